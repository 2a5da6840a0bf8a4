"""Helpers shared by the baselines: key-padding-mask validation, the density statistic of INTERFACE.md and
generator-driven dropout."""
from typing import Optional

import torch
from torch import Tensor


def check_padding_mask(key_padding_mask: Optional[Tensor], batch: int, n: int) -> None:
    """INTERFACE.md's mask: None or a (B, N) bool tensor, True at padding. Anything else (a float or integer
    mask, a wrong shape) is a ValueError naming what was expected, not an error from deep inside the core.
    The method files, which are leaves, carry the same two-line check."""
    if key_padding_mask is not None and (key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (batch, n)):
        raise ValueError(f"key_padding_mask must be a bool tensor of shape {(batch, n)}, True at padding; got "
                         f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")


def attention_density(key_padding_mask: Optional[Tensor], causal: bool, batch: int, n: int, heads: int,
                      device) -> Tensor:
    """(H,) admissible pairs / (valid queries × valid keys), summed over the batch; O(B·N) work. Every
    admissible pair for full attention; for implicit methods, the pairs that influence the output."""
    valid = (torch.ones(batch, n, device=device, dtype=torch.bool) if key_padding_mask is None
             else ~key_padding_mask).to(torch.float64)  # (B, N)
    all_pairs = (valid.sum(1) ** 2).sum()
    # causal: valid query i sees the valid keys j <= i, i.e. a prefix count.
    pairs = (valid * valid.cumsum(1)).sum() if causal else all_pairs
    density = (pairs / all_pairs.clamp_min(1)).to(torch.float32)
    return density.expand(heads).clone()


def generator_dropout(x: Tensor, p: float, generator: Optional[torch.Generator]) -> Tensor:
    """Inverted dropout whose mask comes from ``generator`` when one is given (nn.Dropout cannot take one)."""
    if p == 0.0:
        return x
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= p
    return x * keep / (1.0 - p)
