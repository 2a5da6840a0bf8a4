"""./run_all.sh as a user runs it: its own run folder, a clean git tree, --help and bad options, --out end to end
(cells, scaling, report, plots), n/a and no-data cells, the lock, no orphan cells, budget changes, the report
from a folder of records, and a method registered from outside (tiny smoke budgets throughout)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.files import write_json
from conftest import ROOT, processes

ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "PYTHONPATH": str(ROOT),
    "OMP_NUM_THREADS": "1",
    "HOME": os.environ.get("HOME", "/tmp"),
}
FAST = ["--set", "steps=1", "--set", "final_eval_batches=1"]  # experiments.grid options every cell gets


def sh(args, cwd=ROOT, env=None, check=True, timeout=300):
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**ENV, **(env or {})})
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def fake_wikitext(folder):
    """A WikiText-2-shaped folder of a few kilobytes (the byte-LM task's files)."""
    text = "".join(f" = Section {i} = \n The quick brown fox {i} jumps over the lazy dog . \n" for i in range(300))
    (folder / "wikitext-2").mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (folder / "wikitext-2" / f"{split}.txt").write_text(text)
    return folder


def test_help_exits_at_once_and_runs_nothing():
    before = sorted(os.listdir(ROOT))
    start = time.time()
    result = sh(["bash", "run_all.sh", "--help"])
    assert "usage: ./run_all.sh" in result.stdout and "--smoke" in result.stdout and "--out" in result.stdout
    assert time.time() - start < 30 and sorted(os.listdir(ROOT)) == before and "budget" not in result.stdout[:20]
    assert "./run_all.sh: budget" not in result.stdout and "(default: quick)" not in result.stdout


def test_an_unknown_option_is_refused_before_anything_runs(tmp_path, here):
    result = here("experiments.run_all", "--smoke", "--out", str(tmp_path / "x"), "--bogus", check=False)
    assert result.returncode == 2 and "unrecognized arguments: --bogus" in result.stderr
    assert not (tmp_path / "x").exists()
    result = here("experiments.run_all", "--smoke", "--out", str(tmp_path / "x"), "--methods", "nope", check=False)
    assert result.returncode == 2 and "unknown methods ['nope']" in result.stderr


def test_a_fresh_clone_runs_into_its_own_ignored_folder_and_leaves_git_clean(tmp_path):
    clone = tmp_path / "clone"
    files = sh(["git", "ls-files", "--cached", "--others", "--exclude-standard"]).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "clone"]):
        sh([*git, *args], cwd=clone)
    result = sh(
        ["bash", "run_all.sh", "--smoke", "--methods", "full", "--tasks", "duplicates", "--no-scaling"], cwd=clone
    )
    folder = clone / "runs" / "grid-smoke"
    assert (folder / "REPORT.md").is_file() and (folder / "runs" / "full-duplicates-cpu-s0" / "metrics.json").is_file()
    assert "output folder runs/grid-smoke" in result.stdout and "| full " in result.stdout  # the report is printed
    assert sh(["git", "status", "--porcelain"], cwd=clone).stdout == ""


