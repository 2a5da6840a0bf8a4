"""The tile path of SBM-Transformer (sbm_transformer.py, `path="tile"`): Eq. 5-9 in Triton kernels, no N × M tensor.

Cho et al., NeurIPS 2022, arXiv 2210.15541. The memberships x = Q̂ (B, H, N, K) and w = K̂Ŝᵀ (B, H, M, K) come from
SBMAttention.factors (Eq. 5-7); a program takes a tile of queries and walks over tiles of keys:

    P = x wᵀ on the tile, one tl.dot                                             (Eq. 7)
    M_ij = [u_ij < P_ij + δ], u_ij a Philox uniform of (seed, graph, i, j)          (Eq. 8)
    Y = σ_M(QKᵀ/√D) V, an online softmax over the sampled pairs only               (Eq. 3-4)
    backward: M regenerated from the seed; ∂L/∂P_ij := G_ij on edges, ∂x = G w, ∂w = Gᵀx  (Eq. 9)

with padding, causality and forced self-loops exactly as the reference path's sample_dense. Each pair is drawn
from its own counter, so M_ij ~ Bernoulli(min(1, P_ij + δ)) independently: the reference path's law (tests: Monte
Carlo over seeds), and a pair's draw does not depend on the other tokens. G is the straight-through estimator of
the reference path's StraightThrough, ∂L/∂S ⊙ S (ste="paper") or hardtanh(∂L/∂S) (ste="official"), plus the edge
count's gradient (the density regulariser); forced self-loops receive none. Attention dropout draws a second
Philox word of the same pair, so the backward regenerates it too. The edges are counted in the kernel.
Deviation: u has 24 random bits (multiples of 2⁻²⁴), so a probability acts rounded to that grid (≤ 6·10⁻⁸).

Besides y the forward keeps one float per query (the softmax's log-normaliser) and an edge count per tile; the
backward recomputes the tiles twice (queries: dQ, dx; keys: dK, dV, dw), without atomics, so every run gives the
same bits. Products run in strict IEEE float32 (float64 for float64 inputs, on the CPU only; δ, 1/√D and the dropout
rate enter as float32 scalars): no TF32, so the kernel matches the reference path. Nothing reads a size on the host:
no synchronisation in forward or backward. M = N: a sequence attends to itself (causality, self-loops).

`sample_mask` is the kernel's mask in plain torch (the same hash, the same draws): with the reference path given
that mask (SBMAttention.forward(..., mask=)), the reference path is the kernel's oracle.

    TRITON_INTERPRET=1 python -m pytest -q tests/test_sbm_tile.py     # the kernels on the CPU (numpy interpreter)
    python sbm_transformer.py --task listops --path tile                # on CUDA

Shape legend: B batch, H heads, N queries, M keys, D head dim, K clusters; R = B·H graphs (graph r = b·H + h).
"""

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError as error:  # the one part of SBM-Transformer that needs triton
    raise ImportError("path='tile' needs triton: pip install triton (the CUDA torch wheel ships it)") from error

# The kernels are built for the CPU interpreter when TRITON_INTERPRET=1 is set at import (triton reads it then).
INTERPRETED = bool(triton.knobs.runtime.interpret)
# Queries (keys) a tile, fixed, no autotuning, and one pipeline stage: shared memory then stays within the 227 KiB a
# block may hold on an H100/H200 up to head dim and clusters 256 (204 KiB; triton 3.6, compiled for sm_90). Tiles of
# 64 with triton's default 3 stages asked 257 KiB at head dim 64 and 128 clusters, and failed there.
BLOCK, STAGES = tl.constexpr(32), 1
DTYPES = (torch.float32, torch.float64)

# ---- the law: one Philox draw per pair, and its torch twin ------------------------------------------------------
# Philox4x32-10 (Salmon et al., SC 2011), as triton's tl.philox: key = the seed's low and high words, counters
# (key j, query i, graph r, 0). Word 0 decides the edge (Eq. 8), word 1 the dropout of the same pair.
ROUND_A, ROUND_B, KEY_A, KEY_B = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
WORD = 0xFFFFFFFF
UNIFORM = tl.constexpr(2.0**-24)  # u = (word >> 8) · 2⁻²⁴ ∈ [0, 1): exact in float32


