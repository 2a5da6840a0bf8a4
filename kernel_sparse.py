"""Kernel-based learned sparse attention: per query, predict which 1-D kernels to OR into its attention mask.

Karkhanis, Roberts, Krishnan, "A Kernel based approach to Learning Sparse Attention in Transformers", a Carnegie
Mellon University report (no arXiv id). Per layer and head, for query i of a length-N sequence (L = `max_len`):
    a_is = 1[softmax_s(q_i Kᵀ/√D) ≥ 0.05]                       targets (§4.2; `--target topk`: the 20 largest, §1)
    α(i) = σ(MLP([x_{i−2} … x_{i+2}], loc(i)))                   a coefficient per kernel κ and head (§4.2)
    K_κ(i, s) = max(local_κ[s − i + L − 1], row_κ[i]·col_κ[s])   local offsets, global columns and rows (§4.2)
    L(θ) = Σ_s (max_κ α_κ(i) K_κ(i, s) − a_is)²                  Eq. 1: a max over binary kernels is a soft OR
    S(i) = {κ : α_κ(i) > τ} or the top-K α,  mask(i) = ∪_{κ ∈ S(i)} K_κ(i, ·)                    (§5.2)
    y_i = Σ_{s ∈ mask(i)} softmax_s(q_i·k_s/√D) v_s, computed on the mask's (query, key) list only
Kernel families: 17 standard sliding windows (§4.2.1), 6 handcrafted per head from the teacher's targets (§4.2.2),
14 learned local kernels per layer (§4.2.3). §4.1 accumulates the teacher's attention maps over sequences and
normalises them by sequence length and by distance from the diagonal (Fig. 1).
`main` is the method's procedure: (1) a dense masked-LM teacher (ours: `--task bytes`, a causal one); (2) §4.1's
analysis; (3) one family's predictors fitted with Eq. 1 (or the per-kernel loss, §6.2) and installed with the
selection rule (§5.2); (4) sparsified validation; (5) end-to-end fine-tuning with the predicted masks (§6.2). The
record is the fine-tuned sparse model's. The paper's comparisons (Table 1 for every family and loss, also at matched
keys per query; Tables 2-3; Fig. 5-6; fine-tuning beside a dense control) are experiments/kernel_pipeline.py.

    python kernel_sparse.py --task wikitext2                                 # CPU preset, minutes on one core
    python kernel_sparse.py --task wikitext2 --family learned --select topk  # another family, top-K selection
    python kernel_sparse.py --task bytes                                     # a causal teacher
    python -m experiments.kernel_pipeline --task wikitext2                   # Table 1, Fig. 5-6, §6.2's control
    python -m pytest tests/test_kernel_sparse.py -q                          # `bench.train --method kernel`: main()

One layer's inference time, sparse beside dense, at n = 256-4096: results/notes/kernel_time.md.

Shape legend: B batch, H heads, N queries, M keys (M = N), D head dim, C model width, K kernels, G kernel groups
(1 or H), L max length, R rows (queries) taken, S selected (row, head, kernel) triples or sequences, P offsets
that local kernels hold, Z candidate (query, key) pairs, E edges; global query and key indices are (b·H + h)·N + i
and (b·H + h)·M + s.
"""

import contextlib
import math
import sys
import warnings
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from alibi import alibi_bias, alibi_slopes

PATHS = ("fast", "reference")
SELECTS = ("threshold", "topk")  # the selection rule (§5.2), and the targets' (§4.2)
# §4.2.1: (window length, dilation) of the forward kernels (offsets d, 2d, …, w·d) and, mirrored, the backward ones;
# with the identity, 17 kernels. Ours: Fig. 4a is a picture without lengths or dilations. Nested windows reach 32
# tokens, the dilated ones 64 and 256.
STANDARD_WINDOWS = ((1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (32, 1), (16, 4), (32, 8))
# The attention's defaults, and the pipeline's: learned kernels per layer (§4.2.3), the predictor's
# window (§6.1), hidden width and layers (§4.2: 32 or 64 units, 2 or 3 layers), and the selection at
# inference (§5.2).
LEARNED_KERNELS, WINDOW, HIDDEN, HIDDEN_LAYERS = 14, 5, 64, 2
SELECT, THRESHOLD, TOP_K = "threshold", 0.5, 3


# ----------------------------------------------------------------------------------------------- helpers
def admissible(valid: Tensor, causal: bool) -> Tensor:
    """(B, 1, N, M) bool: key s may be attended by query i (s not padding; s ≤ i when causal)."""
    n = valid.shape[1]
    allowed = valid[:, None, None, :].expand(-1, 1, n, -1)
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=valid.device).tril()
    return allowed


def valid_pairs(valid: Tensor, causal: bool) -> Tensor:
    """(B, 1, N, M) bool: admissible pairs whose query is valid too (the pairs that targets and losses see)."""
    return admissible(valid, causal) & valid[:, None, :, None]


def hash32(x: Tensor) -> Tensor:
    """An integer hash of int64 values in [0, 2³²) to [0, 2³²) (Wellons' "lowbias32": xor-shifts and two odd
    multipliers). The products are taken 16 bits at a time so that no int64 product overflows."""

    def times(x: Tensor, c: int) -> Tensor:  # x·c mod 2³²
        return ((x & 0xFFFF) * c + ((((x >> 16) * c) & 0xFFFF) << 16)) & 0xFFFFFFFF

    x = times(x ^ (x >> 16), 0x7FEB352D)
    x = times(x ^ (x >> 15), 0x846CA68B)
    return x ^ (x >> 16)


def pair_dropout(weights: Tensor, row: Tensor, col: Tensor, p: float, generator: Optional[torch.Generator]) -> Tensor:
    """Inverted dropout on the attention weights of the (query, key) pairs with global indices `row`, `col`
    (broadcastable to `weights`), one seed drawn from `generator` (INTERFACE.md)."""
    # Ours (the paper has no attention dropout): a pair is kept where hash(hash(row + hash(seed)) + col)/2³² ≥ p, a
    # draw of the pair alone, so the edge list and the masked path drop the same pairs, and a causal query's draws
    # do not move when later tokens change the edges after it (as a flat draw over the edge list would).
    if p == 0.0:
        return weights
    source = generator.device if generator is not None else weights.device
    seed = torch.randint(2**32, (), generator=generator, device=source).to(weights.device)
    u = hash32((hash32((row + hash32(seed)) & 0xFFFFFFFF) + col) & 0xFFFFFFFF)  # (…) uniform on [0, 2³²)
    return weights * (u >= p * 2**32) / (1.0 - p)


