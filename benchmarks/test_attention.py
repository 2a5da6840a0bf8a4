"""Forward+backward of every registered attention (bench.methods.available), each with its default
budget, in training mode, non-causal, batch 1, 2 heads, head dim 32: experiments.scaling's cell, one group per n."""

import inspect

import pytest
import torch

from bench.methods import available, get

HEADS, HEAD_DIM = 2, 32


@pytest.mark.parametrize("method", sorted(available()))
def test_attention_fwd_bwd(attention_fwd_bwd, method, n):
    cls = get(method).load()
    options = {"max_len": n} if "max_len" in inspect.signature(cls).parameters else {}
    torch.manual_seed(0)
    module = cls(HEADS * HEAD_DIM, HEADS, HEAD_DIM, 0.0, **options)
    x = torch.randn(1, n, HEADS * HEAD_DIM, requires_grad=True)
    attention_fwd_bwd(module, x, f"attention fwd+bwd, n={n}")
