"""Tables and plots from results records, never typed by hand.

    python -m bench.report                          # the published report (results/), printed
    python -m bench.report --readme README.md       # maintainers: README's results section + results/plots/
    python -m bench.report --run runs/grid-quick    # a run folder's REPORT.md and plots (./run_all.sh does this)

The published report (results/) leads with one section per claim of bench/claims.py, in that order: what the
paper reports, the command that reproduces it, and the table generated from the claim's records (training
runs: mean ± standard deviation over seeds, with each seed's value and wall time) or the benchmark's saved
output. The quick preview (results/quick, a ./run_all.sh run folder copied there deliberately) follows.

A run's report (the quick preview's shape): the test metric of every method on every task with the density
of what training computed, the task's base rate and whether full attention cleared the quick budget's target
(bench/grid.py QUICK_TARGETS), cells that do not run said once under the table (n/a, no data, left out,
failed with the whole reason), then cost relative to full attention on the same task — attention FLOPs and
density of a training step (what SSA's sub-model and SBM's sampled masks cost), inference FLOPs beside them
where they differ, peak memory and median step time — then the attention scaling table and the plots.
With --readme, the Markdown between <!-- results:start --> and <!-- results:end --> is replaced.
"""
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

from tabulate import tabulate

from bench import claims as claim_list
from bench import cli
from bench import grid, plots, scaling
from bench.files import read_json
from bench import methods as registry

START, END = "<!-- results:start -->", "<!-- results:end -->"
REFERENCE = "full"


# ------------------------------------------------------------------------------------------------ records
def load(folder: Path):
    """(complete records, failures) of a run folder's cells; each record carries its cell's command."""
    records, failures = [], []
    for cell in sorted((folder / "runs").glob("*")):
        record = read_json(cell / "metrics.json")
        if record and record.get("status") == "complete":
            record["cell"] = read_json(cell / "cell.json") or {}
            record["folder"] = cell
            records.append(record)
        elif (cell / "failed.json").exists():
            failures.append(read_json(cell / "failed.json"))
    return records, failures


def scale(record_or_metric, value):
    metric = record_or_metric if isinstance(record_or_metric, str) else record_or_metric["metric"]
    return 100 * value if metric == "accuracy" else value


def fmt(values: List[float], metric: str) -> str:
    """Mean (± standard deviation over seeds when there are several): accuracy in %, bits per byte."""
    scaled = [scale(metric, v) for v in values]
    digits = 2 if metric == "accuracy" else 3
    text = f"{statistics.mean(scaled):.{digits}f}"
    if len(scaled) > 1:
        text += f" ± {statistics.stdev(scaled):.{digits}f}"
    return text


def train_density(r: dict) -> float:
    return r["train_density"] if r.get("train_density") is not None else r["density"]


def train_flops(r: dict) -> dict:
    return r.get("train_flops_per_example") or r["flops_per_example"]


