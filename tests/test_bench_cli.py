"""The bench entry points through their command lines: --help of each, experiments.scaling, experiments.grid, experiments.report,
experiments.ssa_table and experiments.sbm_scaling (tiny sizes). A tool runs in a process of its own
where that is what a test checks (--help's imports, a killed grid); elsewhere its main() runs in this
process, and the cells, settings and measurements it starts are processes as ever."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

TINY = [
    "--seq-len",
    "16",
    "--dim",
    "16",
    "--heads",
    "2",
    "--head-dim",
    "8",
    "--mlp-dim",
    "16",
    "--depth",
    "1",
    "--batch-size",
    "4",
    "--eval-batches",
    "1",
    "--final-eval-batches",
    "1",
    "--steps",
    "2",
]


def as_set(flags):
    """["--steps", "2", ...] as experiments.grid's ["--set", "steps=2", ...]: options every cell gets."""
    return [word for flag, value in zip(flags[::2], flags[1::2]) for word in ("--set", f"{flag[2:]}={value}")]


def run(*args, check=True):
    result = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


HELP = """
import contextlib, io, json, runpy, sys
sys.argv = [sys.argv[1], "--help"]
text = io.StringIO()
try:
    with contextlib.redirect_stdout(text):
        runpy.run_module(sys.argv[0], run_name="__main__")
    code = None
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "help": text.getvalue(), "torch": "torch" in sys.modules,
                  "numpy": "numpy" in sys.modules}))
"""


@pytest.mark.parametrize(
    "module, prog",
    [
        ("experiments.scaling", "python -m experiments.scaling"),
        ("experiments.peers", "python -m experiments.peers"),
        ("experiments.ssa_table", "python -m experiments.ssa_table"),
        ("experiments.grid", "python -m experiments.grid"),
        ("experiments.run_all", "./run_all.sh"),
        ("experiments.report", "python -m experiments.report"),
        ("experiments.claims", "python -m experiments.claims"),
        ("experiments.step_time", "python -m experiments.step_time"),
    ],
)
def test_help_runs_nothing_writes_nothing_and_names_the_command(tmp_path, module, prog):
    """--help exits 0 with the usage line a user types, before anything runs: nothing written (the working folder
    stays empty), torch and numpy not imported where the tool's options need neither (experiments.step_time
    measures torch code throughout: it imports it), and never "(default: None)"."""
    heavy = module == "experiments.step_time"
    result = subprocess.run(
        [sys.executable, "-c", HELP, module],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    shown = json.loads(result.stdout)
    assert shown["code"] == 0 and shown["help"].startswith(f"usage: {prog} ")
    assert "(default: None)" not in shown["help"] and "(default: False)" not in shown["help"]
    assert list(tmp_path.iterdir()) == []
    assert heavy or not (shown["torch"] or shown["numpy"])


def test_step_time_times_full_as_run_and_fair_beside_sbm_at_each_density(tmp_path, here, monkeypatch):
    """experiments.step_time: one row per variant with its ratio to fair and to as-run full attention; SBM once per
    --sbm-density item, a run folder giving its record's test density under its λ."""
    from bench.tasks import TASKS

    monkeypatch.setitem(TASKS, "listops", "test_train:SmallListOps")  # padded, without 24,000 trees
    record = tmp_path / "sbm-run"
    record.mkdir()
    (record / "metrics.json").write_text(
        json.dumps({"method": "sbm", "density": 0.3, "config": {"density_weight": 0.01}})
    )
    result = here(
        "experiments.step_time",
        "--task",
        "listops",
        "--seq-len",
        "64",
        "--batch-size",
        "2",
        "--dim",
        "16",
        "--heads",
        "1",
        "--head-dim",
        "16",
        "--mlp-dim",
        "16",
        "--depth",
        "1",
        "--attn-dropout",
        "0.1",
        "--methods",
        "full,sbm,linear",
        "--sbm-density",
        f"0.5,{record}",
        "--repeats",
        "2",
        "--out",
        str(tmp_path / "out"),
    )
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in result.stdout.splitlines()
        if line.startswith("| ") and "variant" not in line
    }
    assert list(rows) == ["full (as run)", "sbm@50.00%", "sbm λ=0.01", "linear", "full (fair)"]
    assert rows["full (fair)"][1] == "1.000" and rows["full (as run)"][2] == "1.000"
    assert rows["full (as run)"][4] == "math" and rows["full (fair)"][4] == "flash"  # attention dropout 0.1 as run
    times = json.loads((tmp_path / "out" / "step_time.json").read_text())["step_ms"]
    assert set(times) == set(rows) and all(len(t) == 2 for t in times.values())
    bad = here("experiments.step_time", "--task", "listops", "--sbm-density", str(tmp_path), check=False)
    assert bad.returncode == 2 and "holds no SBM record with a test density" in bad.stderr.strip().splitlines()[-1]


