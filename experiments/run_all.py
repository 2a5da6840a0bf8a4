"""The comparison end to end: the grid, attention scaling, the report and its plots, in one folder.

    ./run_all.sh                  # the quick grid (28 minutes on 2 cores) into runs/grid-quick
    ./run_all.sh --smoke --out X  # every cell at a few steps (3 min; 4.5 with the data): the plumbing
    ./run_all.sh --full           # paper presets, 3 seeds (a GPU job); scaling to n = 8192

Everything goes to the run folder (ignored by git; a rerun resumes), OUT/REPORT.md last; ``--out
results/quick`` then ``python -m experiments.report --readme README.md`` publish a run.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import cli
from bench import methods as registry
from experiments import grid  # light: the report and torch are imported once options parse
from experiments.budgets import BUDGETS
from bench.files import read_json, write_json

SCALING = {"quick": "1024,2048", "smoke": "128", "full": "1024,2048,4096,8192"}
SCALING_REPEATS = {
    "quick": dict(warmup_iters=2, repeats=5),
    "smoke": dict(warmup_iters=0, repeats=1),
    "full": dict(warmup_iters=2, repeats=5),
}
SCALING_SECONDS = {"quick": 80, "smoke": 25, "full": 600}  # measured on a 2-core CPU, for the estimate
STEP_TIME_REPEATS = {"quick": 3, "smoke": 1, "full": 5}  # rounds of experiments.step_time per task
STEP_TIME_SECONDS = {"quick": 35, "smoke": 2, "full": 300}  # per task, for the estimate


def build_parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="./run_all.sh",
        description=" ".join(__doc__.split("\n\n")[0].split()),
        epilog="Environment: SPARSE_ATTN_DATA (data folder); run_all.sh sets the glibc allocator for every "
        "CPU timing (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736).",
    )
    scale = p.add_mutually_exclusive_group()
    scale.add_argument(
        "--quick",
        dest="budget",
        action="store_const",
        const="quick",
        help="the quick grid: per-task CPU budgets, one seed (the default)",
    )
    scale.add_argument(
        "--smoke",
        dest="budget",
        action="store_const",
        const="smoke",
        help="every method × task at a handful of steps and tiny shapes",
    )
    scale.add_argument(
        "--full",
        dest="budget",
        action="store_const",
        const="full",
        help="paper presets, three seeds (a GPU job); one cell at a time",
    )
    p.set_defaults(budget="quick")
    grid.add_selection_arguments(p)
    p.add_argument(
        "--jobs", type=cli.positive_int, default=None, help="cells side by side (default: cores; 1 for --full)"
    )
    p.add_argument(
        "--lengths",
        default=None,
        type=cli.positive_ints,
        help="scaling table lengths (default: the budget's: quick "
        f"{SCALING['quick']}, smoke {SCALING['smoke']}, full {SCALING['full']})",
    )
    p.add_argument("--no-scaling", action="store_true", help="skip the attention scaling table")
    return p


def run_scaling(out: Path, budget: str, methods, lengths: str, device: str) -> int:
    """OUT/scaling.json of the grid's methods, row by row (a rerun keeps rows measured alike)."""
    from experiments import scaling

    path, chosen = out / "scaling.json", [m for m in methods if registry.get(m).scaling]
    # beside them full attention's explicit path, and SBM at a trained model's 1% density beside its
    # untrained ~25% (Table 2's densities at λ = 1e-2: 1-4%)
    wanted = ",".join(chosen + ["full-ref"] * ("full" in chosen) + ["sbm@0.01"] * ("sbm" in chosen))
    print(f"scaling: {wanted} at n = {lengths} (each cell its own process) ...", flush=True)
    scaling.main(
        [
            "--methods",
            wanted,
            "--lengths",
            lengths,
            "--device",
            device,
            "--resume",
            *grid.flags(SCALING_REPEATS[budget]),
            "--out",
            str(out),
        ]
    )
    return sum("error" in row for row in (read_json(path) or {}).get("rows", []))


