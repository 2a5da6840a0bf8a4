"""Tests for sbm_transformer.py: the sparse and dense paths against each other and against full attention on
the same edge set, the STE against Eq. 9, gradchecks of the custom autograd functions, the sampling law
against Bernoulli(min(1, p + δ)), padding, causality, empty rows, density and FLOP accounting, the CLI."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastrg
import sbm_transformer as sbm
from baselines.full import FullAttention
from bench import measure
from conftest import seeded

H, D, DIM = 2, 8, 16


def make(dtype=torch.float64, **kwargs) -> sbm.SBMAttention:
    torch.manual_seed(0)
    return sbm.SBMAttention(DIM, H, D, **{"clusters": 6, "path": "fast", **kwargs}).to(dtype).train()


def padding(batch=3, n=10):
    mask = torch.zeros(batch, n, dtype=torch.bool)
    mask[1, 7:] = True  # right padding
    mask[2, :3] = True  # left padding: with causal, queries 0-2 of sample 2 have no admissible key
    return mask


def qkv(module, x):
    b, n, _ = x.shape
    q, k, v = module.qkv(x).view(b, n, 3, H, D).permute(2, 0, 3, 1, 4)  # 3×(B, H, N, D)
    return q.contiguous(), k.contiguous(), v.contiguous()


def both_paths(module, x, key_padding_mask, causal, generator):
    """One graph sampled on the dense path, then the attention and density of both paths on that graph."""
    q, k, v = qkv(module, x)
    valid = torch.ones(x.shape[:2], dtype=torch.bool) if key_padding_mask is None else ~key_padding_mask
    module.path = "reference"
    graph = module.sample(q, k, valid, causal, generator)
    sparse_graph = {"edges": sbm.Edges.from_mask(graph["mask"]), "x": graph["x"], "w": graph["w"]}
    return [module.attend(q, k, v, g, valid, None) for g in (graph, sparse_graph)]


@pytest.mark.on_device
@pytest.mark.usefixtures("default_device")
@pytest.mark.parametrize("ste", sbm.STE_FORMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("self_loops", [False, True])
def test_sparse_and_dense_paths_agree_on_the_same_edge_set(ste, causal, padded, self_loops):
    module = make(ste=ste, self_loops=self_loops, density_weight=0.5)
    x = torch.randn(3, 10, DIM, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, H, 10, D, dtype=torch.float64)
    results = []
    for y, density, per_example in both_paths(module, x, padding() if padded else None, causal, seeded(1)):
        loss = (y * weights).sum() + 3.0 * density.mean()  # the regulariser's gradient path included
        params = [x, module.qkv.weight, module.mlp_w, module.mlp_b, module.centers]
        results.append((y, density, per_example, torch.autograd.grad(loss, params, retain_graph=True)))
    (y0, d0, e0, g0), (y1, d1, e1, g1) = results
    torch.testing.assert_close(y1, y0, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(d1, d0, rtol=1e-12, atol=0)
    torch.testing.assert_close(e1, e0, rtol=1e-12, atol=0)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert all(g.abs().sum() > 0 for g in g0[2:])  # the STE reaches the MLP and the clusters


@pytest.mark.on_device
@pytest.mark.usefixtures("default_device")
@pytest.mark.parametrize(
    "causal, padded, self_loops, off_cpu",
    [(False, False, False, False), (True, True, False, False), (False, False, False, True), (True, True, True, True)],
)
def test_sampled_graph_attends_like_the_same_graph_rebuilt(causal, padded, self_loops, off_cpu, monkeypatch):
    """The sparse sampler's graph (CSR straight from fastRG, compacted by thinning, or off the CPU (simulated) its
    repeats, thinned pairs and sampled self-loops flagged in place; its key-major copy built in the forward) gives
    the outputs and gradients of the same edge set rebuilt from its mask."""
    if off_cpu:
        monkeypatch.setattr(fastrg, "host_syncs", lambda device: True)
    module = make(density_weight=0.5, self_loops=self_loops)
    x = torch.randn(3, 10, DIM, dtype=torch.float64, requires_grad=True)
    valid = ~padding() if padded else torch.ones(3, 10, dtype=torch.bool)
    q, k, v = qkv(module, x)
    graph = module.sample(q, k, valid, causal, seeded(6))
    edges = graph["edges"]
    assert (edges.live is not None and not bool(edges.live.all())) == fastrg.host_syncs(x.device)  # CUDA, or off_cpu
    rebuilt = {**graph, "edges": sbm.Edges.from_mask(edges.to_mask())}
    results = []
    for g in (graph, rebuilt):
        y, density, _ = module.attend(q, k, v, g, valid, None)
        loss = (y**2).sum() + density.sum()
        results.append((y, density, torch.autograd.grad(loss, [x, module.centers, module.mlp_w], retain_graph=True)))
    (y0, d0, g0), (y1, d1, g1) = results
    torch.testing.assert_close(y0, y1, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(d0, d1, rtol=1e-12, atol=0)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


def full_graph(r, n):
    return sbm.Edges.from_mask(torch.ones(r, n, n, dtype=torch.bool))


@pytest.mark.on_device
@pytest.mark.usefixtures("default_device")
def test_all_ones_mask_equals_full_attention():
    torch.manual_seed(0)
    b, n = 2, 9
    q, k, v = (torch.randn(b, H, n, D, dtype=torch.float64) for _ in range(3))
    edges = full_graph(b * H, n)
    p = torch.ones(edges.E, dtype=torch.float64)
    y = sbm.EdgeAttention.apply(q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D), p, edges, None, 0.0, "paper")
    reference = FullAttention.reference_core(q, k, v, None, None, 0.0)
    torch.testing.assert_close(y.view(b, H, n, D), reference, rtol=1e-12, atol=1e-12)
    # the whole module with every pair admitted is multi-head full attention with the same projections
    module = make()
    full = FullAttention(DIM, H, D, path="reference").double()
    full.qkv.load_state_dict(module.qkv.state_dict())
    full.out.load_state_dict(module.out.state_dict())
    x = torch.randn(b, n, DIM, dtype=torch.float64)
    q, k, v = qkv(module, x)
    graph = module.sample(q, k, torch.ones(b, n, dtype=torch.bool), False, seeded(0))
    graph["edges"] = edges
    y, density, _ = module.attend(q, k, v, graph, torch.ones(b, n, dtype=torch.bool), None)
    out = module.out(y.transpose(1, 2).reshape(b, n, H * D))
    torch.testing.assert_close(out, full(x)[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(density, torch.ones(H, dtype=torch.float64))


@pytest.mark.parametrize("ste", sbm.STE_FORMS)
def test_ste_gradient_is_equation_9(ste):
    """∂L/∂p_ij := ∂L/∂M_ij with A = M ⊙ QKᵀ/√D (Eq. 9): differentiate a dense float M at its binary value."""
    torch.manual_seed(0)
    n, m = 5, 6
    q, k, v = (
        torch.randn(n, D, dtype=torch.float64),
        torch.randn(m, D, dtype=torch.float64),
        torch.randn(m, D, dtype=torch.float64),
    )
    mask = torch.rand(n, m) < 0.5
    mask[2] = False  # an empty row
    weights = torch.randn(n, D, dtype=torch.float64)
    edges = sbm.Edges.from_mask(mask[None])
    p = torch.rand(edges.E, dtype=torch.float64, requires_grad=True)
    y = sbm.EdgeAttention.apply(q, k, v, p, edges, None, 0.0, ste)
    (grad_p,) = torch.autograd.grad((y * weights).sum(), p)

    scores = q @ k.T / math.sqrt(D)
    m_float = mask.double().requires_grad_()
    logits = m_float * scores  # A := M ⊙ QKᵀ/√d
    alpha = logits.masked_fill(~mask, -math.inf).softmax(-1).nan_to_num(0.0)
    grad_m, grad_a = torch.autograd.grad((alpha @ v * weights).sum(), [m_float, logits])
    expected = grad_m if ste == "paper" else grad_a.clamp(-1, 1)  # official: hardtanh(∂L/∂A) on edges
    torch.testing.assert_close(grad_p, expected[mask], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_m[mask], (grad_a * scores)[mask])  # Eq. 9's product form


@pytest.mark.parametrize("dropout", [False, True])
def test_gradcheck_edge_attention(dropout):
    torch.manual_seed(0)
    n = 7
    mask = torch.rand(2, n, n) < 0.4
    mask[0, 3] = False
    edges = sbm.Edges.from_mask(mask)
    q, k, v = (torch.randn(2 * n, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    p = torch.rand(edges.E, dtype=torch.float64)
    keep = torch.rand(edges.E) > 0.3 if dropout else None
    assert torch.autograd.gradcheck(
        lambda a, b, c: sbm.EdgeAttention.apply(a, b, c, p, edges, keep, 0.3, "paper"), (q, k, v)
    )


def test_edge_attention_double_backward_is_refused():
    """A second derivative through EdgeAttention's sparse products would be silently wrong: torch.autograd.grad of
    a gradient penalty left out EdgeAttention's part, and gradgradcheck found a mismatch rather than a refusal.
    Now create_graph=True through it raises, gradgradcheck included; the reference path, dense, differentiates twice."""
    torch.manual_seed(0)
    edges = sbm.Edges.from_mask(torch.rand(2, 7, 7) < 0.4)
    q, k, v = (torch.randn(14, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    p = torch.rand(edges.E, dtype=torch.float64)
    attend = lambda a, b, c: sbm.EdgeAttention.apply(a, b, c, p, edges, None, 0.0, "paper")  # noqa: E731
    refusal = "EdgeAttention has no second derivative"
    with pytest.raises(RuntimeError, match=refusal):  # a gradient penalty
        torch.autograd.grad(attend(q, k, v).square().sum(), [q, k, v], create_graph=True)
    with pytest.raises(RuntimeError, match=refusal):
        torch.autograd.gradgradcheck(attend, (q, k, v), raise_exception=False)
    x = torch.randn(2, 7, DIM, dtype=torch.float64, requires_grad=True)
    for path in sbm.PATHS:
        module = make(path=path)
        forward = lambda x: module(x, generator=seeded(0))[0]  # noqa: E731
        if path == "fast":
            with pytest.raises(RuntimeError, match=refusal):
                torch.autograd.grad(forward(x).square().sum(), x, create_graph=True)
        else:
            (grad_x,) = torch.autograd.grad(forward(x).square().sum(), x, create_graph=True)
            assert torch.isfinite(torch.autograd.grad(grad_x.square().sum(), x)[0]).all()


@pytest.mark.parametrize("density", [0.01, 0.05])
def test_at_density_places_the_module_at_that_expected_and_sampled_density(density):
    """sbm.at_density shifts the membership logits by one constant: the expected density Σ(p + δ)/pairs
    is the one asked for, the fast path samples about it, and the shift is all it changes (β = 0: the
    module as built)."""
    module = make(torch.float32, clusters=16)
    x = torch.randn(2, 256, DIM)
    with torch.no_grad():
        plain, _ = module(x, generator=seeded(1))
        sbm.at_density(module, x, density)
        assert module.shift < 0
        q, k, _ = qkv(module, x)
        x_hat, z_hat = module.memberships(q), module.memberships(k)
        expected = fastrg.expected_edges(x_hat, module.block_matrix(), z_hat)
        assert abs(float(expected.sum()) / (2 * H * 256**2) + module.delta - density) < 1e-6
        sampled = module(x, generator=seeded(1))[1]["density"]
        assert ((sampled - density).abs() < 0.15 * density).all(), sampled
        module.shift = 0.0
        assert torch.equal(module(x, generator=seeded(1))[0], plain)


def test_straight_through_edges_are_the_mask_with_the_gradient_of_p_and_dropout_matches_a_dense_computation():
    """Forward M_e = 1 on every edge and the edge count per graph; backward the gradient of p_e = x_i · w_j
    (differentiated densely), the counts' included; with self-loops, none into the forced edges."""
    torch.manual_seed(0)
    n, kk = 6, 4
    mask = torch.rand(3, n, n) < 0.5
    mask[:, 2, 2] = True  # (i, i) edges, forced with self-loops
    edges = sbm.Edges.from_mask(mask)
    x, w = (
        torch.rand(3 * n, kk, dtype=torch.float64, requires_grad=True),
        torch.rand(3 * n, kk, dtype=torch.float64, requires_grad=True),
    )
    grad, grad_counts = torch.randn(edges.E, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    for self_loops in (False, True):
        dense = torch.einsum("rik,rjk->rij", x.view(3, n, kk), w.view(3, n, kk))  # p = x wᵀ per graph
        m, counts = sbm.StraightThroughEdges.apply(x, w, edges, self_loops)
        assert torch.equal(m, torch.ones(edges.E, dtype=torch.float64)) and m.stride() == (0,)  # no memory
        assert torch.equal(counts, mask.sum((1, 2)).double())
        dx, dw = torch.autograd.grad([m, counts], [x, w], [grad, grad_counts])
        g = grad + grad_counts[:, None, None].expand(3, n, n)[mask]  # each edge's share of its graph's count
        if self_loops:
            g = g.masked_fill(torch.eye(n, dtype=torch.bool).expand(3, n, n)[mask], 0.0)
        torch.testing.assert_close((dx, dw), torch.autograd.grad(dense[mask], [x, w], g))
    _, counts = sbm.StraightThroughEdges.apply(x, w, edges, False)
    assert torch.autograd.grad(counts.sum(), x)[0].abs().sum() > 0  # the counts alone, the mask unused
    # dropout: weights α·keep/(1 − p) on the edges
    q, k, v = (torch.randn(3, n, D, dtype=torch.float64) for _ in range(3))
    keep = torch.rand(edges.E) > 0.25
    y = sbm.EdgeAttention.apply(
        q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D), m.detach(), edges, keep, 0.25, "paper"
    )
    alpha = (q @ k.transpose(1, 2) / math.sqrt(D)).masked_fill(~mask, -math.inf).softmax(-1).nan_to_num(0.0)
    dropped = torch.zeros_like(alpha)
    dropped[mask] = alpha[mask] * keep / 0.75
    torch.testing.assert_close(y.view(3, n, D), dropped @ v)


