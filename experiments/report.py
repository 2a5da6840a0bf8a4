"""Tables, sentences and plots from the records under results/, never typed by hand.

    python -m experiments.report --readme README.md     # maintainers: README's results at a glance, results/README.md
                                                  # (every claim's table) and results/plots/, in one call
    python -m experiments.report                        # results/README.md's text, printed
    python -m experiments.report --run runs/grid-quick  # a run folder's REPORT.md and plots (./run_all.sh does this)

The glance (README, between <!-- results:start --> and <!-- results:end -->): one row per registered method with
its quick-grid test metric per task, its costs relative to full attention and the lengths from which the scaling
table finds it cheaper ("not run yet" where no record exists), the sentences the records support, the main plots.
results/README.md: one section per claim of experiments/claims.py, in order (what the paper reports, the command, the
table from the claim's records or its benchmark's saved output, the notes, the plot), then the quick preview
(results/quick, a ./run_all.sh run folder) in full. A run's REPORT.md: the same method table, the calibration
targets of experiments/grid.py and the cells that did not run, the cost per task, the scaling table.
"""
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

from tabulate import tabulate

from experiments import claims as claim_list
from bench import cli
from experiments import grid, plots, scaling
from bench import methods as registry
from bench.files import read_json

START, END = "<!-- results:start -->", "<!-- results:end -->"
REFERENCE = "full"
BPB_NOISE = 0.05  # bits per byte counted as noise (a record keeps no standard error of its bits per byte)
PAPER_LISTOPS_DENSITY = {0.0: 0.2009, 0.01: 0.0295}  # SBM Table 2, ListOps 2K: mask density at λ = 0 and 1e-2
COSTS = {  # what a training step costs, per record: the columns "× full" of the method and cost tables
    "train density": lambda r: r["train_density"] if r.get("train_density") is not None else r["density"],
    "attention FLOPs": lambda r: (r.get("train_flops_per_example") or r["flops_per_example"])["attention"],
    "model FLOPs": lambda r: (r.get("train_flops_per_example") or r["flops_per_example"])["model"],
    "peak memory": lambda r: r["peak_memory_bytes"], "step time": lambda r: r["median_step_ms"],
    "eval attention FLOPs": lambda r: r["flops_per_example"]["attention"]}


# ------------------------------------------------------------------------------------------------ records
def load(folder: Path):
    """(complete records, failures) of a run folder's cells; each record carries its cell's command."""
    records, failures = [], []
    for cell in sorted((folder / "runs").glob("*")):
        record = read_json(cell / "metrics.json")
        if record and record.get("status") == "complete":
            records.append(dict(record, cell=read_json(cell / "cell.json") or {}, folder=cell))
        elif (cell / "failed.json").exists():
            failures.append(read_json(cell / "failed.json"))
    return records, failures


def fmt(values: List[float], metric: str, units: bool = False) -> str:
    """Mean (± standard deviation over seeds when there are several): accuracy in %, bits per byte."""
    scaled = [100 * v if metric == "accuracy" else v for v in values]
    digits = 2 if metric == "accuracy" else 3
    text = f"{statistics.mean(scaled):.{digits}f}"
    text += f" ± {statistics.stdev(scaled):.{digits}f}" if len(scaled) > 1 else ""
    return text + (("%" if metric == "accuracy" else " bpb") if units else "")


def tests(rs: List[dict], units: bool = False) -> str:
    return fmt([r["test"] for r in rs], rs[0]["metric"], units)


def mean(rs: List[dict], get) -> Optional[float]:
    values = [get(r) for r in rs]
    return statistics.mean(values) if values and None not in values else None


