"""BigBird block-sparse attention: a sliding window of blocks, global blocks and random blocks.

Zaheer et al., "Big Bird: Transformers for Longer Sequences" (NeurIPS 2020, arXiv 2007.14062), §2 and App. D
(the blocked BIGBIRD-ITC pattern). The sequence is cut into nb = ⌈N/b⌉ blocks of b tokens; query block p
attends key block q (block pattern A, per head) when

    |p − q| ≤ w                       (window: 2w + 1 blocks; w = 1 is the paper's 3-block window)
    p < g  or  q < g                  (global: the first g blocks attend everything, everything attends them)
    q ∈ R_p,  |R_p| = r               (random: r blocks drawn uniformly without replacement among the blocks
                                       not already in p's window or global set; all of them if fewer remain)

and token i (in block p) attends token j (in block q) when A[p, q], j is not padding and, when causal, j ≤ i.
Causal form: the window is q ∈ [p − w, p], global keys are the first g blocks (j ≤ i), and R_p is drawn among
the earlier blocks q < p only. The pattern depends on positions and the draw alone, never on content, so a causal
output depends on the past alone. Attention_i = softmax_{j admissible}(q_i·k_j/√D) v_j; no admissible key → 0.

Budget: ``block`` b, ``window_blocks`` w, ``global_blocks`` g, ``random_blocks`` r; or ``density`` = a target ρ:
for the length N at hand, the largest block ≤ b whose g global blocks and diagonal are not denser than ρ (down to
single tokens; a ρ below that floor gets it), the largest window ≤ w whose pattern without random blocks is not
denser than ρ, then the r whose expected density (``bigbird_density``, exact over the draw) is nearest ρ
(``bigbird_budget``). g stays, counted in blocks. Chosen from N alone.

Two paths, one pattern and one draw (tests/test_bigbird.py shows they agree in outputs and gradients):
- reference: the (B, H, N, M) boolean mask from A, scores materialised, masked softmax in float32, times V.
- fast (default): global query blocks attend every key densely; every other query block gathers its window,
  global and random key blocks into a (B, H, nb − g, K·b, D) tensor (K slots) and attends within it.

Deviations: global blocks are the first g (the official ITC code: the first and the last), so a causal form
exists; the random blocks are drawn in every forward from ``generator`` (the official code draws with numpy);
N is padded to a multiple of b with masked keys (the official code requires a multiple and falls back to dense
attention for short inputs).

Density (INTERFACE.md): the distinct admissible pairs of A / (valid queries × valid keys), per head, batch-summed.

Shape legend: B batch, H heads, N queries, M keys (M = N), D head dim, P query blocks, K key-block slots, b block.
"""

from functools import lru_cache
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.common import check_core_arguments, check_padding_mask, check_pattern_options, masked_attention


def fixed_blocks(nb: int, window_blocks: int, global_blocks: int, causal: bool, device=None) -> Tensor:
    """(nb, nb) bool: the window and global part of A (causal: restricted to q ≤ p)."""
    p, q = torch.arange(nb, device=device)[:, None], torch.arange(nb, device=device)[None, :]
    fixed = ((p - q).abs() <= window_blocks) | (p < global_blocks) | (q < global_blocks)
    return fixed & (q <= p) if causal else fixed


def random_candidates(fixed: Tensor, causal: bool) -> Tensor:
    """(nb, nb) bool: the blocks a random draw may pick for each query block (causal: earlier blocks only)."""
    return ~fixed & torch.ones_like(fixed).tril(-1) if causal else ~fixed


def admissible_counts(pattern: Tensor, valid: Tensor, block: int, causal: bool) -> Tensor:
    """(B, H, nb·b) float64: admissible keys per query for a block pattern (H, nb, nb) (bool, or the probability
    of each block for an expectation) and valid (B, nb·b): each block's valid keys, causal diagonal by prefix."""
    b, nb = valid.shape[0], pattern.shape[-1]
    valid = valid.to(torch.float64).view(b, nb, block)  # (B, nb, b)
    pattern = pattern.to(torch.float64)
    if not causal:
        per_block = torch.einsum("hpq,bq->bhp", pattern, valid.sum(-1))  # (B, H, nb)
        return per_block.repeat_interleave(block, -1)  # (B, H, nb·b)
    earlier = torch.einsum("hpq,bq->bhp", pattern.tril(-1), valid.sum(-1)).repeat_interleave(block, -1)
    diagonal = pattern.diagonal(dim1=-2, dim2=-1)[None, :, :, None] * valid.cumsum(-1)[:, None]  # (B, H, nb, b)
    return earlier + diagonal.reshape(b, -1, nb * block)


