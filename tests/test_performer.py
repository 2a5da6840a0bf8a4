"""PerformerAttention (Choromanski et al. 2020): features, the quadratic form it must equal, stabilisation,
masks, redraw policy, and the approximation error falling as features grow."""

import math

import pytest
import torch

from baselines.full import FullAttention
from baselines.performer import PerformerAttention, orthogonal_gaussian_features

B, N, DIM, H, D = 2, 21, 16, 2, 8


def padding_mask() -> torch.Tensor:
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[0, :3] = True  # leading padding: queries 0-2 have no admissible key when causal
    pad[1, 15:] = True
    return pad


def allowed_pairs(pad, causal, n):
    allowed = ~pad[:, None, None, :] if pad is not None else torch.ones(1, 1, 1, n, dtype=torch.bool)
    return allowed & torch.ones(n, n, dtype=torch.bool).tril() if causal else allowed


def quadratic_form(q, k, v, omega, pad, causal):
    """φ(Q)φ(K)ᵀ (Lemma 1 features) masked, row-normalised, times V — in log space, so it stays exact for
    logits far beyond exp's range: log sim_ij = logsumexp_f(log φ(q_i)_f + log φ(k_j)_f)."""
    scale = q.shape[-1] ** -0.25
    log_phi = lambda x: (x * scale) @ omega.T - (x * scale).square().sum(-1, keepdim=True) / 2  # (B, H, N, K)
    log_sim = torch.logsumexp(log_phi(q).unsqueeze(-2) + log_phi(k).unsqueeze(-3), dim=-1)  # (B, H, N, M)
    allowed = allowed_pairs(pad, causal, q.shape[-2])
    weights = log_sim.masked_fill(~allowed, -math.inf).softmax(-1).nan_to_num(0.0)  # empty rows → 0
    return weights @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_equals_quadratic_form(causal, chunk):
    torch.manual_seed(0)
    attn = PerformerAttention(DIM, H, D, features=12, chunk=chunk).eval()
    q, k, v = torch.randn(3, B, H, N, D, dtype=torch.float64)
    omega = attn.omega.double()
    for pad in (padding_mask(), None):
        torch.testing.assert_close(attn.core(q, k, v, pad, causal), quadratic_form(q, k, v, omega, pad, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_stable_for_logits_beyond_exp_range(causal):
    """Keys of norm ~50: log-features span hundreds, so exp without a shift overflows float32."""
    torch.manual_seed(0)
    attn = PerformerAttention(DIM, H, D, features=16, chunk=4).eval()
    q, k, v = torch.randn(3, B, H, N, D, dtype=torch.float64)
    k = k * torch.linspace(1, 20, N, dtype=torch.float64)[:, None]
    y = attn.core(q.float(), k.float(), v.float(), padding_mask(), causal)
    ref = quadratic_form(q, k, v, attn.omega.double(), padding_mask(), causal)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("scale", [100.0, 1000.0])
def test_non_causal_gradients_stay_finite_at_large_input_scale(scale):
    """With one key shift over all features the denominators fell to denormals at input scale
    100 and 1/den² overflowed; per-feature key shifts keep every denominator ≥ 1 (module docstring)."""
    torch.manual_seed(0)
    attn = PerformerAttention(DIM, H, D, features=16).eval()
    x = (torch.randn(B, 33, DIM) * scale).requires_grad_()
    y, _ = attn(x)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())


def test_causal_future_does_not_reach_past_even_through_the_shift():
    """Future keys with the largest possible log-feature must not move past outputs, not even by rounding
    (a whole-sequence key max would, by ~1e-7 here): the key shift is a prefix max."""
    torch.manual_seed(0)
    attn = PerformerAttention(DIM, H, D, features=16, chunk=4).eval()
    q, k, v = torch.randn(3, B, H, N, D)
    k2, v2 = k.clone(), v.clone()
    longest = attn.omega[attn.omega.norm(dim=1).argmax()]
    k2[:, :, 10:] = D**0.25 * longest  # x = ω_f maximises ω_fᵀx − ‖x‖²/2, at ‖ω_f‖²/2
    v2[:, :, 10:] = torch.randn(B, H, N - 10, D)
    y = attn.core(q, k, v, None, True)
    y2 = attn.core(q, k2, v2, None, True)
    torch.testing.assert_close(y[:, :, :10], y2[:, :, :10], rtol=0, atol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_density_is_full_attentions(causal):
    """Every admissible pair influences the output, so the density is full attention's (module docstring)."""
    torch.manual_seed(0)
    attn = PerformerAttention(DIM, H, D, features=16, chunk=4)
    x, pad = torch.randn(B, N, DIM), padding_mask()
    pad[1] = True  # one sample entirely padding
    _, stats = attn(x, pad, causal)
    _, ref_stats = FullAttention(DIM, H, D)(x, pad, causal)
    torch.testing.assert_close(stats["density"], ref_stats["density"])


def test_orthogonal_features():
    omega = orthogonal_gaussian_features(20, 8, torch.Generator().manual_seed(0))  # blocks of 8, 8, 4 rows
    assert omega.shape == (20, 8)
    directions = omega / omega.norm(dim=1, keepdim=True)
    for block in (directions[:8], directions[8:16], directions[16:]):
        torch.testing.assert_close(block @ block.T, torch.eye(len(block)), rtol=0, atol=1e-5)
    norms = orthogonal_gaussian_features(4096, 8, torch.Generator().manual_seed(1)).norm(dim=1)
    assert abs(norms.square().mean().item() - 8.0) < 0.3  # chi(8): E‖ω‖² = 8


def test_unbiased_kernel_estimate():
    """Lemma 1: φ(x)ᵀφ(y) averages to exp(xᵀy)."""
    g = torch.Generator().manual_seed(0)
    x, y = 0.5 * torch.randn(2, 4, generator=g, dtype=torch.float64)
    omega = orthogonal_gaussian_features(200_000, 4, g).double()
    phi = lambda z: torch.exp(omega @ z - z.square().sum() / 2)
    estimate = (phi(x) * phi(y)).mean()
    assert abs(estimate.item() / torch.exp(x @ y).item() - 1) < 0.02


def test_redraw_policy_and_generator():
    torch.manual_seed(0)
    attn = PerformerAttention(DIM, H, D, features=16, redraw_interval=2)
    x = torch.randn(B, N, DIM)
    seen = []
    for _ in range(3):
        attn(x, generator=torch.Generator().manual_seed(5))
        seen.append(attn.omega.clone())
    torch.testing.assert_close(seen[0], seen[1])  # redraws on forwards 0 and 2, from the same seed
    torch.testing.assert_close(seen[0], seen[2])
    attn.redraw_features(torch.Generator().manual_seed(6))
    assert not torch.allclose(seen[0], attn.omega)
    attn.eval()
    fixed = attn.omega.clone()
    y1, _ = attn(x, generator=torch.Generator().manual_seed(7))
    y2, _ = attn(x)
    torch.testing.assert_close(attn.omega, fixed)  # eval never redraws
    torch.testing.assert_close(y1, y2)


def test_gradient_accumulation_across_redraws():
    attn = PerformerAttention(DIM, H, D, features=16).train()
    x = torch.randn(B, N, DIM)
    loss = attn(x)[0].sum() + attn(x)[0].sum()  # two redraws before one backward
    loss.backward()
    assert torch.isfinite(attn.qkv.weight.grad).all()


def test_error_falls_as_features_grow():
    """Relative error to exact softmax attention, averaged over draws, 16 → 256 features."""
    g = torch.Generator().manual_seed(0)
    errors = {}
    for m in (16, 256):
        attn, total = PerformerAttention(DIM, 1, 16, features=m).eval(), 0.0
        for _ in range(6):
            q, k = 0.58 * torch.randn(2, 1, 1, 64, 16, generator=g)  # the σ = 0.58 regime of the notes
            v = torch.randn(1, 1, 64, 16, generator=g)
            attn.redraw_features(g)
            exact = FullAttention.reference_core(q, k, v, None, None, 0.0)
            total += ((attn.core(q, k, v) - exact).norm() / exact.norm()).item()
        errors[m] = total / 6
    assert errors[256] < 0.5 * errors[16], errors
