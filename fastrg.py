"""fastRG: sample sparse random graphs whose expectation is low rank, X S Yᵀ, in time linear in the edges.

What
----
A batched, exact sampler for the directed (bipartite, n × m) "random dot product"/SBM graph of Rohe, Tao,
Han, Binkiewicz, "A Note on Quickly Sampling a Sparse Matrix with Low Rank Expectation", JMLR 19(77), 2018,
used as Algorithm 1 of the SBM-Transformer paper (Cho et al., "Transformers meet Stochastic Block Models",
NeurIPS 2022, §4.1, Eq. 8; papers/000). Inputs are non-negative memberships X (n × K), Y (m × K) and a
non-negative block matrix S (K × K). Per graph the cost is O((n + m)K + K² + E) memory and
O((n + m)K + K² + E) time (guide-table lookups; plus one radix sort of the edges for dedup/CSR), where E is
the number of edges drawn: no n × m matrix is ever formed.

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
       a guide table (Chen and Asau 1974): bucket ⌊U·G⌋ of a CDF row names the first candidate index, which
       settles about half of the draws; the rest bisect their bucket. A constant number of gathers per edge,
       no search over the whole table. Sources are drawn with the edges grouped by (r, u), destinations
       grouped by (r, v), so consecutive lookups stay in one cached CDF row and nothing is sorted.
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
  one positive total keeps the row non-decreasing. A draw is U ∈ [0, 1) on the 2⁻⁵³ grid (`torch.rand` in
  float64) and picks the first entry strictly above U: always in range (the last entry is 1 > U, no clamp,
  no tail case) and never an index of zero weight (its entry equals its predecessor's). The guide bucket
  ⌊U·G⌋ is exact because G is a power of two. Probabilities are resolved to 2⁻⁵³ ≈ 1e-16.
* Sorting. With `dedup=True` or `csr=True` the edges are deduplicated and grouped by (r, i, j) with one sort
  of the integer key r·2^(bn+bm) + i·2^bm + j (bn, bm = bits of n − 1, m − 1; power-of-two fields decode
  with shifts, not divisions). The key must fit int64: `sample` raises ValueError when R·2^(bn+bm) > 2⁶³
  (R·n·m ≥ 2⁶¹ may hit it). With `dedup=False, csr=False` this sort is skipped and the edge order is
  unspecified.
* Gradients do not flow through sampling: the outputs are integer indices. A straight-through estimator
  (SBM paper Eq. 9) recomputes the probability of each sampled edge, e.g. p_e = X[r, i] · (S[r] Y[r, j]),
  with autograd outside this module.

Use in SBM-Transformer
----------------------
X = Q̂ (B, H, N, K), S = Ŝ (H, K, K) (broadcast over the batch), Y = K̂ (B, H, M, K): R = B·H graphs, graph
r = b·H + h; up to N = M = 16384, K = 128. Per graph and side the tables keep 12·K·N bytes (float64 CDF,
int32 guide) and need about 32·K·N while built (≈ 50 MB kept, 130 MB transient at N = M = 16384, K = 128),
plus ~70 bytes per drawn edge while sampling. `csr=True` returns the edges grouped by flattened query row
q = r·N + i with offsets `row_ptr`, so a sparse attention needs no sort of its own. Random edge exploration
(+δ, SBM §4.2) is exactly λ + δ with X' = [X, 1], Y' = [Y, 1], S' = blockdiag(S, δ).

Run `python fastrg.py` for a short self-check.

Shape legend: R graphs (flattened leading dims), N = n rows of X (queries), M = m rows of Y (keys),
K clusters, E edges.
"""
from __future__ import annotations

import math
import time

import torch

__all__ = ["sample", "expected_edges", "edge_probability"]

_WORK = torch.float64  # CDFs and rates: a float32 prefix sum over 16384 rows may drift by up to n·2⁻²⁴ ≈ 1e-3
_MAX_EXPECTED_EDGES = 2.0**53  # Poisson counts are drawn as float64 and must be exact integers


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
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} must be finite, found NaN or inf")
    if t.dtype != torch.bool and bool((t < 0).any()):
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


def _guide_size(n: int) -> int:
    """G: buckets per CDF row of the guide table, the largest power of two ≤ n (≤ 2 CDF entries per bucket)."""
    return 1 << (n.bit_length() - 1)


