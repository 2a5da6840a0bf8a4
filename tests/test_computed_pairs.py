"""Computed pairs (bench/measure.py, INTERFACE.md): the pairs each attention's kernel scores, per head, as a fraction
of the admissible pairs, checked for every registered method against a count by hand at N = 16, and carried to the
backbone's stats and the run record. Admissible pairs at N = 16 without padding: 256, or 16·17/2 = 136 causal."""

import json

import pytest
import torch

from baselines.bigbird import BigBirdAttention
from baselines.full import FullAttention
from baselines.hybrid import HybridAttention
from baselines.linear import LinearAttention
from baselines.linformer import LinformerAttention
from baselines.moba import MoBAAttention
from baselines.nystromformer import NystromAttention
from baselines.performer import PerformerAttention
from baselines.reformer import ReformerAttention
from baselines.window import WindowAttention
from bench import measure
from bench import train as harness
from bench.methods import available
from conftest import exit_code
from kernel_sparse import KernelSparseAttention
from sbm_transformer import SBMAttention
from ssa import SSAttention

N, DIM, H, D = 16, 8, 2, 4


def computed(module, causal: bool, pad=None, seed: int = 0) -> torch.Tensor:
    """(H,) measure.computed_pairs of one forward on (2, N, DIM) inputs."""
    torch.manual_seed(seed)
    x = torch.randn(2, N, DIM)
    _, stats = module(x, pad, causal, torch.Generator().manual_seed(seed))
    return measure.computed_pairs(stats, pad, causal, N)


def test_every_registered_method_is_counted_here():
    counted = {"full", "linear", "performer", "linformer", "nystromformer", "reformer", "window", "bigbird", "moba"}
    counted |= {"hybrid"}
    assert set(available()) == counted | {"sbm", "ssa", "kernel"}


@pytest.mark.parametrize("causal", [False, True])
def test_dense_methods_compute_every_admissible_pair(causal):
    """Full attention scores every admissible pair; the low-rank and kernel methods touch each once through their
    products (the convention). Causal full attention's density is 136/256, its computed pairs 1. With example 1's
    keys 10-15 padded, admissible pairs are 256 + 100 (causal 136 + 55): still all of them."""
    pad = torch.zeros(2, N, dtype=torch.bool)
    pad[1, 10:] = True
    modules = [FullAttention(DIM, H, D), LinearAttention(DIM, H, D), PerformerAttention(DIM, H, D, features=8)]
    if not causal:
        modules += [LinformerAttention(DIM, H, D, rank=4, max_len=N), NystromAttention(DIM, H, D, landmarks=4)]
    for module in modules:
        for mask in (None, pad):
            assert computed(module, causal, mask).tolist() == pytest.approx([1.0] * H), type(module).__name__


@pytest.mark.parametrize(
    "rounds, chunk, expected, expected_causal",
    [
        # R·2C = 4 keys a query: 16·4 = 64 of 256; causal min(4, i + 1): 1 + 2 + 3 + 13·4 = 58 of 136
        (1, 2, 64 / 256, 58 / 136),
        # R·2C = 8: 128 of 256; causal 1 + … + 8 + 8·8 = 100 of 136
        (2, 2, 128 / 256, 100 / 136),
        # R·2C = 32 ≥ N: every admissible key
        (2, 8, 1.0, 1.0),
    ],
)
def test_reformer_scores_rounds_times_two_chunks_capped_at_the_admissible_keys(
    rounds, chunk, expected, expected_causal
):
    module = ReformerAttention(DIM, H, D, n_hashes=rounds, bucket_size=chunk)
    assert computed(module, False).tolist() == pytest.approx([expected] * H)
    assert computed(module, True).tolist() == pytest.approx([expected_causal] * H)


def test_reformer_with_padding_counts_valid_queries_against_their_valid_keys():
    """R·2C = 4; example 1 has 10 valid tokens: (16·4 + 10·4) / (256 + 100). Duplicates count, distinct pairs
    (the density) do not: the computed pairs are at least the density's."""
    pad = torch.zeros(2, N, dtype=torch.bool)
    pad[1, 10:] = True
    module = ReformerAttention(DIM, H, D, n_hashes=1, bucket_size=2)
    assert computed(module, False, pad).tolist() == pytest.approx([104 / 356] * H)
    module = ReformerAttention(DIM, H, D, n_hashes=3, bucket_size=2)
    _, stats = module(torch.randn(2, N, DIM), None, False, torch.Generator().manual_seed(0))
    assert stats["computed_pairs"].shape == (H,) and not stats["computed_pairs"].requires_grad
    assert (stats["computed_pairs"] >= stats["density"]).all()


@pytest.mark.parametrize("causal, expected", [(False, 74 / 256), (True, 45 / 136)])
def test_window_scores_its_band_and_a_head_allocation_its_heads(causal, expected):
    """w = 2: 16 queries × 5 keys less the 2·3 cut at the edges = 74; causal min(i + 1, 3): 1 + 2 + 14·3 = 45. A head
    allocation with one full head: [1, band], the layer's mean their mean."""
    assert computed(WindowAttention(DIM, H, D, window=2), causal).tolist() == pytest.approx([expected] * H)
    allocation = computed(WindowAttention(DIM, H, D, window=2, full_heads=1), causal)
    assert allocation.tolist() == pytest.approx([1.0, expected])


