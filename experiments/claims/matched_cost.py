"""Where does learning where to look pay? Accuracy at matched cost, paired by seed, against fixed patterns that
reach every budget.

    python -m experiments.claims run matched-cost --jobs 2      # learning rates, first budgets, the rest (resumable)
    python -m experiments.claims verdicts --budgets 0.125,0.25  # the verdicts from the records at chosen budgets

Cost is the pairs an attention computes (bench.measure's ``computed_pairs``: Reformer's rounds × 2C keys, SBM's
sampled edges, a window's band, a head or layer allocation's mean over heads), and, as a second axis, attention
FLOPs ÷ full attention's. One model for every family on a task: 2 layers of 8 heads × 16, so that a head
allocation reaches 12.5% and 25% and a layer allocation 50%. Tasks at 128 tokens: duplicates (SBM §5.1),
scattered-key recall at N/16, N/8 and N/4 pairs (MQAR's difficulty axis, arXiv 2312.04927) and ``ngram``, a
positional control whose window limit is known; ``chain``, where both layers must read by content, waits for a
recipe on which full attention learns it (TASKS). Computed pairs count attention's scored pairs only: a router's
gate (q against each block's mean key) and LSH's rotations are counted on the FLOPs axis.

The statistic (``verdicts``): for each task and budget B, each family's best setting whose median computed pairs
are within B (chosen on validation), then per seed the best adaptive family's test accuracy minus the best fixed
family's, its mean and 95% bootstrap interval over the 5 paired seeds; provisional until every run of the design
that may fall within B is recorded. Which families are adaptive and which fixed is fixed here, before any run
(ADAPTIVE, FIXED).
"""

import functools
import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from tabulate import tabulate

from bench.files import read_json
from experiments.claims.claim import MARGIN, SKIP, Claim, Setting
from experiments.grid import load

SEEDS = (0, 1, 2, 3, 4)
LEARNING_RATES = ("3e-4", "1e-3", "3e-3", "1e-2")
BEYOND = {"3e-4": "1e-4", "1e-2": "3e-2"}  # where the best of the four sits at an edge, one rate beyond it
BUDGETS = (0.0625, 0.125, 0.25, 0.5)  # computed pairs ÷ admissible pairs
# attention FLOPs ÷ full attention's: the q, k, v and output projections, which every family computes in full, are
# half of full attention's FLOPs at 128 tokens (4·N·C·HD against 2·N²·HD), so the FLOPs budgets span (0.5, 1)
FLOPS_BUDGETS = (0.5, 0.625, 0.75, 0.875)
# A setting is within B where its median computed pairs are ≤ SLACK · B: a band, a chunk or a block is a whole number
# of keys, so no setting at 128 tokens lands on a budget exactly (a full head beside seven self-only windows: 13.2%).
SLACK = 1.1
PAYS, DOES_NOT_PAY = 0.05, 0.01  # the interval's lower bound ≥ +0.05: pays; its upper bound ≤ +0.01: does not pay
BOOTSTRAP = 10_000

MODEL = {"seq_len": 128, "dim": 64, "depth": 2, "heads": 8, "head_dim": 16, "mlp_dim": 128, "batch_size": 32}
MODEL.update(weight_decay=0.0, warmup=100, eval_every=250, eval_batches=4, final_eval_batches=8)  # and the recipe
# task → steps, from calibration/ (full attention, seed 0): recall and duplicates at ≥ 0.99 by step 500, ngram's
# positional head formed between steps 500 and 750. The chain is not here yet: through 1,500 steps (and 1,250 at lr
# 3e-3 with half its keys and chains) full attention stayed at guessing among the values a sequence holds (26-31%).
TASKS = {"duplicates": 1000, "recall-few": 1000, "recall": 1000, "recall-many": 1000, "ngram": 1500}

FIXED = ("window", "bigbird", "head allocation", "layer allocation")
ADAPTIVE = ("reformer", "block router", "sbm", "hybrid: reformer", "hybrid: block router", "hybrid: sbm")
# Every family's learning rate is chosen on recall (one model and recipe for every task) and taken by every task.
RATE_TASK = "recall"
# These budgets run first, then the lower ones, which count at 12.5% too, then the rest (1,000 steps: ~150 s a run).
FIRST_BUDGETS = (0.125, 0.25)


