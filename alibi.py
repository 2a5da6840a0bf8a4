"""ALiBi (Press, Smith & Lewis, "Train Short, Test Long", ICLR 2022, arXiv 2108.12409, §3): a per-head linear bias
−m_h·|i − j| on the attention scores in place of positional embeddings.

The repository's one ALiBi rule: ssa.py, kernel_sparse.py and baselines/full.py import it. Like fastrg.py it is a
leaf (torch only), so a method file copied into another project takes this file with it. Written once because
copies drift: before it, kernel_sparse.py's slopes differed from the others' at a head count that is not a power
of two (H = 6: 0.397 instead of 0.25 for the first head).

The bias is symmetric, |i − j|: an encoder sees both sides at the same cost. A causal mask removes j > i, which
leaves Press et al.'s decoder bias −m_h·(i − j).

Shapes: H heads; query and key positions are integer tensors that broadcast to one shape S.
"""

import torch
from torch import Tensor


def alibi_slopes(heads: int) -> Tensor:
    """(H,) float32 slopes m_h, the rule of Press et al. 2022 (§3 and their reference code): 2^(−8h/H), h = 1..H,
    for H a power of two; otherwise the slopes of the largest power of two P below H, then every other slope of
    2P (its 1st, 3rd, ...), H − P of them. H = 6: 2^−2, 2^−4, 2^−6, 2^−8, then 2^−1, 2^−3."""
    if not isinstance(heads, int) or heads < 1:
        raise ValueError(f"ALiBi needs a positive number of heads, got {heads!r}")

    def geometric(n: int) -> list:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    base = 2 ** (heads.bit_length() - 1)
    return torch.tensor(geometric(base) + geometric(2 * base)[::2][: heads - base])


def alibi_bias(slopes: Tensor, query_pos: Tensor, key_pos: Tensor) -> Tensor:
    """(H, *S) the bias −m_h·|i − j| in the slopes' dtype and on their device, for the query positions i and key
    positions j broadcast to S. The distance is taken on the integers, so it is exact at any length."""
    distance = (query_pos - key_pos).abs().to(device=slopes.device, dtype=slopes.dtype)  # S
    return -slopes.view(-1, *[1] * distance.dim()) * distance