def test_out_is_honoured_end_to_end_with_na_and_no_data_cells(tmp_path, monkeypatch, here):
    """./run_all.sh --out with a cell of each kind: run (full and sbm on bytes), n/a (linformer on
    bytes) and no data (retrieval); its rerun (in this process: the first run was the user's command)
    keeps the cells and the scaling table."""
    data, out = fake_wikitext(tmp_path / "data"), tmp_path / "run"
    argv = [
        "--smoke",
        "--out",
        str(out),
        "--methods",
        "full,linformer,sbm",
        "--tasks",
        "bytes,retrieval",
        "--data-dir",
        str(data),
        "--lengths",
        "32",
    ]
    result = sh(["bash", "run_all.sh", *argv])
    assert "n/a: linformer on bytes (no causal form)" in result.stdout  # said in the plan, before any cell ran
    assert "no data: retrieval" in result.stdout and "ETA" in result.stdout
    cells = sorted(p.name for p in (out / "runs").iterdir())
    assert cells == ["full-bytes-cpu-s0", "sbm-bytes-cpu-s0"]  # no process for n/a or no-data cells
    assert all(json.loads((out / "runs" / c / "metrics.json").read_text())["status"] == "complete" for c in cells)
    assert json.loads((out / "scaling.json").read_text())["args"]["lengths"] == "32"
    report = (out / "REPORT.md").read_text()
    assert "n/a (no causal form)" in report and "no data: retrieval: retrieval: LRA's AAN pairs" in report
    assert "failed" not in report and report.strip() in result.stdout
    assert "Attention scaling" in report and "| sbm " in report
    if shutil.which("python3") and __import__("importlib").util.find_spec("matplotlib"):
        assert (out / "accuracy_vs_cost.png").stat().st_size > 1000 and (out / "scaling.png").stat().st_size > 1000
        assert "![" in report
    rerun = here("experiments.run_all", *argv)
    assert rerun.stdout.count("complete, kept") == 2
    assert "step times: bytes: measured after its runs finished; kept" in rerun.stdout
    assert rerun.stderr.count("kept ") == 5 and "measured " not in rerun.stderr  # every scaling row kept
    # A table killed after its first rows keeps them; one an older version wrote (settings under other
    # names, e.g. "batch", "warmup") is measured anew; a cell that failed is measured again.
    from experiments import run_all, scaling

    table = json.loads((out / "scaling.json").read_text())
    measured = []
    monkeypatch.setattr(scaling, "run_cell", lambda cell, *_: measured.append(cell["method"]) or table["rows"][0])
    killed = {**table, "rows": table["rows"][:2] + [{**table["rows"][2], "error": "timed out"}]}
    (out / "scaling.json").write_text(json.dumps(killed))
    run_all.run_scaling(out, "smoke", ["full", "linformer", "sbm"], "32", "auto")
    assert measured == ["sbm", "full-ref", "sbm@0.01"]
    older = {
        **table,
        "args": {
            ("batch" if k == "batch_size" else "warmup" if k == "warmup_iters" else k): v
            for k, v in table["args"].items()
        },
    }
    (out / "scaling.json").write_text(json.dumps(older))
    measured.clear()
    run_all.run_scaling(out, "smoke", ["full", "linformer", "sbm"], "32", "auto")
    assert measured == ["full", "linformer", "sbm", "full-ref", "sbm@0.01"]
    # A task's step times are measured again once one of its runs is newer than them.
    (out / "runs" / "full-bytes-cpu-s0" / "metrics.json").touch()
    calls = []
    monkeypatch.setattr(
        run_all.subprocess,
        "run",
        lambda command, **_: calls.append(command) or subprocess.CompletedProcess(command, 0, "", ""),
    )
    run_all.run_step_times(out, "smoke", ["bytes", "retrieval"], 0)
    assert len(calls) == 1 and "step_time" in " ".join(calls[0])


def test_report_without_matplotlib_says_so_in_one_line(tmp_path, monkeypatch):
    from experiments import plots, report

    monkeypatch.setattr(plots, "available", lambda: False)
    assert "matplotlib is not installed" in report.run_plots(tmp_path, "quick")
    assert list(tmp_path.iterdir()) == []


def write_record(folder, cell, test):
    """A claim cell's record as the grid leaves it: metrics.json (the config with the cell's settings) and
    cell.json (its command, wall and CPU time)."""
    folder.mkdir(parents=True)
    config = {"steps": 1, "batch_size": 1, "seq_len": 8, "depth": 1, "heads": 1, "dim": 8, **cell["settings"]}
    record = {
        "status": "complete",
        "method": cell["method"],
        "task": "listops",
        "seed": cell["seed"],
        "metric": "accuracy",
        "test": test,
        "valid": test,
        "density": 0.5,
        "median_step_ms": 10.0,
        "wall_time_s": 5.0,
        "device": "cpu",
        "config": config,
    }
    (folder / "metrics.json").write_text(json.dumps(record))
    (folder / "cell.json").write_text(
        json.dumps({"command": cell["command"], "wall_s": 60.0 + cell["seed"], "cpu_s": 30.0})
    )


def test_a_claim_table_is_built_from_its_records_with_mean_and_std(tmp_path):
    from experiments import claims, report

    claim = claims.BY_NAME["sbm-listops"]
    cells = {c["name"]: c for c in claim.cells()}
    for seed, test in zip((0, 1, 2), (0.30, 0.32, 0.37)):
        name = f"full-listops-cpu-s{seed}"
        write_record(tmp_path / claim.name / "runs" / name, cells[name], test)
    write_record(tmp_path / claim.name / "runs" / "sbm-listops-cpu-s0", cells["sbm-listops-cpu-s0"], 0.25)
    text = report.claim_section(claim, tmp_path, {})
    full_row = next(line for line in text.splitlines() if "--method full" in line)
    assert "33.00 ± 3.61" in full_row and "30.00 / 32.00 / 37.00" in full_row and "| 0, 1, 2 " in full_row
    assert "60 s / 61 s / 62 s" in full_row and "30 s / 30 s / 30 s" in full_row  # each seed's wall and CPU time
    sbm_row = next(line for line in text.splitlines() if "sbm_transformer.py" in line)
    assert "25.00 " in sbm_row and "±" not in sbm_row
    assert "Not yet run:" in text and "sbm-lambda0.01-listops-cpu-s2" in text
    assert "python -m experiments.claims run sbm-listops" in text and claim.paper in text


