"""fastRG (Rohe et al. 2018): a sparse graph with low-rank expectation sampled in time linear in its edges, as
experiments.fastrg_bench measures it."""

import re
from pathlib import Path
from typing import Tuple

from experiments.claims.claim import REPRODUCED, Claim


def rule(folder: Path) -> Tuple[str, str]:
    """Time linear in the edges: the log-log slope of time against E in fastrg_bench's range."""
    slope, low, high = map(
        float,
        re.search(
            r"slope of fastRG time vs edges.*?: ([\d.]+) \(target ([\d.]+)-([\d.]+)\)",
            (folder / "fastrg_bench.md").read_text(),
        ).groups(),
    )
    return f"time ∝ E^{slope:.2f}", REPRODUCED if low <= slope <= high else f"differs: time ∝ E^{slope:.2f}"


CLAIM = Claim(
    "fastrg",
    "fastRG: a sparse graph with low-rank expectation in time linear in its edges",
    "output",
    paper="Rohe et al. 2018: O(nk + k² + E) sampling, against the O(n m) of a dense Bernoulli draw.",
    commands=("python -m experiments.fastrg_bench --threads 1 --igraph --out results/fastrg",),
    rule=rule,
    figure="time ∝ E (O(nk + k² + E))",
    notes=[
        "One thread, as the scaling claim: the ratio of the two algorithms' work. With both cores the naive "
        "draw's matrix product runs in parallel and fastRG's sequential parts do not: `python -m "
        "experiments.fastrg_bench` (2 threads) gives smaller speed-ups on this machine."
    ],
)
