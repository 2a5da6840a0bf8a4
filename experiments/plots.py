"""Plots of the report, drawn from the same records as its tables (matplotlib, an optional extra).

Each function writes one PNG and returns its caption; ``available()`` says whether matplotlib is installed
(without it the report writes its tables only and says so in one line).
"""
import importlib.util
import math
from pathlib import Path
from typing import Dict, List


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def figure(columns: int, rows: int = 1, width: float = 5.5, height: float = 4.0):
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False)


def matplotlib_ticker():
    import matplotlib.ticker
    return matplotlib.ticker


def log_x(ax) -> None:
    """A log x axis labelled as plain numbers at 1-2-5 steps (0.5, 1, 2, 5, 10) where the data span at most
    ~1.5 decades, and at powers of ten only where they span more (1-2-5 labels would overlap there); never minor
    labels, which overlap where the data span less than a decade."""
    ticker = matplotlib_ticker()
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))

    def label(value, _):
        low, high = ax.get_xlim()
        power = abs(value / 10 ** round(math.log10(value)) - 1) < 1e-9
        return f"{value:g}" if power or high / low <= 30 else ""

    ax.xaxis.set_major_formatter(ticker.FuncFormatter(label))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def save(fig, path: Path, axes, xlabel, ylabels: List[str]) -> None:
    """Labels (``xlabel``: one for every panel, or a list of one per panel), grid, layout, PNG; closes the figure."""
    axes = list(axes)
    for ax, x, ylabel in zip(axes, [xlabel] * len(axes) if isinstance(xlabel, str) else xlabel, ylabels):
        ax.set_xlabel(x, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
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
        axes[0, 1].plot([r["n"] for r in mine], [r["peak_bytes"] / 2 ** 20 for r in mine], **style)
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
    axes[0, 0].legend(fontsize=7)
    save(fig, path, axes[0], "sequence length n", ["forward+backward time (ms)", "peak memory of one fwd+bwd (MiB)"])
    return (f"Forward+backward time (left) and peak memory of one forward+backward (right) against sequence length, "
            f"log-log: {what}; batch {result['args']['batch_size']}, {result['args']['heads']} heads × "
            f"{result['args']['head_dim']}, one run ({result['device']}).")


QUICK_COSTS = ("attention FLOPs", "step time", "peak memory")  # the quick plot's columns: what a training step costs


def accuracy_vs_cost(records: List[dict], path: Path, costs: Dict[str, object], reference: str = "full") -> str:
    """One row per task: the test metric against what a training step costs relative to full attention on the
    same task (``costs``: name → a record's value; the QUICK_COSTS columns), one colour and marker per method,
    named once in the legend (no labels beside the points: they overlap where methods cost alike)."""
    tasks = sorted({r["task"] for r in records if r["method"] == reference})  # a ratio needs the reference
    methods = list(dict.fromkeys(r["method"] for r in records))
    style = {m: dict(color=f"C{i % 10}", marker="osD^v<>ph*"[i // 10 % 10]) for i, m in enumerate(methods)}
    fig, axes = figure(len(QUICK_COSTS), len(tasks), 3.6, 2.9)
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
        row[0].set_ylabel("test accuracy (%)" if scale == 100 else "test bits per byte (lower is better)", fontsize=8)
    handles = {h.get_label(): h for ax in axes.flat for h in ax.collections}
    fig.legend([handles[m] for m in methods if m in handles], [m for m in methods if m in handles],
               loc="lower center", ncol=min(len(methods), 6), fontsize=8, frameon=False)
    for ax in axes[-1]:
        ax.set_xlabel(f"× {reference} attention (log)", fontsize=8)
    for ax in axes.flat:
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout(rect=(0, 0.06 if len(tasks) > 2 else 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return (f"Quick grid: each method's test metric against its training step's attention FLOPs, time and peak "
            f"memory (columns; × {reference} attention on the same task, log scale), one row per task that "
            f"{reference} attention ran; the dotted line is the task's base rate (majority class, or unigram "
            f"entropy for bits per byte).")


def sbm_training(curves: Dict[str, List[dict]], path: Path) -> str:
    """SBM Fig. 4's story: validation accuracy of every method over training and SBM's mask density (log.jsonl).
    ``curves``: method → its log lines."""
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
    return ("SBM Fig. 4 on duplicates (the paper's recipe): validation token accuracy of every method over training "
            "(left) and SBM-Transformer's mask density on the validation split (right), from each run's log.jsonl.")


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
    return ("SSA Fig. 7's shape: validation bits per byte (lower is better) of S-L4's self-ensemble against the number "
            "of sampled sub-models averaged, beside dense (renormalised) inference of the same model.")


def adaptive_vs_fixed(points: Dict[str, List[tuple]], path: Path, length: int) -> str:
    """Test accuracy against attention density (left) and training step time (right), one point per run.
    ``points``: setting → [(density, step time ÷ full, accuracy %)], one tuple per seed."""
    fig, axes = figure(2)
    methods = list(dict.fromkeys(setting.split("-at-")[0] for setting in points))
    for setting, runs in points.items():
        # one colour per method; a fixed pattern at 4× SBM's density is a ring, so that it shows around the dot of
        # the same pattern at 1× where the two take the same density
        index = methods.index(setting.split("-at-")[0])
        style = dict(marker="osD^v<>ph*"[index // 10 % 10], label=setting, **(
            dict(facecolors="none", edgecolors=f"C{index % 10}", s=110, linewidths=1.5) if "-at-4x-" in setting else
            dict(color=f"C{index % 10}")))
        for ax, x in zip(axes[0], (0, 1)):
            ax.scatter([run[x] for run in runs], [run[2] for run in runs], **style)
    for ax in axes[0]:
        log_x(ax)
    axes[0, 1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))  # beside the plot, off the points
    save(fig, path, axes[0], ["attention density on the test split (log)",
                              "training step time ÷ full attention's (log)"],
         ["test token accuracy (%)", "test token accuracy (%)"])
    return (f"Adaptive vs fixed sparsity on duplicates at {length} tokens: each run's test token accuracy against its "
            "attention density (left) and its setting's training step time relative to fair full attention, timed "
            "side by side in one process (right), one point per method and seed.")
