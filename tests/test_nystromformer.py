"""NystromAttention: density and the K = N limit (exact attention). The interface contract (shapes, padding,
reproducibility, empty samples, the causal refusal, the repr's budget) is tests/test_interface.py."""

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


def test_density_is_one_with_valid_keys_and_zero_without():
    m = make(landmarks=4)
    x = torch.randn(3, 10, DIM, dtype=torch.float64)  # 10 tokens, 4 landmarks: padded to 12
    _, stats = m(x, padding(3, 10, {1: [7, 8, 9]}))
    # every valid key influences every query through the landmarks (the implicit-method density rule)
    assert stats["density"].tolist() == [1.0] * HEADS
    _, empty = m(x, torch.ones(3, 10, dtype=torch.bool))
    assert empty["density"].tolist() == [0.0] * HEADS


@pytest.mark.parametrize("n, landmarks, padded", [(12, 12, {}), (9, 12, {1: [0, 4, 8]}), (10, 10, {0: [3, 9]})])
def test_as_many_landmarks_as_tokens_is_full_attention(n, landmarks, padded):
    """With one token per segment, Q̃ = Q, K̃ = K and F·A⁺·B = A·A⁺·A = A (padding: empty landmarks drop out).

    The paper's 6 pseudo-inverse iterations leave ~1% error here (A has condition number ~1e4); the
    iteration converges by 20 steps in float64, so 30 gives exact attention to rounding."""
    m = make(landmarks=landmarks, pinv_iterations=30).eval()
    full = FullAttention(DIM, HEADS, HEAD_DIM, path="reference").double().eval()
    full.load_state_dict(m.state_dict())
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    mask = padding(2, n, padded)
    y, _ = m(x, mask)
    y_full, _ = full(x, mask)
    torch.testing.assert_close(y[~mask], y_full[~mask], rtol=0, atol=1e-10)


def test_unpadded_fast_path_equals_the_masked_path():
    """Without padding the landmarks are plain segment means and no softmax is masked; a batch that holds one
    padded sample takes the masked path for all, and must give the unpadded samples the same outputs."""
    m = make(landmarks=4, conv_kernel=3).eval()
    x = torch.randn(3, 12, DIM, dtype=torch.float64)
    y_fast, _ = m(x[:2])
    y_masked, _ = m(x, padding(3, 12, {2: [5, 11]}))
    torch.testing.assert_close(y_fast, y_masked[:2], rtol=0, atol=1e-12)