def test_step_time_of_runs_times_each_run_s_own_setting(tmp_path, here):
    """--runs: one variant per complete run folder, named by its setting, built with the run's own budget (a
    window at the density it trained at) and positional choice, and SBM at its record's test density; runs of
    another model refused; --exclude leaves folders out."""
    from bench.config import RunConfig
    from bench.tasks import get_task
    from sbm_transformer import SBMConfig

    preset = get_task("duplicates").presets["cpu"]
    tiny = dict(seq_len=64, dim=16, heads=2, head_dim=8, mlp_dim=16, batch_size=2)

    def record(name, method, density, **options):  # a complete run's metrics.json as the loop writes it
        folder = tmp_path / "runs" / f"{name}-duplicates-cpu-s0"
        folder.mkdir(parents=True)
        cfg = RunConfig.of(preset, {**tiny, **options.pop("model", {})}, method=method, task="duplicates", **options)
        (folder / "metrics.json").write_text(
            json.dumps(
                {
                    "status": "complete",
                    "method": method,
                    "task": "duplicates",
                    "seed": 0,
                    "density": density,
                    "config": cfg.as_record(),
                }
            )
        )

    record("full", "full", 1.0)
    record("window-at-x", "window", 0.3, attn={"density": 0.3})
    record("sbm-lambda0.01", "sbm", 0.05, settings=SBMConfig(density_weight=0.01))
    record("ssa", "ssa", 0.25, model={"pos_emb": False})  # its own positional choice (ALiBi on LM tasks)
    result = here(
        "experiments.step_time",
        "--task",
        "duplicates",
        "--runs",
        str(tmp_path / "runs" / "*-s0"),
        "--repeats",
        "2",
        "--out",
        str(tmp_path / "out"),
    )
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in result.stdout.splitlines()
        if line.startswith("| ") and "variant" not in line
    }
    assert list(rows) == ["full (as run)", "sbm-lambda0.01", "ssa", "window-at-x", "full (fair)"], rows
    assert abs(float(rows["window-at-x"][3].rstrip("%")) - 30) < 5  # the window trained at 30% of the pairs
    assert abs(float(rows["sbm-lambda0.01"][3].rstrip("%")) - 5) < 2  # SBM at its record's test density
    record("wider", "full", 1.0, model={"dim": 32})
    bad = here("experiments.step_time", "--task", "duplicates", "--runs", str(tmp_path / "runs" / "*-s0"), check=False)
    assert bad.returncode == 2 and "differ from the first run in task or model" in bad.stderr.strip().splitlines()[-1]
    kept = here(
        "experiments.step_time",
        "--task",
        "duplicates",
        "--runs",
        str(tmp_path / "runs" / "*-s0"),
        "--exclude",
        "wider-*",
        "--exclude",
        "s*",
        "--repeats",
        "1",
        "--out",
        str(tmp_path / "out"),
    )
    assert [
        line.split("|")[1].strip()
        for line in kept.stdout.splitlines()
        if line.startswith("| ") and "variant" not in line
    ] == ["full (as run)", "window-at-x", "full (fair)"]


def test_scaling_prints_one_table_with_ratios_to_full(tmp_path, here):
    result = here(
        "experiments.scaling",
        "--methods",
        "full,full-ref",
        "--lengths",
        "32,64",
        "--repeats",
        "1",
        "--warmup-iters",
        "1",
        "--out",
        str(tmp_path),
    )
    out = tmp_path / "scaling.json"
    assert f"wrote {out}" in result.stderr
    lines = [l for l in result.stdout.splitlines() if l.startswith("| full")]
    assert len(lines) == 4
    assert "MALLOC_MMAP_MAX_=0" in result.stdout  # the allocator setting is stated
    rows = json.loads(out.read_text())["rows"]
    assert {(r["method"], r["n"]) for r in rows} == {("full", 32), ("full", 64), ("full-ref", 32), ("full-ref", 64)}
    for r in rows:
        assert r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 and r["flops"] > 0 and r["density"] == 1.0
    for r in rows:  # hand count: projections, QKᵀ and PV, softmax (4/score), density bookkeeping (n + 4)
        n, c, h, d = r["n"], 64, 2, 32
        expected = 2 * n * c * 3 * h * d + 2 * n * h * d * c + 2 * 2 * h * n * n * d + 4 * h * n * n + n + 4
        assert r["flops"] == expected + (h * n * d if r["method"] == "full-ref" else 0)  # + Q/√D


