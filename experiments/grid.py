"""The comparison grid: methods × tasks × seeds, each cell its own process writing its own results record.

    python -m experiments.grid                          # the quick budget into runs/grid-quick (what ./run_all.sh runs)
    python -m experiments.grid --budget smoke           # every cell at a handful of steps: checks the plumbing
    python -m experiments.grid --out X --methods full,sbm --tasks duplicates

Budgets (experiments/budgets.py): ``quick``, what ./run_all.sh runs; ``smoke``, the plumbing; ``full``, the paper
presets. A rerun keeps complete cells of the planned command, resumes checkpoints, redoes cells of other budgets.
Stopping the grid (even by SIGKILL, on Linux) stops its cells.
"""

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from bench import cli
from bench import methods as registry
from bench.files import DataError, FolderLock, default_data_dir, folder_problem, read_json, write_json
from experiments.budgets import BUDGETS

ROOT = Path(__file__).resolve().parent.parent
GRID_TASKS = ["duplicates", "listops", "bytes", "text", "image", "pathfinder", "retrieval", "wikitext2"]


def flags(settings: Dict[str, object]) -> List[str]:
    """{option: value} as command-line words: seq_len=64 → --seq-len 64; True → the flag alone; a list → the
    flag once per item (--attn)."""
    words = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        for item in value if isinstance(value, (list, tuple)) else [value]:
            words += [flag] if item is True else [flag, str(item)]
    return words


def make_cell(
    method: str,
    task: str,
    seed: int,
    preset: str = "cpu",
    settings: Optional[dict] = None,
    tag: str = "",
    estimate_s: float = 3600.0,
) -> dict:
    """A grid's or claim's run as data: options, folder name (``tag``: of one method's), command."""
    settings = dict(settings or {})
    spec = registry.get(method)
    entry = [spec.script] if spec.script else ["-m", "bench.train", "--method", method]
    return {
        "name": f"{method}{tag}-{task}-{preset}-s{seed}",
        "method": method,
        "task": task,
        "seed": seed,
        "preset": preset,
        "settings": settings,
        "estimate_s": estimate_s,
        "command": [*entry, "--task", task, "--preset", preset, "--seed", str(seed), *flags(settings)],
    }


def load(folder: Path):
    """(complete records, failures) of a folder's cells; each record carries its cell's command and folder."""
    records, failures = [], []
    for cell in sorted((folder / "runs").glob("*")):
        record = read_json(cell / "metrics.json")
        if record and record.get("status") == "complete":
            records.append(dict(record, cell=read_json(cell / "cell.json") or {}, folder=cell))
        elif (cell / "failed.json").exists():
            failures.append(read_json(cell / "failed.json"))
    return records, failures


# ------------------------------------------------------------------------------------------------ planning
def plan(budget_name: str, methods: List[str], tasks: List[str], seeds: List[int], common: Dict[str, object]) -> dict:
    """Every cell with its command, or why it does not run; ``common``: options of every cell."""
    from bench.tasks import get_task

    budget = BUDGETS[budget_name]
    data_dir = Path(common["data_dir"]) if common.get("data_dir") else default_data_dir()
    cells, not_run, missing, left_out = [], [], {}, {}
    for task in tasks:
        if task in budget.left_out:
            left_out[task] = budget.left_out[task]
            continue
        instance = get_task(task)
        refused = {m: registry.refusal(m, instance.head == "lm") for m in methods if registry.applicable(m, task)}
        not_run += [{"method": m, "task": task, "status": "n/a", "reason": why} for m, why in refused.items() if why]
        runnable = [m for m, why in refused.items() if not why]
        if not runnable:
            continue
        preset = instance.presets[budget.preset]
        seq_len = budget.settings(task, runnable[0]).get("seq_len", preset.seq_len)
        try:  # the task's own message when its data are missing (tasks that read files only)
            if instance.reads_files:
                instance.setup(seq_len, 0, data_dir, 0)
        except DataError as exc:
            missing[task] = str(exc)
            continue
        for method in runnable:
            grid_budget = registry.get(method).grid_budget
            attn = {"attn": [f"{k}={v}" for k, v in grid_budget.items()]} if grid_budget else {}
            settings = {**budget.settings(task, method), **attn, **common}
            cells += [
                make_cell(method, task, seed, budget.preset, settings, estimate_s=budget.estimate(task, method))
                for seed in seeds
            ]
    return {
        "budget": budget_name,
        "preset": budget.preset,
        "methods": methods,
        "tasks": tasks,
        "seeds": seeds,
        "cells": cells,
        "not_run": not_run,
        "missing_data": missing,
        "left_out": left_out,
    }


