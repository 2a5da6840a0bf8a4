"""fastRG: sample sparse random graphs whose expectation is low rank, X S Yᵀ, in time linear in the edges.

Rohe, Tao, Han, Binkiewicz, "A Note on Quickly Sampling a Sparse Matrix with Low Rank Expectation", JMLR 19(77),
2018, arXiv 1703.02998; Algorithm 1 of SBM-Transformer (Cho et al., NeurIPS 2022, arXiv 2210.15541,
§4.1, Eq. 8).
Inputs: non-negative memberships X (n × K), Y (m × K) and a block matrix S (K × K); leading dims broadcast and
are flattened into R graphs; X or Y may come as a tuple of parts (n × K_a), their concatenation along K, which
the samplers never form. With λ = X S Yᵀ, λ_ij = Σ_uv X_iu S_uv Y_jv:
* multigraph (dedup=False): edge (i, j) has Poisson(λ_ij) copies, independently, so E[A] = X S Yᵀ exactly;
* simple graph (dedup=True, default): copies merged, P(edge i→j) = 1 − e^{−λ_ij}, independently. The SBM paper
  writes E[M] = λ, true only for small λ (at λ = 1 the edge probability is 0.632); `edge_probability` is exact.
How: split each count by cluster pair (u, v) (Poisson splitting). Pair (u, v) has Poisson(B̄_uv) edges,
B̄ = diag(1ᵀX) S diag(1ᵀY), each with source i ~ column u of X̄ = X diag(1ᵀX)⁻¹ and destination j ~ column v
of Ȳ = Y diag(1ᵀY)⁻¹. `sample_reference` is exactly that, line by line; `sample` draws the same law, batched.
Cost per graph, E edges drawn: O((n + m)K + K² + E log n) time, plus one sort of the edges for dedup/CSR, and
O(K² + E) memory beside one block of CDF rows (at most a graph's n × K), graphs a chunk at a time; no n × m matrix.

    python fastrg.py                                # a short self-check of the law; prints what it verified
    python -m pytest -q tests/test_fastrg.py        # the law (5σ Monte Carlo), structure, edge cases, errors
    python -m experiments.fastrg_bench                    # time against edges, beside the naive dense draw

Shape legend: R graphs (flattened leading dims), N = n rows of X (queries), M = m rows of Y (keys), K clusters,
E edges.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time

import numpy as np
import torch

__all__ = [
    "sample_reference",
    "sample",
    "sample_block_csr",
    "expected_edges",
    "edge_probability",
    "one_thread",
    "sort_integers",
    "count_integers",
    "host_syncs",
]

Factor = torch.Tensor | tuple[torch.Tensor, ...]  # X or Y: a tensor, or its parts along K (never concatenated)
_WORK = torch.float64  # rates, CDFs: float32 running sums drift (n = 16384: 2% of an even entry's mass, +33% on a tail)


# ------------------------------------------------------------------------------ reference: Algorithm 1
def sample_reference(
    X: Factor, S: torch.Tensor, Y: Factor, *, generator: torch.Generator | None = None, dedup: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rohe et al.'s Algorithm 1 in plain torch (the SBM paper's (Y, B, Z) are X, S, Y here), for one graph or a
    batch: edges (r, i, j) from the law of `sample` (not the same draws), sorted by (r, i, j) when dedup=True.
    O(E·(n + m)) memory: for tests and small graphs."""
    lead, R, n, m, K = _validate(X, S, Y, key_needed=False)
    X, S, Y = (_joined(t, lead).to(_WORK) for t in (X, S, Y))  # (R, N, K), (R, K, K), (R, M, K)
    cx, cy = X.sum(1), Y.sum(1)  # (R, K) column sums 1ᵀX, 1ᵀY
    # Line 1 writes D_Y = diag(1ᵀY)⁻¹, a typo: with it lines 2-3 would neither normalise X nor rescale S.
    X_bar = X / cx[:, None, :]  # (R, N, K) line 2: columns sum to 1
    Y_bar = Y / cy[:, None, :]  # (R, M, K) (an empty column: NaN, never drawn)
    B_bar = cx[:, :, None] * S * cy[:, None, :]  # (R, K, K) line 3: B̄ = diag(1ᵀX) S diag(1ᵀY)
    # Lines 4 and 7 draw one Poisson(Σ B̄) total, then a pair (u, v) ∝ B̄_uv per edge: by Poisson splitting that is
    # the same law as one independent Poisson(B̄_uv) count per cluster pair, drawn here.
    counts = torch.poisson(B_bar, generator=generator).long()  # (R, K, K) edges of each (r, u, v)
    groups = torch.arange(R * K * K, device=counts.device).repeat_interleave(counts.view(-1))  # (E,) flat (r, u, v)
    r, u, v = torch.unravel_index(groups, (R, K, K))  # (E,) each edge's graph and cluster pair
    # Lines 8-9: each edge draws its source from column u of X̄ and its destination from column v of Ȳ, with its
    # own (u, v). (The official code draws sources grouped by u and destinations grouped by v, then zips the two
    # lists position-wise: that breaks the (u, v) pairing.)
    i, j = r.clone(), r.clone()
    if len(r):
        i = torch.multinomial(X_bar[r, :, u], 1, generator=generator).view(-1)  # (E, N) rows → (E,)
        j = torch.multinomial(Y_bar[r, :, v], 1, generator=generator).view(-1)  # (E, M) rows → (E,)
    key = (r * n + i) * m + j  # (E,) edge (r, i, j) as one integer
    if dedup:  # line 10 sets M_IJ = 1: copies merged
        key = torch.unique(key)
    return key // (n * m), key // m % n, key % m


def edge_probability(X: Factor, S: torch.Tensor, Y: Factor, dedup: bool = True) -> torch.Tensor:
    """The law, as a dense exact (R, n, m) float64 matrix: P(edge) = 1 − exp(−λ) if dedup, else E[#copies] = λ =
    X S Yᵀ. O(R·n·m) memory: for tests and small cases."""
    lead, R, n, m, K = _validate(X, S, Y, key_needed=False)
    X, S, Y = (_joined(t, lead).to(_WORK) for t in (X, S, Y))
    lam = X @ S @ Y.transpose(1, 2)  # (R, N, M)
    return -torch.expm1(-lam) if dedup else lam


