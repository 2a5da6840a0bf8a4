"""Linformer attention: keys and values projected along the sequence to a fixed rank k.

Wang, Li, Khabsa, Fang, Ma, "Linformer: Self-Attention with Linear Complexity" (arXiv 2006.04768, 2020).
Learned length projections E, F ∈ R^{k×n} shrink the N keys and values to k rows (Eq. 7):

    head = softmax(Q (E K)ᵀ / √D) · (F V),

an (N, k) attention map instead of (N, N): O(N·k) time and memory. The paper motivates it by attention being
approximately low rank (Theorem 1) and shows random Gaussian E, F with N(0, 1/k) entries suffice in principle
(Theorem 2, a Johnson-Lindenstrauss argument); here E and F are learned, as in the paper's experiments.

Parameter sharing (§4, "Additional efficiency techniques"): one E and one F per layer, shared by its heads
("headwise sharing"); each module owns its own, so layers and models never share them. ``max_len`` is the
longest input (the harness sets the task's sequence length); an input of N < max_len uses the first N
columns of E and F, which is exactly the same as zero-padding it to max_len. Longer inputs raise a
ValueError: the projection has no columns for them.

Causal attention is impossible: every projected row mixes all positions, future included (the paper only
treats bidirectional attention), so ``causal=True`` raises a ValueError.

Padding (the paper leaves it open): padded keys and values are zeroed *before* the length projection, so they
contribute nothing to E K and F V and their content cannot reach the output. With padding only at the end this
equals running the unpadded sequence. It is not the same as masking a softmax: the k projected rows are
always all attended; in the limit E = F = I a padded position becomes a row with score 0 and value 0 that
still takes a share of the softmax mass. And since E and F are position-specific, where the padding sits
(left or right) changes the result. A query with no admissible key sees E K = 0 and F V = 0 and outputs 0.

Initialisation (not fixed by the paper): E, F ~ N(0, 1/max_len), so a projected row has the scale of a single
token whatever N/k (Theorem 2's N(0, 1/k) scales it by √(N/k), which sharpens the initial attention).

Density (the repository's convention, INTERFACE.md): every valid (query, key) pair influences the output
through E K and F V, so we report admissible pairs / (valid queries × valid keys) = 1 (0 for a batch with no
valid token) — the same as full attention. It says which pairs interact, not cost (k/N of the dense scores).

Dropout acts on the (N, k) attention map, as in the paper's softmax. The softmax runs in float32 even under
autocast.

Shape legend: B batch, H heads, N queries, M keys (M = N), D head dim, K projection rank (k).
"""

import math
from typing import Optional

import torch
from torch import Tensor, nn

from baselines.common import attention_density, check_padding_mask, generator_dropout


class LinformerAttention(nn.Module):
    """Multi-head Linformer attention (INTERFACE.md). Budget: ``rank`` (k projected keys/values) and
    ``max_len`` (columns of E, F; the longest accepted input)."""

    def __init__(
        self, dim: int, heads: int, head_dim: int, dropout: float = 0.0, *, rank: int = 256, max_len: int = 1024
    ):
        super().__init__()
        if min(dim, heads, head_dim, rank, max_len) < 1:
            raise ValueError(
                f"dim, heads, head_dim, rank and max_len must be positive, got {dim}, {heads}, "
                f"{head_dim}, {rank}, {max_len}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.heads, self.head_dim, self.dropout, self.rank, self.max_len = heads, head_dim, dropout, rank, max_len
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)
        self.E = nn.Parameter(torch.randn(rank, max_len) / math.sqrt(max_len))  # (K, max_len), keys
        self.F = nn.Parameter(torch.randn(rank, max_len) / math.sqrt(max_len))  # (K, max_len), values

    def extra_repr(self) -> str:
        return f"heads={self.heads}, head_dim={self.head_dim}, rank={self.rank}, max_len={self.max_len}"

    def check(self, n: int, causal: bool) -> None:
        if causal:
            raise ValueError(
                "LinformerAttention cannot be causal: each projected key/value mixes all positions, "
                "future ones included (Wang et al. 2020 treat bidirectional attention only)"
            )
        if n > self.max_len:
            raise ValueError(
                f"sequence length {n} exceeds max_len={self.max_len}: E and F have no columns for "
                f"positions beyond it; build the module with max_len >= {n}"
            )

    def core(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        p_drop: float = 0.0,
        generator: Optional[torch.Generator] = None,
    ) -> Tensor:
        """Eq. 7 on per-head (B, H, N, D) tensors; returns (B, H, N, D)."""
        n = k.shape[-2]
        self.check(n, causal)
        compute = torch.promote_types(q.dtype, torch.float32)  # float32 at least, float64 kept for tests
        with torch.autocast(q.device.type, enabled=False):
            q, k, v = q.to(compute), k.to(compute), v.to(compute)
            if key_padding_mask is not None:
                padded = key_padding_mask[:, None, :, None]  # (B, 1, M, 1)
                k, v = k.masked_fill(padded, 0.0), v.masked_fill(padded, 0.0)
            e, f = self.E[:, :n].to(compute), self.F[:, :n].to(compute)  # (K, M): first N columns
            k_proj, v_proj = e @ k, f @ v  # (B, H, K, D)
            scores = q @ k_proj.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, N, K)
            probs = generator_dropout(scores.softmax(-1), p_drop, generator)  # (B, H, N, K)
            return probs @ v_proj  # (B, H, N, D)

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
    ):
        b, n, _ = x.shape
        self.check(n, causal)
        check_padding_mask(key_padding_mask, b, n)
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3×(B, H, N, D)
        p_drop = self.dropout if self.training else 0.0
        y = self.core(q, k, v, key_padding_mask, causal, p_drop, generator).to(v.dtype)  # (B, H, N, D)
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        return self.out(y), {"density": attention_density(key_padding_mask, False, b, n, self.heads, x.device)}