def duration(seconds: Optional[float]) -> str:
    return "–" if seconds is None else (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min")


def table(rows: list, headers: List[str]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def by(recs: List[dict], *keys) -> Dict[tuple, List[dict]]:
    groups = defaultdict(list)
    for r in recs:
        groups[tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]].append(r)
    return groups


def method_order(names) -> List[str]:
    """Registry order, then any method the records name that this process has not registered (a plug-in)."""
    names = set(names)
    return [m for m in registry.METHODS if m in names] + sorted(names - set(registry.METHODS))


def noise(r: dict, p: float) -> float:
    """Two binomial standard errors of an accuracy p on the record's scored test targets, or BPB_NOISE."""
    n = (r.get("scored") or {}).get("test")
    return BPB_NOISE if r["metric"] != "accuracy" else 2 * math.sqrt(p * (1 - p) / n) if n else 0.0


def at_base_rate(rs: List[dict]) -> bool:
    """Whether every trained record's test metric is within noise of its split's base rate (the majority class,
    or the unigram entropy): the model learned nothing that the evaluation can see."""
    def one(r, base):
        if base is None or not r.get("steps", 1):
            return False
        return r["test"] <= base + noise(r, base) if r["metric"] == "accuracy" else r["test"] >= base - BPB_NOISE
    return all(one(r, r.get("base_rate")) for r in rs)


# ------------------------------------------------------------------------------------------------ a run
def target_check(task: str, recs: List[dict]) -> Optional[str]:
    """Whether full attention cleared the quick budget's target on this task (experiments/grid.py QUICK_TARGETS)."""
    ref = [r for r in recs if r["method"] == REFERENCE and r["task"] == task]
    if task not in grid.QUICK_TARGETS or not ref:
        return None
    kind, amount, words = grid.QUICK_TARGETS[task]
    value, base, metric = mean(ref, lambda r: r["test"]), mean(ref, lambda r: r["base_rate"]), ref[0]["metric"]
    goal = {"min": amount, "above_base": base + amount, "below_base": base - amount}[kind]
    ok = value <= goal if kind == "below_base" else value >= goal
    return (f"{task}: full attention {fmt([value], metric)} against base rate {fmt([base], metric)} "
            f"(target {words}: {'≤' if kind == 'below_base' else '≥'} {fmt([goal], metric)}) — "
            f"{'learned' if ok else 'NOT learned'}")


def ratios(recs: List[dict], step_times: Optional[Dict[str, dict]] = None) -> Dict[tuple, Dict[str, float]]:
    """Per (method, task): each of COSTS relative to full attention's on the same task, where both have it; the
    step time ÷ fair full attention's from ``step_times`` (task → experiments.step_time's JSON: every method's step
    timed side by side in one process) where it timed the method, else from the runs' own medians."""
    cells = by(recs, "method", "task")
    both = lambda rs, ref, get: mean(rs, get) and mean(ref, get)  # noqa: E731
    out = {(m, t): {k: mean(rs, get) / mean(cells[(REFERENCE, t)], get) for k, get in COSTS.items()
                    if both(rs, cells.get((REFERENCE, t), []), get)} for (m, t), rs in cells.items()}
    for (m, t), named in out.items():
        fair = fair_step_ratios((step_times or {}).get(t))
        if m in fair:
            named["step time"] = fair[m]
    return out


def step_times_of(folder: Path) -> Dict[str, dict]:
    """task → experiments.step_time's JSON in FOLDER/step_time-TASK (a run folder's or a claim's)."""
    return {path.parent.name.split("-", 1)[1]: read_json(path) for path in folder.glob("step_time-*/step_time.json")}


def relative_costs(recs: List[dict], step_times: Optional[Dict[str, dict]] = None) -> Dict[str, Dict[str, float]]:
    """Per method: each of COSTS relative to full attention, geometric mean over the tasks where both ran."""
    logs = defaultdict(lambda: defaultdict(list))
    for (method, _), named in ratios(recs, step_times).items():
        for name, value in named.items():
            logs[method][name].append(math.log(value))
    return {m: {k: math.exp(statistics.mean(v)) for k, v in named.items()} for m, named in logs.items()}


def crossovers(result: Optional[dict]) -> Dict[str, dict]:
    """Per method of a scaling table, for fwd+bwd time and peak memory: (the shortest length n from which it stays
    below full attention's at every longer n measured, or None; whether n is the shortest length measured; its
    ratio to full attention at the longest length)."""
    rows = [r for r in (result or {}).get("rows", []) if "error" not in r and not r.get("options")]
    ref = {r["n"]: r for r in rows if r["method"] == REFERENCE}
    lengths, out = sorted(ref), defaultdict(dict)
    for method in {r["method"] for r in rows} - {REFERENCE}:
        mine = {r["n"]: r for r in rows if r["method"] == method}
        for key in ("fwdbwd_ms", "peak_bytes"):
            below = [n in mine and mine[n][key] < ref[n][key] for n in lengths]
            first = next((i for i in range(len(lengths)) if all(below[i:])), None)
            last = mine[lengths[-1]][key] / ref[lengths[-1]][key] if lengths[-1] in mine else None
            out[method][key] = (None if first is None else lengths[first], first == 0, last)
    return out


def method_table(recs: List[dict], plan: dict, failures: List[dict], scaling_result: Optional[dict],
                 step_times: Optional[Dict[str, dict]] = None, every: bool = False) -> str:
    """One row per method (the plan's and the records', or ``every`` registered one): the test metric per task,
    the costs relative to full attention (relative_costs) and the crossover lengths of the scaling table."""
    cells, by_task, costs = by(recs, "method", "task"), by(recs, "task"), relative_costs(recs, step_times)
    cross, tasks = crossovers(scaling_result), [t for t in grid.GRID_TASKS if t in by_task]
    refused = {(n["method"], n["task"]): n["reason"] for n in plan.get("not_run", [])}
    failed, rows = {(f["method"], f["task"]): f["status"] for f in failures}, []  # "failed" or "diverged"
    names = [*(registry.METHODS if every else plan.get("methods", [])), *(r["method"] for r in recs + failures)]
    for m in method_order(names):
        row = [m] + [tests(cells[(m, t)]) + (" (base rate)" if at_base_rate(cells[(m, t)]) else "")
                     if (m, t) in cells else f"n/a ({refused[(m, t)]})" if (m, t) in refused else
                     f"{failed[(m, t)]} (below)" if (m, t) in failed else
                     "–" if m in registry.METHODS and not registry.applicable(m, t) else "not run yet" for t in tasks]
        ran = any(k[0] == m for k in cells)
        row += [f"{costs[m][k]:.2f}" if k in costs.get(m, {}) else "–" if ran else "not run yet"
                for k in ("train density", "attention FLOPs", "peak memory", "step time")]
        words = [("—" if n is None else f"{'≤ ' if first else ''}{n}") for n, first, _ in cross.get(m, {}).values()]
        rows.append(row + ["(reference)" if m == REFERENCE else " / ".join(words) if words else
                           "n/a" if m in registry.METHODS and not registry.get(m).scaling else "not run yet"])
    based = {t: [r for r in by_task[t] if r.get("base_rate") is not None] for t in tasks}
    rows.append(["base rate"] + [fmt([mean(based[t], lambda r: r["base_rate"])], based[t][0]["metric"])
                                 if based[t] else "–" for t in tasks] + [""] * 5)
    units = {t: "acc %" if by_task[t][0]["metric"] == "accuracy" else "bpb" for t in tasks}
    return table(rows, ["method", *(f"{t} ({units[t]})" for t in tasks), "train density × full",
                        "attention FLOPs × full", "peak memory × full", "step time × full",
                        "below full from n (time / memory)"])


METHOD_TABLE = ("Test metric per task (\"(base rate)\": within two standard errors of the split's majority class, "
                "or 0.05 bits per byte of its unigram entropy); costs relative to full attention on the same task, "
                "geometric mean over the tasks (training attention pairs and FLOPs, peak memory, and the training "
                "step's time against fair full attention's, timed side by side in one process); last "
                "column: the length n from which forward+backward time / peak memory stay below full attention's "
                "(fused SDPA) in the scaling table (\"≤\": already at the shortest length measured; \"—\": not in "
                "the range measured).")


def cost_table(recs: List[dict], step_times: Optional[Dict[str, dict]] = None) -> str:
    cells, relative, rows = by(recs, "task", "method"), ratios(recs, step_times), []
    for task in [t for t in grid.GRID_TASKS if any(k[0] == t for k in cells)]:
        for method in method_order(m for t, m in cells if t == task):
            rs, named = cells[(task, method)], relative[(method, task)]
            ratio = lambda k: f"{named[k]:.2f}" if k in named else "–"  # noqa: E731
            train, evaluation = ratio("attention FLOPs"), ratio("eval attention FLOPs")
            rows.append([task, method, f"{100 * mean(rs, COSTS['train density']):.1f}%",
                         train + ("" if evaluation == train else f" (eval {evaluation})"),
                         *(ratio(k) for k in ("model FLOPs", "peak memory", "step time")),
                         f"{mean(rs, COSTS['step time']):.0f}", f"{100 * mean(rs, lambda r: r['density']):.1f}%"])
    return table(rows, ["task", "method", "train density", "attention FLOPs × full", "model FLOPs × full",
                        "peak memory × full", "step time × fair full", "step ms (run)", "eval density"])


def run_section(folder: Path, preview: bool = False) -> str:
    """A run folder (./run_all.sh's output) as Markdown: the method table, its notes, cost per task, scaling."""
    plan, run = read_json(folder / "grid.json") or {}, read_json(folder / "run.json") or {}
    recs, failures = load(folder)
    if not recs and not failures:
        return f"No records in {folder} yet: run ./run_all.sh."
    budgets = {r["task"]: (f"{r['task']} {r['config']['steps']} steps × batch {r['config']['batch_size']} at length "
                           f"{r['config']['seq_len']} ({r['config']['depth']} layers × {r['config']['heads']} heads, "
                           f"width {r['config']['dim']})") for r in recs}
    notes = [line for line in (target_check(t, recs) for t in grid.GRID_TASKS) if line]
    notes += [f"n/a: {n['method']} on {n['task']} ({n['reason']}), decided before the grid ran"
              for n in plan.get("not_run", [])]
    notes += [f"no data: {task}: {message}" for task, message in plan.get("missing_data", {}).items()]
    notes += [f"left out of the {plan.get('budget')} budget: {task}: {reason}"
              for task, reason in plan.get("left_out", {}).items()]
    notes += [f"{f['status']}: {f['method']} on {f['task']} (exit {f['exit_code']}): {f['reason']}" for f in failures]
    scaling_result, step_times = read_json(folder / "scaling.json"), step_times_of(folder)
    return "\n\n".join([
        ("**Quick preview**: a smoke-level comparison on a CPU budget; the claim sections above measure the papers' "
         "claims. " if preview else "") + f"**Budget `{plan.get('budget', '?')}`** "
        f"(preset `{plan.get('preset', '?')}`), {', '.join(sorted({r['device'] for r in recs}))}, "
        f"seeds {sorted({r['seed'] for r in recs})}; "
        f"`{' '.join(run.get('command', ['./run_all.sh']))}` (commit {run.get('commit', '?')}) took "
        f"{duration(run.get('wall_time_s'))} end to end with {run.get('jobs', '?')} cells side by side. "
        + "".join(f"Rerun at commit {again['commit']}: {', '.join(again['cells'])} ({again['why']}). "
                  for again in run.get("reruns", []))
        + f"Per task: {'; '.join(budgets[t] for t in sorted(budgets))}.",
        METHOD_TABLE + "\n\n" + method_table(recs, plan, failures, scaling_result, step_times),
        *(["\n".join(f"- {line}" for line in notes)] if notes else []),
        f"Cost relative to {REFERENCE} attention on the same task (forward FLOPs per example of a training step; "
        f"peak memory of training; the training step against fair full attention's, timed side by side in one "
        f"process, and each run's own median; density of the training and the test passes):\n\n"
        + cost_table(recs, step_times), *([scaling.render(scaling_result)] if scaling_result else []),
        *(f"Step times on {task}:\n\n" + step_time_table(timed) for task, timed in sorted(step_times.items()))])


def run_plots(folder: Path) -> str:
    if not plots.available():
        return "Plots: matplotlib is not installed (`pip install -r requirements-extra.txt`); tables only."
    recs, scaling_result, shown = load(folder)[0], read_json(folder / "scaling.json"), {}
    if recs:
        shown["accuracy_vs_cost"] = plots.accuracy_vs_cost(recs, folder / "accuracy_vs_cost.png", COSTS)
    if scaling_result:
        shown["scaling"] = plots.scaling(scaling_result, folder / "scaling.png", SCALING_PLOTS["scaling"])
    return "\n\n".join(figures(shown, shown, ""))


def write_run_report(folder: Path) -> str:
    """OUT/REPORT.md and OUT/*.png of a run folder; returns the report's text."""
    text = "# ./run_all.sh report\n\n" + run_section(folder) + "\n\n" + run_plots(folder)
    (folder / "REPORT.md").write_text(text + "\n")
    return text


# ------------------------------------------------------------------------------------------------ claims
def log_lines(folder: Path) -> List[dict]:
    lines = []
    for line in (folder / "log.jsonl").read_text().splitlines() if (folder / "log.jsonl").exists() else []:
        try:
            lines.append(json.loads(line))
        except ValueError:
            break  # a torn last line of a killed run
    return lines


def runs_table(recs: List[dict]) -> str:
    groups: Dict[str, List[dict]] = defaultdict(list)
    for r in recs:
        command = r["cell"].get("command", [])
        setting = [c for i, c in enumerate(command) if c != "--seed" and (i == 0 or command[i - 1] != "--seed")]
        groups[" ".join(["python", *setting])].append(r)
    rows = []
    for command, rs in groups.items():
        rs.sort(key=lambda r: r["seed"])
        rows.append([f"`{command}`", ", ".join(str(r["seed"]) for r in rs), tests(rs),
                     " / ".join(tests([r]) for r in rs), f"{100 * mean(rs, lambda r: r['density']):.2f}%",
                     " / ".join("–" if r["median_step_ms"] is None else f"{r['median_step_ms']:.0f}" for r in rs),
                     " / ".join(duration(r["cell"].get("wall_s", r["wall_time_s"])) for r in rs),
                     " / ".join(duration(r["cell"].get("cpu_s")) for r in rs)])
    unit = "test acc %" if recs[0]["metric"] == "accuracy" else "test bpb"
    return table(rows, ["command (+ --seed S)", "seeds", f"{unit} (mean ± std)", "per seed", "test density",
                        "median step ms", "wall per seed", "CPU per seed"])


# Fig. 4's low-rank (Linformer, Nyströmformer) and kernelized (linear, Performer) methods, which the paper says
# "fail to achieve the same level of accuracy" (§5.1).
FIG4_FALL_SHORT = ("linear", "performer", "linformer", "nystromformer")


def fig4_check(recs: List[dict]) -> str:
    """Fig. 4's claim against the records: full attention and SBM reach ~100% (≥ 99% here), the low-rank and
    kernelized methods do not. Every method is named on its side of 99% with its figure."""
    test = {r["method"]: r["test"] for r in recs}
    top, below = [m for m in method_order(test) if test[m] >= 0.99], [m for m in method_order(test) if test[m] < 0.99]
    words = lambda ms: ", ".join(f"{m} {100 * test[m]:.2f}%" for m in ms) or "none"  # noqa: E731
    reach, short = [m for m in top if m in FIG4_FALL_SHORT], [m for m in ("full", "sbm") if m not in top]
    verdict = (f"the records do not agree: {' and '.join(short)} {'stays' if len(short) == 1 else 'stay'} below 99%."
               if short else f"the records agree for full attention and SBM; they differ for {', '.join(reach)}, "
               f"which {'reach' if len(reach) > 1 else 'reaches'} 99% too." if reach else "the records agree.")
    return (f"At ≥ 99% test accuracy: {words(top)}. Below: {words(below)}. The paper's Fig. 4 has full attention "
            f"and SBM-Transformer reach 100% and the low-rank and kernelized methods ({', '.join(FIG4_FALL_SHORT)}) "
            f"fall short: {verdict}")


def settings(recs: List[dict]) -> Dict[str, List[dict]]:
    """A Table 3 task's records by setting: the method, SBM's λ, full attention's explicit path."""
    def label(r):
        weight = r["config"].get("density_weight")
        return (r["method"] + (f" λ={float(weight):g}" if weight else "")
                + (" (explicit path)" if "path=reference" in r["cell"].get("command", []) else ""))
    return by([dict(r, label=label(r)) for r in recs], "label")


def accuracy_line(recs: List[dict]) -> str:
    """What a Table 3 task's accuracy says: nothing when every trained setting, full attention included, ends at
    the base rate; else full attention's figure and the settings that stay at the base rate."""
    groups = {g: rs for g, rs in settings(recs).items() if rs[0]["steps"] > 0}
    trained = [r for rs in groups.values() for r in rs]
    if trained and at_base_rate(trained):
        return (f"accuracy carries no information here: every setting, full attention included, ends at the majority "
                f"class ({fmt([mean(trained, lambda r: r['test'])], 'accuracy', True)} test accuracy, the majority "
                f"class {fmt([mean(trained, lambda r: r['base_rate'])], 'accuracy', True)} of the test split, mean "
                f"over {len(trained)} runs)")
    full = groups.get(REFERENCE)
    if not full or full[0].get("base_rate") is None:
        return ""
    base = [f"{g} {tests(rs, True)}" for g, rs in groups.items() if at_base_rate(rs)]
    return (f"full attention reaches {tests(full, True)} (majority class "
            f"{fmt([mean(full, lambda r: r['base_rate'])], 'accuracy', True)})"
            + ("; at the base rate: " + ", ".join(base) if base else ""))


def table3(recs: List[dict], step_times: Optional[Dict[str, dict]] = None) -> str:
    """SBM Table 3 from a claim's records, one table per task (the paper's columns): per-example inference FLOPs
    and memory relative to full attention (fused SDPA, and the explicit path), beside the paper's figures, with
    accuracy, density and the training step time against fair full attention (``step_times``: task → the JSON
    of experiments.step_time, which timed the settings side by side in one process), under a line of what the task's
    accuracy says (accuracy_line)."""
    tasks = by(recs, "task")
    order = [t for t in claim_list.PAPER_TABLE3 if t in tasks] + sorted(set(tasks) - set(claim_list.PAPER_TABLE3))
    return "\n\n".join(f"{task} ({tasks[task][0]['config']['seq_len']} tokens): {accuracy_line(tasks[task])}\n\n"
                       + table3_task(tasks[task], claim_list.PAPER_TABLE3.get(task, {}), (step_times or {}).get(task))
                       for task in order)


def step_time_table(step_time: dict) -> str:
    """experiments.step_time's JSON as its table: each variant's median [min-max] ms and its ratio to fair full
    attention's, and the CPU SDPA kernel full attention ran on (attention dropout moves it to the math path)."""
    fair = statistics.median(step_time["step_ms"].get("full (fair)") or [float("nan")])
    rows = [[label, f"{statistics.median(ms):.0f} [{min(ms):.0f}-{max(ms):.0f}]", f"{statistics.median(ms) / fair:.3f}",
             step_time.get("sdpa_kernel", {}).get(label, "–")] for label, ms in step_time["step_ms"].items()]
    return table(rows, ["variant", "step ms", "÷ full (fair)", "CPU SDPA kernel"])


def fair_step_ratios(step_time: Optional[dict]) -> Dict[str, float]:
    """experiments.step_time's medians ÷ fair full attention's, by Table 3's setting labels ("full": as the recipe runs)."""
    if not step_time or "full (fair)" not in step_time["step_ms"]:
        return {}
    fair = statistics.median(step_time["step_ms"]["full (fair)"])
    names = {"full (as run)": "full", "sbm λ=0": "sbm"}  # Table 3 labels SBM without a regulariser "sbm"
    return {names.get(label, label): statistics.median(ms) / fair
            for label, ms in step_time["step_ms"].items() if label != "full (fair)"}


def table3_task(recs: List[dict], paper_column: Dict[str, tuple], step_time: Optional[dict] = None) -> str:
    groups = settings(recs)
    full, explicit = groups.get("full"), groups.get("full (explicit path)")
    if not full:
        return "Full attention's record is missing: no ratio can be given."
    ratio = lambda rs, ref, get: f"{mean(rs, get) / mean(ref, get):.3f}" if ref else "–"  # noqa: E731
    memory = lambda r: r["inference_memory_per_example_bytes"]  # noqa: E731
    trained_runs = [r for r in recs if r["steps"] > 0]
    nothing_learned = bool(trained_runs) and at_base_rate(trained_runs)  # the accuracy line says so above the table

    def explored(rs):  # SBM's second test pass with δ's random edges kept; "–" where a record has none
        passes = [r.get("sbm", {}).get("test_with_exploration") for r in rs]
        return "–" if None in passes else (("no information" if nothing_learned else
                                            fmt([e["metric"] for e in passes], "accuracy"))
                                           + f" ({100 * mean(passes, lambda e: e['density']):.1f}%)")

    order, rows, steps = ["full", "sbm"] + [m for m in registry.METHODS if m not in ("full", "sbm")], [], \
        fair_step_ratios(step_time)
    for label in sorted(groups, key=lambda g: (order.index(g.split()[0]) if g.split()[0] in order else len(order), g)):
        rs = sorted(groups[label], key=lambda r: r["seed"])
        trained, paper = rs[0]["steps"] > 0, paper_column.get(label)
        layers = zip(*(r["density_per_layer"] for r in rs))
        rows.append([label, ", ".join(str(r["seed"]) for r in rs),
                     "untrained" if not trained else "no information" if nothing_learned else
                     fmt([r["test"] for r in rs], "accuracy") + (" (base rate)" if at_base_rate(rs) else ""),
                     f"{100 * mean(rs, lambda r: r['density']):.1f}% ("
                     + " / ".join(f"{100 * statistics.mean(d):.1f}" for d in layers) + ")",
                     explored(rs), ratio(rs, full, lambda r: r["flops_per_example"]["model"]),
                     ratio(rs, full, lambda r: r["flops_per_example"]["attention"]), ratio(rs, explicit, memory),
                     ratio(rs, full, memory), f"{mean(rs, memory) / 2 ** 20:.1f}",
                     f"{steps[label]:.3f}" if label in steps else "–",
                     f"{paper[0]:.2f} / {paper[1]:.2f}" if paper else "–"])
    return table(rows, ["setting", "seeds", "test acc %", "test density (per layer %)",
                        "with δ in eval: acc % (density)", "FLOPs ÷ full", "attention FLOPs ÷ full",
                        "memory ÷ explicit full", "memory ÷ SDPA full", "MiB per example",
                        "train step ÷ fair full", "paper FLOPs / memory"])


# ------------------------------------------------------------------------------------------------ adaptive vs fixed
LEARNED = "sbm-lambda0.01"  # the adaptive setting whose test density the fixed patterns are matched to
DENSE_SBM = "sbm"  # SBM at λ = 0: the density it chooses with no regulariser
FIXED_AT = {"": "-at-sbm-density", "4× ": "-at-4x-sbm-density"}


def setting_name(r: dict) -> str:
    """A claim record's setting: its folder's name without task, preset and seed (e.g. window-at-sbm-density)."""
    return r["folder"].name.rsplit(f"-{r['task']}-", 1)[0]


def per_seed_ratio(rs: List[dict], refs: Dict[int, dict], get) -> Optional[float]:
    """Mean over seeds of get(run) ÷ get(full attention's run of the same seed), each ratio from one pair."""
    pairs = [(get(r), get(refs[r["seed"]])) for r in rs if r["seed"] in refs]
    return statistics.mean(a / b for a, b in pairs) if pairs and all(a and b for a, b in pairs) else None


def adaptive_rows(recs: List[dict], step_time: Optional[dict] = None) -> Dict[str, dict]:
    """Per setting: its records and, against full attention of the same seed, its costs; its training step ÷ fair
    full attention's from ``step_time`` (experiments.step_time's JSON, the settings timed side by side in one
    process), else from the runs' own step times."""
    groups = by([dict(r, setting=setting_name(r)) for r in recs], "setting")
    refs = {r["seed"]: r for r in groups.get(REFERENCE, [])}
    costs = {"attention FLOPs": lambda r: r["flops_per_example"]["attention"], "step time": COSTS["step time"],
             "peak memory": COSTS["peak memory"]}
    fair = fair_step_ratios(step_time)
    rows = {name: {"recs": sorted(rs, key=lambda r: r["seed"]), "density": mean(rs, lambda r: r["density"]),
                   **{k: per_seed_ratio(rs, refs, get) for k, get in costs.items()}}
            for name, rs in sorted(groups.items(), key=lambda kv: mean(kv[1], lambda r: r["density"]))}
    for name, row in rows.items():
        row["timed"] = name in fair
        row["step time"] = fair.get(name, row["step time"])
    return rows


def adaptive_table(recs: List[dict], step_time: Optional[dict] = None) -> str:
    ratio = lambda v: "–" if v is None else f"{v:.3g}"  # noqa: E731
    rows = [[name, ", ".join(str(r["seed"]) for r in row["recs"]),
             tests(row["recs"]) + (" (base rate)" if at_base_rate(row["recs"]) else ""),
             " / ".join(tests([r]) for r in row["recs"]), f"{100 * row['density']:.2f}%", ratio(row["attention FLOPs"]),
             ratio(row["step time"]) + ("" if row["timed"] else " (runs)"), ratio(row["peak memory"]),
             " / ".join(duration(r["cell"].get("wall_s", r["wall_time_s"])) for r in row["recs"])]
            for name, row in adaptive_rows(recs, step_time).items()]
    return table(rows, ["setting", "seeds", "test acc % (mean ± std; \"base rate\": the majority label's, nothing "
                        "learned)", "per seed", "test density",
                        "attention FLOPs ÷ full", "train step ÷ fair full", "peak memory ÷ full", "wall per seed"])


def adaptive_verdict(recs: List[dict], step_time: Optional[dict] = None, planned: int = 0) -> str:
    """Whether adaptivity paid, in words: SBM (λ = 0 and λ = 1e-2) against the fixed patterns at SBM λ = 1e-2's
    learned density and at 4×, then the other methods against full attention, then the answer: none while fewer
    than the ``planned`` runs have records."""
    rows = adaptive_rows(recs, step_time)
    acc = lambda name: mean(rows[name]["recs"], lambda r: r["test"])  # noqa: E731
    learned = lambda name: not at_base_rate(rows[name]["recs"])  # noqa: E731
    pct = lambda name: (f"{name} {tests(rows[name]['recs'], True)}"  # noqa: E731
                        + ("" if learned(name) else " (the base rate)"))
    said = [f"Full attention reaches {tests(rows[REFERENCE]['recs'], True)}" if REFERENCE in rows else
            "Full attention has no record yet"]
    answer = None
    dense_sbm = DENSE_SBM in rows and learned(DENSE_SBM) and rows[DENSE_SBM]["density"] >= 0.5
    if DENSE_SBM in rows:
        row = rows[DENSE_SBM]
        said.append(f"SBM with λ = 0 reaches {tests(row['recs'], True)} at a test density of "
                    f"{100 * row['density']:.2f}%" + (": it learns the task by making its graph nearly dense"
                                                     if dense_sbm else "") + (
            f" ({row['step time']:.3g}× " + ("fair full attention's training step)" if row["timed"] else
                                             "full attention's training step, the runs' own times)")
            if row["step time"] else ""))
    if LEARNED in rows:
        sbm, density = acc(LEARNED), rows[LEARNED]["density"]
        said.append(f"with λ = 1e-2 its test density falls to {100 * density:.2f}% and it reaches "
                    f"{tests(rows[LEARNED]['recs'], True)}" + ("" if learned(LEARNED) else
                                                               ", the base rate: at that density it learns nothing"))
        margins = {}
        for times, suffix in FIXED_AT.items():
            fixed = [f"{m}{suffix}" for m in ("window", "bigbird") if f"{m}{suffix}" in rows]
            if not fixed:
                continue
            margins[times] = margin = 100 * (sbm - max(acc(f) for f in fixed))
            held = " and ".join(f"{100 * rows[f]['density']:.2f}%" for f in fixed)
            said.append(f"at {times}that density the fixed patterns (test density {held}, the nearest each pattern "
                        f"takes) reach " + " and ".join(pct(f) for f in fixed) + (
                ": nothing learns there, adaptive or fixed"
                if not learned(LEARNED) and not any(learned(f) for f in fixed) else
                f": adaptivity paid, {margin:.1f} points above the better of them" if margin > 1 else
                f": adaptivity did not pay, {-margin:.1f} points below the better of them" if margin < -1 else
                ": within a point of SBM, adaptivity bought nothing here"))
        cost = rows[LEARNED]
        said.append(f"SBM λ = 1e-2 spends {cost['attention FLOPs']:.3g}× full attention's attention FLOPs, "
                    f"{cost['step time']:.3g}× its training step time and {cost['peak memory']:.3g}× its peak memory"
                    if None not in (cost["attention FLOPs"], cost["step time"], cost["peak memory"]) else "")
        if margins:
            at = f"{100 * density:.2f}%"
            answer = (f"So adaptivity paid at {at}: SBM λ = 1e-2 beats the fixed patterns at its own density"
                      if margins.get("", 0) > 1 else
                      f"So on this task and recipe adaptivity did not pay: SBM learned it only with a nearly dense "
                      f"graph, and at the density its regulariser chose ({at}) nothing learned, adaptive or fixed"
                      if dense_sbm and not learned(LEARNED) else
                      f"So adaptivity did not pay at {at}: the fixed patterns did as well or better")
    labelled = {n + (f" at {100 * row['density']:.1f}% density" if row["density"] < 0.995 else ""): row
                for n, row in rows.items()
                if n not in (REFERENCE, LEARNED, DENSE_SBM) and not any(n.endswith(f) for f in FIXED_AT.values())}
    if labelled and REFERENCE in rows:
        ref = rows[REFERENCE]["recs"]
        said.append("the other methods (at full density where none is given): " + "; ".join(
            f"{group}: {', '.join(ms)}"
            for group, ms in standings(ref, {label: row["recs"] for label, row in labelled.items()}).items()))
        sparse = standings(ref, {label: row["recs"] for label, row in labelled.items() if row["density"] < 0.995})
        if answer and sparse.get("reach it"):  # a sparse method that reaches full attention: Reformer's hashed buckets
            answer += (f"; of the other methods, {' and '.join(sparse['reach it'])} "
                       f"reach{'es' if len(sparse['reach it']) == 1 else ''} full attention's accuracy")
    if len(recs) < planned:
        left = planned - len(recs)
        answer = f"{left} of its {planned} runs {'is' if left == 1 else 'are'} not yet run, so it answers nothing yet"
    return ". ".join(s[0].upper() + s[1:] for s in filter(None, ["; ".join(filter(None, said)), answer])) + "."


def claim_section(claim, results: Path, captions: Dict[str, str]) -> str:
    """One claim as Markdown for results/README.md (links relative to results/)."""
    folder, link = results / claim.name, f"[{claim.name}/]({claim.name}/)"
    out = [f"## {claim.title}", f"Paper: {claim.paper}"]
    if claim.kind == "runs":
        recs = load(folder)[0]
        missing = [c["name"] for c in claim.cells() if not (folder / "runs" / c["name"] / "metrics.json").exists()]
        out.append(f"Reproduce: `python -m experiments.claims run {claim.name}` (records in {link}; `python -m experiments.claims "
                   f"list` prints each run's command, to run one with `--seed S --out DIR`).")
        out += [fig4_check(recs)] if recs and claim.name == "sbm-fig4" else []
        step_times = step_times_of(folder)
        if recs and claim.name == "adaptive-vs-fixed":
            timed = step_times.get(recs[0]["task"])
            out += [adaptive_verdict(recs, timed, len(claim.cells())), adaptive_table(recs, timed)]
        out += [table3(recs, step_times) if claim.name == "sbm-table3" else runs_table(recs)] if recs else []
        out += [path.read_text().strip() for path in sorted(folder.glob("*.md"))]
        out += ["Not yet run: " + ", ".join(f"`{name}`" for name in missing) + "."] if missing else []
    else:
        out.append("Reproduce: " + "; ".join(f"`{c}`" for c in claim.commands) + f" (saved in {link}).")
        out += [path.read_text().strip() for path in sorted(folder.glob("*.md"))]
        out += [scaling.render(json.loads(path.read_text())) for path in sorted(folder.glob("scaling*.json"))]
    out += [f"- {note}" for note in claim.notes]
    return "\n\n".join(out + figures(FIGURES.get(claim.name, ()), captions, "plots/"))


def results_readme(results: Path, captions: Dict[str, str]) -> str:
    return "\n\n".join([
        "# Results", "Generated by `python -m experiments.report --readme README.md` from the records in this folder; never "
        "edited by hand. One section per claim of the papers (experiments/claims.py), each with the command that reproduces "
        "it; the quick preview of `./run_all.sh` last. The repository's README summarises them.",
        *(claim_section(claim, results, captions) for claim in claim_list.CLAIMS),
        "## Quick preview: every method on every task (`./run_all.sh`)",
        run_section(results / "quick", preview=True) if (results / "quick").exists() else
        "Not published yet: `./run_all.sh --out results/quick`.", *figures(FIGURES["quick"], captions, "plots/")])


# ------------------------------------------------------------------------------------------------ plots
FIGURES = {"sbm-fig4": ["sbm_fig4"], "adaptive-vs-fixed": ["adaptive_vs_fixed"], "ssa-table": ["ssa_fig7"], "scaling": ["scaling", "sbm_scaling"],
           "quick": ["accuracy_vs_cost"]}
SCALING_PLOTS = {  # results/scaling/NAME.json → what its plot shows
    "scaling": "every method at its default budget (sbm untrained, at its initial ~25% density, and sbm@0.01 at a "
               "trained model's 1%; full is the fused SDPA, full-ref the explicit path)",
    "sbm_scaling": "SBM-Transformer's attention core (core@d) and whole module (sbm@d; sbm-dense@d, its dense "
                   "reference path) at fixed densities d, beside full attention (fused SDPA) and its explicit path "
                   "(full-ref)"}


def figures(names, captions: Dict[str, str], prefix: str) -> List[str]:
    return [f"![{captions[name]}]({prefix}{name}.png)\n\n*{captions[name]}*" for name in names if name in captions]


def ssa_curve(folder: Path) -> Optional[tuple]:
    """Fig. 7's curve from experiments.ssa_table's saved output: the dense figure on the "Self-ensembling" line and
    the rows of the sub-models table that follows it."""
    for path in sorted(folder.glob("*.md")):
        lines = path.read_text().splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("Self-ensembling")), None)
        if start is not None:
            rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start + 1:]
                    if line.startswith("|") and line.strip("|").split("|")[0].strip().isdigit()]
            return [int(r[0]) for r in rows], [float(r[1]) for r in rows], float(lines[start].rsplit(" ", 1)[1])
    return None