@lru_cache(maxsize=256)
def bigbird_density(
    n: int, block: int, window_blocks: int, global_blocks: int, random_blocks: int, causal: bool
) -> float:
    """Expected density at length n without padding, over the random draw: a candidate block is picked with
    probability min(r, c_p)/c_p (c_p candidates in row p), so the expectation is exact."""
    nb = -(-n // block)
    fixed = fixed_blocks(nb, window_blocks, global_blocks, causal)
    candidates = random_candidates(fixed, causal).to(torch.float64)
    per_row = candidates.sum(-1, keepdim=True)  # (nb, 1)
    pick = (per_row.clamp_max(random_blocks) / per_row.clamp_min(1)) * candidates  # (nb, nb)
    valid = torch.arange(nb * block) < n  # (nb·b,)
    counts = admissible_counts((fixed + pick)[None], valid[None], block, causal)  # (1, 1, nb·b)
    return float((counts * valid).sum()) / n**2


@lru_cache(maxsize=256)
def bigbird_budget(
    n: int, density: float, block: int, window_blocks: int, global_blocks: int, causal: bool
) -> Tuple[int, int, int]:
    """(block, window_blocks, random_blocks) for a target density at length n: the largest block ≤ block whose
    global blocks and diagonal are not denser than the target (else single tokens; the blocks' sizes are an
    efficiency choice of the paper, the pattern is the method), the widest window ≤ window_blocks not denser than
    the target without random blocks (else no window), then the r nearest the target."""
    block = next((b for b in range(block, 0, -1) if bigbird_density(n, b, 0, global_blocks, 0, causal) <= density), 1)
    w = next(
        (w for w in range(window_blocks, -1, -1) if bigbird_density(n, block, w, global_blocks, 0, causal) <= density),
        0,
    )
    lo, hi = 0, -(-n // block)
    while lo < hi:  # smallest r reaching the target (density grows with r)
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if bigbird_density(n, block, w, global_blocks, mid, causal) < density else (lo, mid)
    r = min((max(lo - 1, 0), lo), key=lambda r: abs(bigbird_density(n, block, w, global_blocks, r, causal) - density))
    return block, w, r


class BigBirdAttention(nn.Module):
    """Multi-head BigBird attention (INTERFACE.md). Budget: ``block``, ``window_blocks`` (half-width in blocks),
    ``global_blocks``, ``random_blocks`` (default 3) or ``density`` (a target: block, window and r chosen per
    length; then ``random_blocks`` stays None). ``path``: "reference" or "fast"."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dropout: float = 0.0,
        *,
        block: int = 64,
        window_blocks: int = 1,
        global_blocks: int = 2,
        random_blocks: Optional[int] = None,
        density: Optional[float] = None,
        path: str = "fast",
    ):
        super().__init__()
        check_core_arguments(dim, heads, head_dim, dropout)
        if block < 1 or min(window_blocks, global_blocks, 0 if random_blocks is None else random_blocks) < 0:
            raise ValueError(
                f"block must be >= 1 and window_blocks, global_blocks, random_blocks >= 0, got "
                f"block={block}, window_blocks={window_blocks}, global_blocks={global_blocks}, "
                f"random_blocks={random_blocks}"
            )
        if random_blocks is not None and density is not None:
            raise ValueError(f"give random_blocks or density, not both (got {random_blocks}, {density})")
        check_pattern_options(density, path)
        self.heads, self.head_dim, self.dropout, self.path = heads, head_dim, dropout, path
        self.block, self.window_blocks, self.global_blocks = block, window_blocks, global_blocks
        self.random_blocks = 3 if random_blocks is None and density is None else random_blocks
        self.density = density
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)

    def extra_repr(self) -> str:
        return (
            f"heads={self.heads}, head_dim={self.head_dim}, block={self.block}, "
            f"window_blocks={self.window_blocks}, global_blocks={self.global_blocks}, "
            f"random_blocks={self.random_blocks}, density={self.density}, path={self.path}"
        )

    def draw_pattern(self, n: int, causal: bool, generator: Optional[torch.Generator], device) -> Tuple[Tensor, int]:
        """(A: (H, nb, nb) bool, the block b). R_p: the r smallest of uniforms over p's candidates (a uniform draw
        without replacement), drawn on the generator's device; the draw depends on N alone, never on content."""
        blk, w, r = self.block, self.window_blocks, self.random_blocks
        if self.density is not None:
            blk, w, r = bigbird_budget(n, self.density, blk, w, self.global_blocks, causal)
        nb = -(-n // blk)
        fixed = fixed_blocks(nb, w, self.global_blocks, causal, device)  # (nb, nb)
        pattern = fixed.expand(self.heads, nb, nb)
        if min(r, nb) > 0:
            source = generator.device if generator is not None else device
            u = torch.rand(self.heads, nb, nb, generator=generator, device=source).to(device)  # (H, nb, nb)
            u = u.masked_fill(~random_candidates(fixed, causal), 2.0)  # non-candidates last, never picked
            value, index = u.topk(min(r, nb), -1, largest=False)  # (H, nb, r)
            pattern = pattern | torch.zeros_like(pattern).scatter(-1, index, value < 2.0)
        return pattern, blk

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
        pattern, blk = self.draw_pattern(n, causal, generator, x.device)  # (H, nb, nb), b
        nb = pattern.shape[-1]
        valid = torch.ones(b, n, dtype=torch.bool, device=x.device) if key_padding_mask is None else ~key_padding_mask
        valid = F.pad(valid, (0, nb * blk - n), value=False)  # (B, nb·b): the tail block's padding
        p_drop = self.dropout if self.training else 0.0
        core = self.reference_core if self.path == "reference" else self.fast_core
        y = core(q, k, v, valid, pattern, blk, causal, p_drop, generator).to(v.dtype)  # (B, H, N, D)
        counts = admissible_counts(pattern, valid, blk, causal)[..., :n]  # (B, H, N)
        y = y.masked_fill((counts == 0)[..., None], 0.0)  # a query with no admissible key outputs 0
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        pairs = (counts * valid[:, None, :n]).sum((0, 2))  # (H,) distinct admissible pairs
        total = (valid.sum(1).to(torch.float64) ** 2).sum().clamp_min(1)
        return self.out(y), {"density": (pairs / total).to(torch.float32)}

    def reference_core(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid: Tensor,
        pattern: Tensor,
        blk: int,
        causal: bool,
        p_drop: float,
        generator: Optional[torch.Generator],
    ) -> Tensor:
        """A expanded to tokens, a dense (B, H, N, M) mask: A[p(i), p(j)], j valid, causal j ≤ i."""
        n = q.shape[-2]
        allowed = pattern.repeat_interleave(blk, 1).repeat_interleave(blk, 2)[:, :n, :n]  # (H, N, M)
        allowed = allowed[None] & valid[:, None, None, :n]  # (B, H, N, M)
        if causal:
            allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        return masked_attention(q, k, v, allowed, p_drop, generator)

    # --- fast path: block gathers -----------------------------------------------------------------------------
    def fast_core(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid: Tensor,
        pattern: Tensor,
        blk: int,
        causal: bool,
        p_drop: float,
        generator: Optional[torch.Generator],
    ) -> Tensor:
        """Global query blocks (p < g: A's full rows) attend every key; each other query block gathers the K key
        blocks of its row of A (K: the most any row holds; a shorter row's spare slots are masked), so each
        distinct pair is scored once and the work is O(N·K·b·D) instead of O(N·M·D)."""
        bsz, h, n, d = q.shape
        nb = pattern.shape[-1]
        g = min(self.global_blocks, nb)
        q, k, v = (F.pad(t, (0, 0, 0, nb * blk - n)) for t in (q, k, v))  # (B, H, nb·b, D)
        outputs = []
        if g > 0:
            allowed = valid[:, None, None, :]  # (B, 1, 1, M)
            if causal:
                pos = torch.arange(nb * blk, device=q.device)
                allowed = allowed & (pos[None, :] <= pos[: g * blk, None])  # (B, 1, g·b, M)
            outputs.append(masked_attention(q[:, :, : g * blk], k, v, allowed, p_drop, generator))  # (B, H, g·b, D)
        if nb > g:
            p = torch.arange(g, nb, device=q.device)  # (P,) the other query blocks
            others = pattern[:, g:].clone()  # (H, P, nb)
            others[:, p - g, p] = False  # the query block itself goes to slot 0
            present, slots = others.to(torch.uint8).topk(int(others.sum(-1).max()), -1)  # (H, P, K − 1)
            slots = torch.cat([p.expand(h, -1)[..., None], slots], -1)  # (H, P, K)
            present = F.pad(present.bool(), (1, 0), value=True)  # (H, P, K): a shorter row's spare slots False
            kk = slots.shape[-1]
            rows = (torch.arange(h, device=q.device)[:, None, None] * nb + slots).flatten()  # (H·P·K,) in H·nb
            k_g, v_g = (
                t.reshape(bsz, h * nb, blk * d).index_select(1, rows).view(bsz, h, nb - g, kk * blk, d) for t in (k, v)
            )  # (B, H, P, K·b, D)
            key_valid = valid.view(bsz, nb, blk)[:, slots] & present[None, ..., None]  # (B, H, P, K, b)
            allowed = key_valid.flatten(3, 4)[:, :, :, None, :]  # (B, H, P, 1, K·b)
            if causal:  # slot 0 (the block itself) takes the triangle j ≤ i; a causal row's other blocks are earlier
                own = torch.ones(blk, kk * blk, dtype=torch.bool, device=q.device)
                own[:, :blk] = own[:, :blk].tril()
                allowed = allowed & own  # (B, H, P, b, K·b)
            q_b = q[:, :, g * blk :].view(bsz, h, nb - g, blk, d)  # (B, H, P, b, D)
            outputs.append(masked_attention(q_b, k_g, v_g, allowed, p_drop, generator).flatten(2, 3))  # (B,H,P·b,D)
        return torch.cat(outputs, 2)[:, :, :n]  # (B, H, N, D)
