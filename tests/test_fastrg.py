"""Tests for fastrg.py: distribution (Monte Carlo with derived tolerances), structure, edge cases, errors.

Statistical tests draw T independent graphs in one call (the same X, S, Y broadcast over a leading dim of
size T) with a fixed seed. Every tolerance is Z = 5 standard deviations of the statistic under the exact
law, computed from Poisson or binomial variances (a two-sided 5σ normal tail is 5.7e-7 per statistic).
"""

import math

import numpy as np
import pytest
import torch

import fastrg
from conftest import seeded
from fastrg import edge_probability, expected_edges, sample

CPU = torch.device("cpu")

Z = 5.0
T = 10_000  # graphs per Monte Carlo test: every count compared below has mean ≥ 200 (normal regime)


@pytest.fixture(autouse=True)
def _one_thread():
    """Single intra-op thread: the tensors here are small, and on a shared CPU extra threads mostly wait."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _random_factors(seed, n=5, m=6, K=3, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, K, generator=g) + 0.1
    S = (torch.rand(K, K, generator=g) + 0.1) * scale
    Y = torch.rand(m, K, generator=g) + 0.1
    return X, S, Y


def _batch(X, S, Y, t=T):
    """The same graph model t times: (t, n, K), S, (t, m, K)."""
    return X.expand(t, *X.shape), S, Y.expand(t, *Y.shape)


def _pair_counts(i, j, n, m):
    return torch.bincount(i * m + j, minlength=n * m).view(n, m).double()


# ------------------------------------------------------------------------------------------- distribution
def test_total_count_mean_and_variance_match_poisson():
    X, S, Y = _random_factors(0)
    lam = float(expected_edges(X, S, Y))
    r, _, _ = sample(*_batch(X, S, Y), generator=torch.Generator().manual_seed(1), dedup=False)
    N = torch.bincount(r, minlength=T).double()  # (T,) edges per graph, each Poisson(Σλ)
    assert abs(float(N.mean()) - lam) <= Z * math.sqrt(lam / T)
    # Variance of the sample variance of T Poisson(λ) draws: (μ4 − σ⁴(T−3)/(T−1))/T, μ4 = λ + 3λ².
    var_s2 = (lam + 3 * lam**2 - lam**2 * (T - 3) / (T - 1)) / T
    assert abs(float(N.var()) - lam) <= Z * math.sqrt(var_s2)


def test_dedup_total_count_is_sum_of_bernoullis():
    X, S, Y = _random_factors(2, scale=2.0)
    p = edge_probability(X, S, Y)[0]
    mean, var = float(p.sum()), float((p * (1 - p)).sum())
    r, _, _ = sample(*_batch(X, S, Y), generator=torch.Generator().manual_seed(3))
    N = torch.bincount(r, minlength=T).double()
    assert abs(float(N.mean()) - mean) <= Z * math.sqrt(var / T)
    assert float(N.max()) <= X.shape[0] * Y.shape[0]


def test_multigraph_pair_counts_match_lambda():
    X, S, Y = _random_factors(4, n=7, m=5, K=4)
    lam = edge_probability(X, S, Y, dedup=False)[0]
    _, i, j = sample(*_batch(X, S, Y), generator=torch.Generator().manual_seed(5), dedup=False)
    c = _pair_counts(i, j, 7, 5)  # sum of T independent Poisson(λ_ij): Poisson(T·λ_ij)
    z = (c - T * lam) / (T * lam).sqrt()
    assert float(z.abs().max()) <= Z


def test_dedup_pair_frequencies_match_one_minus_exp():
    X, S, Y = _random_factors(6, n=6, m=4, K=3, scale=1.5)  # λ from 1.7 to 3.5: far from p = λ
    lam = edge_probability(X, S, Y, dedup=False)[0]
    p = edge_probability(X, S, Y)[0]
    assert torch.allclose(p, 1 - torch.exp(-lam))
    _, i, j = sample(*_batch(X, S, Y), generator=torch.Generator().manual_seed(7))
    c = _pair_counts(i, j, 6, 4)  # Binomial(T, 1 − e^{−λ}) per pair
    sd = (T * p * (1 - p)).sqrt()
    assert float(((c - T * p) / sd).abs().max()) <= Z
    # The paper's reading p = λ is rejected where λ is not small.
    big = lam > 0.5
    assert big.any()
    assert bool((((c - T * lam.clamp(max=1)) / sd).abs() > Z)[big].all())


def test_long_uneven_column_has_no_prefix_sum_drift():
    # n = 16384 sources: 16 of weight 1, then 16368 of weight w = 0.75·2⁻¹⁹ (exact in float32), one key. Summed in
    # float32, the running sum sits in [16, 32), whose unit in the last place is 2⁻¹⁹: every w rounds up to it,
    # +33%, so a float32 CDF would give the tail a third more edges. Edges per row-block over 8 graphs (about 5.2M
    # proposals) against edge_probability's Σp with variance Σp(1 − p), the head and 4 tail blocks; and the drift
    # such a CDF would show, computed, is beyond 2Z in every tail block: the test would catch it.
    n, head, graphs = 16384, 16, 8
    w = torch.full((n, 1), 0.75 * 2.0**-19)
    w[:head] = 1.0
    S = torch.tensor([[5.2e6 / graphs / float(w.double().sum())]])
    Y = torch.ones(1, 1)
    p = edge_probability(w, S, Y)[0, :, 0]  # (n,) P(edge i → 0)
    row_ptr, *_ = fastrg.sample_block_csr(w.expand(graphs, n, 1), S, Y, generator=torch.Generator().manual_seed(54))
    per_row = row_ptr.diff().view(graphs, n).sum(0).double()  # (n,) over the graphs
    bounds = [0, head] + [head + k * (n - head) // 4 for k in range(1, 5)]
    w32 = torch.from_numpy(np.diff(np.cumsum(w[:, 0].numpy()), prepend=0)).double()  # float32 running sum
    p32 = -torch.expm1(-w32 / w32.sum() * float(S) * float(w.double().sum()))
    for a, b in zip(bounds[:-1], bounds[1:]):
        mean, sd = graphs * float(p[a:b].sum()), math.sqrt(graphs * float((p[a:b] * (1 - p[a:b])).sum()))
        assert abs(float(per_row[a:b].sum()) - mean) <= Z * max(sd, 1e-9)
        if a >= head:
            assert graphs * float(p32[a:b].sum()) - mean > 2 * Z * sd


def test_joint_pairing_zero_diagonal_never_within_cluster():
    # One-hot memberships, block matrix with a zero diagonal: a within-cluster edge has λ = 0. A sampler that
    # draws sources by u and destinations by v separately and zips them (the official code's bug) emits many.
    K = 3
    zx = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    zy = torch.tensor([2, 1, 0, 0, 1, 2])
    X, Y = torch.eye(K)[zx], torch.eye(K)[zy]
    S = torch.tensor([[0.0, 0.5, 0.2], [0.3, 0.0, 0.4], [0.1, 0.6, 0.0]])
    for dedup in (False, True):
        _, i, j = sample(*_batch(X, S, Y, 5000), generator=torch.Generator().manual_seed(8), dedup=dedup)
        assert len(i) > 10_000
        assert not bool((zx[i] == zy[j]).any())


def test_block_counts_with_asymmetric_S():
    K = 3
    zx = torch.tensor([0, 0, 0, 1, 1, 2])
    zy = torch.tensor([0, 1, 1, 1, 2, 2, 2])
    X, Y = torch.eye(K)[zx], torch.eye(K)[zy]
    S = torch.tensor([[0.05, 0.30, 0.02], [0.01, 0.20, 0.40], [0.25, 0.03, 0.10]])
    _, i, j = sample(*_batch(X, S, Y), generator=torch.Generator().manual_seed(9), dedup=False)
    counts = torch.bincount(zx[i] * K + zy[j], minlength=K * K).view(K, K).double()
    mean = T * torch.bincount(zx, minlength=K)[:, None] * S * torch.bincount(zy, minlength=K)[None, :]
    assert float(((counts - mean) / mean.sqrt()).abs().max()) <= Z
    assert not torch.allclose(mean, mean.T)  # the test distinguishes (u, v) from (v, u)


def test_mixed_membership_pair_counts_with_sparse_support():
    # Zero entries in X and Y (mixed membership with holes): frequencies still match λ, and no edge has λ = 0.
    g = torch.Generator().manual_seed(10)
    X = torch.rand(6, 4, generator=g) * (torch.rand(6, 4, generator=g) > 0.4)
    Y = torch.rand(5, 4, generator=g) * (torch.rand(5, 4, generator=g) > 0.4)
    X[2] = 0  # a query with no membership at all
    S = torch.rand(4, 4, generator=g)
    lam = edge_probability(X, S, Y, dedup=False)[0]
    _, i, j = sample(*_batch(X, S, Y), generator=g, dedup=False)
    assert bool((lam[i, j] > 0).all())
    c = _pair_counts(i, j, 6, 5)
    pos = lam > 0
    z = (c[pos] - T * lam[pos]) / (T * lam[pos]).sqrt()
    assert float(z.abs().max()) <= Z


@pytest.mark.parametrize("dedup", [False, True])
def test_reference_and_fast_samplers_draw_the_same_law(dedup):
    # Per-pair counts over T graphs: each sampler's against the law (Poisson(T·λ) copies, or Binomial(T, p) graphs
    # with the edge, p = 1 − e^{−λ}), and the two against each other (the difference of two independent counts of
    # one law has twice the variance).
    X, S, Y = _random_factors(36, n=6, m=5, K=3, scale=1.5)
    X[0] *= 0.1
    lam, p = edge_probability(X, S, Y, dedup=False)[0], edge_probability(X, S, Y)[0]
    mean, var = (T * p, T * p * (1 - p)) if dedup else (T * lam, T * lam)
    counts = []
    for draw, seed in ((fastrg.sample_reference, 37), (sample, 38)):
        _, i, j = draw(*_batch(X, S, Y), generator=torch.Generator().manual_seed(seed), dedup=dedup)
        counts.append(_pair_counts(i, j, 6, 5))
        assert float(((counts[-1] - mean) / var.sqrt()).abs().max()) <= Z
    assert float(((counts[0] - counts[1]) / (2 * var).sqrt()).abs().max()) <= Z


def test_reference_sampler_total_count_and_joint_pairing():
    # Edges per graph: Poisson(Σλ) without dedup; and the zero-diagonal block matrix of the fast sampler's test
    # (no within-cluster edge may appear) in a (B, H) batch with S broadcast over the batch.
    X, S, Y = _random_factors(39)
    lam = float(expected_edges(X, S, Y))
    r, _, _ = fastrg.sample_reference(*_batch(X, S, Y), generator=torch.Generator().manual_seed(40), dedup=False)
    N = torch.bincount(r, minlength=T).double()
    assert abs(float(N.mean()) - lam) <= Z * math.sqrt(lam / T)
    zx, zy = torch.tensor([0, 0, 1, 1, 1, 2, 2]), torch.tensor([2, 1, 0, 0, 1, 2])
    X, Y = torch.eye(3)[zx].expand(50, 2, 7, 3), torch.eye(3)[zy].expand(50, 2, 6, 3)
    S = torch.tensor([[0.0, 0.5, 0.2], [0.3, 0.0, 0.4], [0.1, 0.6, 0.0]]).expand(2, 3, 3)
    r, i, j = fastrg.sample_reference(X, S, Y, generator=torch.Generator().manual_seed(41))
    assert len(i) > 500 and not bool((zx[i] == zy[j]).any()) and int(r.max()) < 100
    key = (r * 7 + i) * 6 + j
    assert bool((key.diff() > 0).all())  # dedup: sorted by (r, i, j), no repeats, as `sample` returns them
    empty = fastrg.sample_reference(X, S * 0, Y, generator=torch.Generator().manual_seed(42))
    assert all(t.dtype == torch.int64 and t.shape == (0,) for t in empty)


# ---------------------------------------------------------------------------------------------- structure
def test_no_edge_crosses_graphs():
    # Graph r has a single possible edge (a_r, b_r); an edge of graph r anywhere else mixed two graphs.
    R, n, m = 64, 9, 7
    a, b = torch.arange(R) % n, (torch.arange(R) * 3) % m
    X = torch.zeros(R, n, 2)
    Y = torch.zeros(R, m, 2)
    X[torch.arange(R), a, 0] = 1.0
    Y[torch.arange(R), b, 1] = 1.0
    S = torch.tensor([[0.0, 3.0], [0.0, 0.0]])
    for csr in (False, True):
        r, i, j = sample(X, S, Y, generator=torch.Generator().manual_seed(11), dedup=False, csr=csr)[:3]
        assert len(r) > 0
        assert torch.equal(i, a[r]) and torch.equal(j, b[r])


def test_broadcast_leading_dims_flatten_row_major():
    B, H, n, m, K = 3, 2, 4, 5, 1
    X = torch.zeros(B, H, n, K)
    Y = torch.zeros(B, H, m, K)
    for b in range(B):
        for h in range(H):
            X[b, h, b] = 1.0
            Y[b, h, h + 2] = 1.0
    S = torch.full((H, K, K), 20.0)  # broadcast over the batch; P(edge) = 1 − e^{−20}
    r, i, j = sample(X, S, Y, generator=torch.Generator().manual_seed(12))
    assert set(r.tolist()) == set(range(B * H))
    assert torch.equal(i, r // H) and torch.equal(j, r % H + 2)
    assert expected_edges(X, S, Y).shape == (B * H,)
    assert edge_probability(X, S, Y).shape == (B * H, n, m)


def test_outputs_are_int64_in_range():
    g = torch.Generator().manual_seed(13)
    X, Y = torch.rand(4, 30, 8, generator=g), torch.rand(4, 20, 8, generator=g)
    S = torch.rand(8, 8, generator=g) * 0.1
    for dedup in (False, True):
        r, i, j = sample(X, S, Y, generator=g, dedup=dedup)
        for t in (r, i, j):
            assert t.dtype == torch.int64 and t.dim() == 1 and len(t) == len(r) and not t.requires_grad
        assert len(r) > 100
        assert 0 <= int(r.min()) and int(r.max()) < 4
        assert 0 <= int(i.min()) and int(i.max()) < 30
        assert 0 <= int(j.min()) and int(j.max()) < 20


@pytest.mark.on_device
@pytest.mark.usefixtures("default_device")
@pytest.mark.parametrize("dedup", [False, True])
def test_a_draw_on_the_generator_s_device_stays_there_and_leaves_the_global_rngs_alone(dedup):
    g = seeded(16)  # on the test device
    R, n, m, K = 3, 30, 20, 4
    X, Y = torch.rand(R, n, K, generator=g), torch.rand(R, m, K, generator=g)
    S = torch.rand(R, K, K, generator=g) * 0.3
    states = torch.get_rng_state(), (torch.cuda.get_rng_state() if X.is_cuda else None)
    for csr in (False, True):
        drawn = sample(X, S, Y, generator=seeded(17), dedup=dedup, csr=csr)
        assert all(t.device == X.device for t in drawn) and drawn[0].numel() > 0
    assert torch.equal(torch.get_rng_state(), states[0])
    assert states[1] is None or torch.equal(torch.cuda.get_rng_state(), states[1])
    again = sample(X, S, Y, generator=seeded(17), dedup=dedup, csr=True)
    assert all(torch.equal(a, b) for a, b in zip(drawn, again))  # the same generator state, the same graph


@pytest.mark.parametrize("dedup", [False, True])
def test_csr_matches_coo_and_is_sorted(dedup):
    g = torch.Generator().manual_seed(14)
    R, n, m, K = 5, 40, 33, 6
    X, Y = torch.rand(R, n, K, generator=g), torch.rand(R, m, K, generator=g)
    S = torch.rand(R, K, K, generator=g) * 0.2
    r0, i0, j0 = sample(X, S, Y, generator=torch.Generator().manual_seed(15), dedup=dedup)
    r, i, j, row_ptr = sample(X, S, Y, generator=torch.Generator().manual_seed(15), dedup=dedup, csr=True)
    key, key0 = (r * n + i) * m + j, (r0 * n + i0) * m + j0
    assert torch.equal(key, torch.sort(key0).values)  # same multiset of edges, sorted by (r, i, j)
    diff = key.diff()
    assert bool((diff > 0).all()) if dedup else bool((diff >= 0).all())
    if not dedup:
        assert bool((diff == 0).any())  # multigraph duplicates are kept
    assert row_ptr.dtype == torch.int64 and row_ptr.shape == (R * n + 1,)
    assert int(row_ptr[0]) == 0 and int(row_ptr[-1]) == len(r)
    assert torch.equal(torch.repeat_interleave(torch.arange(R * n), row_ptr.diff()), r * n + i)


def test_block_csr_is_the_csr_draw_as_one_block_diagonal_matrix():
    g = torch.Generator().manual_seed(30)
    R, n, m, K = 4, 37, 29, 5
    X, Y = torch.rand(R, n, K, generator=g), torch.rand(R, m, K, generator=g)
    S = torch.rand(K, K, generator=g) * 0.3
    r, i, j, row_ptr = sample(X, S, Y, generator=torch.Generator().manual_seed(31), csr=True)
    block_ptr, col, first, graph_ptr = fastrg.sample_block_csr(X, S, Y, generator=torch.Generator().manual_seed(31))
    assert block_ptr.dtype == col.dtype == torch.int32 and len(col) > 100 and first is None  # on the CPU: merged
    assert graph_ptr is None
    assert torch.equal(block_ptr.long(), row_ptr) and torch.equal(col.long(), r * m + j)
    empty_ptr, empty_col, *_ = fastrg.sample_block_csr(X, S * 0, Y, generator=g)
    assert torch.equal(empty_ptr, torch.zeros(R * n + 1, dtype=torch.int32)) and empty_col.shape == (0,)


@pytest.mark.parametrize(
    "setting", [{}, dict(_CHUNK=97, _EDGES=300, _BLOCK=64, _COPY_ROWS=1)], ids=["whole", "chunked"]
)
def test_factors_in_parts_draw_the_graph_of_their_concatenation(monkeypatch, setting):
    # X and Y given as parts along K (SBM-Transformer's [K̂, 1] without the copy), broadcast apart: the same
    # graph, edge for edge, as their concatenation under the same generator, in every form and with chunked
    # draws too (CDF rows that straddle two parts); the dense helpers read the parts alike.
    for name, value in setting.items():
        monkeypatch.setattr(fastrg, name, value)
    g = torch.Generator().manual_seed(58)
    R, n, m, K = 3, 41, 33, 6
    X, Y = torch.rand(R, n, K, generator=g), torch.rand(R, m, K, generator=g)
    S = torch.rand(K, K, generator=g) * 0.4
    ones = torch.ones(1, m, 1)  # one part broadcast over the graphs
    Y[..., 5:] = 1
    parts = ((X[..., :2], X[..., 2:]), S, (Y[..., :5], ones))
    for draw in (
        lambda *a: sample(*a, generator=torch.Generator().manual_seed(59), csr=True),
        lambda *a: sample(*a, generator=torch.Generator().manual_seed(59), dedup=False),
        lambda *a: fastrg.sample_block_csr(*a, generator=torch.Generator().manual_seed(59))[:2],
    ):
        whole, split = draw(X, S, Y), draw(*parts)
        assert len(whole[0]) > 100 and all(torch.equal(a, b) for a, b in zip(whole, split))
    assert torch.equal(edge_probability(*parts), edge_probability(X, S, Y))
    assert torch.allclose(expected_edges(*parts), expected_edges(X, S, Y), rtol=1e-12, atol=0)


def test_cpu_primitives_match_torch():
    g = torch.Generator().manual_seed(32)
    key = torch.randint(0, 1 << 20, (1000,), dtype=torch.int32, generator=g)
    assert torch.equal(fastrg.sort_integers(key.clone()), torch.sort(key).values)
    state = g.get_state()
    U = fastrg._uniforms(g, torch.device("cpu"))(10_000)
    g.set_state(state)
    uniforms = fastrg._uniforms(g, torch.device("cpu"))
    assert torch.equal(torch.cat([uniforms(3000), uniforms(7000)]), U)  # the generator's state fixes the stream
    assert not torch.equal(fastrg._uniforms(g, torch.device("cpu"))(10_000), U)  # and advances with it
    assert U.dtype == torch.float64 and 0 <= float(U.min()) and float(U.max()) < 1
    assert torch.equal(U * 2.0**53, (U * 2.0**53).floor())  # on the 2⁻⁵³ grid
    assert abs(float(U.mean()) - 0.5) < Z * math.sqrt(1 / 12 / len(U))


@pytest.mark.parametrize(
    "setting",
    [
        dict(_CHUNK=777),
        dict(_EDGES=700),
        dict(_EDGES=1),
        dict(_BLOCK=64, _COPY_ROWS=1),
        dict(_BLOCK=128, _COPY_ROWS=1, _GUIDE=64),
    ],
    ids=["draws", "graphs", "graph", "rows", "guide"],
)
def test_chunks_and_blocks_change_no_draw(monkeypatch, setting):
    # Draws looked up a chunk at a time, graphs drawn a chunk at a time (several graphs a chunk, 8 not a multiple
    # of them; one graph a chunk), CDF rows built a block at a time (one column; two, the guide counted a row at
    # a time): each side reads one stream of uniforms in the same order and the search's answer does not depend
    # on the guide, so the graph is the same, in every form.
    X, S, Y = _random_factors(34, n=60, m=50, K=4, scale=0.2)
    X, Y = X.expand(8, 60, 4), Y.expand(8, 50, 4)

    def draws():
        return [
            sample(X, S, Y, generator=torch.Generator().manual_seed(35), csr=True),
            sample(X, S, Y, generator=torch.Generator().manual_seed(35), dedup=False),
            fastrg.sample_block_csr(X, S, Y, generator=torch.Generator().manual_seed(35))[:2],
        ]

    whole = draws()
    for name, value in setting.items():
        monkeypatch.setattr(fastrg, name, value)
    chunked = draws()
    assert len(whole[1][0]) > 5 * 777
    assert all(torch.equal(a, b) for w, c in zip(whole, chunked) for a, b in zip(w, c))


def test_chunked_draw_has_the_law(monkeypatch):
    # Graphs drawn a few hundred at a time (about 80 chunks): pair frequencies over T graphs against 1 − e^{−λ},
    # and against an unchunked draw of another seed (the difference of two independent counts of one law has
    # twice the variance).
    X, S, Y = _random_factors(48, n=6, m=4, K=3, scale=1.5)
    p = edge_probability(X, S, Y)[0]
    mean, var = T * p, T * p * (1 - p)
    counts = []
    for edges, seed in ((1 << 20, 49), (5000, 50)):
        monkeypatch.setattr(fastrg, "_EDGES", edges)
        _, i, j = sample(*_batch(X, S, Y), generator=torch.Generator().manual_seed(seed))
        counts.append(_pair_counts(i, j, 6, 4))
        assert float(((counts[-1] - mean) / var.sqrt()).abs().max()) <= Z
    assert float(((counts[0] - counts[1]) / (2 * var).sqrt()).abs().max()) <= Z
    assert float(expected_edges(X, S, Y)) * T > 50 * 5000  # many chunks


def test_chunks_of_graphs_edge_cases(monkeypatch):
    # One graph larger than a chunk; 7 graphs in chunks of about 3 (7 is not a multiple); graphs without edges
    # first, inside and last (chunks skip them); no edge at all. Each form against the unchunked draw, and the
    # CSR offsets against the edges.
    g = torch.Generator().manual_seed(51)
    X, Y = torch.rand(7, 30, 5, generator=g), torch.rand(7, 20, 5, generator=g)
    S = torch.rand(5, 5, generator=g) * 0.2
    X[[0, 3, 6]] = 0  # graphs 0, 3, 6 have no edge
    cases = [(X[1:2], S, Y[1:2], 10), (X, S, Y, 150), (X, S, Y, 1), (X, S * 0, Y, 1)]
    for Xc, Sc, Yc, edges in cases:
        R = Xc.shape[0]
        monkeypatch.setattr(fastrg, "_EDGES", 1 << 20)
        whole = sample(Xc, Sc, Yc, generator=torch.Generator().manual_seed(52), csr=True)
        monkeypatch.setattr(fastrg, "_EDGES", edges)
        chunked = sample(Xc, Sc, Yc, generator=torch.Generator().manual_seed(52), csr=True)
        assert all(torch.equal(a, b) for a, b in zip(whole, chunked))
        r, i, j, row_ptr = chunked
        assert int(row_ptr[-1]) == len(r) and torch.equal(
            torch.repeat_interleave(torch.arange(R * 30), row_ptr.diff()), r * 30 + i
        )
        if Sc.any():
            assert len(r) > 4 * edges if edges > 1 else len(r) > 100
        if R == 7:
            assert not bool(torch.isin(r, torch.tensor([0, 3, 6])).any())
    assert len(chunked[0]) == 0  # the last case: no edge


def test_calls_with_few_edges_build_few_cdf_rows(monkeypatch):
    # The fixed cost of a call: CDF rows are built only in runs of rows with draws (_GAP: 8 rows of 8192 entries
    # apart at most), so a call with a handful of edges builds a handful of rows, not K per graph and side.
    built = []
    block = fastrg._cdf_block
    monkeypatch.setattr(fastrg, "_cdf_block", lambda W, o0, o1: built.append(o1 - o0) or block(W, o0, o1))
    g = torch.Generator().manual_seed(53)
    X, Y, S = (
        torch.rand(2, 8192, 64, generator=g),
        torch.rand(2, 8192, 64, generator=g),
        torch.rand(64, 64, generator=g),
    )
    S *= 3 / float(expected_edges(X, S, Y).sum())  # about 3 edges in all
    r, _, _ = sample(X, S, Y, generator=g)
    assert 0 < len(r) <= 10 and sum(built) <= 4 * len(r)


@pytest.mark.parametrize("parts", [False, True])
def test_few_draws_are_the_draws_of_the_blocks(monkeypatch, parts):
    # A side with at most _FEW draws searches each drawn row alone (_draw_few): the same CDF values, uniforms and
    # rule as the blocks and guide tables, so the same edges, for every output form and with X, Y in parts.
    same, few = 0, fastrg._FEW
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        R, n, m, K = (1 + seed % 3, *[(8192, 8192, 128), (300, 200, 16), (1, 5, 3)][seed % 3])
        X, Y, S = torch.rand(R, n, K, generator=g), torch.rand(R, m, K, generator=g), torch.rand(K, K, generator=g)
        X[:, :, 0] = 0  # a column never drawn from
        S *= (seed % 7 + 0.5) / float(expected_edges(X, S, Y).sum())  # 0.5 to 6.5 expected edges in all
        if parts:
            X, Y = (X[..., :1], X[..., 1:]), (Y[..., :2], Y[..., 2:])
        draws = []
        for limit in (few, 0):
            monkeypatch.setattr(fastrg, "_FEW", limit)
            draws.append(
                [
                    fastrg.sample_block_csr(X, S, Y, generator=torch.Generator().manual_seed(seed))[:2],
                    sample(X, S, Y, generator=torch.Generator().manual_seed(seed), dedup=False),
                ]
            )
        assert all(torch.equal(a, b) for x, y in zip(*draws) for a, b in zip(x, y))
        same += len(draws[0][1][0]) > 0
    assert same >= 30  # most calls drew edges


def test_draws_are_pinned_to_the_generator():
    # SBM-Transformer's published results were made with these exact draws (CPU): the uniforms, their order, the
    # inverse-CDF rule (the first CDF entry strictly above U) and the edge order fix these numbers. A partial guide
    # (5% density, block CSR) and a full one (a multigraph at about one edge a pair, unsorted: its order counts).
    g = torch.Generator().manual_seed(61)
    X, Y = torch.rand(2, 3, 300, 16, generator=g), torch.rand(2, 3, 200, 16, generator=g)
    S = torch.rand(3, 16, 16, generator=g)
    S = S * (0.05 * 300 * 200 / expected_edges(X, S, Y).view(2, 3, 1, 1).mean(0))
    row_ptr, col, *_ = fastrg.sample_block_csr(X, S, Y, generator=torch.Generator().manual_seed(62))
    w = torch.arange(len(col)) % 1009
    assert (len(col), int((col.long() * w).sum()), int(row_ptr.long().sum())) == (17485, 5269992395, 15727210)
    r, i, j = sample(X, S * 20, Y, generator=torch.Generator().manual_seed(63), dedup=False)
    w = torch.arange(len(r)) % 1009
    assert (len(r), int((((r * 300 + i) * 200 + j) * w).sum())) == (361332, 32793464300290)


def test_one_thread_restores_the_count_and_keeps_the_draws():
    X, S, Y = _random_factors(44, n=300, m=200, K=8, scale=0.01)
    one = sample(X, S, Y, generator=torch.Generator().manual_seed(45), csr=True)  # the fixture's one thread
    torch.set_num_threads(2)
    with fastrg.one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    two = sample(X, S, Y, generator=torch.Generator().manual_seed(45), csr=True)
    assert torch.get_num_threads() == 2 and all(torch.equal(a, b) for a, b in zip(one, two))
    with pytest.raises(ValueError):
        sample(X, S, Y[:, :2])
    assert torch.get_num_threads() == 2  # restored after an error too


def test_reproducible_with_generator():
    X, S, Y = _random_factors(16, n=50, m=40, K=5, scale=0.01)
    X, Y = X.expand(3, 50, 5), Y.expand(3, 40, 5)
    for kw in (dict(dedup=False), dict(dedup=True), dict(csr=True)):
        a = sample(X, S, Y, generator=torch.Generator().manual_seed(17), **kw)
        b = sample(X, S, Y, generator=torch.Generator().manual_seed(17), **kw)
        c = sample(X, S, Y, generator=torch.Generator().manual_seed(18), **kw)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert not all(torch.equal(x, y) for x, y in zip(a, c))
    torch.manual_seed(19)  # generator=None draws from the global generator
    a = sample(X, S, Y)
    torch.manual_seed(19)
    assert all(torch.equal(x, y) for x, y in zip(a, sample(X, S, Y)))


def _locate(cdf, rows, U, n):
    """Entry index i of the inverse-CDF draw U from CDF row `rows` of a _cdf_block table, the same through guide
    tables of every size (one bucket; a few, built by torch.searchsorted; L buckets, by counting) and through
    both searches (two steps, then a bisection; a bisection alone), and without a guide (off the CPU)."""
    b = fastrg._bits(n)
    found = []
    for G in sorted({1, 4, 1 << b}):
        guide = fastrg._guide_table(cdf, n, G)
        slot = (U * G).long() + rows * (G + 1)
        lo, hi = guide[slot], guide[slot + 1]
        assert bool((lo <= hi).all())
        for steps in (False, True):
            found.append(fastrg._search(cdf, lo.clone(), hi, U, 1 << b, steps))
    found.append(fastrg._bisect(cdf, rows << b, U, 1 << b, b))  # off the CPU: the whole row, b steps
    assert all(torch.equal(f, found[0]) for f in found)
    assert torch.equal(found[0] >> b, rows.to(found[0].dtype))  # never leaves its row
    return (found[0] & ((1 << b) - 1)).long()


def _cdf(W):
    """The CDF rows of every column of W (R, n, K), as one block (R·K·L,)."""
    return fastrg._cdf_block(fastrg._Factor((W,)), 0, W.shape[0] * W.shape[2])


def _widest(cdf, n):
    """The most entries an interval of the full guide spans."""
    L = 1 << fastrg._bits(n)
    return int(fastrg._guide_table(cdf, n, L).view(-1, L + 1).diff(dim=1).max())


def test_inverse_cdf_tails_never_pick_zero_weight():
    # Column weights with zero runs at both ends and inside, and a weight too small to survive the prefix sum;
    # many columns. Uniforms at the extremes of [0, 1) on the 2⁻⁵³ grid, at the step 1/3 and on a grid.
    K, n = 1 << 12, 8
    w = torch.tensor([0.0, 0.0, 1.0, 0.0, 1e-300, 2.0, 0.0, 0.0], dtype=torch.float64)
    cdf = _cdf(w[None, :, None].expand(1, n, K))
    assert torch.equal(cdf[:n], torch.tensor([0, 0, 1 / 3, 1 / 3, 1 / 3, 1, 1, 1], dtype=torch.float64))  # C/C = 1
    third = float(cdf[2])  # CDF after index 2: 1/3 rounded
    grid = torch.linspace(0, 1 - 2.0**-53, 1001, dtype=torch.float64)
    U = torch.cat(
        [torch.tensor([0.0, 2.0**-53, third - 2.0**-54, third, 1 - 2.0**-52, 1 - 2.0**-53], dtype=torch.float64), grid]
    )
    for row in (0, 1, K // 2, K - 1):
        i = _locate(cdf, torch.full(U.shape, row), U, n)
        assert bool((w[i] > 0).all())
        assert i[:6].tolist() == [2, 2, 2, 5, 5, 5]
        assert torch.equal(i[6:], (grid >= third).long() * 3 + 2)  # inverse CDF over {2: 1/3, 5: 2/3}


@pytest.mark.parametrize("n", [300, 256, 1])
def test_guide_table_lookup_equals_search(n):
    # Guide tables plus steps or bisection must give exactly the first CDF entry above U, as torch.searchsorted
    # does, for skewed weights (wide buckets), runs of zeros, a single non-zero entry, even weights (at most
    # one step), and n a power of two or not (rows padded to 512 entries at n = 300).
    g = torch.Generator().manual_seed(23)
    K = 6
    W = torch.rand(2, n, K, generator=g, dtype=torch.float64) ** 8
    W[0, n // 3 : n * 5 // 6, 1] = 0
    W[1, :, 2] = 0
    W[1, n // 2, 2] = 5.0  # a single non-zero entry
    W[:, :, 3] = 1.0
    cdf = _cdf(W)
    L = 1 << fastrg._bits(n)
    assert n == 1 or _widest(cdf, n) > 8  # skewed weights: wide intervals
    even = _cdf(W[:, :, 3:4])
    assert _widest(even, n) <= 2  # an even column: at most two steps
    rows = torch.randint(0, 2 * K, (20000,), generator=g)
    U = torch.rand(20000, generator=g, dtype=torch.float64)
    expected = torch.searchsorted(cdf.view(2 * K, L)[rows, :n], U[:, None], right=True).squeeze(1)
    assert torch.equal(_locate(cdf, rows, U, n), expected)
    rows = torch.randint(0, 2, (20000,), generator=g)
    expected = torch.searchsorted(even.view(2, L)[rows, :n], U[:, None], right=True).squeeze(1)
    assert torch.equal(_locate(even, rows, U, n), expected)


def test_trailing_zero_weights_do_not_widen_the_guide():
    # Padded keys have zero weight: their CDF entries are exactly 1 and stop every draw, so an even column
    # padded to twice its length still settles every draw within one step of the guide's candidate.
    n = 512
    W = torch.ones(3, n, 2, dtype=torch.float64)
    W[:, n // 2 :, 0] = 0  # right padding
    W[:, : n // 2, 1] = 0  # left padding
    cdf = _cdf(W)
    assert _widest(cdf, n) <= 1
    g = torch.Generator().manual_seed(33)
    rows = torch.randint(0, 6, (5000,), generator=g)
    U = torch.rand(5000, generator=g, dtype=torch.float64)
    expected = torch.searchsorted(cdf.view(6, n)[rows], U[:, None], right=True).squeeze(1)
    assert torch.equal(_locate(cdf, rows, U, n), expected)


def test_off_the_cpu_repeats_are_flagged_in_place_and_the_draw_is_the_same(monkeypatch):
    # Off the CPU (simulated here: host_syncs, and with it chunk_size's sizes) the multigraph's sorted keys stay
    # whole, repeats flagged: where `first` is set they are the CPU's simple graph, bit for bit; graph_ptr, read
    # with the counts, offsets them all. `sample` merges them (one more read there) into the CPU's edges.
    g = torch.Generator().manual_seed(71)
    R, n, m, K = 6, 50, 40, 4
    X, Y = torch.rand(R, n, K, generator=g), torch.rand(R, m, K, generator=g)
    S = torch.rand(K, K, generator=g)  # about one copy a pair: many repeats
    on_cpu = [fastrg.sample_block_csr(X, S, Y, generator=torch.Generator().manual_seed(72))]
    on_cpu.append(sample(X, S, Y, generator=torch.Generator().manual_seed(73), csr=True))
    monkeypatch.setattr(fastrg, "host_syncs", lambda device: True)
    row_ptr, col, first, graph_ptr = fastrg.sample_block_csr(X, S, Y, generator=torch.Generator().manual_seed(72))
    assert on_cpu[0][2] is None and 0.2 < 1 - float(first.float().mean()) < 0.8
    assert torch.equal(col[first], on_cpu[0][1])
    kept = torch.cat([torch.zeros(1, dtype=torch.int64), first.cumsum(0)])  # first copies before each offset
    assert torch.equal(kept[row_ptr.long()], on_cpu[0][0].long())
    assert np.array_equal(graph_ptr, row_ptr[::n].numpy()) and graph_ptr[-1] == len(col)
    merged = sample(X, S, Y, generator=torch.Generator().manual_seed(73), csr=True)
    assert all(torch.equal(a, b) for a, b in zip(merged, on_cpu[1], strict=True))


@pytest.mark.parametrize("syncs", [False, True], ids=["cpu", "off-cpu"])
def test_shift_between_group_orders(monkeypatch, syncs):
    # Values laid out group by group in (r, v, u) order, each moved by its shift, land in (r, u, v) order with
    # the order within a group kept; _spread cut on the host (CPU) or by a search on the device (off it).
    monkeypatch.setattr(fastrg, "host_syncs", lambda device: syncs)
    g = torch.Generator().manual_seed(24)
    counts = torch.randint(0, 4, (2, 3, 3), generator=g)

    def labelled(groups):  # each edge labelled by its group (r, u, v) and its rank k within the group
        return torch.tensor(
            [(r * 100 + u * 10 + v) * 10 + k for r, u, v in groups for k in range(int(counts[r, u, v]))],
            dtype=torch.int64,
        )

    values = labelled([(r, u, v) for r in range(2) for v in range(3) for u in range(3)])
    expected = labelled([(r, u, v) for r in range(2) for u in range(3) for v in range(3)])
    moved = torch.empty_like(values)
    shift, ends = fastrg._uv_shift(counts, len(values))  # per group, applied a slice at a time
    for a, z in ((0, 5), (5, 6), (6, 23), (23, len(values))):
        moved[torch.arange(a, z) + fastrg._spread(shift, ends, a, z)] = values[a:z]
    assert torch.equal(moved, expected)


def test_expected_edges_and_edge_probability():
    X, S, Y = _random_factors(20, n=9, m=11, K=4)
    lam = X.double() @ S.double() @ Y.double().T
    assert expected_edges(X, S, Y).dtype == torch.float64
    assert torch.allclose(expected_edges(X, S, Y), lam.sum()[None])
    assert torch.allclose(edge_probability(X, S, Y, dedup=False)[0], lam)
    p = edge_probability(X, S, Y)[0]
    assert torch.allclose(p, -torch.expm1(-lam)) and bool((p <= lam).all()) and bool((p < 1).all())


def test_accepts_dtypes_and_grad_inputs():
    X, S, Y = _random_factors(21, n=20, m=20, K=4, scale=0.1)
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        assert len(sample(X.to(dt), S.to(dt), Y.to(dt), generator=torch.Generator().manual_seed(0))[0]) > 0
    Xg = X.clone().requires_grad_(True)
    r, i, j = sample(Xg, S, Y, generator=torch.Generator().manual_seed(0))
    assert not r.requires_grad and len(r) > 0
    counts = (torch.eye(3)[torch.tensor([0, 1, 1, 2])] * 2).long()  # integer memberships
    assert len(sample(counts, torch.ones(3, 3), counts, generator=torch.Generator().manual_seed(0))[0]) > 0


# --------------------------------------------------------------------------------------------- edge cases
def _assert_empty(out, R, n, csr):
    for t in out[:3]:
        assert t.dtype == torch.int64 and t.shape == (0,)
    if csr:
        assert torch.equal(out[3], torch.zeros(R * n + 1, dtype=torch.int64))


@pytest.mark.parametrize("csr", [False, True, "multigraph", "reference"])
def test_empty_cases(csr):
    g = torch.Generator().manual_seed(22)
    X, S, Y = torch.rand(3, 5, 4, generator=g), torch.rand(4, 4, generator=g), torch.rand(3, 6, 4, generator=g)
    draw = (
        fastrg.sample_reference
        if csr == "reference"
        else (lambda *a, **kw: sample(*a, dedup=False, **kw))
        if csr == "multigraph"
        else (lambda *a, **kw: sample(*a, csr=csr, **kw))
    )
    csr = csr is True
    _assert_empty(draw(X, torch.zeros(4, 4), Y, generator=g), 3, 5, csr)  # all-zero S
    _assert_empty(draw(torch.zeros_like(X), S, Y, generator=g), 3, 5, csr)
    _assert_empty(draw(X, S, torch.zeros_like(Y), generator=g), 3, 5, csr)
    _assert_empty(draw(X, S * 1e-30, Y, generator=g), 3, 5, csr)  # zero edges drawn
    _assert_empty(draw(X[:, :0], S, Y, generator=g), 3, 0, csr)  # n = 0
    _assert_empty(draw(X, S, Y[:, :0], generator=g), 3, 5, csr)  # m = 0
    _assert_empty(draw(X[:0], S, Y[:0], generator=g), 0, 5, csr)  # R = 0
    _assert_empty(draw(X[..., :0], S[:0, :0], Y[..., :0], generator=g), 3, 5, csr)  # K = 0
    assert float(expected_edges(X, torch.zeros(4, 4), Y).abs().sum()) == 0.0
    assert edge_probability(X[:, :0], S, Y).shape == (3, 0, 6)


def test_zero_rows_and_columns_get_no_edges():
    g = torch.Generator().manual_seed(23)
    X, S, Y = torch.rand(10, 3, generator=g), torch.rand(3, 3, generator=g), torch.rand(8, 3, generator=g)
    X[[1, 4, 9]] = 0  # queries without membership
    Y[[0, 7]] = 0
    X[:, 1] = 0  # an empty cluster column
    _, i, j = sample(*_batch(X, S, Y, 2000), generator=g, dedup=False)
    assert len(i) > 1000
    assert not bool(torch.isin(i, torch.tensor([1, 4, 9])).any())
    assert not bool(torch.isin(j, torch.tensor([0, 7])).any())


def test_n_equals_one_and_k_equals_one():
    g = torch.Generator().manual_seed(24)
    X, Y, S = torch.full((T, 1, 1), 0.5), torch.full((1, 1), 2.0), torch.tensor([[0.4]])  # λ = 0.4, n = m = 1
    r, i, j = sample(X, S, Y, generator=g, dedup=False)
    assert bool((i == 0).all() and (j == 0).all())
    assert abs(len(r) - 0.4 * T) <= Z * math.sqrt(0.4 * T)
    r, i, j = sample(X, S, Y, generator=g)
    p = 1 - math.exp(-0.4)
    assert abs(len(r) - p * T) <= Z * math.sqrt(T * p * (1 - p))
    X1 = torch.rand(20, 1, generator=g) + 0.5  # K = 1, rank-one expectation, λ = 0.1·x·y ≥ 0.025
    Y1 = torch.rand(15, 1, generator=g) + 0.5
    lam = X1 @ Y1.T * 0.1
    _, i, j = sample(X1.expand(T, 20, 1), torch.tensor([[0.1]]), Y1.expand(T, 15, 1), generator=g, dedup=False)
    z = (_pair_counts(i, j, 20, 15) - T * lam) / (T * lam).sqrt()
    assert float(z.abs().max()) <= Z


# ------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("name", ["X", "S", "Y"])
@pytest.mark.parametrize(
    "bad, word", [(-0.1, "non-negative"), (float("nan"), "finite"), (float("inf"), "finite"), (float("-inf"), "finite")]
)
def test_bad_values_raise_naming_the_argument(name, bad, word):
    args = dict(zip("XSY", _random_factors(25)))
    args[name] = args[name].clone()
    args[name][0, 0] = bad
    for fn in (sample, expected_edges, edge_probability):
        with pytest.raises(ValueError, match=f"{name} must be {word}"):
            fn(args["X"], args["S"], args["Y"])


def test_bad_shapes_and_types_raise():
    X, S, Y = _random_factors(26)
    cases = [
        ((X, S[:, :2], Y), "S must have shape"),
        ((X, S, Y[:, :2]), "Y must have shape"),
        ((X[0], S, Y), "X must have at least 2 dims"),
        ((X, S, Y.numpy()), "Y must be a torch.Tensor"),
        ((X.to(torch.complex64), S, Y), "X must be real"),
        ((X.expand(2, 5, 3), S.expand(3, 3, 3), Y), "do not broadcast"),
        (((X[:, :1], X[:4, 1:]), S, Y), "parts of X must have the same rows"),
        ((X, S, (Y, Y[:, :1])), "Y must have shape"),
        ((X, S, ()), "Y must be a torch.Tensor or a tuple of them"),
        (((X[:, :1], X[:, 1:].numpy()), S, Y), "X must be a torch.Tensor"),
    ]
    for args, msg in cases:
        with pytest.raises(ValueError, match=msg):
            sample(*args)


def test_overflowing_sort_key_and_expected_count_raise():
    big = torch.zeros(1, 1, 1).expand(1 << 22, 1 << 21, 1)  # R·n·m = 2^64: a view, never materialised
    with pytest.raises(ValueError, match="int64 sort key"):
        sample(big, torch.ones(1, 1), big, csr=True)
    X, S, Y = _random_factors(27)
    with pytest.raises(ValueError, match="expected number of edges"):
        sample(X.double() * 1e200, S.double() * 1e200, Y)


def test_benchmark_runs_on_the_cpu_clock_and_refuses_it_with_threads(capsys, tmp_path):
    import json

    from experiments import fastrg_bench

    assert (
        fastrg_bench.main(
            [
                "--lengths",
                "64",
                "--densities",
                "0.05",
                "--repeats",
                "1",
                "--threads",
                "1",
                "--clock",
                "cpu",
                "--warmup-iters",
                "2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "cpu clock" in out and " 64 |" in out and "after 2 warm-up" in out
    record = json.loads((tmp_path / "fastrg_bench.json").read_text())
    assert [row["n"] for row in record["rows"]] == [64] and record["settings"]["clock"] == "cpu"
    row = record["rows"][0]
    assert float(row["fixed_ms"]) > 0 and "fixed ms" in out  # the one-edge call, timed beside the cells
    assert float(row["tables_ms"]) > 0 and "slope_above_tables" in record and "igraph_ms" not in row
    assert fastrg_bench.above_fixed(10.0, 4.0, 1000) == "6000" and fastrg_bench.above_fixed(10.0, 9.5, 1000) == "–"
    for bad in (["--threads", "2", "--clock", "cpu"], ["--default-allocator"], ["--warmup-iters", "0"]):
        with pytest.raises(SystemExit) as exc:
            fastrg_bench.main(bad)
        assert exc.value.code == 2


def test_benchmark_times_igraph_beside_when_asked(capsys, tmp_path, monkeypatch):
    import json
    import sys

    from experiments import fastrg_bench

    args = [
        "--lengths",
        "256",
        "--densities",
        "0.05",
        "--repeats",
        "1",
        "--threads",
        "1",
        "--igraph",
        "--out",
        str(tmp_path),
    ]
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "igraph", None)  # not installed: a note, igraph's columns left out
        assert fastrg_bench.main(args) == 0
        assert "pip install igraph" in capsys.readouterr().out
        row = json.loads((tmp_path / "fastrg_bench.json").read_text())["rows"][0]
        assert "igraph_ms" not in row and float(row["fastrg_ms"]) > 0
    pytest.importorskip("igraph")
    assert fastrg_bench.main(args) == 0
    row = json.loads((tmp_path / "fastrg_bench.json").read_text())["rows"][0]
    assert float(row["igraph_ms"]) > 0 and float(row["fastrg_over_igraph"]) > 0 and "igraph" in capsys.readouterr().out


def test_benchmark_help_runs_nothing(capsys):
    from experiments import fastrg_bench

    with pytest.raises(SystemExit) as exc:
        fastrg_bench.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("usage: python -m experiments.fastrg_bench")
    assert "default: None" not in out and "--allocator" in out and "fastRG vs naive" not in out


def test_self_check_runs(capsys):
    assert fastrg.main([]) == 0
    assert "self-check passed" in capsys.readouterr().out


def test_help_runs_nothing(capsys):
    with pytest.raises(SystemExit) as exc:
        fastrg.main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("usage: python fastrg.py") and "self-check passed" not in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_structure_and_is_reproducible():
    X, S, Y = (t.cuda() for t in _random_factors(28, n=64, m=48, K=8, scale=0.05))
    X, Y = X.expand(4, 64, 8), Y.expand(4, 48, 8)
    out = [sample(X, S, Y, generator=torch.Generator("cuda").manual_seed(29), csr=True) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*out))
    r, i, j, row_ptr = out[0]
    assert r.is_cuda and len(r) > 0 and int(row_ptr[-1]) == len(r)
    assert int(i.max()) < 64 and int(j.max()) < 48


@pytest.mark.parametrize("shape, u0, u1", [((200, 3), 0, 3), ((64, 129), 0, 129), ((1, 5), 1, 4), ((300, 128), 5, 37)])
def test_tiled_column_copy_equals_the_transpose(shape, u0, u1):
    # The CPU copy goes a tile of rows at a time: n not a multiple of the tile (200, 300), exactly one tile (64),
    # one row, a range of columns into a strided target (rows of 512 for n = 300); float32 in, float64 out, bit
    # for bit the plain transposing conversion.
    W = torch.rand(*shape, generator=torch.Generator().manual_seed(41))
    out = torch.full((u1 - u0, 512), -1.0, dtype=torch.float64)
    fastrg._columns(W, u0, u1, out[:, : shape[0]])
    assert torch.equal(out[:, : shape[0]], W[:, u0:u1].T.double()) and bool((out[:, shape[0] :] == -1).all())


@pytest.mark.parametrize("n", [1000, 1024])
def test_cdf_block_rows_are_normalised_prefix_sums(n):
    # Any row range, across graphs: each row is column u of graph r, its prefix sums over their total, exactly 1
    # from the last entry on (padding past n = 1000 to 1024 too); an empty column (never drawn from) reads 0.
    W = torch.rand(3, n, 7, generator=torch.Generator().manual_seed(43)) ** 4
    W[1, :, 2] = 0
    L = 1024
    parts = fastrg._Factor((W[..., :3], W[..., 3:4], W[..., 4:]))  # W in parts along K: the same rows
    for o0, o1 in ((0, 21), (5, 16), (9, 10)):
        cdf = fastrg._cdf_block(fastrg._Factor((W,)), o0, o1).view(o1 - o0, L)
        assert torch.equal(fastrg._cdf_block(parts, o0, o1).view(o1 - o0, L), cdf)
        for k, o in enumerate(range(o0, o1)):
            col = W[o // 7, :, o % 7].double()
            prefix = col.cumsum(0)
            expected = prefix / prefix[-1] if prefix[-1] > 0 else torch.zeros(n, dtype=torch.float64)
            assert torch.equal(cdf[k, :n], expected) and bool((cdf[k, n:] == 1).all())
            assert float(cdf[k, n - 1]) == (1.0 if prefix[-1] > 0 else 0.0)


def test_blocks_cover_the_rows_with_draws_only(monkeypatch):
    # Blocks of whole graphs or of columns of one graph (in near-equal parts), cut to runs of rows with draws;
    # rows without draws inside a run are built (and never drawn from), blocks without draws are skipped.
    per_row = np.array([0, 2, 0, 1, 0, 0, 0, 0, 0, 4, 0, 5])  # R = 3 graphs of K = 4 columns
    monkeypatch.setattr(fastrg, "_COPY_ROWS", 1)
    monkeypatch.setattr(fastrg, "_BLOCK", 8 * 16)  # 8 rows of L = 16: two whole graphs
    assert list(fastrg._blocks(per_row, 4, 16, CPU)) == [(1, 4), (9, 12)]  # a gap of one row stays in its run
    monkeypatch.setattr(fastrg, "_GAP", 16)  # ... unless one row is too many
    assert list(fastrg._blocks(per_row, 4, 16, CPU)) == [(1, 2), (3, 4), (9, 10), (11, 12)]
    monkeypatch.setattr(fastrg, "_GAP", 64)
    monkeypatch.setattr(fastrg, "_BLOCK", 3 * 16)  # 3 rows: a graph's 4 columns in parts of 2
    assert list(fastrg._blocks(per_row, 4, 16, CPU)) == [(1, 2), (3, 4), (9, 10), (11, 12)]
    monkeypatch.setattr(fastrg, "_BLOCK", 1)  # at least one row a block
    assert list(fastrg._blocks(per_row, 4, 16, CPU)) == [(1, 2), (3, 4), (9, 10), (11, 12)]
    assert list(fastrg._blocks(np.zeros(8, dtype=np.int64), 4, 16, CPU)) == []
    every = np.ones(12, dtype=np.int64)  # every row drawn from
    monkeypatch.setattr(fastrg, "_BLOCK", 3 * 16)
    assert list(fastrg._blocks(every, 4, 16, CPU)) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12)]
    monkeypatch.setattr(fastrg, "_BLOCK", 8 * 16)
    assert list(fastrg._blocks(every, 4, 16, CPU)) == [(0, 8), (8, 12)]


@pytest.mark.parametrize("per_row", [0.5, 200.0])
def test_row_offsets_by_count_equal_offsets_by_search(per_row):
    # _row_ptr counts the keys by row up to 64 edges a row and searches each row's first key above that: both
    # must give the offsets of the sorted keys, with empty rows, rows past n's power of two (n = 5 in 8 slots).
    R, n, m = 3, 5, 6
    bn, bm = fastrg._bits(n), fastrg._bits(m)
    g = torch.Generator().manual_seed(47)
    r, i, j = (torch.randint(0, size, (int(per_row * R * n),), generator=g) for size in (R, n, m))
    key = ((r << (bn + bm)) | (i << bm) | j).sort().values
    expected = torch.zeros(R * n + 1, dtype=torch.int64)
    expected[1:] = torch.bincount(r * n + i, minlength=R * n).cumsum(0)
    assert torch.equal(fastrg._row_ptr(key, R, n, bm).long(), expected)
    assert torch.equal(fastrg._row_ptr(key.int(), R, n, bm).long(), expected)


def test_column_sums_through_numpy_equal_torch_and_take_broadcast_inputs():
    # Many graphs (torch's slow case), float32 and float64, and a broadcast (stride-0) batch as _flat gives it.
    W = torch.rand(8, 300, 5, generator=torch.Generator().manual_seed(53))
    for t in (W, W.double(), W[:1].expand(8, 300, 5)):
        assert torch.allclose(fastrg._column_sums(t), t.sum(1, dtype=torch.float64), rtol=1e-12, atol=0)