def test_scaling_rejects_unknown_methods(here):
    result = here("experiments.scaling", "--methods", "full,bogus", "--lengths", "32", check=False)
    assert result.returncode == 2 and "unknown method" in result.stderr


def test_scaling_attn_options_reach_their_method_and_bad_ones_stop_before_any_cell(tmp_path, here):
    result = here(
        "experiments.scaling",
        "--methods",
        "full,performer",
        "--attn",
        "performer.features=8",
        "--lengths",
        "32",
        "--repeats",
        "1",
        "--warmup-iters",
        "0",
        "--out",
        str(tmp_path),
    )
    rows = {r["method"]: r for r in json.loads((tmp_path / "scaling.json").read_text())["rows"]}
    assert rows["performer"]["options"] == {"features": "8"} and "options" not in rows["full"]
    assert "| performer (features=8) |" in result.stdout
    for attn, message in [
        ("performer.bogus=1", "takes no option 'bogus'"),
        ("performer.features=x", "features"),
        ("linear.chunk=4", "not among --methods"),
        ("features=8", "METHOD.KEY=VALUE"),
    ]:
        bad = here(
            "experiments.scaling",
            "--methods",
            "full,performer",
            "--attn",
            attn,
            "--lengths",
            "32",
            "--out",
            str(tmp_path / "bad"),
            check=False,
        )
        assert bad.returncode == 2 and message in bad.stderr and "measured" not in bad.stderr, (attn, bad.stderr)
    assert not (tmp_path / "bad").exists()


def test_grid_keeps_complete_cells_plans_missing_data_and_records_failures(tmp_path, here):
    out = tmp_path / "results"
    first = here(
        "experiments.grid",
        "--methods",
        "full",
        "--tasks",
        "duplicates,bytes",
        "--out",
        str(out),
        "--data-dir",
        str(tmp_path / "no-data"),
        *as_set(TINY),
    )
    assert "full-duplicates-cpu-s0: done" in first.stdout
    assert "no data: bytes: bytes: no WikiText-2 text" in first.stdout and "full-bytes" not in first.stdout
    assert not (tmp_path / "no-data").exists()  # the plan looked, and created nothing
    record = out / "runs" / "full-duplicates-cpu-s0" / "metrics.json"
    stamp = record.stat().st_mtime_ns
    second = here(
        "experiments.grid",
        "--methods",
        "full",
        "--tasks",
        "duplicates",
        "--out",
        str(out),
        "--data-dir",
        str(tmp_path / "no-data"),
        *as_set(TINY),
    )  # the same command: the cell is kept
    assert "complete, kept" in second.stdout and record.stat().st_mtime_ns == stamp
    # a cell whose loss is not finite (another seed: a cell of its own): kept as diverged by the
    # grid, shown as diverged by the report
    failing = here(
        "experiments.grid",
        "--methods",
        "full",
        "--tasks",
        "duplicates",
        "--seeds",
        "1",
        "--out",
        str(out),
        *as_set(TINY),
        "--set",
        "lr=1e20",
        check=False,
    )
    assert failing.returncode == 1
    assert "full-duplicates-cpu-s1: DIVERGED: error: the run diverged" in failing.stdout
    failure = json.loads((out / "runs" / "full-duplicates-cpu-s1" / "failed.json").read_text())
    assert failure["status"] == "diverged" and failure["exit_code"] == 3

    from experiments import report

    (out / "run.json").write_text(
        json.dumps(
            {
                "commit": "abc1234",
                "reruns": [
                    {"commit": "def5678", "cells": ["full-duplicates-cpu-s0"], "why": "a fix to full attention"}
                ],
            }
        )
    )
    text = report.write_run_report(out)
    assert "| full " in text and "diverged: full on duplicates (exit 3): " + failure["reason"] in text
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| ")]
    run_row = next(row for row in rows if row[0] == "quick")  # budget, preset, device, seeds, command, commit, ...
    assert run_row[3] == "[0]" and run_row[5] == "abc1234"
    assert ["def5678", "full-duplicates-cpu-s0", "a fix to full attention"] in rows  # the cells' own code


