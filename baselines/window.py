"""Sliding-window (local) attention: each query attends only the keys within a fixed distance.

Beltagy, Peters, Cohan, "Longformer: The Long-Document Transformer" (arXiv 2004.05150), §3.1 "Sliding
Window". With half-width w, query i attends key j when

    |i − j| ≤ w                      (2w + 1 keys; causal: i − w ≤ j ≤ i, the w previous tokens and itself)
    Attention_i = softmax_{j admissible}(q_i·k_j / √D) v_j,

admissible = inside the window, not padding. A query with no admissible key outputs zeros.

Budget: ``window`` = w directly, or ``density`` = a target ρ for the sequence length N at hand: w is the integer
whose exact density at N (the band's clipped edges included, ``window_density``) is nearest ρ, so about
w ≈ ρN/2 without a causal mask and w ≈ ρN with one (``window_for_density``). It is chosen from N alone, never
from the padding, so a causal output cannot depend on later padding.

Two paths, one pattern (tests/test_window.py shows they agree in outputs and gradients):
- reference: the (B, 1, N, M) boolean mask, the scores materialised, masked softmax in float32, times V.
- fast (default): only the band. Queries are cut into chunks of C = 64; a chunk scores the C + 2w keys (causal:
  C + w) around it, taken from an unfolded view of the keys: O(N·(C + 2w)·D) work and memory, no N × M tensor.
  Where C + 2w ≥ N the chunks would cover the whole sequence anyway, and the reference form runs.

Density (INTERFACE.md): admissible pairs of the band / (valid queries × valid keys), per head, summed over the
batch; the fast path's extra scored pairs outside the band are masked and not counted.

A fixed head allocation (``full_heads`` = f > 0): heads 1..f attend to every admissible key (full attention),
the others keep the window, so the model has a dense path for long-range content beside cheap local heads: the
fixed counterpart of a learned allocation that makes one head dense and another sparse. A fixed layer allocation
(``full_layers`` = l > 0): layers 0..l − 1 are full attention, the later ones windows (the model's factory gives
each attention its ``layer``), the counterpart of a learned graph dense in one layer and sparse in the next
(SBM-Transformer's on recall, results/frontier-2-heads).

Deviations: Longformer's dilation, per-layer window sizes and global tokens are left out (BigBird,
baselines/bigbird.py, has global tokens); dropout acts on the attention weights, drawn from ``generator``.

Shape legend: B batch, H heads, N queries, M keys (M = N), D head dim, T chunks, C chunk length, S keys per chunk.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.common import check_core_arguments, check_padding_mask, check_pattern_options, masked_attention

# Queries per chunk of the fast path: among C ∈ {32, 64, 128, w/4, w/2, w, 2w}, 64 was the fastest or near it for a
# 7% band at N = 1K-8K (fwd+bwd, one thread); the span's excess over the band, (C + 2w)/(2w + 1), is small for w >> C.
CHUNK = 64


def window_density(n: int, window: int, causal: bool) -> float:
    """Exact density of the window pattern at length n without padding: pairs / n²."""
    w = min(window, n - 1)
    pairs = n * (w + 1) - w * (w + 1) // 2 if causal else n * (2 * w + 1) - w * (w + 1)  # edge triangles cut
    return pairs / n**2


def window_for_density(n: int, density: float, causal: bool) -> int:
    """The half-width w in [0, n − 1] whose density at length n is nearest ``density`` (density grows with w)."""
    lo, hi = 0, max(n - 1, 0)
    while lo < hi:  # smallest w whose density reaches the target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if window_density(n, mid, causal) < density else (lo, mid)
    below = max(lo - 1, 0)
    return min((below, lo), key=lambda w: abs(window_density(n, w, causal) - density))


def window_counts(valid: Tensor, window: int, causal: bool) -> Tensor:
    """(B, N) float64: the valid keys inside each query's window, by a prefix count, O(B·N)."""
    n = valid.shape[1]
    count = F.pad(valid.to(torch.float64).cumsum(1), (1, 0))  # (B, N + 1): count[:, j] = valid keys before j
    i = torch.arange(n, device=valid.device)
    lo, hi = (i - window).clamp_min(0), (i if causal else (i + window).clamp_max(n - 1))  # (N,) window ends
    return count[:, hi + 1] - count[:, lo]


