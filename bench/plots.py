"""Plots of the report, drawn from the same records as its tables (matplotlib, an optional extra).

Each function writes one PNG and returns its caption; ``available()`` says whether matplotlib is installed
(without it the report writes its tables only and says so in one line).
"""
import importlib.util
import math
from pathlib import Path
from typing import Dict, List

METRIC_LABEL = {"accuracy": "test accuracy (%)", "bpb": "test bits per byte (lower is better)"}


def NullFormatter():
    from matplotlib.ticker import NullFormatter as formatter
    return formatter()


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def label(ax, xlabel: str, ylabel: str, legend_size: int = 7) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=legend_size)
    ax.grid(True, alpha=0.3)


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def scaling(result: dict, path: Path) -> str:
    """Forward+backward time and peak memory against sequence length, log-log, one line per method."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = [r for r in result["rows"] if "error" not in r]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["n"])
        n = [r["n"] for r in mine]
        axes[0].plot(n, [r["fwdbwd_ms"] for r in mine], marker="o", label=method)
        axes[1].plot(n, [r["peak_bytes"] / 2 ** 20 for r in mine], marker="o", label=method)
    for ax, label in zip(axes, ("forward+backward time (ms)", "peak memory of one fwd+bwd (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    args = result["args"]
    fig.suptitle(f"Attention scaling — {result['device']}; batch {args['batch_size']}, {args['heads']} heads × "
                 f"{args['head_dim']}", fontsize=10)
    save(fig, path)
    return (f"Attention scaling: forward+backward time and peak memory against sequence length (log-log), "
            f"every method at its default budget (SBM untrained, at its initial ~25% density), measured in one run "
            f"({result['device']}).")


def accuracy_vs_cost(records: List[dict], path: Path, reference: str = "full") -> str:
    """Per task: the test metric against the attention FLOPs of a training step, relative to full attention."""
    plt = pyplot()
    tasks = sorted({r["task"] for r in records if r["method"] == reference})  # a ratio needs the reference
    columns = min(3, len(tasks))
    rows_n = math.ceil(len(tasks) / columns)
    fig, axes = plt.subplots(rows_n, columns, figsize=(4.2 * columns, 3.6 * rows_n), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        mine = [r for r in records if r["task"] == task]
        ref = next(r for r in mine if r["method"] == reference)
        for r in mine:
            flops = (r.get("train_flops_per_example") or r["flops_per_example"])["attention"]
            x = flops / (ref.get("train_flops_per_example") or ref["flops_per_example"])["attention"]
            y = 100 * r["test"] if r["metric"] == "accuracy" else r["test"]
            ax.scatter([x], [y])
            ax.annotate(r["method"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        if mine and mine[0].get("base_rate") is not None:
            base = mine[0]["base_rate"] * (100 if mine[0]["metric"] == "accuracy" else 1)
            ax.axhline(base, color="grey", linestyle=":", label="base rate")
            ax.legend(fontsize=7)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels crowd a short log range
        ax.set_title(task, fontsize=10)
        ax.set_xlabel(f"training attention FLOPs × {reference}", fontsize=8)
        ax.set_ylabel(METRIC_LABEL[mine[0]["metric"]] if mine else "", fontsize=8)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    save(fig, path)
    return (f"Test metric against the attention FLOPs of a training step (× {reference} attention on the same "
            f"task), one panel per task with full attention; the dotted line is the task's base rate.")


def sbm_training(curves: Dict[str, List[dict]], path: Path) -> str:
    """SBM Fig. 4's story: mask density and accuracy over training (log.jsonl), beside other methods'
    accuracy. ``curves``: method → its log lines."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for index, (method, lines) in enumerate(curves.items()):
        # Validation accuracy only: every run logs it at the same steps (training-window lines exist only in
        # newer records, and SSA's are of its sub-model), one colour per method.
        valid = [line for line in lines if line.get("split") == "valid"]
        if not valid:
            continue
        steps = [line["step"] for line in valid]
        color = f"C{index % 10}"
        left.plot(steps, [100 * line["metric"] for line in valid], "o-", markersize=3, color=color, label=method)
        if method == "sbm":
            right.plot(steps, [line["density"] for line in valid], "o-", markersize=3, color=color,
                       label="sbm (valid)")
    label(left, "training step", "validation token accuracy (%)")
    left.legend(fontsize=7, loc="lower right")  # the curves rise through the upper left
    label(right, "training step", "SBM mask density")
    right.set_ylim(0, 1.05)
    save(fig, path)
    return ("SBM Fig. 4's story on duplicates (paper recipe): validation accuracy of every method over training "
            "(left) and SBM-Transformer's mask density (right), from the runs' log.jsonl.")


def ssa_ensemble(samples: List[int], bpb: List[float], dense: float, path: Path) -> str:
    """SSA Fig. 7's shape: validation bpb of the self-ensemble against the number of sub-models."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(samples, bpb, "o-", label="self-ensemble of sampled sub-models")
    ax.axhline(dense, color="grey", linestyle="--", label="dense (renormalised) inference")
    ax.set_xscale("log", base=2)
    ax.set_xticks(samples)
    ax.set_xticklabels([str(s) for s in samples])
    label(ax, "sub-models averaged", "validation bits per byte", legend_size=8)
    save(fig, path)
    return ("SSA Fig. 7's shape: validation bits per byte of S-L4's self-ensemble against the number of "
            "sub-models, beside dense inference.")
