"""NystromAttention: interface, padding, reproducibility, and the K = N limit (exact attention)."""
import pytest
import torch

from baselines.full import FullAttention
from baselines.nystromformer import NystromAttention

DIM, HEADS, HEAD_DIM = 16, 2, 8


def make(**budget) -> NystromAttention:
    torch.manual_seed(0)
    return NystromAttention(DIM, HEADS, HEAD_DIM, **budget).double()


def padding(b: int, n: int, padded: dict) -> torch.Tensor:
    """(B, N) bool key_padding_mask, True at padded[i] positions of sample i."""
    mask = torch.zeros(b, n, dtype=torch.bool)
    for i, positions in padded.items():
        mask[i, positions] = True
    return mask


def test_shapes_density_and_repr():
    m = make(landmarks=4)
    x = torch.randn(3, 10, DIM, dtype=torch.float64)  # 10 tokens, 4 landmarks: padded to 12
    y, stats = m(x, padding(3, 10, {1: [7, 8, 9]}))
    assert y.shape == x.shape
    assert stats["density"].shape == (HEADS,) and not stats["density"].requires_grad
    # every valid key influences every query through the landmarks (the implicit-method density rule)
    assert stats["density"].tolist() == [1.0] * HEADS
    _, empty = m(x, torch.ones(3, 10, dtype=torch.bool))
    assert empty["density"].tolist() == [0.0] * HEADS
    assert "landmarks=4" in repr(m) and "conv_kernel=0" in repr(m)


def test_finite_gradients_with_padding_conv_and_dropout():
    m = make(landmarks=3, conv_kernel=5, dropout=0.2).train()
    x = torch.randn(2, 11, DIM, dtype=torch.float64, requires_grad=True)
    y, _ = m(x, padding(2, 11, {0: [0, 5], 1: [9, 10]}), generator=torch.Generator().manual_seed(0))
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_padding_invariance():
    m = make(landmarks=3, conv_kernel=5).eval()
    mask = padding(2, 11, {0: [1, 2, 6], 1: [8, 9, 10]})
    x = torch.randn(2, 11, DIM, dtype=torch.float64)
    x2 = torch.where(mask[..., None], 100 * torch.randn_like(x), x)
    y, _ = m(x, mask)
    y2, _ = m(x2, mask)
    torch.testing.assert_close(y[~mask], y2[~mask], rtol=0, atol=1e-12)


def test_reproducible_with_generator():
    m = make(landmarks=4, dropout=0.3).train()
    x = torch.randn(2, 12, DIM, dtype=torch.float64)
    y1, _ = m(x, generator=torch.Generator().manual_seed(7))
    y2, _ = m(x, generator=torch.Generator().manual_seed(7))
    y3, _ = m(x, generator=torch.Generator().manual_seed(8))
    assert torch.equal(y1, y2)
    assert not torch.allclose(y1, y3)


@pytest.mark.parametrize("n, landmarks, padded", [(12, 12, {}), (9, 12, {1: [0, 4, 8]}), (10, 10, {0: [3, 9]})])
def test_as_many_landmarks_as_tokens_is_full_attention(n, landmarks, padded):
    """With one token per segment, Q̃ = Q, K̃ = K and F·A⁺·B = A·A⁺·A = A (padding: empty landmarks drop out).

    The paper's 6 pseudo-inverse iterations leave ~1% error here (A has condition number ~1e4); the
    iteration converges by 20 steps in float64, so 30 gives exact attention to rounding."""
    m = make(landmarks=landmarks, pinv_iterations=30).eval()
    full = FullAttention(DIM, HEADS, HEAD_DIM, fused=False).double().eval()
    full.load_state_dict(m.state_dict())
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    mask = padding(2, n, padded)
    y, _ = m(x, mask)
    y_full, _ = full(x, mask)
    torch.testing.assert_close(y[~mask], y_full[~mask], rtol=0, atol=1e-10)


def test_causal_raises():
    with pytest.raises(ValueError, match="causal"):
        make(landmarks=2)(torch.randn(1, 4, DIM, dtype=torch.float64), causal=True)


def test_all_keys_padded_gives_zero_attention():
    m = make(landmarks=3, conv_kernel=3)
    x = torch.randn(2, 7, DIM, dtype=torch.float64, requires_grad=True)
    mask = padding(2, 7, {1: list(range(7))})
    y, stats = m(x, mask)
    # Attention output 0 for every query of sample 1, so y is the output projection's bias there.
    torch.testing.assert_close(y[1], m.out.bias.expand(7, DIM), rtol=0, atol=0)
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(stats["density"]).all()


def test_unpadded_fast_path_equals_the_masked_path():
    """Without padding the landmarks are plain segment means and no softmax is masked; a batch that holds one
    padded sample takes the masked path for all, and must give the unpadded samples the same outputs."""
    m = make(landmarks=4, conv_kernel=3).eval()
    x = torch.randn(3, 12, DIM, dtype=torch.float64)
    y_fast, _ = m(x[:2])
    y_masked, _ = m(x, padding(3, 12, {2: [5, 11]}))
    torch.testing.assert_close(y_fast, y_masked[:2], rtol=0, atol=1e-12)
