"""Tables and plots from the records under results/, never typed by hand; what they mean is written by a person
in README.md, above the generated region, which this never rewrites.

    python -m experiments.report --readme README.md     # the generated region, results/README.md, results/plots/
    python -m experiments.report                        # results/README.md's text, printed
    python -m experiments.report --run runs/grid-quick  # a run folder's REPORT.md and plots (./run_all.sh does this)
"""

import math
import os
import re
import shlex
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

from bench import cli
from bench import methods as registry
from bench.files import read_json
from experiments import claims, grid, plots, scaling
from experiments.budgets import QUICK_TARGETS
from experiments.grid import load
from experiments.tables import by, devices, duration, fair_ratios, fmt, mean, table, tests

START, END = "<!-- results:start -->", "<!-- results:end -->"
REFERENCE = "full"
SMOKE_LINE = "Smoke run: these numbers test the plumbing and carry no information."
PUBLISHED_SCALING = "scaling/scaling.json"  # under results/: the one scaling run the published tables quote
COSTS = {  # what a training step costs, per record: the columns "× full" of the method table and the quick plot
    "train density": lambda r: r["train_density"] if r.get("train_density") is not None else r["density"],
    "attention FLOPs": lambda r: (r.get("train_flops_per_example") or r["flops_per_example"])["attention"],
    "peak memory": lambda r: r["peak_memory_bytes"],
    "step time": lambda r: r["median_step_ms"],
}


# ------------------------------------------------------------------------------------------------ a run
def step_times_of(folder: Path) -> Dict[str, dict]:
    """task → experiments.step_time's JSON in FOLDER/step_time-TASK (a run folder's or a claim's)."""
    return {path.parent.name.split("-", 1)[1]: read_json(path) for path in folder.glob("step_time-*/step_time.json")}


def relative_costs(recs: List[dict], step_times: Optional[Dict[str, dict]] = None) -> Dict[str, Dict[str, float]]:
    """Per method: COSTS ÷ full attention's per task (step: ÷ fair full's), geometric mean."""
    cells, logs = by(recs, "method", "task"), defaultdict(lambda: defaultdict(list))
    for (method, task), rs in cells.items():
        ref = cells.get((REFERENCE, task), [])
        named = {k: mean(rs, get) / mean(ref, get) for k, get in COSTS.items() if mean(rs, get) and mean(ref, get)}
        fair = fair_ratios((step_times or {}).get(task) or {}).get(method, math.nan)
        named.update({} if math.isnan(fair) else {"step time": fair})  # NaN: not timed
        for name, value in named.items():
            logs[method][name].append(math.log(value))
    return {m: {k: math.exp(statistics.mean(v)) for k, v in named.items()} for m, named in logs.items()}


def crossovers(result: Optional[dict]) -> Dict[str, dict]:
    """Per method, time and memory: (the n from which it stays below full attention's or None, n is the first)."""
    rows = [r for r in (result or {}).get("rows", []) if "error" not in r and not r.get("options")]
    ref = {r["n"]: r for r in rows if r["method"] == REFERENCE}
    lengths, out = sorted(ref), defaultdict(dict)
    for method in {r["method"] for r in rows} - {REFERENCE}:
        mine = {r["n"]: r for r in rows if r["method"] == method}
        for key in ("fwdbwd_ms", "peak_bytes"):
            below = [n in mine and mine[n][key] < ref[n][key] for n in lengths]
            first = next((i for i in range(len(lengths)) if all(below[i:])), None)
            out[method][key] = (None if first is None else lengths[first], first == 0)
    return out


METHOD_CAPTION = (
    "Columns: test metric per task; costs × full attention on the same task, geometric mean over tasks "
    "(training attention pairs and FLOPs, peak memory, training step against fair full attention's "
    "timed side by side in one process); the length n from which forward+backward time / peak memory "
    "stay below fused full attention's in the scaling run {} (≤: from its shortest length; —: never "
    "within its lengths)."
)