def draw_plots(results: Path, plot_dir: Path) -> Dict[str, str]:
    """Every published plot into plot_dir, once; {name: caption} of those drawn."""
    if not plots.available():
        return {}
    plot_dir.mkdir(exist_ok=True)
    captions, fig4, quick = {}, load(results / "sbm-fig4")[0], load(results / "quick")[0]
    if fig4:
        curves = {r["method"]: log_lines(r["folder"]) for r in fig4}
        captions["sbm_fig4"] = plots.sbm_training(curves, plot_dir / "sbm_fig4.png")
    if ssa_curve(results / "ssa-table"):
        captions["ssa_fig7"] = plots.ssa_ensemble(*ssa_curve(results / "ssa-table"), plot_dir / "ssa_fig7.png")
    for (name, what), command in zip(SCALING_PLOTS.items(), claim_list.BY_NAME["scaling"].commands):
        if (results / "scaling" / f"{name}.json").exists():
            result = read_json(results / "scaling" / f"{name}.json")
            captions[name] = plots.scaling(result, plot_dir / f"{name}.png", f"{what}; `{command}`")
    adaptive = load(results / "adaptive-vs-fixed")[0]
    if adaptive:
        timed = read_json(results / "adaptive-vs-fixed" / f"step_time-{adaptive[0]['task']}" / "step_time.json")
        points = {name: [(r["density"], row["step time"], 100 * r["test"]) for r in row["recs"]]
                  for name, row in adaptive_rows(adaptive, timed).items() if row["step time"] is not None}
        captions["adaptive_vs_fixed"] = plots.adaptive_vs_fixed(points, plot_dir / "adaptive_vs_fixed.png",
                                                                adaptive[0]["config"]["seq_len"])
    if quick:
        captions["accuracy_vs_cost"] = plots.accuracy_vs_cost(quick, plot_dir / "accuracy_vs_cost.png", COSTS)
    return captions


