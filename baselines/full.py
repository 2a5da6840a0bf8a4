"""Full softmax attention: the dense baseline every method in this repository is compared with.

Vaswani et al., "Attention Is All You Need" (NeurIPS 2017, arXiv 1706.03762), Eq. 1:

    Attention(Q, K, V) = softmax(Q Kᵀ / √D) V

with multi-head projections (§3.2.2). Two execution paths with the same semantics:

- reference (``path="reference"``): materialises the (B, H, N, M) scores, fills inadmissible pairs with
  ``finfo.min``, takes the softmax in float32 and multiplies by V. Readable; O(N·M) memory.
- fast (``path="fast"``, the default): ``torch.nn.functional.scaled_dot_product_attention`` (SDPA),
  which picks a flash / memory-efficient kernel where one applies. SDPA's attention dropout cannot take a
  ``generator``, so a training forward with dropout and a generator runs the reference path. Its additive
  mask (with ALiBi) is −inf on inadmissible pairs, not finfo.min: under float16 autocast a score can pass
  finfo(float16).min = −65504 in size, and a masked key would get weight. tests/test_full.py shows the two
  agree in outputs and gradients, with padding and causal masks.

Admissible pairs: key j is admissible for query i when j is not padding and (not causal or j ≤ i).
A query with no admissible key outputs zeros (never NaN): SDPA would give NaN on a fully masked row, so
such rows are given one dummy admissible key and their output is zeroed afterwards, which also keeps
their gradient exactly zero.

Optional ALiBi (Press et al., "Train Short, Test Long", ICLR 2022, §3): a per-head linear bias
−m_h·|i − j| added to the scores, slopes m_h a geometric sequence starting at 2^(−8/H). It lets a causal
LM run with no positional embeddings. (For a non-power-of-two H the paper interleaves two sequences; we
do the same.)

Density (the repository's convention, see INTERFACE.md): admissible pairs / (valid queries × valid keys),
per head, summed over the batch before dividing. Full attention computes every admissible pair, so its
density is 1 without a causal mask and about (N+1)/(2N) with one.

Shape legend: B batch, H heads, N queries, M keys (M = N: self-attention), D head dim.
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from alibi import alibi_bias, alibi_slopes
from baselines.common import attention_density, check_padding_mask, generator_dropout

PATHS = ("fast", "reference")


def admissible_mask(key_padding_mask: Optional[Tensor], causal: bool, n: int, device) -> Optional[Tensor]:
    """(B|1, 1, N, N) bool, True where query i may attend to key j; None when every pair is admissible."""
    mask = None
    if key_padding_mask is not None:
        mask = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, M)
    if causal:
        tril = torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]  # (1, 1, N, M)
        mask = tril if mask is None else mask & tril
    return mask


class FullAttention(nn.Module):
    """Multi-head softmax attention, the repository's one attention interface (INTERFACE.md).

    Budget: none (every admissible pair). Options: ``path`` selects SDPA ("fast") or the reference path
    ("reference"); ``alibi`` adds ALiBi biases.
    """

    def __init__(
        self, dim: int, heads: int, head_dim: int, dropout: float = 0.0, *, path: str = "fast", alibi: bool = False
    ):
        super().__init__()
        if min(dim, heads, head_dim) < 1:
            raise ValueError(f"dim, heads and head_dim must be positive, got {dim}, {heads}, {head_dim}")
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.path, self.alibi = path, alibi
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)
        if alibi:
            self.register_buffer("slopes", alibi_slopes(heads), persistent=False)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, head_dim={self.head_dim}, path={self.path}, alibi={self.alibi}"

    def alibi_bias(self, n: int, device) -> Tensor:
        """(1, H, N, N) float32 bias −m_h·|i − j|."""
        pos = torch.arange(n, device=device)
        return alibi_bias(self.slopes.to(device), pos[:, None], pos[None, :])[None]

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
    ):
        b, n, _ = x.shape
        check_padding_mask(key_padding_mask, b, n)
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3×(B, H, N, D)
        p_drop = self.dropout if self.training else 0.0
        # SDPA's dropout cannot take a generator: a reproducible draw needs the reference path.
        fast = self.path == "fast" and not (p_drop > 0 and generator is not None)
        # SDPA's own causal kernel is faster than an explicit (N, N) mask when nothing else is masked; only the
        # fast path may leave causality to it, the reference path needs it in `allowed`.
        sdpa_causal = fast and causal and key_padding_mask is None and not self.alibi
        allowed = admissible_mask(key_padding_mask, causal and not sdpa_causal, n, x.device)  # (B|1,1,N|1,M)
        empty = None
        if allowed is not None:
            empty = ~allowed.any(-1, keepdim=True)  # (B|1, 1, N|1, 1): rows with no admissible key
            allowed = allowed | empty  # a dummy key keeps softmax finite; the row is zeroed below
        bias = self.alibi_bias(n, x.device) if self.alibi else None  # (1, H, N, M)
        if fast:
            y = self.fast_core(q, k, v, allowed, bias, p_drop, sdpa_causal)
        else:
            y = self.reference_core(q, k, v, allowed, bias, p_drop, generator)
        if empty is not None:
            y = y.masked_fill(empty, 0.0)
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        return self.out(y), {"density": attention_density(key_padding_mask, causal, b, n, self.heads, x.device)}

    @staticmethod
    def reference_core(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        allowed: Optional[Tensor],
        bias: Optional[Tensor],
        p_drop: float,
        generator: Optional[torch.Generator] = None,
    ) -> Tensor:
        """softmax(QKᵀ/√D + bias, masked) V with the scores materialised, softmax in float32 (autocast off:
        it would run the score product, and so the softmax, in its lower precision)."""
        compute = torch.promote_types(q.dtype, torch.float32)  # float32 at least, float64 kept for gradcheck
        with torch.autocast(q.device.type, enabled=False):
            q = q.to(compute) / math.sqrt(q.shape[-1])  # scaling Q, not the scores: one (N, M) tensor fewer
            scores = q @ k.to(compute).transpose(-1, -2)  # (B, H, N, M)
            if bias is not None:
                scores = scores + bias
            if allowed is not None:
                scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
            probs = generator_dropout(scores.softmax(-1), p_drop, generator)
        return probs.to(v.dtype) @ v  # (B, H, N, D)

    @staticmethod
    def fast_core(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        allowed: Optional[Tensor],
        bias: Optional[Tensor],
        p_drop: float,
        is_causal: bool,
    ) -> Tensor:
        """The same computation through SDPA, the boolean mask given as an additive one: −inf on the inadmissible
        pairs, not finfo.min, since a float16 score can exceed finfo(float16).min's 65504 in size and would let a
        masked key through; every row keeps an admissible (or dummy) key, so none is all −inf. Additive even without
        ALiBi: given a boolean mask under float16 autocast, torch 2.11's cuDNN attention on an H200 let gradient
        through padded keys (0.65 in tests/test_full.py; its math and efficient kernels 0). On the CPU the two
        forms give the same bits."""
        mask = None if bias is None else bias.to(q.dtype)
        if allowed is not None:
            mask = (torch.zeros(allowed.shape, dtype=q.dtype, device=q.device) if mask is None else mask).masked_fill(
                ~allowed, -math.inf
            )
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p_drop, is_causal=is_causal)
