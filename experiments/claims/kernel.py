"""Kernel-based learned sparse attention (kernel_sparse.py): Table 1's WikiText-2 perplexities of the standard,
learned and handcrafted kernels, with Tables 2-3, Fig. 5-6 and §6.2 from the paper's pipeline
(experiments/kernel_pipeline.py)."""

import re
from pathlib import Path
from typing import Tuple

from experiments.claims.claim import NO_INFORMATION, Claim


def rule(folder: Path) -> Tuple[str, str]:
    """Table 1 at matched density: the families in order of valid perplexity at each calibrated keys per query, and
    the verdict the report computes from them against the paper's order standard < learned < handcrafted."""
    text = (folder / "kernel_report.md").read_text()
    orders = re.findall(r"^\| ([\d.]+) \| (\w+(?: < \w+)+) \|$", text, re.M)
    verdict = re.search(r"^Learned kernels .*Verdict \(paper's order [^)]*\): (.*)\.$", text, re.M)
    if not orders or verdict is None:
        return "no matched-density table", NO_INFORMATION
    return "valid ppl at matched keys per query: " + "; ".join(f"{k}: {o}" for k, o in orders), verdict.group(1)


CLAIM = Claim(
    "kernel",
    "Kernel-based sparse attention: Tables 1-3, Fig. 5-6, §6.2 fine-tuning",
    "output",
    paper="Table 1: masked-LM perplexity of the sparsified models on WikiText-2 for standard, handcrafted "
    "and learned kernels; Tables 2-3: their training and inference FLOPs and density; Fig. 5: "
    "perplexity of the sparsified model; Fig. 6: error propagation; §6.2: end-to-end fine-tuning.",
    # the tables from the published record (results/kernel/metrics.json), whose config holds the command that made it
    commands=("python -m experiments.kernel_report results/kernel",),
    rule=rule,
    figure="valid ppl standard 2487, handcrafted 2677, learned 2632 (WikiText-2)",
    notes=[
        "This run is a reduced one, sized to its shared 2-core machine: the teacher is the step-500 checkpoint of "
        "the 1000-step preset's (valid ppl 4.91; the finished teacher reaches 3.71), the Eq. 1 predictors only, "
        "Fig. 5 at two points and no §6.2 fine-tuning (0 steps: the fine-tuning line is the unfitted model's).",
        "The record's command is `python kernel_sparse.py`, which ran the pipeline when it was made; the pipeline is "
        "now `python -m experiments.kernel_pipeline` with the same options, but `--sweep F/L` given as `--family F "
        "--loss L` (on one small teacher per task, bytes and WikiText-2, the two commands give the same 414 values "
        "but times, and the same tensors), and `python kernel_sparse.py` trains one kernel family.",
        "The learned kernels used to select nothing (0.0 keys per query at τ = 0.5, valid ppl 237). Started from "
        "logits N(0, 1), every kernel was a random half of the offsets; Eq. 1 switched every coefficient off "
        "(α ≤ 0.18, train loss 0.0132, the targets' own density), and with α ≈ 0 no gradient reached the kernels, "
        "which stayed as initialised. Started near-empty (logits N(−4, 1)) with a learning rate of their own (0.03), "
        "they learn a few offsets each: the lowest train loss of the three (0.0058, standard 0.0060, handcrafted "
        "0.0079) and 1.4 keys per query at τ = 0.5, the paper's density (542 ones per head of 512 tokens).",
        "At matched keys per query the learned kernels beat the handcrafted ones at every density the three reach "
        "(1.25, 2.5, 5), and are best of the three at 1.25 and 5 (valid ppl 8.42 and 8.14 against the standard "
        "kernels' 8.85 and 10.28); the standard kernels are best at 2.5 (7.70 against 8.65). The handcrafted "
        "kernels are far behind at low density (26.8 at 1.25 keys: 20 keys per kernel, Eq. 1's α stays below "
        "their low precision) and ahead only where they take many keys (6.59 at 9.7 keys, which the learned "
        "kernels never reach: at τ → 0 they hold 4.7). Top-K is no matched comparison (learned top-5: 3.1 keys, "
        "handcrafted top-1: 15.5). So the paper's WikiText-2 order holds at 2.5 keys only, and its WikiText-103 "
        "reading (learned best) at 1.25 and 5; single runs on 16 validation batches, no seeds repeated.",
    ],
)