def expected_edges(X: Factor, S: torch.Tensor, Y: Factor) -> torch.Tensor:
    """Σ_ij λ_ij = (1ᵀX) S (Yᵀ1) per graph, float64 (R,), in O((n + m)K + K²): the expected number of multigraph
    edges, Algorithm 1's 1 B̄ 1ᵀ (line 4); with dedup the expected count is Σ(1 − e^{−λ}), less."""
    lead, R, n, m, K = _validate(X, S, Y, key_needed=False)
    cx, cy = _Factor.flat(X, lead).column_sums(), _Factor.flat(Y, lead).column_sums()  # (R, K)
    return torch.einsum("ru,ruv,rv->r", cx, _flat(S, lead).to(_WORK), cy)


# ------------------------------------------------------------------------------------------- fast path
# The same law for all R graphs at once, in time linear in the edges:
#   1. the counts N[r, u, v] ~ Poisson(B̄[r, u, v]) of every graph and cluster pair, in one call (_counts);
#   2. graphs a chunk at a time, about _EDGES edges a chunk (_chunks), so that per-edge buffers stay bounded;
#   3. in a chunk, sources by inverse-CDF sampling of column u of X[r], the edges in (r, u, v) order, a block of
#      CDF rows at a time (_blocks: a graph's K columns, or a few small graphs; rows that no edge draws from are
#      not built), so that no (R, K, N) table is formed; destinations likewise from column v of Y[r], drawn in
#      (r, v, u) order and moved to their source's place (_uv_shift);
#   4. with dedup or csr, one sort of integer keys (r, i, j) a chunk (_sorted_key).
# The draws are a fixed function of the generator's state: same generator, same graph, on any thread count.
_MAX_EXPECTED_EDGES = 2.0**53  # Poisson counts are drawn as float64 and must be exact integers
_EDGES = 1 << 20  # edges a chunk of graphs (at least one graph): ~12 bytes of temporaries an edge
_BLOCK = 1 << 19  # CDF entries a block (4 MiB of float64): at n = 8192 a third of a graph's K = 128 columns
_COPY_ROWS = 64  # fewest CDF rows a block: the transposing copy is fastest over all of a graph's K = 128 columns
_GAP = 1 << 16  # CDF entries of rows without draws between two rows with draws above which a block is cut
_GUIDE = 1 << 18  # CDF entries counted at a time in a full guide table: bounded temporaries
_CHUNK = 1 << 16  # draws looked up at a time in a block: bounded temporaries (~40 bytes a draw)
_FEW = 8  # draws a side up to which each drawn row is searched alone (_draw_few): the sampler 1.6× faster on a
# near-empty graph (3 edges, n = 8192, K = 128; results/notes/fastrg_parts.md)
GPU_CHUNKS = 64  # _EDGES, _BLOCK, _GAP, _GUIDE, _CHUNK (and SBM-Transformer's CHUNK, BLOCK) × this off the CPU, where
# an op costs a kernel launch and a size read a host sync: SBM's step at 2,048 tokens makes 25× fewer ops (3× at 1%
# density) for 1.2-1.9× the peak memory, the same bits (tests/test_devices.py; figures: results/gpu/README.md)


def host_syncs(device: torch.device) -> bool:
    """Whether reading a tensor's data on the host waits for `device` (every device but the CPU). There the fast path
    reads the sampled sizes once (_counts), cuts its work at whole graphs, and flags duplicates rather than merging
    them, so that no size is read again; on the CPU, where reads are free, it merges, and cuts at whole rows."""
    return device.type != "cpu"


def chunk_size(size: int, device: torch.device) -> int:
    """A bounded size (edges, draws or entries a chunk) on `device`: as set on the CPU, GPU_CHUNKS× elsewhere."""
    return size * GPU_CHUNKS if host_syncs(device) else size


@contextlib.contextmanager
def one_thread():
    """Run the block with one torch intra-op thread, restoring the count on exit (the count is per process: other
    Python threads' torch ops run on one thread meanwhile). The sampler is many mid-sized ops, and with several
    threads on a shared CPU each op waits at a barrier for a descheduled thread. Without this scope, at n = 1024-
    8192, K = 128, densities 0.1-10% on 2 cores, 2 threads took down to 0.73× the one-thread time on a quiet
    machine but 1.6-31× beside a busy process on each core (results/notes/thread_cost.md). The graph drawn
    does not depend on the thread count."""
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads > 1:
            torch.set_num_threads(threads)


