"""LinearAttention (Katharopoulos et al. 2020): the quadratic form it must equal (chunked causal scan, masks), its
density. The interface contract (float32 under autocast, the repr's budget) is tests/test_interface.py."""

import pytest
import torch
import torch.nn.functional as F

from baselines.full import FullAttention
from baselines.linear import LinearAttention

B, N, DIM, H, D = 2, 21, 16, 2, 8


def padding_mask() -> torch.Tensor:
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[0, :3] = True  # leading padding: queries 0-2 have no admissible key when causal
    pad[1, 15:] = True
    return pad


def quadratic_form(q, k, v, pad, causal):
    """Eq. 2-3 written out: φ(Q)φ(K)ᵀ with masks, row-normalised, times V (empty rows → 0)."""
    sim = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2)  # (B, H, N, M)
    allowed = ~pad[:, None, None, :] if pad is not None else torch.ones(1, 1, 1, k.shape[-2], dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    sim = sim * allowed
    den = sim.sum(-1, keepdim=True)
    return sim @ v / torch.where(den > 0, den, 1.0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [1, 4, 64])  # chunk does not divide N, and chunk > N
def test_equals_quadratic_form(causal, chunk):
    torch.manual_seed(0)
    attn = LinearAttention(DIM, H, D, chunk=chunk)
    q, k, v = torch.randn(3, B, H, N, D, dtype=torch.float64)
    pad = padding_mask()
    torch.testing.assert_close(attn.core(q, k, v, pad, causal), quadratic_form(q, k, v, pad, causal))
    torch.testing.assert_close(attn.core(q, k, v, None, causal), quadratic_form(q, k, v, None, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_density_is_full_attentions(causal):
    """Every admissible pair influences the output, so the density is full attention's (module docstring)."""
    torch.manual_seed(0)
    attn = LinearAttention(DIM, H, D, chunk=4)
    x, pad = torch.randn(B, N, DIM), padding_mask()
    pad[1] = True  # one sample entirely padding
    _, stats = attn(x, pad, causal)
    _, ref_stats = FullAttention(DIM, H, D)(x, pad, causal)
    torch.testing.assert_close(stats["density"], ref_stats["density"])