# ---------------------------------------- reference path: kernels K_κ, predictor α(i), union mask, masked attention
class KernelBank(nn.Module):
    """K kernels per group (G = 1: shared by all heads, or G = H): K_κ(i, s) = max(local_κ[s − i + L − 1],
    row_κ[i]·col_κ[s]). local (G, K, 2L−1) in [0, 1] (learned: logits, σ applied), row and col (G, K, L) binary."""

    def __init__(self, local: Tensor, row: Tensor, col: Tensor, learned: bool = False):
        super().__init__()
        if not (
            local.shape[:2] == row.shape[:2] == col.shape[:2]
            and local.shape[-1] == 2 * row.shape[-1] - 1
            and row.shape == col.shape
        ):
            raise ValueError(
                f"kernel shapes disagree: local {tuple(local.shape)}, row {tuple(row.shape)}, col {tuple(col.shape)}"
            )
        self.learned = learned
        if learned:
            self.logits = nn.Parameter(local.float())
        else:
            self.register_buffer("fixed", local.float())
        self.register_buffer("row", row.float())
        self.register_buffer("col", col.float())

    def extra_repr(self) -> str:
        return f"groups={self.row.shape[0]}, kernels={self.num_kernels}, max_len={self.max_len}, learned={self.learned}"

    @property
    def max_len(self) -> int:
        return self.row.shape[-1]

    @property
    def num_kernels(self) -> int:
        return self.row.shape[1]

    def local(self) -> Tensor:
        return self.logits.sigmoid() if self.learned else self.fixed  # §4.2.3: σ keeps learned values in (0, 1)

    def patterns(self, n: int, rows: Optional[Tensor] = None) -> Tensor:
        """(G, K, R, M) kernel values on rows `rows` (default: all N) of an N × N map."""
        i = torch.arange(n, device=self.row.device) if rows is None else rows  # (R,)
        offset = torch.arange(n, device=i.device)[None, :] - i[:, None] + self.max_len - 1  # (R, M) s − i + L − 1
        block = self.row[:, :, i, None] * self.col[:, :, None, :n]  # (G, K, R, M) global rows × columns
        return torch.maximum(self.local()[:, :, offset], block)

    def mask(self, sel: Tensor, valid: Tensor, causal: bool) -> Tensor:
        """(B, H, N, M) bool OR of each query's selected kernels, sel (B, N, H, K), O(B·H·K·N·M); padded queries
        select nothing (ours: their output is 0, never scored), padded keys and, causal, s > i are cut."""
        n, heads = sel.shape[1], sel.shape[2]
        # Ours: learned kernels are binarised at 0.5 (the paper does not say how their reals become a mask).
        binary = (self.patterns(n) > 0.5).float().expand(heads, -1, -1, -1)  # (H, K, N, M)
        hits = torch.einsum("bnhk,hknm->bhnm", (sel & valid[:, :, None, None]).float(), binary)
        return (hits > 0) & admissible(valid, causal)

    def edges(self, sel: Tensor, valid: Tensor, causal: bool) -> Tuple[Tensor, Tensor]:
        """The same OR as an edge list, (row, col) global indices: `union_edges`, the fast path below."""
        return union_edges(self, sel, valid, causal)


def standard_kernels(max_len: int) -> KernelBank:
    """§4.2.1: identity, then forward and backward sliding windows (`STANDARD_WINDOWS`), shared by the heads."""
    local = torch.zeros(1, 1 + 2 * len(STANDARD_WINDOWS), 2 * max_len - 1)
    centre = max_len - 1
    local[0, 0, centre] = 1.0
    for index, (length, dilation) in enumerate(STANDARD_WINDOWS):
        reach = torch.arange(1, length + 1) * dilation
        reach = reach[reach < max_len]
        local[0, 1 + index, centre + reach] = 1.0  # forward: the tokens after the query
        local[0, 1 + len(STANDARD_WINDOWS) + index, centre - reach] = 1.0  # backward: the tokens before it
    empty = torch.zeros(1, local.shape[1], max_len)
    return KernelBank(local, empty, empty)


def init_learned_kernels(
    max_len: int, count: int, generator: Optional[torch.Generator] = None, mean: float = 0.0
) -> KernelBank:
    """§4.2.3: `count` local kernels of length 2L−1 per layer (1023 at L = 512), logits N(mean, 1), shared by heads."""
    logits = torch.randn(1, count, 2 * max_len - 1, generator=generator) + mean
    empty = torch.zeros(1, count, max_len)
    return KernelBank(logits, empty, empty, learned=True)


class KernelPredictor(nn.Module):
    """§4.2: α = σ(MLP(window of layer inputs, location embedding)), the inputs taken before the query projection,
    a 4-d learned location embedding, 2-3 hidden layers of 32 or 64 units with ReLU. The first layer on the
    concatenated window is a Conv1d over the sequence; the location enters through its own map into the same units."""

    # Ours: one predictor per layer with H·K outputs (a coefficient per head and kernel), not one model per head.

    def __init__(
        self,
        dim: int,
        heads: int,
        bank: KernelBank,
        window: int = WINDOW,
        hidden: int = HIDDEN,
        hidden_layers: int = HIDDEN_LAYERS,
        location_dim: int = 4,
    ):
        super().__init__()
        if bank.row.shape[0] not in (1, heads):
            raise ValueError(f"kernel groups must be 1 or heads={heads}, got {bank.row.shape[0]}")
        self.heads, self.window, self.bank = heads, window, bank
        self.embed_window = nn.Conv1d(dim, hidden, window)
        self.location = nn.Embedding(bank.max_len, location_dim)
        self.embed_location = nn.Linear(location_dim, hidden, bias=False)
        layers = []
        for _ in range(hidden_layers - 1):
            layers += [nn.ReLU(), nn.Linear(hidden, hidden)]
        self.mlp = nn.Sequential(*layers, nn.ReLU(), nn.Linear(hidden, heads * bank.num_kernels))

    def forward(self, x: Tensor, valid: Tensor, causal: bool) -> Tensor:
        """x (B, N, C) attention inputs, valid (B, N) → α (B, N, H, K)."""
        b, n, _ = x.shape
        x = (x * valid[..., None]).transpose(1, 2)  # (B, C, N): padding contributes nothing
        # Ours, causal: the window ends at the query, so no mask depends on a later token.
        pad = (self.window - 1, 0) if causal else (self.window // 2, self.window // 2)
        h = self.embed_window(F.pad(x, pad)).transpose(1, 2)  # (B, N, hidden)
        h = h + self.embed_location(self.location(torch.arange(n, device=x.device)))
        return self.mlp(h).sigmoid().view(b, n, self.heads, -1)


def masked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    p_drop: float = 0.0,
    generator: Optional[torch.Generator] = None,
    bias: Optional[Tensor] = None,
) -> Tensor:
    """The reference path: softmax(QKᵀ/√D + bias) over each query's masked keys with the (B, H, N, M) scores
    materialised; a row without keys gives 0. q (B, H, N, D), k, v (B, H, M, D), mask (B|1, H|1, N, M),
    bias (H, N, M) or None."""
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-1, -2)  # (B, H, N, M)
    if bias is not None:
        scores = scores + bias
    probs = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(-1) * mask  # empty rows → 0
    b, h, n, m = probs.shape
    block = torch.arange(b * h, device=q.device).view(b, h, 1, 1)  # graph b·H + h: global indices as the edges'
    row, col = block * n + torch.arange(n, device=q.device)[:, None], block * m + torch.arange(m, device=q.device)
    return pair_dropout(probs, row, col, p_drop, generator) @ v  # (B, H, N, D)


