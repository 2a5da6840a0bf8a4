"""Plots of the report from its tables' records (matplotlib, optional): a PNG and its caption each."""

import importlib.util
import json
import math
import re
import statistics
from pathlib import Path
from typing import Dict, List, Optional

from bench.files import kept_log, read_json
from experiments.claims.frontier import VARIANTS, by_setting, families
from experiments.grid import load
from experiments.tables import fair_ratios


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


def frontiers(records: List[dict], path: Path) -> str:
    """Test metric against measured test density (top) and against training step time ÷ fair full attention
    (bottom; experiments.step_time of the seed-0 runs), a column per task variant: a point per seed, each family's
    medians joined in order of density, full attention's median (dotted) and the base rate (dashed)."""
    groups, folder = by_setting(records), records[0]["folder"].parent.parent
    variants = [v for v in VARIANTS if (v, "dense", "full") in groups]  # each read against full attention
    fig, axes = figure(len(variants), 2)
    names = list(families(0, "bytes"))  # every family, the kernel method's (bytes alone) last
    for column, variant in enumerate(variants):
        times = fair_ratios(read_json(folder / f"step_time-{variant}" / "step_time.json") or {}, VARIANTS[variant][1])
        full, base = (statistics.median(r[k] for r in groups[variant, "dense", "full"]) for k in ("test", "base_rate"))
        for ax, x in zip(axes[:, column], (lambda r, label: r["density"], lambda r, label: times.get(label, math.nan))):
            for family in names:
                points = sorted(
                    (
                        (
                            statistics.median(r["density"] for r in rs),
                            statistics.median(x(r, s) for r in rs),
                            statistics.median(r["test"] for r in rs),
                            s,
                            rs,
                        )
                        for (v, f, s), rs in groups.items()
                        if v == variant and f == family and not math.isnan(x(rs[0], s))
                    ),
                    key=lambda point: point[:3],
                )  # two settings may tie: never compare their records
                colour = f"C{names.index(family)}"
                for *_, label, rs in points:
                    ax.scatter([x(r, label) for r in rs], [r["test"] for r in rs], s=8, color=colour, alpha=0.4)
                if points:
                    ax.plot([p[1] for p in points], [p[2] for p in points], "o-", color=colour, label=family, ms=4)
            ax.axhline(full, color="k", ls=":", lw=1)
            ax.axhline(base, color="grey", ls="--", lw=1)
            ax.set_title(variant + ("" if ax is axes[0, column] or times else ": not timed yet"), fontsize=9)
            log_x(ax)
        if variant.startswith("duplicates"):  # a token with a duplicate is right where it is found
            d, heads = [10 ** (e / 40) for e in range(-120, 1)], VARIANTS[variant][2]["heads"]
            for recall, family in ((lambda x: min(1, heads * x**0.5), "sbm"), (lambda x: x, "window")):
                axes[0, column].plot(
                    d, [base + (1 - base) * recall(x) for x in d], "-.", lw=0.8, color=f"C{names.index(family)}"
                )
        axes[0, column].set_xlim(right=1.2)  # a density is at most 1
    shown = {label: handle for ax in axes.flat for handle, label in zip(*ax.get_legend_handles_labels())}
    axes[0, -1].legend(shown.values(), shown.keys(), fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    save(
        fig,
        path,
        axes.flat,
        ["attention density on the test split (log)"] * len(variants)
        + ["training step time ÷ fair full attention's (log)"] * len(variants),
        ["test metric (accuracy; bytes: bits per byte)"] * 2 * len(variants),
    )
    return (
        "Frontiers: test metric against measured attention density (top) and against training step time ÷ fair "
        "full attention's (bottom: one side-by-side run of each setting's seed-0 model; the kernel method's "
        "pipeline has no one training step to time), a point per seed, each family's medians joined in order of "
        "density; dotted: full attention's median, dashed: the base rate; dash-dot (duplicates): base + (1 − "
        "base) × recall, the most a pattern of density d reaches if it finds a token's duplicate with probability "
        "recall = d (a window) or at most min(1, 2√d) (SBM with 2 heads: Eq. 5 makes each head's density ≥ its "
        "recall²)."
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
    frontier_records = load(results / "frontier")[0]
    if frontier_records:
        captions["frontier"] = frontiers(frontier_records, plot_dir / "frontier.png")
    if quick:
        captions["accuracy_vs_cost"] = accuracy_vs_cost(quick, plot_dir / "accuracy_vs_cost.png", costs, "quick")
    return captions
