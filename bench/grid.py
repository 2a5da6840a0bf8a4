"""The comparison grid: methods × tasks × seeds, each cell its own process writing its own results record.

    python -m bench.grid                          # the quick budget into runs/grid-quick (what ./run_all.sh runs)
    python -m bench.grid --budget smoke           # every cell at a handful of steps: checks the plumbing
    python -m bench.grid --budget full            # paper presets, 3 seeds (a GPU job)
    python -m bench.grid --out X --methods full,sbm --tasks duplicates

Budgets (BUDGETS): ``quick`` trains each task at the per-task settings of QUICK, calibrated so that full
attention clearly learns every task shown within the whole ./run_all.sh's 30 minutes on a 2-core CPU; a task
that cannot be learned in that time is left out (QUICK_LEFT_OUT says where it is measured instead). ``smoke``
runs a few steps of every cell at tiny shapes. ``full`` runs the paper presets. Every cell of a task uses the
same backbone and recipe; only the attention differs, and every record states its config.

Cells are planned before any process starts (OUT/grid.json): a method with no form for a task (registry
``causal=False`` on a causal LM task) is "n/a", and a task whose data are missing is one "no data" line with
the task's own message, instead of one failure per method. The kernel method is a masked-LM pipeline
(paper 003 §4) and runs on ``wikitext2`` only, where no other method runs (bench/methods.py).

Resumable within its folder: a cell whose record is complete and whose command is the planned one is kept;
a cell left with a checkpoint is resumed; a cell made with another budget is redone from scratch, and the
grid says so. A folder holds one grid at a time (OUT/grid.lock names the holder); stopping the grid
(SIGTERM, SIGINT, or SIGKILL on Linux) stops its cells too. A failed cell writes OUT/runs/CELL/failed.json
with the last lines of its output, and the grid goes on. --jobs runs cells side by side, each on
cores // jobs threads; the progress line gives elapsed time and an ETA scaled by how the finished cells
compared with their estimates.
"""
import argparse
import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from bench import cli
from bench import methods as registry
from bench.data import DataError, default_data_dir  # light; bench.tasks (torch) is imported where a task is built

ROOT = Path(__file__).resolve().parent.parent
GRID_TASKS = ["duplicates", "listops", "bytes", "text", "image", "pathfinder", "retrieval", "wikitext2"]
EVAL = ["--eval-batches", "2", "--final-eval-batches", "8"]
KERNEL_QUICK = ["--analysis-sequences", "32", "--predictor-steps", "100", "--finetune-steps", "100",
                "--thresholds", "0.3,0.5,0.7", "--top-ks", "1,3,5"]
# Per task: overrides of the CPU preset, and the CPU seconds of full attention's cell (process start and data
# included; one measured run on a 2-core machine) from which the grid estimates its time.
QUICK: Dict[str, tuple] = {
    # SBM paper §5.1 at 64 tokens: full attention passes 99% token accuracy in 600 steps of batch 128 (lr 2e-3;
    # 400 steps stay at 77%). Large batches and few steps: at these lengths every method but full attention
    # pays a fixed cost per step (Reformer and SBM 8-11× full attention's step), not per example.
    "duplicates": (["--seq-len", "64", "--steps", "600", "--batch-size", "128", "--lr", "2e-3", "--warmup", "50",
                    "--eval-every", "300", *EVAL], 10),
    # ListOps with LRA's rules at lengths 25-100: full attention reaches ~29% in 150 steps (majority class 16%).
    "listops": (["--seq-len", "100", "--steps", "300", "--eval-every", "150", "--eval-batches", "2",
                 "--final-eval-batches", "16"], 14),
    "bytes": (["--steps", "100", "--eval-every", "50", *EVAL], 19),
    # LRA Image at 8x8 (4x4 blocks averaged), no dropout: full attention reaches 27-29% (chance 10%) in 400-600
    # steps of batch 128 at lr 3e-3; 600 steps of batch 64 at lr 2e-3 stay at 22%.
    "image": (["--seq-len", "64", "--steps", "500", "--batch-size", "128", "--lr", "3e-3", "--dropout", "0",
               "--warmup", "50", "--eval-every", "250", "--eval-batches", "2", "--final-eval-batches", "16"], 36),
    "wikitext2": (["--steps", "300", "--eval-every", "150", *EVAL, *KERNEL_QUICK], 260),
}
# What full attention must reach for a task to be shown in the quick preview (the report checks each run):
# (kind, amount, in words), kind "min" an absolute metric, "above_base"/"below_base" relative to the base rate.
QUICK_TARGETS = {
    "duplicates": ("min", 0.95, "95% token accuracy"),
    "listops": ("above_base", 0.05, "majority class + 5 points"),
    "image": ("min", 0.20, "2× chance of 10 classes"),
    "bytes": ("below_base", 0.5, "0.5 bits per byte below the unigram entropy"),
    "text": ("min", 0.60, "60%"),
    "pathfinder": ("min", 0.60, "60%"),
}
# Tasks that full attention does not learn within the quick budget: never shown at their base rate.
QUICK_LEFT_OUT = {
    "text": "full attention reaches 52% on byte-level IMDB at 256 bytes in 600 steps and 58% in 1500 (11 minutes "
            "of one core for one method), short of 60%; measured by the paper preset (`./run_all.sh --full`, a GPU job)",
    "pathfinder": "full attention stays at 51% on 16x16 images after 600 steps; measured by the paper preset "
                  "(`./run_all.sh --full`, a GPU job)",
    "retrieval": "LRA's AAN files are user-supplied, so no quick budget was calibrated on them; measured by the paper "
                 "preset (`./run_all.sh --full`)",
}
# ListOps draws its 24,000 trees at setup: at 100 tokens that is fastest (shorter lengths reject more trees).
SMOKE_SHAPES = {"duplicates": 16, "listops": 100, "bytes": 32, "text": 32, "image": 16, "pathfinder": 256,
                "retrieval": 32, "wikitext2": 32}