def _mulhilo(a: Tensor, b: int) -> tuple:
    """(high, low) 32-bit words of a·b for words a (int64 tensor) and b, in 16-bit halves: no int64 overflow."""
    low = (a & 0xFFFF) * b
    mid = (a >> 16) * b + (low >> 16)
    return mid >> 16, ((mid & 0xFFFF) << 16) | (low & 0xFFFF)


def philox(seed: Tensor, c0: Tensor, c1: Tensor, c2: Tensor, c3: Tensor, rounds: int = 10) -> tuple:
    """tl.philox(seed, c0, c1, c2, c3) on int64 tensors holding 32-bit words."""
    k0, k1 = seed & WORD, (seed >> 32) & WORD
    for _ in range(rounds):
        high_b, low_b = _mulhilo(c2, ROUND_B)
        high_a, low_a = _mulhilo(c0, ROUND_A)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
        k0, k1 = (k0 + KEY_A) & WORD, (k1 + KEY_B) & WORD
    return c0, c1, c2, c3


def uniforms(seed: Tensor, B: int, H: int, N: int, M: int) -> tuple:
    """The kernel's draws for S seeds (S,) int64: (u, u_drop) (S, B, H, N, M) float32, each pair's edge and
    dropout uniforms."""
    device = seed.device
    r = torch.arange(B * H, device=device).view(B, H, 1, 1)
    i, j = torch.arange(N, device=device).view(N, 1), torch.arange(M, device=device)
    c0, c1, c2 = torch.broadcast_tensors(j, i, r)  # (B, H, N, M) each
    words = philox(seed.view(-1, 1, 1, 1, 1), c0, c1, c2, torch.zeros_like(c0))
    return tuple((word >> 8).to(torch.float32) * UNIFORM.value for word in words[:2])


def sample_mask(seed: Tensor, x: Tensor, w: Tensor, valid: Tensor, causal: bool, delta: float, self_loops: bool):
    """The kernel's M (B, H, N, M) bool in plain torch for its seed (1,): u < P + δ with P = x wᵀ (Eq. 8), then
    padding (valid (B, N) bool), causality and forced self-loops as the reference path's sample_dense. The kernel
    forms P by its own sums: a pair within float rounding of its threshold (~10⁻⁷ in float32) may fall otherwise."""
    B, H, N, _ = x.shape
    M = w.shape[2]
    mask = uniforms(seed, B, H, N, M)[0][0] < x @ w.transpose(-1, -2) + delta  # (B, H, N, M)
    mask &= valid[:, None, :, None] & valid[:, None, None, :]
    if causal:
        mask &= torch.ones(N, M, dtype=torch.bool, device=mask.device).tril()
    if self_loops:
        mask |= torch.eye(N, M, dtype=torch.bool, device=mask.device) & valid[:, None, :, None]
    return mask


def draw_seed(generator, device) -> Tensor:
    """The graph's one draw from the generator (or the global RNG): a (1,) int64 seed, read by the kernel."""
    return torch.randint(2**62, (1,), generator=generator, device=device)


# ---- the kernels ---------------------------------------------------------------------------------------------------
# A kernel's arguments: inputs = pointers (q, k, v, x, w, valid, seed), q, k, v, x, w as (R·N, ·) rows, valid (R, N);
# scalars = (N, D, K, 1/√D, δ, dropout); widths BD, BK = D, K padded to powers of two ≥ 16 (tl.dot's minimum).
@triton.jit
def _rows(ptr, r, rows, n, width, WIDE: tl.constexpr):
    """Rows `rows` of graph r of an (R·n, width) matrix at ptr: (BLOCK, WIDE), zeros beyond n and width."""
    col = tl.arange(0, WIDE)
    at = (r.to(tl.int64) * n + rows)[:, None] * width + col[None, :]
    return tl.load(ptr + at, mask=(rows < n)[:, None] & (col < width)[None, :], other=0.0)