class WindowAttention(nn.Module):
    """Multi-head sliding-window attention (INTERFACE.md). Budget: ``window`` (half-width w, default 64) or
    ``density`` (a target, w chosen per length; then ``window`` stays None), and ``full_heads``, the heads that
    attend to every key instead (default 0), or ``full_layers``, the layers that do. ``path``: "reference" or "fast"."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dropout: float = 0.0,
        *,
        window: Optional[int] = None,
        density: Optional[float] = None,
        full_heads: int = 0,
        full_layers: int = 0,
        layer: int = 0,
        path: str = "fast",
    ):
        super().__init__()
        check_core_arguments(dim, heads, head_dim, dropout)
        if window is not None and density is not None:
            raise ValueError(f"give window or density, not both (got window={window}, density={density})")
        if window is not None and window < 0:
            raise ValueError(f"window (the half-width w) must be >= 0, got {window}")
        if not 0 <= full_heads <= heads:
            raise ValueError(f"full_heads must be in [0, heads={heads}], got {full_heads}")
        check_pattern_options(density, path)
        self.heads, self.head_dim, self.dropout, self.path = heads, head_dim, dropout, path
        if min(full_layers, layer) < 0:
            raise ValueError(f"full_layers and layer must be >= 0, got {full_layers}, {layer}")
        self.full_heads = heads if layer < full_layers else full_heads
        self.window, self.density = (64 if window is None and density is None else window), density
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)

    def extra_repr(self) -> str:
        return (
            f"heads={self.heads}, head_dim={self.head_dim}, window={self.window}, density={self.density}, "
            f"full_heads={self.full_heads}, path={self.path}"
        )

    def half_width(self, n: int, causal: bool) -> int:
        """w for length n: the fixed window, or the one nearest the target density; at most n − 1 (the same
        pattern, and the fast path's padding stays small)."""
        w = self.window if self.density is None else window_for_density(n, self.density, causal)
        return min(w, max(n - 1, 0))

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
        valid = torch.ones(b, n, dtype=torch.bool, device=x.device) if key_padding_mask is None else ~key_padding_mask
        p_drop = self.dropout if self.training else 0.0
        core = self.reference_core if self.path == "reference" else self.fast_core
        total = (valid.sum(1).to(torch.float64) ** 2).sum().clamp_min(1)  # Σ_b (valid count)²
        ys, densities = [], []
        # the full heads are a window of half-width N − 1, which holds every key (causal: every earlier key)
        for group, w in (
            (slice(0, self.full_heads), max(n - 1, 0)),
            (slice(self.full_heads, self.heads), self.half_width(n, causal)),
        ):
            heads = group.stop - group.start
            if heads == 0:
                continue
            y = core(q[:, group], k[:, group], v[:, group], valid, w, causal, p_drop, generator).to(v.dtype)
            in_window = window_counts(valid, w, causal)  # (B, N)
            ys.append(y.masked_fill((in_window == 0)[:, None, :, None], 0.0))  # no admissible key: output 0
            # density: Σ over valid queries of the valid keys in their window / Σ_b (valid count)², per head
            densities.append(((in_window * valid).sum() / total).to(torch.float32).expand(heads))
        y = torch.cat(ys, 1).transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        return self.out(y), {"density": torch.cat(densities)}

    @staticmethod
    def reference_core(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid: Tensor,
        w: int,
        causal: bool,
        p_drop: float,
        generator: Optional[torch.Generator],
    ) -> Tensor:
        """The band as a dense (B, 1, N, M) mask: |i − j| ≤ w (causal: 0 ≤ i − j ≤ w), valid keys only."""
        i = torch.arange(q.shape[-2], device=q.device)
        offset = i[:, None] - i[None, :]  # (N, M): i − j
        band = (offset >= 0) & (offset <= w) if causal else offset.abs() <= w
        allowed = band[None, None] & valid[:, None, None, :]  # (B, 1, N, M)
        return masked_attention(q, k, v, allowed, p_drop, generator)

    # --- fast path: the band by chunks ------------------------------------------------------------------------
    @staticmethod
    def fast_core(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid: Tensor,
        w: int,
        causal: bool,
        p_drop: float,
        generator: Optional[torch.Generator],
    ) -> Tensor:
        """Queries s..s+C−1 of a chunk score keys s−w..s+C−1+w (causal: s−w..s+C−1), a span of S keys; a query
        at chunk offset a and key slot c are i = s + a, j = s − w + c, so i − j = w + a − c and the band is
        0 ≤ c − a ≤ 2w (causal: w). Keys outside 0..N−1 are zero padding, masked as invalid."""
        b, h, n, d = q.shape
        c = min(CHUNK, n)
        span = c + w + (0 if causal else w)  # S
        if span >= n:  # a chunk's span covers the sequence (short N, wide w): the dense band is no more work
            return WindowAttention.reference_core(q, k, v, valid, w, causal, p_drop, generator)
        t = -(-n // c)
        right = t * c - n + (0 if causal else w)  # keys after the last query's span end are never needed
        q = F.pad(q, (0, 0, 0, t * c - n)).view(b, h, t, c, d)  # (B, H, T, C, D)
        # contiguous tiles: a matmul on the overlapping unfolded view takes a slow path (up to 2x measured)
        k, v = (F.pad(x, (0, 0, w, right)).unfold(2, span, c).transpose(-1, -2).contiguous() for x in (k, v))
        # (B, H, T, S, D)
        key_valid = F.pad(valid, (w, right), value=False).unfold(1, span, c)  # (B, T, S)
        a, slot = torch.arange(c, device=q.device), torch.arange(span, device=q.device)
        lag = slot[None, :] - a[:, None]  # (C, S): c − a
        band = (lag >= 0) & (lag <= (w if causal else 2 * w))  # (C, S)
        allowed = band & key_valid[:, None, :, None, :]  # (B, 1, T, C, S)
        y = masked_attention(q, k, v, allowed, p_drop, generator)  # (B, H, T, C, D)
        return y.reshape(b, h, t * c, d)[:, :, :n]  # (B, H, N, D)