SMOKE = ["--steps", "2", "--batch-size", "2", "--eval-every", "2", "--eval-batches", "1", "--final-eval-batches",
         "1", "--warmup", "1", "--dim", "16", "--heads", "2", "--head-dim", "8", "--mlp-dim", "16", "--depth", "1"]
KERNEL_SMOKE = ["--analysis-sequences", "2", "--predictor-steps", "1", "--predictor-batch", "2",
                "--predictor-rows", "2", "--finetune-steps", "1", "--thresholds", "0.5", "--top-ks", "1",
                "--handcrafted-k", "2", "--learned-kernels", "2", "--hidden", "4"]
PROCESS_SECONDS = 6  # starting python, importing torch and setting up a task, per cell


@dataclass(frozen=True)
class Budget:
    preset: str
    seeds: tuple
    left_out: Dict[str, str] = field(default_factory=dict)

    def task_args(self, name: str, task: str, method: str) -> List[str]:
        if name == "quick":
            return list(QUICK[task][0])
        if name == "smoke":
            extra = KERNEL_SMOKE if method == "kernel" else []
            return ["--seq-len", str(SMOKE_SHAPES[task]), *SMOKE, *extra]
        return []

    def estimate(self, name: str, task: str, method: str) -> float:
        """Seconds one cell is expected to take on one thread (full: unknown, so a nominal hour)."""
        if name == "smoke":
            return PROCESS_SECONDS + (6 if method == "kernel" else 2)
        if name == "quick":
            return QUICK[task][1] * registry.get(method).cost
        return 3600.0


BUDGETS = {"quick": Budget("cpu", (0,), QUICK_LEFT_OUT), "smoke": Budget("cpu", (0,)),
           "full": Budget("paper", (0, 1, 2))}


def cell_name(method: str, task: str, preset: str, seed: int) -> str:
    return f"{method}-{task}-{preset}-s{seed}"


def read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def is_complete(folder: Path) -> bool:
    return (read_json(folder / "metrics.json") or {}).get("status") == "complete"


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ planning
def data_problem(task: str, seq_len: int, data_dir: Path) -> Optional[str]:
    """The task's own message when its data are missing (tasks that read files only), else None."""
    from bench.tasks import get_task
    instance = get_task(task)
    if not instance.reads_files:
        return None
    try:
        instance.setup(seq_len, 0, data_dir, 0)
    except DataError as exc:
        return str(exc)
    return None


def plan(budget_name: str, methods: List[str], tasks: List[str], seeds: List[int], extra: List[str],
         data_dir: Path) -> dict:
    """Every cell with its command, or why it does not run (n/a, no data, left out of this budget)."""
    from bench.tasks import get_task
    budget = BUDGETS[budget_name]
    cells, not_run, missing, left_out = [], [], {}, {}
    for task in tasks:
        if task in budget.left_out:
            left_out[task] = budget.left_out[task]
            continue
        causal = get_task(task).head == "lm"
        runnable = [m for m in methods if registry.applicable(m, task)]
        for method in runnable:
            reason = registry.refusal(method, causal)
            if reason:
                not_run.append({"method": method, "task": task, "status": "n/a", "reason": reason})
        runnable = [m for m in runnable if not registry.refusal(m, causal)]
        if not runnable:
            continue
        args = budget.task_args(budget_name, task, runnable[0])
        seq_len = int(args[args.index("--seq-len") + 1]) if "--seq-len" in args else \
            get_task(task).presets[budget.preset].seq_len
        problem = data_problem(task, seq_len, data_dir)
        if problem:
            missing[task] = problem
            continue
        for method in runnable:
            for seed in seeds:
                spec = registry.get(method)
                entry = [spec.script] if spec.script else ["-m", "bench.train", "--method", method]
                command = [*entry, "--task", task, "--preset", budget.preset, "--seed", str(seed),
                           *budget.task_args(budget_name, task, method), *extra]
                cells.append({"name": cell_name(method, task, budget.preset, seed), "method": method, "task": task,
                              "seed": seed, "command": command,
                              "estimate_s": budget.estimate(budget_name, task, method)})
    return {"budget": budget_name, "preset": budget.preset, "methods": methods, "tasks": tasks, "seeds": seeds,
            "cells": cells, "not_run": not_run, "missing_data": missing, "left_out": left_out}