# ------------------------------------------------------------ fast path: the union as an edge list, attention on it
def union_edges(bank: KernelBank, sel: Tensor, valid: Tensor, causal: bool) -> Tuple[Tensor, Tensor]:
    """KernelBank.mask as (row, col) global indices, grouped by query (ascending) without repeats, built from the
    kernels' structure with no sort of the edges: a local kernel is a set of diagonals (offsets d = s − i), so the
    queries that select the same kernels (in the same head group) share one ascending list of offsets, the OR of
    their kernels' sets, and query i's local keys are the run of that list inside [−i, N − 1 − i] (≤ 0 when causal),
    found from prefix counts and written out directly; a global block adds its columns to the queries of its rows,
    less those already there (a local offset or an earlier kernel's column). O(B·H·N·K + U·P + E) for U distinct
    selections and P offsets some kernel holds; no N × M tensor, no per-query bitmap over the P offsets."""
    b, n, heads, kernels = sel.shape
    queries, device, padded = b * heads * n, sel.device, not bool(valid.all())
    chosen = (sel & valid[:, :, None, None] if padded else sel).transpose(1, 2)  # (B, H, N, K)
    chosen = chosen.reshape(queries, kernels)  # (B·H·N, K); padded queries select nothing
    local = bank.local()[:, :, bank.max_len - n : bank.max_len - 1 + n] > 0.5  # (G, K, 2N−1): |s − i| < N
    slot = local.any(1).any(0).nonzero().squeeze(1)  # (P,) offsets some kernel holds, + N − 1, ascending
    d = slot - (n - 1)  # (P,) offsets s − i
    groups, head = bank.row.shape[0], torch.arange(queries, device=device) // n % heads  # (B·H·N,)
    # Each query's selection as a code, 31 kernels to a number (then its head, where heads have their own kernels),
    # renumbered 0 … U − 1: a sort of B·H·N codes, not of the E edges; selections repeat (top 3 of 17: ≤ 680 codes).
    bits = torch.arange(31, device=device)
    numbers = [
        (chosen[:, first : first + 31].long() << bits[: kernels - first]).sum(1) for first in range(0, kernels, 31)
    ]
    code = numbers[0]
    for number in numbers[1:] + ([head] if groups > 1 else []):
        code = torch.unique(code, return_inverse=True)[1] * 2**31 + number  # < B·H·N·2³¹: no overflow
    code = torch.unique(code, return_inverse=True)[1]  # (B·H·N,)
    codes = int(code.max()) + 1 if queries else 0  # U
    first = torch.full((codes,), queries, device=device).scatter_reduce_(
        0, code, torch.arange(queries, device=device), "amin"
    )  # (U,) a query of each code
    pick = torch.zeros(codes, groups, kernels, device=device)  # (U, G, K) the code's kernels, in its head's group
    pick[torch.arange(codes, device=device), head[first] % groups] = chosen[first].float()  # group: 0, or the head
    union = pick.flatten(1) @ local[:, :, slot].flatten(0, 1).float() > 0  # (U, P): offset p is in code u's union
    before = F.pad(union.cumsum(1), (1, 0))  # (U, P + 1) the code's offsets in slots before p
    i = torch.arange(n, device=device)
    lo = torch.searchsorted(d, -i).repeat(b * heads)  # (B·H·N,) the first slot whose key i + d is ≥ 0
    last = torch.zeros_like(i) if causal else n - 1 - i  # (N,) the largest offset whose key is admissible
    hi = torch.searchsorted(d, last, right=True).repeat(b * heads)  # (B·H·N,) past the last slot ≤ it
    lo, hi = before[code, lo], before[code, hi]  # (B·H·N,) the query's run in its code's list
    near = hi - lo  # (B·H·N,) local keys per query
    listed = d.expand(codes, -1)[union]  # every code's offsets, code after code, ascending
    shift = (before[:, -1].cumsum(0) - before[:, -1])[code] + lo - (near.cumsum(0) - near)  # list index − edge's
    row = torch.repeat_interleave(near)  # (E₁,) grouped by query, keys ascending
    at = shift.index_select(0, row).add_(torch.arange(len(row), device=device))  # (E₁,) the edge's offset in `listed`
    col = listed.index_select(0, at).add_(row)  # global key: query + d
    if padded:  # padded keys never receive weight
        kept = valid.reshape(-1)[row // (heads * n) * n + col % n]  # (E₁,)
        row, col = row[kept], col[kept]
        near = torch.bincount(row, minlength=queries)
    in_block = (bank.row[:, :, :n] > 0.5).transpose(1, 2)  # (G, N, K) query i is in kernel κ's global block
    if not bool(in_block.any()):  # local kernels only
        return row, col
    block = chosen.view(b, heads, n, kernels) & in_block  # (B, H, N, K) selected, row i in the block
    if not bool(block.any()):
        return row, col
    columns = bank.col[:, :, :n] > 0.5  # (G, K, M)
    count = columns.sum(-1).view(-1)  # (G·K,) columns per kernel
    listed = columns.view(-1, n).nonzero()[:, 1]  # every kernel's columns, kernel after kernel
    query, kernel = block.view(-1, kernels).nonzero(as_tuple=True)  # (S,) grouped by query
    gk = (query // n % heads if columns.shape[0] > 1 else 0) * kernels + kernel  # (S,) group·K + kernel
    owner = torch.repeat_interleave(count[gk])  # (Z,) candidates: every column of every selection
    shift = (count.cumsum(0) - count)[gk] - (count[gk].cumsum(0) - count[gk])  # (S,) listed index − candidate's
    s = listed[shift[owner] + torch.arange(len(owner), device=owner.device)]  # (Z,) candidate keys
    query, kernel, group = query[owner], kernel[owner], (gk - kernel)[owner]  # (Z,) each; group = g·K
    offset = s - query % n  # (Z,) s − i
    keep = (offset <= 0) | (not causal)
    if padded:
        keep &= valid.reshape(-1)[query // (heads * n) * n + s]
    if len(slot):  # already a local key: offset s − i has a slot (else −1) in the union of the query's code
        lookup = torch.full((2 * n - 1,), -1, device=s.device)
        at = lookup.index_copy_(0, slot, torch.arange(len(slot), device=s.device))[offset + (n - 1)]  # (Z,)
        keep &= ~((at >= 0) & union[code[query], at.clamp_min(0)])
    for j in block.view(-1, kernels).any(0).nonzero().squeeze(1).tolist():  # already an earlier kernel j's column
        keep &= ~((kernel > j) & block.view(-1, kernels)[query, j] & columns.view(-1, n)[group + j, s])
    far, far_col = query[keep], (query + offset)[keep]  # (E₂,) grouped by query
    # Merge the two lists, each grouped by query, by counting: each query's local edges, then its global ones.
    globals_ = torch.bincount(far, minlength=queries)
    at = torch.cat([(globals_.cumsum(0) - globals_)[row], near.cumsum(0)[far] - len(row)])  # the other list's
    at += torch.arange(len(at), device=at.device)  # edges before, + those of its own list
    rows, cols = torch.empty_like(at), torch.empty_like(at)
    rows[at], cols[at] = torch.cat([row, far]), torch.cat([col, far_col])
    return rows, cols


def csr(crow: Tensor, col: Tensor, values: Tensor, shape: Tuple[int, int]) -> Tensor:
    """A sparse CSR matrix: row offsets, column indices, values."""
    with warnings.catch_warnings():  # torch's notices that CSR "is in beta" and (torch 2.11) that checks are off
        warnings.filterwarnings("ignore", message="Sparse (CSR tensor support is in beta|invariant checks)")
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


class ListAttention(torch.autograd.Function):
    """y_i = Σ_s keep_is·softmax_s(q_i·k_s/√D + bias_is) v_s on the (query, key) list as a CSR matrix (row offsets
    `offsets`, in the sparse kernels' index type `crow`, keys `col`, the query of each edge `row`), O(E·D) time and
    O(E) memory: SDDMM scores, segment reductions, CSR × dense. The backward uses the same products, the keys' side
    (∂K, ∂V) on the transposed list (one sort of the keys); its products have no derivative of their own, so a
    double backward (create_graph=True: a gradient penalty, gradgradcheck) raises."""

    @staticmethod
    def forward(ctx, q, k, v, bias, keep, offsets, crow, col, row):
        shape = (q.shape[0], k.shape[0])
        start = q.new_zeros(len(col)) if bias is None else bias.to(q.dtype, copy=True)  # SDDMM adds it: beta = 1
        scores = csr(crow, col, start, shape)  # written in place
        s = torch.sparse.sampled_addmm(
            scores, q, k.t(), beta=float(bias is not None), alpha=q.shape[-1] ** -0.5, out=scores
        ).values()  # (E,) q_i·k_s/√D + bias_is
        top = torch.segment_reduce(s, "max", offsets=offsets, unsafe=True)  # (Rq,) a shift the softmax ignores
        a = s.sub_(top.index_select(0, row)).exp_()  # (E,) unnormalised, in the scores' place
        total = torch.segment_reduce(a, "sum", offsets=offsets, unsafe=True)  # (Rq,) ≥ e⁰ = 1 where a row has edges
        ctx.save_for_backward(q, k, v, a, total, keep, offsets, crow, col, row)
        y = csr(crow, col, a if keep is None else a * keep, shape) @ v  # (Rq, D); a query without edges gets 0
        return y / total.clamp_min(1.0)[:, None]  # the softmax's division per query (Rq·D), not per edge (E)

    @staticmethod
    def backward(ctx, grad):
        # Grad mode is on here only under create_graph=True; once_differentiable's error node would hang off detached
        # copies, which torch.autograd.grad never reaches: a second derivative without this function's part.
        if torch.is_grad_enabled():
            raise RuntimeError(
                "ListAttention has no second derivative: a double backward (create_graph=True) is "
                "refused; the masked reference path (path='reference') has one"
            )
        q, k, v, a, total, keep, offsets, crow, col, row = ctx.saved_tensors
        shape, scale, grad = (q.shape[0], k.shape[0]), q.shape[-1] ** -0.5, grad.contiguous()
        a = a / total.index_select(0, row)  # (E,) the softmax
        w = a if keep is None else a * keep  # (E,) the weights, dropout's pairs at 0
        dw = csr(crow, col, torch.zeros_like(a), shape)
        da = torch.sparse.sampled_addmm(dw, grad, v.t(), beta=0.0, out=dw).values()  # (E,) ∂L/∂w = grad_i·v_s
        da = da if keep is None else da * keep
        row_dot = torch.segment_reduce(a * da, "sum", offsets=offsets, unsafe=True)  # (Rq,) Σ_s a·∂L/∂w
        ds = a * (da - row_dot.index_select(0, row))  # (E,) ∂L/∂s: the softmax's backward
        order = col.argsort(stable=True)  # the transposed list: edges by key, queries ascending
        key_offsets = torch.searchsorted(col.index_select(0, order), torch.arange(shape[1] + 1, device=col.device))
        key_offsets, query = key_offsets.to(col.dtype), row.index_select(0, order).to(col.dtype)
        dk = (csr(key_offsets, query, ds.index_select(0, order), shape[::-1]) @ q) * scale
        dv = csr(key_offsets, query, w.index_select(0, order), shape[::-1]) @ grad
        dq = (csr(crow, col, ds, shape) @ k) * scale
        return dq, dk, dv, ds if ctx.needs_input_grad[3] else None, None, None, None, None, None


def sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    row: Tensor,
    col: Tensor,
    p_drop: float = 0.0,
    generator: Optional[torch.Generator] = None,
    bias: Optional[Tensor] = None,
) -> Tensor:
    """masked_attention on the (query, key) list only (ListAttention), O(E·D) time and O(E) memory: q (Rq, D) all
    B·H·N queries, k, v (Rk, D), row, col (E,) global indices grouped by query in ascending order, bias (E,) or
    None; a query without edges gets 0."""
    offsets = F.pad(torch.bincount(row, minlength=q.shape[0]).cumsum(0), (1, 0))  # (Rq + 1,) CSR rows: row sorted
    index = torch.int32 if len(col) < 2**31 else torch.int64  # the sparse kernels' own: no copies inside them
    keep = pair_dropout(q.new_ones(len(col)), row, col, p_drop, generator) if p_drop > 0 else None  # (E,)
    return ListAttention.apply(q, k, v, bias, keep, offsets, offsets.to(index), col.to(index), row)


# ---------------------------------------------------------------------------------------- the attention module
class KernelSparseAttention(nn.Module):
    """Multi-head attention with kernel-predicted masks (INTERFACE.md). Budget: the predictor (`kernels`: standard
    or learned; the pipeline installs handcrafted ones), `select` (threshold τ or top-K). `sparse=False`: exact
    softmax attention (the teacher); `sparse=True`: attention inside the predicted mask, on the edge list
    (`path="fast"`) or as a masked dense softmax (`path="reference"`)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dropout: float = 0.0,
        *,
        max_len: int = 512,
        kernels: str = "standard",
        learned_kernels: int = LEARNED_KERNELS,
        window: int = WINDOW,
        hidden: int = HIDDEN,
        hidden_layers: int = HIDDEN_LAYERS,
        select: str = SELECT,
        threshold: float = THRESHOLD,
        top_k: int = TOP_K,
        sparse: bool = True,
        path: str = "fast",
        alibi: bool = False,
    ):
        super().__init__()
        if min(dim, heads, head_dim, max_len, learned_kernels, hidden, hidden_layers, top_k) < 1:
            raise ValueError(
                "dim, heads, head_dim, max_len, learned_kernels, hidden, hidden_layers, top_k must be positive"
            )
        if kernels not in ("standard", "learned") or select not in SELECTS or path not in PATHS:
            raise ValueError(
                f"kernels must be standard|learned, select one of {SELECTS}, path one of {PATHS}; got "
                f"{kernels!r}, {select!r}, {path!r}"
            )
        if window % 2 == 0 or not 0.0 <= dropout < 1.0:
            raise ValueError(f"need an odd window and 0 <= dropout < 1, got {window}, {dropout}")
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.select, self.threshold, self.top_k, self.sparse, self.path = select, threshold, top_k, sparse, path
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)
        bank = standard_kernels(max_len) if kernels == "standard" else init_learned_kernels(max_len, learned_kernels)
        self.predictor = KernelPredictor(dim, heads, bank, window, hidden, hidden_layers)
        # Ours: the teacher's scores carry a symmetric ALiBi bias −m_h·|i − s| beside learned positions (without it our
        # byte-level teacher stayed at the no-context solution, 4.17 bits per masked byte after 1000 steps); every
        # path adds it (per entry, per edge), so an all-ones mask still reproduces the teacher exactly.
        self.register_buffer("slopes", alibi_slopes(heads) if alibi else None, persistent=False)

    def extra_repr(self) -> str:
        rule = f"threshold={self.threshold}" if self.select == "threshold" else f"top_k={self.top_k}"
        return (
            f"heads={self.heads}, head_dim={self.head_dim}, sparse={self.sparse}, path={self.path}, "
            f"select={self.select}, {rule}, alibi={self.slopes is not None}"
        )

    def bias(self, n: int, dtype: torch.dtype) -> Optional[Tensor]:
        """(H, N, N) the ALiBi bias −m_h·|i − s| in `dtype`, or None without ALiBi."""
        if self.slopes is None:
            return None
        position = torch.arange(n, device=self.slopes.device)
        return alibi_bias(self.slopes.to(dtype), position[:, None], position[None, :])

    def project(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """x (B, N, C) → q, k, v (B, H, N, D) in float32 or wider (softmax in float32, INTERFACE.md)."""
        b, n, _ = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3×(B, H, N, D)
        dtype = torch.promote_types(qkv.dtype, torch.float32)
        return qkv[0].to(dtype), qkv[1].to(dtype), qkv[2].to(dtype)

    @torch.no_grad()
    def attention_probs(self, x: Tensor, valid: Tensor, causal: bool) -> Tensor:
        """(B, H, N, M) the dense attention probabilities (§4.1's hook on the teacher)."""
        q, k, _ = self.project(x)
        scores = (q / math.sqrt(self.head_dim)) @ k.transpose(-1, -2)  # (B, H, N, M)
        bias = self.bias(x.shape[1], scores.dtype)
        scores = scores if bias is None else scores + bias
        allowed = admissible(valid, causal)
        return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).softmax(-1) * allowed

    @torch.no_grad()
    def selected(self, x: Tensor, valid: Tensor, causal: bool) -> Tensor:
        """(B, N, H, K) bool: the kernels each query takes (§5.2), by threshold τ or top-K coefficients.
        Not differentiable, so the predictor runs without autograd."""
        alpha = self.predictor(x.to(self.predictor.embed_window.weight.dtype), valid, causal)  # (B, N, H, K)
        if self.select == "threshold":
            return alpha > self.threshold
        top = alpha.topk(min(self.top_k, alpha.shape[-1]), -1).indices
        return torch.zeros_like(alpha, dtype=torch.bool).scatter_(-1, top, True)

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
    ):
        b, n, _ = x.shape
        if key_padding_mask is not None and (key_padding_mask.shape != (b, n) or key_padding_mask.dtype != torch.bool):
            raise ValueError(
                f"key_padding_mask must be a bool tensor of shape {(b, n)}, got "
                f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
        if self.sparse and n > self.predictor.bank.max_len:
            raise ValueError(f"sequence length {n} exceeds the kernels' max_len {self.predictor.bank.max_len}")
        valid = torch.ones(b, n, dtype=torch.bool, device=x.device) if key_padding_mask is None else ~key_padding_mask
        p_drop = self.dropout if self.training else 0.0
        q, k, v = self.project(x)
        with torch.autocast(x.device.type, enabled=False):
            if not self.sparse:
                y, counts = self.dense(q, k, v, valid, causal, p_drop, generator)
            else:
                sel = self.selected(x, valid, causal)
                if self.path == "reference":
                    mask = self.predictor.bank.mask(sel, valid, causal)  # (B, H, N, M)
                    y = masked_attention(q, k, v, mask, p_drop, generator, self.bias(n, q.dtype))
                    counts = mask.sum((2, 3))
                else:
                    row, col = self.predictor.bank.edges(sel, valid, causal)
                    bias = None  # per edge: −m_h·|i − s|, with s − i = col − row (one (batch, head) block)
                    if self.slopes is not None:
                        slope = -self.slopes.to(q.dtype).repeat_interleave(n).repeat(b)  # (B·H·N,) per query
                        bias = slope.index_select(0, row).mul_((col - row).abs_())  # (E,)
                    flat = [t.reshape(-1, self.head_dim) for t in (q, k, v)]  # (B·H·N, D) each
                    y = sparse_attention(*flat, row, col, p_drop, generator, bias).view(b, self.heads, n, self.head_dim)
                    blocks = torch.arange(b * self.heads + 1, device=row.device) * n  # first query of each block
                    counts = torch.searchsorted(row, blocks).diff().view(b, self.heads)  # edges grouped by query
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim).to(x.dtype)  # (B, N, H·D)
        pairs = (valid.sum(1, dtype=torch.float64) ** 2).sum().clamp_min(1)  # valid queries × valid keys, batch-summed
        return self.out(y), {"density": (counts.sum(0, dtype=torch.float64) / pairs).float()}  # (H,) INTERFACE.md

    def dense(self, q, k, v, valid, causal, p_drop, generator):
        """Exact softmax attention over the admissible keys: SDPA, or the reference path when a dropout mask must
        come from `generator`. Returns (B, H, N, D) and the pairs computed (B, H), counted in O(B·N) so that
        bookkeeping adds no N × M work to the FLOP count."""
        # Ours: the paper sparsifies a pretrained RoBERTa; we download no model, so the teacher is this dense path in
        # bench's backbone, trained as a byte-level masked LM (bench's `wikitext2`; perplexity per masked byte) or,
        # on `bytes`, a causal LM: the kernels are cut at the query (KernelBank.mask), so the pipeline is the same.
        keys = valid.cumsum(1) if causal else valid.sum(1, keepdim=True)  # (B, N|1) admissible keys per query
        counts = (keys * valid).sum(1, keepdim=True).expand(-1, self.heads)
        bias = self.bias(q.shape[2], q.dtype)  # (H, N, M) or None
        if p_drop == 0 and not causal and bool(valid.all()):  # every pair admissible: SDPA, no boolean mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias), counts
        allowed = admissible(valid, causal)  # (B, 1, N, M)
        if p_drop > 0:
            return masked_attention(q, k, v, allowed, p_drop, generator, bias), counts
        empty = ~allowed.any(-1, keepdim=True)  # (B, 1, N, 1): a dummy key keeps SDPA finite, zeroed below
        mask = allowed | empty
        if bias is not None:  # a float mask: the bias on admissible keys, −∞ elsewhere
            mask = bias.masked_fill(~mask, float("-inf"))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return y.masked_fill(empty, 0.0), counts


# ------------------------------------------------------------------------------------------ the method's settings
FAMILIES = ("standard", "handcrafted", "learned")
LOSSES = ("max", "per-kernel")


@dataclass
class KernelConfig:
    """The method's settings (the paper's values where it gives them), each an option of `python kernel_sparse.py`."""

    family: str = field(default="standard", metadata={"choices": FAMILIES, "help": "kernel family (§4.2.1-§4.2.3)"})
    loss: str = field(default="max", metadata={"choices": LOSSES, "help": "Eq. 1 (max), or §6.2's per-kernel (binary)"})
    target: str = field(default="threshold", metadata={"choices": SELECTS, "help": "targets: p ≥ τ (§4.2), or top-k"})
    target_threshold: float = field(default=0.05, metadata={"help": "a_is = 1[p ≥ this] (§4.2)"})
    target_topk: int = field(default=20, metadata={"help": "k of the top-k targets"})
    handcrafted_k: int = field(default=20, metadata={"help": "ones per handcrafted kernel (§4.2.2)"})
    learned_kernels: int = field(default=LEARNED_KERNELS, metadata={"help": "learned kernels per layer (§4.2.3)"})
    window: int = field(default=WINDOW, metadata={"help": "tokens in the predictor's window, odd (§6.1)"})
    hidden: int = field(default=HIDDEN, metadata={"help": "predictor hidden width (§4.2: 32 or 64)"})
    hidden_layers: int = field(default=HIDDEN_LAYERS, metadata={"help": "predictor hidden layers (§4.2: 2 or 3)"})
    select: str = field(default=SELECT, metadata={"choices": SELECTS, "help": "kernels at inference: α > τ, or top-K"})
    threshold: float = field(default=THRESHOLD, metadata={"help": "τ: take kernels with α > τ (§5.2)"})
    top_k: int = field(default=TOP_K, metadata={"help": "K: take the K largest α (§5.2)"})
    analysis_sequences: int = field(default=128, metadata={"help": "training sequences for §4.1 and the predictors"})
    predictor_steps: int = field(default=300, metadata={"help": "Adam steps per predictor"})
    predictor_lr: float = field(default=3e-3, metadata={"help": "predictor learning rate"})
    # Ours (§4.2.3 says only "randomly initialized"): learned kernels' logits N(learned_init, 1) begin near-empty,
    # like the targets (a few ones in a row of hundreds). From N(0, 1) every kernel began as a random half of the
    # offsets, Eq. 1 answered by switching every coefficient off (α ≈ 0.01), and with α ≈ 0 no gradient reached the
    # kernels: they ended as they began and none was ever selected (loss = the targets' density, 0.013).
    learned_init: float = field(default=-4.0, metadata={"help": "mean of the learned kernels' initial logits (ours)"})
    kernel_lr: float = field(default=0.03, metadata={"help": "learned kernels' learning rate (ours)"})
    predictor_batch: int = field(default=8, metadata={"help": "sequences per predictor step"})
    predictor_rows: int = field(default=32, metadata={"help": "query rows per sequence in a predictor step"})
    finetune_steps: int = field(default=300, metadata={"help": "end-to-end steps (§6.2); 0: off"})
    finetune_lr: float = field(default=5e-4, metadata={"help": "fine-tuning peak learning rate"})
    alibi: bool = field(default=True, metadata={"help": "symmetric ALiBi bias in the teacher (ours, not the paper's)"})

    def __post_init__(self):
        if self.family not in FAMILIES or self.loss not in LOSSES or (self.family == "learned" and self.loss != "max"):
            raise ValueError(
                f"family must be in {FAMILIES} and loss in {LOSSES} (learned kernels: max only), got "
                f"{self.family}/{self.loss}"
            )
        if self.target not in SELECTS or self.select not in SELECTS:
            raise ValueError(f"target and select must be 'threshold' or 'topk', got {self.target}, {self.select}")
        if self.window < 1 or self.window % 2 == 0:
            raise ValueError(f"the predictor window must be an odd number of tokens, got {self.window}")
        counts = "target_topk handcrafted_k learned_kernels hidden hidden_layers top_k analysis_sequences"
        for name in (counts + " predictor_batch predictor_rows").split():
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        reals = "threshold target_threshold predictor_lr learned_init kernel_lr finetune_lr".split()
        if not all(math.isfinite(getattr(self, r)) for r in reals):
            raise ValueError(f"{', '.join(reals)} must be finite")
        if min(self.predictor_steps, self.finetune_steps) < 0:
            raise ValueError("steps must be >= 0")

    @property
    def variant(self) -> str:
        """FAMILY/LOSS: the kernels and the loss that `fit_predictors` fits."""
        return f"{self.family}/{self.loss}"

    def teacher_attention(self, m) -> "KernelSparseAttention":
        """The dense teacher's attention for the backbone's model settings `m` (dim, heads, head_dim, max_len)."""
        return KernelSparseAttention(
            m.dim,
            m.heads,
            m.head_dim,
            m.attn_dropout,
            max_len=m.max_len,
            window=self.window,
            hidden=self.hidden,
            hidden_layers=self.hidden_layers,
            sparse=False,
            alibi=self.alibi,
        )


# ------------------------------------------------------------------------------------------------ §4.1 analysis
@dataclass
class LayerData:
    """What the teacher shows one layer's predictor (§4.2): attention inputs and binary targets."""

    x: Tensor  # (S, N, C) the attention's input (after the block's LayerNorm)
    valid: Tensor  # (S, N) bool
    target: Tensor  # (S, H, N, M) bool


@torch.no_grad()
def layer_inputs(model: nn.Module, inputs: List[dict]) -> List[List[tuple]]:
    """Per layer, the (x, valid, causal) each attention received while the model ran on each of `inputs` (the
    model's keyword arguments of a batch)."""
    seen = [[] for _ in model.blocks]

    def hook(index):
        def record(module, args, kwargs):
            x, padding = args[0], kwargs.get("key_padding_mask")
            valid = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if padding is None else ~padding
            seen[index].append((x.detach().float(), valid, kwargs.get("causal", False)))

        return record

    handles = [block.attn.register_forward_pre_hook(hook(i), with_kwargs=True) for i, block in enumerate(model.blocks)]
    try:
        for batch in inputs:
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def binary_targets(probs: Tensor, pairs: Tensor, cfg: KernelConfig) -> Tensor:
    """(B, H, N, M) bool targets a_is (§4.2): probabilities ≥ 0.05, or each row's top-k (§1), on valid pairs."""
    if cfg.target == "threshold":
        return (probs >= cfg.target_threshold) & pairs
    top = probs.topk(min(cfg.target_topk, probs.shape[-1]), -1).indices
    return torch.zeros_like(pairs.expand_as(probs)).scatter_(-1, top, True) & pairs & (probs > 0)


def diagonal_sums(maps: Tensor) -> Tensor:
    """(…, N, M) → (…, 2N−1): the sum along each diagonal, offset d = s − i from −(N−1) to N−1."""
    n = maps.shape[-1]
    offset = (torch.arange(n)[None, :] - torch.arange(n)[:, None] + n - 1).flatten().to(maps.device)
    out = maps.new_zeros(maps.shape[:-2] + (2 * n - 1,))
    return out.index_add_(-1, offset, maps.flatten(-2))


@torch.no_grad()
def analyse_layer(attn: KernelSparseAttention, captured: List[tuple], cfg: KernelConfig) -> Tuple[LayerData, dict]:
    """Targets of one layer and its Fig. 1 maps: accumulated probabilities and targets, raw (a mean over sequences)
    and per sequence covering the pair (length normalisation), and their diagonal sums raw and per pair at the
    offset (distance normalisation)."""
    xs, valids, targets = [], [], []
    probs_sum = targets_sum = covered = 0
    for x, valid, causal in captured:
        probs = attn.attention_probs(x, valid, causal)  # (B, H, N, M)
        pairs = valid_pairs(valid, causal)  # (B, 1, N, M)
        target = binary_targets(probs, pairs, cfg)
        xs.append(x)
        valids.append(valid)
        targets.append(target)
        probs_sum = probs_sum + probs.sum(0)
        targets_sum = targets_sum + target.sum(0)
        covered = covered + pairs.sum(0)
    count = sum(len(x) for x in xs)
    coverage = covered.clamp_min(1)  # (1, N, M) sequences in which the pair exists
    per_offset = diagonal_sums((covered > 0).float()).clamp_min(1)  # (1, 2N−1) pairs at each offset
    maps = {"probs_raw": probs_sum / count, "probs": probs_sum / coverage, "targets": targets_sum / coverage}
    for name in ("probs", "targets"):
        maps[name + "_diagonal_raw"] = diagonal_sums(maps[name])
        maps[name + "_diagonal"] = maps[name + "_diagonal_raw"] / per_offset
    return LayerData(torch.cat(xs), torch.cat(valids), torch.cat(targets)), maps


def analysis(model: nn.Module, inputs: List[dict], cfg: KernelConfig) -> Tuple[List[LayerData], List[dict]]:
    """§4.1 on the teacher's training batches (`inputs`: the model's keyword arguments of each): per layer the
    data its predictor learns from and the accumulated maps (Fig. 1)."""
    captured = layer_inputs(model, inputs)
    data, maps = zip(*(analyse_layer(block.attn, layer, cfg) for block, layer in zip(model.blocks, captured)))
    return list(data), list(maps)


# ------------------------------------------------------------------------------------ §4.2.2 handcrafted kernels
def most_correlated(samples: Tensor, defined: Tensor, k: int) -> Tensor:
    """Correlation-based selection: the feature of highest mean, then the k − 1 features whose values correlate
    most with it (Pearson over the samples where both are defined). samples, defined (S, F)."""
    w = defined.float()
    mean = (samples * w).sum(0) / w.sum(0).clamp_min(1)
    ref = int(mean.argmax())
    w = w * w[:, ref : ref + 1]  # (S, F) samples where the feature and the reference both exist
    count = w.sum(0).clamp_min(1)
    dx = samples - (samples * w).sum(0) / count
    dy = samples[:, ref : ref + 1] - (samples[:, ref : ref + 1] * w).sum(0) / count
    corr = (w * dx * dy).sum(0) / ((w * dx**2).sum(0) * (w * dy**2).sum(0)).sqrt()
    corr = corr.nan_to_num(-2.0)  # a constant feature correlates with nothing
    corr[ref] = 2.0  # the reference is always in (the paper: its correlation with itself is one)
    top = corr.topk(min(k, len(corr)))
    return top.indices[top.values > -2.0]


def top_positive(scores: Tensor, k: int) -> Tensor:
    """Top-k pruning: the k highest-scoring indices, among those that ever occur."""
    top = scores.topk(min(k, len(scores)))
    return top.indices[top.values > 0]


@torch.no_grad()
def handcrafted_kernels(
    data: LayerData,
    causal: bool,
    max_len: int,
    k: int = 20,
    samples: int = 4096,
    generator: Optional[torch.Generator] = None,
) -> KernelBank:
    """Per head (G = H) six kernels: local offsets by top-k and by correlation (of the distance-normalised diagonal
    frequency), global columns (keys) and global rows (queries) by top-k and by correlation. Correlations use
    `samples` random query rows (or key columns)."""
    # Ours: built from the accumulated binary targets, not the probabilities: every softmax row sums to 1, so top-k
    # pruning of rows by summed probability cannot rank them; the targets' row sums can. Correlations are Pearson
    # over single attention rows (samples), the "attention sparsity pattern" of §4.2.2.
    target = data.target.float()  # (S, H, N, M)
    heads, n = target.shape[1], target.shape[-1]
    pairs = valid_pairs(data.valid, causal).float()  # (S, 1, N, M)
    freq = target.sum(0) / pairs.sum(0).clamp_min(1)  # (H, N, M) length-normalised frequency (Fig. 1a)
    local_freq = diagonal_sums(freq) / diagonal_sums((pairs.sum(0) > 0).float()).clamp_min(1)  # (H, 2N−1)
    seq = torch.randint(len(target), (samples,), generator=generator).to(target.device)
    pos = torch.randint(n, (samples,), generator=generator).to(target.device)
    offset = pos[:, None] + torch.arange(-(n - 1), n, device=target.device)  # (S', 2N−1) key of row pos at d
    inside = (offset >= 0) & (offset < n)
    in_rows = target[seq, :, pos]  # (S', H, M) single query rows
    row_pairs = pairs[seq, 0, pos]  # (S', M)
    local_rows = in_rows.gather(2, offset.clamp(0, n - 1)[:, None].expand(-1, heads, -1))  # (S', H, 2N−1)
    local_defined = inside & row_pairs.gather(1, offset.clamp(0, n - 1)).bool()
    in_cols = target[seq, :, :, pos]  # (S', H, N) single key columns
    col_pairs = pairs[seq, 0, :, pos].bool()  # (S', N)
    local = torch.zeros(heads, 6, 2 * max_len - 1)
    row, col = torch.zeros(heads, 6, max_len), torch.zeros(heads, 6, max_len)
    for h in range(heads):
        chosen = [top_positive(local_freq[h], k), most_correlated(local_rows[:, h], local_defined, k)]
        for kernel, d in enumerate(chosen):
            local[h, kernel, d.cpu() - (n - 1) + max_len - 1] = 1.0  # offsets d − (N − 1) in a 2L−1 vector
        global_columns = [top_positive(freq[h].sum(0), k), most_correlated(in_rows[:, h], row_pairs.bool(), k)]
        global_rows = [top_positive(freq[h].sum(1), k), most_correlated(in_cols[:, h], col_pairs, k)]
        for kernel, keys in enumerate(global_columns, start=2):  # global columns: every query sees these keys
            row[h, kernel] = 1.0
            col[h, kernel, keys.cpu()] = 1.0
        for kernel, queries in enumerate(global_rows, start=4):  # global rows: these queries see every key
            row[h, kernel, queries.cpu()] = 1.0
            col[h, kernel] = 1.0
    return KernelBank(local, row, col).to(data.x.device)


# ---------------------------------------------------------------------------------- §4.3.1 fitting the predictors
def eq1_loss(alpha: Tensor, patterns: Tensor, target: Tensor, weight: Tensor) -> Tensor:
    """Eq. 1, Σ_s (max_κ α_κ K_κs − a_s)², over the weighted entries. alpha (B, H, R, K), patterns (G, K, R, M),
    target (B, H, R, M) bool, weight (B, 1, R, M)."""
    soft_or = (alpha[..., None] * patterns.transpose(1, 2)[None]).amax(-2)  # (B, H, R, M): max over kernels
    # Ours: a mean per (query, key) entry, where Table 1 reports sums.
    return ((soft_or - target.float()) ** 2 * weight).sum() / weight.expand_as(soft_or).sum().clamp_min(1)


def per_kernel_loss(alpha: Tensor, patterns: Tensor, target: Tensor, weight: Tensor) -> Tensor:
    """§6.2's per-kernel loss, which the paper leaves open. Ours: Σ_κ Σ_s K_κs (α_κ − a_s)² / Σ_s K_κs, a mean over
    (row, head, kernel) with a non-empty kernel: α_κ regresses on the precision of kernel κ in the row, so every
    coefficient gets a gradient. Binary kernels only."""
    support = patterns.transpose(1, 2)[None] * weight[:, :, :, None, :]  # (B, H|1, R, K, M)
    error = (alpha[..., None] - target[:, :, :, None, :].float()) ** 2  # (B, H, R, K, M)
    size = support.sum(-1)  # (B, H|1, R, K)
    per = (support * error).sum(-1) / size.clamp_min(1e-9)  # (B, H, R, K)
    used = (size > 0).expand_as(per)
    return per[used].sum() / used.sum().clamp_min(1)


def kernel_loss(
    predictor: KernelPredictor,
    x: Tensor,
    valid: Tensor,
    target: Tensor,
    causal: bool,
    loss: str,
    rows: Optional[Tensor] = None,
) -> Tensor:
    """The chosen loss of `predictor` on sequences (x (B, N, C), valid, target (B, H, N, M)), on rows `rows`."""
    n = x.shape[1]
    rows = torch.arange(n, device=x.device) if rows is None else rows
    alpha = predictor(x, valid, causal)[:, rows].transpose(1, 2)  # (B, H, R, K)
    weight = valid_pairs(valid, causal)[:, :, rows].float()  # (B, 1, R, M)
    loss_function = eq1_loss if loss == "max" else per_kernel_loss
    return loss_function(alpha, predictor.bank.patterns(n, rows), target[:, :, rows], weight)


def fit_predictor(
    predictor: KernelPredictor, data: LayerData, causal: bool, loss: str, cfg: KernelConfig, generator: torch.Generator
) -> float:
    """Adam on the loss over random sequences and query rows (a stochastic estimate of the sum over rows);
    returns the loss on all the training rows at the end."""
    if loss == "per-kernel" and predictor.bank.learned:
        raise ValueError("the per-kernel loss is defined for binary kernels only")
    # Ours: learned kernels take their own learning rate. Adam moves a parameter about lr a step, so at the
    # predictor's 3e-3 a logit travels < 1 in 300 steps, too little to turn an offset on from --learned-init.
    kernels = [p for name, p in predictor.named_parameters() if name.startswith("bank.")]
    others = [p for name, p in predictor.named_parameters() if not name.startswith("bank.")]
    optimizer = torch.optim.Adam([{"params": others}, {"params": kernels, "lr": cfg.kernel_lr}], lr=cfg.predictor_lr)
    count, n = data.x.shape[0], data.x.shape[1]
    for _ in range(cfg.predictor_steps):
        seq = torch.randint(count, (min(cfg.predictor_batch, count),), generator=generator).to(data.x.device)
        rows = torch.randperm(n, generator=generator)[: cfg.predictor_rows].to(data.x.device)
        value = kernel_loss(predictor, data.x[seq], data.valid[seq], data.target[seq], causal, loss, rows)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
    with torch.no_grad():  # equal-sized chunks: the mean of chunk means is the mean over all rows
        chunks = [
            kernel_loss(predictor, data.x[s : s + 4], data.valid[s : s + 4], data.target[s : s + 4], causal, loss)
            for s in range(0, count, 4)
        ]
    return float(torch.stack(chunks).mean())


def fit_predictors(
    model: nn.Module, data: List[LayerData], variant: str, cfg: KernelConfig, generator: torch.Generator
) -> Tuple[List[KernelPredictor], dict]:
    """§4.2-§4.3.1 for one FAMILY/LOSS variant: a kernel bank per layer (standard, learned, or handcrafted from
    the layer's targets), a predictor per layer fitted to them; returns the predictors and the fit's record."""
    family, loss = variant.split("/")
    causal, device = model.cfg.head == "lm", data[0].x.device
    max_len = model.blocks[0].attn.predictor.bank.max_len
    layers = []
    for d in data:
        if family == "standard":
            bank = standard_kernels(max_len)
        elif family == "learned":
            bank = init_learned_kernels(max_len, cfg.learned_kernels, generator, cfg.learned_init)
        else:
            bank = handcrafted_kernels(d, causal, max_len, cfg.handcrafted_k, generator=generator)
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=generator)))
        layers.append(
            KernelPredictor(model.cfg.dim, model.cfg.heads, bank, cfg.window, cfg.hidden, cfg.hidden_layers).to(device)
        )
    losses = [fit_predictor(p, d, causal, loss, cfg, generator) for p, d in zip(layers, data)]
    return layers, {
        "train_loss": sum(losses) / len(losses),
        "train_loss_per_layer": losses,
        "kernels_per_layer": layers[0].bank.num_kernels,
    }