def run_step_times(out: Path, budget: str, tasks, seed: int, data_dir=None) -> int:
    """experiments.step_time over each task's ``seed`` cells (smoke: one), kept if newer."""
    failed, preset = 0, BUDGETS[budget].preset
    timed = [
        t
        for t in tasks
        if (read_json(out / "runs" / f"full-{t}-{preset}-s{seed}" / "metrics.json") or {}).get("status") == "complete"
    ]
    for task in timed[:1] if budget == "smoke" else timed:
        done = out / f"step_time-{task}" / "step_time.json"
        runs = (out / "runs").glob(f"*-{task}-{preset}-s{seed}/metrics.json")
        if done.exists() and all(r.stat().st_mtime < done.stat().st_mtime for r in runs):
            print(f"step times: {task}: measured after its runs finished; kept", flush=True)
            continue
        print(f"step times: {task}: every method's training step side by side in one process ...", flush=True)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "experiments.step_time",
                "--task",
                task,
                "--runs",
                str(out / "runs" / f"*-{task}-{preset}-s{seed}"),
                "--repeats",
                str(STEP_TIME_REPEATS[budget]),
                "--out",
                str(out / f"step_time-{task}"),
                *(["--data-dir", data_dir] if data_dir else []),
            ],
            cwd=grid.ROOT,
            capture_output=True,
            text=True,
            preexec_fn=grid.die_with_parent,
        )  # no timing outlives a killed ./run_all.sh
        if result.returncode != 0:
            failed += 1
            print(f"step times: {task} failed: {(result.stderr.strip() or 'no output').splitlines()[-1]}", flush=True)
    return failed


def source_commit() -> str:
    """The git commit of the code that ran ("+ changes" when the tree differs from it), or "unknown"."""
    try:
        head, dirty = (
            subprocess.run(["git", *args], cwd=grid.ROOT, capture_output=True, text=True, check=True).stdout.strip()
            for args in [["rev-parse", "--short", "HEAD"], ["status", "-s", "-uno"]]
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + changes" if dirty else "")


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    from experiments import report

    jobs = args.jobs or (1 if args.budget == "full" else os.cpu_count() or 1)
    lengths = ",".join(map(str, args.lengths)) if args.lengths else SCALING[args.budget]  # as text
    try:
        methods, tasks, seeds, out = grid.checked_plan_options(args)
    except ValueError as exc:
        p.error(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with cli.one_line_errors(), grid.grid_lock(out):
        print(
            f"./run_all.sh: budget {args.budget}, output folder {out}; checking each task's data (a missing "
            f"file is downloaded now, its size said first) ...",
            flush=True,
        )
        plan = grid.plan(args.budget, methods, tasks, seeds, grid.common_settings(args))
        write_json(out / "grid.json", plan)
        estimate = (
            sum(c["estimate_s"] for c in plan["cells"]) / jobs
            + STEP_TIME_SECONDS[args.budget] * len(tasks)
            + (0 if args.no_scaling else SCALING_SECONDS[args.budget])
        )
        print(grid.describe(plan, jobs), flush=True)
        print(
            f"then: each task's step times side by side, "
            f"{'no scaling table' if args.no_scaling else 'attention scaling at n = ' + lengths}, the "
            f"report and plots; estimated total {cli.clock(estimate)}",
            flush=True,
        )
        failures = grid.run_cells(out, plan["cells"], jobs)
        if not args.device.startswith("cuda"):  # experiments.step_time times CPU steps
            failures += run_step_times(out, args.budget, tasks, seeds[0], args.data_dir)
        if not args.no_scaling:
            failures += run_scaling(
                out, args.budget, methods, lengths, "cuda" if args.device.startswith("cuda") else args.device
            )
        wall = time.time() - start
        previous = read_json(out / "run.json") or {}
        write_json(
            out / "run.json",
            {
                "command": ["./run_all.sh", *(argv if argv is not None else sys.argv[1:])],
                "wall_time_s": wall,
                "earlier_wall_time_s": previous.get("wall_time_s"),
                "budget": args.budget,
                "jobs": jobs,
                "commit": source_commit(),
                **({"reruns": previous["reruns"]} if "reruns" in previous else {}),  # why cells were redone, kept
            },
        )
        text = report.write_run_report(out)
    print(text)
    print(
        f"\n./run_all.sh finished in {cli.clock(wall)} ({failures} failed cells, grid and scaling): report "
        f"{out / 'REPORT.md'}",
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