@triton.jit
def _store_rows(ptr, r, rows, n, width, value):
    """_rows' inverse: value (BLOCK, WIDE) into rows `rows` of graph r."""
    col = tl.arange(0, value.shape[1])
    at = (r.to(tl.int64) * n + rows)[:, None] * width + col[None, :]
    tl.store(ptr + at, value, mask=(rows < n)[:, None] & (col < width)[None, :])


@triton.jit
def _queries(inputs, scalars, r, i, BD: tl.constexpr, BK: tl.constexpr):
    """q/√D (BLOCK, BD), x = Q̂ (BLOCK, BK) and valid (BLOCK,) of the queries i of graph r."""
    N, D, K, scale = scalars[0], scalars[1], scalars[2], scalars[3]
    valid = tl.load(inputs[5] + r.to(tl.int64) * N + i, mask=i < N, other=0) != 0
    # Eq. 3's 1/√D on q, as the reference path scales it
    return _rows(inputs[0], r, i, N, D, BD) * scale, _rows(inputs[3], r, i, N, K, BK), valid


@triton.jit
def _keys(inputs, scalars, r, j, BD: tl.constexpr, BK: tl.constexpr):
    """k, v (BLOCK, BD), w = K̂Ŝᵀ (BLOCK, BK) and valid (BLOCK,) of the keys j of graph r."""
    N, D, K = scalars[0], scalars[1], scalars[2]
    Kt, V, W, VALID = inputs[1], inputs[2], inputs[4], inputs[5]
    valid = tl.load(VALID + r.to(tl.int64) * N + j, mask=j < N, other=0) != 0
    return _rows(Kt, r, j, N, D, BD), _rows(V, r, j, N, D, BD), _rows(W, r, j, N, K, BK), valid


@triton.jit
def _pairs(seed, r, i, j, x, w, valid_i, valid_j, scalars, CAUSAL: tl.constexpr, SELF_LOOPS: tl.constexpr):
    """(edge, weight) (BLOCK, BLOCK) of queries i and keys j: M_ij (Eq. 8), and the factor that attention
    dropout puts on α_ij (0 or 1/(1 − dropout); 1 without dropout)."""
    delta, p_drop = scalars[4], scalars[5]
    prob = tl.dot(x, tl.trans(w), input_precision="ieee")  # (BLOCK, BLOCK) P_ij = x_i · w_j (Eq. 7)
    c0 = j[None, :] + 0 * i[:, None]
    u, u_drop, _, _ = tl.philox(seed, c0, i[:, None] + 0 * j[None, :], c0 * 0 + r, c0 * 0)
    edge = ((u >> 8).to(tl.float32) * UNIFORM < prob + delta) & valid_i[:, None] & valid_j[None, :]
    if CAUSAL:
        edge &= j[None, :] <= i[:, None]
    if SELF_LOOPS:  # (+I), Table 8: M_ii = 1 for valid tokens
        edge |= (i[:, None] == j[None, :]) & valid_i[:, None]
    weight = tl.where((u_drop >> 8).to(tl.float32) * UNIFORM >= p_drop, 1 / (1 - p_drop), 0.0)
    return edge, weight


