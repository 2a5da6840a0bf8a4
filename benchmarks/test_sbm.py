"""SBM-Transformer at controlled densities (experiments.sbm_scaling's cells): the attention core
(sbm_transformer.EdgeAttention on a fixed uniform random graph, the graph's structures built inside the timed
call: the key-major copy in the backward) and the whole SBMAttention module with its membership logits shifted so
that the expected density is d. The core's saved run also records what its forward keeps for the backward, in
bytes an edge (the graph alone: 4)."""

import pytest
import torch

import sbm_transformer
from experiments.sbm_scaling import random_graph
from experiments.scaling import shifted_module

HEADS, HEAD_DIM = 2, 32
DENSITIES = [0.01, 0.05]


@pytest.mark.parametrize("density", DENSITIES, ids=[f"d{d:g}" for d in DENSITIES])
def test_sbm_core_fwd_bwd(benchmark, n, density):
    torch.manual_seed(0)
    row_ptr, col = random_graph(HEADS, n, density, torch.Generator().manual_seed(0))
    q, k, v = (torch.randn(HEADS * n, HEAD_DIM, requires_grad=True) for _ in range(3))
    p = torch.rand(len(col), requires_grad=True)
    grad = torch.randn(HEADS * n, HEAD_DIM)

    def forward_backward():
        edges = sbm_transformer.Edges.from_csr(row_ptr, col, HEADS, n, n)
        sbm_transformer.EdgeAttention.apply(q, k, v, p, edges, None, 0.0, "paper").backward(grad)

    benchmark.group = f"SBM core fwd+bwd, n={n}"
    benchmark(forward_backward)
    benchmark.extra_info["density"] = len(col) / (HEADS * n * n)
    y = sbm_transformer.EdgeAttention.apply(
        q, k, v, p, sbm_transformer.Edges.from_csr(row_ptr, col, HEADS, n, n), None, 0.0, "paper"
    )
    per_edge = [t for t in y.grad_fn.saved_tensors if t is not None and t.shape == (len(col),)]
    benchmark.extra_info["saved_bytes_per_edge"] = (
        col.element_size()  # the graph, and E-sized saved values
        + sum(t.element_size() for t in per_edge)
    )


@pytest.mark.parametrize("density", DENSITIES, ids=[f"d{d:g}" for d in DENSITIES])
def test_sbm_module_fwd_bwd(attention_fwd_bwd, n, density):
    torch.manual_seed(0)
    x = torch.randn(1, n, HEADS * HEAD_DIM, requires_grad=True)
    module = shifted_module(HEADS * HEAD_DIM, HEADS, HEAD_DIM, x, density, "fast")
    attention_fwd_bwd(module, x, f"SBM module fwd+bwd, n={n}")
