"""The matched-cost claim's statistic (experiments/claims/matched_cost.py): the paired bootstrap interval, the
verdict words from it alone, each family's best setting within a budget chosen on validation, and the learning
rate one step beyond an edge. Records are made by hand here; the claim's own records are read by the report."""

import json
from pathlib import Path

import pytest

from experiments.claims import matched_cost as mc
from experiments.claims.claim import SKIP


def record(name: str, seed: int, test: float, pairs: float, valid=None, flops=1.0) -> dict:
    return {
        "folder": Path("runs") / f"{name}-cpu-s{seed}",
        "seed": seed,
        "test": test,
        "valid": test if valid is None else valid,
        "density": pairs,
        "computed_pairs": pairs,
        "flops_per_example": {"attention": flops},
    }


def setting(name: str, tests, pairs: float, **kw) -> list:
    return [record(name, s, t, pairs, **kw) for s, t in zip(mc.SEEDS, tests)]


def test_the_interval_is_the_bootstrap_of_the_mean_over_seeds_and_regenerates_exactly():
    assert mc.interval([0.2] * 5) == (0.2, 0.2, 0.2)
    mean, low, high = mc.interval([0.1, 0.2, 0.3, 0.4, 0.5])
    assert mean == pytest.approx(0.3) and 0.1 < low < 0.3 < high < 0.5
    assert mc.interval([0.1, 0.2, 0.3, 0.4, 0.5]) == (mean, low, high)
    assert high - low == pytest.approx(2 * 1.96 * (0.02 / 5) ** 0.5, rel=0.15)  # the normal approximation's width


@pytest.mark.parametrize(
    "low, high, words",
    [(0.05, 0.3, "pays"), (0.049, 0.3, "inconclusive"), (-0.2, 0.01, "does not pay"), (-0.2, 0.011, "inconclusive")],
)
def test_the_verdict_words_come_from_the_interval_alone(low, high, words):
    assert mc.verdict(low, high) == words


def test_at_each_budget_the_best_family_within_it_by_validation_is_compared_seed_by_seed():
    """ngram: a window at 12.5% scores 0.30, Reformer at 12.5% 0.90 (seed by seed +0.6: pays); BigBird at 13.7%
    (within 1.1 × 12.5%) has the better test but the worse validation, so the window is the fixed family's
    choice; nothing is within 6.25%; at 25% a head allocation ties Reformer (does not pay)."""
    records = [
        *setting("full-ngram", [1.0] * 5, 1.0),
        *setting("window-d0.125-ngram", [0.3] * 5, 0.125),
        *setting("bigbird-d0.125-ngram", [0.35] * 5, 0.137, valid=0.2),
        *setting("reformer-h1-b8-ngram", [0.9, 0.91, 0.89, 0.9, 0.9], 0.125),
        *setting("window-full1-d0.125-ngram", [0.9, 0.91, 0.89, 0.9, 0.9], 0.23),
    ]
    rows = {(r["task"], r["budget"]): r for r in mc.verdicts(records)}
    at = rows["ngram", 0.125]
    assert (at["adaptive"], at["fixed"], at["verdict"], at["wins"]) == ("reformer", "window", "pays", 5)
    assert at["mean"] == pytest.approx(0.6)
    assert "verdict" not in rows["ngram", 0.0625] and rows["ngram", 0.0625]["fixed"] is None
    assert (rows["ngram", 0.25]["fixed"], rows["ngram", 0.25]["verdict"]) == ("head allocation", "does not pay")
    assert all("verdict" not in r for (task, _), r in rows.items() if task != "ngram")


def test_a_setting_missing_a_seed_is_not_compared():
    records = [*setting("window-d0.125-ngram", [0.3] * 5, 0.125), *setting("reformer-h1-b8-ngram", [0.9] * 4, 0.125)]
    assert all("verdict" not in r for r in mc.verdicts(records))


def test_at_matched_flops_the_budget_is_a_fraction_of_full_attention_s_attention_flops():
    records = [
        *setting("full-ngram", [1.0] * 5, 1.0, flops=100.0),
        *setting("window-d0.125-ngram", [0.3] * 5, 0.125, flops=52.0),
        *setting("reformer-h1-b8-ngram", [0.9] * 5, 0.125, flops=60.0),
    ]
    rows = {(r["task"], r["budget"]): r for r in mc.verdicts(records, "flops")}
    assert [b for t, b in rows if t == "ngram"] == list(mc.FLOPS_BUDGETS)  # the projections' half is every family's
    assert (rows["ngram", 0.5]["fixed"], rows["ngram", 0.5]["adaptive"]) == ("window", None)
    assert rows["ngram", 0.625]["verdict"] == "pays"


