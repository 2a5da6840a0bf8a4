"""fastRG: sample sparse random graphs whose expectation is low rank, X S Yᵀ, in time linear in the edges.

What
----
A batched, exact sampler for the directed (bipartite, n × m) "random dot product"/SBM graph of Rohe, Tao,
Han, Binkiewicz, "A Note on Quickly Sampling a Sparse Matrix with Low Rank Expectation", JMLR 19(77), 2018,
used as Algorithm 1 of the SBM-Transformer paper (Cho et al., "Transformers meet Stochastic Block Models",
NeurIPS 2022, §4.1, Eq. 8; papers/000). Inputs are non-negative memberships X (n × K), Y (m × K) and a
non-negative block matrix S (K × K). Per graph the cost is O((n + m)K + K² + E) memory and
O((n + m)K + K² + E log(n + m)) time (guide-table lookups, bisected when draws are few; plus one sort of the
edges for dedup/CSR), where E is the number of edges drawn: no n × m matrix is ever formed.

Distribution (what `sample` returns)
------------------------------------
λ = X S Yᵀ,  λ_ij = Σ_uv X_iu S_uv Y_jv.
* Multigraph (`dedup=False`): the number of copies of edge (i, j) is Poisson(λ_ij), independently over
  (graph, i, j), so E[A] = X S Yᵀ exactly. This is fastRG's own guarantee.
* Simple graph (`dedup=True`, default): copies are merged, so P(edge i→j) = 1 − exp(−λ_ij), independently.
  The SBM paper's Algorithm 1 sets a binary M_IJ = 1 and claims E[M] = Y B Zᵀ, i.e. p = λ; that holds only
  for small λ (1 − e^{−λ} = λ − λ²/2 + …; at λ = 1 the edge probability is 0.632, not 1).
  `edge_probability` gives the exact dense matrix for tests and small cases.

How (Poisson splitting, Rohe et al. 2018)
----------------------------------------
Write λ_ij = Σ_uv X_iu S_uv Y_jv and split every Poisson count by cluster pair (u, v):
    A_ij = Σ_uv A_ij^{uv},   A_ij^{uv} ~ Poisson(X_iu S_uv Y_jv)  independent.
For a fixed (u, v) the total N_uv = Σ_ij A_ij^{uv} ~ Poisson(cx_u S_uv cy_v) with cx_u = Σ_i X_iu,
cy_v = Σ_j Y_jv (the paper's B̄ = D_Y B D_Z, Algorithm 1 line 3), and given N_uv its edges are i.i.d. with
source i ~ X[:, u] / cx_u and destination j ~ Y[:, v] / cy_v drawn independently (lines 8-9). So we draw
    1. N[r, u, v] ~ Poisson(cx[r, u] · S[r, u, v] · cy[r, v])    for all graphs and cluster pairs at once;
    2. for every edge, i by inverse-CDF sampling of column u of X[r] and j of column v of Y[r], each through
       a guide table (Chen and Asau 1974): bucket ⌊U·G⌋ of a CDF row names an interval that holds the
       answer, which a draw steps through (narrow intervals) or bisects. G is sized to the draws: a full
       guide (one bucket per entry, a counting pass) when draws are many, a few searched buckets when they
       are few, so the tables cost what the draws save. Sources are drawn with the edges grouped by (r, u),
       destinations grouped by (r, v) and moved to their source's place, so consecutive lookups stay in one
       cached CDF row; they go a chunk at a time (bounded temporaries).
Step 1 replaces Algorithm 1's "one Poisson total, then a categorical (u, v) per edge" (lines 4, 7) by
independent Poisson counts per (u, v); the two are equal in distribution (Poisson splitting) and step 1 has
no loop and no `torch.multinomial` category limit.

Deviations and notes
--------------------
* Algorithm 1 line 1 defines D_Y = diag(1ᵀY)⁻¹, with which lines 2-3 (Ȳ = Y D_Y⁻¹, B̄ = D_Y B D_Z) would
  neither normalise the columns nor scale B correctly; the inverse is a typo. We implement the intended
  Ȳ = Y diag(1ᵀY)⁻¹, B̄ = diag(1ᵀY) B diag(1ᵀZ).
* The official SBM-Transformer `fastRG()` pairs sources and destinations position-wise after drawing them
  grouped by u and by v separately, which breaks the joint (u, v) pairing (shared/notes/sbm_reference.md §5).
  Here each edge carries its own (u, v) from step 1, so the joint law is exact; tests/test_fastrg.py checks
  it with a zero-diagonal block matrix (no within-cluster edge may ever appear).
* Float round-off. CDFs are float64, C_i / C_n for the prefix sums C of a column; from the first index where
  C reaches its total the entry is exactly 1 (C/C = 1), including any trailing zero weights, and division by
  one positive total keeps the row non-decreasing. A draw is U ∈ [0, 1) on the 2⁻⁵³ grid (float64 uniforms:
  numpy's PCG64 on CPU, seeded from the torch generator; torch.rand elsewhere) and picks the first entry
  strictly above U: always in range (the last entry is 1 > U, no clamp, no tail case) and never an index of
  zero weight (its entry equals its predecessor's). The guide bucket ⌊U·G⌋ is exact because G is a power of
  two. Probabilities are resolved to 2⁻⁵³ ≈ 1e-16.
* Sorting. With `dedup=True` or `csr=True` the edges are deduplicated and grouped by (r, i, j) with one sort
  of the integer key r·2^(bn+bm) + i·2^bm + j (bn, bm = bits of n − 1, m − 1; power-of-two fields decode
  with shifts, not divisions), int32 when it fits (half the bytes to sort). The key must fit int64: `sample`
  raises ValueError when R·2^(bn+bm) > 2⁶³ (R·n·m ≥ 2⁶¹ may hit it). With `dedup=False, csr=False` this sort
  is skipped and the edge order is unspecified.
* CPU primitives. Six steps that torch runs slowly on CPU go through numpy there (`repeat_interleave`,
  `sort_integers`, `nonzero`, the uniforms, the column sums and the CDF's transposing copy, tile by tile;
  measured beside each).
* Gradients do not flow through sampling: the outputs are integer indices. A straight-through estimator
  (SBM paper Eq. 9) recomputes the probability of each sampled edge, e.g. p_e = X[r, i] · (S[r] Y[r, j]),
  with autograd outside this module.

Use in SBM-Transformer
----------------------
X = Q̂ (B, H, N, K), S = Ŝ (H, K, K) (broadcast over the batch), Y = K̂ (B, H, M, K): R = B·H graphs, graph
r = b·H + h; up to N = M = 16384, K = 128. One side's tables live at a time, built just before its draws:
8·K·N bytes per graph (float64 CDF) plus the guide (up to 8·K·N while built); then about 12 bytes per drawn
edge and 40 per edge of a chunk while sampling. `sample_block_csr` returns the graphs as one block-diagonal CSR matrix (row offsets and global
columns, int32), the form a sparse attention consumes: it needs no sort of its own. Random edge exploration
(+δ, SBM §4.2) is exactly λ + δ with X' = [X, 1], Y' = [Y, 1], S' = blockdiag(S, δ).

Run `python fastrg.py` for a short self-check (`--help` runs nothing).

Shape legend: R graphs (flattened leading dims), N = n rows of X (queries), M = m rows of Y (keys),
K clusters, E edges.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np
import torch

__all__ = ["sample", "sample_block_csr", "expected_edges", "edge_probability", "repeat_interleave", "nonzero",
           "sort_integers"]

_WORK = torch.float64  # CDFs and rates: a float32 prefix sum over 16384 rows may drift by up to n·2⁻²⁴ ≈ 1e-3
_MAX_EXPECTED_EDGES = 2.0**53  # Poisson counts are drawn as float64 and must be exact integers
# Draws looked up at a time (_draw): bounded temporaries, and a chunk's CDF rows stay in cache through its
# bisection rounds (2^17: 5-13% faster than 2^20 at n = 4096-16384 on one core; 2^13 is slower, per-op overhead).
_CHUNK = 1 << 17
_SCAN = 8  # the widest guide interval that draws step through (3 passes a step); wider ones are bisected
_TILE = 64  # rows of X a time in the CPU transposing copy (_columns): 64·K floats stay in the L1 cache


# ----------------------------------------------------------------------------------------------- helpers
def _check_factor(name: str, t) -> None:
    """Type and rank of one input; values are checked later, after the cheap shape checks."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_complex():
        raise ValueError(f"{name} must be real, got dtype {t.dtype}")
    if t.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dims (..., rows, K), got shape {tuple(t.shape)}")