def duration(seconds: Optional[float]) -> str:
    return "–" if seconds is None else (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min")


# ------------------------------------------------------------------------------------------------ a run
def budget_line(recs: List[dict]) -> str:
    seen = {}
    for r in recs:
        c = r["config"]
        seen.setdefault(r["task"], f"{r['task']} {c['steps']} steps × batch {c['batch_size']} at length "
                                   f"{c['seq_len']} ({c['depth']} layers × {c['heads']} heads, width {c['dim']})")
    return "; ".join(seen[t] for t in sorted(seen))


def target_check(task: str, recs: List[dict]) -> Optional[str]:
    """Whether full attention cleared the quick budget's target on this task, with its margin."""
    if task not in grid.QUICK_TARGETS:
        return None
    ref = [r for r in recs if r["method"] == REFERENCE and r["task"] == task]
    if not ref:
        return None
    kind, amount, words = grid.QUICK_TARGETS[task]
    value, base = statistics.mean(r["test"] for r in ref), statistics.mean(r["base_rate"] for r in ref)
    metric = ref[0]["metric"]
    goal = {"min": amount, "above_base": base + amount, "below_base": base - amount}[kind]
    ok = value <= goal if kind == "below_base" else value >= goal
    return (f"{task}: full attention {fmt([value], metric)} against base rate {fmt([base], metric)} "
            f"(target {words}: {'≤' if kind == 'below_base' else '≥'} {fmt([goal], metric)}) — "
            f"{'learned' if ok else 'NOT learned'}")


def ranking_check(recs: List[dict]) -> Optional[str]:
    """SBM Fig. 4 ranks full attention and SBM near 100% on duplicates, Performer and Linformer far below."""
    test = {r["method"]: r["test"] for r in recs if r["task"] == "duplicates"}
    if not all(m in test for m in ("full", "sbm", "performer", "linformer")):
        return None
    top, low = min(test["full"], test["sbm"]), max(test["performer"], test["linformer"])
    agrees = top >= 0.95 and low <= top - 0.05
    return (f"SBM Fig. 4 ranks full attention and SBM-Transformer near 100% on duplicates and Performer and "
            f"Linformer far below. Here: full {100 * test['full']:.2f}%, SBM {100 * test['sbm']:.2f}%, Performer "
            f"{100 * test['performer']:.2f}%, Linformer {100 * test['linformer']:.2f}%: "
            f"{'agrees' if agrees else 'does not agree'} at this budget"
            + ("" if agrees else " (the paper's recipe: the README's SBM Fig. 4 claim)") + ".")


def method_order(names) -> List[str]:
    """Registry order, then any method the records name that this process has not registered (a plug-in)."""
    names = set(names)
    return [m for m in registry.METHODS if m in names] + sorted(names - set(registry.METHODS))


def accuracy_table(recs: List[dict], plan: dict, failures: List[dict]) -> str:
    tasks = [t for t in grid.GRID_TASKS if any(r["task"] == t for r in recs)]
    methods = method_order([r["method"] for r in recs] + [f["method"] for f in failures] + plan.get("methods", []))
    refused = {(n["method"], n["task"]): n["reason"] for n in plan.get("not_run", [])}
    failed = {(f["method"], f["task"]): f for f in failures}
    cells = defaultdict(list)
    for r in recs:
        cells[(r["method"], r["task"])].append(r)
    rows = []
    for m in methods:
        row = [m]
        for t in tasks:
            rs = cells.get((m, t))
            if rs:
                density = statistics.mean(r["density"] for r in rs)
                row.append(f"{fmt([r['test'] for r in rs], rs[0]['metric'])} ({100 * density:.1f}%)")
            elif (m, t) in refused:
                row.append(f"n/a ({refused[(m, t)]})")
            elif (m, t) in failed:
                row.append("failed (below)")
            elif m in registry.METHODS and not registry.applicable(m, t):
                row.append("–")
            else:
                row.append("not run")
        rows.append(row)
    base = ["base rate"]
    for t in tasks:
        rs = [r for r in recs if r["task"] == t and r.get("base_rate") is not None]
        base.append(fmt([statistics.mean(r["base_rate"] for r in rs)], rs[0]["metric"]) if rs else "–")
    rows.append(base)
    metric_of = {t: next(r["metric"] for r in recs if r["task"] == t) for t in tasks}
    headers = ["method"] + [f"{t} ({'acc %' if metric_of[t] == 'accuracy' else 'bpb'})" for t in tasks]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def cost_table(recs: List[dict]) -> str:
    by_cell = defaultdict(list)
    for r in recs:
        by_cell[(r["task"], r["method"])].append(r)

    def mean(rs, get):
        values = [get(r) for r in rs] if rs else []
        return statistics.mean(values) if values and None not in values else None

    def ratio(rs, ref, get):
        value, base = mean(rs, get), mean(ref, get)
        return f"{value / base:.2f}" if value is not None and base else "–"

    rows = []
    for task in [t for t in grid.GRID_TASKS if any(k[0] == t for k in by_cell)]:
        ref = by_cell.get((task, REFERENCE))
        for method in method_order(m for t, m in by_cell if t == task):
            rs = by_cell[(task, method)]
            train_attn = ratio(rs, ref, lambda r: train_flops(r)["attention"])
            eval_attn = ratio(rs, ref, lambda r: r["flops_per_example"]["attention"])
            density, eval_density = mean(rs, train_density), mean(rs, lambda r: r["density"])
            rows.append([task, method, f"{100 * density:.1f}%",
                         train_attn + ("" if eval_attn == train_attn else f" (eval {eval_attn})"),
                         ratio(rs, ref, lambda r: train_flops(r)["model"]),
                         ratio(rs, ref, lambda r: r["peak_memory_bytes"]),
                         ratio(rs, ref, lambda r: r["median_step_ms"]),
                         f"{mean(rs, lambda r: r['median_step_ms']):.0f}", f"{100 * eval_density:.1f}%"])
    headers = ["task", "method", "train density", f"attention FLOPs × {REFERENCE}", f"model FLOPs × {REFERENCE}",
               f"peak memory × {REFERENCE}", f"step time × {REFERENCE}", "step ms", "eval density"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def run_section(folder: Path, plot_dir: Optional[Path], link_prefix: str = "") -> str:
    """A run folder (./run_all.sh's output) as Markdown: preview table, cost, scaling, plots."""
    plan = read_json(folder / "grid.json") or {}
    run = read_json(folder / "run.json") or {}
    recs, failures = load(folder)
    out = []
    if not recs and not failures:
        return f"No records in {folder} yet: run ./run_all.sh."
    devices = sorted({r["device"] for r in recs})
    seeds = sorted({r["seed"] for r in recs})
    head = (f"**Budget `{plan.get('budget', '?')}`** (preset `{plan.get('preset', '?')}`), {', '.join(devices)}, "
            f"seeds {seeds}; `{' '.join(run.get('command', ['./run_all.sh']))}` (commit {run.get('commit', '?')}) "
            f"took {duration(run.get('wall_time_s'))} end to end with {run.get('jobs', '?')} cells side by side. "
            f"Per task: {budget_line(recs)}.")
    if plan.get("budget") == "quick":
        head = ("**Quick preview**: a smoke-level comparison on a CPU budget; the papers' claims are measured by the "
                "claim tables of the README. " + head)
    out.append(head)
    out.append("Test metric (attention density of the test evaluation, mean over heads and layers; what training "
               "computed is in the cost table):\n\n" + accuracy_table(recs, plan, failures))
    notes = []
    if plan.get("budget") == "quick":  # the targets the quick budget was calibrated to, checked on this run
        notes += [line for line in (target_check(t, recs) for t in grid.GRID_TASKS) if line]
        notes += [line for line in [ranking_check(recs)] if line]
    notes += [f"n/a: {n['method']} on {n['task']} ({n['reason']}), decided before the grid ran"
              for n in plan.get("not_run", [])]
    notes += [f"no data: {task}: {message}" for task, message in plan.get("missing_data", {}).items()]
    notes += [f"left out of the {plan.get('budget')} budget: {task}: {reason}"
              for task, reason in plan.get("left_out", {}).items()]
    notes += [f"failed: {f['method']} on {f['task']} (exit {f['exit_code']}): {f['reason']}" for f in failures]
    if notes:
        out.append("\n".join(f"- {line}" for line in notes))
    out.append(f"Cost relative to {REFERENCE} attention on the same task (forward FLOPs per example of a training "
               f"step; peak memory of training; median training step):\n\n{cost_table(recs)}")
    scaling_result = read_json(folder / "scaling.json")
    if scaling_result:
        out.append(scaling.render(scaling_result))
    if plot_dir is not None:
        out.append(run_plots(recs, scaling_result, plot_dir, link_prefix))
    return "\n\n".join(out)


def run_plots(recs: List[dict], scaling_result: Optional[dict], plot_dir: Path, link_prefix: str) -> str:
    if not plots.available():
        return "Plots: matplotlib is not installed (`pip install -r requirements-extra.txt`); tables only."
    plot_dir.mkdir(parents=True, exist_ok=True)
    shown = []
    if recs:
        shown.append(("accuracy_vs_cost.png", plots.accuracy_vs_cost(recs, plot_dir / "accuracy_vs_cost.png")))
    if scaling_result:
        shown.append(("scaling.png", plots.scaling(scaling_result, plot_dir / "scaling.png")))
    return "\n\n".join(f"![{caption}]({link_prefix}{name})\n\n*{caption}*" for name, caption in shown)


def write_run_report(folder: Path) -> str:
    """OUT/REPORT.md and OUT/*.png of a run folder; returns the report's text."""
    text = "# ./run_all.sh report\n\n" + run_section(folder, folder)
    (folder / "REPORT.md").write_text(text + "\n")
    return text


# ------------------------------------------------------------------------------------------------ claims
def log_lines(folder: Path) -> List[dict]:
    lines = []
    path = folder / "log.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                break  # a torn last line of a killed run
    return lines


def runs_table(claim, recs: List[dict]) -> str:
    groups: Dict[str, List[dict]] = defaultdict(list)
    for r in recs:
        command = r["cell"].get("command", [])
        setting = [c for i, c in enumerate(command) if c != "--seed" and (i == 0 or command[i - 1] != "--seed")]
        groups[" ".join(["python", *setting])].append(r)
    rows = []
    for command, rs in groups.items():
        rs.sort(key=lambda r: r["seed"])
        rows.append([f"`{command}`", ", ".join(str(r["seed"]) for r in rs), fmt([r["test"] for r in rs],
                     rs[0]["metric"]), " / ".join(fmt([r["test"]], r["metric"]) for r in rs),
                     f"{100 * statistics.mean(r['density'] for r in rs):.1f}%",
                     " / ".join("–" if r["median_step_ms"] is None else f"{r['median_step_ms']:.0f}" for r in rs),
                     " / ".join(duration(r["cell"].get("wall_s", r["wall_time_s"])) for r in rs),
                     " / ".join(duration(r["cell"].get("cpu_s")) for r in rs)])
    metric = recs[0]["metric"] if recs else "accuracy"
    unit = "test acc %" if metric == "accuracy" else "test bpb"
    headers = ["command (+ --seed S)", "seeds", f"{unit} (mean ± std)", "per seed", "test density",
               "median step ms", "wall per seed", "CPU per seed"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


# Fig. 4's low-rank (Linformer, Nyströmformer) and kernelized (linear, Performer) methods, which the paper says
# "fail to achieve the same level of accuracy" (§5.1).
FIG4_FALL_SHORT = ("linear", "performer", "linformer", "nystromformer")


def fig4_check(recs: List[dict]) -> str:
    """Fig. 4's claim against the records: full attention and SBM reach ~100% (≥ 99% here), the low-rank and
    kernelized methods do not. Every method is named on its side of 99% with its figure."""
    test = {r["method"]: r["test"] for r in recs}
    top = [m for m in method_order(test) if test[m] >= 0.99]
    below = [m for m in method_order(test) if test[m] < 0.99]
    words = lambda ms: ", ".join(f"{m} {100 * test[m]:.2f}%" for m in ms) or "none"  # noqa: E731
    reach = [m for m in top if m in FIG4_FALL_SHORT]
    short = [m for m in ("full", "sbm") if m not in top]
    if short:
        verdict = f"the records do not agree: {' and '.join(short)} {'stays' if len(short) == 1 else 'stay'} below 99%."
    elif reach:
        verdict = (f"the records agree for full attention and SBM; they differ for {', '.join(reach)}, "
                   f"which {'reach' if len(reach) > 1 else 'reaches'} 99% too.")
    else:
        verdict = "the records agree."
    return (f"At ≥ 99% test accuracy: {words(top)}. Below: {words(below)}. The paper's Fig. 4 has full attention "
            f"and SBM-Transformer reach 100% and the low-rank and kernelized methods ({', '.join(FIG4_FALL_SHORT)}) "
            f"fall short: {verdict}")


def setting_label(r: dict) -> str:
    """A Table 3 row's name: the method, SBM's λ, full attention's explicit path."""
    command = r["cell"].get("command", [])
    label = r["method"]
    if r["config"].get("density_weight"):
        label += f" λ={float(r['config']['density_weight']):g}"
    if "path=reference" in command:
        label += " (explicit path)"
    return label


def table3(recs: List[dict]) -> str:
    """SBM Table 3 from a claim's records, one table per task (the paper's columns): per-example inference FLOPs
    and memory relative to full attention (fused SDPA, and the explicit path), beside the paper's figures, with
    accuracy, density and step time."""
    by_task: Dict[str, List[dict]] = defaultdict(list)
    for r in recs:
        by_task[r["task"]].append(r)
    order = [t for t in claim_list.PAPER_TABLE3 if t in by_task] + sorted(set(by_task) - set(claim_list.PAPER_TABLE3))
    return "\n\n".join(f"{task} ({by_task[task][0]['config']['seq_len']} tokens):\n\n"
                        + table3_task(by_task[task], claim_list.PAPER_TABLE3.get(task, {})) for task in order)


def with_exploration(rs: List[dict]) -> str:
    """SBM's test accuracy and density with δ's random edges kept in evaluation (the recipe's second test pass),
    mean over seeds; "–" where a record has none (other methods, δ = 0, or δ already on)."""
    explored = [r.get("sbm", {}).get("test_with_exploration") for r in rs]
    if not explored or None in explored:
        return "–"
    return (fmt([e["metric"] for e in explored], "accuracy")
            + f" ({100 * statistics.mean(e['density'] for e in explored):.1f}%)")


def table3_task(recs: List[dict], paper_column: Dict[str, tuple]) -> str:
    groups: Dict[str, List[dict]] = defaultdict(list)
    for r in recs:
        groups[setting_label(r)].append(r)
    full, explicit = groups.get("full"), groups.get("full (explicit path)")
    if not full:
        return "Full attention's record is missing: no ratio can be given."

    def mean(rs, get):
        return statistics.mean(get(r) for r in rs)

    def ratio(rs, ref, get):
        return f"{mean(rs, get) / mean(ref, get):.3f}" if ref else "–"

    flops = lambda r: r["flops_per_example"]["model"]  # noqa: E731 (one-line accessors for the table)
    attention_flops = lambda r: r["flops_per_example"]["attention"]  # noqa: E731
    memory = lambda r: r["inference_memory_per_example_bytes"]  # noqa: E731
    rows = []
    order = ["full", "sbm"] + [m for m in registry.METHODS if m not in ("full", "sbm")]
    for label in sorted(groups, key=lambda g: (order.index(g.split()[0]) if g.split()[0] in order else len(order), g)):
        rs = sorted(groups[label], key=lambda r: r["seed"])
        trained = rs[0]["steps"] > 0
        paper = paper_column.get(label)
        per_layer = [statistics.mean(r["density_per_layer"][i] for r in rs)
                     for i in range(len(rs[0]["density_per_layer"]))]
        rows.append([label, ", ".join(str(r["seed"]) for r in rs),
                     fmt([r["test"] for r in rs], "accuracy") if trained else "untrained",
                     f"{100 * mean(rs, lambda r: r['density']):.1f}% ("
                     + " / ".join(f"{100 * d:.1f}" for d in per_layer) + ")",
                     with_exploration(rs),
                     ratio(rs, full, flops), ratio(rs, full, attention_flops),
                     ratio(rs, explicit, memory), ratio(rs, full, memory),
                     f"{mean(rs, memory) / 2 ** 20:.1f}",
                     ratio(rs, full, lambda r: r["median_step_ms"]) if trained else "–",
                     f"{paper[0]:.2f} / {paper[1]:.2f}" if paper else "–"])
    headers = ["setting", "seeds", "test acc %", "test density (per layer %)", "with δ in eval: acc % (density)",
               "FLOPs ÷ full",
               "attention FLOPs ÷ full", "memory ÷ explicit full", "memory ÷ SDPA full", "MiB per example",
               "train step ÷ full", "paper FLOPs / memory"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def claim_section(claim, results: Path, plot_dir: Optional[Path], link_prefix: str) -> str:
    folder = results / claim.name
    out = [f"### {claim.title}", f"Paper: {claim.paper}"]
    if claim.kind == "runs":
        recs, failures = load(folder)
        missing = [c for c in claim.cells() if not (folder / "runs" / c["name"] / "metrics.json").exists()]
        out.append(f"Reproduce: `python -m bench.claims run {claim.name}` (records in `results/{claim.name}/`), "
                   f"or one row's command with `--seed S --out DIR`.")
        if recs and claim.name == "sbm-fig4":
            out.append(fig4_check(recs))
        if recs and claim.name == "sbm-table3":
            out.append(table3(recs))
        if recs:
            out.append(runs_table(claim, recs))
        if missing:
            out.append("Not yet run: " + ", ".join(f"`{c['name']}`" for c in missing) + ".")
        out += [f"- {note}" for note in claim.notes]
        if plot_dir is not None and claim.name == "sbm-fig4" and recs and plots.available():
            curves = {r["method"]: log_lines(r["folder"]) for r in recs}
            caption = plots.sbm_training(curves, plot_dir / "sbm_fig4.png")
            out.append(f"![{caption}]({link_prefix}sbm_fig4.png)\n\n*{caption}*")
    else:
        out.append("Reproduce: " + "; ".join(f"`{c}`" for c in claim.commands) + f" (saved in `results/{claim.name}/`).")
        for path in sorted(folder.glob("*.md")):
            out.append(path.read_text().strip())
        out += [scaling.render(json.loads(path.read_text())) for path in sorted(folder.glob("scaling*.json"))]
        out += [f"- {note}" for note in claim.notes]
        if plot_dir is not None and claim.name == "ssa-table" and plots.available():
            out += ssa_plot(folder, plot_dir, link_prefix)
        if plot_dir is not None and claim.name == "scaling" and plots.available():
            for path in sorted(folder.glob("*.json")):
                caption = plots.scaling(json.loads(path.read_text()), plot_dir / f"{path.stem}.png")
                out.append(f"![{caption}]({link_prefix}{path.stem}.png)\n\n*{caption}*")
    return "\n\n".join(out)


def ssa_plot(folder: Path, plot_dir: Path, link_prefix: str) -> List[str]:
    """Fig. 7's curve from bench.ssa_table's saved output: the dense figure on the "Self-ensembling" line and
    the rows of the sub-models table that follows it."""
    for path in sorted(folder.glob("*.md")):
        lines = path.read_text().splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("Self-ensembling")), None)
        if start is None:
            continue
        dense = float(lines[start].rsplit(" ", 1)[1])
        rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start + 1:]
                if line.startswith("|") and line.strip("|").split("|")[0].strip().isdigit()]
        caption = plots.ssa_ensemble([int(r[0]) for r in rows], [float(r[1]) for r in rows], dense,
                                     plot_dir / "ssa_fig7.png")
        return [f"![{caption}]({link_prefix}ssa_fig7.png)\n\n*{caption}*"]
    return []