def write(runs: Path, name: str, lr: str, valid: float) -> None:
    folder = runs / f"{name}-s0"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"status": "complete", "valid": valid, "config": {"lr": lr}}))


@pytest.mark.parametrize("best, beyond", [("1e-2", "3e-2"), ("3e-4", "1e-4"), ("1e-3", SKIP)])
def test_one_rate_beyond_the_edge_where_the_best_of_four_sits_there(tmp_path, best, beyond):
    cells = tuple(f"reformer-h1-b8-lr{lr}-ngram-cpu" for lr in (*mc.LEARNING_RATES, "beyond"))
    for lr in mc.LEARNING_RATES:
        write(tmp_path, f"reformer-h1-b8-lr{lr}-ngram-cpu", lr, 0.9 if lr == best else 0.5)
    assert mc.BestLearningRate(cells[:-1], beyond=True).resolve(tmp_path) == beyond
    chosen = mc.BestLearningRate(cells)
    if beyond == SKIP:
        assert chosen.resolve(tmp_path) == best
        return
    assert chosen.resolve(tmp_path) is None  # it waits for the fifth
    write(tmp_path, cells[-1], beyond, 0.95)
    assert chosen.resolve(tmp_path) == beyond


def test_the_claim_s_cells_drop_a_needless_fifth_rate_and_every_family_is_fixed_or_adaptive(tmp_path):
    """Rates are run on recall only, and every task's cells take recall's best; the first budgets come first."""
    families = mc.families(100)
    assert set(families) == {"dense", *mc.FIXED, *mc.ADAPTIVE} and not set(mc.FIXED) & set(mc.ADAPTIVE)
    runs = tmp_path / "runs"
    for lr in mc.LEARNING_RATES:
        write(runs, f"full-lr{lr}-recall-cpu", lr, 0.9 if lr == "1e-3" else 0.5)
    cells = mc.CLAIM.cells(runs)
    names = [c["name"] for c in cells]
    assert "full-lrbeyond-recall-cpu-s0" not in names and "window-d0.125-lrbeyond-recall-cpu-s0" in names
    assert not [n for n in names if "-lr" in n and "-recall-" not in n]
    for name in ("full-ngram-cpu-s3", "full-duplicates-cpu-s0"):
        full = next(c for c in cells if c["name"] == name)
        assert full["command"][full["command"].index("--lr") + 1] == "1e-3" and "waiting" not in full
    assert "waiting" in next(c for c in cells if c["name"] == "window-d0.125-ngram-cpu-s0")
    first, later = names.index("window-d0.25-ngram-cpu-s4"), names.index("window-d0.5-duplicates-cpu-s0")
    assert first < later  # every task's 12.5% and 25% before any task's 6.25% and 50%


def test_each_setting_s_computed_pairs_at_128_tokens_are_within_the_budget_it_aims_at():
    """The stated budget of every fixed and routed setting against its attention's own computed pairs, by hand:
    a window of w keys each side scores min(i, w) + min(n-1-i, w) + 1 keys of row i; Reformer R · 2C; MoBA (k+1)·B."""
    n = 128
    for family, members in mc.families(100).items():
        for method, tag, options, budget in members:
            attn = dict(o.split("=", 1) for o in options.get("attn", []))
            if method == "moba":
                pairs = (int(attn["topk"]) + 1) * int(attn["block"]) / n
            elif method == "reformer":
                pairs = int(attn["n_hashes"]) * 2 * int(attn["bucket_size"]) / n
            elif method == "window" and "full_heads" not in attn and "full_layers" not in attn:
                from baselines.window import window_for_density

                w = window_for_density(n, float(attn["density"]), causal=False)
                pairs = sum(min(i, w) + min(n - 1 - i, w) + 1 for i in range(n)) / n**2
            else:
                continue
            assert budget / 2 < pairs <= mc.SLACK * budget, (family, tag, pairs, budget)