def _check_values(name: str, t: torch.Tensor) -> None:
    """One pass (aminmax): a NaN propagates to both ends, an infinity shows at one of them."""
    if t.dtype == torch.bool or t.numel() == 0:
        return
    low, high = torch.aminmax(t.detach())
    if t.is_floating_point() and not bool(torch.isfinite(low) & torch.isfinite(high)):
        raise ValueError(f"{name} must be finite, found NaN or inf")
    if bool(low < 0):
        raise ValueError(f"{name} must be non-negative, found a negative entry")


def _validate(X, S, Y, key_needed: bool) -> tuple[tuple[int, ...], int, int, int, int]:
    """Check all inputs; return (leading shape, R, n, m, K)."""
    for name, t in (("X", X), ("S", S), ("Y", Y)):
        _check_factor(name, t)
    K = X.shape[-1]
    if S.shape[-2:] != (K, K):
        raise ValueError(f"S must have shape (..., K, K) with K = X.shape[-1] = {K}, got {tuple(S.shape)}")
    if Y.shape[-1] != K:
        raise ValueError(f"Y must have shape (..., m, K) with K = X.shape[-1] = {K}, got {tuple(Y.shape)}")
    if not (X.device == S.device == Y.device):
        raise ValueError(f"X, S, Y must be on one device, got {X.device}, {S.device}, {Y.device}")
    try:
        lead = tuple(torch.broadcast_shapes(X.shape[:-2], S.shape[:-2], Y.shape[:-2]))
    except RuntimeError:
        raise ValueError(f"leading dims of X {tuple(X.shape[:-2])}, S {tuple(S.shape[:-2])} and "
                         f"Y {tuple(Y.shape[:-2])} do not broadcast") from None
    R, n, m = math.prod(lead), X.shape[-2], Y.shape[-2]
    if key_needed:
        bits = max(R - 1, 0).bit_length() + _bits(n) + _bits(m)
        if bits > 63:
            raise ValueError(f"R·n·m too large for the int64 sort key of dedup/csr (R={R}, n={n}, m={m} need "
                             f"{bits} bits > 63); split the batch or use dedup=False, csr=False")
    for name, t in (("X", X), ("S", S), ("Y", Y)):
        _check_values(name, t)
    return lead, R, n, m, K


