"""SBM-Transformer Table 3: inference FLOPs and peak memory per example relative to full attention at LRA lengths
(ListOps 2K, Image 1K), on the CPU: the paper preset's model and lengths (Table 7), batch 8 for 600 steps (the paper:
128 × 5000 on ListOps, 1024 × 35000 on Image), warm-up scaled to the run; Image tests 1000 of its 10000 images."""

import math
import statistics
from pathlib import Path
from typing import List, Tuple

from bench import methods as registry
from experiments import grid
from experiments.claims.claim import NO_INFORMATION, REPRODUCED, Claim, Setting, average
from experiments.tables import by, fmt, mean, table, tests

TASKS = {"listops": 63, "image": 125}  # task → test batches of 8 in the final evaluation
# Table 3: (FLOPs, peak memory) relative to full attention, per task column, by the setting's label.
PAPER = {
    "listops": {
        "full": (1.00, 1.00),
        "linear": (0.02, 0.18),
        "reformer": (0.05, 0.39),
        "performer": (0.18, 0.76),
        "linformer": (0.33, 0.26),
        "nystromformer": (1.09, 0.34),
        "sbm λ=0.1": (0.07, 0.19),
    },
    "image": {
        "full": (1.00, 1.00),
        "linear": (0.04, 0.42),
        "reformer": (0.10, 0.72),
        "performer": (0.36, 0.96),
        "linformer": (0.66, 0.34),
        "nystromformer": (2.37, 0.70),
        "sbm λ=0.1": (0.27, 0.39),
    },
}
COST_SLACK = 1.5  # a cost ratio up to 1.5× the paper's counts as the paper's (other hardware, other lengths)


RECIPE = dict(batch_size=8, steps=600, lr="1e-3", warmup=60, eval_every=200, eval_batches=8)


def trained(method: str, task: str, tag: str = "", **options) -> Setting:
    return Setting(method, task, "paper", dict(RECIPE, final_eval_batches=TASKS[task], **options), tag)


def untrained(method: str, task: str, tag: str = "", **options) -> Setting:
    return Setting(
        method, task, "paper", dict(**options, batch_size=8, steps=0, final_eval_batches=1), tag + "-untrained"
    )


def learned(rs: List[dict]) -> bool:
    """Whether the mean test accuracy clears the split's majority class by two binomial standard errors."""
    base, value = average(rs, lambda r: r["base_rate"]), average(rs)
    scored = (rs[0].get("scored") or {}).get("test")
    return value > base + (2 * math.sqrt(base * (1 - base) / scored) if scored else 0.0)


def rule(folder: Path) -> Tuple[str, str]:
    """SBM λ = 1e-1's inference FLOPs ÷ full attention's and memory ÷ the explicit path's within COST_SLACK × the
    paper's, per task; its accuracy above the base rate where full attention's is."""
    recs, said, costly, at_base, informative = grid.load(folder)[0], [], [], [], False
    for task, columns in PAPER.items():
        rs = [r for r in recs if r["task"] == task]
        full = [r for r in rs if r["method"] == "full" and r["steps"] > 0]
        explicit = [r for r in rs if "path=reference" in r["cell"].get("command", [])]
        sbm = [r for r in rs if r["method"] == "sbm" and float(r["config"].get("density_weight") or 0) == 0.1]
        if full and explicit and sbm:
            flops, memory = (
                average(sbm, get) / average(ref, get)
                for ref, get in (
                    (full, lambda r: r["flops_per_example"]["model"]),
                    (explicit, lambda r: r["inference_memory_per_example_bytes"]),
                )
            )
            said.append(f"{task} {flops:.2f} / {memory:.2f}")
            informative |= learned(full)
            at_base += [task] if learned(full) and not learned(sbm) else []
            costly += (
                [task]
                if flops > COST_SLACK * columns["sbm λ=0.1"][0] or memory > COST_SLACK * columns["sbm λ=0.1"][1]
                else []
            )
    problems = ([f"costs above the paper's ({', '.join(costly)})"] if costly else []) + (
        [f"SBM at base rate ({', '.join(at_base)})"] if at_base else []
    )
    return "SBM λ = 0.1, FLOPs / memory ÷ full: " + "; ".join(said), (
        NO_INFORMATION if not informative else "differs: " + "; ".join(problems) if problems else REPRODUCED
    )


def setting_label(r: dict) -> str:
    """A record's setting: the method, SBM's λ, full attention's explicit path."""
    return (
        r["method"]
        + (f" λ={float(r['config']['density_weight']):g}" if r["config"].get("density_weight") else "")
        + (" (explicit path)" if "path=reference" in r["cell"].get("command", []) else "")
    )