@pytest.mark.parametrize(
    "causal, padded, self_loops, ste, dropout, weight",
    [
        (False, False, False, "paper", 0.0, 0.0),
        (True, True, False, "paper", 0.2, 0.1),
        (False, True, True, "official", 0.0, 0.1),
        (True, False, True, "paper", 0.2, 0.0),
    ],
)
@pytest.mark.parametrize("off_cpu", [False, True])
def test_chunks_of_queries_and_keys_change_no_bit(
    causal, padded, self_loops, ste, dropout, weight, off_cpu, monkeypatch
):
    """The fast path takes its per-edge work a chunk of queries (keys) at a time (off the CPU, simulated, of whole
    graphs): thinning, softmax, products, the STE; the key-major copy a block of graphs at a time. With chunks of
    about 5 edges and a block a graph the graph, outputs, densities and every gradient are the same, bit for bit,
    as with one chunk and block (same kernels, same values, the thinning's uniforms drawn in the same order)."""
    if off_cpu:
        monkeypatch.setattr(fastrg, "host_syncs", lambda device: True)
    sampled, draw = [], sbm.sample_edges
    monkeypatch.setattr(sbm, "sample_edges", lambda *args: sampled.append(draw(*args)) or sampled[-1])
    results = []
    for chunk, block in ((sbm.CHUNK, sbm.BLOCK), (5, 7)):
        monkeypatch.setattr(sbm, "CHUNK", chunk)
        monkeypatch.setattr(sbm, "BLOCK", block)
        module = make(ste=ste, self_loops=self_loops, density_weight=weight, dropout=dropout)
        x = torch.randn(3, 10, DIM, dtype=torch.float64, generator=seeded(8), requires_grad=True)
        y, stats = module(x, padding() if padded else None, causal, generator=seeded(9))
        loss = (y * torch.randn(y.shape, dtype=y.dtype, generator=seeded(10))).sum() + stats.get("aux_loss", 0)
        grads = torch.autograd.grad(loss, [x] + list(module.parameters()))
        results.append(
            [sampled[-1].row_ptr, sampled[-1].col, y, stats["density"], stats["density_per_example"], *grads]
        )
    assert sampled[-1].E > 10 * 5  # many chunks
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_between_forward_and_backward_a_layer_keeps_only_its_graph(dropout):
    """EdgeAttention saves per-query and dense tensors, and per edge only the dropout mask when there is one: the
    scores and α are recomputed in the backward, and the key-major copy of the graph is built there too, used by
    the STE's backward and freed at its end."""
    module = make(dropout=dropout)
    x = torch.randn(2, 12, DIM, dtype=torch.float64, requires_grad=True)
    q, k, v = qkv(module, x)
    valid = torch.ones(2, 12, dtype=torch.bool)
    graph = module.sample(q, k, valid, False, seeded(3))
    y, _, _ = module.attend(q, k, v, graph, valid, seeded(4))
    edges = graph["edges"]
    saved = [
        t for t in y.grad_fn.next_functions[0][0].saved_tensors if t is not None
    ]  # the view's input: EdgeAttention
    assert [t.dtype for t in saved if t.shape == (edges.E,)] == ([torch.bool] if dropout else [])
    assert edges._key_major is None
    built = []
    key_major = edges.key_major
    edges.key_major = lambda: built.append(1) or key_major()
    y.sum().backward()
    assert built and edges._key_major is None  # built by the backward, used by the STE's, then freed