def test_one_command_writes_the_readme_glance_and_the_claims_into_results_readme(tmp_path):
    """--readme rewrites only the README's generated region (every registered method, "not run yet" without
    records; a sentence naming results/README.md) and leaves the hand-written text around it as it was; it writes
    results/README.md: the claims table, one section per claim in the order of experiments/claims/, the quick grid
    last."""
    results = tmp_path / "results"
    (results / "fastrg").mkdir(parents=True)
    (results / "fastrg" / "fastrg.md").write_text("`python -m experiments.fastrg_bench`\n\n| fastrg table |\n")
    readme = tmp_path / "README.md"
    head = "intro\n\n### What the results mean\n\nA person's words, *kept* | as written.\n\n"
    readme.write_text(head + "<!-- results:start -->\nold\n<!-- results:end -->\noutro\n")
    run("experiments.report", "--results", str(results), "--readme", str(readme))
    text = readme.read_text()
    assert text.startswith(head + "<!-- results:start -->\n") and text.endswith("<!-- results:end -->\noutro\n")
    assert "old" not in text
    section = text.split("<!-- results:start -->")[1].split("<!-- results:end -->")[0]
    from experiments.claims import CLAIMS
    from bench.methods import METHODS

    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ")}
    assert all(m in rows and "not run yet" in rows[m] for m in METHODS if m not in ("kernel", "hybrid"))
    # the hybrid runs in the matched-cost claim only: no grid cell, so nothing here is still to come
    assert "hybrid" in rows and "not run yet" not in rows["hybrid"]
    assert "[results/README.md](results/README.md)" in section and "### " not in section and "\n- " not in section
    assert "| [" not in section  # the claims table lives in results/README.md alone
    claims = (results / "README.md").read_text()
    assert sum(line.startswith("| [") and "](#" in line for line in claims.splitlines()) == len(CLAIMS)
    positions = [claims.index(f"## {claim.title}") for claim in CLAIMS]
    assert positions == sorted(positions) and positions[-1] < claims.index("## Quick grid")
    assert "| fastrg table |" in claims and "Not yet run:" in claims and "](fastrg/)" in claims
    assert "Not published yet: `./run_all.sh --out results/quick`" in claims
    printed = run("experiments.report", "--results", str(results)).stdout
    assert printed.strip() == claims.strip()  # without --readme: the same text, printed