def records_table(recs: List[dict]) -> str:
    """Per task: inference FLOPs and memory ÷ full attention's (SDPA, explicit path) beside the paper's."""
    out, order = [], ["full", "sbm"] + [m for m in registry.METHODS if m not in ("full", "sbm")]
    for task, rs in sorted(by(recs, "task").items(), key=lambda kv: [*PAPER, kv[0]].index(kv[0])):
        groups, paper = by([dict(r, label=setting_label(r)) for r in rs], "label"), PAPER.get(task, {})
        full, explicit, rows = groups.get("full"), groups.get("full (explicit path)"), []
        ratio = lambda rs, ref, get: f"{mean(rs, get) / mean(ref, get):.3f}" if ref else "–"  # noqa: E731
        memory = lambda r: r["inference_memory_per_example_bytes"]  # noqa: E731
        for label in sorted(groups, key=lambda g: (order.index(g.split()[0]) if g.split()[0] in order else 99, g)):
            rs = sorted(groups[label], key=lambda r: r["seed"])
            trained, explored = rs[0]["steps"] > 0, [r.get("sbm", {}).get("test_with_exploration") for r in rs]
            rows.append(
                [
                    label,
                    ", ".join(str(r["seed"]) for r in rs),
                    tests(rs) if trained else "untrained",
                    fmt([mean(rs, lambda r: r["base_rate"])], "accuracy") if trained and "base_rate" in rs[0] else "–",
                    f"{100 * mean(rs, lambda r: r['density']):.1f}% ("
                    + " / ".join(f"{100 * statistics.mean(d):.1f}" for d in zip(*(r["density_per_layer"] for r in rs)))
                    + ")",
                    "–"
                    if None in explored
                    else fmt([e["metric"] for e in explored], "accuracy")
                    + f" ({100 * mean(explored, lambda e: e['density']):.1f}%)",
                    *(ratio(rs, full, lambda r, k=k: r["flops_per_example"][k]) for k in ("model", "attention")),
                    ratio(rs, explicit, memory),
                    ratio(rs, full, memory),
                    f"{mean(rs, memory) / 2**20:.1f}",
                    "/".join(f" {v:.2f} " for v in paper[label]).strip() if label in paper else "–",
                ]
            )
        out.append(
            f"{task} ({rs[0]['config']['seq_len']} tokens):\n\n"
            + table(
                rows,
                [
                    "setting",
                    "seeds",
                    "test acc %",
                    "majority class %",
                    "test density (per layer %)",
                    "with δ in eval: acc % (density)",
                    "FLOPs ÷ full",
                    "attention FLOPs ÷ full",
                    "memory ÷ explicit full",
                    "memory ÷ SDPA full",
                    "MiB per example",
                    "paper FLOPs / memory",
                ],
            )
            if full
            else f"{task}: full attention's record is missing, no ratio can be given."
        )
    return "\n\n".join(out)


CLAIM = Claim(
    "sbm-table3",
    "SBM-Transformer Table 3: inference FLOPs and memory at LRA length (ListOps 2K, Image 1K)",
    "runs",
    paper="Table 3: per-example inference FLOPs / peak memory ÷ full attention (every method's beside ours in "
    "the table). Table 2 (λ = 1e-1): SBM 37.76% at 1.15% density on ListOps, 41.35% at 1.33% on Image; "
    "Table 1: full attention 37.22% and 40.38%. Ours: the paper's LRA model and lengths (ListOps padded "
    "to 2048; Image 1024 pixels), a CPU-sized batch and number of steps.",
    runs=tuple(
        run
        for task in TASKS
        for run in (
            trained("full", task),
            trained("sbm", task, "-lambda0.1", density_weight="0.1"),
            trained("sbm", task, "-lambda0.01", density_weight="0.01"),
        )
    ),
    seeds=(0, 1),
    rule=rule,
    figure="SBM λ = 0.1, FLOPs / memory ÷ full: listops 0.07 / 0.19; image 0.27 / 0.39",
    once=tuple(
        run
        for task in TASKS
        for run in (
            untrained("full", task, "-path-reference", attn=["path=reference"]),
            *(untrained(m, task) for m in ("linear", "reformer", "performer", "linformer", "nystromformer")),
        )
    ),
    commands=tuple(
        f"python -m experiments.step_time --task {task} --preset paper --batch-size 8 --methods full,sbm,linear,"
        f"reformer,performer,linformer,nystromformer --sbm-density "
        + ",".join(f"results/sbm-table3/runs/sbm-lambda{w}-{task}-paper-s0" for w in ("0.1", "0.01"))
        + f" --out results/sbm-table3/step_time-{task}"
        for task in TASKS
    ),
    notes=[
        "FLOPs: forward per example, bench/measure.py's convention (SDPA and the explicit path count the "
        "same). Memory: peak above the weights and inputs of one inference call on 4 test examples, "
        "per example; on CPU the resident set's high-water mark. The `path=reference` row is full "
        "attention's explicit path (materialised scores, the paper's \"full attention\"); the untrained "
        "rows are fixed-cost methods, whose cost does not depend on their weights.",
        "Step times (`experiments.step_time`, below): fair full attention has no attention dropout and "
        "trims each batch to its longest sequence; the paper's recipe (the `full` row) keeps dropout 0.1, "
        "which moves CPU SDPA from its flash kernel to its math path.",
        "With δ in eval: the SBM recipe's second pass over the same test examples, keeping δ's random "
        "edges (δ = 0.01) in evaluation as the official code does (`--explore-in-eval`); our default drops "
        "them. The paper's λ = 1e-1 densities on four LRA tasks (1.15-2.61%; Text 10.62%) sit just above "
        "δ's 1%, as such an evaluation gives.",
    ],
    table=records_table,
)