# ------------------------------------------------------------------------------------------------ the glance
def standings(ref: List[dict], groups: Dict[str, List[dict]]) -> Dict[str, List[str]]:
    """Each setting against full attention's test metric (ref), best first: "reach it" (within two standard errors,
    at least 1 point, or BPB_NOISE bits), "fall short", or "at the base rate"."""
    metric, full = ref[0]["metric"], mean(ref, lambda r: r["test"])
    sign, margin = (1, max(0.01, noise(ref[0], full))) if metric == "accuracy" else (-1, BPB_NOISE)
    value = {m: mean(rs, lambda r: r["test"]) for m, rs in groups.items()}
    out = {"reach it": [], "fall short": [], "at the base rate": []}
    for m in sorted(value, key=lambda m: -sign * value[m]):
        out["at the base rate" if at_base_rate(groups[m]) else
            "reach it" if sign * (value[m] - full) >= -margin else "fall short"].append(f"{m} {tests(groups[m], True)}")
    return {group: ms for group, ms in out.items() if ms}


def task_sentence(task: str, cells: dict) -> Optional[str]:
    """Which methods reach full attention's test metric on a quick task, which fall short, which stay at the base
    rate (standings)."""
    ref = cells.get((REFERENCE, task))
    if not ref:
        return None
    metric = ref[0]["metric"]
    groups = standings(ref, {m: rs for (m, t), rs in cells.items() if t == task and m != REFERENCE})
    return (f"{task}: full attention {tests(ref, True)}, base rate "
            f"{fmt([mean(ref, lambda r: r['base_rate'])], metric, True)}; "
            + "; ".join(f"{group}: {', '.join(ms)}" for group, ms in groups.items()) + ".")