def method_table(
    recs: List[dict],
    plan: dict,
    failures: List[dict],
    scaling_result: Optional[dict],
    step_times: Optional[Dict[str, dict]] = None,
    every: bool = False,
) -> str:
    """A row per method (the plan's and the records', or ``every`` registered one): metrics, costs, crossovers."""
    cells, by_task, costs = by(recs, "method", "task"), by(recs, "task"), relative_costs(recs, step_times)
    cross, tasks = crossovers(scaling_result), [t for t in grid.GRID_TASKS if t in by_task]
    refused = {(n["method"], n["task"]): n["reason"] for n in plan.get("not_run", [])}
    failed, rows = {(f["method"], f["task"]): f["status"] for f in failures}, []  # "failed" or "diverged"
    names = {*(registry.METHODS if every else plan.get("methods", [])), *(r["method"] for r in recs + failures)}
    # registry order, then any method the records name that this process lacks (a plug-in)
    for m in [m for m in registry.METHODS if m in names] + sorted(names - set(registry.METHODS)):
        row = [m] + [
            tests(cells[(m, t)])
            if (m, t) in cells
            else f"n/a ({refused[(m, t)]})"
            if (m, t) in refused
            else f"{failed[(m, t)]} (below)"
            if (m, t) in failed
            else "–"
            if m in registry.METHODS and not registry.applicable(m, t)
            else "not run yet"
            for t in tasks
        ]
        # "–" once it ran, or where the grid runs it on none of its tasks (the hybrid: the matched-cost claim's)
        costless = any(k[0] == m for k in cells) or (
            m in registry.METHODS and not any(registry.applicable(m, t) for t in grid.GRID_TASKS)
        )
        row += [
            f"{costs[m][k]:.2f}" if k in costs.get(m, {}) else "–" if costless else "not run yet"
            for k in ("train density", "attention FLOPs", "peak memory", "step time")
        ]
        words = [("—" if n is None else f"{'≤ ' if first else ''}{n}") for n, first in cross.get(m, {}).values()]
        rows.append(
            row
            + [
                "(reference)"
                if m == REFERENCE
                else " / ".join(words)
                if words
                else "n/a"
                if m in registry.METHODS and not registry.get(m).scaling
                else "not run yet"
            ]
        )
    based = {t: [r for r in by_task[t] if r.get("base_rate") is not None] for t in tasks}
    rows.append(
        ["base rate"]
        + [fmt([mean(based[t], lambda r: r["base_rate"])], based[t][0]["metric"]) if based[t] else "–" for t in tasks]
        + [""] * 5
    )
    return table(
        rows,
        [
            "method",
            *(f"{t} ({'acc %' if by_task[t][0]['metric'] == 'accuracy' else 'bpb'})" for t in tasks),
            "train density × full",
            "attention FLOPs × full",
            "peak memory × full",
            "step time × full",
            "below full from n (time / memory)",
        ],
    )


def targets_table(recs: List[dict]) -> str:
    """Full attention against the quick budget's target per task (experiments/budgets.py QUICK_TARGETS)."""
    rows = []
    for task, (kind, amount, words) in QUICK_TARGETS.items():
        ref = [r for r in recs if r["method"] == REFERENCE and r["task"] == task]
        if ref:
            value, base, metric = mean(ref, lambda r: r["test"]), mean(ref, lambda r: r["base_rate"]), ref[0]["metric"]
            goal = {"min": amount, "above_base": base + amount, "below_base": base - amount}[kind]
            rows.append(
                [
                    task,
                    fmt([value], metric),
                    fmt([base], metric),
                    f"{words} ({fmt([goal], metric)})",
                    "yes" if (value <= goal if kind == "below_base" else value >= goal) else "no",
                ]
            )
    return table(rows, ["task", "full attention", "base rate", "target", "met"])


def step_time_table(step_time: dict) -> str:
    """experiments.step_time's JSON: each variant's median [min-max] ms, ÷ fair full attention's, SDPA kernel."""
    fair = statistics.median(step_time["step_ms"].get("full (fair)") or [float("nan")])
    rows = [
        [
            label,
            f"{statistics.median(ms):.0f} [{min(ms):.0f}-{max(ms):.0f}]",
            f"{statistics.median(ms) / fair:.3f}",
            step_time.get("sdpa_kernel", {}).get(label, "–"),
        ]
        for label, ms in step_time["step_ms"].items()
    ]
    return table(rows, ["variant", "step ms", "÷ full (fair)", "CPU SDPA kernel"])