def test_table3_gives_costs_relative_to_both_full_attention_paths_beside_the_paper(tmp_path):
    from experiments import claims, grid
    from experiments.claims import sbm_table3

    claim = claims.BY_NAME["sbm-table3"]
    cells = {c["name"]: c for c in claims.BY_NAME["sbm-table3"].cells()}
    costs = {
        "full": (1000, 20, 100.0),
        "full-path-reference": (1000, 200, None),
        "sbm-lambda0.1": (80, 30, 250.0),
        "performer": (300, 40, None),
    }
    for name, cell in cells.items():
        setting = name.rsplit("-listops", 1)[0].replace("-untrained", "")
        if setting not in costs or cell["seed"] > 1:
            continue
        flops, memory, step_ms = costs[setting]
        folder = tmp_path / claim.name / "runs" / name
        write_record(folder, cell, 0.3 + 0.02 * cell["seed"])
        record = json.loads((folder / "metrics.json").read_text())
        record.update(
            flops_per_example={"model": flops + 10 * cell["seed"], "attention": flops},
            inference_memory_per_example_bytes=memory * 2**20,
            median_step_ms=step_ms,
            density_per_layer=[0.5, 0.25],
            steps=0 if step_ms is None else 600,
        )
        (folder / "metrics.json").write_text(json.dumps(record))
    title, table = sbm_table3.records_table(grid.load(tmp_path / claim.name)[0]).split("\n\n", 1)
    assert title.startswith("listops (")  # one table per task; only ListOps records here
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table.splitlines()[2:]}
    assert list(rows) == ["full", "full (explicit path)", "sbm λ=0.1", "performer"]
    seeds, acc, majority, density, explored, flops, attention, vs_explicit, vs_sdpa, mib, paper = rows["sbm λ=0.1"]
    assert (seeds, acc, majority, density, explored) == ("0, 1", "31.00 ± 1.41", "–", "50.0% (50.0 / 25.0)", "–")
    assert (flops, attention) == (f"{85 / 1005:.3f}", "0.080")  # model FLOPs averaged over the seeds first
    assert (vs_explicit, vs_sdpa, mib, paper) == ("0.150", "1.500", "30.0", "0.07 / 0.19")
    assert rows["performer"][1] == "untrained" and rows["performer"][-1] == "0.18 / 0.76"
    assert rows["full (explicit path)"][8] == "10.000"


def test_table3_gives_one_table_per_task_with_that_task_s_paper_column():
    """The sbm-table3 claim's table: ratios against the same task's full attention, beside the paper's figures for
    that task's column (ListOps 2K, Image 1K)."""
    from experiments.claims import sbm_table3

    def record(task, method, weight=None, flops=1.0, memory=100.0, steps=600):
        return {
            "task": task,
            "method": method,
            "seed": 0,
            "steps": steps,
            "test": 0.2,
            "density": 0.5,
            "metric": "accuracy",
            "density_per_layer": [0.5, 0.5],
            "config": {"seq_len": {"listops": 2048, "image": 1024}[task], "density_weight": weight},
            "cell": {"command": []},
            "flops_per_example": {"model": flops, "attention": flops},
            "inference_memory_per_example_bytes": memory,
            "median_step_ms": 10.0,
        }

    explored = record("listops", "sbm", 0.1, flops=0.5, memory=50)
    explored["sbm"] = {"test_with_exploration": {"metric": 0.31, "density": 0.012}}
    recs = [
        record("listops", "full"),
        explored,
        record("image", "full", flops=4.0),
        record("image", "sbm", 0.1, flops=1.0),
        record("image", "linear", flops=2.0, steps=0),
    ]
    text = sbm_table3.records_table(recs)
    listops, image = text.split("image (1024 tokens):")
    assert listops.startswith("listops (2048 tokens):")
    sbm_listops = next(line for line in listops.splitlines() if line.startswith("| sbm λ=0.1"))
    assert "| 0.500 " in sbm_listops and "0.07 / 0.19" in sbm_listops and "| 31.00 (1.2%) " in sbm_listops
    sbm_image = next(line for line in image.splitlines() if line.startswith("| sbm λ=0.1"))
    assert "| 0.250 " in sbm_image and "0.27 / 0.39" in sbm_image  # 1.0 / 4.0: image's full, not ListOps'
    linear_image = next(line for line in image.splitlines() if line.startswith("| linear"))
    assert "untrained" in linear_image and "0.04 / 0.42" in linear_image