def cost_sentence(costs: dict, result: dict) -> str:
    """Which methods cost less than full attention: per training step at the quick lengths, and in the scaling
    table's forward+backward time and peak memory within its longest length."""
    faster = [m for m in method_order(costs) if m != REFERENCE and costs[m].get("step time", 2) <= 1]
    said = ["per training step at the quick lengths (against fair full attention, timed side by side): "
            + (", ".join(f"{m} {costs[m]['step time']:.2f}×" for m in faster) or "none")]
    cross = {m: c for m, c in crossovers(result).items() if m in registry.METHODS}
    longest = max((r["n"] for r in result["rows"]), default=None)
    for key, what in (("fwdbwd_ms", "forward+backward time"), ("peak_bytes", "peak memory")) if cross else ():
        below = [m for m in method_order(cross) if cross[m][key][0] is not None]
        above = [f"{m} {cross[m][key][2]:.2f}×" for m in method_order(cross) if cross[m][key][0] is None]
        where = f" (the scaling table, {result['device']}, full attention as fused SDPA)" if key == "fwdbwd_ms" else ""
        said.append(f"in {what} by n = {longest}{where}: {', '.join(below) or 'none'}"
                    + (f" (not {', '.join(above)} at n = {longest})" if above else ""))
    return "Cheaper than full attention " + "; ".join(said) + "."