# ------------------------------------------------------------------------------------------------ running
def grid_lock(out: Path) -> FolderLock:
    """One grid per folder: OUT/grid.lock names its holder."""
    return FolderLock(out, "grid.lock", "grid")


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
        print(f"{cell['name']}: made with another command ({' '.join(stored.get('command', []))}); redone", flush=True)
    if (read_json(folder / "metrics.json") or {}).get("status") == "complete":
        return "complete"
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "cell.json", {"command": cell["command"]})
    (folder / "failed.json").unlink(missing_ok=True)
    return "resume" if (folder / "checkpoint.pt").exists() else "fresh"


def start_cell(folder: Path, cell: dict, mode: str, threads: int) -> subprocess.Popen:
    """The cell's own process: it resumes a checkpoint of this very command, or starts the cell again
    (--overwrite: a cell's folder is the grid's, so an unfinished run's files may go)."""
    command = [
        sys.executable,
        *cell["command"],
        "--out",
        str(folder),
        "--resume" if mode == "resume" else "--overwrite",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(folder / "train.log", "a" if mode == "resume" else "w") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, preexec_fn=die_with_parent
        )


def reap(process: subprocess.Popen) -> Optional[tuple]:
    """(exit code, CPU seconds) of a finished cell, None while it runs; CPU time (user + system, from the
    kernel's accounting of the child) is what the cell cost whatever else shared the cores."""
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if pid == 0:
        return None
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime


def finish_cell(folder: Path, cell: dict, code: int, seconds: float, cpu_seconds: float) -> str:
    """ "done" when the cell wrote a complete record, else why not (as failed.json says)."""
    status = (read_json(folder / "metrics.json") or {}).get("status")
    if code == 0 and status == "complete":
        write_json(
            folder / "cell.json",
            {"command": cell["command"], "wall_s": round(seconds, 1), "cpu_s": round(cpu_seconds, 1)},
        )
        return "done"
    tail = (folder / "train.log").read_text(errors="replace").strip().splitlines()[-5:]
    failure, reason = "diverged" if status == "diverged" else "failed", (tail or ["no output"])[-1]
    write_json(
        folder / "failed.json",
        {
            "status": failure,
            "method": cell["method"],
            "task": cell["task"],
            "seed": cell["seed"],
            "exit_code": code,
            "reason": reason,
            "log_tail": tail,
            "seconds": seconds,
        },
    )
    return f"{failure.upper()}: {reason}"


def run_cells(out: Path, cells: List[dict], jobs: int) -> int:
    """Runs the planned cells, longest first; returns how many failed."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    pending, running, failures, finished = sorted(cells, key=lambda c: -c["estimate_s"]), {}, 0, 0
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
                status = finish_cell(folder, cell, code, seconds, cpu_seconds)
                failures += status != "done"
                finished += 1
                remaining -= cell["estimate_s"]
                done_estimate, done_actual = done_estimate + cell["estimate_s"], done_actual + seconds
                eta = remaining * done_actual / done_estimate / jobs  # at this machine's pace
                print(
                    f"[{finished}/{len(cells)}] {cell['name']}: {status} ({seconds:.0f} s) | elapsed "
                    f"{cli.clock(time.time() - start)} | ETA {cli.clock(eta)}",
                    flush=True,
                )
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return failures


def describe(grid: dict, jobs: int) -> str:
    """What will run: cells, budget, estimated time and the output folder."""
    total = sum(c["estimate_s"] for c in grid["cells"])
    tasks = list(dict.fromkeys(c["task"] for c in grid["cells"]))
    lines = [
        f"grid: {len(grid['cells'])} cells on {len(tasks)} tasks ({', '.join(tasks)}), {len(grid['seeds'])} "
        f"seed(s), budget {grid['budget']} (preset {grid['preset']}), {jobs} job(s) side by side; estimated "
        f"{cli.clock(total / jobs)} on a 2-core CPU"
    ]
    lines += [f"  n/a: {n['method']} on {n['task']} ({n['reason']})" for n in grid["not_run"]]
    lines += [f"  no data: {task}: {said.splitlines()[0]}" for task, said in grid["missing_data"].items()]
    lines += [f"  left out of the {grid['budget']} budget: {task}: {why}" for task, why in grid["left_out"].items()]
    return "\n".join(lines)


def parse_list(text: str, known: List[str], what: str) -> List[str]:
    """A comma-separated list of names from ``known``; an empty list is refused, not read as the default."""
    items = [x for x in text.split(",") if x]
    if not items:
        raise ValueError(f"--{what} names none (leave the option out for the default); known: {', '.join(known)}")
    unknown = [x for x in items if x not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return items


def add_selection_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a grid that ./run_all.sh shares: which cells, where, on which device."""
    p.add_argument("--out", metavar="DIR", default=None, help="run folder (default runs/grid-BUDGET)")
    p.add_argument("--methods", default=None, help="comma-separated (default: every registered method)")
    p.add_argument("--tasks", default=",".join(GRID_TASKS), help="comma-separated tasks")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: the budget's: 0, or 0,1,2 for full)")
    p.add_argument(
        "--device",
        default="auto",
        type=cli.device_option,
        help="every cell's device: auto (CUDA when present), cpu, cuda or cuda:N",
    )
    p.add_argument(
        "--data-dir", default=None, metavar="DIR", help="data folder (default: $SPARSE_ATTN_DATA, else ./data)"
    )


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("python -m experiments.grid", __doc__.splitlines()[0])
    p.add_argument("--budget", choices=sorted(BUDGETS), default="quick", help="cells' training budget")
    add_selection_arguments(p)
    p.add_argument("--jobs", type=cli.positive_int, default=os.cpu_count() or 1, help="cells side by side")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        type=cell_option,
        metavar="NAME=VALUE",
        dest="options",
        help="a training option every cell gets, e.g. --set steps=2 (repeatable; the cells' own flags: "
        "python -m bench.train --help)",
    )
    p.add_argument("--plan-only", action="store_true", help="print and write the plan, run nothing")
    return p


