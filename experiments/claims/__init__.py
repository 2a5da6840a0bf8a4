"""The papers' claims this project reproduces: one file per claim in this folder, one folder under results/ per claim
holding its records.

    python -m experiments.claims list                   # every claim, its folder and commands
    python -m experiments.claims run sbm-fig4 --jobs 2  # (re)runs a claim's training runs into results/sbm-fig4
    python -m experiments.claims run fastrg             # re-runs a benchmark claim, saving its output and wall time
    python -m experiments.claims rerun matched-cost window-d0.125-lr1e-3-recall-cpu-s0  # a record against its command
    python -m experiments.claims verdicts --budgets 0.125,0.25 --axis flops  # matched cost at chosen budgets

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
import tempfile
import time
from pathlib import Path

from bench import cli
from bench.files import read_json
from experiments import grid
from experiments.claims import (
    fastrg,
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
        if claim.phase and cells:  # the earliest phase left first, a kept cell included (it is only looked at)
            first = min(map(claim.phase, cells))
            ready = [c for c in ready if claim.phase(c) == first]
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


# what two runs of one command may differ in: the clock, memory, and where the record was written
MEASURED = re.compile(r"time|_ms$|_s$|memory|allocator|versions")


def comparable(record: dict) -> dict:
    config = {k: v for k, v in record.get("config", {}).items() if k != "out"}
    return {k: v for k, v in dict(record, config=config).items() if not MEASURED.search(k)}


def rerun(claim: Claim, out: Path, name: str) -> int:
    """The recorded cell NAME's command again, in a scratch folder, on as many threads as the record's (its device
    says; float sums differ between thread counts); its record beside the published one, field by field (every
    field but times, memory and versions), and, where they differ, the processors of both. 0 when identical."""
    record = read_json(out / "runs" / name / "metrics.json") or {}
    cell = next((c for c in claim.cells(out / "runs") if c["name"] == name), None)
    if cell is None or record.get("status") != "complete":
        what = "is not a cell of the claim" if cell is None else f"has no complete record in {out / 'runs'}"
        raise SystemExit(f"python -m experiments.claims rerun: {name!r} {what}")
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, *cell["command"], "--out", scratch, "--overwrite"]
        threads = re.search(r"(\d+) threads?\)$", record.get("device", ""))  # "cpu (x86_64, 1 thread)"
        env = {**os.environ, "OMP_NUM_THREADS": threads.group(1) if threads else "1"}
        if subprocess.run(command, cwd=grid.ROOT, env=env).returncode:
            raise SystemExit(f"python -m experiments.claims rerun: {shlex.join(cell['command'])} failed")
        rerun_record = read_json(Path(scratch) / "metrics.json") or {}
    published, again = comparable(record), comparable(rerun_record)
    differing = sorted(k for k in {*published, *again} if published.get(k) != again.get(k))
    print(
        f"{name}: " + (f"differs in {', '.join(differing)}" if differing else f"identical in {len(published)} fields")
    )
    recorded_on, rerun_on = (r.get("versions", {}).get("cpu") for r in (record, rerun_record))
    if differing and recorded_on != rerun_on:  # float sums differ between kinds of processor (bench.measure.versions)
        print(
            f"recorded on {recorded_on or 'a CPU its record does not name'}, rerun on {rerun_on}: a rerun is "
            "bit-identical on the same kind of processor only"
        )
    if differing and threads and threads.group(1) != "1":  # on 2 threads one process in ~20 did (tests/test_run_all)
        print(f"recorded on {threads.group(1)} threads: such reruns may differ in the last digits; one thread's do not")
    return 1 if differing else 0


def budgets(text: str) -> tuple:
    """--budgets: comma-separated fractions of the admissible pairs, each in (0, 1]."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated fractions in (0, 1], got {text!r}")
    return values


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
    again = sub.add_parser("rerun", help="a recorded cell's command again, its metrics beside the record's")
    again.add_argument("claim", choices=[c.name for c in CLAIMS if c.kind == "runs"])
    again.add_argument("cell", help="the cell's name, its folder under results/CLAIM/runs")
    verdicts = sub.add_parser("verdicts", help="the matched-cost verdicts from its records, at chosen budgets")
    verdicts.add_argument(
        "--budgets", type=budgets, default=None, help="e.g. 0.125,0.25 (default: the claim's, per axis)"
    )
    verdicts.add_argument("--axis", choices=("pairs", "flops"), default="pairs", help="computed pairs or FLOPs")
    args = p.parse_args(argv)
    if args.verb == "rerun":
        return rerun(BY_NAME[args.claim], RESULTS / args.claim, args.cell)
    if args.verb == "verdicts":
        records = grid.load(RESULTS / matched_cost.CLAIM.name)[0]
        if not matched_cost.by_setting(records):
            p.exit(1, f"{p.prog} verdicts: no setting of {matched_cost.CLAIM.name} has a record yet\n")
        print(matched_cost.verdict_table(records, args.axis, args.budgets))
        return 0
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
        names = [c["name"] for c in claim.cells()]  # not all: hundreds of names would make one enormous line
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
