"""Attention scaling: time, memory and FLOPs against sequence length (experiments.scaling, experiments.sbm_scaling),
checked against SBM-Transformer Table 3's ListOps column at 2K."""

import json
from pathlib import Path
from typing import Tuple

from experiments.claims.claim import REPRODUCED, Claim
from experiments.claims.sbm_table3 import COST_SLACK, PAPER


def rule(folder: Path) -> Tuple[str, str]:
    """SBM at a 1% density (sbm@0.01, near λ = 1e-1's 1.15%) against full attention at 2K: FLOPs ÷ fused full's and
    peak memory ÷ the explicit path's, within COST_SLACK × the paper's."""
    rows = {
        (r["method"], r["n"]): r for r in json.loads((folder / "scaling.json").read_text())["rows"] if "error" not in r
    }
    sbm, full, explicit = rows[("sbm@0.01", 2048)], rows[("full", 2048)], rows[("full-ref", 2048)]
    flops, memory = sbm["flops"] / full["flops"], sbm["peak_bytes"] / explicit["peak_bytes"]
    paper_flops, paper_memory = PAPER["listops"]["sbm λ=0.1"]
    within = flops <= COST_SLACK * paper_flops and memory <= COST_SLACK * paper_memory
    ours = f"sbm@0.01 at n = 2048: FLOPs {flops:.2f}×, memory {memory:.2f}× explicit full"
    return ours, REPRODUCED if within else f"differs: FLOPs {flops:.2f}×, memory {memory:.2f}×"


CLAIM = Claim(
    "scaling",
    "Attention scaling: time, memory and FLOPs against sequence length",
    "output",
    paper="SBM Table 3: per-example FLOPs and memory relative to full attention at LRA lengths.",
    rule=rule,
    figure="ListOps 2K, SBM λ = 0.1: FLOPs 0.07×, memory 0.19×",
    commands=(
        "python -m experiments.scaling --methods full,full-ref,linear,linformer,performer,nystromformer,"
        "reformer,window,bigbird,moba,sbm,sbm@0.01,ssa --lengths 1024,2048,4096,8192 --out results/scaling",
        "python -m experiments.sbm_scaling --threads 1 --rounds 3 --out results/scaling",
    ),
    figures=("scaling", "sbm_scaling"),
)
