"""The kernel method's report (Karkhanis et al., kernel_sparse.py): Tables 1-3, Table 1 at matched density, Fig. 5,
Fig. 6 and the §6.2 fine-tuning as Markdown, generated from a record of experiments/kernel_pipeline.py
(RUN/metrics.json, its ``kernel`` part).

    python -m experiments.kernel_report RUN                                   # print the tables
    python -m experiments.kernel_report results/kernel --out results/kernel/kernel_report.md --command "…"

The matched-density verdict compares the families' validation perplexity at each calibrated density with the
paper's WikiText-2 order (Table 1: standard 2487 < learned 2632 < handcrafted 2677).
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List

PAPER_ORDER = ["standard", "learned", "handcrafted"]  # Table 1, WikiText-2 validation perplexity, best first
MATCHED = 0.2  # a density counts as matched where every family's keys per query is within 20% of the calibrated one


def variants_table(kernel: dict) -> List[str]:
    """Tables 1 and 3: each FAMILY/LOSS at the pipeline's selection rule."""
    lines = [
        "| kernels / loss | predictor train loss (Eq. 1 mean) | valid ppl | keys per query | density | "
        "core FLOPs × dense | attention FLOPs × dense | model FLOPs × dense | model time × dense | "
        "target recall | mass recall |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in kernel["variants"].items():
        lines.append(
            f"| {name} | {v['train_loss']:.4f} | {v['valid_ppl']:.3f} | {v['keys_per_query']:.1f} | "
            f"{v['density']:.3f} | {v['core_flops_x_dense']:.3f} | {v['attention_flops_x_dense']:.3f} | "
            f"{v['model_flops_x_dense']:.3f} | {v['time_x_dense']:.2f} | {v['target_recall']:.3f} | "
            f"{v['mass_recall']:.3f} |"
        )
    return lines


def family(row: dict) -> str:
    return row["variant"].split("/")[0]


def matched_verdict(rows: List[dict]) -> Dict[str, object]:
    """Per calibrated density (keys per query) that every family reached (within MATCHED), the families in order of
    validation perplexity, and the verdict: reproduced where that order is the paper's at every such density, else
    how it differs; the densities some family could not reach (its τ → 0 selects fewer keys) are listed apart."""
    levels = sorted({r["keys_target"] for r in rows if r["select"] == "threshold"})
    orders, unreached = {}, {}
    for level in levels:
        at = [r for r in rows if r["select"] == "threshold" and r["keys_target"] == level]
        short = [f"{family(r)} {r['keys_per_query']:.2f}" for r in at if abs(r["keys_per_query"] / level - 1) > MATCHED]
        if short:
            unreached[level] = short
        else:
            orders[level] = [family(r) for r in sorted(at, key=lambda r: r["valid_ppl"])]
    if not orders:
        verdict = "no information at this budget"
    elif all(order == [f for f in PAPER_ORDER if f in order] for order in orders.values()):
        verdict = "reproduced"
    else:
        verdict = "differs: " + "; ".join(f"{level:g} keys: " + " < ".join(o) for level, o in orders.items())
    return {
        "orders": orders,
        "unreached": unreached,
        "learned_best_at": [level for level, order in orders.items() if order[0] == "learned"],
        "learned_beats_handcrafted_at": [
            level for level, order in orders.items() if order.index("learned") < order.index("handcrafted")
        ],
        "verdict": verdict,
    }


def matched_table(kernel: dict) -> List[str]:
    """Table 1 at matched density: each family by top-K and by τ calibrated to the same keys per query, the dense
    teacher beside, and the verdict computed from the calibrated rows."""
    rows, teacher = kernel["matched"], kernel["teacher"]
    lines = [
        "| kernels | select | K or τ | keys per query (calibrated to) | valid ppl | × teacher | keys per query | "
        "target recall | mass recall |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| dense teacher | all | – | – | {teacher['valid_ppl']:.3f} | 1.000 | all | 1.000 | 1.000 |",
    ]
    for r in sorted(rows, key=lambda r: (r["select"], r["keys_target"] or r["value"], PAPER_ORDER.index(family(r)))):
        value = f"{r['value']}" if r["select"] == "topk" else f"{r['value']:.4g}"
        target = "–" if r["keys_target"] is None else f"{r['keys_target']:g}"
        lines.append(
            f"| {family(r)} | {r['select']} | {value} | {target} | {r['valid_ppl']:.3f} | "
            f"{r['valid_ppl'] / teacher['valid_ppl']:.3f} | {r['keys_per_query']:.2f} | {r['target_recall']:.3f} | "
            f"{r['mass_recall']:.3f} |"
        )
    v = matched_verdict(rows)
    lines += [
        "",
        "| calibrated keys per query | families by valid ppl (best first) |",
        "|---|---|",
        *[f"| {level:g} | {' < '.join(order)} |" for level, order in v["orders"].items()],
        *[f"| {level:g} | not matched: {', '.join(short)} keys |" for level, short in v["unreached"].items()],
        "",
        f"Learned kernels best at: {', '.join(f'{x:g}' for x in v['learned_best_at']) or 'no density'} keys per "
        f"query; ahead of handcrafted at: {', '.join(f'{x:g}' for x in v['learned_beats_handcrafted_at']) or 'none'}. "
        f"Verdict (paper's order {' < '.join(PAPER_ORDER)}): {v['verdict']}.",
    ]
    return lines


def render(kernel: dict) -> str:
    """The report of a record's ``kernel`` part: Tables 1-3, Table 1 at matched density, Fig. 5, Fig. 6, §6.2."""
    teacher, config = kernel["teacher"], kernel["config"]
    lines = [f"Dense teacher: valid ppl {teacher['valid_ppl']:.3f}, test ppl {teacher['test_ppl']:.3f}.", ""]
    lines += [f"Table 1 ({config['select']} selection at {config[config['select'].replace('topk', 'top_k')]}):", ""]
    lines += variants_table(kernel)
    if kernel.get("matched"):
        lines += ["", "Table 1 at matched density (Eq. 1 predictors):", "", *matched_table(kernel)]
    lines += [
        "",
        f"Fig. 5 ({kernel['finetune']['setting']['variant']}):",
        "",
        "| select | value | valid ppl | keys per query | density | core FLOPs × dense | model time × dense |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {p['select']} | {p['value']} | {p['valid_ppl']:.3f} | {p['keys_per_query']:.1f} | {p['density']:.3f} | "
        f"{p['core_flops_x_dense']:.3f} | {p['time_x_dense']:.2f} |"
        for p in kernel["fig5"]
    ]
    lines += [
        "",
        "Fig. 6 (sparsified from the last layer backwards):",
        "",
        "| layers sparsified | valid ppl | density |",
    ]
    lines += [
        "|---|---|---|",
        *[f"| {p['layers']} | {p['valid_ppl']:.3f} | {p['density']:.3f} |" for p in kernel["fig6"]],
    ]
    f = kernel["finetune"]
    lines += [
        "",
        f"Fine-tuned end to end ({f['steps']} steps) at {f['setting']}: valid ppl {f['before_valid_ppl']:.3f} "
        f"→ {f['valid_ppl']:.3f}; test ppl {f['test_ppl']:.3f} = {f['ppl_x_teacher']:.3f} × teacher; core "
        f"FLOPs {f['core_flops_x_dense']:.3f} × dense (attention {f['attention_flops_x_dense']:.3f}, model "
        f"{f['model_flops_x_dense']:.3f}); model inference time {f['time_x_dense']:.2f} × dense (measured on one "
        f"validation batch); target (core ≤ {config['flops_budget']} × dense, ppl ≤ 1.2 × teacher) "
        f"{'met' if f['target_met'] else 'not met'}.",
    ]
    if "dense_control" in f:
        lines += [
            "",
            f"Dense control (the teacher fine-tuned the same {f['steps']} steps with dense attention): test "
            f"ppl {f['dense_control']['test_ppl']:.3f}; the sparse model's is {f['ppl_x_dense_control']:.3f} × "
            f"the control's.",
        ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.kernel_report", description=__doc__.splitlines()[0])
    p.add_argument("run", help="a run folder of python -m experiments.kernel_pipeline (its metrics.json)")
    p.add_argument("--out", help="write the report to this file (default: print it)")
    p.add_argument("--command", default="", help="the command that made the record, for the report's first line")
    args = p.parse_args(argv)
    path = Path(args.run) / "metrics.json"
    try:
        kernel = json.loads(path.read_text())["kernel"]
        text = render(kernel)
    except (OSError, ValueError, KeyError) as exc:
        sys.exit(f"{p.prog}: {path} is no kernel pipeline record ({type(exc).__name__}: {exc})")
    if args.out:
        header = f"`{args.command}` ({kernel['seconds'] / 60:.1f} min for the pipeline after the teacher)\n\n"
        Path(args.out).write_text((header if args.command else "") + text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