def run_section(folder: Path, scaling_path: Path, scaling_name: str, preview: bool = False) -> str:
    """A run folder as Markdown; the method table quotes the scaling run ``scaling_path`` (rendered unless preview)."""
    (plan, run), (recs, failures) = (read_json(folder / name) or {} for name in ("grid.json", "run.json")), load(folder)
    if not recs and not failures:
        return f"No records in {folder} yet: run ./run_all.sh."
    notes = (
        [f"n/a: {n['method']} on {n['task']} ({n['reason']})" for n in plan.get("not_run", [])]
        + [f"no data: {task}: {message}" for task, message in plan.get("missing_data", {}).items()]
        + [f"left out: {task}: {reason}" for task, reason in plan.get("left_out", {}).items()]
        + [f"{f['status']}: {f['method']} on {f['task']} (exit {f['exit_code']}): {f['reason']}" for f in failures]
    )
    scaling_result, step_times = read_json(scaling_path), step_times_of(folder)
    budgets = {
        r["task"]: [r["task"], *(r["config"][k] for k in ("steps", "batch_size", "seq_len", "depth", "heads", "dim"))]
        for r in recs
    }
    out = [
        table(
            [
                [
                    plan.get("budget", "?"),
                    plan.get("preset", "?"),
                    devices(recs),
                    sorted({r["seed"] for r in recs}),
                    f"`{' '.join(run.get('command', ['./run_all.sh']))}`",
                    run.get("commit", "?"),
                    duration(run.get("wall_time_s")),
                    run.get("jobs", "?"),
                ]
            ],
            ["budget", "preset", "device", "seeds", "command", "commit", "wall time", "cells side by side"],
        ),
        table([budgets[t] for t in sorted(budgets)], ["task", "steps", "batch", "length", "layers", "heads", "width"]),
    ]
    out += (
        [
            table(
                [[again["commit"], ", ".join(again["cells"]), again["why"]] for again in run["reruns"]],
                ["rerun at commit", "cells", "why"],
            )
        ]
        if run.get("reruns")
        else []
    )
    out += [
        METHOD_CAPTION.format(scaling_name) + "\n\n" + method_table(recs, plan, failures, scaling_result, step_times)
    ]
    out += ["\n".join(f"- {line}" for line in notes)] if notes else []
    out += [] if plan.get("budget") == "smoke" else ["Quick targets of full attention:\n\n" + targets_table(recs)]
    out += (
        [f"Scaling run {scaling_name}:\n\n" + scaling.render(scaling_result)] if scaling_result and not preview else []
    )
    return "\n\n".join(out)


def run_plots(folder: Path, budget: str) -> str:
    if not plots.available():
        return "Plots: matplotlib is not installed (`pip install -r requirements-extra.txt`); tables only."
    recs, scaling_result, shown = load(folder)[0], read_json(folder / "scaling.json"), {}
    if recs:
        shown["accuracy_vs_cost"] = plots.accuracy_vs_cost(recs, folder / "accuracy_vs_cost.png", COSTS, budget)
    if scaling_result:
        shown["scaling"] = plots.scaling(scaling_result, folder / "scaling.png", f"{budget} run, scaling.json")
    return "\n\n".join(figures(shown, shown, ""))


def write_run_report(folder: Path) -> str:
    """OUT/REPORT.md and OUT/*.png of a run folder (a smoke run's first line says so); returns the text."""
    budget = (read_json(folder / "grid.json") or {}).get("budget", "?")
    text = (
        (SMOKE_LINE + "\n\n" if budget == "smoke" else "")
        + "# ./run_all.sh report\n\n"
        + run_section(folder, folder / "scaling.json", "scaling.json of this folder")
        + "\n\n"
        + run_plots(folder, budget)
    )
    (folder / "REPORT.md").write_text(text + "\n")
    return text