def quick_record(folder, method, task, test, attention, step_ms, metric="accuracy"):
    """A quick-grid cell's record as the grid leaves it, with the fields the glance reads."""
    record = {
        "status": "complete",
        "method": method,
        "task": task,
        "seed": 0,
        "metric": metric,
        "test": test,
        "valid": test,
        "base_rate": 0.5,
        "scored": {"test": 2000},
        "density": 1.0,
        "steps": 10,
        "device": "cpu",
        "flops_per_example": {"model": 2 * attention, "attention": attention},
        "peak_memory_bytes": 1000,
        "median_step_ms": step_ms,
        "wall_time_s": 1.0,
        "config": {"seq_len": 16, "steps": 10, "batch_size": 2, "depth": 1, "heads": 1, "dim": 8},
    }
    cell = folder / "runs" / f"{method}-{task}-cpu-s0"
    cell.mkdir(parents=True)
    (cell / "metrics.json").write_text(json.dumps(record))
    return record


def test_the_glance_has_one_row_per_registered_method_from_the_records(tmp_path):
    """The README's table: every registered method, "not run yet" where no record exists; test metrics, cost
    ratios and the scaling crossover computed from the records; no sentences, no base-rate marks."""
    from bench import methods
    from experiments import report

    quick = tmp_path / "quick"
    full = quick_record(quick, "full", "duplicates", 0.95, attention=400, step_ms=10.0)
    linear = quick_record(quick, "linear", "duplicates", 0.70, attention=100, step_ms=20.0)
    at_base = quick_record(quick, "performer", "duplicates", 0.50, attention=300, step_ms=30.0)
    (quick / "grid.json").write_text(json.dumps({"methods": ["full", "linear", "performer"], "not_run": []}))
    (tmp_path / "scaling").mkdir()
    rows = [
        {"method": m, "n": n, "fwdbwd_ms": ms, "peak_bytes": mib, "fwd_ms": 1, "flops": 1, "density": 1}
        for m, n, ms, mib in [
            ("full", 32, 1.0, 10),
            ("full", 64, 4.0, 10),
            ("full", 128, 16.0, 10),
            ("linear", 32, 2.0, 20),
            ("linear", 64, 3.0, 30),
            ("linear", 128, 4.0, 40),
            ("performer", 32, 0.5, 5),
            ("performer", 64, 5.0, 20),
            ("performer", 128, 8.0, 30),
        ]
    ]
    (tmp_path / "scaling" / "scaling.json").write_text(json.dumps({"rows": rows, "args": {}, "device": "cpu"}))
    text = report.glance(tmp_path, {})
    table = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in text.splitlines()
        if line.startswith("| ")
    }
    assert set(methods.METHODS) <= set(table) and "base rate" in table
    # the others: not run yet in every column, the crossover too where the scaling table measures the method
    without = [m for m in methods.METHODS if m not in ("full", "linear", "performer") and methods.get(m).scaling]
    assert without and all(set(table[m]) <= {"not run yet", "–"} and "not run yet" in table[m] for m in without)
    assert table["full"][0] == report.fmt([full["test"]], "accuracy") and table["full"][-1] == "(reference)"
    assert table["linear"][0] == report.fmt([linear["test"]], "accuracy")
    attention = linear["flops_per_example"]["attention"] / full["flops_per_example"]["attention"]
    assert table["linear"][2] == f"{attention:.2f}"
    assert table["linear"][4] == f"{linear['median_step_ms'] / full['median_step_ms']:.2f}"
    assert table["linear"][-1] == "64 / —"  # faster from n = 64 on, never smaller
    assert table["performer"][-1] == "128 / —"  # below at n = 32 and 128, not 64: it stays below from 128 only
    assert table["performer"][0] == report.fmt([at_base["test"]], "accuracy")  # the base rate row says the rest
    assert table["base rate"][0] == "50.00" and "(base rate)" not in text and "\n- " not in text
    assert "results/scaling/scaling.json" in text.split("| method")[0]  # the caption names the scaling run
    # the claims' table lives in results/README.md, which the glance names; every claim is a row there
    assert "[results/README.md](results/README.md)" in text and "| [" not in text
    claims = [line for line in report.claims_table(tmp_path, "").splitlines() if line.startswith("| [")]
    assert len(claims) == len(__import__("experiments.claims").claims.CLAIMS)
    assert all("not run yet" in line for line in claims)  # no claim has records here
    assert "(#sbm-transformer-fig-4-duplicates-every-method-the-papers-recipe)" in claims[0]


def test_a_claims_cell_pattern_matching_nothing_is_refused_before_anything_is_written(tmp_path, here):
    result = here(
        "experiments.claims", "run", "sbm-table3", "--cells", "*-s9", "--out", str(tmp_path / "claim"), check=False
    )
    assert result.returncode == 2 and "no cell of sbm-table3 matches '*-s9'" in result.stderr
    assert "full-listops-paper-s0" in result.stderr and not (tmp_path / "claim").exists()
    result = here(
        "experiments.claims", "run", "matched-cost", "--cells", "nosuch*", "--out", str(tmp_path / "claim"), check=False
    )  # hundreds of cells: the message names the first and the last, not all of them
    assert result.returncode == 2 and len(result.stderr.splitlines()[-1]) < 200, result.stderr
    assert "full-duplicates-cpu-s0 … " in result.stderr and not (tmp_path / "claim").exists()