def transposed(edges: sbm.Edges, values: torch.Tensor) -> torch.Tensor:
    """csr(values)ᵀ as a dense (R·M, R·N) matrix, from the key-major copy a chunk of keys at a time."""
    return torch.cat([part.csr(values[at]).to_dense() for _, at, part in edges.chunks(key_major=True)])


def test_edges_hold_one_graph_in_query_and_key_order():
    mask = torch.rand(3, 5, 7) < 0.4
    edges = sbm.Edges.from_mask(mask)
    assert torch.equal(edges.to_mask(), mask) and edges.E == mask.sum()
    assert torch.equal(edges.per_graph(), mask.sum((1, 2)).int())
    dense_t = torch.block_diag(*mask.transpose(1, 2).float())  # (R·M, R·N)
    assert torch.equal(transposed(edges, torch.ones(edges.E)), dense_t)
    values = torch.arange(edges.E, dtype=torch.float32)
    assert torch.equal(transposed(edges, values), edges.csr(values).to_dense().T)


@pytest.mark.parametrize("chunk, block", [(1, 1), (4, 1), (4, 30), (1000, 1 << 21)])
def test_chunks_cover_every_query_and_key_once_and_are_rows_of_the_whole(chunk, block, monkeypatch):
    """Edges.chunks: consecutive ranges of whole queries (keys), about `chunk` edges each (one query alone may
    hold more), with empty queries (keys) covered too, the key-major copy built in blocks of whole graphs (about
    `block` edges); each part's CSR is its rows of the whole (transposed) graph."""
    monkeypatch.setattr(sbm, "CHUNK", chunk)
    monkeypatch.setattr(sbm, "BLOCK", block)
    mask = torch.rand(3, 5, 7, generator=seeded(4)) < 0.4
    mask[1] = False  # a graph without edges
    mask[2, :, 3] = True  # a key in every row
    edges = sbm.Edges.from_mask(mask)
    values = torch.arange(1, edges.E + 1, dtype=torch.float64)
    for key_major, whole, width in (
        (False, edges.csr(values).to_dense(), 3 * 7),
        (True, edges.csr(values).to_dense().T, 3 * 5),
    ):
        covered = 0
        for start, at, part in edges.chunks(key_major):
            assert start == covered and part.R == 1 and part.M == width
            assert part.N == 1 or part.E <= max(chunk, 1)
            assert torch.equal(part.csr(values[at]).to_dense(), whole[start : start + part.N])
            covered += part.N
        assert covered == whole.shape[0]
    assert len(edges.key_major()[1]) == (3 if block == 1 else 1)  # a block a graph, or all in one