def _bits(size: int) -> int:
    """Bits of the largest index of a dimension of this size."""
    return max(size - 1, 0).bit_length()


def _flat(t: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """(..., a, b) → (R, a, b), broadcasting the leading dims; detached (no gradient, see above)."""
    t = t.detach()
    return t.expand(*lead, *t.shape[-2:]).reshape(-1, *t.shape[-2:])


def _index_dtype(size: int) -> torch.dtype:
    """int32 for indices below 2³¹ (half the memory traffic of int64; gathers and scatters take either)."""
    return torch.int32 if size <= 2**31 else torch.int64


# Primitives that torch runs slowly on CPU go through numpy there (same results; timings on a 2-core AVX-512
# CPU, 9.7M elements): np.repeat fills whole runs (1.3 ms against torch.repeat_interleave's 107 ms for 258
# runs), numpy's vectorised quicksort sorts values in place (72 ms against torch.sort's 260 ms, which also
# writes int64 indices), np.flatnonzero is 5× torch.nonzero, numpy's PCG64 draws float64 uniforms 3× faster
# than torch.rand, and its transposing copy (_columns) is 2× torch's strided copy.
def repeat_interleave(values: torch.Tensor, counts: torch.Tensor, total: int) -> torch.Tensor:
    """torch.repeat_interleave(values, counts, output_size=total) for 1-D values without gradient."""
    if values.device.type == "cpu" and not values.requires_grad:
        return torch.from_numpy(np.repeat(values.numpy(), counts.numpy()))
    return torch.repeat_interleave(values, counts, output_size=total)


def nonzero(mask: torch.Tensor) -> torch.Tensor:
    """(E,) bool → int64 positions of its True entries."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return mask.nonzero().squeeze(1)


def sort_integers(key: torch.Tensor) -> torch.Tensor:
    """1-D integer keys without gradient, sorted ascending (in place on CPU)."""
    if key.device.type == "cpu":
        key.numpy().sort()
        return key
    return torch.sort(key).values


def _uniforms(generator: torch.Generator | None, device: torch.device):
    """A function size → (size,) float64 uniforms in [0, 1) on the 2⁻⁵³ grid, one stream from `generator` (the
    global one when None): on CPU numpy's PCG64 seeded by one draw of the generator, elsewhere torch.rand; the
    same generator state gives the same stream, however it is cut."""
    if device.type == "cpu":
        stream = np.random.default_rng(int(torch.randint(0, 2**63 - 1, (), generator=generator)))
        return lambda size: torch.from_numpy(stream.random(size))
    return lambda size: torch.rand(size, dtype=_WORK, device=device, generator=generator)


def _column_sums(W: torch.Tensor) -> torch.Tensor:
    """(R, n, K) → (R, K) float64 column sums; numpy's on CPU (one pass adding rows, where torch's reduction over
    the middle dim is 6× slower for many graphs: 2.5 against 15.5 ms at R = 32, n = 1024, K = 128, one core)."""
    if W.device.type == "cpu" and W.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(W.numpy().sum(axis=1, dtype=np.float64))
    return W.sum(1, dtype=_WORK)


def _cdf_table(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF table of every column of W (R, n, K) → (cdf (R·K·L,), totals (R, K) of the prefix sums).

    Rows are L = 2^b ≥ n entries apart (b = bits of n − 1), so a flat index o·L + i splits into CDF row
    o = r·K + u and entry i with a shift and a mask. Row o is the CDF of column u of graph r, float64, padded
    with 1 past n; from the first index where the prefix sum reaches its total it is exactly 1 (C/C = 1), and
    division by one positive total keeps it monotone.
    """
    R, n, K = W.shape
    L = 1 << _bits(n)
    C = _columns(W).cumsum_(2)                                       # (R, K, N) prefix sums of each column
    totals = C[:, :, -1].clone()                                     # (R, K) column sums cx
    safe = torch.where(totals > 0, totals, torch.ones_like(totals))  # empty columns draw no edge; avoid 0/0
    if L == n:
        return C.div_(safe[:, :, None]).view(-1), totals
    cdf = torch.ones(R, K, L, dtype=_WORK, device=W.device)          # (R, K, L), 1 past n
    torch.div(C, safe[:, :, None], out=cdf[:, :, :n])
    return cdf.view(-1), totals