@pytest.mark.parametrize("budgets", ["0,0.5", "1.5", "a", ""])
def test_a_budget_outside_zero_to_one_is_refused_in_one_line(here, budgets):
    result = here("experiments.claims", "verdicts", "--budgets", budgets, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1].endswith(f"must be comma-separated fractions in (0, 1], got {budgets!r}")


def test_the_verdicts_at_chosen_budgets_come_from_the_records_and_none_is_one_line(tmp_path, monkeypatch, here):
    from experiments import claims

    monkeypatch.setattr(claims, "RESULTS", tmp_path)
    result = here("experiments.claims", "verdicts", check=False)
    assert (result.returncode, result.stdout) == (1, "") and len(result.stderr.splitlines()) == 1
    assert "no setting of matched-cost has a record yet" in result.stderr
    pairs = {"full": 1.0, "window-d0.125": 0.128, "reformer-h1-b8": 0.125}
    tests = {"full": 1.0, "window-d0.125": 0.3, "reformer-h1-b8": 0.9}
    extra = {s: {"computed_pairs": c, "density": c, "flops_per_example": {"attention": c}} for s, c in pairs.items()}
    claim_records(tmp_path, "matched-cost", tests, **extra)
    table = " ".join(here("experiments.claims", "verdicts", "--budgets", "0.125,0.03").stdout.split())
    # the design's other runs within 12.5% are not recorded: the verdict is provisional until they are
    assert (
        "| recall | 12.5% | reformer | window | +0.600 | [+0.600, +0.600] | 5/5 | provisional (runs to come: " in table
    )
    # no family within 3% yet; SBM's two settings and its hybrid learn their cost, so their 15 runs may fall within
    assert "| recall | 3% | none within | none within | – | – | – | runs to come: 15 |" in table and "25%" not in table
    assert not list(tmp_path.glob("*.md")) and not list(tmp_path.rglob("*.png"))  # it prints, it writes nothing


def test_a_rerun_compares_a_record_with_its_command_and_a_missing_one_is_one_line(tmp_path, monkeypatch, here):
    """A tiny claim: its one cell run, then rerun from its command: identical; a changed metric: the field named;
    a cell without a record, or not of the claim: one line, exit 1."""
    from experiments import claims, grid
    from experiments.claims.claim import Claim, Setting

    options = dict(seq_len=16, dim=16, depth=1, heads=2, head_dim=8, mlp_dim=16, batch_size=4, steps=3)
    options.update(eval_every=3, eval_batches=1, final_eval_batches=1, warmup=1, lr="1e-3")
    tiny = Claim("tiny", "a tiny claim", "runs", "–", runs=(Setting("full", "recall", "cpu", options),))
    monkeypatch.setattr(claims, "RESULTS", tmp_path)
    monkeypatch.setitem(claims.BY_NAME, "matched-cost", tiny)
    out, (cell,) = tmp_path / "matched-cost", tiny.cells()
    missing = here("experiments.claims", "rerun", "matched-cost", cell["name"], check=False)
    assert missing.returncode == 1 and "has no complete record" in missing.stderr.splitlines()[-1]
    assert not out.exists()
    strange = here("experiments.claims", "rerun", "matched-cost", "nosuch-s0", check=False)
    assert strange.returncode == 1 and "'nosuch-s0' is not a cell of the claim" in strange.stderr
    # as many jobs as cores: the cell runs on one thread, as the claim's runs do (on two threads, about one process in
    # twenty computed half of the optimizer's step to other last digits on this machine)
    assert grid.run_cells(out, [cell], os.cpu_count() or 1) == 0
    assert here("experiments.claims", "rerun", "matched-cost", cell["name"]).stdout.endswith("fields\n")
    record = out / "runs" / cell["name"] / "metrics.json"
    published = json.loads(record.read_text())

    def run(command, **_):  # the same command again, but its record says other things
        changed = dict(published, test=0.5, extra=1, wall_time_s=0.0, config=dict(published["config"], out="x"))
        changed["versions"] = dict(published["versions"], cpu=processor)
        (Path(command[command.index("--out") + 1]) / "metrics.json").write_text(json.dumps(changed))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(claims.subprocess, "run", run)
    processor = published["versions"]["cpu"]
    changed = here("experiments.claims", "rerun", "matched-cost", cell["name"], check=False)
    assert changed.returncode == 1 and changed.stdout.endswith("differs in extra, test\n")  # not times, not --out
    processor = "Another CPU, AVX2"  # where the processors differ, the rerun names both
    changed = here("experiments.claims", "rerun", "matched-cost", cell["name"], check=False).stdout.splitlines()
    assert changed[-2].endswith("differs in extra, test") and changed[-1] == (
        f"recorded on {published['versions']['cpu']}, rerun on Another CPU, AVX2: a rerun is bit-identical on the "
        "same kind of processor only"
    )
    record.write_text(json.dumps(dict(published, device="cpu (x86_64, 2 threads)")))  # a record of two threads
    changed = here("experiments.claims", "rerun", "matched-cost", cell["name"], check=False).stdout.splitlines()
    assert changed[-1] == "recorded on 2 threads: such reruns may differ in the last digits; one thread's do not"


