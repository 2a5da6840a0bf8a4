"""Helpers shared by the baselines: key-padding-mask validation, the density statistic of INTERFACE.md,
generator-driven dropout, and the masked softmax attention of the fixed-sparse patterns (window, BigBird)."""

import math
from typing import Optional

import torch
from torch import Tensor


def check_core_arguments(dim: int, heads: int, head_dim: int, dropout: float) -> None:
    """The interface's arguments: positive sizes and a dropout rate in [0, 1), else a ValueError naming them."""
    if min(dim, heads, head_dim) < 1:
        raise ValueError(f"dim, heads and head_dim must be positive, got {dim}, {heads}, {head_dim}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")


def check_pattern_options(density: Optional[float], path: str) -> None:
    """A fixed pattern's target density in (0, 1] (or None) and its path, "reference" or "fast"; else a
    ValueError naming the value."""
    if density is not None and not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    if path not in ("reference", "fast"):
        raise ValueError(f"path must be 'reference' or 'fast', got {path!r}")


def check_padding_mask(key_padding_mask: Optional[Tensor], batch: int, n: int) -> None:
    """INTERFACE.md's mask: None or a (B, N) bool tensor, True at padding. Anything else (a float or integer
    mask, a wrong shape) is a ValueError naming what was expected, not an error from deep inside the core.
    The method files, which are leaves, carry the same two-line check."""
    if key_padding_mask is not None and (key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (batch, n)):
        raise ValueError(
            f"key_padding_mask must be a bool tensor of shape {(batch, n)}, True at padding; got "
            f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )


def attention_density(
    key_padding_mask: Optional[Tensor], causal: bool, batch: int, n: int, heads: int, device
) -> Tensor:
    """(H,) admissible pairs / (valid queries × valid keys), summed over the batch; O(B·N) work. Every
    admissible pair for full attention; for implicit methods, the pairs that influence the output."""
    valid = (
        torch.ones(batch, n, device=device, dtype=torch.bool) if key_padding_mask is None else ~key_padding_mask
    ).to(torch.float64)  # (B, N)
    all_pairs = (valid.sum(1) ** 2).sum()
    # causal: valid query i sees the valid keys j <= i, i.e. a prefix count.
    pairs = (valid * valid.cumsum(1)).sum() if causal else all_pairs
    density = (pairs / all_pairs.clamp_min(1)).to(torch.float32)
    return density.expand(heads).clone()


def generator_dropout(x: Tensor, p: float, generator: Optional[torch.Generator]) -> Tensor:
    """Inverted dropout whose mask comes from ``generator`` when one is given (nn.Dropout cannot take one). The
    repo's one dropout rule: the uniforms are drawn on the generator's device (the tensor's without one) and
    moved to the tensor's, so a CPU generator also drives a CUDA forward."""
    if p == 0.0:
        return x
    source = generator.device if generator is not None else x.device
    keep = torch.rand(x.shape, generator=generator, device=source).to(x.device) >= p
    return x * keep / (1.0 - p)


def masked_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, p_drop: float, generator: Optional[torch.Generator]
) -> Tensor:
    """softmax over the allowed keys of q·kᵀ/√D, times v, in float32 at least (autocast off). q (..., N, D), k and
    v (..., M, D), allowed broadcastable to (..., N, M). A row with no allowed key comes out finite (the softmax
    of finfo.min's is uniform); the caller zeroes it, which zeroes its gradient too."""
    compute = torch.promote_types(q.dtype, torch.float32)  # float32 at least, float64 kept for tests
    with torch.autocast(q.device.type, enabled=False):
        # finfo.min added, not filled in: an addition's backward is free, and finfo.min + s rounds to finfo.min
        bias = torch.where(allowed, torch.zeros((), dtype=compute, device=q.device), torch.finfo(compute).min)
        scores = (q.to(compute) / math.sqrt(q.shape[-1])) @ k.to(compute).transpose(-1, -2) + bias  # (..., N, M)
        return generator_dropout(scores.softmax(-1), p_drop, generator) @ v.to(compute)  # (..., N, D)
