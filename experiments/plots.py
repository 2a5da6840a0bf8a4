"""Plots of the report from its tables' records (matplotlib, optional): a PNG and its caption each."""

import importlib.util
import json
import math
import re
import statistics
from pathlib import Path
from typing import Dict, List, Optional

from bench.files import kept_log, read_json
from experiments.claims import matched_cost as mc
from experiments.grid import load


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def figure(columns: int, rows: int = 1, width: float = 5.5, height: float = 4.0):
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False)


def log_x(ax) -> None:
    """A log x axis labelled as plain numbers at 1-2-5 steps where the data span at most ~1.5
    decades, at powers of ten where they span more, never at minor ticks: no labels overlap."""
    import matplotlib.ticker as ticker

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))

    def label(value, _):
        low, high = ax.get_xlim()
        power = abs(value / 10 ** round(math.log10(value)) - 1) < 1e-9
        return f"{value:g}" if power or high / low <= 30 else ""

    ax.xaxis.set_major_formatter(ticker.FuncFormatter(label))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def save(fig, path: Path, axes, xlabel, ylabels: List[str], rect=(0, 0, 1, 1)) -> None:
    """Labels (one ``xlabel`` or one per panel; None: none), grid, layout within ``rect``, PNG."""
    axes = list(axes)
    for ax, x, ylabel in zip(axes, [xlabel] * len(axes) if isinstance(xlabel, str) else xlabel, ylabels):
        for label, set_label in ((x, ax.set_xlabel), (ylabel, ax.set_ylabel)):
            if label is not None:
                set_label(label, fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)