def claim_sentences(results: Path) -> List[str]:
    """Where the claims' records agree with the papers and where they differ."""
    out, fig4, listops = [], load(results / "sbm-fig4")[0], load(results / "sbm-listops")[0]
    adaptive = load(results / "adaptive-vs-fixed")[0]
    if fig4:
        out.append(f"SBM Fig. 4 (duplicates, the paper's recipe): {fig4_check(fig4)}")
    if adaptive:
        timed = step_times_of(results / "adaptive-vs-fixed").get(adaptive[0]["task"])
        out.append(f"Adaptive vs fixed sparsity (duplicates at {adaptive[0]['config']['seq_len']} tokens, "
                   f"{len({r['seed'] for r in adaptive})} seeds): "
                   + adaptive_verdict(adaptive, timed, len(claim_list.BY_NAME["adaptive-vs-fixed"].cells())))
    groups = by([dict(r, weight=float(r["config"].get("density_weight") or 0)) for r in listops], "method", "weight")
    sbm = {w: rs for (m, w), rs in sorted(groups.items()) if m == "sbm" and w in PAPER_LISTOPS_DENSITY}
    if sbm and (REFERENCE, 0.0) in groups:
        density = {w: mean(rs, lambda r: r["density"]) for w, rs in sbm.items()}
        out.append(f"SBM Tables 1-2 (ListOps, CPU preset, {len(groups[(REFERENCE, 0.0)])} seeds): " + "; ".join(
            f"λ = {w:g}: test density {100 * density[w]:.1f}% ("
            f"{'denser' if density[w] > PAPER_LISTOPS_DENSITY[w] else 'sparser'} than the paper's "
            f"{100 * PAPER_LISTOPS_DENSITY[w]:.2f}% at 2K), test accuracy {tests(rs, True)}" for w, rs in sbm.items())
            + f"; full attention {tests(groups[(REFERENCE, 0.0)], True)}.")
    for task, rs in by(load(results / "sbm-table3")[0], "task").items():
        groups, paper, said = settings(rs), claim_list.PAPER_TABLE3.get(task, {}), [accuracy_line(rs)]
        memory = lambda r: r["inference_memory_per_example_bytes"]  # noqa: E731
        for label in [g for g in groups if g.startswith("sbm") and g in paper and REFERENCE in groups]:
            ratio = lambda ref, get: mean(groups[label], get) / mean(groups[ref], get)  # noqa: E731
            flops = ratio(REFERENCE, lambda r: r["flops_per_example"]["model"])
            said.append(f"{label}'s inference FLOPs are {flops:.2f} × full attention's (paper {paper[label][0]:.2f})"
                        f" and its memory {ratio(REFERENCE, memory):.2f} × fused SDPA's" + (
                            f", {ratio('full (explicit path)', memory):.2f} × the explicit path's (paper "
                            f"{paper[label][1]:.2f})" if "full (explicit path)" in groups else ""))
        said = "; ".join(filter(None, said))
        out.append(f"SBM Table 3, {task} at {rs[0]['config']['seq_len']} tokens: {said}.")
    return out


