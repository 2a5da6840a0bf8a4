"""What a claim is: the training runs it makes (grid cells, results/CLAIM/runs/CELL) or the benchmarks whose output it
keeps (results/CLAIM/*.md), and its rule: its folder → (ours, the verdict: REPRODUCED, NO_INFORMATION or
"differs: <how>"). The verdict words and the measures that several rules share are here too."""

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from experiments import grid

REPRODUCED, NO_INFORMATION = "reproduced", "no information at this budget"
SKIP = "skip"  # what a pending option resolves to when its records make its run needless
MARGIN = 0.01  # accuracy within one point of the figure it is compared with counts as reaching it


@dataclass(frozen=True)
class Setting:
    """A claim's training setting; ``tag`` tells two of one method apart (e.g. SBM at two λ)."""

    method: str
    task: str
    preset: str = "cpu"
    options: Dict[str, object] = field(default_factory=dict)
    tag: str = ""


@dataclass(frozen=True)
class Claim:
    name: str  # the folder under results/
    title: str
    kind: str  # "runs" or "output"
    paper: str  # what the paper reports, in its own words and numbers, for the reader to compare
    runs: Tuple[Setting, ...] = ()
    seeds: Tuple[int, ...] = (0,)
    once: Tuple[Setting, ...] = ()  # settings run at the first seed only (costs of untrained models)
    commands: Tuple[str, ...] = ()  # benchmarks whose output the claim keeps (a runs claim: after its runs)
    notes: List[str] = field(default_factory=list)
    figure: str = ""  # the paper's number(s) that the verdict compares with, for the table's paper column
    rule: Callable[[Path], Tuple[str, str]] = None  # the claim's folder → (ours, verdict)
    table: Callable[[List[dict]], str] = None  # its records as Markdown (None: a row per command, the report's)
    figures: Tuple[str, ...] = ()  # its plots in results/plots/ (experiments.plots draws them)
    calibration: Callable[[Path], str] = None  # its folder → the table of its calibration/ runs, before any sweep
    # a cell → its phase: no cell runs while one of an earlier phase is left (None: every cell once it is ready)
    phase: Callable[[dict], int] = None

    def cells(self, runs: Path = None) -> List[dict]:
        """Every run as a grid cell, ``"waiting"`` for the records under ``runs`` it needs."""
        cells = []
        for s, seeds in [(s, self.seeds) for s in self.runs] + [(s, self.seeds[:1]) for s in self.once]:
            pending = {k: v for k, v in s.options.items() if hasattr(v, "resolve")}
            values = {k: v.resolve(runs) if runs else None for k, v in pending.items()}
            if SKIP in values.values():
                continue  # a run its settings, resolved from records, make needless
            options = dict(s.options, **{k: value or f"<{type(pending[k]).__name__}>" for k, value in values.items()})
            waiting = [k for k, value in values.items() if value is None]
            cells += [
                dict(
                    grid.make_cell(s.method, s.task, seed, s.preset, options, s.tag),
                    **({"waiting": f"the records that give --{waiting[0].replace('_', '-')}"} if waiting else {}),
                )
                for seed in seeds
            ]
        return cells


def average(rs: List[dict], get=lambda r: r["test"]) -> float:
    return statistics.mean(get(r) for r in rs)