def families(steps: int) -> Dict[str, List[Tuple[str, str, dict, Optional[float]]]]:
    """family → its settings [(method, tag, options, budget)], the first the one its learning rate is chosen on.
    Each fixed or routed setting aims at one budget: its computed pairs at 128 tokens, measured, are within SLACK of
    it (a window of density 0.05 has 7 keys a query, 5.4%; one of 0.0625, 6.9%, is not within 6.25%). SBM learns
    its density (budget None), pressed by λ 1e-2 and 1e-1; without λ (RATES_ONLY: its learning rates are chosen
    there) and at 1e-3 it learned 94% on duplicates at 128 tokens (results/frontier-2-heads), above every budget,
    so neither runs in stage 2. Each hybrid keeps its 12.5% window: its adaptive head adds what it learns."""
    window = lambda d: f"density={d:g}"  # noqa: E731
    return {
        "dense": [("full", "", {}, 1.0)],
        "window": [("window", f"-d{d:g}", {"attn": [window(d)]}, b) for d, b in WINDOWS],
        "bigbird": [("bigbird", f"-d{d:g}", {"attn": [window(d), "block=8", "global_blocks=1"]}, d) for d in BIGBIRD],
        "head allocation": [
            ("window", f"-full{f}-d{d:g}", {"attn": [f"full_heads={f}", window(d)]}, b) for f, d, b in HEADS
        ],
        "layer allocation": [("window", "-fulllayer-d0.0625", {"attn": ["full_layers=1", window(0.0625)]}, 0.5)],
        "reformer": [
            ("reformer", f"-h{h}-b{c}", {"attn": [f"n_hashes={h}", f"bucket_size={c}"]}, b) for h, c, b in ROUNDS
        ],
        "block router": [
            ("moba", f"-b{c}-k{k}", {"attn": [f"block={c}", f"topk={k}", *(["path=reference"] if k > 1 else [])]}, b)
            for c, k, b in BLOCKS
        ],
        "sbm": [("sbm", "", {}, RATES_ONLY)]
        + [("sbm", f"-lambda{w}", {"density_weight": w, "density_from": steps // 2}, None) for w in ("1e-2", "1e-1")],
        **{
            f"hybrid: {name}": [
                (
                    "hybrid",
                    f"-{adaptive}-d0.125",
                    {"attn": [f"adaptive={adaptive}", window(0.125), f"budget={budget}"]},
                    aim,
                )
            ]
            for name, adaptive, budget, aim in HYBRIDS
        },
    }


# (setting, budget) at 128 tokens; computed pairs measured after one step, the first of each the rate's setting.
WINDOWS = ((0.125, 0.125), (0.05, 0.0625), (0.25, 0.25), (0.5, 0.5))  # 12.8%, 5.4%, 25.5%, 50.0%
BIGBIRD = (0.125, 0.0625, 0.25, 0.5)  # 11.4%, 6.2%, 23.8%, 52.3%
HEADS = ((1, 0.01, 0.125), (1, 0.125, 0.25), (2, 0.25, 0.5))  # full heads, window: 13.2%, 23.7%, 44.1%
ROUNDS = ((1, 8, 0.125), (1, 4, 0.0625), (2, 8, 0.25), (2, 16, 0.5))  # hashes, bucket: R · 2C keys a query
# block, routed blocks: (k + 1) · block keys. With three routed blocks the fast path's per-query gather of 24-48 keys
# takes 3.8× the reference path's time at 128 tokens (one thread, a layer's forward and backward): those settings
# take the reference path, one routing and the same outputs (tests/test_moba.py). Computed pairs are the routing's;
# FLOPs are counted on the path taken, 1.04 × full attention's, where the fast path's are 0.65 (blocks of 8) and 0.77
# (of 16): on the FLOPs axis these two settings are counted high.
BLOCKS = ((8, 1, 0.125), (4, 1, 0.0625), (8, 3, 0.25), (16, 3, 0.5))
# seven 12.5% window heads beside one adaptive head at 12.5% (12.8% in all), or beside an SBM head, which learns its own
HYBRIDS = (
    ("reformer", "reformer", "n_hashes=1;bucket_size=8", 0.125),
    ("block router", "moba", "block=8;topk=1", 0.125),
    ("sbm", "sbm", "clusters=4", None),
)  # (family, the adaptive head, that head's budget, the setting's budget)
RATES_ONLY = "rates only"  # the budget of a setting run on the learning-rate stage only


@dataclass(frozen=True)
class BestLearningRate:
    """A stage-2 cell's ``lr``: the best by validation of its family's rated cells at seed 0, once all are in;
    with ``beyond``, the rate one step past the best of the first four where that best is at an edge of them, and
    SKIP where it is not (no fifth run is needed)."""

    cells: Tuple[str, ...]
    beyond: bool = False

    def resolve(self, runs: Path) -> Optional[str]:
        records = [read_json(runs / f"{name}-s0" / "metrics.json") or {} for name in self.cells]
        four, fifth = records[: len(LEARNING_RATES)], records[len(LEARNING_RATES) :]
        if any(r.get("status") != "complete" for r in four):
            return None
        best = rate(max(four, key=lambda r: r["valid"]))
        if self.beyond:
            return BEYOND.get(best, SKIP)
        if BEYOND.get(best) and fifth and fifth[0].get("status") != "complete":
            return None  # the rate beyond the edge is still running
        done = [r for r in records if r.get("status") == "complete"]
        return rate(max(done, key=lambda r: r["valid"]))


def rate(record: dict) -> str:
    lr = record["config"]["lr"]
    return lr if isinstance(lr, str) else f"{lr:g}"


def settings():
    """(method, task, options, tag, seeds, task, family, label) of every cell group of the claim: the learning rates
    on RATE_TASK first, then every task's settings at FIRST_BUDGETS (and SBM's), then the rest."""
    rates, first, rest = [], [], []
    for task, steps in TASKS.items():
        options = dict(MODEL, steps=steps)
        for family, members in families(steps).items():
            method, tag, extra, _ = members[0]
            rated = tuple(f"{method}{tag}-lr{lr}-{RATE_TASK}-cpu" for lr in (*LEARNING_RATES, "beyond"))
            if task == RATE_TASK:
                rates += [
                    (method, task, {**options, **extra, "lr": lr}, f"{tag}-lr{lr}", (0,), task, family, f"lr {lr}")
                    for lr in LEARNING_RATES
                ]
                beyond = {**options, **extra, "lr": BestLearningRate(rated[:-1], beyond=True)}
                rates.append((method, task, beyond, f"{tag}-lrbeyond", (0,), task, family, "lr beyond"))
            for m, t, o, budget in members:
                if budget == RATES_ONLY:
                    continue
                group = (m, task, {**options, **o, "lr": BestLearningRate(rated)}, t, SEEDS, task, family, f"{m}{t}")
                (first if leads(budget) else rest).append(group)
    return rates + first + rest


def leads(budget: Optional[float]) -> bool:
    """A setting of the first budgets (full attention's and SBM's learned ones among them)."""
    return budget is None or budget in (*FIRST_BUDGETS, 1.0)


def phase(cell: dict) -> int:
    """The run order (each phase waits for the earlier): learning rates 0, first budgets 1, those below 2, others 3."""
    if "-lr" in cell["name"]:
        return 0
    name = cell["name"].rsplit("-s", 1)[0]
    budget = next(d[name] for d in designed().values() if name in d)
    return 1 if leads(budget) else 2 if budget < min(FIRST_BUDGETS) else 3


@functools.cache  # phase() asks it once per cell
def designed() -> Dict[str, Dict[str, Optional[float]]]:
    """task → {stage-2 setting's run name without its seed: the budget it aims at (None: learned)}."""
    return {
        task: {f"{m}{t}-{task}-cpu": b for ms in families(steps).values() for m, t, _, b in ms if b != RATES_ONLY}
        for task, steps in TASKS.items()
    }


def window_limit(task: str, n: int, density: float, layers: int = 1) -> Optional[float]:
    """The exact Bayes limit of ``layers`` window layers (no causal mask) of ``density`` at length n, where the task
    has one: the best accuracy of a rule seeing the tokens within layers · w of each scored position (w keys each
    side). A second layer reaches w further, through the first: for the 2-layer models only layers=2 is a bound."""
    from baselines.window import window_for_density
    from bench.tasks import get_task

    limit = getattr(get_task(task), "window_limit", None)  # chain: none known
    return limit(n, min(layers * window_for_density(n, density, causal=False), n - 1)) if limit else None


# ------------------------------------------------------------------------------------------------ the statistic
def cost(record: dict, axis: str, full_flops: Optional[float]) -> Optional[float]:
    """A record's cost on ``axis``: computed pairs ÷ admissible, or attention FLOPs ÷ full attention's."""
    if axis == "pairs":
        return record.get("computed_pairs", record["density"])
    return record["flops_per_example"]["attention"] / full_flops if full_flops else None


def interval(differences: List[float], seed: int = 0) -> Tuple[float, float, float]:
    """(mean, 2.5%, 97.5%) of the mean of ``differences`` over BOOTSTRAP resamples of them (the seeds), from a
    fixed generator so that the table regenerates byte for byte."""
    rng, n = random.Random(seed), len(differences)
    means = sorted(sum(rng.choice(differences) for _ in range(n)) / n for _ in range(BOOTSTRAP))
    return statistics.fmean(differences), means[int(0.025 * BOOTSTRAP)], means[int(0.975 * BOOTSTRAP) - 1]


def verdict(low: float, high: float) -> str:
    return "pays" if low >= PAYS else "does not pay" if high <= DOES_NOT_PAY else "inconclusive"


def by_setting(records: List[dict]) -> Dict[Tuple[str, str, str], Dict[int, dict]]:
    """(task, family, label) → {seed: record} of the stage-2 settings."""
    names = {
        f"{m}{t}-{task}-cpu": (task, f, label) for m, task, _, t, seeds, _, f, label in settings() if seeds == SEEDS
    }
    groups = {}
    for r in records:
        key = names.get(r["folder"].name.rsplit("-s", 1)[0])
        if key:
            groups.setdefault(key, {})[r["seed"]] = r
    return groups


def best_within(groups, task: str, family: str, budget: float, axis: str, full_flops) -> Optional[Dict[int, dict]]:
    """The family's setting of best mean validation accuracy among those whose median cost is within the budget
    and that have every seed; None if there is none."""
    within = [
        runs
        for (t, f, _), runs in groups.items()
        if t == task
        and f == family
        and len(runs) == len(SEEDS)
        and statistics.median(cost(r, axis, full_flops) or float("inf") for r in runs.values()) <= SLACK * budget
    ]
    return max(within, key=lambda runs: statistics.fmean(r["valid"] for r in runs.values()), default=None)


def verdicts(records: List[dict], axis: str = "pairs", budgets: Optional[Tuple[float, ...]] = None) -> List[dict]:
    """Per task and budget: the best adaptive and the best fixed family within it, the paired difference of their
    test accuracy over the seeds with its interval, and the verdict the interval gives."""
    groups, rows, done = by_setting(records), [], {r["folder"].name for r in records}
    budgets = budgets or (BUDGETS if axis == "pairs" else FLOPS_BUDGETS)
    for task, aims in designed().items():
        full = groups.get((task, "dense", "full"), {})
        full_flops = statistics.median(r["flops_per_example"]["attention"] for r in full.values()) if full else None
        for budget in budgets:
            best = {}
            for kind, members in (("adaptive", ADAPTIVE), ("fixed", FIXED)):
                found = [(f, runs) for f in members if (runs := best_within(groups, task, f, budget, axis, full_flops))]
                best[kind] = max(
                    found, key=lambda fr: statistics.fmean(r["valid"] for r in fr[1].values()), default=None
                )
            # the runs of the design that may fall within the budget and are not recorded yet: until there are
            # none, a row's verdict is provisional
            waiting = sum(
                f"{name}-s{s}" not in done for name, aim in aims.items() if aim is None or aim <= budget for s in SEEDS
            )
            row = {"task": task, "budget": budget, "waiting": waiting, **{k: v and v[0] for k, v in best.items()}}
            if best["adaptive"] and best["fixed"]:
                (_, adaptive), (_, fixed) = best["adaptive"], best["fixed"]
                differences = [adaptive[s]["test"] - fixed[s]["test"] for s in SEEDS]
                mean, low, high = interval(differences)
                row.update(
                    mean=mean, low=low, high=high, wins=sum(d > 0 for d in differences), verdict=verdict(low, high)
                )
            rows.append(row)
    return rows


def lowest_reaching_full(records: List[dict]) -> List[list]:
    """Per task and family: the lowest median computed pairs whose median test accuracy is within MARGIN of full
    attention's, with the seeds that reach it."""
    groups, rows = by_setting(records), []
    for task in TASKS:
        full = groups.get((task, "dense", "full"))
        if not full:
            continue
        target = statistics.median(r["test"] for r in full.values()) - MARGIN
        for family in (*FIXED, *ADAPTIVE):
            reaching = sorted(
                (statistics.median(cost(r, "pairs", None) for r in runs.values()), label, runs)
                for (t, f, label), runs in groups.items()
                if t == task and f == family and statistics.median(r["test"] for r in runs.values()) >= target
            )
            pairs, label, runs = reaching[0] if reaching else (None, "–", {})
            seeds = f"{sum(r['test'] >= target for r in runs.values())}/{len(runs)}" if runs else "–"
            rows.append([task, family, "does not" if pairs is None else f"{100 * pairs:.1f}%", label, seeds])
    return rows


def verdict_table(records: List[dict], axis: str = "pairs", budgets: Optional[Tuple[float, ...]] = None) -> str:
    """The verdicts at matched cost on ``axis`` ("pairs" or "flops"), a Markdown table: without a verdict, "not run
    yet" (no record of the task), the runs to come or "–"; a verdict is provisional while runs are to come."""
    run = {task for task, _, _ in by_setting(records)}
    rows = [
        [
            r["task"],
            f"{100 * r['budget']:g}%",
            r["adaptive"] or "none within",
            r["fixed"] or "none within",
            *(
                (
                    f"{r['mean']:+.3f}",
                    f"[{r['low']:+.3f}, {r['high']:+.3f}]",
                    f"{r['wins']}/{len(SEEDS)}",
                    f"provisional (runs to come: {r['waiting']})" if r["waiting"] else r["verdict"],
                )
                if "mean" in r
                else ("–", "–", "–", "not run yet")
                if r["task"] not in run
                else ("–", "–", "–", f"runs to come: {r['waiting']}" if r["waiting"] else "–")
            ),
        ]
        for r in verdicts(records, axis, budgets)
    ]
    header = ["task", "budget", "best adaptive", "best fixed", "mean difference", "95% interval", "seeds won", ""]
    return tabulate(rows, header, "github", disable_numparse=True)


def records_table(records: List[dict]) -> str:
    header = ["task", "family", "lowest reaching full", "setting", "seeds"]
    return "\n\n".join(
        [
            f"At matched computed pairs:\n\n{verdict_table(records, 'pairs')}",
            f"At matched attention FLOPs ÷ full attention's:\n\n{verdict_table(records, 'flops')}",
            "The lowest computed pairs reaching full attention (within one point):",
            tabulate(lowest_reaching_full(records), header, "github", disable_numparse=True),
            "Learning rates (validation accuracy, test computed pairs; bold: kept):",
            learning_rates(records),
            spent(records),
        ]
    )


def spent(records: List[dict]) -> str:
    """Core-hours: each run's CPU and wall time on its one thread (cell.json: a resumed run's last process only)."""
    cpu, wall = (sum(r["cell"].get(key, 0) for r in records) / 3600 for key in ("cpu_s", "wall_s"))
    return f"Spent: {cpu:.1f} core-hours of CPU time ({wall:.1f} of wall time) in {len(records)} runs."


def learning_rates(records: List[dict]) -> str:
    """Stage 1, seed 0 on RATE_TASK: each family's first setting at every rate, validation accuracy (test computed
    pairs); in bold the rate its stage-2 cells on every task take. A family whose every rate stays within 0.01 of
    the base rate has learned nothing to choose by: its row says so; its cells take the best (the first of equals)."""
    runs, rows = {r["folder"].name: r for r in records}, []
    if not records:
        return "no learning-rate run yet"
    folder = records[0]["folder"].parent
    for rated, family in dict.fromkeys((o["lr"], f) for _, _, o, _, s, _, f, _ in settings() if s == SEEDS):
        kept, rs = rated.resolve(folder), [runs.get(f"{name}-s0") for name in rated.cells]
        cells = [
            "–"
            if r is None
            else ("**{}**" if rate(r) == kept else "{}").format(f"{r['valid']:.4f} ({cost(r, 'pairs', None):.3f})")
            for r in rs
        ]
        blind = all(r is not None and r["valid"] <= r["base_rate"] + 0.01 for r in rs[: len(LEARNING_RATES)])
        rows.append([family, rated.cells[0].split("-lr")[0], *cells, "at the base rate" if blind else ""])
    header = [
        "family",
        f"setting on {RATE_TASK}, seed 0",
        *(f"lr {lr}" for lr in LEARNING_RATES),
        "beyond the edge",
        "",
    ]
    return tabulate(rows, header, "github", disable_numparse=True)


def calibration_table(folder: Path) -> str:
    """The recipe's check before any sweep: each calibration run in FOLDER/calibration (full attention unless its
    name says otherwise, one seed), the first evaluation at which validation reached 0.99, and where it ended."""
    rows = []
    for run in sorted((folder / "calibration").glob("*")):
        record = read_json(run / "metrics.json") or {}
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
        evals = [e for e in log if e["split"] == "valid"]
        first = next((e["step"] for e in evals if e["metric"] >= 0.99), None)
        cfg = record.get("config") or {}
        rows.append(
            [
                run.name,
                f"{cfg.get('steps', '?')}, {cfg.get('lr', '?')}",
                "not reached" if first is None else first,
                f"{record['valid']:.4f}"
                if record
                else f"{evals[-1]['metric']:.4f} at step {evals[-1]['step']} (stopped)",
                f"{record['test']:.4f}" if record else "–",
                f"{record['base_rate']:.4f}" if record else "–",
            ]
        )
    header = ["run", "steps, lr", "validation ≥ 0.99 from step", "validation", "test", "base rate"]
    return "Calibration (each run's command in its record's config):\n\n" + tabulate(
        rows, header, "github", disable_numparse=True
    )


def rule(folder: Path) -> Tuple[str, str]:
    """The verdicts at matched computed pairs: where the paired interval says learning where to look pays."""
    rows = [r for r in verdicts(load(folder)[0]) if "verdict" in r and not r["waiting"]]
    if not rows:
        return "no task and budget with every run in yet", "no information at this budget"
    pays = [f"{r['task']} {100 * r['budget']:g}%" for r in rows if r["verdict"] == "pays"]
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("pays", "inconclusive", "does not pay")}
    ours = f"{len(rows)} task × budget cells: " + ", ".join(f"{v} {n}" for v, n in counts.items())
    return ours, f"adaptivity pays at {', '.join(pays)}" if pays else "adaptivity does not pay at any budget"


CLAIM = Claim(
    "matched-cost",
    "Matched cost: adaptive against fixed sparsity at equal computed pairs, paired by seed",
    "runs",
    paper="SBM §5.1: on duplicates the model must perform full attention; neither SBM's paper nor Reformer's "
    "compares with fixed patterns at the same cost. The field compares at matched FLOPs (The Sparse Frontier, "
    "arXiv 2504.17768; MoSA, arXiv 2505.00315) with routers that keep a local path (MoBA, arXiv 2502.13189; NSA, "
    "arXiv 2502.11089).",
    runs=tuple(Setting(m, t, "cpu", o, tag) for m, t, o, tag, seeds, *_ in settings() if seeds[1:]),
    once=tuple(Setting(m, t, "cpu", o, tag) for m, t, o, tag, seeds, *_ in settings() if not seeds[1:]),
    seeds=SEEDS,
    rule=rule,
    figure="no figure: a comparison the papers do not make",
    notes=[
        "Per task and budget: the best adaptive family (Reformer, the block router, SBM, window heads beside one "
        "adaptive head) and the best fixed one (window, BigBird, head and layer allocations) within the budget, "
        "the mean paired difference of test accuracy over 5 seeds and its 95% bootstrap interval; pays where the "
        "interval's lower bound is ≥ +0.05, does not pay where its upper bound is ≤ +0.01."
    ],
    table=records_table,
    calibration=calibration_table,
    figures=("matched-cost",),
    phase=phase,
)