def test_a_second_grid_on_one_folder_is_refused_naming_the_holder(tmp_path):
    from experiments.grid import grid_lock

    with grid_lock(tmp_path):
        result = sh(
            [
                sys.executable,
                "-m",
                "experiments.grid",
                "--budget",
                "smoke",
                "--out",
                str(tmp_path),
                "--methods",
                "full",
                "--tasks",
                "duplicates",
            ],
            check=False,
        )
    assert result.returncode != 0 and f"another grid is running in {tmp_path} (pid {os.getpid()})" in result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "grid.lock").exists()  # released, the file gone


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_grid_leaves_no_cell_running(tmp_path):
    out = tmp_path / "grid"
    grid = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "experiments.grid",
            "--budget",
            "smoke",
            "--out",
            str(out),
            "--methods",
            "full",
            "--tasks",
            "duplicates",
            "--set",
            "steps=100000",
        ],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not processes(str(out), without="experiments.grid"):
        assert grid.poll() is None and time.time() < deadline, "no cell started"
        time.sleep(0.1)
    grid.send_signal(signal.SIGKILL)  # the grid alone: its cell must not outlive it
    grid.wait()
    deadline = time.time() + 30
    while processes(str(out), without="experiments.grid"):
        assert time.time() < deadline, "a cell outlived its killed grid"
        time.sleep(0.1)


STAND_IN = """import sys
from pathlib import Path
from experiments import claims, run_all
sys.executable, out = sys.argv[1], Path(sys.argv[2])
if sys.argv[3] == "step times":
    run_all.run_step_times(out, "smoke", ["duplicates"], 0)
else:
    benchmark = claims.Claim("bench", "a benchmark", "output", "", commands=(f"python -m experiments.scaling {out}",))
    claims.run_output(benchmark, out)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("phase", ["step times", "claims"])
def test_a_killed_driver_leaves_no_benchmark_running(tmp_path, phase):
    """Before: SIGKILL of ./run_all.sh in its step-time phase, or of experiments.claims running a benchmark, left
    the benchmark running. The driver's own code runs with a stand-in python whose child sleeps for minutes."""
    from test_entry_points import kill_and_watch_the_child

    stand_in = tmp_path / "python"
    stand_in.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import time; time.sleep(600)' \"$@\"\n")
    stand_in.chmod(0o755)
    record = tmp_path / "runs" / "full-duplicates-cpu-s0" / "metrics.json"  # a task with a complete full record
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"status": "complete"}))
    kill_and_watch_the_child(
        [sys.executable, "-c", STAND_IN, str(stand_in), str(tmp_path), phase],
        ("time.sleep(600)", str(tmp_path)),
        "run_all",
        tmp_path,
    )


def test_a_rerun_with_another_budget_redoes_the_cell_instead_of_mixing(tmp_path, here):
    args = ["--budget", "smoke", "--out", str(tmp_path), "--methods", "full", "--tasks", "duplicates"]
    here("experiments.grid", *args, *FAST)
    record = tmp_path / "runs" / "full-duplicates-cpu-s0" / "metrics.json"
    assert json.loads(record.read_text())["steps"] == 1
    same = here("experiments.grid", *args, *FAST)
    assert "complete, kept" in same.stdout
    changed = here("experiments.grid", *args, "--set", "steps=2", "--set", "final_eval_batches=1")
    assert "made with another command" in changed.stdout and "redone" in changed.stdout
    assert json.loads(record.read_text())["steps"] == 2