# ------------------------------------------------------------------------------------------------ running
class GridLock:
    """One grid per folder: an exclusive lock on OUT/grid.lock, which names its holder."""

    def __init__(self, out: Path):
        self.path = out / "grid.lock"
        self.file = None

    def __enter__(self):
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "unknown"
            self.file.close()
            raise SystemExit(f"error: another grid is running in {self.path.parent} (pid {holder}); "
                             f"wait for it or stop it first")
        self.file.seek(0)
        self.file.truncate()
        self.file.write(str(os.getpid()))
        self.file.flush()
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def die_with_parent():
    """Runs in each cell's process before exec: on Linux the cell gets SIGTERM when the grid dies, even by
    SIGKILL, so no cell outlives its grid and trains into a folder a rerun is also training into."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def prepare_cell(folder: Path, cell: dict) -> str:
    """'complete' (kept), 'resume' (a checkpoint of this very command) or 'fresh'; a folder made by another
    command (another budget) is cleared, so cells of two budgets never mix."""
    stored = read_json(folder / "cell.json")
    if stored is not None and stored.get("command") != cell["command"]:
        shutil.rmtree(folder)
        print(f"{cell['name']}: made with another command ({' '.join(stored.get('command', []))}); redone",
              flush=True)
    if folder.exists() and is_complete(folder):
        return "complete"
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "cell.json", {"command": cell["command"]})
    (folder / "failed.json").unlink(missing_ok=True)
    return "resume" if (folder / "checkpoint.pt").exists() else "fresh"


def start_cell(folder: Path, cell: dict, mode: str, threads: int) -> subprocess.Popen:
    """The cell's own process: it resumes a checkpoint of this very command, or starts the cell again
    (--overwrite: a cell's folder is the grid's, so an unfinished run's files may go)."""
    command = [sys.executable, *cell["command"], "--out", str(folder),
               "--resume" if mode == "resume" else "--overwrite"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(folder / "train.log", "a" if mode == "resume" else "w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                preexec_fn=die_with_parent)


def reap(process: subprocess.Popen) -> Optional[tuple]:
    """(exit code, CPU seconds) of a finished cell, None while it runs; CPU time (user + system, from the
    kernel's accounting of the child) is what the cell cost whatever else shared the cores."""
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if pid == 0:
        return None
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime


def finish_cell(folder: Path, cell: dict, code: int, seconds: float, cpu_seconds: float) -> bool:
    """True when the cell wrote a complete record; otherwise failed.json says why."""
    if code == 0 and is_complete(folder):
        write_json(folder / "cell.json", {"command": cell["command"], "wall_s": round(seconds, 1),
                                          "cpu_s": round(cpu_seconds, 1)})
        return True
    tail = (folder / "train.log").read_text(errors="replace").strip().splitlines()[-5:]
    write_json(folder / "failed.json", {
        "status": "failed", "method": cell["method"], "task": cell["task"], "seed": cell["seed"],
        "exit_code": code, "reason": tail[-1] if tail else "no output", "log_tail": tail, "seconds": seconds})
    return False


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def run_cells(out: Path, cells: List[dict], jobs: int) -> int:
    """Runs the planned cells, longest first; returns how many failed."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    order = sorted(cells, key=lambda c: -c["estimate_s"])
    pending, running, failures = list(order), {}, 0
    start, done_estimate, done_actual = time.time(), 0.0, 0.0
    remaining = sum(c["estimate_s"] for c in cells)

    def stop_cells(signum, _frame):
        for process in running:
            process.terminate()
        for process in running:
            process.wait()
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop_cells) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        finished = 0
        while pending or running:
            while pending and len(running) < jobs:
                cell = pending.pop(0)
                folder = out / "runs" / cell["name"]
                mode = prepare_cell(folder, cell)
                if mode == "complete":
                    finished += 1
                    remaining -= cell["estimate_s"]
                    print(f"[{finished}/{len(cells)}] {cell['name']}: complete, kept", flush=True)
                    continue
                running[start_cell(folder, cell, mode, threads)] = (cell, folder, time.time())
            for process, (code, cpu_seconds) in [(p, r) for p in list(running) for r in [reap(p)] if r]:
                cell, folder, began = running.pop(process)
                seconds = time.time() - began
                ok = finish_cell(folder, cell, code, seconds, cpu_seconds)
                failures += not ok
                finished += 1
                remaining -= cell["estimate_s"]
                done_estimate, done_actual = done_estimate + cell["estimate_s"], done_actual + seconds
                speed = done_actual / done_estimate if done_estimate else 1.0
                eta = remaining * speed / jobs
                status = "done" if ok else "FAILED: " + read_json(folder / "failed.json")["reason"]
                print(f"[{finished}/{len(cells)}] {cell['name']}: {status} ({seconds:.0f} s) | elapsed "
                      f"{clock(time.time() - start)} | ETA {clock(eta)}", flush=True)
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return failures


def describe(grid: dict, jobs: int) -> str:
    """What will run: cells, budget, estimated time and the output folder."""
    total = sum(c["estimate_s"] for c in grid["cells"])
    tasks = list(dict.fromkeys(c["task"] for c in grid["cells"]))
    lines = [f"grid: {len(grid['cells'])} cells on {len(tasks)} tasks ({', '.join(tasks)}), {len(grid['seeds'])} "
             f"seed(s), budget {grid['budget']} (preset {grid['preset']}), {jobs} job(s) side by side; estimated "
             f"{clock(total / jobs)} on a 2-core CPU"]
    for item in grid["not_run"]:
        lines.append(f"  n/a: {item['method']} on {item['task']} ({item['reason']})")
    for task, message in grid["missing_data"].items():
        lines.append(f"  no data: {task}: {message.splitlines()[0]}")
    for task, reason in grid["left_out"].items():
        lines.append(f"  left out of the {grid['budget']} budget: {task}: {reason}")
    return "\n".join(lines)


def parse_list(text: str, known: List[str], what: str) -> List[str]:
    items = [x for x in text.split(",") if x]
    unknown = [x for x in items if x not in known]
    if unknown or not items:
        raise ValueError(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return items


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("python -m bench.grid", __doc__.splitlines()[0],
                   epilog="Options not listed here go to every cell (e.g. --data-dir, --device).")
    p.add_argument("--budget", choices=sorted(BUDGETS), default="quick", help="cells' training budget")
    p.add_argument("--methods", default=None, help="comma-separated (default: every registered method)")
    p.add_argument("--tasks", default=",".join(GRID_TASKS), help="comma-separated tasks")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: the budget's: 0, or 0,1,2 for full)")
    p.add_argument("--out", metavar="DIR", default=None, help="run folder (default runs/grid-BUDGET)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="cells side by side")
    p.add_argument("--plan-only", action="store_true", help="print and write the plan, run nothing")
    return p


def data_dir_of(extra: List[str]) -> Path:
    return Path(extra[extra.index("--data-dir") + 1]) if "--data-dir" in extra[:-1] else default_data_dir()


def selection(args) -> tuple:
    """(methods, tasks, seeds) named by the options, checked against the registries."""
    from bench.tasks import TASKS
    landed = list(registry.available())
    methods = parse_list(args.methods, landed, "methods") if args.methods else landed
    tasks = parse_list(args.tasks, [t for t in GRID_TASKS if t in TASKS], "tasks")
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(BUDGETS[args.budget].seeds)
    except ValueError:
        raise ValueError(f"--seeds takes comma-separated integers, got {args.seeds!r}") from None
    return methods, tasks, seeds


def main(argv=None) -> int:
    p = build_parser()
    args, extra = p.parse_known_args(argv)
    try:
        if args.jobs < 1:
            raise ValueError("--jobs must be at least 1")
        methods, tasks, seeds = selection(args)
    except ValueError as exc:
        p.error(str(exc))
    out = Path(args.out or f"runs/grid-{args.budget}")
    out.mkdir(parents=True, exist_ok=True)
    with GridLock(out):
        grid = plan(args.budget, methods, tasks, seeds, extra, data_dir_of(extra))
        write_json(out / "grid.json", grid)
        print(describe(grid, args.jobs), flush=True)
        print(f"output: {out}", flush=True)
        if args.plan_only:
            return 0
        failures = run_cells(out, grid["cells"], args.jobs)
    print(f"grid finished: {len(grid['cells']) - failures} cells complete, {failures} failed ({out})", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
