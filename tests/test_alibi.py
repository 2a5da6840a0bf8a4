"""One ALiBi slope rule: the copies in ssa.py, kernel_sparse.py and baselines/full.py (method files are leaves, so
each keeps its own) agree with Press et al.'s reference code and with the known values, and the modules use them."""
import math

import pytest
import torch

import kernel_sparse
import ssa
from baselines import full

COPIES = {"ssa": ssa.alibi_slopes, "kernel_sparse": kernel_sparse.alibi_slopes, "full": full.alibi_slopes}


def press_slopes(n: int) -> list:
    """get_slopes of the ALiBi reference code (Press et al. 2022, github.com/ofirpress/attention_with_linear_biases)."""
    def power_of_two(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + press_slopes(2 * closest)[0::2][:n - closest]


KNOWN = {  # 2^-8h/H for H a power of two; otherwise the lower power of two's slopes, then every other of 2P's
    6: [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3],
    12: [2.0 ** -h for h in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5],
}


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 8, 12, 16])
@pytest.mark.parametrize("copy", sorted(COPIES))
def test_every_copy_follows_the_reference_rule(copy, heads):
    torch.testing.assert_close(COPIES[copy](heads), torch.tensor(press_slopes(heads), dtype=torch.float32))


@pytest.mark.parametrize("heads", sorted(KNOWN))
def test_non_power_of_two_head_counts_give_the_known_slopes(heads):
    assert press_slopes(heads) == pytest.approx(KNOWN[heads])
    for copy in COPIES.values():
        torch.testing.assert_close(copy(heads), torch.tensor(KNOWN[heads], dtype=torch.float32))


@pytest.mark.parametrize("heads", [6, 12])
def test_the_attention_modules_carry_those_slopes(heads):
    expected = torch.tensor(KNOWN[heads], dtype=torch.float32)
    modules = [ssa.SSAttention(16, heads, 4), kernel_sparse.KernelSparseAttention(16, heads, 4, max_len=8, alibi=True),
               full.FullAttention(16, heads, 4, alibi=True)]
    for module in modules:
        torch.testing.assert_close(module.slopes, expected)
