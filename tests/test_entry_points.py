"""Every entry point under bad input and at its edges: a bad option, size, list or folder is refused in one line
(exit 2) before anything is made, in the folder given or the current one; a tool killed while a child process
measures or trains leaves no child running; a scaling table whose every cell failed exits 1. The training entry
points' run folders under faults are tests/test_faults.py."""

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, exit_code, processes

NO_CUDA = "--device cuda was asked for, but CUDA is not available on this machine"
BIG = str(10**20)  # a size or seed of 1e20
# (module whose main() is the entry point, its arguments, words of the one-line message). {file} is a regular
# file, {tmp} the test's folder, {root} the repository.
CASES = [
    ("bench.train", ["--task", "duplicates", "--out", "{file}"], "argument --out: '{file}' is a file, not a folder"),
    ("bench.train", ["--task", "duplicates", "--batch-size", "100000000"], "must be a batch size from 1 to 1,048,576"),
    ("sbm_transformer", ["--task", "duplicates", "--delta", "inf"], "argument --delta: must be a finite number"),
    ("sbm_transformer", ["--task", "duplicates", "--out", ""], "argument --out: must name a folder"),
    ("ssa", ["--task", "duplicates", "--out", "{file}/run"], "cannot be made: {file} is a file"),
    ("kernel_sparse", ["--task", "wikitext2", "--out", "{tmp}/" + "n" * 300], "File name too long"),
    ("experiments.grid", ["--methods", ""], "--methods names none (leave the option out for the default)"),
    ("experiments.grid", ["--tasks", ""], "--tasks names none"),
    ("experiments.grid", ["--seeds", ""], "--seeds takes comma-separated integers from 0 to 4,294,967,295, got ''"),
    ("experiments.grid", ["--seeds", "0,-1"], "--seeds takes comma-separated integers"),
    ("experiments.grid", ["--device", "cuda"], NO_CUDA),
    ("experiments.grid", ["--out", "{file}"], "argument --out: '{file}' is a file, not a folder"),
    ("experiments.grid", ["--jobs", "0"], "argument --jobs: must be a positive integer from 1 to"),
    (
        "experiments.grid",
        ["--set", "bogus=1", "--plan-only"],
        "--set: --bogus 1 is not an option of python -m bench.train, which trains full, linear",
    ),
    (
        "experiments.grid",
        ["--set", "lr=nan", "--plan-only"],
        "--set: argument --lr: must be a positive number up to 1e37",
    ),
    (
        "experiments.grid",
        ["--set", f"seq_len={BIG}", "--plan-only"],
        "--set: argument --seq-len: must be a length from 1 to",
    ),
    ("experiments.run_all", ["--jobs", "0"], "argument --jobs: must be a positive integer from 1 to"),
    ("experiments.run_all", ["--methods", ""], "--methods names none"),
    (
        "experiments.run_all",
        ["--lengths", ""],
        "argument --lengths: must be comma-separated lengths from 1 to 1,048,576",
    ),
    ("experiments.run_all", ["--lengths", "0"], "argument --lengths: must be comma-separated lengths"),
    ("experiments.run_all", ["--device", "cuda"], NO_CUDA),
    ("experiments.run_all", ["--out", ""], "argument --out: must name a folder"),
    ("experiments.run_all", ["--out", "{file}/grid"], "cannot be made: {file} is a file"),
    (
        "experiments.report",
        ["--results", "{root}/results", "--readme", "{tmp}/missing.md"],
        "--readme: {tmp}/missing.md is not a file this process can read and write",
    ),
    ("experiments.report", ["--results", "{root}/results", "--readme", "{tmp}"], "is not a file this process can read"),
    ("experiments.report", ["--results", ""], "--results: no folder ''"),
    ("experiments.report", ["--run", ""], "--run: no folder ''"),
    (
        "experiments.report",
        ["--results", "{root}/results", "--readme", ""],
        "--readme: '' is not a file this process can",
    ),
    ("experiments.scaling", ["--out", "{file}"], "argument --out: '{file}' is a file, not a folder"),
    ("experiments.scaling", ["--lengths", "2000000"], "argument --lengths: must be comma-separated lengths from 1 to"),
    ("experiments.scaling", ["--batch-size", "0"], "argument --batch-size: must be a batch size from 1"),
    ("experiments.scaling", ["--repeats", "0"], "argument --repeats: must be a positive integer from 1"),
    ("experiments.scaling", ["--device", "cuda"], NO_CUDA),
    ("experiments.sbm_scaling", ["--out", ""], "argument --out: must name a folder"),
    ("experiments.sbm_scaling", ["--heads", "0"], "argument --heads: must be a count from 1 to 1,024"),
    ("experiments.sbm_scaling", ["--lengths", BIG], "argument --lengths: must be comma-separated lengths from 1 to"),
    ("experiments.sbm_scaling", ["--densities", ""], "--densities must be comma-separated densities in (0, 1), got ''"),
    (
        "experiments.claims",
        ["run", "sbm-listops", "--jobs", BIG, "--cells", "none", "--out", "{tmp}/claim"],
        "argument --jobs: must be a positive integer from 1 to 1,000,000,000",
    ),
    ("experiments.fastrg_bench", ["--lengths", BIG], "argument --lengths: must be comma-separated lengths from 1 to"),
    ("experiments.fastrg_bench", ["--repeats", BIG], "argument --repeats: must be a positive integer from 1 to"),
    ("experiments.fastrg_bench", ["--seed", BIG], "argument --seed: must be a seed from 0 to 4,294,967,295"),
    ("experiments.fastrg_bench", ["--threads", BIG], "argument --threads: must be a thread count (0: torch's default)"),
    (
        "experiments.fastrg_bench",
        ["--densities", "nan"],
        "--densities: must be comma-separated densities in (0, 1], got nan",
    ),
    ("experiments.peers", ["--repeats", BIG], "argument --repeats: must be a positive integer from 1 to"),
    ("experiments.peers", ["--threads", BIG], "argument --threads: must be a thread count (0: torch's default)"),
    ("experiments.peers", ["--out", ""], "argument --out: must name a folder"),
    ("experiments.ssa_table", ["--out", ""], "argument --out: must name a folder"),
    ("experiments.ssa_table", ["--seq-len", "0"], "argument --seq-len: must be a length from 1"),
    (
        "experiments.ssa_table",
        ["--steps", "2", "--batch-size", "0"],
        "argument --batch-size: must be a batch size from 1",
    ),
    ("experiments.ssa_table", ["--steps", "2", "--sigma", "nan"], "argument --sigma: must be a finite number, got nan"),
    ("experiments.ssa_table", ["--steps", "2", "--device", "cuda"], NO_CUDA),
    (
        "experiments.step_time",
        ["--task", "duplicates", "--device", "cuda"],
        "--device cuda: this tool times training steps on the CPU only",
    ),
]