def published(results: Path, plot_dir: Optional[Path], link_prefix: str = "") -> str:
    out = [claim_section(claim, results, plot_dir, link_prefix) for claim in claim_list.CLAIMS]
    quick = results / "quick"
    out.append("### Quick preview: every method on every task (`./run_all.sh`)")
    out.append(run_section(quick, plot_dir, link_prefix) if quick.exists() else
               "Not published yet: `./run_all.sh --out results/quick`.")
    return "\n\n".join(out)


def main(argv=None) -> int:
    p = cli.parser("python -m bench.report", __doc__.splitlines()[0])
    p.add_argument("--results", default="results", help="the published records (one folder per claim)")
    p.add_argument("--readme", default=None, help="rewrite this file's results section; plots to RESULTS/plots")
    p.add_argument("--run", default=None, help="a run folder: write its REPORT.md and plots there instead")
    args = p.parse_args(argv)
    if args.run:
        if not Path(args.run).is_dir():
            p.error(f"--run: no folder {args.run}")
        print(write_run_report(Path(args.run)))
        return 0
    results = Path(args.results)
    if not results.is_dir():
        p.error(f"--results: no folder {results}")
    if args.readme and not (Path(args.readme).is_file() and os.access(args.readme, os.R_OK | os.W_OK)):
        p.error(f"--readme: {args.readme} is not a file this process can read and write")
    plot_dir = results / "plots" if args.readme else None
    if plot_dir is not None and plots.available():
        plot_dir.mkdir(exist_ok=True)
    text = published(results, plot_dir, f"{results.as_posix()}/plots/")
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