def glance(results: Path, captions: Dict[str, str]) -> str:
    """The README's results section: one table of every method, what the records say, the main plots."""
    recs, plan = load(results / "quick")[0], read_json(results / "quick" / "grid.json") or {}
    scaling_result = read_json(results / "scaling" / "scaling.json") or {"rows": [], "args": {}}
    lengths, args = sorted({r["config"]["seq_len"] for r in recs}) or ["?"], scaling_result["args"]
    said = [line for line in (task_sentence(t, by(recs, "method", "task")) for t in grid.GRID_TASKS) if line]
    step_times = step_times_of(results / "quick")
    said += [cost_sentence(relative_costs(recs, step_times), scaling_result)] + claim_sentences(results)
    return "\n\n".join([
        f"One row per method: the quick grid (`./run_all.sh`, [results/quick](results/quick): "
        f"{', '.join(sorted({r['device'] for r in recs}))}, seeds {sorted({r['seed'] for r in recs})}, "
        f"{lengths[0]}-{lengths[-1]} tokens) and the scaling table ([results/scaling](results/scaling): `python -m "
        f"experiments.scaling --methods {args.get('methods', '?')} --lengths {args.get('lengths', '?')}`). " + METHOD_TABLE,
        method_table(recs, plan, [], scaling_result, step_times, every=True),
        "What the records say (\"reach it\": within two standard errors of full attention's test accuracy, at least "
        f"1 point, or {BPB_NOISE} bits per byte):\n\n" + "\n".join(f"- {line}" for line in said),
        *figures(("accuracy_vs_cost", "scaling", "sbm_fig4"), captions, "results/plots/"),
        "Every claim table, with its command: [results/README.md](results/README.md)."])