@pytest.mark.parametrize("chunk, off_cpu", [(sbm.CHUNK, False), (50, False), (50, True)])
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_sampler_draws_bernoulli_min_one_p_plus_delta(causal, chunk, off_cpu, monkeypatch):
    """T graphs of one input: the frequency of every pair matches min(1, p + δ), including pairs with π ≥ 1
    (memberships at 1, where plain fastRG would give 1 − e^(−π) ≤ 0.64); 5σ binomial bounds. Thinned in one
    chunk of queries, and in chunks of about 50 edges (a few queries each, or off the CPU (simulated) a graph,
    repeats and thinned pairs flagged in place: the same law)."""
    monkeypatch.setattr(sbm, "CHUNK", chunk)
    if off_cpu:
        monkeypatch.setattr(fastrg, "host_syncs", lambda device: True)
    torch.manual_seed(0)
    module = sbm.SBMAttention(DIM, 1, D, clusters=3, delta=0.01).double().train()
    n, T = 6, 4000
    x = torch.rand(n, 3, dtype=torch.float64) * 0.3
    z = torch.rand(n, 3, dtype=torch.float64) * 0.3
    x[[0, 2, 4]], z[[0, 1, 4]] = 1.0, 1.0  # p = ΣŜ = 1 on these pairs, π = 1.01
    block = module.block_matrix().detach()  # (1, 3, 3)
    w = z @ block[0].T
    valid = torch.ones(T, n, dtype=torch.bool)
    edges = sbm.sample_edges(
        x.expand(T, 1, n, 3),
        z.expand(T, 1, n, 3),
        w.expand(T, 1, n, 3),
        block,
        valid,
        causal,
        module.exploration(),
        False,
        seeded(3),
    )
    freq = edges.to_mask().double().mean(0)  # (N, M)
    prob = (x @ w.T + 0.01).clamp(max=1.0)
    if causal:
        prob = prob.tril()
    assert (prob == 1).sum() >= 4 and prob[prob > 0].min() < 0.05  # both regimes are tested
    z = (freq - prob) / (prob * (1 - prob) / T).sqrt().clamp_min(1e-3)
    assert z.abs().max() < 5, z
    assert (freq[prob == 1] > 0.995).all()