def cell_option(text: str) -> tuple:
    """NAME=VALUE of --set: (name with underscores, value text)."""
    name, sep, value = text.partition("=")
    if not (sep and name):
        raise argparse.ArgumentTypeError(f"takes NAME=VALUE (e.g. steps=2), got {text!r}")
    return name.lstrip("-").replace("-", "_"), value


def check_options(options: List[tuple], methods: List[str]) -> None:
    """--set's options checked once, up front (ValueError), as python -m bench.train parses them: a
    bad value, and a name it lacks where it trains a baseline of ``methods`` (else: the cells')."""
    from bench.train import build_parser

    parser = build_parser("--set")
    parser.exit_on_error = False
    try:
        _, unknown = parser.parse_known_args(["--task", "duplicates", *flags(dict(options))])
    except argparse.ArgumentError as exc:
        raise ValueError(f"--set: {exc}") from None
    baselines = [m for m in methods if not registry.get(m).script]
    if unknown and baselines:
        raise ValueError(
            f"--set: {' '.join(unknown)} is not an option of python -m bench.train, which trains {', '.join(baselines)}"
        )


def common_settings(args) -> Dict[str, object]:
    """The options every cell gets: its device, the data folder when given, and those of --set."""
    return {
        "device": args.device,
        **({"data_dir": args.data_dir} if args.data_dir else {}),
        **dict(getattr(args, "options", [])),
    }


def checked_plan_options(args) -> tuple:
    """(methods, tasks, seeds, run folder) of the options, checked up front (ValueError)."""
    from bench.tasks import TASKS

    landed = list(registry.available())
    methods = parse_list(args.methods, landed, "methods") if args.methods is not None else landed
    tasks = parse_list(args.tasks, [t for t in GRID_TASKS if t in TASKS], "tasks")
    try:
        seeds = (
            [int(s) for s in args.seeds.split(",") if s] if args.seeds is not None else list(BUDGETS[args.budget].seeds)
        )
    except ValueError:
        seeds = None
    if not seeds or not all(0 <= s < 2**32 for s in seeds):
        raise ValueError(f"--seeds takes comma-separated integers from 0 to 4,294,967,295, got {args.seeds!r}")
    if args.device.startswith("cuda"):  # a CUDA device it lacks: refused once, not by every cell
        from bench.config import resolve_device

        resolve_device(args.device)
    out = Path(args.out or f"runs/grid-{args.budget}")
    problem = folder_problem(out)
    if problem:
        raise ValueError(f"--out {out}: {problem}")
    return methods, tasks, seeds, out


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        methods, tasks, seeds, out = checked_plan_options(args)
        check_options(args.options, methods)
    except ValueError as exc:
        p.error(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    with cli.one_line_errors(), grid_lock(out):
        grid = plan(args.budget, methods, tasks, seeds, common_settings(args))
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