def main(argv=None) -> int:
    p = cli.parser("python -m experiments.report", __doc__.splitlines()[0])
    p.add_argument("--results", default="results", help="the published records (one folder per claim)")
    p.add_argument("--readme", default=None,
                   help="rewrite this file's results section, RESULTS/README.md and the plots in RESULTS/plots")
    p.add_argument("--run", default=None, help="a run folder: write its REPORT.md and plots there instead")
    args = p.parse_args(argv)
    for option, path in (("--run", args.run), ("--results", args.results)):  # '' is refused, not taken for '.'
        if path is not None and not (path and Path(path).is_dir()):
            p.error(f"{option}: no folder {path or repr(path)}")
    if args.run is not None:
        print(write_run_report(Path(args.run)))
        return 0
    results = Path(args.results)
    if args.readme is not None and not (Path(args.readme).is_file() and os.access(args.readme, os.R_OK | os.W_OK)):
        p.error(f"--readme: {args.readme or repr(args.readme)} is not a file this process can read and write")
    if args.readme is None:
        print(results_readme(results, {}))
        return 0
    readme = Path(args.readme)
    content = readme.read_text()
    if START not in content or END not in content:
        p.error(f"{readme} has no {START} ... {END} markers")
    captions = draw_plots(results, results / "plots")
    (results / "README.md").write_text(results_readme(results, captions) + "\n")
    head, rest = content.split(START, 1)
    readme.write_text(f"{head}{START}\n{glance(results, captions)}\n{END}{rest.split(END, 1)[1]}")
    print(f"wrote {readme}'s results section, {results / 'README.md'} and {len(captions)} plots in {results / 'plots'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
