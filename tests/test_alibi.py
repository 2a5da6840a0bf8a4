"""One ALiBi rule (alibi.py, the leaf that ssa.py, kernel_sparse.py and baselines/full.py import): its slopes
follow Press et al.'s reference code and the known values at head counts that are not powers of two, its bias is
−m_h·|i − j|, and each attention module carries those slopes and adds that bias."""

import math

import pytest
import torch

import alibi
import kernel_sparse
import ssa
from baselines import full


def press_slopes(n: int) -> list:
    """get_slopes of the ALiBi reference code (Press et al. 2022, github.com/ofirpress/attention_with_linear_biases)."""

    def power_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + press_slopes(2 * closest)[0::2][: n - closest]


KNOWN = {  # 2^-8h/H for H a power of two; otherwise the lower power of two's slopes, then every other of 2P's
    6: [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3],
    12: [2.0**-h for h in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5],
}


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 8, 12, 16])
def test_the_slopes_follow_the_reference_rule(heads):
    torch.testing.assert_close(alibi.alibi_slopes(heads), torch.tensor(press_slopes(heads), dtype=torch.float32))


@pytest.mark.parametrize("heads", sorted(KNOWN))
def test_non_power_of_two_head_counts_give_the_known_slopes(heads):
    assert press_slopes(heads) == pytest.approx(KNOWN[heads])
    torch.testing.assert_close(alibi.alibi_slopes(heads), torch.tensor(KNOWN[heads], dtype=torch.float32))


@pytest.mark.parametrize("heads", [0, -1, 2.0])
def test_a_bad_head_count_is_refused_with_a_message(heads):
    with pytest.raises(ValueError, match="positive number of heads"):
        alibi.alibi_slopes(heads)


def test_the_bias_is_minus_slope_times_distance_for_any_broadcast_of_positions():
    slopes = alibi.alibi_slopes(6)
    query, key = torch.tensor([[0, 3, 7]]), torch.tensor([[5, 1], [2, 9]])
    bias = alibi.alibi_bias(slopes, query[..., None], key[:, None, :])  # (H, 2, 3, 2)
    assert bias.shape == (6, 2, 3, 2) and bias.dtype == torch.float32
    for h in range(6):
        for r in range(2):
            for i in range(3):
                for j in range(2):
                    expected = -slopes[h] * abs(int(query[0, i]) - int(key[r, j]))
                    assert bias[h, r, i, j] == expected
    assert alibi.alibi_bias(slopes.double(), query, query).dtype == torch.float64


@pytest.mark.parametrize("heads", [6, 12])
def test_the_attention_modules_carry_those_slopes(heads):
    expected = torch.tensor(KNOWN[heads], dtype=torch.float32)
    modules = [
        ssa.SSAttention(16, heads, 4),
        kernel_sparse.KernelSparseAttention(16, heads, 4, max_len=8, alibi=True),
        full.FullAttention(16, heads, 4, alibi=True),
    ]
    for module in modules:
        torch.testing.assert_close(module.slopes, expected)


def test_full_attention_and_the_kernel_teacher_add_the_shared_bias():
    """Their dense (N, N) bias is −m_h·|i − j| (SSA's per-window blocks: tests/test_ssa.py)."""
    heads, n = 6, 8
    slopes, pos = alibi.alibi_slopes(heads), torch.arange(n)
    dense = -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs().float()  # (H, N, N)
    torch.testing.assert_close(full.FullAttention(16, heads, 4, alibi=True).alibi_bias(n, "cpu"), dense[None])
    kernel = kernel_sparse.KernelSparseAttention(16, heads, 4, max_len=n, alibi=True)
    torch.testing.assert_close(kernel.bias(n, torch.float64), dense.double())