# ------------------------------------------------------------------------------------------------ claims
def runs_table(recs: List[dict]) -> str:
    groups = by(
        [
            dict(r, setting=re.sub(r" --seed \S+", "", shlex.join(["python", *r["cell"].get("command", [])])))
            for r in recs
        ],
        "setting",
    )  # a command without its --seed S
    rows = [
        [
            f"`{command}`",
            ", ".join(str(r["seed"]) for r in rs),
            tests(rs),
            " / ".join(tests([r]) for r in rs),
            f"{100 * mean(rs, lambda r: r['density']):.2f}%",
            " / ".join("–" if r["median_step_ms"] is None else f"{r['median_step_ms']:.0f}" for r in rs),
            " / ".join(duration(r["cell"].get("wall_s", r["wall_time_s"])) for r in rs),
            " / ".join(duration(r["cell"].get("cpu_s")) for r in rs),
        ]
        for command, rs in ((c, sorted(rs, key=lambda r: r["seed"])) for c, rs in groups.items())
    ]
    unit = "test acc %" if recs[0]["metric"] == "accuracy" else "test bpb"
    return table(
        rows,
        [
            "command (+ --seed S)",
            "seeds",
            f"{unit} (mean ± std)",
            "per seed",
            "test density",
            "median step ms",
            "wall per seed",
            "CPU per seed",
        ],
    )


def verdict(claim, folder: Path) -> tuple:
    """(ours, verdict) by the claim's rule, or ("–", "not run yet" / "in progress") while records or output are
    missing."""
    recorded, planned = len(load(folder)[0]), len(claim.cells())
    if recorded < planned:  # a claim of kind "output" plans no cells
        return "–", f"in progress: {recorded} of {planned} runs" if recorded else f"not run yet ({planned} runs)"
    try:
        return claim.rule(folder)
    except (FileNotFoundError, KeyError):  # its output, or a setting the rule compares, is missing
        return "–", "not run yet"


def claims_table(results: Path, link: str) -> str:
    anchor = lambda title: re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")  # GitHub's  # noqa: E731
    rows = [
        [
            f"[{claim.title.split(':')[0]}]({link}#{anchor(claim.title)})",
            claim.figure or "–",
            *verdict(claim, results / claim.name),
        ]
        for claim in claims.CLAIMS
    ]
    return table(rows, ["claim", "paper", "ours", "verdict"])


QUICK_FIGURES = ("accuracy_vs_cost",)


def figures(names, captions: Dict[str, str], prefix: str) -> List[str]:
    return [f"![{captions[name]}]({prefix}{name}.png)\n\n*{captions[name]}*" for name in names if name in captions]


def claim_section(claim, results: Path, captions: Dict[str, str]) -> str:
    """One claim as Markdown for results/README.md (links relative to results/), with its plots."""
    folder, link = results / claim.name, f"[{claim.name}/]({claim.name}/)"
    recs = load(folder)[0]
    missing = [c["name"] for c in claim.cells() if not (folder / "runs" / c["name"] / "metrics.json").exists()]
    out = [
        f"## {claim.title}",
        f"Paper: {claim.paper}",
        table([[claim.figure or "–", *verdict(claim, folder)]], ["paper", "ours", "verdict"]),
        f"Reproduce: `python -m experiments.claims run {claim.name}` (records in {link}; each "
        "run's command: `python -m experiments.claims list`)."
        if claim.kind == "runs"
        else "Reproduce: " + "; ".join(f"`{c}`" for c in claim.commands) + f" (saved in {link}).",
    ]
    out += [claim.calibration(folder)] if claim.calibration and (folder / "calibration").is_dir() else []
    out += [(claim.table or runs_table)(recs)] if recs else []
    out += [
        f"Step times on {task} (`experiments.step_time`):\n\n" + step_time_table(timed)
        for task, timed in sorted(step_times_of(folder).items())
        if not (folder / f"step_time-{task}.md").exists()
    ]  # else its saved output, below
    out += [path.read_text().strip() for path in sorted(folder.glob("*.md"))]
    out += [scaling.render(read_json(path)) for path in sorted(folder.glob("scaling*.json"))]
    out += (
        [
            f"Not yet run: {len(missing)} runs"
            if len(missing) > 20
            else "Not yet run: " + ", ".join(f"`{name}`" for name in missing)
        ]
        if missing
        else []
    )
    out += [f"- {note}" for note in claim.notes]
    return "\n\n".join(out + figures(claim.figures, captions, "plots/"))


