"""Tables from results records, never typed by hand.

    python -m bench.report [--results results] [--readme README.md]

One block per (preset, device), each stating device, preset, training budget and seeds:
- accuracy (SBM paper Table 1 shape): rows are methods, columns tasks; a cell is the test metric (accuracy in
  %, or bits per byte) with the mean attention density in parentheses, mean ± std over seeds when there are
  several, "failed" with the reason's first words for a cell that could not run and "n/a" where the method
  does not apply (bench/grid.py's ONLY); the average over the accuracy tasks when a method has all of them;
- cost (SBM paper Table 3 and SSA paper Table 1 shape): per task, each method's attention FLOPs, model FLOPs,
  peak memory and median training step time, normalised to full attention's on the same task.
RESULTS/scaling*.json written by ``bench.scaling --out`` become the scaling tables. RESULTS/benchmarks/*.md,
the saved output of a benchmark script (its command on the first line; e.g. ``bench.fastrg_bench``,
``bench.sbm_scaling``, ``bench.ssa_table``), are appended as they are, in name order. With --readme, the
Markdown between the markers <!-- results:start --> and <!-- results:end --> is replaced.
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate

from bench import scaling
from bench.grid import applicable

START, END = "<!-- results:start -->", "<!-- results:end -->"
REFERENCE = "full"


def load(results: Path):
    records, failures = [], []
    for folder in sorted((results / "runs").glob("*")):
        if (folder / "metrics.json").exists():
            rec = json.loads((folder / "metrics.json").read_text())
            if rec.get("status") == "complete":
                records.append(rec)
                continue
        if (folder / "failed.json").exists():
            failures.append(json.loads((folder / "failed.json").read_text()))
    return records, failures


def fmt(values, metric):
    scale = 100 if metric == "accuracy" else 1
    mean = statistics.mean(v * scale for v in values)
    text = f"{mean:.2f}" if metric == "accuracy" else f"{mean:.3f}"
    if len(values) > 1:
        text += f" ± {statistics.stdev(v * scale for v in values):.2f}"
    return text


def budget(recs) -> str:
    """Each task's training budget as the records state it (steps × batch at sequence length)."""
    seen = {}
    for r in recs:
        c = r["config"]
        seen.setdefault(r["task"], f"{r['task']} {c['steps']} steps × {c['batch_size']} × {c['seq_len']}")
    return "; ".join(seen[t] for t in sorted(seen))


def accuracy_table(recs, failed) -> str:
    tasks = sorted({r["task"] for r in recs} | {t for _, t in failed})
    methods = list(dict.fromkeys([r["method"] for r in recs] + [m for m, _ in failed]))
    cells = defaultdict(list)
    for r in recs:
        cells[(r["method"], r["task"])].append(r)
    metric_of = {t: next((r["metric"] for r in recs if r["task"] == t), None) for t in tasks}
    accuracy_tasks = [t for t in tasks if metric_of[t] == "accuracy"]
    rows = []
    for m in methods:
        row = [m]
        for t in tasks:
            rs = cells.get((m, t))
            if rs:
                density = statistics.mean(r["density"] for r in rs)
                row.append(f"{fmt([r['test'] for r in rs], rs[0]['metric'])} ({100 * density:.1f}%)")
            elif (m, t) in failed:
                row.append("failed: " + failed[(m, t)][:60])
            elif not applicable(m, t):
                row.append("n/a")
            else:
                row.append("–")
        done = [cells[(m, t)] for t in accuracy_tasks if cells.get((m, t))]
        average = (f"{100 * statistics.mean(statistics.mean(r['test'] for r in rs) for rs in done):.2f}"
                   if accuracy_tasks and len(done) == len(accuracy_tasks) else "–")
        rows.append(row + [average])
    unit = {"accuracy": " (acc %)", "bpb": " (bpb)", None: ""}
    headers = ["method"] + [t + unit[metric_of[t]] for t in tasks] + ["avg acc"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def cost_table(recs) -> str:
    by_cell = defaultdict(list)
    for r in recs:
        by_cell[(r["task"], r["method"])].append(r)

    def mean(rs, get):
        values = [get(r) for r in rs]
        return statistics.mean(values) if values and None not in values else None

    measures = [("attention FLOPs", lambda r: r["flops_per_example"]["attention"]),
                ("model FLOPs", lambda r: r["flops_per_example"]["model"]),
                ("peak memory", lambda r: r["peak_memory_bytes"]),
                ("step time", lambda r: r["median_step_ms"])]
    rows = []
    for task in sorted({t for t, _ in by_cell}):
        reference = by_cell.get((task, REFERENCE))
        for method in [m for t, m in by_cell if t == task]:
            row = [task, method]
            for _, get in measures:
                value, ref = mean(by_cell[(task, method)], get), mean(reference, get) if reference else None
                row.append(f"{value / ref:.2f}" if value is not None and ref else "–")
            rs = by_cell[(task, method)]
            row.append(f"{statistics.mean(r['median_step_ms'] for r in rs):.0f}")
            rows.append(row)
    headers = ["task", "method"] + [f"{name} × {REFERENCE}" for name, _ in measures] + ["step ms"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def tables(records, failures, scaling_results=(), benchmarks=()) -> str:
    groups = defaultdict(list)
    for rec in records:
        groups[(rec["preset"], rec["device"])].append(rec)
    out = []
    for (preset, device), recs in sorted(groups.items()):
        failed = {(f["method"], f["task"]): f["reason"] for f in failures if f["preset"] == preset}
        seeds = sorted({r["seed"] for r in recs})
        out.append(f"**Preset `{preset}`, {device}, seeds {seeds}.** Budget: {budget(recs)}.\n\n"
                   f"Test metric (mean attention density):\n\n{accuracy_table(recs, failed)}\n\n"
                   f"Cost relative to {REFERENCE} attention on the same task (forward FLOPs per example; peak "
                   f"memory of training; median training step):\n\n{cost_table(recs)}")
    unplaced = [f for f in failures if not any(r["preset"] == f["preset"] for r in records)]
    for f in unplaced:
        out.append(f"- {f['method']} on {f['task']} ({f['preset']}): failed: {f['reason']}")
    out += [scaling.render(result) for result in scaling_results]
    out += [text.strip() for text in benchmarks]
    return "\n\n".join(out) if out else "No results yet: run ./run_all.sh."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default="results", help="results folder (written by bench.grid)")
    p.add_argument("--readme", default=None, help="rewrite this file's results section between the markers")
    args = p.parse_args(argv)
    results = Path(args.results)
    scaling_results = [json.loads(path.read_text()) for path in sorted(results.glob("scaling*.json"))]
    benchmarks = [path.read_text() for path in sorted((results / "benchmarks").glob("*.md"))]
    text = tables(*load(results), scaling_results, benchmarks)
    print(text)
    if args.readme:
        readme = Path(args.readme)
        content = readme.read_text()
        if START not in content or END not in content:
            p.error(f"{readme} has no {START} ... {END} markers")
        head, rest = content.split(START, 1)
        tail = rest.split(END, 1)[1]
        readme.write_text(f"{head}{START}\n{text}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