def test_a_killed_grid_rerun_finishes_without_redoing_complete_cells(tmp_path, here):
    """The grid (and its cell) killed once its first cell is complete, before its second is: the
    rerun keeps the first and runs the second."""
    out = tmp_path / "results"
    args = ["--methods", "full,performer", "--tasks", "duplicates", "--out", str(out), "--jobs", "1", *as_set(TINY)]
    grid = subprocess.Popen(
        [sys.executable, "-m", "experiments.grid", *args],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    first = out / "runs" / "performer-duplicates-cpu-s0" / "metrics.json"  # the longest is dispatched first
    deadline = time.time() + 240
    while not (first.exists() and json.loads(first.read_text())["status"] == "complete"):
        assert grid.poll() is None and time.time() < deadline, "the grid ended before its first cell completed"
        time.sleep(0.05)
    os.killpg(grid.pid, signal.SIGKILL)  # the grid and the cell it is running
    grid.wait()
    records = [out / "runs" / f"{m}-duplicates-cpu-s0" / "metrics.json" for m in ("full", "performer")]
    assert not records[0].exists(), "the kill came too late to leave a cell undone"
    stamp = first.stat().st_mtime_ns

    rerun = here("experiments.grid", *args)
    assert "performer-duplicates-cpu-s0: complete, kept" in rerun.stdout
    assert first.stat().st_mtime_ns == stamp
    assert "full-duplicates-cpu-s0: done" in rerun.stdout
    assert all(json.loads(r.read_text())["status"] == "complete" for r in records)


def test_grid_pairs_the_kernel_method_with_its_masked_lm_task_and_refuses_unknown_tasks(tmp_path, here):
    from bench.methods import applicable

    assert applicable("kernel", "wikitext2") and not applicable("kernel", "listops")
    assert applicable("full", "listops") and not applicable("full", "wikitext2")
    result = here(
        "experiments.grid",
        "--methods",
        "kernel,full",
        "--tasks",
        "duplicates,nonsense",
        "--out",
        str(tmp_path),
        check=False,
    )
    assert result.returncode == 2 and "unknown tasks ['nonsense']" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_grid_runs_methods_with_their_own_entry_points(tmp_path, here):
    """SBM, SSA and kernel cells run their files' main(); the kernel cell on its masked LM."""
    import pytest
    from conftest import DATA

    tasks = "duplicates,wikitext2" if (DATA / "wikitext-2" / "valid.txt").is_file() else "duplicates"
    kernel = [
        "--analysis-sequences",
        "4",
        "--predictor-steps",
        "2",
        "--predictor-batch",
        "2",
        "--predictor-rows",
        "4",
        "--finetune-steps",
        "1",
        "--select",
        "topk",
        "--top-k",
        "2",
        "--handcrafted-k",
        "4",
        "--learned-kernels",
        "2",
        "--hidden",
        "8",
    ]
    out = tmp_path / "results"
    result = here("experiments.grid", "--methods", "sbm,ssa", "--tasks", "duplicates", "--out", str(out), *as_set(TINY))
    assert "sbm-duplicates-cpu-s0: done" in result.stdout and "ssa-duplicates-cpu-s0: done" in result.stdout
    for method in ("sbm", "ssa"):
        assert (
            json.loads((out / "runs" / f"{method}-duplicates-cpu-s0" / "metrics.json").read_text())["method"] == method
        )
    if tasks == "duplicates":
        pytest.skip(f"no WikiText-2 in {DATA} for the kernel cell (set SPARSE_ATTN_DATA)")
    result = here(
        "experiments.grid",
        "--methods",
        "kernel",
        "--tasks",
        tasks,
        "--out",
        str(out),
        "--data-dir",
        str(DATA),
        *as_set(TINY),
        *as_set(kernel),
    )
    assert "kernel-wikitext2-cpu-s0: done" in result.stdout and "kernel-duplicates" not in result.stdout
    record = json.loads((out / "runs" / "kernel-wikitext2-cpu-s0" / "metrics.json").read_text())
    assert "finetune" in record["kernel"]


def test_ssa_table_runs_every_setting_and_normalises_to_s0(tmp_path, here):
    import pytest
    from conftest import DATA

    if not (DATA / "wikitext-2" / "valid.txt").is_file():
        pytest.skip(f"no WikiText-2 in {DATA} (set SPARSE_ATTN_DATA)")
    out = tmp_path / "ssa"
    assert TINY[:2] == ["--seq-len", "16"]
    tiny = TINY[2:]  # the table sets the length
    result = here(
        "experiments.ssa_table",
        "--out",
        str(out),
        "--seq-len",
        "32",
        "--eval-context",
        "8",
        "--ensemble-samples",
        "2",
        "--data-dir",
        str(DATA),
        *tiny,
    )
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in result.stdout.splitlines()
        if line.startswith("| S")
    }
    assert list(rows) == ["S0", "S-L2", "S-L4", "S-L4+FT", "S-U75"]
    assert [rows[s][0] for s in rows] == ["S0", "S1-L2", "S1-L4", "S1-L4+FT", "S1-U75"]
    assert all(v == "1.00" for v in rows["S0"][5:8]) and rows["S0"][9] == "1.00"
    attention = {s: float(rows[s][5]) for s in rows}  # a training step's attention FLOPs × S0
    assert attention["S-L4"] < attention["S-L2"] < 1 and attention["S-L4"] < attention["S-L4+FT"] < 1
    assert "Self-ensembling" in result.stdout and (out / "table.md").read_text() in result.stdout
    records = json.loads((out / "table.json").read_text())
    assert list(records["S-L4"]["ssa"]["ensemble_curve"]) == ["1", "2"]
    rerun = here(
        "experiments.ssa_table",
        "--out",
        str(out),
        "--seq-len",
        "32",
        "--eval-context",
        "8",
        "--ensemble-samples",
        "2",
        "--data-dir",
        str(DATA),
        *tiny,
    )
    assert rerun.stdout.count("complete, skipped") == 5