def scaling(result: dict, path: Path, what: str) -> str:
    """Forward+backward time and peak memory against sequence length, log-log, one line per method."""
    fig, axes = figure(2)
    rows = [r for r in result["rows"] if "error" not in r]
    for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["n"])
        style = dict(color=f"C{i % 10}", marker="os"[i // 10 % 2], linestyle="-" if i < 10 else "--", label=method)
        axes[0, 0].plot([r["n"] for r in mine], [r["fwdbwd_ms"] for r in mine], **style)  # past 10: a second style
        axes[0, 1].plot([r["n"] for r in mine], [r["peak_bytes"] / 2**20 for r in mine], **style)
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    axes[0, 0].legend(fontsize=7)
    save(fig, path, axes[0], "sequence length n", ["forward+backward time (ms)", "peak memory of one fwd+bwd (MiB)"])
    return (
        f"Forward+backward time (left) and peak memory (right) against sequence length, log-log: {what}; "
        f"batch {result['args']['batch_size']}, {result['args']['heads']} heads × {result['args']['head_dim']}, "
        + re.sub(r"\b1 threads\b", "1 thread", result["device"])
        + "."
    )


QUICK_COSTS = ("attention FLOPs", "step time", "peak memory")  # the quick plot's columns: what a training step costs


def accuracy_vs_cost(
    records: List[dict], path: Path, costs: Dict[str, object], budget: str, reference: str = "full"
) -> str:
    """Per task, the test metric against a step's ``costs`` × full attention's, per method."""
    tasks = sorted({r["task"] for r in records if r["method"] == reference})  # a ratio needs the reference
    methods = list(dict.fromkeys(r["method"] for r in records))
    style = {m: dict(color=f"C{i % 10}", marker="osD^v<>ph*"[i // 10 % 10]) for i, m in enumerate(methods)}
    fig, axes = figure(len(QUICK_COSTS), len(tasks), 3.6, 2.9)
    ylabels = []  # on each row's first panel
    for row, task in zip(axes, tasks):
        mine = [r for r in records if r["task"] == task]
        scale = 100 if mine[0]["metric"] == "accuracy" else 1
        ref = next(r for r in mine if r["method"] == reference)
        for ax, name in zip(row, QUICK_COSTS):
            get = costs[name]
            for r in mine:
                if get(r) and get(ref):
                    ax.scatter([get(r) / get(ref)], [scale * r["test"]], s=22, label=r["method"], **style[r["method"]])
            if mine[0].get("base_rate") is not None:
                ax.axhline(scale * mine[0]["base_rate"], color="grey", linestyle=":")
            log_x(ax)
            ax.set_title(f"{task}: {name}", fontsize=9)
        ylabels += ["test accuracy (%)" if scale == 100 else "test bits per byte (lower is better)"]
        ylabels += [None] * (len(QUICK_COSTS) - 1)
    handles = {h.get_label(): h for ax in axes.flat for h in ax.collections}
    fig.legend(
        [handles[m] for m in methods if m in handles],
        [m for m in methods if m in handles],
        loc="lower center",
        ncol=min(len(methods), 6),
        fontsize=8,
        frameon=False,
    )
    xlabels = [None] * (axes.size - len(QUICK_COSTS)) + [f"× {reference} attention (log)"] * len(QUICK_COSTS)
    save(fig, path, axes.flat, xlabels, ylabels, rect=(0, 0.06 if len(tasks) > 2 else 0.1, 1, 1))
    return (
        f"{budget.capitalize()} grid: test metric against a training step's attention FLOPs, time and peak "
        f"memory × {reference} attention (log), one row per task; dotted: the task's base rate."
    )


def sbm_training(curves: Dict[str, List[dict]], path: Path) -> str:
    """SBM Fig. 4: each method's validation accuracy over training and SBM's density (log lines)."""
    fig, axes = figure(2)
    left, right = axes[0]
    for index, (method, lines) in enumerate(curves.items()):
        valid = [line for line in lines if line.get("split") == "valid"]  # every run logs these at the same steps
        steps, color = [line["step"] for line in valid], f"C{index % 10}"
        left.plot(steps, [100 * line["metric"] for line in valid], "o-", markersize=3, color=color, label=method)
        if method == "sbm":
            right.plot(steps, [line["density"] for line in valid], "o-", markersize=3, color=color, label="sbm")
    left.legend(fontsize=7, loc="lower right")  # the curves rise through the upper left
    right.set_ylim(0, 1.05)
    save(fig, path, axes[0], "training step", ["validation token accuracy (%)", "SBM mask density (validation)"])
    return (
        "SBM Fig. 4, duplicates, the paper's recipe: validation token accuracy over training (left), SBM's "
        "mask density (right)."
    )


def ssa_ensemble(samples: List[int], bpb: List[float], dense: float, path: Path) -> str:
    """SSA Fig. 7's shape: validation bpb of the self-ensemble against the number of sub-models."""
    fig, axes = figure(1)
    ax = axes[0, 0]
    ax.plot(samples, bpb, "o-", label="self-ensemble of sampled sub-models")
    ax.axhline(dense, color="grey", linestyle="--", label="dense (renormalised) inference")
    ax.set_xscale("log", base=2)
    ax.set_xticks(samples, [str(s) for s in samples])
    ax.legend(fontsize=8)
    save(fig, path, [ax], "sub-models averaged", ["validation bits per byte"])
    return (
        "SSA Fig. 7: validation bits per byte of S-L4's self-ensemble against the sub-models averaged, beside "
        "dense inference."
    )


def matched_costs(records: List[dict], path: Path, gpu: Dict[str, List[dict]]) -> str:
    """The matched-cost claim: per task, test accuracy against computed pairs ÷ admissible (log), each setting's median
    over its seeds with a bar over their range; then per device of ``gpu`` (folder → its GPU job's recall records),
    accuracy against the median training step, a point per setting."""
    from baselines.window import window_density  # torch, which a report without this plot does not import

    groups, names, verdicts = mc.by_setting(records), [*mc.FIXED, *mc.ADAPTIVE], mc.verdicts(records)
    panels, n = [*mc.TASKS, *gpu], mc.MODEL["seq_len"]
    fig, axes = figure(3, math.ceil(len(panels) / 3), 4.0, 3.3)
    for ax, task in zip(axes.flat, mc.TASKS):
        for (t, family, _), runs in groups.items():
            if t == task and family != "dense":
                x = statistics.median(mc.cost(r, "pairs", None) for r in runs.values())
                tests, colour = [r["test"] for r in runs.values()], f"C{names.index(family)}"
                y, filled = statistics.median(tests), family in mc.ADAPTIVE
                style = dict(
                    fmt="o" if filled else "s", ms=4, capsize=2, color=colour, mfc=colour if filled else "none"
                )
                ax.errorbar([x], [y], [[y - min(tests)], [max(tests) - y]], label=family, **style)
        if (task, "dense", "full") in groups:
            full = statistics.median(r["test"] for r in groups[task, "dense", "full"].values())
            ax.axhline(full, color="k", lw=1, label="full attention")
        densities = [window_density(n, w, False) for w in range(n)]
        for layers, style, label in ((1, "--", "one window layer's Bayes limit"), (2, ":", "two layers' Bayes limit")):
            limit = [(d, mc.window_limit(task, n, d, layers)) for d in densities]
            if limit[0][1] is not None:  # where the task has one
                ax.plot(*zip(*limit), style, lw=0.9, color=f"C{names.index('window')}", label=label)
        for budget in mc.BUDGETS:
            ax.axvline(budget, color="grey", ls=":", lw=0.8)
        said = [
            f"{100 * r['budget']:g}%: {r['mean']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] "
            + ("provisional" if r["waiting"] else r["verdict"])
            for r in verdicts
            if r["task"] == task and "mean" in r
        ]
        ax.set_title("\n".join(said), fontsize=6, loc="right")  # above the panel: no point hidden
        ax.set_title(task, fontsize=9, loc="left")
        log_x(ax)
    for ax, (device, rs) in zip(axes.flat[len(mc.TASKS) :], gpu.items()):
        for k, r in enumerate(rs, 1):  # numbered points, named in a list where the panel is empty: no label overlaps
            ax.scatter([r["median_step_ms"]], [r["test"]], s=14, color="k")
            ax.annotate(str(k), (r["median_step_ms"], r["test"]), xytext=(2, 2), textcoords="offset points", fontsize=6)
        listed = "\n".join(f"{k} {r['folder'].name}" for k, r in enumerate(rs, 1))
        ax.text(0.98, 0.55, listed, transform=ax.transAxes, fontsize=6, ha="right", va="center")
        ax.set_title(f"{device}: recall at {rs[0]['config']['seq_len']:,} tokens, seed 0", fontsize=9)
        log_x(ax)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    shown = {label: h for ax in axes.flat for h, label in zip(*ax.get_legend_handles_labels())}
    order = sorted(shown, key=lambda label: names.index(label) if label in names else len(names))
    fig.legend([shown[label] for label in order], order, loc="lower center", ncol=6, fontsize=7, frameon=False)
    xlabels = ["computed pairs ÷ admissible (log)"] * len(mc.TASKS) + ["median training step, ms (log)"] * len(gpu)
    save(fig, path, axes.flat[: len(panels)], xlabels, ["test accuracy"] * len(panels), rect=(0, 0.08, 1, 1))
    said = [
        f"{r['task']} {100 * r['budget']:g}%: {r['mean']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] "
        + (f"provisional (runs to come: {r['waiting']})" if r["waiting"] else r["verdict"])
        for r in verdicts
        if "mean" in r
    ]
    return (
        f"Matched cost: test accuracy against the pairs each attention computes ÷ the admissible pairs (log), a panel "
        f"per task at {n} tokens; each setting's median over its seeds, its bar their range; filled: adaptive "
        "families, open: fixed; solid: full attention's median; dashed: the exact Bayes limit of what one window layer reads, dotted blue: of what two "
        "layers reach (the models' depth; a bound for a window model); dotted grey: the budgets; above a panel, per budget: the best adaptive family's test accuracy minus the best fixed one's, mean "
        "[95% bootstrap interval] over the paired seeds, with its verdict: "
        + ("; ".join(said) or "no budget has both kinds yet")
        + "".join(f"; {device}: the GPU job's recall runs, accuracy against the median training step" for device in gpu)
        + "."
    )


SCALING_PLOTS = {  # results/scaling/NAME.json → what its plot shows
    "scaling": "every method at its default budget (sbm untrained at ~25% density, sbm@0.01 at 1%; full: fused "
    "SDPA, full-ref: the explicit path)",
    "sbm_scaling": "SBM's attention core (core@d) and module (sbm@d; sbm-dense@d, its dense path) at densities d, "
    "beside full attention (fused SDPA, full-ref)",
}


def ssa_curve(folder: Path) -> Optional[tuple]:
    """Fig. 7's curve from experiments.ssa_table's saved output: the dense figure on the "Self-ensembling" line and
    the rows of the sub-models table that follows it."""
    for path in sorted(folder.glob("*.md")):
        lines = path.read_text().splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("Self-ensembling")), None)
        if start is not None:
            rows = [
                [cell.strip() for cell in line.strip("|").split("|")]
                for line in lines[start + 1 :]
                if line.startswith("|") and line.strip("|").split("|")[0].strip().isdigit()
            ]
            return [int(r[0]) for r in rows], [float(r[1]) for r in rows], float(lines[start].rsplit(" ", 1)[1])
    return None


def draw_published(results: Path, plot_dir: Path, costs: Dict[str, object]) -> Dict[str, str]:
    """Every published plot into plot_dir, once; {name: caption} of those drawn."""
    if not available():
        return {}
    plot_dir.mkdir(exist_ok=True)
    captions, fig4, quick = {}, load(results / "sbm-fig4")[0], load(results / "quick")[0]
    if fig4:  # each run's log.jsonl, without a line torn by a kill
        logs = {r["method"]: kept_log(r["folder"] / "log.jsonl", math.inf) for r in fig4}
        curves = {m: [json.loads(line) for line in log.splitlines()] for m, log in logs.items()}
        captions["sbm_fig4"] = sbm_training(curves, plot_dir / "sbm_fig4.png")
    if ssa_curve(results / "ssa-table"):
        captions["ssa_fig7"] = ssa_ensemble(*ssa_curve(results / "ssa-table"), plot_dir / "ssa_fig7.png")
    for name, what in SCALING_PLOTS.items():
        if (results / "scaling" / f"{name}.json").exists():
            captions[name] = scaling(
                read_json(results / "scaling" / f"{name}.json"),
                plot_dir / f"{name}.png",
                f"results/scaling/{name}.json, {what}",
            )
    cost_records = load(results / "matched-cost")[0]
    if mc.by_setting(cost_records):  # stage 2: the GPU job's recall runs beside
        gpu = {}
        for metrics in sorted(results.glob("gpu/*/frontier/*/metrics.json")):
            record = read_json(metrics) or {}
            if record.get("status") == "complete":
                gpu.setdefault(metrics.parts[-4], []).append(dict(record, folder=metrics.parent))
        captions["matched-cost"] = matched_costs(cost_records, plot_dir / "matched-cost.png", gpu)
    if quick:
        captions["accuracy_vs_cost"] = accuracy_vs_cost(quick, plot_dir / "accuracy_vs_cost.png", costs, "quick")
    return captions