@pytest.mark.parametrize("task", ["duplicates", "recall"])
def test_a_window_s_bayes_limit_is_what_its_rule_scores_on_the_task_s_own_data(task):
    """The rule the limit assumes, applied to 2,000 generated sequences of 64 tokens with a 40% window: its accuracy
    is the limit within 5σ. Duplicates: 1 where the window holds the value, else the likelier label; recall: the
    pair's value where the window holds the pair, else a fixed guess."""
    import torch

    from baselines.window import window_for_density
    from bench.tasks import IGNORE, get_task

    n, density = 64, 0.4
    w, data = window_for_density(n, density, causal=False), get_task(task)
    data.setup(n, seed=0, data_dir=Path("."))
    batch = data.train_batch(2000, torch.Generator().manual_seed(9))
    tokens, targets = batch["tokens"], batch["targets"]
    i = torch.arange(n)
    near = ((i[:, None] - i[None, :]).abs() <= w) & (i[:, None] != i[None, :])  # (N, M): the others in the window
    if task == "duplicates":
        same = tokens[:, :, None] == tokens[:, None, :]  # (B, N, M)
        seen = (same & near).any(-1)
        guess = torch.where(seen, 1, (1 - (1 - 1 / n) ** (n - 1 - near.sum(1)) > 0.5).long())
        hits = (guess == targets).double()
    else:
        first = data.KEYS + 1
        pair_key = torch.where(tokens >= first, (tokens - first) // data.VALUES + 1, -1)  # (B, N): a pair's key
        holds = (pair_key[:, None, :] == tokens[:, :, None]) & near  # (B, N, M): the question's pair in the window
        value = ((tokens - first) % data.VALUES)[:, None, :].expand_as(holds)
        guess = torch.where(holds.any(-1), (value * holds).sum(-1), 0)
        scored = targets != IGNORE
        hits = (guess[scored] == targets[scored]).double()
    limit = mc.window_limit(task, n, density)
    sigma = (limit * (1 - limit) / hits.numel()) ** 0.5
    assert abs(hits.mean().item() - limit) < 5 * sigma, (hits.mean().item(), limit)


def test_two_window_layers_reach_twice_as_far_so_their_limit_is_the_one_at_twice_the_width():
    """Every output of two residual window layers of w keys each side depends on exactly the inputs within 2w of its
    position: what the layers=2 limit assumes (the MLP between them works per position)."""
    import torch

    from baselines.window import WindowAttention, window_for_density
    from bench.tasks import get_task

    n, w = 40, window_for_density(40, 0.25, causal=False)
    layers = [WindowAttention(8, 2, 4, window=w).double() for _ in range(2)]
    x = torch.randn(1, n, 8, dtype=torch.double, requires_grad=True)
    y = x
    for layer in layers:
        y = y + layer(y, None, False)[0]
    for i in (0, n // 2):
        (grad,) = torch.autograd.grad(y[0, i].sum(), x, retain_graph=True)
        reached = grad[0].abs().sum(-1) > 0
        assert reached.tolist() == [abs(i - j) <= 2 * w for j in range(n)], i
    recall = get_task("recall")
    assert mc.window_limit("recall", n, 0.25, layers=2) == recall.window_limit(n, 2 * w) > recall.window_limit(n, w)


def test_the_duplicates_limit_is_the_published_figure_and_ngram_s_is_exact_from_its_offset():
    assert mc.window_limit("duplicates", 64, 0.4) == pytest.approx(0.697, abs=5e-4)
    assert mc.window_limit("ngram", 128, 0.0625) == 1.0 and mc.window_limit("ngram", 128, 0.01) < 0.5
    assert mc.window_limit("chain", 128, 0.25) is None


def test_a_verdict_is_provisional_until_every_run_of_the_design_within_its_budget_is_recorded():
    """The runs that may fall within a budget: every setting aimed at or below it and every one whose density is
    learned. With one of them missing a seed, the row says how many runs are to come, and the rule counts no verdict."""
    aims = mc.designed()["ngram"]
    within = [name for name, aim in aims.items() if aim is None or aim <= 0.125]
    assert (
        "full-ngram-cpu" not in within
        and "sbm-lambda1e-1-ngram-cpu" in within
        and "window-d0.25-ngram-cpu" not in within
    )
    records = [
        record(name.removesuffix("-cpu"), s, 0.9 if name.startswith("reformer") else 0.3, 0.125)
        for name in within
        for s in mc.SEEDS
    ]
    rows = {(r["task"], r["budget"]): r for r in mc.verdicts(records)}
    assert (rows["ngram", 0.125]["waiting"], rows["ngram", 0.125]["verdict"]) == (0, "pays")
    quarter = [name for name, aim in aims.items() if aim is not None and 0.125 < aim <= 0.25]
    assert "window-d0.25-ngram-cpu" in quarter and rows["ngram", 0.25]["waiting"] == len(quarter) * len(mc.SEEDS)
    said = {line.split("|")[2].strip(): line.split("|")[-2].strip() for line in mc.verdict_table(records).splitlines()}
    assert (said["12.5%"], said["25%"]) == ("pays", f"provisional (runs to come: {5 * len(quarter)})")
    rows = {(r["task"], r["budget"]): r for r in mc.verdicts(records[1:])}
    assert rows["ngram", 0.125]["waiting"] == 1 and "provisional (runs to come: 1)" in mc.verdict_table(records[1:])