@pytest.mark.parametrize("path", sbm.PATHS)
def test_initial_density_is_about_25_percent_with_the_lra_dims(path):
    """App. C: Kaiming-normal clusters give ≈ 25% initial density (2 heads, head dim 32, k = 128); +δ in
    training."""
    torch.manual_seed(0)
    module = sbm.SBMAttention(64, 2, 32, clusters=128, path=path)
    x = torch.randn(2, 256, 64)
    with torch.no_grad():
        density = module.eval()(x, generator=seeded(0))[1]["density"]
        assert ((density - 0.25).abs() < 0.01).all(), density
        density = module.train()(x, generator=seeded(0))[1]["density"]
        assert ((density - 0.26).abs() < 0.01).all(), density


@pytest.mark.parametrize("path", sbm.PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_padding_invariance(path, causal):
    module = make(path=path)
    x = torch.randn(3, 10, DIM, dtype=torch.float64)
    mask = padding()
    y, stats = module(x, mask, causal, generator=seeded(5))
    changed = x.clone()
    changed[mask] = torch.randn(int(mask.sum()), DIM, dtype=torch.float64) * 10
    y2, stats2 = module(changed, mask, causal, generator=seeded(5))
    torch.testing.assert_close(y2[~mask], y[~mask], rtol=0, atol=0)
    assert torch.equal(stats["density"], stats2["density"])
    if path == "fast":  # padded keys never get an edge, padded queries send none
        q, k, _ = qkv(module, x)
        edges = module.sample(q, k, ~mask, causal, seeded(5))["edges"].to_mask().view(3, H, 10, 10)
        assert not edges[mask[:, None, :, None].expand_as(edges)].any()
        assert not edges[mask[:, None, None, :].expand_as(edges)].any()


def test_causal_never_sees_the_future():
    """Dense path: outputs up to t are unchanged when tokens after t change (same generator). Sparse path: no
    edge ever points to the future, and with the graph fixed the future cannot change the past."""
    module = make(path="reference")
    x = torch.randn(2, 10, DIM, dtype=torch.float64)
    y, _ = module(x, causal=True, generator=seeded(2))
    for t in (0, 4, 8):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
        y2, _ = module(changed, causal=True, generator=seeded(2))
        torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=0, atol=0)
    module.path = "fast"
    q, k, v = qkv(module, x)
    graph = module.sample(q, k, torch.ones(2, 10, dtype=torch.bool), True, seeded(2))
    assert not graph["edges"].to_mask().triu(1).any()
    valid = torch.ones(2, 10, dtype=torch.bool)
    y, _, _ = module.attend(q, k, v, graph, valid, None)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 6:], v2[:, :, 6:] = torch.randn_like(k2[:, :, 6:]), torch.randn_like(v2[:, :, 6:])
    y2, _, _ = module.attend(q, k2, v2, graph, valid, None)
    torch.testing.assert_close(y2[:, :, :6], y[:, :, :6], rtol=0, atol=0)


