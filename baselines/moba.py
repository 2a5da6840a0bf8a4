"""MoBA, a block router: each query attends to its own key block and the k other blocks its gate ranks highest.

Lu et al., "MoBA: Mixture of Block Attention for Long-Context LLMs" (arXiv 2502.13189), §2.2. The keys are cut
into P = ⌈N/b⌉ blocks I_p = [p·b, (p + 1)·b); per head, query i (in block p(i)) gates every candidate block by
its affinity with the block's mean key (Eq. 6) and keeps the top k (Eq. 5):

    s_ip = q_i · mean_{j ∈ I_p, j valid} k_j
    G_i = {p(i)} ∪ topk_{p ∈ C_i} (s_ip, k)
    Attention_i = softmax_{j ∈ I_p, p ∈ G_i, j admissible} (q_i·k_j / √D) v_j

C_i: the other blocks holding a valid key; causal: only the blocks wholly in the past, p < p(i), while the own
block is always kept and causally masked (§2.2, "Causality"). All of C_i when it holds at most k blocks.
Admissible: a valid key, and j ≤ i when causal. A query with no admissible key outputs zeros. A padded key is
left out of its block's mean, so its content moves neither the gate nor the output.

Budget: ``block`` b and ``topk`` k: a query scores at most (k + 1)·b keys.

Two paths, one routing (tests/test_moba.py shows they agree in outputs and gradients):
- reference: the router's choice as a dense (B, H, N, M) mask, scores materialised, masked softmax in float32.
- fast (default): each query gathers the keys of its k routed blocks, (B, H, N, K·b, D), beside its own block's,
  which the block's queries share; one softmax over the (k + 1)·b: O(N·(k + 1)·b·D), no N × M tensor.

Density (INTERFACE.md): the admissible keys of the own and routed blocks, summed over valid queries / (valid
queries × valid keys), batch-summed. They are the pairs the fast path scores (its masked slots aside), so the
density is also the computed pairs of bench/measure.py.

Deviations: the official code counts the own block among its top-k (its gate is set to +∞); here k counts the
routed blocks only, so MoBA's top-3 is k = 2. N is padded to a multiple of b with masked keys; dropout acts on the
attention weights, drawn from ``generator``.

Shape legend: B batch, H heads, N queries (N' after padding to P·b), M keys, D head dim, P blocks, K routed blocks,
b block length.
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.common import check_core_arguments, check_padding_mask, generator_dropout, masked_attention


def route(q: Tensor, k: Tensor, valid: Tensor, block: int, topk: int, causal: bool) -> Tuple[Tensor, Tensor]:
    """The router (Eq. 5-6): q, k (B, H, N', D), valid (B, N') → each query's routed blocks (B, H, N', K) and
    whether each slot holds a candidate (B, H, N', K) (False where C_i has fewer than K blocks). The top-k choice is
    not differentiable: as in MoBA, the gate gets no gradient, and q and k learn only through the attention over
    the blocks chosen. Gate in float32 at least, under autocast too."""
    bsz, h, n, d = q.shape
    p = n // block
    compute = torch.promote_types(q.dtype, torch.float32)
    with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
        weight = valid.view(bsz, 1, p, block, 1).to(compute)  # (B, 1, P, b, 1)
        count = weight.sum(3)  # (B, 1, P, 1): valid keys per block
        means = (k.to(compute).view(bsz, h, p, block, d) * weight).sum(3) / count.clamp_min(1)  # (B, H, P, D)
        gate = q.to(compute) @ means.transpose(-1, -2)  # (B, H, N', P): s_ip
        own = torch.arange(n, device=q.device)[:, None] // block  # (N', 1): p(i)
        blocks = torch.arange(p, device=q.device)[None, :]  # (1, P)
        candidate = (count[..., 0] > 0)[:, :, None, :] & ((blocks < own) if causal else (blocks != own))
        # (B, 1, N', P)
        index = gate.masked_fill(~candidate, -math.inf).topk(min(topk, p), -1).indices  # (B, H, N', K)
        return index, candidate.expand(bsz, h, n, p).gather(-1, index)


class MoBAAttention(nn.Module):
    """Multi-head MoBA attention (INTERFACE.md). Budget: ``block`` (b, default 64) and ``topk`` (k, the routed
    blocks beside the own one, default 2: the paper's top-3). ``path``: "reference" or "fast"."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dropout: float = 0.0,
        *,
        block: int = 64,
        topk: int = 2,
        path: str = "fast",
    ):
        super().__init__()
        check_core_arguments(dim, heads, head_dim, dropout)
        if block < 1 or topk < 0:
            raise ValueError(f"block must be >= 1 and topk >= 0, got block={block}, topk={topk}")
        if path not in ("reference", "fast"):
            raise ValueError(f"path must be 'reference' or 'fast', got {path!r}")
        self.heads, self.head_dim, self.dropout, self.path = heads, head_dim, dropout, path
        self.block, self.topk = block, topk
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, head_dim={self.head_dim}, block={self.block}, topk={self.topk}, path={self.path}"

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
    ):
        b, n, _ = x.shape
        check_padding_mask(key_padding_mask, b, n)
        blk = self.block
        pad = -n % blk
        q, k, v = F.pad(self.qkv(x), (0, 0, 0, pad)).view(b, n + pad, 3, self.heads, self.head_dim).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # 3×(B, H, N', D)
        valid = torch.ones(b, n, dtype=torch.bool, device=x.device) if key_padding_mask is None else ~key_padding_mask
        valid = F.pad(valid, (0, pad), value=False)  # (B, N'): the tail block's padding
        index, chosen = route(q, k, valid, blk, self.topk, causal)  # (B, H, N', K) ×2
        # admissible keys per query: its own block's valid keys (causal: up to itself) and its routed blocks'
        per_block = valid.view(b, -1, blk).sum(-1, dtype=torch.float64)  # (B, P)
        own = (
            valid.view(b, -1, blk).cumsum(-1, dtype=torch.float64)
            if causal
            else per_block[..., None].expand(-1, -1, blk)
        )  # (B, P, b)
        routed = per_block[:, None, None, :].expand(*index.shape[:3], -1).gather(-1, index)  # (B, H, N', K)
        counts = (routed * chosen).sum(-1) + own.reshape(b, 1, -1)  # (B, H, N')
        p_drop = self.dropout if self.training else 0.0
        core = self.reference_core if self.path == "reference" else self.fast_core
        y = core(q, k, v, valid, index, chosen, blk, causal, p_drop, generator).to(v.dtype)[:, :, :n]  # (B, H, N, D)
        y = y.masked_fill((counts[..., :n] == 0)[..., None], 0.0)  # a query with no admissible key outputs 0
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        pairs = (counts * valid[:, None]).sum((0, 2))  # (H,) admissible pairs of valid queries
        total = (valid.sum(1, dtype=torch.float64) ** 2).sum().clamp_min(1)
        return self.out(y), {"density": (pairs / total).to(torch.float32)}

    @staticmethod
    def reference_core(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid: Tensor,
        index: Tensor,
        chosen: Tensor,
        blk: int,
        causal: bool,
        p_drop: float,
        generator: Optional[torch.Generator],
    ) -> Tensor:
        """G_i as a dense (B, H, N', M) mask: the routed blocks and the own block, valid keys, causal j ≤ i."""
        n = q.shape[-2]
        routed = torch.zeros(*index.shape[:3], n // blk, dtype=torch.bool, device=q.device).scatter(-1, index, chosen)
        key_block = torch.arange(n, device=q.device) // blk  # (M,)
        allowed = routed[..., key_block] | (key_block[:, None] == key_block[None, :])  # (B, H, N', M)
        if causal:
            allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        return masked_attention(q, k, v, allowed & valid[:, None, None, :], p_drop, generator)

    # --- fast path: the own block shared, the routed blocks gathered ---------------------------------------------
    @staticmethod
    def fast_core(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid: Tensor,
        index: Tensor,
        chosen: Tensor,
        blk: int,
        causal: bool,
        p_drop: float,
        generator: Optional[torch.Generator],
    ) -> Tensor:
        """A query's (k + 1)·b scores: its own block's b (one matmul per block, shared by the block's queries), then
        the K·b of the blocks it was routed to, gathered per query; one softmax over both."""
        bsz, h, n, d = q.shape
        p, kk = n // blk, index.shape[-1]
        compute = torch.promote_types(q.dtype, torch.float32)  # float32 at least, float64 kept for tests
        with torch.autocast(q.device.type, enabled=False):
            q, k, v = q.to(compute) / math.sqrt(d), k.to(compute), v.to(compute)
            kb, vb = k.reshape(bsz, h, p, blk, d), v.reshape(bsz, h, p, blk, d)  # (B, H, P, b, D)
            own = (q.view(bsz, h, p, blk, d) @ kb.transpose(-1, -2)).view(bsz, h, n, blk)  # (B, H, N', b)
            own_allowed = valid.view(bsz, 1, p, 1, blk).expand(bsz, 1, p, blk, blk)  # (B, 1, P, b, b)
            if causal:
                own_allowed = own_allowed & torch.ones(blk, blk, dtype=torch.bool, device=q.device).tril()
            rows = (index + torch.arange(bsz * h, device=q.device).view(bsz, h, 1, 1) * p).flatten()  # (B·H·N'·K,)
            k_r, v_r = (
                t.reshape(bsz * h * p, blk * d).index_select(0, rows).view(bsz, h, n, kk * blk, d) for t in (k, v)
            )
            # (B, H, N', K·b, D)
            routed = (q[..., None, :] @ k_r.transpose(-1, -2))[..., 0, :]  # (B, H, N', K·b)
            batch = torch.arange(bsz, device=q.device).view(bsz, 1, 1, 1)
            routed_allowed = (valid.view(bsz, p, blk)[batch, index] & chosen[..., None]).flatten(-2)  # (B, H, N', K·b)
            allowed = torch.cat([own_allowed.reshape(bsz, 1, n, blk).expand(bsz, h, n, blk), routed_allowed], -1)
            # finfo.min added, as masked_attention: a row with nothing allowed stays finite; the caller zeroes it
            bias = torch.where(allowed, torch.zeros((), dtype=compute, device=q.device), torch.finfo(compute).min)
            probs = generator_dropout((torch.cat([own, routed], -1) + bias).softmax(-1), p_drop, generator)
            # (B, H, N', (K + 1)·b)
            y = (probs[..., :blk].reshape(bsz, h, p, blk, blk) @ vb).view(bsz, h, n, d)  # own block
            return y + (probs[..., None, blk:] @ v_r)[..., 0, :]  # (B, H, N', D)
