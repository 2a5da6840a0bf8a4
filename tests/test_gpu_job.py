"""The GPU job (experiments/gpu.py) without a GPU: its refusals, its crossover and status rules, and its published
record, whose README must be what the job writes from its gpu.json. `.ci/run` runs the whole job at toy sizes on
the CPU (``--device cpu --tiny``), so that no stage rots between the sessions that have a GPU."""

import pytest

from bench.files import read_json
from conftest import ROOT, exit_code
from experiments import gpu


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--device", "cpu"], "--device cpu measures nothing a GPU would: add --tiny"),
        (["--device", "cpu", "--tiny", "--stages", "scaling,fast"], "--stages takes a comma-separated list of"),
        (["--device", "cpu", "--tiny", "--budget", "0"], "argument --budget"),
        (["--device", "tpu"], "argument --device: must be auto, cpu, cuda or cuda:N"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, said, capsys, tmp_path):
    assert exit_code(gpu.main, [*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert said in err[-1] and not (tmp_path / "out").exists()


def row(method, n, ms):
    return {"method": method, "n": n, "fwdbwd_ms": ms}


def test_a_crossover_is_the_first_length_from_which_a_method_stays_faster_than_full():
    rows = [
        row("full", 1024, 1.0),
        row("full", 2048, 3.0),
        row("full", 4096, 9.0),
        row("ssa", 1024, 2.0),
        row("ssa", 2048, 2.5),
        row("ssa", 4096, 4.0),  # faster from 2048 on
        row("window", 1024, 0.5),
        row("window", 2048, 4.0),
        row("window", 4096, 5.0),  # faster, slower, faster
        row("linear", 1024, 2.0),
        row("linear", 2048, 4.0),
        {"method": "linear", "n": 4096, "error": "x"},
    ]
    found = {r["method"]: r["faster than full from"] for r in gpu.crossovers(rows)}
    assert found["ssa"] == 2048 and found["window"] == 4096 and found["linear"] is None and "sbm" not in found


def test_a_stage_fails_on_a_failed_row_not_on_rows_the_budget_or_memory_left_out():
    assert gpu.stage_status([{"code": 0}, {"error": "out of memory at 8192"}]) == "ok"
    assert gpu.stage_status([{"code": 0}, {"status": "not run: budget spent"}]) == "1 not run"
    assert gpu.stage_status([{"code": 1}, {"error": "RuntimeError: x"}, {"code": "timed out"}]) == "3 of 3 failed"


@pytest.mark.parametrize(
    "folder", sorted(p.parent for p in (ROOT / "results" / "gpu").glob("*/gpu.json")), ids=lambda p: p.name
)
def test_a_published_record_s_readme_is_what_the_job_writes_from_its_json(folder):
    record = read_json(folder / "gpu.json")
    assert record["device"] != "cpu" and record["size"] == "full", "a published GPU record is a full-size CUDA run"
    assert (folder / "README.md").read_text() == gpu.markdown(record), (
        f"rewrite it: python -m experiments.gpu --render {folder.relative_to(ROOT)}"
    )


def test_the_frontier_stage_keeps_complete_runs_resumes_cut_ones_and_starts_the_rest(tmp_path, monkeypatch):
    """A short budget does what it can and the next job continues: a complete record is read, not rerun; a folder
    with a checkpoint goes on with --resume; the others start; a run cut at the deadline is resumable, not failed."""
    settings = list(gpu.frontier_settings(32))
    folders = {label: tmp_path / "frontier" / slug for label, slug in zip(settings[:2], ("full", "window"))}
    folders["full"].mkdir(parents=True)
    (folders["full"] / "metrics.json").write_text('{"status": "complete", "test": 0.5, "computed_pairs": 1.0}')
    folders["window"].mkdir(parents=True)
    (folders["window"] / "checkpoint.pt").write_bytes(b"")
    calls = []
    monkeypatch.setattr(
        gpu, "run", lambda argv, deadline, cap: calls.append(argv) or {"code": "timed out", "seconds": 1}
    )
    rows = gpu.frontier_rows("cpu", "tiny", gpu.time.monotonic() + 600, tmp_path)
    assert [r["setting"] for r in rows] == settings and len(calls) == len(settings) - 1
    assert rows[0]["status"] == "complete" and rows[0]["test"] == 0.5
    assert calls[0][-1] == "--resume" and all(argv[-1] == "--overwrite" for argv in calls[1:])
    assert {r["status"] for r in rows[1:]} == {"resumable"} and gpu.stage_status(rows) == "ok"
    assert all(argv[argv.index("--task") + 1] == "recall" for argv in calls)


def test_the_frontier_runs_sbm_on_the_path_the_scaling_stage_timed_faster_and_keeps_a_started_one(tmp_path):
    """At the frontier's length where the scaling stage measured it, else at its shortest; a failed or missing
    cell never wins; a run already started keeps its path (a resume cannot change it)."""
    rows = [
        {"method": "sbm", "n": 64, "fwdbwd_ms": 5.0},
        {"method": "sbm@0.26/tile", "n": 64, "fwdbwd_ms": 9.0},
        {"method": "sbm", "n": 1024, "fwdbwd_ms": 30.0},
        {"method": "sbm@0.26/tile", "n": 1024, "fwdbwd_ms": 12.0},
        {"method": "sbm@0.26/tile", "n": 2048, "error": "out of memory at 2048"},
    ]
    assert gpu.fastest_sbm_path(rows, 1024, tmp_path) == "tile"
    assert gpu.fastest_sbm_path(rows, 32, tmp_path) == "fast"  # not measured at 32: compared at 64
    assert gpu.fastest_sbm_path(rows, 2048, tmp_path) == "fast"  # compared at 64, the shortest measured
    assert (
        gpu.fastest_sbm_path(rows[2:3], 1024, tmp_path) == "fast" and gpu.fastest_sbm_path([], 1024, tmp_path) == "fast"
    )
    started = tmp_path / "frontier" / "sbm-fast-path"
    started.mkdir(parents=True)
    (started / "checkpoint.pt").write_bytes(b"")
    assert gpu.fastest_sbm_path(rows, 1024, tmp_path) == "fast"
    assert list(gpu.frontier_settings(1024, "tile"))[-1] == "sbm (tile path)"