@pytest.mark.parametrize("path", sbm.PATHS)
def test_rows_without_edges_give_zeros_and_finite_gradients(path):
    module = make(path=path)
    x = torch.randn(2, 6, DIM, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0] = True  # every token of sample 0 is padding: no edges at all
    y, stats = module(x, mask, generator=seeded(0))
    torch.testing.assert_close(y[0], module.out.bias.expand(6, -1))
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[0].abs().max() == 0
    module.zero_grad()
    y, _ = module(x, torch.ones(2, 6, dtype=torch.bool), generator=seeded(0))  # the whole batch: no edge drawn
    y.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)
    edges = sbm.Edges.from_mask(torch.zeros(2, 4, 4, dtype=torch.bool))  # the empty graph
    q = torch.randn(8, D, dtype=torch.float64, requires_grad=True)
    out = sbm.EdgeAttention.apply(q, q, q, torch.zeros(0, dtype=torch.float64), edges, None, 0.0, "paper")
    out.sum().backward()
    assert out.abs().max() == 0 and q.grad.abs().max() == 0


@pytest.mark.on_device
@pytest.mark.usefixtures("default_device")
@pytest.mark.parametrize("path", sbm.PATHS)
def test_never_nan_on_extreme_inputs_and_same_generator_same_draw(path):
    module = make(path=path, dtype=torch.float32)
    x = torch.randn(2, 12, DIM) * 1e3
    y, stats = module(x, generator=seeded(4))
    assert torch.isfinite(y).all() and torch.isfinite(stats["density"]).all()
    y2, _ = module(x, generator=seeded(4))
    assert torch.equal(y, y2)


def test_density_reports_per_head_and_the_regulariser_has_a_gradient():
    module = make(density_weight=0.2)
    x = torch.randn(2, 8, DIM, dtype=torch.float64)
    _, stats = module(x, generator=seeded(0))
    assert stats["density"].shape == (H,) and not stats["density"].requires_grad
    assert stats["density_per_example"].shape == (2, H)
    torch.testing.assert_close(stats["aux_loss"], 0.2 * stats["density"].mean())
    stats["aux_loss"].backward()
    assert module.centers.grad.abs().sum() > 0 and module.qkv.weight.grad.abs().sum() > 0
    assert "aux_loss" not in make()(x)[1]  # λ = 0: no regulariser term


def test_flops_are_counted_from_the_edges():
    """Scores 2·E·D, aggregation 2·E·D, softmax 5·E (max, subtract, exp, sum, divide): nothing per pair."""
    n = 16
    mask = torch.rand(2, n, n) < 0.3
    edges = sbm.Edges.from_mask(mask)
    q = torch.randn(2 * n, D)
    count = measure.count_flops(
        lambda: sbm.EdgeAttention.apply(q, q, q, torch.zeros(edges.E), edges, None, 0.0, "paper")
    )["total"]
    assert count == 4 * edges.E * D + 5 * edges.E


def test_invalid_arguments_raise():
    for kwargs in (
        {"clusters": 0},
        {"delta": 1.0},
        {"density_weight": -1.0},
        {"path": "dense"},
        {"ste": "clip"},
        {"dropout": 1.0},
    ):
        with pytest.raises(ValueError):
            sbm.SBMAttention(DIM, H, D, **kwargs)
    for mask in (torch.zeros(2, 4, dtype=torch.bool), torch.zeros(2, 5)):
        with pytest.raises(ValueError, match="key_padding_mask"):
            make()(torch.randn(2, 5, DIM, dtype=torch.float64), mask)