def _columns(W: torch.Tensor) -> torch.Tensor:
    """(R, n, K) → its columns as rows, (R, K, n) float64 contiguous: one transposing, converting copy. On CPU
    numpy's, _TILE rows of a graph at a time: a tile's source and destination stay in the L1 cache, where the
    whole-array copy walks the destination with a stride of n (measured on one core, K = 128: 0.58 against
    1.31 ms at n = 8192, 1.56 against 2.98 ms at n = 16384; the whole-array copy is 2× torch's strided one)."""
    if W.device.type == "cpu" and W.dtype in (torch.float32, torch.float64):
        R, n, K = W.shape
        source, columns = W.numpy(), np.empty((R, K, n), dtype=np.float64)
        for r in range(R):
            for a in range(0, n, _TILE):
                columns[r, :, a:a + _TILE] = source[r, a:a + _TILE].T
        return torch.from_numpy(columns)
    return torch.empty(W.shape[0], W.shape[2], W.shape[1], dtype=_WORK, device=W.device).copy_(W.transpose(1, 2))


def _guide_table(cdf: torch.Tensor, n: int, G: int) -> tuple[torch.Tensor, int]:
    """Chen and Asau's guide table of a CDF table (_cdf_table's) with G buckets per row, G a power of two ≤ L →
    (guide (rows·(G + 1),), widest).

    guide[o·(G + 1) + c] is the flat index o·L + i of the first entry of row o whose CDF exceeds c/G (c < G),
    and guide[o·(G + 1) + G] that of the first entry equal to 1: a draw U ∈ [c/G, (c + 1)/G) lands in
    [guide[c], guide[c + 1]], since every entry before guide[c] is ≤ c/G ≤ U and entry guide[c + 1] is above
    U. `widest` is the most entries such an interval spans. With G = L the guide is a counting pass: guide[c] is
    the number of entries with ⌈CDF·L⌉ ≤ c (exact: L is a power of two), about ten passes over the table; with
    fewer buckets each is found by bisection (b rounds over rows·G values, all at once).
    """
    L = 1 << _bits(n)
    rows = len(cdf) // L
    start = torch.arange(0, rows * L, L, device=cdf.device)[:, None]  # (rows, 1) flat row starts
    if G == L:
        bucket = (cdf.view(rows, L)[:, :n] * L).ceil_().long()       # (rows, N) ⌈CDF·L⌉ ∈ [0, L]
        bucket += torch.arange(0, rows * (L + 1), L + 1, device=cdf.device).view(rows, 1)
        counts = torch.bincount(bucket.view(-1), minlength=rows * (L + 1)).view(rows, L + 1)
        guide = torch.empty(rows, L + 1, dtype=torch.int64, device=cdf.device)
        torch.cumsum(counts[:, :L], 1, out=guide[:, :L])
        guide[:, :L] += start
        below_one = torch.full((rows,), 1 - 2.0**-53, dtype=_WORK, device=cdf.device)  # the last: first 1
        guide[:, L] = _bisect(cdf, start.view(-1), start.view(-1) + (n - 1), below_one, L)
    else:
        levels = torch.arange(G + 1, dtype=_WORK, device=cdf.device) / G  # c/G exact; the last, 1 − 2⁻⁵³
        levels[G] = 1 - 2.0**-53
        lo = start.expand(rows, G + 1).reshape(-1)
        guide = _bisect(cdf, lo, lo + (n - 1), levels.repeat(rows), L).view(rows, G + 1)
    widest = int(guide.diff(dim=1).max())
    return guide.to(_index_dtype(rows * L)).view(-1), widest