def test_a_claim_s_cells_wait_for_their_family_s_learning_rate_and_then_take_the_best(tmp_path, monkeypatch, capsys):
    """matched-cost: stage 1 runs four learning rates per family at seed 0; each stage-2 cell waits for its family's
    records, then takes the rate of the best validation accuracy, in the same run; a rate beyond an edge is not
    needed where the best lies inside the four."""
    from experiments import claims, grid

    claim, runs = claims.BY_NAME["matched-cost"], tmp_path / "runs"
    first = [c for c in claim.cells(runs) if "waiting" not in c]
    assert {c["settings"]["lr"] for c in first} == {"3e-4", "1e-3", "3e-3", "1e-2"}
    assert all(c["seed"] == 0 and "-lr" in c["name"] for c in first)  # stage 2 waits for them
    valid = {"3e-4": 0.7, "1e-3": 0.9, "3e-3": 0.8, "1e-2": 0.6}

    def run_cells(out, cells, jobs):  # the grid: stage-1 records whose validation metric depends on the rate
        for cell in cells:
            write_record(out / "runs" / cell["name"], cell, valid.get(cell["settings"]["lr"], 0.5))
        return 0

    monkeypatch.setattr(grid, "run_cells", run_cells)
    assert claims.run_claim(claim, tmp_path, "window-d0.125-*recall-cpu-s0", 1) == 0
    cells = {c["name"]: c for c in claim.cells(runs)}
    window = cells["window-d0.125-recall-cpu-s0"]["command"]
    assert window[window.index("--lr") + 1] == "1e-3" and (runs / "window-d0.125-recall-cpu-s0").is_dir()
    assert "window-d0.125-lrbeyond-recall-cpu-s0" not in cells and "waiting" in cells["bigbird-d0.125-recall-cpu-s0"]
    monkeypatch.setattr(grid, "run_cells", lambda out, cells, jobs: 0)  # stage 1 leaves no record
    assert claims.run_claim(claim, tmp_path, "sbm-lambda1e-2-recall-cpu-s4", 1) == 1
    assert "sbm-lambda1e-2-recall-cpu-s4: not run, it waits for the records that give --lr" in capsys.readouterr().out


def test_the_whole_claim_runs_its_learning_rates_then_the_first_budgets_then_the_rest(tmp_path, monkeypatch):
    """One command runs matched-cost in its phases: every learning rate first (a cell waiting on its family's rates
    is not skipped ahead of), then every task's 12.5% and 25% settings, then its 6.25% ones, then the rest, each
    phase one grid wave."""
    from experiments import claims, grid
    from experiments.claims import matched_cost as mc

    waves = []

    def run_cells(out, cells, jobs):
        waves.append({mc.phase(c) for c in cells})
        for cell in cells:
            write_record(out / "runs" / cell["name"], cell, 0.9 if cell["settings"]["lr"] == "1e-3" else 0.5)
        return 0

    monkeypatch.setattr(grid, "run_cells", run_cells)
    assert claims.run_claim(mc.CLAIM, tmp_path, "*", 2) == 0
    assert waves == [{0}, {1}, {2}, {3}]
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == len(mc.CLAIM.cells(tmp_path / "runs")) == 44 + 650  # no rate beyond 1e-3, an inside best


def claim_records(tmp_path, claim_name, tests, **fields):
    """Records for the cells of a claim whose setting (the cell's name without task, preset and seed) is in
    ``tests`` (setting → test accuracy), with ``fields`` (setting → extra fields) merged in."""
    from experiments import claims

    claim = claims.BY_NAME[claim_name]
    for cell in claim.cells(tmp_path / claim.name / "runs"):
        setting = cell["name"].rsplit(f"-{cell['task']}-", 1)[0]
        if setting in tests:
            folder = tmp_path / claim.name / "runs" / cell["name"]
            write_record(folder, cell, tests[setting])
            record = json.loads((folder / "metrics.json").read_text())
            record.update(task=cell["task"], base_rate=0.632, scored={"test": 32768}, **fields.get(setting, {}))
            (folder / "metrics.json").write_text(json.dumps(record))
    return claim, tmp_path / claim.name


def test_the_fig4_rule_reproduces_only_when_full_and_sbm_reach_99_and_the_low_rank_methods_do_not(tmp_path):
    from experiments.claims.claim import REPRODUCED

    claim, folder = claim_records(tmp_path / "a", "sbm-fig4", {"full": 0.9998, "sbm": 0.995, "performer": 0.74})
    ours, verdict = claim.rule(folder)
    assert verdict == REPRODUCED and ours == "≥ 99%: full, sbm; below: performer 74.0%"
    claim, folder = claim_records(tmp_path / "b", "sbm-fig4", {"full": 0.9998, "sbm": 0.995, "linear": 0.9967})
    assert claim.rule(folder)[1] == "differs: linear reaches 99% too"
    claim, folder = claim_records(tmp_path / "c", "sbm-fig4", {"full": 0.9998, "sbm": 0.84})
    assert claim.rule(folder)[1] == "differs: sbm below 99%"