def test_factory_splits_lambda_over_layers_and_official_preset():
    cfg = sbm.SBMConfig(density_weight=0.1)
    layers = [sbm.make_attention_factory(cfg, DIM, H, D, 0.0, 2)(i) for i in range(2)]
    assert all(math.isclose(layer.density_weight, 0.05) for layer in layers)
    official = sbm.SBMConfig.official()
    assert (official.path, official.ste, official.explore_in_eval, official.shared_mlp) == (
        "reference",
        "official",
        True,
        True,
    )
    module = sbm.make_attention_factory(official, DIM, H, D, 0.0, 1)(0).eval()
    assert module.exploration() == 0.01 and module.mlp_w.shape[1] == 1


@pytest.mark.parametrize(
    "extra, path", [([], "reference"), (["--path", "fast"], "fast"), (["--official", "--self-loops"], "reference")]
)
def test_command_line_trains_and_records_density_per_layer_and_head(tmp_path, extra, path):
    out = tmp_path / "run"
    argv = [
        "--task",
        "duplicates",
        "--seq-len",
        "32",
        "--steps",
        "3",
        "--batch-size",
        "4",
        "--eval-every",
        "3",
        "--eval-batches",
        "1",
        "--final-eval-batches",
        "2",
        "--clusters",
        "8",
        "--density-weight",
        "0.01",
        "--out",
        str(out),
    ] + extra
    assert sbm.main(argv) == 0
    record = json.loads((out / "metrics.json").read_text())
    assert record["method"] == "sbm" and record["sbm"]["clusters"] == 8 and record["sbm"]["path"] == path
    profile = record["sbm"]["density"]
    assert len(profile["mean"]) == 1 and len(profile["mean"][0]) == 1 and 0 < profile["mean"][0][0] <= 1
    assert 0 < record["flops_per_example"]["attention"]
    explored = record["sbm"].get("test_with_exploration")  # a second test pass with δ kept, where eval drops it
    if "--official" in extra:
        assert explored is None
    else:
        assert 0 <= explored["metric"] <= 1 and 0 < explored["density"] <= 1


def test_density_from_holds_the_regulariser_back_until_its_step(tmp_path):
    """λ with --density-from at the last step trains exactly as λ = 0 does; from the middle, the same steps up to
    there, then the regulariser thins the graph (its training density falls below λ = 0's)."""

    def train(*extra):
        out = tmp_path / "-".join(extra)
        argv = [
            "--task",
            "duplicates",
            "--seq-len",
            "32",
            "--steps",
            "40",
            "--batch-size",
            "4",
            "--eval-every",
            "20",
            "--eval-batches",
            "1",
            "--final-eval-batches",
            "2",
            "--clusters",
            "8",
            "--lr",
            "3e-3",
            "--out",
            str(out),
            *extra,
        ]
        assert sbm.main(argv) == 0
        log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        at_20 = [{k: v for k, v in entry.items() if k != "time"} for entry in log if entry["step"] == 20]
        return {**json.loads((out / "metrics.json").read_text()), "step 20": at_20}

    free, held, later = (
        train(*extra)
        for extra in (
            ["--density-weight", "0"],
            ["--density-weight", "1", "--density-from", "40"],
            ["--density-weight", "1", "--density-from", "20"],
        )
    )
    assert held["train_density"] == free["train_density"] and held["test"] == free["test"]
    assert later["step 20"] == free["step 20"] and free["step 20"][0]["split"] == "valid"
    assert later["train_density"] < free["train_density"]


def test_exploration_is_delta_in_training_and_in_evaluation_only_where_asked():
    model = torch.nn.Sequential(*[sbm.SBMAttention(DIM, H, D, clusters=4, delta=0.05) for _ in range(2)]).eval()
    model[1].explore_in_eval = True
    assert [m.exploration() for m in model] == [0.0, 0.05]
    assert [m.exploration() for m in model.train()] == [0.05, 0.05]


@pytest.mark.parametrize("bad", [["--attn", "clusters=2"], ["--clusters", "0"], ["--path", "dense"]])
def test_command_line_rejects_bad_settings_with_exit_2(bad):
    with pytest.raises(SystemExit) as exc:
        sbm.main(["--task", "duplicates"] + bad)
    assert exc.value.code == 2