def results_readme(results: Path, captions: Dict[str, str]) -> str:
    quick = results / "quick"
    return "\n\n".join(
        [
            "# Results",
            "Generated by `python -m experiments.report --readme README.md` from the records in this "
            "folder; never edited by hand. One section per claim of experiments/claims/, with the command that "
            "reproduces it; the quick grid of `./run_all.sh` last.",
            claims_table(results, ""),
            *(claim_section(claim, results, captions) for claim in claims.CLAIMS),
            "## Quick grid: every method on every task (`./run_all.sh`)",
            run_section(quick, results / PUBLISHED_SCALING, PUBLISHED_SCALING, preview=True)
            if quick.exists()
            else "Not published yet: `./run_all.sh --out results/quick`.",
            *figures(QUICK_FIGURES, captions, "plots/"),
        ]
    )


# ------------------------------------------------------------------------------------------------ the glance
def glance(results: Path, captions: Dict[str, str]) -> str:
    """The README's generated region: the methods table, where the claims are, the main plots."""
    recs, plan = load(results / "quick")[0], read_json(results / "quick" / "grid.json") or {}
    scaling_result, lengths = (
        read_json(results / PUBLISHED_SCALING) or {"rows": [], "args": {}},
        sorted({r["config"]["seq_len"] for r in recs}) or ["?"],
    )
    return "\n\n".join(
        [
            f"**Methods**: the quick grid ([results/quick](results/quick), `./run_all.sh`; {devices(recs) or '–'}; "
            f"seeds {sorted({r['seed'] for r in recs})}; {lengths[0]}-{lengths[-1]} tokens) and the scaling run "
            f"[results/{PUBLISHED_SCALING}](results/{PUBLISHED_SCALING}) (lengths "
            f"{scaling_result['args'].get('lengths', '?')}). " + METHOD_CAPTION.format(f"results/{PUBLISHED_SCALING}"),
            method_table(recs, plan, [], scaling_result, step_times_of(results / "quick"), every=True),
            "**Claims**: each paper's figure beside ours, the verdict of the claim's rule, its tables and command "
            "in [results/README.md](results/README.md).",
            *figures(("accuracy_vs_cost", "scaling"), captions, "results/plots/"),
        ]
    )


def main(argv=None) -> int:
    p = cli.parser("python -m experiments.report", __doc__.splitlines()[0])
    p.add_argument("--results", default="results", help="the published records (one folder per claim)")
    p.add_argument(
        "--readme",
        default=None,
        help="rewrite this file's generated region, RESULTS/README.md and the plots in RESULTS/plots",
    )
    p.add_argument("--run", default=None, help="a run folder: write its REPORT.md and plots there instead")
    args = p.parse_args(argv)
    for option, path in (("--run", args.run), ("--results", args.results)):  # '' is refused, not taken for '.'
        if path is not None and not (path and Path(path).is_dir()):
            p.error(f"{option}: no folder {path or repr(path)}")
    results, readme = Path(args.results), Path(args.readme or ".")
    if args.run is not None or args.readme is None:  # a run folder's report, or results/README.md
        print(results_readme(results, {}) if args.run is None else write_run_report(Path(args.run)))
        return 0
    if not (args.readme and readme.is_file() and os.access(readme, os.R_OK | os.W_OK)):
        p.error(f"--readme: {args.readme or repr(args.readme)} is not a file this process can read and write")
    content = readme.read_text()
    if START not in content or END not in content:
        p.error(f"{readme} has no {START} ... {END} markers")
    captions = plots.draw_published(results, results / "plots", COSTS)
    (results / "README.md").write_text(results_readme(results, captions) + "\n")
    head, rest = content.split(START, 1)
    readme.write_text(f"{head}{START}\n{glance(results, captions)}\n{END}{rest.split(END, 1)[1]}")
    print(
        f"wrote {readme}'s generated region, {results / 'README.md'} and {len(captions)} plots in {results / 'plots'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