@one_thread()
def sample(
    X: Factor,
    S: torch.Tensor,
    Y: Factor,
    *,
    generator: torch.Generator | None = None,
    dedup: bool = True,
    csr: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Draw one graph per (broadcast) leading index: edges (r, i, j), or (r, i, j, row_ptr) with csr=True.

    X (..., n, K), S (..., K, K), Y (..., m, K), all non-negative and finite; leading dims broadcast and are
    flattened (row-major) into R graphs, R = 1 for 2-D inputs. X or Y may be a tuple of parts (..., n, K_a) with
    Σ K_a = K, read as their concatenation along K (never formed); each part broadcasts on its own. Returns
    three 1-D int64 tensors of equal length E on X's device: graph r ∈ [0, R), source i ∈ [0, n), destination
    j ∈ [0, m).
    The count of edge (r, i, j) is Poisson(λ) with λ = (X S Yᵀ)[r, i, j]; with dedup=True duplicates are
    merged, so P(edge) = 1 − exp(−λ). csr=True sorts the edges by (r, i, j) and adds row_ptr (R·n + 1,): the
    edges of flattened row q = r·n + i are [row_ptr[q], row_ptr[q+1]). dedup=True also returns them sorted;
    dedup=False, csr=False leaves them unsorted. All randomness comes from `generator` (on X's device) when
    given. Runs with one intra-op thread (one_thread). Off the CPU dedup=True reads the number of distinct edges
    (a host sync beside the sampler's one read; sample_block_csr flags instead).
    """
    if not (dedup or csr):
        R, n, m, X, Y, counts, sources, destinations = _counts(X, S, Y, generator, key_needed=False)
        device = S.device  # validated: X, S, Y on one device
        if counts is None:
            return _empty(R, n, device, csr)
        K, per_graph = counts.shape[1], sources.reshape(R, -1).sum(1)  # (R,) edges of each graph, on the host
        E = int(per_graph.sum())
        r = torch.repeat_interleave(torch.arange(R, device=device), counts.view(R, -1).sum(1), output_size=E)
        i, j = torch.empty_like(r), torch.empty_like(r)
        streams = _uniforms(generator, device), _uniforms(generator, device)
        for r0, r1, e0, e1 in _chunks(per_graph, device):
            rows = sources[r0 * K : r1 * K], destinations[r0 * K : r1 * K]
            i[e0:e1], j[e0:e1] = _draw_chunk(X[r0:r1], Y[r0:r1], counts[r0:r1], rows, *streams)
        return r, i, j
    R, n, m, key, first, _ = _sorted_key(X, S, Y, generator, dedup)
    if key is None:
        return _empty(R, n, S.device, csr)
    if first is not None:
        key = key[first]
    bn, bm = _bits(n), _bits(m)
    key = key.long()
    r = key >> (bn + bm)
    i = (key >> bm) & ((1 << bn) - 1)
    j = key & ((1 << bm) - 1)
    if not csr:
        return r, i, j
    return r, i, j, _row_ptr(key, R, n, bm).long()


@one_thread()
def sample_block_csr(X: Factor, S: torch.Tensor, Y: Factor, *, generator: torch.Generator | None = None) -> tuple:
    """The simple graphs of `sample(X, S, Y, dedup=True)` as one block-diagonal (R·n) × (R·m) matrix in CSR
    form: (row_ptr (R·n + 1,), col (E,), first, graph_ptr), row_ptr and col int32 (the index type of the sparse
    BLAS kernels). The edges of row q = r·n + i are col[row_ptr[q]:row_ptr[q + 1]], sorted, with col = r·m + j;
    P(edge) = 1 − exp(−λ). On the CPU first and graph_ptr are None; off it the sizes are those of the sampler's one
    read (a multigraph's): a pair's repeats stay in place, first (E,) bool marks each pair's first copy, and
    graph_ptr (R + 1,) NumPy int64 is row_ptr at each graph's first row, on the host. The same draw as
    `sample(..., csr=True)` under the same generator (its edges where first is set), without the per-edge (r, i, j).
    SBM-Transformer calls it with X = Q̂ (B, H, N, K), S = Ŝ (H, K, K), Y = K̂ (B, H, M, K): graph r = b·H + h.
    Its random edge exploration (+δ, §4.2) is exactly λ + δ with X' = [X, 1], Y' = [Y, 1], S' = blockdiag(S, δ),
    X' and Y' passed as parts (X, 1), (Y, 1): K̂ is not copied.
    """
    R, n, m, key, first, per_graph = _sorted_key(X, S, Y, generator, dedup=True)
    if key is None:
        empty = torch.zeros(0, dtype=torch.int32, device=S.device)
        flagged = (empty.bool(), np.zeros(R + 1, np.int64)) if host_syncs(S.device) else (None, None)
        return torch.zeros(R * n + 1, dtype=torch.int32, device=S.device), empty, *flagged
    if R * m > 2**31 or len(key) > 2**31:
        raise ValueError(f"R·m = {R * m} columns or {len(key)} edges do not fit int32 indices; split the batch")
    bn, bm = _bits(n), _bits(m)
    row_ptr = _row_ptr(key, R, n, bm)
    step = chunk_size(_EDGES, key.device)
    for a in range(0, len(key), step):  # in place, a chunk at a time: key → r·m + j
        part = key[a : a + step]
        part.copy_((part >> (bn + bm)).mul_(m).add_(part & ((1 << bm) - 1)))
    return row_ptr, key.int(), first, None if first is None else np.r_[0, np.cumsum(per_graph)]


def _counts(X, S, Y, generator, key_needed: bool):
    """Inputs checked and flattened, the edge counts of every graph and cluster pair, and the draws of every CDF row
    on the host: (R, n, m, X (R, N, K), Y (R, M, K) as _Factor, counts (R, K, K) N[r, u, v], sources (R·K,) and
    destinations (R·K,) NumPy int64, the draws of row o = r·K + u of X and of Y); None from X on when no edge is
    drawn. The sampler's one read of the device: the checks' extremes, the expected total and these sums together,
    the checks made on the host after the draw (an invalid rate draws nothing meanwhile)."""
    lead, R, n, m, K = _validate(X, S, Y, key_needed=key_needed, values=False)
    if generator is not None and generator.device.type != S.device.type:
        raise ValueError(f"generator is on {generator.device}, inputs on {S.device}")
    if R * n * m * K == 0:
        return R, n, m, None, None, None, None, None
    X, Y = _Factor.flat(X, lead), _Factor.flat(Y, lead)
    cx, cy = X.column_sums(), Y.column_sums()  # (R, K) 1ᵀX, 1ᵀY
    rates = cx[:, :, None] * (S := _flat(S, lead)).to(_WORK) * cy[:, None, :]  # (R, K, K) B̄: expected edges per (u, v)
    total = rates.sum()
    # Algorithm 1's one Poisson total and a categorical (u, v) per edge (lines 4, 7), as one count per (u, v):
    # equal in law (Poisson splitting), and no loop or `torch.multinomial` category limit.
    rates = torch.where(total < _MAX_EXPECTED_EDGES, rates, 0.0).clamp_(min=0)  # valid rates unchanged
    counts = torch.poisson(rates, generator=generator).to(torch.int64)  # (R, K, K) N[r, u, v]
    # X and Y: a NaN, −inf or negative entry shows in the minimum, a +inf in the column sums; S: its extremes
    low = [torch.stack([p.amin().to(_WORK) for p in t.parts if p.numel()]).amin() for t in (X, Y)]
    checks = [*low, *torch.aminmax(S), torch.isfinite(cx).all(), torch.isfinite(cy).all(), total]
    read = torch.cat([torch.stack([c.to(_WORK) for c in checks]), counts.sum(2).view(-1), counts.sum(1).view(-1)])
    # the read: off the CPU a host sync; a copy (aten._to_copy) on it too, so that an op counter sees it
    (x_low, y_low, s_low, s_high, x_finite, y_finite, total), read = np.split(read.to("cpu", copy=True).numpy(), [7])
    for name, values, finite in (("X", [x_low], x_finite), ("S", [s_low, s_high], 1), ("Y", [y_low], y_finite)):
        _check_values(name, values, finite > 0)
    if not total < _MAX_EXPECTED_EDGES:
        raise ValueError(
            f"expected number of edges {total:.3g} is not finite or too large (limit 2^53); scale down X, S or Y"
        )
    sources, destinations = read.astype(np.int64).reshape(2, R * K)
    if sources.sum() == 0:
        return R, n, m, None, None, None, None, None
    return R, n, m, X, Y, counts, sources, destinations


def _chunks(per_graph: np.ndarray, device: torch.device):
    """Consecutive graph ranges [r0, r1) of about chunk_size(_EDGES) edges (at least one graph each, none without
    edges) of graphs of per_graph (R,) edges, with their edge ranges [e0, e1): yields (r0, r1, e0, e1)."""
    ends, size = np.cumsum(per_graph), chunk_size(_EDGES, device)  # (R,)
    R, r0, e0 = len(per_graph), 0, 0
    while r0 < R:
        r1 = max(r0 + 1, int(np.searchsorted(ends, e0 + size, side="right")))
        e1 = int(ends[r1 - 1])
        if e1 > e0:
            yield r0, r1, e0, e1
        r0, e0 = r1, e1


def _draw_chunk(X: "_Factor", Y: "_Factor", counts: torch.Tensor, rows: tuple, sources, destinations):
    """The multigraph of graphs X (c, n, K), Y (c, m, K) with counts (c, K, K) N[r, u, v]: sources i and
    destinations j, (E,) int32 each, edges in (r, u, v) group order; rows: the draws of each CDF row of X and of Y
    on the host (_counts). Sources are drawn in (r, u) order, column by column, and destinations in (r, v) order;
    the edges of one (r, u, v) group are exchangeable, so pairing the group's k-th source with its k-th destination
    keeps each edge's own (u, v), as the reference does. Each side reads its own stream of uniforms (_uniforms),
    chunk after chunk: chunks change no draw."""
    i = _draw(X, counts.sum(2).view(-1), rows[0], sources)
    j = _draw(Y, counts.sum(1).view(-1), rows[1], destinations, moves=_uv_shift(counts, int(rows[1].sum())))
    return i, j


def _draw(W: "_Factor", per_row: torch.Tensor, host: np.ndarray, uniforms, moves: tuple | None = None) -> torch.Tensor:
    """Inverse-CDF draws from the columns of W (R, n, K): per_row[o] draws (R·K,; `host` its copy on the host) from
    CDF row o = r·K + u, the CDF of column u of W[r], in that order → indices i (E,) int32. With `moves` (shift,
    ends) (_uv_shift), the draws of group g, positions ends[g − 1]..ends[g] − 1, are stored shift[g] further on. A
    block of rows at a time (_blocks): its CDF (_cdf_block), its guide table and its draws.

    The rule is torch.searchsorted(cdf[o], U, right=True) for U ∈ [0, 1) on the 2⁻⁵³ grid: the first entry
    strictly above U. It is always in range (the row's last entry is 1 > U) and never an index of zero weight
    (its entry equals its predecessor's). Guide table (Chen and Asau 1974) and bisection: the bucket ⌊U·G⌋ of
    the row's G-bucket guide names an interval [guide[c], guide[c + 1]] that holds the answer, then a search
    finds it. One thread, K = 128, n = 1024-8192, densities 0.1-10%: 1.8-3.0× (4.6× at n = 8192, 10%) the speed
    of one torch.searchsorted over the table as integer keys o·2⁵⁴ + ⌈CDF·2⁵³⌉, which gives the same draws. A
    full guide (G = L, a counting pass) pays once draws are at least half the entries; below that, G ≈ draws /
    (rows·(b + 1)) buckets. Off the CPU, where the guide's interval sizes would need a read, a bisection of the
    whole row (b steps) finds the same entry.
    """
    n, K = W.shape[1:]
    L = 1 << _bits(n)
    ends = np.cumsum(host)  # (R·K,) each row's last draw + 1
    drawn = torch.empty(int(ends[-1]), dtype=torch.int32, device=W.device)
    if len(drawn) <= _FEW:
        _draw_few(W, host, uniforms, drawn, moves)
        return drawn
    for o0, o1 in _blocks(host, K, L, W.device):
        e0 = int(ends[o0 - 1]) if o0 else 0
        _draw_rows(W, o0, o1, per_row[o0:o1], int(ends[o1 - 1]) - e0, uniforms, drawn, e0, moves)
    return drawn


def _draw_rows(
    W: "_Factor", o0: int, o1: int, per_row: torch.Tensor, E: int, uniforms, drawn: torch.Tensor, e0: int, moves
) -> None:
    """The E draws of CDF rows o0..o1 − 1 of W's columns (_draw): per_row[o − o0] from row o, in order, into
    drawn[e0:], each moved as `moves` says when given."""
    n = W.shape[1]
    b = _bits(n)
    L = 1 << b
    rows, whole = o1 - o0, host_syncs(W.device)
    G = L if 2 * E >= rows * L else max(1, min(L // 2, 1 << (max(E // (rows * (b + 1)), 1).bit_length() - 1)))
    cdf = _cdf_block(W, o0, o1)  # (rows·L,)
    guide = None if whole else _guide_table(cdf, n, G)  # (rows·(G + 1),)
    step, row_ends = L if whole else G + 1, per_row.cumsum(0)  # rows' spacing in the CDF or the guide
    start = torch.arange(0, rows * step, step, dtype=torch.int64 if whole else guide.dtype, device=cdf.device)
    for a in range(0, E, chunk_size(_CHUNK, cdf.device)):
        z = min(a + chunk_size(_CHUNK, cdf.device), E)
        U = uniforms(z - a)  # (chunk,)
        if whole:
            found = _bisect(cdf, _spread(start, row_ends, a, z), U, L, b)
        else:
            slot = (U * G).to(guide.dtype).add_(_spread(start, row_ends, a, z))  # bucket ⌊U·G⌋ (exact: G = 2^k)
            found = _search(cdf, guide.index_select(0, slot), guide.index_select(0, slot.add_(1)), U, L, G == L)
        found = found.bitwise_and_(L - 1)  # (chunk,) entry i in its row
        if moves is None:
            drawn[e0 + a : e0 + z] = found
        else:
            shift, group_ends = moves
            at = _spread(shift, group_ends, e0 + a, e0 + z).add_(
                torch.arange(e0 + a, e0 + z, dtype=shift.dtype, device=shift.device)
            )
            drawn[at] = found.to(torch.int32)


def _draw_few(W: "_Factor", counts: np.ndarray, uniforms, drawn: torch.Tensor, moves: tuple | None) -> None:
    """_draw's draws when they are few (a near-empty graph): each drawn row's CDF alone and torch.searchsorted, the
    same rule on the same CDF values and uniforms, so the same draws, without blocks or guide tables."""
    U, at = uniforms(len(drawn)), 0
    found = torch.empty(len(drawn), dtype=torch.int64, device=drawn.device)
    for o in np.flatnonzero(counts):
        count = int(counts[o])
        found[at : at + count] = torch.searchsorted(_cdf_block(W, o, o + 1), U[at : at + count], right=True)
        at += count
    if moves is None:
        drawn.copy_(found)
    else:
        shift, group_ends = moves
        where = _spread(shift, group_ends, 0, len(drawn)).add_(
            torch.arange(len(drawn), dtype=shift.dtype, device=shift.device)
        )
        drawn[where] = found.to(torch.int32)


def _spread(values: torch.Tensor, ends: torch.Tensor, a: int, z: int) -> torch.Tensor:
    """Positions a..z − 1 (a < z) of repeat_interleave(values, sizes), where `ends` (len(values),) are the running
    sums of the sizes: the slice without the whole, so that no per-draw table is formed. Off the CPU by a search
    on the device, where cutting on the host would read `ends`."""
    if host_syncs(values.device):
        at = torch.arange(a, z, dtype=ends.dtype, device=ends.device)
        return values.index_select(0, torch.searchsorted(ends, at, right=True))
    ends = ends.numpy()
    lo = int(np.searchsorted(ends, a, side="right"))  # the group of position a
    hi = int(np.searchsorted(ends, z - 1, side="right")) + 1  # one past the group of position z − 1
    sizes = np.diff(ends[lo:hi].clip(max=z), prepend=a)  # (hi − lo,) each group's positions in a..z − 1
    return torch.repeat_interleave(values[lo:hi], torch.from_numpy(sizes).to(values.device), output_size=z - a)


def _blocks(per_row: np.ndarray, K: int, L: int, device: torch.device):
    """Row ranges [o0, o1) of a CDF table with rows o = r·K + u of L entries, about chunk_size(_BLOCK) entries each:
    whole graphs when a graph's K rows fit, else a graph's columns in near-equal parts. Only rows with draws are
    built: a block is cut to its runs of such rows, runs apart by fewer than chunk_size(_GAP) entries of rows
    without draws kept together (a block costs about as much as building that many entries), so that a call with
    few edges builds few rows."""
    size, total = max(_COPY_ROWS, chunk_size(_BLOCK, device) // L), len(per_row)
    gap = max(1, chunk_size(_GAP, device) // L)  # chunk_size(_GAP) in rows
    step = size // K * K if size >= K else -(-K // -(-K // size))  # whole graphs, or K in near-equal parts
    used = np.flatnonzero(per_row)  # rows with draws
    if len(used) == total and size >= K:  # every row: the blocks as they are
        yield from ((a, min(a + step, total)) for a in range(0, total, step))
    elif len(used) == total:
        yield from ((r + u, r + min(u + step, K)) for r in range(0, total, K) for u in range(0, K, step))
    elif len(used):
        block = used // step if size >= K else used // K * K + used % K // step
        cut = np.flatnonzero((used[1:] - used[:-1] > gap) | (block[1:] != block[:-1])) + 1
        yield from zip(used[np.r_[0, cut]].tolist(), (used[np.r_[cut, len(used)] - 1] + 1).tolist())


def _cdf_block(W: "_Factor", o0: int, o1: int) -> torch.Tensor:
    """Inverse-CDF rows o0..o1 − 1 of the columns of W (R, n, K), row o = r·K + u the CDF of column u of W[r]
    → (rows·L,) float64, L = 2^b ≥ n (b = bits of n − 1), so a flat index o·L + i splits into row and entry i with
    a shift and a mask; padded with 1 past n. An empty column reads 0 (it is never drawn from)."""
    R, n, K = W.shape
    L = 1 << _bits(n)
    cdf = torch.empty(o1 - o0, L, dtype=_WORK, device=W.device)  # (rows, L)
    for r in range(o0 // K, (o1 - 1) // K + 1):  # the columns, graph by graph
        a, z = max(o0, r * K), min(o1, r * K + K)
        W.columns(r, a - r * K, z - r * K, cdf[a - o0 : z - o0, :n])
    C = cdf[:, :n]
    C.cumsum_(1)  # prefix sums, float64 (see _WORK)
    totals = C[:, -1:].clone()
    # Round-off: from the first index where C reaches its total the entry is exactly 1 (C/C = 1), trailing zero
    # weights included, and dividing by one positive total keeps the row non-decreasing.
    C.div_(torch.where(totals > 0, totals, torch.ones_like(totals)))
    if L > n:
        cdf[:, n:] = 1.0
    return cdf.view(-1)


def _guide_table(cdf: torch.Tensor, n: int, G: int) -> torch.Tensor:
    """Guide table of a CDF block (_cdf_block's) with G buckets per row, G a power of two ≤ L → (rows·(G + 1),).

    guide[o·(G + 1) + c] is the flat index of an entry of row o at or below the first entry above c/G (c < G), and
    guide[o·(G + 1) + G] that of the first entry equal to 1: a draw U ∈ [c/G, (c + 1)/G) has its answer, the
    first entry above U, in [guide[c], guide[c + 1]].
    """
    L = 1 << _bits(n)
    rows = len(cdf) // L
    table = cdf.view(rows, L)
    dtype = _index_dtype(rows * L + 1)  # an empty row's entries may point one past it
    if G == L:
        # Counting: the first entry at or above c/L (c ≥ 1) is the number of entries with ⌊CDF·L⌋ < c (exact: L a
        # power of two), one bincount for a range of rows; for c = 0 the first entry above 0 (a first entry at 0
        # has zero weight, and may start a long run of them). Beside torch.searchsorted of the L levels: the
        # sampler 1.6× faster at n = 4096, density 10%, 2.8× at n = 8192, 1% (results/notes/fastrg_parts.md).
        guide = torch.empty(rows, L + 1, dtype=dtype, device=cdf.device)
        step = max(1, chunk_size(_GUIDE, cdf.device) // L)
        for a in range(0, rows, step):
            z = min(a + step, rows)
            bucket = _scaled_floor(table[a:z, :n], L)  # (rows, N) ⌊CDF·L⌋ ∈ [0, L]
            bucket += torch.arange(0, (z - a) * (L + 1), L + 1, device=cdf.device).view(z - a, 1)
            counts = count_integers(bucket.view(-1), (z - a) * (L + 1)).view(z - a, L + 1)
            torch.cumsum(counts[:, :L], 1, dtype=dtype, out=guide[a:z, 1:])
        guide[:, :1] = torch.searchsorted(
            table, torch.zeros(rows, 1, dtype=_WORK, device=cdf.device), right=True, out_int32=dtype == torch.int32
        )
    else:
        levels = torch.arange(G + 1, dtype=_WORK, device=cdf.device) / G  # c/G exact
        levels[G] = 1 - 2.0**-53  # the last level: the first entry = 1
        guide = torch.searchsorted(
            table, levels.expand(rows, G + 1).contiguous(), right=True, out_int32=dtype == torch.int32
        )
    guide += torch.arange(0, rows * L, L, dtype=dtype, device=cdf.device)[:, None]  # flat indices
    return guide.view(-1)


def _search(cdf: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, U: torch.Tensor, L: int, steps: bool):
    """The first flat index in [lo, hi] whose CDF exceeds U, for draws whose cdf[hi] > U (all (E,)). With `steps`
    (a full guide, whose intervals mostly hold one or two entries) two steps first, which settle most draws, then
    a bisection of the others (the sampler 1.08× faster at n = 4096, density 10%, alike at 1%; its index additions
    are in SBM-Transformer's recorded FLOP counts, which bisecting all would change); else a bisection."""
    if not steps:
        return _bisect(cdf, lo, U, L, int((hi - lo).max()).bit_length() if len(lo) else 0)
    for _ in range(2):
        lo += cdf.index_select(0, lo) <= U  # step past an entry ≤ U
    rest = (cdf.index_select(0, lo) <= U).nonzero().squeeze(1)  # not settled: the answer is in [lo + 1, hi]
    start, hi = lo.index_select(0, rest) + 1, hi.index_select(0, rest)
    span = int((hi - start).max()).bit_length() if len(rest) else 0
    lo[rest] = _bisect(cdf, start, U.index_select(0, rest), L, span)
    return lo


def _bisect(cdf: torch.Tensor, lo: torch.Tensor, U: torch.Tensor, L: int, k: int) -> torch.Tensor:
    """The first flat index in [lo, lo + 2^k − 1] whose CDF exceeds U, for draws whose answer is there, in rows of
    L entries (a power of two): a binary search by steps 2^(k−1), …, 2, 1, all draws at once, four passes a
    round. It starts at lo − 1 (an entry ≤ U, or before the row), moved back where needed so that no step
    leaves the row (the entries it then passes are ≤ U too)."""
    last = torch.minimum(lo - 1, (lo | (L - 1)) + 1 - (1 << k))  # the last entry known ≤ U
    for step in (1 << j for j in reversed(range(k))):
        last.add_(cdf.index_select(0, last + step) <= U, alpha=step)
    return last + 1


def _uv_shift(counts: torch.Tensor, E: int) -> tuple[torch.Tensor, torch.Tensor]:
    """How far the E edges laid out in (r, v, u) group order move to reach (r, u, v) group order, order within a
    group kept: (shift (R·K·K,), ends (R·K·K,) int64), group g = (r, v, u) holding positions
    ends[g − 1]..ends[g] − 1 of the source order. counts (R, K, K) holds N[r, u, v]; group (r, u, v) starts at
    start_uv in the target order and at start_vu in the source order, so its edges move by start_uv − start_vu."""
    start_uv = counts.view(-1).cumsum(0).sub_(counts.view(-1)).view(counts.shape)  # (R, K, K) [r, u, v]
    counts_vu = counts.transpose(1, 2).contiguous()  # (R, K, K) [r, v, u]
    ends_vu = counts_vu.view(-1).cumsum(0)  # (R·K·K,) [r, v, u]
    shift = start_uv.transpose(1, 2).reshape(-1).sub_(ends_vu).add_(counts_vu.view(-1))  # (R·K·K,) [r, v, u]
    return shift.to(_index_dtype(E)), ends_vu


def _sorted_key(X, S, Y, generator, dedup: bool):
    """(R, n, m, key, first, per_graph): the edges as sorted integer keys r·2^(bn+bm) + i·2^bm + j (None when no
    edge is drawn), a chunk of graphs at a time: one sort groups a chunk's edges by (r, i), then j; dedup merges
    repeats on the CPU, off it flags them (first (E,) bool; else None), so that the sizes stay those of the one
    read: per_graph (R,) on the host. Chunks are in graph order, so their keys follow one another in order.

    bn, bm are the bits of n − 1, m − 1: power-of-two fields decode with shifts, not divisions. The key is int32
    when it fits (half the bytes to sort), else int64; `_validate` raises when even int64 is too small."""
    R, n, m, X, Y, counts, sources, destinations = _counts(X, S, Y, generator, key_needed=True)
    if counts is None:
        return R, n, m, None, None, np.zeros(R, dtype=np.int64)
    bn, bm, K = _bits(n), _bits(m), counts.shape[1]
    dtype = _index_dtype(R << (bn + bm))
    per_graph, graphs = sources.reshape(R, K).sum(1), counts.view(R, -1).sum(1)  # (R,) edges of each graph
    total, out, at = int(per_graph.sum()), None, 0
    first = torch.ones(total, dtype=torch.bool, device=X.device) if dedup and host_syncs(X.device) else None
    streams = _uniforms(generator, X.device), _uniforms(generator, X.device)  # of sources, of destinations
    for r0, r1, e0, e1 in _chunks(per_graph, X.device):
        rows = sources[r0 * K : r1 * K], destinations[r0 * K : r1 * K]
        i, j = _draw_chunk(X[r0:r1], Y[r0:r1], counts[r0:r1], rows, *streams)
        key = i.to(dtype).bitwise_left_shift_(bm)  # (E,) in (r, u, v) order; in i's buffer if int32
        del i
        key |= j
        del j
        if r1 - r0 == 1:
            key |= r0 << (bn + bm)
        else:  # several graphs: at most about _EDGES edges
            graph = torch.arange(r0, r1, dtype=dtype, device=key.device) << (bn + bm)
            key |= torch.repeat_interleave(graph, graphs[r0:r1], output_size=e1 - e0)
        key = sort_integers(key)  # the one sort
        if first is not None:  # a chunk starts a graph: its first key is no repeat
            torch.ne(key[1:], key[:-1], out=first[e0 + 1 : e1])
        elif dedup:
            key = torch.unique_consecutive(key)
        if e1 - e0 == total:  # one chunk: no copy
            return R, n, m, key, first, per_graph
        if out is None:  # room for every chunk's keys
            out = torch.empty(total, dtype=dtype, device=key.device)
        out[at : at + len(key)] = key
        at += len(key)
    return R, n, m, out[:at], first, per_graph


def _row_ptr(key: torch.Tensor, R: int, n: int, bm: int) -> torch.Tensor:
    """(R·n + 1,) int32 row offsets of sorted keys (rows q = r·n + i): up to 32 edges a row, a count of the keys
    by row; with more, where each row's first key would go, one search per row. Either alone leaves the sampler's
    speed within 1.05× (results/notes/fastrg_parts.md); the rule stays as SBM-Transformer's recorded FLOP counts
    were made (the count's cumsum is in them, the search is not)."""
    bn = _bits(n)
    row_ptr = torch.full((R * n + 1,), len(key), dtype=torch.int32, device=key.device)
    if len(key) <= 32 * R * n:
        rows = torch.zeros(R << bn, dtype=torch.int64, device=key.device)
        step = max(chunk_size(_EDGES, key.device), R << bn)
        for a in range(0, len(key), step):  # a chunk of keys at a time: no (E,) temporary
            rows += count_integers(key[a : a + step] >> bm, R << bn)
        rows = rows.view(R, 1 << bn)[:, :n]  # (R, n) edges a row
        row_ptr[0] = 0
        torch.cumsum(rows.reshape(-1), 0, out=row_ptr[1:])
        return row_ptr
    first = torch.arange(R, dtype=key.dtype, device=key.device)[:, None] << (bn + bm)
    first = (first | (torch.arange(n, dtype=key.dtype, device=key.device) << bm)).view(-1)  # (R·N,) row keys
    row_ptr[:-1] = torch.searchsorted(key, first, out_int32=True)
    return row_ptr


def _empty(R: int, n: int, device: torch.device, csr: bool) -> tuple[torch.Tensor, ...]:
    """What `sample` returns when no edge is drawn."""
    e = torch.zeros(0, dtype=torch.int64, device=device)
    out = (e, e.clone(), e.clone())
    return out + (torch.zeros(R * n + 1, dtype=torch.int64, device=device),) if csr else out


# ------------------------------------------------------------------------------ CPU primitives
# Steps that torch runs slowly on CPU go through numpy there (same results). Factors: the whole sampler's speed
# (sample_block_csr) against torch's own call, one thread, K = 128, n = 1024-8192, densities 0.1-10% and a
# near-empty graph (results/notes/fastrg_parts.md).
def count_integers(values: torch.Tensor, size: int) -> torch.Tensor:
    """torch.bincount(values, minlength=size) for values < size, int64: off the CPU a scatter-add, as bincount there
    reads the largest value to size its output (a host sync)."""
    if not host_syncs(values.device):
        return torch.bincount(values, minlength=size)
    ones = torch.ones((), dtype=torch.int64, device=values.device).expand(len(values))
    return torch.zeros(size, dtype=torch.int64, device=values.device).index_add_(0, values, ones)


def sort_integers(key: torch.Tensor) -> torch.Tensor:
    """1-D integer keys without gradient, sorted ascending, in place on CPU (numpy's vectorised sort beside
    torch.sort: the sampler 1.2× faster at n = 4096, 1%, 1.8× at 10%, 1.3× at n = 8192, 1%)."""
    if key.device.type == "cpu":
        key.numpy().sort()
        return key
    return torch.sort(key).values


def _uniforms(generator: torch.Generator | None, device: torch.device):
    """A function size → (size,) float64 uniforms in [0, 1) on the 2⁻⁵³ grid, one stream from `generator` (the
    global one when None): on CPU numpy's PCG64 seeded by one draw of the generator, the same however it is cut
    (1.9× torch.rand; the draws behind results/ were made with it), elsewhere torch.rand, whose draws depend on the
    cut (a graph there on chunk_size's sizes, its law not)."""
    if device.type == "cpu":
        stream = np.random.default_rng(int(torch.randint(0, 2**63 - 1, (), generator=generator)))
        return lambda size: torch.from_numpy(stream.random(size))
    return lambda size: torch.rand(size, dtype=_WORK, device=device, generator=generator)


def _scaled_floor(C: torch.Tensor, L: int) -> torch.Tensor:
    """⌊C·L⌋ as int64 for C ≥ 0 (numpy's product cast in one pass: the sampler up to 1.07× faster, n = 4096, 1%;
    torch's product would enter SBM-Transformer's recorded FLOP counts)."""
    if C.device.type == "cpu":
        out = np.empty(C.shape, dtype=np.int64)
        np.multiply(C.numpy(), L, out=out, casting="unsafe")  # a C cast truncates: ⌊·⌋ for C ≥ 0
        return torch.from_numpy(out)
    return (C * L).long()


def _column_sums(W: torch.Tensor) -> torch.Tensor:
    """(R, n, K) → (R, K) float64 column sums (numpy's adds rows in one pass: the sampler 1.5× faster on a
    near-empty graph at n = 8192, K = 128, and the sums, rounded unlike torch's, are those of the draws behind
    results/)."""
    if W.device.type == "cpu" and W.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(W.numpy().sum(axis=1, dtype=np.float64))
    return W.sum(1, dtype=_WORK)


def _columns(W: torch.Tensor, u0: int, u1: int, out: torch.Tensor) -> None:
    """Columns u0..u1 − 1 of W (n, K) as rows: out (u1 − u0, n) float64 ← W[:, u0:u1]ᵀ, one transposing, converting
    copy. On CPU numpy's, a tile of rows at a time so that its source and destination stay in the L1 cache
    (beside torch's strided copy, K = 128: the sampler 1.15× faster at n = 4096, 1%, 1.13× at n = 8192, 1%)."""
    if W.device.type == "cpu" and W.dtype in (torch.float32, torch.float64):
        n, tile = W.shape[0], max(64, 8192 // (u1 - u0))  # 64 rows of 128 columns: 32 KiB of float32
        source, target = W.numpy(), out.numpy()
        for a in range(0, n, tile):
            target[:, a : a + tile] = source[a : a + tile, u0:u1].T
    else:
        out.copy_(W[:, u0:u1].t())


# ------------------------------------------------------------------------------ inputs
def _check_factor(name: str, t) -> None:
    """Type and rank of one input; values are checked later, after the cheap shape checks."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_complex():
        raise ValueError(f"{name} must be real, got dtype {t.dtype}")
    if t.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dims (..., rows, K), got shape {tuple(t.shape)}")


def _check_values(name: str, values, finite: bool = True) -> None:
    """A factor's extremes (a NaN propagates to both ends of aminmax, an infinity shows at one of them), and whether
    the rest of it is finite; bool and empty tensors have no extremes to check."""
    values = [float(v) for v in values]
    if not (finite and all(math.isfinite(v) for v in values)):
        raise ValueError(f"{name} must be finite, found NaN or inf")
    if values and min(values) < 0:
        raise ValueError(f"{name} must be non-negative, found a negative entry")


def _validate(X, S, Y, key_needed: bool, values: bool = True) -> tuple[tuple[int, ...], int, int, int, int]:
    """Check all inputs (with values=False their shapes alone: _counts checks the values from its one read); return
    (leading shape, R, n, m, K). X and Y may come in parts along K (a tuple of tensors, _Factor)."""
    factors = {"X": _parts(X), "S": (S,), "Y": _parts(Y)}
    for name, parts in factors.items():
        if not parts:
            raise ValueError(f"{name} must be a torch.Tensor or a tuple of them, got an empty tuple")
        for t in parts:
            _check_factor(name, t)
        if len({t.shape[-2] for t in parts}) > 1:
            raise ValueError(f"the parts of {name} must have the same rows, got {[tuple(t.shape) for t in parts]}")
    (X, *_), (Y, *_) = factors["X"], factors["Y"]
    K = sum(t.shape[-1] for t in factors["X"])
    if S.shape[-2:] != (K, K):
        raise ValueError(f"S must have shape (..., K, K) with K = X.shape[-1] = {K}, got {tuple(S.shape)}")
    if sum(t.shape[-1] for t in factors["Y"]) != K:
        raise ValueError(
            f"Y must have shape (..., m, K) with K = X.shape[-1] = {K}, got {[tuple(t.shape) for t in factors['Y']]}"
        )
    devices = {t.device for parts in factors.values() for t in parts}
    if len(devices) > 1:
        raise ValueError(f"X, S, Y must be on one device, got {sorted(map(str, devices))}")
    try:
        lead = tuple(torch.broadcast_shapes(*(t.shape[:-2] for parts in factors.values() for t in parts)))
    except RuntimeError:
        raise ValueError(
            f"leading dims of X {tuple(X.shape[:-2])}, S {tuple(S.shape[:-2])} and "
            f"Y {tuple(Y.shape[:-2])} do not broadcast"
        ) from None
    R, n, m = math.prod(lead), X.shape[-2], Y.shape[-2]
    if key_needed:  # the sort key r·2^(bn+bm) + i·2^bm + j of dedup/csr must fit int64 (R·n·m ≥ 2⁶¹ may not)
        bits = max(R - 1, 0).bit_length() + _bits(n) + _bits(m)
        if bits > 63:
            raise ValueError(
                f"R·n·m too large for the int64 sort key of dedup/csr (R={R}, n={n}, m={m} need "
                f"{bits} bits > 63); split the batch or use dedup=False, csr=False"
            )
    for name, parts in factors.items():
        for t in parts if values else ():
            if t.dtype != torch.bool and t.numel():
                _check_values(name, torch.aminmax(t.detach()))
    return lead, R, n, m, K


def _bits(size: int) -> int:
    """Bits of the largest index of a dimension of this size."""
    return max(size - 1, 0).bit_length()


def _flat(t: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """(..., a, b) → (R, a, b), broadcasting the leading dims. Detached: the outputs are integer indices, so no
    gradient flows through sampling; SBM's straight-through estimator (Eq. 9) recomputes each sampled edge's
    probability, e.g. X[r, i] · (S[r] Y[r, j]), with autograd outside this module."""
    t = t.detach()
    return t.expand(*lead, *t.shape[-2:]).reshape(math.prod(lead), *t.shape[-2:])


def _parts(t) -> tuple:
    """A factor's parts along K: the tuple's tensors, or the tensor alone."""
    return tuple(t) if isinstance(t, (tuple, list)) else (t,)


def _joined(t, lead: tuple[int, ...]) -> torch.Tensor:
    """_flat of a factor, its parts concatenated (the reference helpers form it)."""
    return torch.cat([_flat(part, lead) for part in _parts(t)], -1)


class _Factor:
    """X or Y on the fast path, (R, n, K): its parts (R, n, K_a) (_flat), read as their concatenation along K and
    never formed (SBM-Transformer appends δ's column to K̂ so, without a copy of K̂)."""

    def __init__(self, parts: tuple):
        self.parts = parts
        self.shape = (*parts[0].shape[:2], sum(part.shape[2] for part in parts))
        self.device = parts[0].device

    @classmethod
    def flat(cls, t, lead: tuple[int, ...]) -> "_Factor":
        return cls(tuple(_flat(part, lead) for part in _parts(t)))

    def __getitem__(self, graphs: slice) -> "_Factor":
        return _Factor(tuple(part[graphs] for part in self.parts))

    def column_sums(self) -> torch.Tensor:
        """(R, K) float64 (_column_sums)."""
        return torch.cat([_column_sums(part) for part in self.parts], 1)

    def columns(self, r: int, u0: int, u1: int, out: torch.Tensor) -> None:
        """Columns u0..u1 − 1 of graph r as the rows of out (_columns), part by part."""
        start = 0
        for part in self.parts:
            a, z = max(u0, start), min(u1, start + part.shape[2])
            if a < z:
                _columns(part[r], a - start, z - start, out[a - u0 : z - u0])
            start += part.shape[2]


def _index_dtype(size: int) -> torch.dtype:
    """int32 for indices below 2³¹ (half the memory traffic of int64; gathers and scatters take either)."""
    return torch.int32 if size <= 2**31 else torch.int64


# -------------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    """`python fastrg.py`: a short self-check (fixed seeds, 5σ bounds from binomial variances) that prints what it
    verified; the full statistical tests are tests/test_fastrg.py."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python fastrg.py",
        description="fastRG (Rohe et al. 2018): a short "
        "self-check of the samplers' law and the speed; prints what it verified.",
    )
    parser.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    T, n, m, K = 4000, 5, 6, 3  # T independent graphs in one call
    X, Y = torch.rand(n, K, generator=g), torch.rand(m, K, generator=g)
    S = torch.rand(K, K, generator=g)
    p = -torch.expm1(-edge_probability(X, S, Y, dedup=False)[0])  # P(edge (i, j)) = 1 − e^(−λ_ij)
    for name, sampler in (("fast sampler", sample), ("reference sampler (Algorithm 1)", sample_reference)):
        _, i, j = sampler(X.expand(T, n, K), S, Y.expand(T, m, K), generator=g)
        c = torch.bincount(i * m + j, minlength=n * m).view(n, m).double()  # Binomial(T, p) per pair
        z = float(((c - T * p) / (T * p * (1 - p)).sqrt()).abs().max())
        print(f"{name}: over {T} graphs, the {n * m} pair frequencies match 1 − e^(−λ), max |z| = {z:.2f}")
        assert z < 5

    X, Y = torch.rand(4096, 128, generator=g), torch.rand(4096, 128, generator=g)
    S = torch.rand(128, 128, generator=g)
    S *= 0.01 * 4096 * 4096 / float(expected_edges(X, S, Y))
    t0 = time.perf_counter()
    r, _, _, _ = sample(X, S, Y, generator=g, csr=True)
    print(
        f"n = m = 4096, K = 128, density 1%: {len(r)} edges (dedup, CSR) in {(time.perf_counter() - t0) * 1e3:.0f} ms"
    )
    print("fastrg self-check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