# ------------------------------------------------------------------------------------- §5 sparsified inference
def install(
    model: nn.Module,
    predictors: Optional[List[KernelPredictor]] = None,
    sparse: bool = True,
    layers: Optional[int] = None,
    select: Optional[str] = None,
    threshold: Optional[float] = None,
    top_k: Optional[int] = None,
) -> None:
    """Puts `predictors` (one per layer) into the model's attentions, makes the last `layers` layers sparse or
    dense (all by default; the layers before them run dense: Fig. 6) and sets the selection rule."""
    depth = len(model.blocks)
    first = depth - (depth if layers is None else layers)
    for index, block in enumerate(model.blocks):
        attn = block.attn
        if predictors is not None:
            attn.predictor = predictors[index]
        attn.sparse = sparse and index >= first
        attn.select = select or attn.select
        attn.threshold = attn.threshold if threshold is None else threshold
        attn.top_k = top_k or attn.top_k


@contextlib.contextmanager
def switched(model: nn.Module, **settings):
    """Sets `settings` (sparse, path) on every layer's attention; each layer's own values come back on exit."""
    saved = [{name: getattr(block.attn, name) for name in settings} for block in model.blocks]
    for block in model.blocks:
        for name, value in settings.items():
            setattr(block.attn, name, value)
    try:
        yield model
    finally:
        for block, values in zip(model.blocks, saved):
            for name, value in values.items():
                setattr(block.attn, name, value)