def _cdf_table(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse-CDF tables of every column of W (R, n, K) → (cdf (R·K·n,), guide (R·K·(G+1),), totals (R, K)).

    Row o = r·K + u of `cdf` is the CDF of column u of graph r, float64. From the first index where the prefix
    sum reaches its total the CDF is exactly 1 (C/C = 1); division by one positive total keeps it monotone.
    Row o of `guide` (Chen and Asau's guide table) holds, for b = 0…G, the first index whose CDF exceeds b/G,
    i.e. the number of entries with CDF ≤ b/G = the number with ⌈CDF·G⌉ ≤ b. G is a power of two, so CDF·G is
    exact and the guide is exact: a counting pass (bincount, cumsum), no search.
    """
    R, n, K = W.shape
    G = _guide_size(n)
    C = W.cumsum(1, dtype=_WORK)                                     # (R, N, K) inclusive prefix sums
    totals = C[:, -1, :]                                             # (R, K) column sums cx
    safe = torch.where(totals > 0, totals, torch.ones_like(totals))  # empty columns draw no edge; avoid 0/0
    cdf = torch.empty(R, K, n, dtype=_WORK, device=W.device)         # (R, K, N) contiguous: rows are CDFs
    torch.div(C.transpose(1, 2), safe[:, :, None], out=cdf)
    bucket = cdf.mul(G).ceil_().to(torch.int64)                      # (R, K, N) ⌈CDF·G⌉ ∈ [0, G]
    bucket += torch.arange(0, R * K * (G + 1), G + 1, device=W.device).view(R, K, 1)
    guide = torch.bincount(bucket.view(-1), minlength=R * K * (G + 1)).view(R * K, G + 1).cumsum(1)
    return cdf.view(-1), guide.to(torch.int32).view(-1), totals


def _draw(cdf: torch.Tensor, guide: torch.Tensor, rows: torch.Tensor, n: int,
          generator: torch.Generator | None) -> torch.Tensor:
    """One inverse-CDF draw per entry of `rows` (E,), each in [0, n), from that row of the table."""
    U = torch.rand(rows.shape, dtype=_WORK, device=rows.device, generator=generator)  # multiples of 2⁻⁵³
    return _locate(cdf, guide, rows, U, n)


def _locate(cdf: torch.Tensor, guide: torch.Tensor, rows: torch.Tensor, U: torch.Tensor, n: int) -> torch.Tensor:
    """Index i in [0, n) of the first entry of CDF row `rows` strictly above U ∈ [0, 1): inverse-CDF sampling.

    With b = ⌊U·G⌋ (exact), the answer lies in [guide[b], guide[b + 1]]: every entry before guide[b] is
    ≤ b/G ≤ U, and entry guide[b + 1] exceeds (b + 1)/G > U (past the row's end, n − 1 holds CDF 1 > U). The
    first candidate settles most draws with one gather (≤ 2 entries per bucket on average); the rest bisect
    their bucket, all at once, for as many rounds as the widest bucket needs. No sort and no search over the
    whole table: a constant number of gathers per edge. An index of zero weight repeats its predecessor's
    CDF, so it is never the first one above U.
    """
    G = _guide_size(n)
    slot = (U * G).long().add_(rows, alpha=G + 1)                   # (E,) flat guide position of bucket b
    base = rows * n                                                  # (E,) flat start of each CDF row
    i = guide.take(slot).long()                                      # (E,) guide[b]
    rest = (cdf.take(base + i) <= U).nonzero().squeeze(1)           # draws beyond the bucket's first entry
    if len(rest) == 0:
        return i
    lo = i.take(rest).add_(1)
    hi = guide.take(slot.take(rest).add_(1)).long().clamp_(max=n - 1)  # cdf[hi] > U: the answer is in [lo, hi]
    u, start = U.take(rest), base.take(rest)
    for _ in range(int((hi - lo).max()).bit_length()):              # bisection: each round halves [lo, hi]
        mid = (lo + hi) >> 1
        above = cdf.take(start + mid) > u
        hi = torch.where(above, mid, hi)
        lo = torch.where(above, lo, mid + 1)
    i[rest] = lo
    return i


def _to_uv_order(values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Reorder per-edge values from (r, v, u) group order to (r, u, v) group order, keeping order within groups.

    counts (R, K, K) holds N[r, u, v]. Group (r, u, v) starts at start_uv in the target order and at start_vu
    in the source order, so its k-th edge moves by start_uv − start_vu: one scatter whose writes are runs of
    consecutive positions.
    """
    E = len(values)
    start_uv = counts.view(-1).cumsum(0).sub_(counts.view(-1)).view(counts.shape)   # (R, K, K) [r, u, v]
    counts_vu = counts.transpose(1, 2).contiguous()                                 # (R, K, K) [r, v, u]
    start_vu = counts_vu.view(-1).cumsum(0).sub_(counts_vu.view(-1))               # (R·K·K,) [r, v, u]
    shift = start_uv.transpose(1, 2).reshape(-1).sub_(start_vu)                    # (R·K·K,) [r, v, u]
    target = torch.repeat_interleave(shift, counts_vu.view(-1), output_size=E)
    target += torch.arange(E, device=values.device)
    return torch.empty_like(values).scatter_(0, target, values)


def _empty(R: int, n: int, device: torch.device, csr: bool) -> tuple[torch.Tensor, ...]:
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
    cx = _flat(X, lead).sum(1, dtype=_WORK)                          # (R, K)
    cy = _flat(Y, lead).sum(1, dtype=_WORK)                          # (R, K)
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
    lead, R, n, m, K = _validate(X, S, Y, key_needed=dedup or csr)
    device = X.device
    if generator is not None and generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device}, inputs on {device}")
    if R * n * m * K == 0:
        return _empty(R, n, device, csr)

    cdf_x, guide_x, cx = _cdf_table(_flat(X, lead))                  # (R·K·N,), (R·K·(G+1),), (R, K)
    cdf_y, guide_y, cy = _cdf_table(_flat(Y, lead))                  # (R·K·M,), (R·K·(G+1),), (R, K)
    rates = cx[:, :, None] * _flat(S, lead).to(_WORK) * cy[:, None, :]  # (R, K, K) B̄: expected edges per (u, v)
    total = float(rates.sum())
    if not total < _MAX_EXPECTED_EDGES:
        raise ValueError(f"expected number of edges {total:.3g} is not finite or too large (limit 2^53); "
                         f"scale down X, S or Y")
    counts = torch.poisson(rates, generator=generator).to(torch.int64)  # (R, K, K) N[r, u, v]
    E = int(counts.sum())
    if E == 0:
        return _empty(R, n, device, csr)

    # Sources are drawn in (r, u, v) edge order and destinations in (r, v, u) order, so each side's lookups
    # run row by row through its CDF table (one 8·n-byte row stays in cache) without sorting anything. Edges
    # of one (r, u, v) group are exchangeable, so pairing its k-th source with its k-th destination keeps the
    # law exact; `_to_uv_order` moves the destinations to the sources' order.
    rows = torch.arange(R * K, device=device)                      # (R·K,) CDF row r·K + u (or r·K + v)
    i = _draw(cdf_x, guide_x, torch.repeat_interleave(rows, counts.sum(2).view(-1), output_size=E), n, generator)
    del cdf_x, guide_x
    j = _draw(cdf_y, guide_y, torch.repeat_interleave(rows, counts.sum(1).view(-1), output_size=E), m, generator)
    del cdf_y, guide_y
    j = _to_uv_order(j, counts)
    per_graph = counts.view(R, K * K).sum(1)                         # (R,) edges per graph
    graph = torch.arange(R, device=device)
    if not (dedup or csr):
        return torch.repeat_interleave(graph, per_graph, output_size=E), i, j

    bm, bn = _bits(m), _bits(n)
    key = torch.repeat_interleave(graph << (bn + bm), per_graph, output_size=E)  # (E,) r·2^(bn+bm) + i·2^bm + j
    key |= i << bm
    key |= j
    del i, j
    key = torch.sort(key).values                                    # the one sort: groups by (r, i), then j
    if dedup:
        key = torch.unique_consecutive(key)
    r = key >> (bn + bm)
    i = (key >> bm) & ((1 << bn) - 1)
    j = key & ((1 << bm) - 1)
    if not csr:
        return r, i, j
    row_ptr = torch.zeros(R * n + 1, dtype=torch.int64, device=device)
    torch.cumsum(torch.bincount(r * n + i, minlength=R * n), 0, out=row_ptr[1:])
    return r, i, j, row_ptr


# -------------------------------------------------------------------------------------------------- main
def main() -> None:
    """Short self-check (fixed seeds, 5σ bounds from Poisson/binomial variances); prints what it verified."""
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


if __name__ == "__main__":
    main()