def test_a_hybrid_reports_its_window_heads_then_its_adaptive_heads():
    """One window head at a target density of 0.289: w = 2 (74 of 256); causal w = 4, 16·5 − 10 = 70 of 256, so
    70 of 136. One Reformer head, R·2C = 4: 64 of 256, causal 58 of 136 (as above)."""
    module = HybridAttention(DIM, H, D, adaptive="reformer", density=0.289, budget="n_hashes=1;bucket_size=2")
    assert computed(module, False).tolist() == pytest.approx([74 / 256, 64 / 256])
    assert computed(module, True).tolist() == pytest.approx([70 / 136, 58 / 136])


@pytest.mark.parametrize(
    "random_blocks, expected, expected_causal",
    [
        # 4 blocks of 4, block 0 global, no window beyond the diagonal: block pairs row 0 (4), column 0 (3) and the
        # diagonal (3) = 10 × 16 = 160; causal: (0, 0) and 3 diagonal blocks as triangles of 10, 3 × 16 below = 88
        (0, 160 / 256, 88 / 136),
        # one random block: rows 1-3 have 2 candidates each, +3 × 16 = 208; causal: rows 2 and 3 have earlier
        # candidates (row 1's only earlier block is global), +2 × 16 = 120
        (1, 208 / 256, 120 / 136),
    ],
)
def test_bigbird_scores_its_blocks(random_blocks, expected, expected_causal):
    module = BigBirdAttention(DIM, H, D, block=4, window_blocks=0, global_blocks=1, random_blocks=random_blocks)
    assert computed(module, False).tolist() == pytest.approx([expected] * H)
    assert computed(module, True).tolist() == pytest.approx([expected_causal] * H)


def test_moba_scores_its_own_block_and_its_routed_blocks():
    """Blocks of 4, k = 1: 4 + 4 keys a query, 128 of 256, whatever the routing; causal: own blocks as triangles
    (10 pairs each, 40) and blocks 1-3 route to one earlier block (3 × 16 = 48): 88 of 136."""
    for path in ("fast", "reference"):
        module = MoBAAttention(DIM, H, D, block=4, topk=1, path=path)
        assert computed(module, False).tolist() == pytest.approx([128 / 256] * H)
        assert computed(module, True).tolist() == pytest.approx([88 / 136] * H)


@pytest.mark.parametrize("causal", [False, True])
def test_ssa_scores_its_sampled_keys(causal):
    """4 windows of 4 queries. σ = 0 draws each window's own 4 positions: 16·4 = 64 of 256; causal, the positions up
    to the query: 4 × (1 + 2 + 3 + 4) = 40 of 136. σ = 1 draws 4 sources a window from the same generator: counted
    here source by source."""
    local = SSAttention(DIM, H, D, windows=4, sigma=0.0, sampling="always", alibi=False)
    assert computed(local, causal).tolist() == pytest.approx([(40 / 136 if causal else 64 / 256)] * H)
    spread = SSAttention(DIM, H, D, windows=4, sigma=1.0, sampling="always", alibi=False)
    sources = spread.draw_sources(N, causal, torch.Generator().manual_seed(0))  # (W, K)
    pairs = sum(int(s) <= i or not causal for i in range(N) for s in sources[i // 4])
    assert computed(spread, causal).tolist() == pytest.approx([pairs / (136 if causal else 256)] * H)


@pytest.mark.parametrize("causal", [False, True])
def test_sbm_scores_its_sampled_edges(causal):
    """The graph the forward samples, its edges counted per head over both examples."""
    module = SBMAttention(DIM, H, D, clusters=4, path="reference")
    graphs = []
    sample = module.sample
    module.sample = lambda *args: graphs.append(sample(*args)) or graphs[-1]
    result = computed(module, causal)
    edges = graphs[0]["mask"].sum((0, 2, 3)).double()  # (H,)
    assert result.tolist() == pytest.approx((edges / (2 * (136 if causal else 256))).tolist())
    assert 0 < result.min() and result.max() <= 1


@pytest.mark.parametrize("causal", [False, True])
def test_the_kernel_method_scores_its_selected_keys(causal):
    """The mask the predictor's selection gives, its keys counted per head over both examples."""
    module = KernelSparseAttention(DIM, H, D, max_len=N, hidden=8, select="topk", top_k=1, path="reference")
    masks = []
    mask = module.predictor.bank.mask
    module.predictor.bank.mask = lambda *args: masks.append(mask(*args)) or masks[-1]
    result = computed(module, causal)
    keys = masks[0].sum((0, 2, 3)).double()  # (H,)
    assert result.tolist() == pytest.approx((keys / (2 * (136 if causal else 256))).tolist())
    assert 0 < result.max() < 1  # a selection, not every key (causal: a head may select only forward kernels, all cut)


def test_the_record_holds_the_computed_pairs_mean_and_per_layer(tmp_path, monkeypatch, capsys):
    """Reformer, R·2C = 4 on the duplicates task at 16 tokens (no padding, no causal mask): 64 of 256 in each
    layer, above its distinct pairs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPARSE_ATTN_OFFLINE", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    tiny = "--seq-len 16 --dim 16 --heads 2 --head-dim 8 --mlp-dim 16 --depth 2 --batch-size 4 --warmup 2"
    args = ["--method", "reformer", "--task", "duplicates", "--attn", "n_hashes=1", "--attn", "bucket_size=2"]
    args += [*tiny.split(), "--steps", "2", "--eval-batches", "1", "--final-eval-batches", "1", "--out", "run"]
    assert exit_code(harness.main, args) == 0, capsys.readouterr()
    record = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert record["computed_pairs"] == pytest.approx(0.25)
    assert record["computed_pairs_per_layer"] == pytest.approx([0.25, 0.25])
    assert record["density"] <= record["computed_pairs"]