# ------------------------------------------------------------------------------------------- §6.2 fine-tuning
def backbone_parameters(model: nn.Module) -> List[nn.Parameter]:
    """What fine-tuning trains: everything but the predictors."""
    # Ours (§6.2 leaves it open): the predictors stay frozen, their selection is not differentiable.
    return [p for name, p in model.named_parameters() if ".predictor." not in name]


# -------------------------------------------------------------------------------------------------- main
def analysis_batches(task, count: int, batch_size: int, seed: int) -> List[dict]:
    """§4.1's training sequences: `count`, in whole batches of `task`'s training split, from seeds of their own."""
    first = seed * 7919 + 8
    return [
        task.train_batch(batch_size, torch.Generator().manual_seed(s))
        for s in range(first, first - (-count // batch_size))
    ]


def main(argv=None, prog: str = "python kernel_sparse.py") -> int:
    """The method on the shared loop (bench/, which the attention above does not need): (1) a dense teacher,
    masked-LM (causal on bytes), (2) §4.1's analysis, (3) one family's predictors fitted and installed, (4)
    sparsified validation, (5) end-to-end fine-tuning (§6.2). The record is the fine-tuned sparse model's."""
    import importlib.util

    if importlib.util.find_spec("bench") is None:  # this file alone, away from its repository
        sys.exit(
            f"{prog}: training needs the repository's bench/ beside this file "
            "(KernelSparseAttention needs only torch and alibi.py)"
        )
    from bench import cli, fine_tune, loop
    from bench.tasks import get_task

    about = "Kernel-based learned sparse attention (Karkhanis et al.): dense teacher, §4.1 analysis, kernel predictors"
    cfg, kernel = cli.parse(
        argv, "kernel", prog, about + ", sparsified inference, fine-tuning.", KernelConfig, tasks=("wikitext2", "bytes")
    )
    with cli.one_line_errors():
        run = loop.setup(cfg, get_task(cfg.task), lambda m: lambda _: kernel.teacher_attention(m))
        loop.train(run)  # (1) the teacher: dense attention
        model, limit = run.model.eval(), cfg.final_eval_batches
        teacher = {f"{split}_ppl": math.exp(run.evaluate(split, limit)["loss"]) for split in ("valid", "test")}
        batches = analysis_batches(run.task, kernel.analysis_sequences, cfg.batch_size, cfg.seed)
        data, _ = analysis(model, [loop.model_inputs(b, run.device) for b in batches], kernel)  # (2)
        predictors, fit = fit_predictors(model, data, kernel.variant, kernel, torch.Generator().manual_seed(cfg.seed))
        install(model, predictors, select=kernel.select, threshold=kernel.threshold, top_k=kernel.top_k)  # (3)
        before = math.exp(run.evaluate("valid", limit)["loss"])  # (4) the sparse model, before fine-tuning
        recipe = (kernel.finetune_steps, kernel.finetune_lr, cfg.weight_decay, cfg.batch_size, cfg.grad_clip, cfg.seed)
        with switched(model, path="reference"):  # (5) ours: the masked path, equal to the edge list's (tests)
            losses = fine_tune.fine_tune(model, run.task, backbone_parameters(model), *recipe)
        record = loop.final_record(run)  # the fine-tuned sparse model's
        if record is not None:
            tuned = {"steps": kernel.finetune_steps, "train_loss_last": sum(losses[-50:]) / max(1, len(losses[-50:]))}
            record["kernel"] = {"teacher": teacher, "fit": fit, "sparse_valid_ppl": before, "finetune": tuned}
        loop.finish(run, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