@triton.jit
def _forward(
    inputs, outputs, scalars, BD: tl.constexpr, BK: tl.constexpr, CAUSAL: tl.constexpr, SELF_LOOPS: tl.constexpr
):
    """A tile of queries: y = σ_M(QKᵀ/√D) V over the sampled pairs (Eq. 3-4) as an online softmax, each query's
    log-normaliser (for the backward), and the tile's edge count."""
    Y, LSE, COUNT = outputs
    N = scalars[0]
    block, r = tl.program_id(0), tl.program_id(1)
    i = block * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(inputs[6])
    q, x, valid_i = _queries(inputs, scalars, r, i, BD, BK)
    top = tl.full((BLOCK,), float("-inf"), dtype=q.dtype)  # running maximum of each query's sampled scores
    total = tl.zeros((BLOCK,), dtype=q.dtype)  # Σ exp(s − top) over the sampled pairs
    acc = tl.zeros((BLOCK, BD), dtype=q.dtype)
    edges = tl.zeros((BLOCK,), dtype=tl.int32)
    for j0 in range(0, tl.minimum(N, (block + 1) * BLOCK) if CAUSAL else N, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        k, v, w, valid_j = _keys(inputs, scalars, r, j, BD, BK)
        edge, weight = _pairs(seed, r, i, j, x, w, valid_i, valid_j, scalars, CAUSAL, SELF_LOOPS)
        s = tl.where(edge, tl.dot(q, tl.trans(k), input_precision="ieee"), float("-inf"))  # (BLOCK, BLOCK)
        new_top = tl.maximum(top, tl.max(s, 1))
        shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # a query without edges so far: every term 0
        alpha = tl.exp(s - shift[:, None])  # (BLOCK, BLOCK), 0 off the edges
        rescale = tl.exp(top - shift)
        total = total * rescale + tl.sum(alpha, 1)  # dropout acts on the normalised weights: the sum keeps all
        acc = acc * rescale[:, None] + tl.dot((alpha * weight).to(v.dtype), v, input_precision="ieee")
        top = new_top
        edges += tl.sum(edge.to(tl.int32), 1)
    some = total > 0  # a query without edges outputs 0 (Eq. 4 over an empty set)
    _store_rows(Y, r, i, N, scalars[1], tl.where(some[:, None], acc / tl.where(some, total, 1.0)[:, None], 0.0))
    lse = tl.where(some, top + tl.log(tl.where(some, total, 1.0)), 0.0)
    tl.store(LSE + r.to(tl.int64) * N + i, lse, mask=i < N)
    tl.store(COUNT + r * tl.num_programs(0) + block, tl.sum(edges, 0))


@triton.jit
def _tile_grads(
    seed, r, i, j, queries, keys, scalars, CAUSAL: tl.constexpr, SELF_LOOPS: tl.constexpr, PAPER: tl.constexpr
):
    """(α·weight, ∂L/∂S, G) (BLOCK, BLOCK) of a tile, its scores and mask recomputed; queries = (q, x, valid, dY,
    lse, dY·Y, the count's gradient), keys = (k, v, w, valid). G = ∂L/∂P, the straight-through estimator (Eq. 9)."""
    q, x, valid_i, dy, lse, dot, count_grad = queries
    k, v, w, valid_j = keys
    edge, weight = _pairs(seed, r, i, j, x, w, valid_i, valid_j, scalars, CAUSAL, SELF_LOOPS)
    s = tl.dot(q, tl.trans(k), input_precision="ieee")  # (BLOCK, BLOCK) the forward's scores S = QKᵀ/√D
    alpha = tl.exp(tl.where(edge, s, float("-inf")) - lse[:, None])  # the forward's α, 0 off the edges
    grad_alpha = tl.dot(dy, tl.trans(v), input_precision="ieee") * weight
    grad_s = alpha * (grad_alpha - dot[:, None])  # Σ_j α_ij ∂L/∂α_ij = dY_i · Y_i, dropout included
    # Eq. 9: ∂L/∂P := ∂L/∂S ⊙ S, or the official code's hardtanh(∂L/∂S); plus the edge count's gradient
    ste = grad_s * s if PAPER else tl.minimum(tl.maximum(grad_s, -1.0), 1.0)
    sampled = edge & (i[:, None] != j[None, :]) if SELF_LOOPS else edge  # forced self-loops are not sampled
    return alpha * weight, grad_s, tl.where(sampled, ste + count_grad, 0.0)


@triton.jit
def _query_side(inputs, grads, scalars, r, i, BD: tl.constexpr, BK: tl.constexpr):
    """The queries' part of _tile_grads: q, x, valid, dY, lse, dY·Y, the count's gradient."""
    DY, LSE, DOT, COUNT_GRAD = grads
    N = scalars[0]
    q, x, valid = _queries(inputs, scalars, r, i, BD, BK)
    rows = r.to(tl.int64) * N + i
    lse, dot = tl.load(LSE + rows, mask=i < N, other=0.0), tl.load(DOT + rows, mask=i < N, other=0.0)
    return q, x, valid, _rows(DY, r, i, N, scalars[1], BD), lse, dot, tl.load(COUNT_GRAD + r)


@triton.jit
def _backward_queries(
    inputs,
    grads,
    outputs,
    scalars,
    BD: tl.constexpr,
    BK: tl.constexpr,
    CAUSAL: tl.constexpr,
    SELF_LOOPS: tl.constexpr,
    PAPER: tl.constexpr,
):
    """A tile of queries: dQ = ∂L/∂S K/√D, dx = G w (Eq. 9)."""
    DQ, DX = outputs
    N, D, K, scale = scalars[0], scalars[1], scalars[2], scalars[3]
    block, r = tl.program_id(0), tl.program_id(1)
    i = block * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(inputs[6])
    queries = _query_side(inputs, grads, scalars, r, i, BD, BK)
    dq, dx = tl.zeros((BLOCK, BD), dtype=queries[0].dtype), tl.zeros((BLOCK, BK), dtype=queries[0].dtype)
    for j0 in range(0, tl.minimum(N, (block + 1) * BLOCK) if CAUSAL else N, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        keys = _keys(inputs, scalars, r, j, BD, BK)
        _, grad_s, g = _tile_grads(seed, r, i, j, queries, keys, scalars, CAUSAL, SELF_LOOPS, PAPER)
        dq += tl.dot(grad_s, keys[0], input_precision="ieee")
        dx += tl.dot(g, keys[2], input_precision="ieee")
    _store_rows(DQ, r, i, N, D, dq * scale)
    _store_rows(DX, r, i, N, K, dx)


@triton.jit
def _backward_keys(
    inputs,
    grads,
    outputs,
    scalars,
    BD: tl.constexpr,
    BK: tl.constexpr,
    CAUSAL: tl.constexpr,
    SELF_LOOPS: tl.constexpr,
    PAPER: tl.constexpr,
):
    """A tile of keys: dK = ∂L/∂Sᵀ Q/√D, dV = (α·weight)ᵀ dY, dw = Gᵀ x (Eq. 9)."""
    DK, DV, DW = outputs
    N, D, K = scalars[0], scalars[1], scalars[2]
    block, r = tl.program_id(0), tl.program_id(1)
    j = block * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(inputs[6])
    keys = _keys(inputs, scalars, r, j, BD, BK)
    dk, dv = tl.zeros((BLOCK, BD), dtype=keys[0].dtype), tl.zeros((BLOCK, BD), dtype=keys[0].dtype)
    dw = tl.zeros((BLOCK, BK), dtype=keys[0].dtype)
    for i0 in range(block * BLOCK if CAUSAL else 0, N, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        queries = _query_side(inputs, grads, scalars, r, i, BD, BK)
        weighted, grad_s, g = _tile_grads(seed, r, i, j, queries, keys, scalars, CAUSAL, SELF_LOOPS, PAPER)
        dv += tl.dot(tl.trans(weighted), queries[3], input_precision="ieee")
        dk += tl.dot(tl.trans(grad_s), queries[0], input_precision="ieee")
        dw += tl.dot(tl.trans(g), queries[1], input_precision="ieee")
    _store_rows(DK, r, j, N, D, dk)
    _store_rows(DV, r, j, N, D, dv)
    _store_rows(DW, r, j, N, K, dw)


# ---- the autograd function and the entry point ---------------------------------------------------------------------
class TileAttention(torch.autograd.Function):
    """(y (B, H, N, D), counts (B, H)) from q, k, v (B, H, N, D), the memberships x, w (B, H, N, K), valid (B·H, N)
    uint8 and the seed (1,); the backward gives q, k, v, x and w their gradients (Eq. 9)."""

    @staticmethod
    def forward(ctx, q, k, v, x, w, valid, seed, causal: bool, delta: float, self_loops: bool, p_drop: float, ste):
        B, H, N, D = q.shape
        grid = (triton.cdiv(N, BLOCK.value), B * H)
        y, lse = torch.empty_like(q), q.new_empty(B, H, N)
        count = torch.empty(grid[::-1], dtype=torch.int32, device=q.device)  # (B·H, tiles) edges a tile
        inputs, scalars = (q, k, v, x, w, valid, seed), (N, D, x.shape[-1], D**-0.5, delta, p_drop)
        flags = dict(BD=_width(D), BK=_width(x.shape[-1]), CAUSAL=causal, SELF_LOOPS=self_loops, num_stages=STAGES)
        _forward[grid](inputs, (y, lse, count), scalars, **flags)
        ctx.save_for_backward(*inputs, y, lse)
        ctx.grid, ctx.scalars, ctx.flags = grid, scalars, dict(flags, PAPER=ste == "paper")
        return y, count.sum(1).view(B, H).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_y, grad_counts):
        if torch.is_grad_enabled():  # create_graph=True: the kernels' products have no derivative of their own
            raise RuntimeError("the tile path has no second derivative; the reference path (path='reference') has one")
        *inputs, y, lse = ctx.saved_tensors
        q, k, v, x, w = inputs[:5]
        grad_y = grad_y.contiguous()
        dot = (grad_y * y).sum(-1)  # (B, H, N) dY_i · Y_i = Σ_j α_ij ∂L/∂α_ij, the softmax backward's row term
        grads = (grad_y, lse, dot, grad_counts.contiguous())
        dq, dk, dv, dx, dw = (torch.empty_like(t) for t in (q, k, v, x, w))
        _backward_queries[ctx.grid](tuple(inputs), grads, (dq, dx), ctx.scalars, **ctx.flags)
        _backward_keys[ctx.grid](tuple(inputs), grads, (dk, dv, dw), ctx.scalars, **ctx.flags)
        return dq, dk, dv, dx, dw, None, None, None, None, None, None, None


def _width(n: int) -> int:
    """A tile's padded width for n columns: a power of two, at least tl.dot's 16."""
    return max(16, triton.next_power_of_2(n))


def attend(q, k, v, graph: dict, valid: Tensor, p_drop: float, ste: str, generator):
    """SBMAttention.attend on the tile path: y (B, H, N, D) and the (B, H) edge counts with the STE's gradient path,
    as the reference path computes them on its mask; graph = SBMAttention.sample's {x = Q̂, w = K̂Ŝᵀ, causal, delta,
    self_loops}; valid (B, N) bool."""
    x, w = graph["x"], graph["w"]
    if not (q.is_cuda or INTERPRETED):
        raise ValueError(
            f"the tile path runs on CUDA, or on the CPU with TRITON_INTERPRET=1 set before sbm_tile is imported; "
            f"got a tensor on {q.device}"
        )
    if q.dtype not in DTYPES or any(t.dtype != q.dtype for t in (k, v, x, w)):
        raise ValueError(f"the tile path takes float32 or float64, got {[t.dtype for t in (q, k, v, x, w)]}")
    if q.is_cuda and q.dtype == torch.float64:  # triton 3.6 stops at its float64 product of a product (P·V, sm_80/90)
        raise ValueError("the tile path takes float32 on CUDA; float64 runs on the CPU under TRITON_INTERPRET=1")
    # no host synchronisation: on CUDA a NaN or infinite membership stops the next synchronising call
    torch._assert_async(torch.isfinite(x).all() & torch.isfinite(w).all(), "the tile path's memberships must be finite")
    seed = draw_seed(generator, q.device)
    B, H, N, _ = q.shape  # valid as (B·H, N) in memory (contiguous() copies an expand): the kernels index it densely
    valid = valid.to(torch.uint8)[:, None].expand(B, H, N).contiguous().view(B * H, N)
    q, k, v, x, w = (t.contiguous() for t in (q, k, v, x, w))
    law = (graph["causal"], graph["delta"], graph["self_loops"])
    return TileAttention.apply(q, k, v, x, w, valid, seed, *law, p_drop, ste)
