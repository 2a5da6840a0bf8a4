"""The comparison grid: methods × tasks × seeds, each cell its own process writing its own results record.

    python -m bench.grid                 # --quick: CPU presets on the quick budget (what ./run_all.sh runs)
    python -m bench.grid --full          # paper presets, 3 seeds (a GPU job)

--quick runs every method × task on a 2-core machine (26 minutes here; see QUICK): the CPU preset's model and recipe,
with the steps and evaluation batches of QUICK (stated in every record's config and in the report). Those
numbers are a smoke-level comparison; claims come from the full presets. Every cell of a task uses the same
backbone and recipe; only the attention differs. The kernel method is a masked-LM pipeline (paper 003, §4):
it runs on `wikitext2` only (the masked-LM task of bench/tasks.py), and the other methods are not run on that
task; the report marks those cells as not applicable.

Resumable: a cell whose OUT/runs/CELL/metrics.json is complete is skipped, so a killed grid re-run finishes
the rest. A cell that fails is recorded in OUT/runs/CELL/failed.json with the last lines of its output, and
the grid goes on. --jobs runs cells side by side, each on cores // jobs threads.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.train import available_methods

METHODS = ["full", "linear", "linformer", "performer", "nystromformer", "reformer", "sbm", "ssa", "kernel"]
TASKS = ["duplicates", "listops", "bytes", "text", "image", "pathfinder", "retrieval", "wikitext2"]
ONLY = {"kernel": {"wikitext2"}}  # methods that run on some tasks only; the rest never run on these tasks
# Methods whose own file has a main() with method-specific options and hooks (SBM's regulariser, SSA's tail,
# the kernel pipeline): a cell runs that entry point, as a user would; the baselines run through bench.train.
ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {"sbm": "sbm_transformer.py", "ssa": "ssa.py", "kernel": "kernel_sparse.py"}
EVAL = ["--eval-batches", "2", "--final-eval-batches", "8"]
SLOW_FIRST = ["kernel", "reformer", "sbm"]  # dispatched first, in this order (main)
QUICK = {  # per task: overrides of the CPU preset for --quick (most cells under a minute of one core; Reformer and
    # SBM cells 1-4 minutes, the kernel pipeline 5: ./run_all.sh took 26 minutes on 2 cores)
    "duplicates": ["--steps", "150", "--batch-size", "64", "--eval-every", "75", *EVAL],
    "listops": ["--steps", "150", "--eval-every", "75", *EVAL],
    "bytes": ["--steps", "100", "--eval-every", "50", *EVAL],
    "text": ["--steps", "100", "--eval-every", "50", *EVAL],
    "image": ["--steps", "100", "--eval-every", "50", *EVAL],
    "pathfinder": ["--steps", "100", "--eval-every", "50", *EVAL],
    "retrieval": ["--steps", "100", "--eval-every", "50", *EVAL],
    "wikitext2": ["--steps", "300", "--eval-every", "150", *EVAL, "--analysis-sequences", "32",
                  "--predictor-steps", "100", "--finetune-steps", "100", "--thresholds", "0.3,0.5,0.7",
                  "--top-ks", "1,3,5"],
}


def applicable(method: str, task: str) -> bool:
    return task in ONLY[method] if method in ONLY else task not in set().union(*ONLY.values())


def cell_dir(out: Path, method: str, task: str, preset: str, seed: int) -> Path:
    return out / "runs" / f"{method}-{task}-{preset}-s{seed}"


def is_complete(folder: Path) -> bool:
    try:
        return json.loads((folder / "metrics.json").read_text()).get("status") == "complete"
    except (OSError, ValueError):
        return False


def start_cell(folder: Path, method: str, task: str, preset: str, seed: int, extra: list, threads: int):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "failed.json").unlink(missing_ok=True)
    entry = [str(ROOT / SCRIPTS[method])] if method in SCRIPTS else ["-m", "bench.train", "--method", method]
    cmd = [sys.executable, *entry, "--task", task, "--preset", preset, "--seed", str(seed), "--out", str(folder),
           "--overwrite", *extra]  # an unfinished cell starts again
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(folder / "train.log", "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def finish_cell(folder: Path, method: str, task: str, preset: str, seed: int, code: int, seconds: float) -> bool:
    """True when the cell wrote a complete record; otherwise failed.json says why."""
    if code == 0 and is_complete(folder):
        return True
    tail = (folder / "train.log").read_text().strip().splitlines()[-5:]
    (folder / "failed.json").write_text(json.dumps({
        "status": "failed", "method": method, "task": task, "preset": preset, "seed": seed, "exit_code": code,
        "reason": tail[-1] if tail else "no output", "log_tail": tail, "seconds": seconds}, indent=2))
    return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--quick", action="store_true", help="CPU presets, one seed (the default)")
    scale.add_argument("--full", action="store_true", help="paper presets, three seeds")
    p.add_argument("--methods", default=None, help="comma-separated (default: every method that has landed)")
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated tasks")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default 0, or 0,1,2 with --full)")
    p.add_argument("--out", default="results", help="results folder")
    p.add_argument("--jobs", type=int, default=1, help="cells run side by side (each on cores // jobs threads)")
    args, extra = p.parse_known_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    landed = available_methods()
    methods = args.methods.split(",") if args.methods else [m for m in METHODS if m in landed]
    unknown = [m for m in methods if m not in landed]
    if unknown:
        p.error(f"unknown or unavailable methods {unknown}; available: {sorted(landed)}")
    tasks = args.tasks.split(",")
    if not set(tasks) <= set(TASKS):
        p.error(f"unknown tasks {sorted(set(tasks) - set(TASKS))}; known: {TASKS}")
    preset = "paper" if args.full else "cpu"
    seeds = [int(s) for s in (args.seeds or ("0,1,2" if args.full else "0")).split(",")]
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    out = Path(args.out)
    cells = [(m, t, s) for t in tasks for m in methods for s in seeds if applicable(m, t)]
    # Longest cells first (the kernel pipeline, then Reformer and SBM: 3-10× a baseline cell at the quick
    # budget), so side-by-side jobs end together instead of one long cell running alone at the end.
    cells.sort(key=lambda cell: SLOW_FIRST.index(cell[0]) if cell[0] in SLOW_FIRST else len(SLOW_FIRST))
    pending, running = list(enumerate(cells, 1)), {}
    while pending or running:
        while pending and len(running) < args.jobs:
            i, (method, task, seed) = pending.pop(0)
            folder = cell_dir(out, method, task, preset, seed)
            if is_complete(folder):
                print(f"[{i}/{len(cells)}] {folder.name}: complete, skipped", flush=True)
                continue
            budget = QUICK.get(task, []) if preset == "cpu" else []
            process = start_cell(folder, method, task, preset, seed, [*budget, *extra], threads)
            running[process] = (i, folder, method, task, seed, time.time())
        for process in [p for p in running if p.poll() is not None]:
            i, folder, method, task, seed, start = running.pop(process)
            ok = finish_cell(folder, method, task, preset, seed, process.returncode, time.time() - start)
            status = "done" if ok else "FAILED: " + json.loads((folder / "failed.json").read_text())["reason"]
            print(f"[{i}/{len(cells)}] {folder.name}: {status} ({time.time() - start:.0f} s)", flush=True)
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
