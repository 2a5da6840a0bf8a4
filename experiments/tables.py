"""Records as the tables show them: a metric over seeds, a duration, a group of records, a Markdown table, and step
times as ratios; what the report and the claims' own tables share."""

import math
import re
import statistics
from collections import defaultdict
from typing import Dict, List, Optional

from tabulate import tabulate


def fmt(values: List[float], metric: str) -> str:
    """Mean (± standard deviation over seeds when there are several): accuracy in %, bits per byte."""
    scaled = [100 * v if metric == "accuracy" else v for v in values]
    digits = 2 if metric == "accuracy" else 3
    return f"{statistics.mean(scaled):.{digits}f}" + (
        f" ± {statistics.stdev(scaled):.{digits}f}" if len(scaled) > 1 else ""
    )


def tests(rs: List[dict]) -> str:
    return fmt([r["test"] for r in rs], rs[0]["metric"])


def mean(rs: List[dict], get) -> Optional[float]:
    values = [get(r) for r in rs]
    return statistics.mean(values) if values and None not in values else None


def duration(seconds: Optional[float]) -> str:
    return "–" if seconds is None else (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min")


def devices(recs: List[dict]) -> str:
    """The records' devices, a count of one thread in the singular."""
    return ", ".join(sorted({re.sub(r"\b1 threads\b", "1 thread", r["device"]) for r in recs}))


def table(rows: list, headers: List[str]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def by(recs: List[dict], *keys) -> Dict[tuple, List[dict]]:
    groups = defaultdict(list)
    for r in recs:
        groups[tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]].append(r)
    return groups


def fair_ratios(timed: dict) -> Dict[str, float]:
    """experiments.step_time's JSON: each setting's median step ÷ fair full attention's (NaN without
    one), by its label less " (as run)"."""
    fair = statistics.median(timed.get("step_ms", {}).get("full (fair)") or [math.nan])
    return {
        name.replace(" (as run)", ""): statistics.median(ms) / fair for name, ms in timed.get("step_ms", {}).items()
    }