def _draw(cdf: torch.Tensor, n: int, per_row: torch.Tensor, generator: torch.Generator | None,
          shift: torch.Tensor | None = None) -> torch.Tensor:
    """One inverse-CDF draw per edge from the rows of a CDF table (_cdf_table's, of columns of n entries),
    per_row[o] edges from row o = r·K + u, in that order → flat indices (E,) o·L + i (i = flat & (L − 1)): the
    first entry of the row strictly above U ∈ [0, 1). With `shift` (E,), draw e is stored at position e + shift[e].

    The guide table's bucket names an interval holding the answer (_guide_table); draws then step through it
    when every interval is short (one gather per step, the row staying in cache as draws come grouped by row),
    else bisect it. A full guide (G = L, a counting pass of about ten passes over the table) pays once there
    are at least half as many draws as entries; below that, G ≈ draws / (rows·(b + 1)) buckets cost about one
    bisection of every draw and save each draw log2(G) rounds.
    An index of zero weight repeats its predecessor's CDF, so it is never the first one above U.
    """
    b = _bits(n)
    rows, E = len(per_row), int(per_row.sum())
    L = 1 << b
    G = L if 2 * E >= rows * L else max(1, min(L // 2, 1 << (max(E // (rows * (b + 1)), 1).bit_length() - 1)))
    guide, widest = _guide_table(cdf, n, G)
    start = torch.arange(0, rows * (G + 1), G + 1, dtype=guide.dtype, device=cdf.device)  # each row's guide
    start = repeat_interleave(start, per_row, E)                     # (E,) the guide of each edge's row
    uniforms, drawn = _uniforms(generator, cdf.device), torch.empty_like(start)
    for a in range(0, E, _CHUNK):  # bounded temporaries (~40 bytes a draw), and a chunk stays in cache
        end = min(a + _CHUNK, E)
        found = _lookup(cdf, L, guide, widest, G, start[a:end], uniforms(end - a))
        if shift is None:
            drawn[a:end] = found
        else:
            drawn[shift[a:end] + torch.arange(a, end, dtype=shift.dtype, device=shift.device)] = found
    return drawn


def _lookup(cdf: torch.Tensor, L: int, guide: torch.Tensor, widest: int, G: int, start: torch.Tensor,
            U: torch.Tensor) -> torch.Tensor:
    """Flat index of the first entry strictly above U (E,) of the CDF rows (L entries apart) whose guides start
    at `start` (E,)."""
    slot = (U * G).long().add_(start)                                # (E,) bucket ⌊U·G⌋ of the edge's row
    lo = guide.index_select(0, slot)
    if widest > _SCAN:
        return _bisect(cdf, lo, guide.index_select(0, slot.add_(1)), U, L)
    # Step through the interval (three passes a step): every draw takes two steps (most settle there), then the
    # draws still at an entry ≤ U go on alone.
    for _ in range(min(widest, 2)):
        lo += cdf.index_select(0, lo) <= U
    if widest > 2:
        rest = nonzero(cdf.index_select(0, lo) <= U)
        if len(rest):
            last, u = lo.index_select(0, rest), U.index_select(0, rest)
            for _ in range(widest - 2):
                last += cdf.index_select(0, last) <= u
            lo[rest] = last
    return lo


def _bisect(cdf: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, U: torch.Tensor, L: int) -> torch.Tensor:
    """The first flat index in [lo, hi] whose CDF exceeds U, for draws whose cdf[hi] > U, in rows of L entries
    (a power of two): a binary search by steps 2^(k−1), …, 2, 1 (2^k > hi − lo), all draws at once, four passes
    a round. It starts at lo − 1 (an entry ≤ U, or before the row), moved back where needed so that no step
    leaves the row (the entries it then passes are ≤ U too)."""
    k = int((hi - lo).max()).bit_length() if len(lo) else 0
    last = torch.minimum(lo - 1, (lo | (L - 1)) + 1 - (1 << k))  # the last entry known ≤ U
    for step in (1 << j for j in reversed(range(k))):
        last.add_(cdf.index_select(0, last + step) <= U, alpha=step)
    return last + 1


def _uv_shift(counts: torch.Tensor) -> torch.Tensor:
    """How far each edge laid out in (r, v, u) group order moves to reach (r, u, v) group order, order within a
    group kept: (E,). counts (R, K, K) holds N[r, u, v]; group (r, u, v) starts at start_uv in the target order
    and at start_vu in the source order, so its edges move by start_uv − start_vu."""
    E = int(counts.sum())
    start_uv = counts.view(-1).cumsum(0).sub_(counts.view(-1)).view(counts.shape)   # (R, K, K) [r, u, v]
    counts_vu = counts.transpose(1, 2).contiguous()                                 # (R, K, K) [r, v, u]
    start_vu = counts_vu.view(-1).cumsum(0).sub_(counts_vu.view(-1))               # (R·K·K,) [r, v, u]
    shift = start_uv.transpose(1, 2).reshape(-1).sub_(start_vu)                    # (R·K·K,) [r, v, u]
    return repeat_interleave(shift.to(_index_dtype(E)), counts_vu.view(-1), E)


def _empty(R: int, n: int, device: torch.device, csr: bool) -> tuple[torch.Tensor, ...]:
    """What `sample` returns when no edge is drawn."""
    e = torch.zeros(0, dtype=torch.int64, device=device)
    out = (e, e.clone(), e.clone())
    return out + (torch.zeros(R * n + 1, dtype=torch.int64, device=device),) if csr else out


# -------------------------------------------------------------------------------------------------- core
def expected_edges(X: torch.Tensor, S: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """Σ_ij λ_ij = (1ᵀX) S (Yᵀ1) per graph, float64 of shape (R,), in O((n + m)K + K²).

    This is the expected number of multigraph edges (Poisson mean of the total), the paper's 1 B̄ 1ᵀ
    (Algorithm 1 line 4); with dedup the expected count is Σ(1 − e^{−λ}) ≤ this.
    """
    lead, R, n, m, K = _validate(X, S, Y, key_needed=False)
    cx, cy = _column_sums(_flat(X, lead)), _column_sums(_flat(Y, lead))  # (R, K)
    return torch.einsum("ru,ruv,rv->r", cx, _flat(S, lead).to(_WORK), cy)


def edge_probability(X: torch.Tensor, S: torch.Tensor, Y: torch.Tensor, dedup: bool = True) -> torch.Tensor:
    """Dense exact (R, n, m) float64 matrix: P(edge) = 1 − exp(−λ) if dedup, else E[#copies] = λ = X S Yᵀ.

    O(R·n·m) memory: for tests and small cases only.
    """
    lead, R, n, m, K = _validate(X, S, Y, key_needed=False)
    X, S, Y = (_flat(t, lead).to(_WORK) for t in (X, S, Y))
    lam = X @ S @ Y.transpose(1, 2)                                  # (R, N, M)
    return -torch.expm1(-lam) if dedup else lam


def sample(X: torch.Tensor, S: torch.Tensor, Y: torch.Tensor, *, generator: torch.Generator | None = None,
           dedup: bool = True, csr: bool = False) -> tuple[torch.Tensor, ...]:
    """Draw one graph per (broadcast) leading index: edges (r, i, j), or (r, i, j, row_ptr) with csr=True.

    X (..., n, K), S (..., K, K), Y (..., m, K), all non-negative and finite; leading dims broadcast and are
    flattened (row-major) into R graphs, R = 1 for 2-D inputs. Returns three 1-D int64 tensors of equal
    length E on X's device: graph r ∈ [0, R), source i ∈ [0, n), destination j ∈ [0, m).
    The count of edge (r, i, j) is Poisson(λ) with λ = (X S Yᵀ)[r, i, j]; with dedup=True duplicates are
    merged, so P(edge) = 1 − exp(−λ) (not λ, as the SBM paper writes; equal only for small λ).
    csr=True sorts the edges by (r, i, j) and adds row_ptr (R·n + 1,): the edges of flattened row
    q = r·n + i are [row_ptr[q], row_ptr[q+1]). dedup=True also returns them sorted.
    All randomness comes from `generator` (on X's device) when given. No gradient flows (integer output).
    """
    if not (dedup or csr):
        R, n, m, counts, i, j = _draw_edges(X, S, Y, generator, key_needed=False)
        if i is None:
            return _empty(R, n, X.device, csr)
        r = repeat_interleave(torch.arange(R, device=i.device), counts.view(R, -1).sum(1), len(i))
        return r, (i & ((1 << _bits(n)) - 1)).long(), (j & ((1 << _bits(m)) - 1)).long()
    R, n, m, key = _sorted_key(X, S, Y, generator, dedup)
    if key is None:
        return _empty(R, n, X.device, csr)
    bn, bm = _bits(n), _bits(m)
    key = key.long()
    r = key >> (bn + bm)
    i = (key >> bm) & ((1 << bn) - 1)
    j = key & ((1 << bm) - 1)
    if not csr:
        return r, i, j
    return r, i, j, _row_ptr(key, R, n, bm).long()


def sample_block_csr(X: torch.Tensor, S: torch.Tensor, Y: torch.Tensor, *,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The simple graphs of `sample(X, S, Y, dedup=True)` as one block-diagonal (R·n) × (R·m) matrix in CSR
    form: (row_ptr (R·n + 1,), col (E,)), both int32 (the index type of the sparse BLAS kernels). The edges of
    row q = r·n + i are col[row_ptr[q]:row_ptr[q + 1]], sorted, with col = r·m + j; P(edge) = 1 − exp(−λ).
    The same draw as `sample(..., csr=True)` under the same generator, without the per-edge (r, i, j).
    """
    R, n, m, key = _sorted_key(X, S, Y, generator, dedup=True)
    if key is None:
        return (torch.zeros(R * n + 1, dtype=torch.int32, device=X.device),
                torch.zeros(0, dtype=torch.int32, device=X.device))
    if R * m > 2**31 or len(key) > 2**31:
        raise ValueError(f"R·m = {R * m} columns or {len(key)} edges do not fit int32 indices; split the batch")
    bm = _bits(m)
    row_ptr = _row_ptr(key, R, n, bm)
    col = key.bitwise_and_((1 << bm) - 1).int()                     # (E,) j
    if R > 1:                                                        # + r·m, graph by graph
        per_graph = (row_ptr[n::n] - row_ptr[:-1:n]).long()
        col += repeat_interleave(torch.arange(0, R * m, m, dtype=torch.int32, device=col.device), per_graph,
                                 len(col))
    return row_ptr, col


def _draw_edges(X, S, Y, generator, key_needed: bool):
    """The multigraph of `sample` before any sort: (R, n, m, counts (R, K, K) N[r, u, v], i, j), where i (E,)
    are flat source indices (r·K + u)·2^bn + i and j flat destination indices (r·K + v)·2^bm + j, both in
    (r, u, v) group order; counts, i, j are None when no edge is drawn."""
    lead, R, n, m, K = _validate(X, S, Y, key_needed=key_needed)
    device = X.device
    if generator is not None and generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device}, inputs on {device}")
    if R * n * m * K == 0:
        return R, n, m, None, None, None
    X, Y = _flat(X, lead), _flat(Y, lead)
    # One side's table lives at a time, each built just before its draws (fresh in cache). X's comes first:
    # its prefix sums' totals are the column sums cx that the rates need, so X is read once.
    cdf, cx = _cdf_table(X)                                          # (R·K·L,), (R, K)
    cy = _column_sums(Y)                                             # (R, K) column sums
    rates = cx[:, :, None] * _flat(S, lead).to(_WORK) * cy[:, None, :]  # (R, K, K) B̄: expected edges per (u, v)
    total = float(rates.sum())
    if not total < _MAX_EXPECTED_EDGES:
        raise ValueError(f"expected number of edges {total:.3g} is not finite or too large (limit 2^53); "
                         f"scale down X, S or Y")
    counts = torch.poisson(rates, generator=generator).to(torch.int64)  # (R, K, K) N[r, u, v]
    if int(counts.sum()) == 0:
        return R, n, m, None, None, None
    # Sources are drawn in (r, u, v) edge order and destinations in (r, v, u) order, so each side's lookups
    # run row by row through its CDF table (one row stays in cache) without sorting anything. Edges of one
    # (r, u, v) group are exchangeable, so pairing its k-th source with its k-th destination keeps the law
    # exact; `_uv_shift` moves each destination, as it is drawn, to its source's place.
    i = _draw(cdf, n, counts.sum(2).view(-1), generator)
    del cdf
    j = _draw(_cdf_table(Y)[0], m, counts.sum(1).view(-1), generator, shift=_uv_shift(counts))
    return R, n, m, counts, i, j


def _sorted_key(X, S, Y, generator, dedup: bool):
    """(R, n, m, key): the edges of `_draw_edges` as sorted integer keys r·2^(bn+bm) + i·2^bm + j (int32 when
    they fit; None when no edge is drawn), built in place of the draws: one sort groups them by (r, i), then j;
    dedup merges repeated keys."""
    R, n, m, counts, i, j = _draw_edges(X, S, Y, generator, key_needed=True)
    if i is None:
        return R, n, m, None
    bn, bm = _bits(n), _bits(m)
    dtype = _index_dtype(R << (bn + bm))
    graph = torch.arange(R, dtype=dtype, device=i.device) << (bn + bm)
    key = repeat_interleave(graph, counts.view(R, -1).sum(1), len(i))  # (E,) in (r, u, v) order
    key |= i.to(dtype).bitwise_and_((1 << bn) - 1).bitwise_left_shift_(bm)
    del i
    key |= j.to(dtype).bitwise_and_((1 << bm) - 1)
    del j
    key = sort_integers(key)                                         # the one sort
    return R, n, m, (torch.unique_consecutive(key) if dedup else key)


def _row_ptr(key: torch.Tensor, R: int, n: int, bm: int) -> torch.Tensor:
    """(R·n + 1,) int32 row offsets of sorted keys (rows q = r·n + i). With up to 64 edges a row, a count of the
    keys by row (one pass over the E keys, then a prefix sum over the rows); with more, where each row's first
    key would go, one search per row (R·n·log E probes, fewer than E). Measured on one core at R·n = 8192:
    counting is 6.6× the search's speed at 8 edges a row, equal near 100, 0.85× at 200."""
    bn = _bits(n)
    row_ptr = torch.full((R * n + 1,), len(key), dtype=torch.int32, device=key.device)
    if len(key) <= 64 * R * n:
        rows = torch.bincount(key >> bm, minlength=R << bn).view(R, 1 << bn)[:, :n]  # (R, n) edges a row
        row_ptr[0] = 0
        torch.cumsum(rows.reshape(-1), 0, out=row_ptr[1:])
        return row_ptr
    first = torch.arange(R, dtype=key.dtype, device=key.device)[:, None] << (bn + bm)
    first = (first | (torch.arange(n, dtype=key.dtype, device=key.device) << bm)).view(-1)  # (R·N,) row keys
    row_ptr[:-1] = torch.searchsorted(key, first, out_int32=True)
    return row_ptr


# -------------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    """`python fastrg.py`: a short self-check (fixed seeds, 5σ bounds from Poisson/binomial variances) that prints
    what it verified."""
    import argparse

    parser = argparse.ArgumentParser(prog="python fastrg.py", description="fastRG (Rohe et al. 2018): a short "
                                     "self-check of the sampler's law, its CSR form and its speed; prints what it "
                                     "verified.")
    parser.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    T, n, m, K = 4000, 5, 6, 3                                       # T independent graphs in one call
    X, Y = torch.rand(n, K, generator=g), torch.rand(m, K, generator=g)
    S = torch.rand(K, K, generator=g)
    batch = (X.expand(T, n, K), S, Y.expand(T, m, K))
    lam = edge_probability(X, S, Y, dedup=False)[0]                  # (N, M)
    L = float(lam.sum())

    r, i, j = sample(*batch, generator=g, dedup=False)
    per_graph = torch.bincount(r, minlength=T).double()              # (T,) each Poisson(Σλ)
    z = (float(per_graph.mean()) - L) / math.sqrt(L / T)
    print(f"edges per graph over {T} graphs: mean {float(per_graph.mean()):.3f}, "
          f"variance {float(per_graph.var()):.3f}, Σλ = {L:.3f} (mean z = {z:+.2f})")
    assert abs(z) < 5
    c = torch.bincount(i * m + j, minlength=n * m).view(n, m).double()  # Poisson(T·λ) per pair
    z = float(((c - T * lam) / (T * lam).sqrt()).abs().max())
    print(f"multigraph: copies per pair match T·λ, max |z| = {z:.2f} over {n * m} pairs")
    assert z < 5

    _, i, j = sample(*batch, generator=g)
    c = torch.bincount(i * m + j, minlength=n * m).view(n, m).double()  # Binomial(T, 1 − e^(−λ)) per pair
    p = -torch.expm1(-lam)
    z = float(((c - T * p) / (T * p * (1 - p)).sqrt()).abs().max())
    top = int(lam.argmax())
    print(f"dedup: pair frequencies match 1 − e^(−λ), max |z| = {z:.2f}; at the largest λ = "
          f"{float(lam.view(-1)[top]):.3f}: frequency {float(c.view(-1)[top]) / T:.3f}, "
          f"1 − e^(−λ) = {float(p.view(-1)[top]):.3f}")
    assert z < 5

    hard = torch.eye(2).repeat_interleave(3, 0)                      # 6 nodes, clusters {0,1,2} and {3,4,5}
    off = torch.tensor([[0.0, 2.0], [0.7, 0.0]])                     # zero diagonal: within-cluster λ = 0
    _, i, j = sample(hard.expand(T, 6, 2), off, hard.expand(T, 6, 2), generator=g, dedup=False)
    within = int(((i < 3) == (j < 3)).sum())
    print(f"joint (u, v) pairing: zero-diagonal block matrix gave {len(i)} edges, {within} within a cluster")
    assert within == 0

    Xb, Yb = torch.rand(2, 3, 40, 8, generator=g), torch.rand(2, 3, 50, 8, generator=g)
    Sb = torch.rand(3, 8, 8, generator=g) * 0.05                     # one block matrix per head, shared
    coo = sample(Xb, Sb, Yb, generator=torch.Generator().manual_seed(7))
    r, i, j, row_ptr = sample(Xb, Sb, Yb, generator=torch.Generator().manual_seed(7), csr=True)
    assert all(torch.equal(a, b) for a, b in zip(coo, (r, i, j)))
    assert torch.equal(torch.repeat_interleave(torch.arange(6 * 40), row_ptr.diff()), r * 40 + i)
    print(f"CSR: {len(r)} edges in 2×3 broadcast graphs, row_ptr consistent with COO; same seed, same graph")

    X, Y = torch.rand(4096, 128, generator=g), torch.rand(4096, 128, generator=g)
    S = torch.rand(128, 128, generator=g)
    S *= 0.01 * 4096 * 4096 / float(expected_edges(X, S, Y))
    t0 = time.perf_counter()
    r, _, _, _ = sample(X, S, Y, generator=g, csr=True)
    print(f"n = m = 4096, K = 128, density 1%: {len(r)} edges (dedup, CSR) in "
          f"{(time.perf_counter() - t0) * 1e3:.0f} ms")
    print("fastrg self-check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
