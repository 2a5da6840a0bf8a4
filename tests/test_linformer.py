"""LinformerAttention (Wang et al. 2020): the max_len it must refuse past, its exact limit E = F = I, masks, its
density and the gradient of unused projection columns. The interface contract (the causal refusal, shapes,
finite gradients, float32 under autocast, the repr's budget) is tests/test_interface.py."""

import pytest
import torch

from baselines.full import FullAttention
from baselines.linformer import LinformerAttention

B, N, DIM, H, D = 2, 21, 16, 2, 8


def padding_mask() -> torch.Tensor:
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[0, :3] = True
    pad[1, 15:] = True
    return pad


def test_rejects_inputs_longer_than_max_len():
    attn = LinformerAttention(DIM, H, D, rank=4, max_len=N)
    with pytest.raises(ValueError, match="max_len"):
        attn(torch.randn(B, N + 1, DIM))


def test_identity_projections_equal_softmax_attention():
    torch.manual_seed(0)
    attn = LinformerAttention(DIM, H, D, rank=N, max_len=N)
    with torch.no_grad():
        attn.E.copy_(torch.eye(N))
        attn.F.copy_(torch.eye(N))
    full = FullAttention(DIM, H, D, path="reference")
    full.load_state_dict({name: t for name, t in attn.state_dict().items() if name not in ("E", "F")})
    x = torch.randn(B, N, DIM)
    torch.testing.assert_close(attn(x)[0], full(x)[0])


def test_right_padding_equals_the_shorter_sequence():
    """Padded rows are removed before the projection, and a shorter input uses E's first columns."""
    torch.manual_seed(0)
    attn = LinformerAttention(DIM, H, D, rank=5, max_len=32)
    x = torch.randn(1, N, DIM)
    pad = torch.zeros(1, N, dtype=torch.bool)
    pad[0, 15:] = True
    torch.testing.assert_close(attn(x, pad)[0][:, :15], attn(x[:, :15])[0])


def test_density_is_full_attentions_and_unused_columns_get_no_gradient():
    torch.manual_seed(0)
    attn = LinformerAttention(DIM, H, D, rank=5, max_len=32)
    x = torch.randn(B, N, DIM, requires_grad=True)
    pad = padding_mask()
    pad[1] = True  # one sample entirely padding
    y, stats = attn(x, pad)
    _, ref_stats = FullAttention(DIM, H, D)(x, pad)
    torch.testing.assert_close(stats["density"], ref_stats["density"])
    y.square().sum().backward()
    assert (attn.F.grad[:, N:] == 0).all()  # columns beyond the input length are unused
    q, k, v = torch.randn(3, B, H, N, D)
    assert (attn.core(q, k, v, pad)[1] == 0).all()