def test_the_matched_cost_plot_draws_stage_2_beside_the_gpu_runs_and_its_caption_states_the_verdicts(tmp_path):
    """Five settings on every task, 5 seeds: the plot is drawn and embedded in the claim's section, and its caption
    gives each budget's paired difference with its interval and verdict (recall at 12.5%: Reformer against BigBird,
    the better fixed family on validation; at 25%, against the head allocation); a GPU job's recall runs add a
    panel."""
    pytest.importorskip("matplotlib")
    from experiments import plots, report

    settings = {  # setting → (test accuracy, computed pairs)
        "full": (1.0, 1.0),
        "window-d0.125": (0.3, 0.13),
        "bigbird-d0.125": (0.35, 0.137),
        "window-full1-d0.125": (0.95, 0.23),
        "reformer-h1-b8": (0.9, 0.12),
    }
    tests, pairs = ({s: v[i] for s, v in settings.items()} for i in (0, 1))
    fields = {s: {"computed_pairs": p, "flops_per_example": {"attention": p}} for s, p in pairs.items()}
    claim, folder = claim_records(tmp_path, "matched-cost", tests, **fields)
    for path in folder.glob("runs/reformer-*/metrics.json"):  # Reformer's seeds differ: 0.90, 0.88, ..., 0.82
        record = json.loads(path.read_text())
        path.write_text(json.dumps(dict(record, test=0.9 - 0.02 * record["seed"])))
    for setting, ms in (("full", 40.0), ("window", 30.0), ("reformer", 55.0)):  # the GPU job's frontier stage
        (tmp_path / "gpu" / "nvidia-h200" / "frontier" / setting).mkdir(parents=True)
        record = {"status": "complete", "test": 0.9, "median_step_ms": ms, "config": {"seq_len": 1024}}
        write_json(tmp_path / "gpu" / "nvidia-h200" / "frontier" / setting / "metrics.json", record)
    captions = plots.draw_published(tmp_path, tmp_path / "plots", report.COSTS)
    assert list(captions) == ["matched-cost"] and (tmp_path / "plots" / "matched-cost.png").stat().st_size > 0
    caption = captions["matched-cost"]
    assert (
        "recall 12.5%: +0.510 [+0.486, +0.534] provisional (runs to come: " in caption and "recall 6.25%" not in caption
    )
    assert "recall 25%: -0.090 [-0.114, -0.066] provisional" in caption and "; nvidia-h200: the GPU job's" in caption
    assert "(plots/matched-cost.png)" in report.claim_section(claim, tmp_path, captions)


def test_the_claims_table_puts_the_rule_s_verdict_beside_the_paper_s_figure(tmp_path):
    from experiments import claims, report

    claim_records(
        tmp_path,
        "sbm-fig4",
        {
            m: 0.995 if m in ("full", "sbm") else 0.7
            for m in ("full", "sbm", "performer", "linformer", "linear", "nystromformer", "ssa", "reformer")
        },
    )
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in report.claims_table(tmp_path, "x.md").splitlines()[2:]
    }
    fig4 = rows["[SBM-Transformer Fig. 4](x.md#sbm-transformer-fig-4-duplicates-every-method-the-papers-recipe)"]
    assert fig4 == [
        claims.BY_NAME["sbm-fig4"].figure,
        "≥ 99%: full, sbm; below: "
        + ", ".join(f"{m} 70.0%" for m in ("linear", "linformer", "nystromformer", "performer", "reformer", "ssa")),
        "reproduced",
    ]
    listops = next(row for name, row in rows.items() if name.startswith("[SBM-Transformer Tables 1-2]"))
    assert listops[1:] == ["–", "not run yet (9 runs)"]
    claim_records(tmp_path, "sbm-listops", {"full": 0.38})  # its three seeds of nine runs
    listops = next(line for line in report.claims_table(tmp_path, "x.md").splitlines() if "Tables 1-2]" in line)
    assert "| in progress: 3 of 9 runs |" in listops


def test_a_smoke_report_says_first_that_its_numbers_carry_no_information(tmp_path):
    from experiments import report

    quick_record(tmp_path, "full", "duplicates", 0.5, attention=400, step_ms=10.0)  # at the base rate
    (tmp_path / "grid.json").write_text(json.dumps({"budget": "smoke", "methods": ["full"], "not_run": []}))
    text = report.write_run_report(tmp_path)
    assert text.splitlines()[0] == report.SMOKE_LINE and "carry no information" in text.splitlines()[0]
    assert "NOT learned" not in text and "(base rate)" not in text and "Quick grid" not in text
    assert "Quick targets" not in text  # a smoke run has no targets to meet
    if __import__("importlib").util.find_spec("matplotlib"):
        assert "![Smoke grid:" in text
    (tmp_path / "grid.json").write_text(json.dumps({"budget": "quick", "methods": ["full"], "not_run": []}))
    text = report.write_run_report(tmp_path)
    assert text.startswith("# ./run_all.sh report") and "| duplicates | 50.00" in text  # the targets table
