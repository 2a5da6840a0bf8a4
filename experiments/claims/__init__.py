"""The papers' claims this project reproduces: one file per claim in this folder, one folder under results/ per claim
holding its records.

    python -m experiments.claims list                   # every claim, its folder and commands
    python -m experiments.claims run sbm-fig4 --jobs 2  # (re)runs a claim's training runs into results/sbm-fig4
    python -m experiments.claims run fastrg             # re-runs a benchmark claim, saving its output and wall time

A claim's file defines CLAIM (experiments/claims/claim.py says what one holds): its settings or benchmarks, its rule
and its reading of the records. Adding a claim is adding its file, imported below, and its line in CLAIMS, whose
order is results/README.md's.
"""

import argparse
import fnmatch
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench import cli
from bench.files import read_json
from experiments import grid
from experiments.claims import (
    fastrg,
    frontier,
    kernel,
    matched_cost,
    sbm_fig4,
    sbm_listops,
    sbm_table3,
    scaling,
    ssa_table,
)
from experiments.claims.claim import Claim

CLAIMS = [
    sbm_fig4.CLAIM,
    sbm_listops.CLAIM,
    sbm_table3.CLAIM,
    frontier.CLAIM,
    matched_cost.CLAIM,
    ssa_table.CLAIM,
    kernel.CLAIM,
    fastrg.CLAIM,
    scaling.CLAIM,
]
BY_NAME = {c.name: c for c in CLAIMS}
RESULTS = Path(__file__).resolve().parents[2] / "results"


def run_claim(claim: Claim, out: Path, pattern: str, jobs: int) -> int:
    """The cells matching ``pattern``, each once its records are in; how many failed or wait."""
    done, failures = set(), 0
    while True:
        cells = [c for c in claim.cells(out / "runs") if fnmatch.fnmatch(c["name"], pattern) and c["name"] not in done]
        ready = [c for c in cells if "waiting" not in c]
        if not ready:
            break
        failures += grid.run_cells(out, ready, jobs)
        done |= {c["name"] for c in ready}
    for cell in cells:
        print(f"{cell['name']}: not run, it waits for {cell['waiting']}", flush=True)
    return failures + len(cells)


def run_output(claim: Claim, out: Path) -> int:
    """A claim's benchmarks one by one, each saved as OUT/<script>.md after its command and time."""
    scripts = [re.match(r"python (?:-m experiments\.)?(\w+)", c).group(1) for c in claim.commands]
    failures = 0
    for command, script in zip(claim.commands, scripts):
        argv = shlex.split(command)  # a script run per task saved per task: step_time-image.md
        name = script + ("-" + argv[argv.index("--task") + 1] if scripts.count(script) > 1 else "")
        print(f"{claim.name}: {command} ...", flush=True)
        start = time.time()
        result = subprocess.run(
            [sys.executable, *argv[1:]],
            cwd=RESULTS.parent,
            capture_output=True,
            text=True,
            preexec_fn=grid.die_with_parent,
        )  # no benchmark outlives a killed claims run
        wall = time.time() - start
        if result.returncode != 0:
            failures += 1
            print(f"{claim.name}: `{command}` failed (exit {result.returncode}):\n{result.stderr[-2000:]}", flush=True)
            continue
        header = (
            f"`{command}` ({wall / 60:.1f} min on {platform.machine()}, {os.cpu_count()} cores, "
            f"{time.strftime('%Y-%m-%d')})"
        )
        (out / f"{name}.md").write_text(f"{header}\n\n{result.stdout.strip()}\n")
        print(f"{claim.name}: saved {out / (name + '.md')} ({wall:.0f} s)", flush=True)
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.claims", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)
    sub.add_parser("list", help="every claim, its folder and commands")
    run = sub.add_parser("run", help="run a claim into its folder: training runs resumably, benchmarks anew")
    run.add_argument("claim", choices=[c.name for c in CLAIMS])
    run.add_argument("--jobs", type=cli.positive_int, default=1, help="runs side by side")
    run.add_argument("--out", metavar="DIR", default=None, type=cli.out_folder, help="folder (default results/CLAIM)")
    run.add_argument(
        "--cells",
        default="*",
        metavar="PATTERN",
        help="runs only the cells whose names match this shell pattern (e.g. '*-s0')",
    )
    args = p.parse_args(argv)
    if args.verb == "list":
        for claim in CLAIMS:
            cells = claim.cells(RESULTS / claim.name / "runs")  # each learning rate resolved where its records are
            commands = [shlex.join(["python", *c["command"]]) for c in cells] + list(claim.commands)
            print(f"{claim.name} ({claim.kind}): {claim.title}\n  " + "\n  ".join(commands))
        return 0
    claim = BY_NAME[args.claim]
    out = Path(args.out) if args.out else RESULTS / args.claim
    cells = [c for c in claim.cells(out / "runs") if fnmatch.fnmatch(c["name"], args.cells)]
    if claim.kind == "runs" and not cells:
        names = [c["name"] for c in claim.cells()]  # not all of them: a frontier's 590 would be a 20,000-character line
        run.error(f"no cell of {claim.name} matches {args.cells!r}, a shell pattern over {names[0]} … {names[-1]}")
    out.mkdir(parents=True, exist_ok=True)
    with cli.one_line_errors(), grid.grid_lock(out):
        failures = 0
        if claim.kind == "runs":
            print(f"{claim.name}: {len(cells)} runs into {out}, {args.jobs} side by side", flush=True)
            failures = run_claim(claim, out, args.cells, args.jobs)
        runs = out / "runs"
        if all(
            (read_json(runs / c["name"] / "metrics.json") or {}).get("status") == "complete" for c in claim.cells(runs)
        ):  # its benchmarks time the settings of every run
            failures += run_output(claim, out)
        elif claim.commands:
            print(f"{claim.name}: {', '.join(claim.commands)}: once every run is complete")
    return 1 if failures else 0