def test_a_forward_and_backward_emit_no_warning():
    """torch says once per process that sparse CSR tensors are "in beta"; the SBM attention builds its CSR tensors
    with exactly that notice silenced, so a fresh process (where the notice would come) shows no warning at all."""
    code = (
        "import warnings, torch, sbm_transformer as sbm\n"
        "warnings.simplefilter('error')\n"
        "padding = torch.zeros(2, 8, dtype=torch.bool)\n"
        "padding[1, 6:] = True\n"
        "for path in sbm.PATHS:\n"
        "    module = sbm.SBMAttention(16, 2, 8, 0.1, clusters=4, path=path, density_weight=0.1).train()\n"
        "    x = torch.randn(2, 8, 16, requires_grad=True)\n"
        "    y, stats = module(x, padding, causal=True, generator=torch.Generator().manual_seed(0))\n"
        "    (y.sum() + stats['aux_loss']).backward()\n"
        "    module.eval()(x)\n"
        "print('ok')\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "ok\n", ""), ran.stderr


def density_after_training(lr: float, steps: int, **options) -> tuple:
    """The README's learning-rate probe: its SBM block (k = 16, λ as given, causal) on a
    causal toy task (each token's label: whether 1s are the majority so far, which any attention that keeps a
    share of the past can learn), AdamW; the layer's density at the start and after `steps` steps."""
    torch.manual_seed(0)
    attention = sbm.SBMAttention(64, 2, 32, clusters=16, path="reference", **options)
    embed, norm, head = torch.nn.Embedding(2, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 2)
    params = [p for m in (attention, embed, norm, head) for p in m.parameters()]
    optimizer, generator, densities = torch.optim.AdamW(params, lr=lr), seeded(0), []
    for _ in range(steps + 1):
        tokens = (torch.rand(32, 64, generator=generator) < torch.rand(32, 1, generator=generator)).long()
        labels = (tokens.cumsum(1) * 2 > torch.arange(1, 65)).long()
        x = embed(tokens)
        y, stats = attention(norm(x), causal=True, generator=generator)
        loss = torch.nn.functional.cross_entropy(head(x + y).flatten(0, 1), labels.flatten())
        densities.append(float(stats["density"].mean()))
        optimizer.zero_grad()
        (loss + stats.get("aux_loss", 0)).backward()
        optimizer.step()
    return densities[0], densities[-1]


@pytest.mark.parametrize(
    "lr, options, holds",
    [
        (3e-4, dict(density_weight=1e-2), True),  # the stated working range
        (3e-3, dict(density_weight=0.0), False),  # Eq. 9 at a high rate: the density collapses, λ = 0 included
        (3e-3, dict(density_weight=0.0, ste="official"), True),
    ],
)  # the clipped estimator holds it
def test_learning_rate_probe_of_the_readme(lr, options, holds):
    start, end = density_after_training(lr, 100, **options)
    assert (end > 0.7 * start) == holds, (start, end)


# ---------------------------------------------------------------- the density bound of Eq. 5 on a matching graph
@pytest.mark.parametrize("clusters", [2, 4, 16])
def test_eq5_forces_density_at_least_recall_squared_on_a_matching_graph(clusters):
    """Ŝ of Eq. 5 is one distribution over all k² block pairs and memberships lie in (0, 1), so on a graph that
    links each query i to one key, key i (a token and its duplicate), recall r = mean_i P_ii and density
    ρ = mean_ij P_ij satisfy ρ ≥ r²: r ≤ Σ_uv Ŝ_uv min(q̄_u, k̄_v) ≤ Σ_uv Ŝ_uv √(q̄_u k̄_v) ≤ √ρ by Jensen (q̄, k̄
    the mean memberships). Checked on the module's own Ŝ and memberships while Adam asks for recall without
    density, and tight: one-hot memberships and Ŝ = I/k give r = 1/k, ρ = 1/k²."""
    torch.manual_seed(clusters)
    n = 4 * clusters
    attn = sbm.SBMAttention(16, 1, 8, clusters=clusters).double()
    inputs = torch.nn.Parameter(torch.randn(2, 1, 1, n, 8, dtype=torch.float64))  # queries' and keys' (B, H, N, D)
    optimizer = torch.optim.Adam([*attn.parameters(), inputs], lr=0.05)
    ratios = []
    for _ in range(300):
        q_hat, k_hat = (attn.memberships(x)[0, 0] for x in inputs)  # (N, K) each, Eq. 6
        p = q_hat @ attn.block_matrix()[0] @ k_hat.T  # (N, M): Eq. 7 before δ
        density, recall = p.mean(), p.diagonal().mean()
        assert density >= recall**2 - 1e-12
        ratios.append((recall**2 / density).item())
        optimizer.zero_grad()
        (density - recall).backward()
        optimizer.step()
    assert ratios[-1] > 0.9 > ratios[0]  # the optimum presses against the bound, not only respects it
    one_hot = torch.eye(clusters, dtype=torch.float64).repeat_interleave(n // clusters, 0)  # (N, K)
    p = one_hot @ (torch.eye(clusters, dtype=torch.float64) / clusters) @ one_hot.T
    torch.testing.assert_close(p.mean(), p.diagonal().mean() ** 2)