def tree(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    "module, args, message", CASES, ids=[f"{m}:{' '.join(a)[:40] or 'empty'}" for m, a, _ in CASES]
)
def test_bad_input_is_one_line_and_makes_nothing(tmp_path, monkeypatch, capsys, module, args, message):
    """Run in this process from an empty current folder, so that a default or an empty --out would show."""
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    here = tmp_path / "here"
    here.mkdir()
    (tmp_path / "file").write_text("a file")
    monkeypatch.chdir(here)
    monkeypatch.setenv("SPARSE_ATTN_OFFLINE", "1")
    fill = {"file": tmp_path / "file", "tmp": tmp_path, "root": ROOT}
    argv = [a.format(**fill) for a in args]
    before = tree(tmp_path)
    code = exit_code(importlib.import_module(module).main, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err and "error: " in err[-1] and "Traceback" not in "\n".join(err), (code, err)
    assert message.format(**fill) in err[-1], err[-1]
    assert tree(tmp_path) == before


def kill_and_watch_the_child(command: list, child: tuple, without: str, tmp_path: Path) -> None:
    """Starts ``command``, waits for its child (a process whose command line holds ``child``), kills the parent
    with SIGKILL and requires the child gone within 30 s."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", SPARSE_ATTN_OFFLINE="1")
    parent = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not processes(*child, without=without):
            assert parent.poll() is None and time.time() < deadline, "no child started"
            time.sleep(0.1)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 30
        while processes(*child, without=without):
            assert time.time() < deadline, "a child outlived its killed parent"
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in processes(*child, without=without):  # what a failed test left: this test's own children
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_scaling_table_leaves_no_cell_measuring(tmp_path):
    """Before: SIGKILL of ./run_all.sh in its scaling phase (experiments.scaling, and experiments.sbm_scaling through it)
    left the measuring cell running."""
    repeats = 987_651  # a cell that would measure for minutes, and a mark to find it by
    kill_and_watch_the_child(
        [
            sys.executable,
            "-m",
            "experiments.scaling",
            "--methods",
            "full",
            "--lengths",
            "256",
            "--warmup-iters",
            "0",
            "--repeats",
            str(repeats),
            "--out",
            str(tmp_path),
        ],
        ("--cell", f'"repeats": {repeats}'),
        "",
        tmp_path,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_ssa_table_leaves_no_setting_training(tmp_path):
    text = tmp_path / "text.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 400)
    out = tmp_path / "table"
    kill_and_watch_the_child(
        [
            sys.executable,
            "-m",
            "experiments.ssa_table",
            "--out",
            str(out),
            "--seq-len",
            "32",
            "--steps",
            "100000",
            "--settings",
            "S0",
            "--data-file",
            str(text),
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
            "2",
            "--eval-context",
            "8",
        ],
        ("ssa.py", str(out / "S0")),
        "experiments.ssa_table",
        tmp_path,
    )


def test_a_scaling_table_whose_every_cell_failed_exits_1(tmp_path, capsys):
    """Before: exit 0 with a table of failures. Linformer has no causal form: its cell fails."""
    from experiments import scaling

    code = scaling.main(
        [
            "--methods",
            "linformer",
            "--causal",
            "--lengths",
            "16",
            "--warmup-iters",
            "0",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "error: 1 of 1 cells failed" in err and (tmp_path / "scaling.json").is_file()


def test_an_sbm_scaling_table_with_a_failed_cell_exits_1(tmp_path, monkeypatch, capsys):
    """Before: exit 0 with a table of failures (at --lengths 1e20, every cell)."""
    from experiments import sbm_scaling

    monkeypatch.setattr(sbm_scaling, "run_cell", lambda cell, allocator, timeout: {"error": "failed (test)"})
    code = sbm_scaling.main(["--lengths", "16", "--kinds", "full,core", "--densities", "0.5", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "error: 2 of 2 cells failed" in err and (tmp_path / "sbm_scaling.json").is_file()
