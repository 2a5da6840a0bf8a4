"""Local heads beside adaptive heads: the shape of the field's current content-adaptive designs.

NSA (Yuan et al., arXiv 2502.11089, §3.3) gives every query a sliding-window branch beside its selected blocks, and
MoBA (Lu et al., arXiv 2502.13189, §2.2) always keeps the query's own block: a cheap local path that needs no
learning, and a learned one for what lies far away. Here the split is by heads: of H heads, ``adaptive_heads`` run
an adaptive attention (Reformer's LSH, the block router of baselines/moba.py, or SBM-Transformer) and the other
H − a heads a sliding window at ``density``:

    y = W_local · concat(window heads) + W_adaptive · concat(adaptive heads)

which is one output projection over the concatenation of all H heads, split in two blocks of columns (its bias
counted twice, a constant). ``budget`` gives the adaptive attention's own options as "key=value;key=value"
(e.g. "n_hashes=2;bucket_size=8"). Statistics: ``density`` and ``computed_pairs`` per head, the window heads' first,
and the adaptive attention's ``aux_loss`` where it has one (SBM's density regulariser).

Shape legend: B batch, H heads, N queries, D head dim.
"""

import importlib
from typing import Optional

import torch
from torch import Tensor, nn

from baselines.common import check_core_arguments
from baselines.window import WindowAttention

ADAPTIVE = {
    "reformer": "baselines.reformer:ReformerAttention",
    "moba": "baselines.moba:MoBAAttention",
    "sbm": "sbm_transformer:SBMAttention",
}


def parse_budget(text: str) -> dict:
    """ "key=value;key=value" as keyword arguments: integers, finite numbers, true/false, else text."""
    options = {}
    for item in filter(None, text.split(";")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"budget items are key=value separated by ';', got {item!r}")
        for parse in (int, float):
            try:
                options[key] = parse(value)
                break
            except ValueError:
                continue
        else:
            options[key] = {"true": True, "false": False}.get(value.lower(), value)
    return options


class HybridAttention(nn.Module):
    """Window heads beside ``adaptive_heads`` heads of ``adaptive`` (INTERFACE.md); see the module docstring."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dropout: float = 0.0,
        *,
        adaptive: str = "reformer",
        adaptive_heads: int = 1,
        density: float = 0.0625,
        budget: str = "",
    ):
        super().__init__()
        check_core_arguments(dim, heads, head_dim, dropout)
        if adaptive not in ADAPTIVE:
            raise ValueError(f"adaptive must be one of {sorted(ADAPTIVE)}, got {adaptive!r}")
        if not 1 <= adaptive_heads <= heads:
            raise ValueError(f"adaptive_heads must be in [1, heads={heads}], got {adaptive_heads}")
        module, _, name = ADAPTIVE[adaptive].partition(":")
        attention = getattr(importlib.import_module(module), name)
        self.adaptive_name, self.adaptive_heads, self.density, self.budget = adaptive, adaptive_heads, density, budget
        # every head adaptive leaves no window: the adaptive attention alone
        local = heads - adaptive_heads
        self.local = WindowAttention(dim, local, head_dim, dropout, density=density) if local else None
        self.adaptive = attention(dim, adaptive_heads, head_dim, dropout, **parse_budget(budget))

    def extra_repr(self) -> str:
        return (
            f"adaptive={self.adaptive_name}, adaptive_heads={self.adaptive_heads}, density={self.density}, "
            f"budget={self.budget}"
        )

    def out(self, heads: Tensor) -> Tensor:
        """The output projection over the H heads side by side (..., H·D), the window heads first: the two parts'
        projections of their own columns, summed (what forward applies to the heads' outputs)."""
        if self.local is None:
            return self.adaptive.out(heads)
        split = self.local.heads * self.local.head_dim
        return self.local.out(heads[..., :split]) + self.adaptive.out(heads[..., split:])

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
    ):
        y, adaptive = self.adaptive(x, key_padding_mask, causal, generator)
        parts = [adaptive]
        if self.local is not None:
            y_local, local = self.local(x, key_padding_mask, causal, generator)
            y, parts = y_local + y, [local, adaptive]
        stats = {
            key: torch.cat([part.get(key, part["density"]) for part in parts], -1)  # (H,): the window heads first
            for key in ("density", "computed_pairs")
        }
        if "aux_loss" in adaptive:
            stats["aux_loss"] = adaptive["aux_loss"]
        return y, stats