def test_init_from_starts_a_fresh_run_from_a_snapshot_s_weights_with_its_own_settings(tmp_path, here):
    """--init-from: a fresh run (its own steps, schedule and optimizer) from a snapshot's model weights, recorded
    in its config; --resume refuses a changed setting and points to it; a checkpoint of another model is one line."""
    import hashlib

    import torch
    from bench.files import load_checkpoint

    first, second = tmp_path / "first", tmp_path / "second"
    common = ["bench.train", "--task", "duplicates", *TINY, "--steps", "4", "--eval-every", "2"]
    here(*common, "--snapshot-at", "2", "--out", str(first))
    snapshot = first / "checkpoint-2.pt"
    started = here(*common, "--lr", "0.01", "--init-from", str(snapshot), "--out", str(second))
    assert f"from the weights of {snapshot}" in started.stdout
    record = json.loads((second / "metrics.json").read_text())
    assert record["config"]["init_from"] == str(snapshot) and record["config"]["lr"] == 0.01
    assert load_checkpoint(second / "checkpoint.pt")["progress"]["step"] == 4
    here(*common, "--steps", "0", "--init-from", str(snapshot), "--out", str(tmp_path / "untrained"))
    digest = hashlib.sha256()  # full attention keeps no persistent buffer: its state is its parameters, in order
    for tensor in torch.load(snapshot, weights_only=True)["model"].values():
        digest.update(tensor.contiguous().numpy().tobytes())
    assert json.loads((tmp_path / "untrained" / "metrics.json").read_text())["param_fingerprints"] == [
        digest.hexdigest()
    ]
    refused = here(*common, "--lr", "0.02", "--init-from", str(snapshot), "--out", str(second), "--resume", check=False)
    assert refused.returncode == 2 and "--lr 0.01 → 0.02" in refused.stderr and "--init-from" in refused.stderr
    wide = here(
        "bench.train",
        "--task",
        "duplicates",
        *TINY,
        "--dim",
        "32",
        "--init-from",
        str(snapshot),
        "--out",
        str(tmp_path / "wide"),
        check=False,
    )
    assert wide.returncode == 2 and f"--init-from: {snapshot} does not fit this model" in wide.stderr


def test_ssa_table_refuses_a_task_that_is_not_language_modelling(tmp_path, here):
    result = here("experiments.ssa_table", "--task", "listops", "--out", str(tmp_path), check=False)
    assert result.returncode == 2 and "language-modelling" in result.stderr


def test_sbm_scaling_measures_core_module_and_full_attention_in_one_table(tmp_path, here):
    result = here(
        "experiments.sbm_scaling",
        "--lengths",
        "32",
        "--densities",
        "0.25",
        "--kinds",
        "full,core,sbm",
        "--repeats",
        "1",
        "--warmup-iters",
        "0",
        "--out",
        str(tmp_path),
    )
    assert "Crossover densities" in result.stdout and "MALLOC_MMAP_MAX_=0" in result.stdout
    rows = {r["method"]: r for r in json.loads((tmp_path / "sbm_scaling.json").read_text())["rows"]}
    assert set(rows) == {"full", "core@0.25", "sbm@0.25"}
    assert all("error" not in r and r["fwdbwd_ms"] > 0 and r["tensor_peak_bytes"] > 0 for r in rows.values())
    assert abs(rows["core@0.25"]["density"] - 0.25) < 0.05 and rows["full"]["density"] == 1.0


def test_sbm_scaling_help_runs_nothing_and_refuses_old_flag_names(here):
    result = here("experiments.sbm_scaling", "--help")
    assert result.stdout.startswith("usage: python -m experiments.sbm_scaling") and "default: None" not in result.stdout
    assert (
        "--warmup-iters" in result.stdout
        and "--batch-size" in result.stdout
        and "SBM-Transformer scaling —" not in result.stdout
    )
    for old in (["--warmup", "1"], ["--batch", "1"], ["--repeats", "0"]):
        failed = here("experiments.sbm_scaling", *old, check=False)
        assert failed.returncode == 2 and "error:" in failed.stderr


def test_a_claims_listing_into_a_pipe_closed_early_ends_without_a_traceback():
    """`python -m experiments.claims list | head -1`: the listing (about 200 kB, more than a pipe holds) meets a
    closed pipe; it stops quietly instead of printing Python's BrokenPipeError traceback."""
    result = subprocess.run(
        f"{shlex.quote(sys.executable)} -m experiments.claims list | head -1",
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    from experiments.claims import CLAIMS

    assert result.stdout.startswith(f"{CLAIMS[0].name} (") and result.stdout.count("\n") == 1
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
