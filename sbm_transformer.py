"""SBM-Transformer: attention on a graph sampled from a learned Stochastic Block Model, at a cost linear in its edges.

Cho, Min, Kim, Lee, Lee, Hong, "Transformers meet Stochastic Block Models: Attention with Data-Adaptive Sparsity and
Cost", NeurIPS 2022, arXiv 2210.15541; the official code is github.com/sc782/SBM-Transformer. Per layer and head,
with queries Q, keys K, values V and k cluster embeddings C (§4.1-4.2):

    Ŝ = softmax(C Cᵀ), one softmax over all k² entries                        (Eq. 5)
    Q̂ = σ(MLP(Q) Cᵀ),  K̂ = σ(MLP(K) Cᵀ),  P = Q̂ Ŝ K̂ᵀ                        (Eq. 6-7)
    M_ij ~ Bernoulli(min(1, P_ij + δ)), δ: random edge exploration (§4.2)      (Eq. 8)
    Y = σ_M(M ⊙ QKᵀ/√d) V, a softmax over each query's edges; no edge: 0     (Eq. 3-4)
    ∂L/∂P_ij := ∂L/∂A_ij · Q_iK_jᵀ/√d on sampled edges, 0 elsewhere          (Eq. 9, straight-through)
    loss += λ · mean density, density = edges / (valid queries × valid keys)  (§5.2)

Ŝ is one distribution over all k² block pairs and memberships lie in (0, 1), so on a graph linking each query to
one key (a token and its duplicate) the density is at least recall² (tests: the bound of Eq. 5).

Three paths draw the same law of M and give the same outputs and gradients on one edge set (tests):
`path="reference"` (default) forms P and a dense mask, O(N²k), as the official code does; `path="fast"` draws the
edges with fastRG (fastrg.py, Algorithm 1), made exact by thinning, and attends on them alone, O(E): for long
sequences at low density (its GPU costs: results/gpu); `path="tile"` (sbm_tile.py, triton; float32 on CUDA) draws
each pair inside a tiled kernel, O(N²(d + k)) time, memory linear in N.

    python sbm_transformer.py --task listops                          # Table 1's setting (λ = 0), CPU preset
    python sbm_transformer.py --task listops --density-weight 1e-2    # Table 2's λ
    python sbm_transformer.py --task duplicates --density-weight 1e-2 --density-from 400   # λ once learned
    python sbm_transformer.py --task listops --official               # the official code's choices
    python sbm_transformer.py --task listops --self-loops             # Table 8's (+I)
    python sbm_transformer.py --task duplicates --preset paper       # §5.1, Fig. 4: density → 1
    python -m experiments.sbm_scaling                                       # core and module against full attention
(`python -m bench.train --method sbm ...` runs the same code; `--help` lists every option.)

Shape legend: B batch, H heads, N queries, M keys (M = N here), D = d head dim, K = k clusters, E edges,
R = B·H graphs (graph r = b·H + h); "global" query / key indices are r·N + i / r·M + j.
"""

import contextlib
import sys
import warnings
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import fastrg

PATHS = ("reference", "fast")  # torch alone; default first: fast fwd+bwd 1.5-4.3× at n ≤ 512, 0.06× at 4096, 1%
KERNEL_PATHS = ("tile",)  # Triton (sbm_tile.py, imported when chosen): CUDA, or the CPU under TRITON_INTERPRET=1
STE_FORMS = ("paper", "official")


@dataclass
class SBMConfig:
    """SBM settings of a model (§4, Table 7); everything else is the task's preset. Each field is also an option
    of `python sbm_transformer.py` (its metadata: the help)."""

    clusters: int = field(default=128, metadata={"help": "k, clusters per head (Table 7)"})
    delta: float = field(default=0.01, metadata={"help": "δ, random edge exploration (§4.2)"})
    density_weight: float = field(
        default=0.0,
        metadata={
            "metavar": "LAMBDA",
            "help": "λ of the density regulariser (§5.2; Table 2: 0, 1e-4, 1e-3, 1e-2, 1e-1; Table 1 is λ = 0)",
        },
    )
    density_from: int = field(
        default=0,
        metadata={
            "metavar": "STEP",
            "help": "the training step from which λ acts (0: the paper's, from the first step; "
            "later: once the task has shaped the graph)",
        },
    )
    self_loops: bool = field(default=False, metadata={"help": "the (+I) variant: M_ii = 1 (Table 8)"})
    path: str = field(
        default="reference",
        metadata={
            "choices": PATHS + KERNEL_PATHS,
            "help": "reference (dense masks, O(N²k); faster at the CPU presets' lengths), "
            "fast (fastRG, O(E); long sequences at low density) or tile (a Triton kernel: CUDA): one law",
        },
    )
    ste: str = field(
        default="paper",
        metadata={"choices": STE_FORMS, "help": "the straight-through estimator: paper (Eq. 9) or official (hardtanh)"},
    )
    explore_in_eval: bool = field(default=False, metadata={"help": "add δ in evaluation too (official)"})
    shared_mlp: bool = field(default=False, metadata={"help": "one node MLP for all heads (official)"})

    @classmethod
    def official(cls, **overrides) -> "SBMConfig":
        """The official code's behaviour: dense Bernoulli path, hardtanh STE, δ also at evaluation, one MLP for all
        heads."""
        return cls(**{"path": "reference", "ste": "official", "explore_in_eval": True, "shared_mlp": True, **overrides})


# ---- reference path: Eq. 5-9 as dense code, O(N²k) ------------------------------------------------------------
class SBMAttention(nn.Module):
    """Multi-head SBM attention (INTERFACE.md). Budget: clusters (k), delta (δ), density_weight (λ of this layer),
    self_loops; options: path, ste, explore_in_eval, shared_mlp (SBMConfig). The methods below are the reference
    path; `path="fast"` replaces the mask by a graph of edges (sample_edges, attend_edges)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dropout: float = 0.0,
        *,
        clusters: int = SBMConfig.clusters,
        delta: float = SBMConfig.delta,
        density_weight: float = SBMConfig.density_weight,
        self_loops: bool = SBMConfig.self_loops,
        path: str = SBMConfig.path,
        ste: str = SBMConfig.ste,
        explore_in_eval: bool = SBMConfig.explore_in_eval,
        shared_mlp: bool = SBMConfig.shared_mlp,
    ):
        super().__init__()
        if min(dim, heads, head_dim, clusters) < 1:
            raise ValueError(f"dim, heads, head_dim, clusters must be positive, got {dim, heads, head_dim, clusters}")
        if not 0.0 <= delta < 1.0 or density_weight < 0 or not 0.0 <= dropout < 1.0:
            raise ValueError(
                f"need 0 <= delta < 1, density_weight >= 0, 0 <= dropout < 1; got {delta}, {density_weight}, {dropout}"
            )
        if path not in PATHS + KERNEL_PATHS or ste not in STE_FORMS:
            raise ValueError(f"path must be one of {PATHS + KERNEL_PATHS}, ste of {STE_FORMS}: got {path!r}, {ste!r}")
        self.heads, self.head_dim, self.dropout, self.clusters = heads, head_dim, dropout, clusters
        self.delta, self.density_weight, self.self_loops = delta, density_weight, self_loops
        self.path, self.ste, self.explore_in_eval, self.shared_mlp = path, ste, explore_in_eval, shared_mlp
        self.shift = 0.0  # β on the membership logits: 0 in the paper, set by at_density
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)
        # The node MLP d → d → d of Eq. 6-7, for queries and keys alike: one per head, as §4.1 says ("each attention
        # head a 2-layer MLP"); Fig. 2 and the official code share one across heads (shared_mlp=True). U(±1/√d) init.
        mlp_heads, bound = (1 if shared_mlp else heads), head_dim**-0.5
        self.mlp_w = nn.Parameter(torch.empty(2, mlp_heads, head_dim, head_dim).uniform_(-bound, bound))
        self.mlp_b = nn.Parameter(torch.empty(2, mlp_heads, 1, head_dim).uniform_(-bound, bound))
        # Cluster embeddings C (H, K, D), Kaiming normal with the fan-in of the whole tensor, std √(2/(K·D)), as the
        # official code: App. C's ≈ 25% initial density (tests). A per-head fan-in D would give std √(2/D).
        self.centers = nn.Parameter(nn.init.kaiming_normal_(torch.empty(heads, clusters, head_dim)))

    def block_matrix(self) -> Tensor:
        """Ŝ (H, K, K) = softmax over all K² entries of C Cᵀ (Eq. 5)."""
        gram = self.centers @ self.centers.transpose(1, 2)  # (H, K, K)
        return gram.flatten(1).softmax(-1).view_as(gram)

    def memberships(self, t: Tensor) -> Tensor:
        """σ(MLP(t) Cᵀ) (Eq. 6-7): (B, H, N, D) → (B, H, N, K) in (0, 1)."""
        node = F.relu(t @ self.mlp_w[0] + self.mlp_b[0]) @ self.mlp_w[1] + self.mlp_b[1]  # (B, H, N, D)
        logits = node @ self.centers.transpose(1, 2)  # (B, H, N, K)
        return torch.sigmoid(logits + self.shift if self.shift else logits)

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
        mask: Optional[Tensor] = None,  # a given M (B, H, N, N) bool in place of Eq. 8's draw: the tile path's oracle
    ):
        b, n, _ = x.shape
        if mask is not None and (self.path, mask.dtype, mask.shape) != ("reference", torch.bool, (b, self.heads, n, n)):
            raise ValueError(f"a given mask is the reference path's bool M of shape {(b, self.heads, n, n)}")
        if key_padding_mask is not None and (key_padding_mask.shape != (b, n) or key_padding_mask.dtype != torch.bool):
            raise ValueError(
                f"key_padding_mask must be a bool tensor of shape {(b, n)}, got "
                f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
        valid = (
            torch.ones(b, n, dtype=torch.bool, device=x.device) if key_padding_mask is None else ~key_padding_mask
        )  # (B, N)
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3×(B, H, N, D)
        # scores, softmax and sampling in float32 (≥); the fast path's many mid-sized ops on one thread (fastrg.py's
        # one_thread: on a shared CPU a second thread's barrier waits cost more than it gives)
        with (
            torch.autocast(x.device.type, enabled=False),
            fastrg.one_thread() if self.path == "fast" else contextlib.nullcontext(),
        ):
            dtype = torch.promote_types(q.dtype, torch.float32)
            q, k, v = q.to(dtype).contiguous(), k.to(dtype).contiguous(), v.to(dtype).contiguous()
            # M is sampled in evaluation too, as in the official code and Table 1's test-time densities
            graph = self.sample(q, k, valid, causal, generator, mask)
            y, density, per_example = self.attend(q, k, v, graph, valid, generator)
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        stats = {"density": density.detach(), "density_per_example": per_example}
        if self.density_weight > 0:
            stats["aux_loss"] = self.density_weight * density.mean()
        return self.out(y.to(x.dtype)), stats

    def exploration(self) -> float:
        """δ, added to every edge probability (§4.2)."""
        # §4.2 explores "during training" only; the official code also at evaluation, where its densities include δ
        return self.delta if self.training or self.explore_in_eval else 0.0

    def sample(self, q: Tensor, k: Tensor, valid: Tensor, causal: bool, generator, mask=None) -> dict:
        """M ~ SBM(Q̂, Ŝ, K̂) (Eq. 8): {"mask": (B, H, N, M) bool (or the given one), "prob": P} on the reference path,
        {"edges": Edges} on the fast one, the law's settings on the tile path (its kernel draws M), plus the
        memberships x = Q̂, w = K̂Ŝᵀ (with gradient; p_ij = x_i · w_j) of the STE."""
        x, z, s, w = self.factors(q, k)
        if self.path == "tile":
            return {"x": x, "w": w, "causal": causal, "delta": self.exploration(), "self_loops": self.self_loops}
        if self.path == "reference":
            prob = x @ w.transpose(-1, -2)  # (B, H, N, M) P = Q̂ŜK̂ᵀ
            with torch.no_grad():
                mask = self.sample_dense(prob, valid, causal, generator) if mask is None else mask
            return {"mask": mask, "prob": prob, "x": x, "w": w}
        with torch.no_grad():
            edges = sample_edges(x, z, w, s, valid, causal, self.exploration(), self.self_loops, generator)
        return {"edges": edges, "x": x, "w": w}

    def factors(self, q: Tensor, k: Tensor) -> tuple:
        """The SBM's factors: x = Q̂ (B, H, N, K), z = K̂ (B, H, M, K), s = Ŝ (H, K, K), w = K̂Ŝᵀ (B, H, M, K)."""
        x, z, s = self.memberships(q), self.memberships(k), self.block_matrix()
        return x, z, s, z @ s.transpose(1, 2)

    def sample_dense(self, prob: Tensor, valid: Tensor, causal: bool, generator) -> Tensor:
        """One Bernoulli(min(1, P + δ)) per pair (Eq. 8), as the official code draws M; then
        padding, causality and forced self-loops: a (B, H, N, M) mask."""
        # u < min(1, π) ⟺ u < π for u ∈ [0, 1): no clamp needed
        mask = (
            torch.rand(prob.shape, generator=generator, device=prob.device, dtype=prob.dtype)
            < prob + self.exploration()
        )
        n = mask.shape[-1]
        # No edge from or to padding (the official code samples padded keys, at weight 0, and lets padded queries
        # attend): padded tokens' memberships never meet the loss.
        mask &= valid[:, None, :, None] & valid[:, None, None, :]
        if causal:
            mask &= torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
        if self.self_loops:  # (+I): M_ii = 1 for valid tokens (§4.3 footnote 1, Table 8); off in the paper's runs
            mask |= torch.eye(n, dtype=torch.bool, device=mask.device) & valid[:, None, :, None]
        return mask

    def attend(self, q, k, v, graph: dict, valid: Tensor, generator):
        """Eq. 3-4 on the sampled graph, Eq. 9 for its edge probabilities, and the density: y (B, H, N, D), density
        (H,) with its STE gradient path, density per example (B, H) detached (App. C, Fig. 5, 7-8)."""
        B, H, N, D = q.shape
        p_drop = self.dropout if self.training else 0.0
        if "mask" in graph:
            mask, prob = graph["mask"], graph["prob"]
            if self.self_loops:  # forced edges are not sampled: no STE gradient
                eye = torch.eye(N, dtype=torch.bool, device=q.device)
                prob = torch.where(eye, prob.detach(), prob)
            row_edges = mask.sum(-1, keepdim=True, dtype=torch.int32)  # (B, H, N, 1); int32: 2× faster than int64
            y = dense_attention(q, k, v, prob, mask, row_edges, p_drop, self.ste, generator)
            # (B, H) edge counts Σ M_ij with the STE's ∂M_ij/∂P_ij = 1 on sampled edges, as Σ(1 + P − stopgrad(P)):
            # the regulariser gives each sampled edge's probability λ/pairs, as in the official code
            ste_part = prob.masked_fill(~mask, 0).sum((2, 3))
            counts = row_edges.sum((2, 3)).to(q.dtype) + (ste_part - ste_part.detach())
        elif self.path == "tile":
            import sbm_tile  # the Triton kernel, imported on this path only

            y, counts = sbm_tile.attend(q, k, v, graph, valid, p_drop, self.ste, generator)
        else:
            y, counts = attend_edges(q, k, v, graph, p_drop, self.ste, self.self_loops, generator)
        # edges / (valid queries × valid keys); δ-edges and self-loops count, as in the official code, whose
        # denominator is all b·n·m pairs, padding included
        per_pairs = valid.sum(1).to(q.dtype) ** 2  # (B,) valid queries × valid keys
        density = counts.sum(0) / per_pairs.sum().clamp_min(1)  # (H,)
        per_example = (counts / per_pairs.clamp_min(1)[:, None]).detach()
        return y, density, per_example

    def extra_repr(self) -> str:
        return (
            f"heads={self.heads}, head_dim={self.head_dim}, clusters={self.clusters}, delta={self.delta}, "
            f"density_weight={self.density_weight:g}, self_loops={self.self_loops}, path={self.path}, "
            f"ste={self.ste}, explore_in_eval={self.explore_in_eval}, shared_mlp={self.shared_mlp}"
        )


def dense_attention(q, k, v, prob, mask, row_edges, p_drop: float, ste: str, generator=None) -> Tensor:
    """σ_M(M ⊙ QKᵀ/√D) V (Eq. 3-4) with materialised (B, H, N, M) scores, and Eq. 9 as the gradient of prob = P
    (detached on forced edges); row_edges (B, H, N, 1) = mask.sum(-1). The fast path's EdgeAttention gives the same
    result and gradients on the same mask."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)  # (B, H, N, M), Eq. 3's 1/√D
    logits = StraightThrough.apply(scores, prob, ste)
    alpha = logits.masked_fill(~mask, torch.finfo(logits.dtype).min).softmax(-1)
    alpha = alpha * (row_edges > 0)  # a row without edges is uniform here: output 0 instead
    if p_drop > 0:  # attention dropout on the normalised weights, as the official code (the paper is silent)
        source = generator.device if generator is not None else alpha.device  # drawn where the generator is
        keep = torch.rand(alpha.shape, generator=generator, device=source).to(alpha.device) >= p_drop
        alpha = alpha * keep / (1 - p_drop)
    return alpha @ v  # (B, H, N, D)


class StraightThrough(torch.autograd.Function):
    """The scores unchanged in value, with the straight-through estimator as the gradient of P (Eq. 9): ∂L/∂P =
    ∂L/∂S ⊙ S, S = QKᵀ/√D (`ste="paper"`); the official code's form is hardtanh(∂L/∂S) (`ste="official"`). One
    function, not P − stopgrad(P) arithmetic, so the (B, H, N, M) work is one product in the backward."""

    @staticmethod
    def forward(ctx, scores, prob, ste: str):
        ctx.save_for_backward(scores)
        ctx.ste = ste
        return scores.view_as(scores)

    @staticmethod
    def backward(ctx, grad):
        (scores,) = ctx.saved_tensors
        # The official clip acts on the regulariser's share of the gradient too; here it clips only the attention's.
        return grad, (grad * scores if ctx.ste == "paper" else grad.clamp(-1.0, 1.0)), None


# ---- fast path: Eq. 5-9 on the sampled edges, O(E) -----------------------------------------------
# Eq. 8: sample_edges draws M as a graph grouped by query (CSR, Edges): fastRG proposes, thinning
# makes each pair exact Bernoulli(min(1, P + δ)). Eq. 3-4: EdgeAttention scores the edges alone
# (SDDMM), a softmax per query by segment reductions, Y by sparse products. Eq. 9:
# StraightThroughEdges carries ∂L/∂p_e to Q̂ and K̂Ŝᵀ. Between forward and backward a layer keeps
# its graph alone (4 bytes an edge; dropout's mask, 1), and autograd the memberships' intermediates
# (recomputing them too would save 8 MiB at n = 4096, 1%, for 7-12% of the step; the crossover with
# SDPA stays at 1.4%). Time O(E(D + K) + N(D² + KD + K²) + K²(D + R)), memory O(E + N(K + D) + RK²);
# App. B's Table 5 omits the N·K² of K̂Ŝᵀ and fastRG's R·K² block counts, which at K = 128 > D = 32
# dominate short sequences (ListOps at N = 200 costs more FLOPs than full attention).
CAP = 1e-3  # thinning is exact for π ≤ 1 − CAP; above, a pair is kept with probability ≥ 1 − CAP
CHUNK = 1 << 18  # edges a chunk of queries or keys: per-edge temporaries of 1 MiB (float32), not E-sized
BLOCK = 1 << 21  # edges a block of whole graphs in the key-major copy: allocations of 16 MiB (or one graph's)
# (both on the CPU; fastrg.GPU_CHUNKS× on a GPU, where an op costs a kernel launch and a size read a host sync:
# there a layer's forward + backward reads the device once, fastRG's sizes, at any batch and length: test_devices)


def _csr(ptr: Tensor, idx: Tensor, values: Tensor, shape) -> Tensor:
    with warnings.catch_warnings():  # torch's notices that CSR "is in beta" and (torch 2.11) that checks are off
        warnings.filterwarnings("ignore", message="Sparse (CSR tensor support is in beta|invariant checks)")
        return torch.sparse_csr_tensor(ptr, idx, values, shape, check_invariants=False)


def _offsets(counts: Tensor) -> Tensor:
    """(n,) counts → (n + 1,) int32 offsets [0, c0, c0 + c1, ...]."""
    ptr = counts.new_zeros(len(counts) + 1, dtype=torch.int32)
    ptr[1:] = counts.cumsum(0)
    return ptr


@dataclass
class Edges:
    """The edges of R query→key graphs grouped by query (CSR: row_ptr, col; int32, the sparse BLAS
    kernels' type; keys sorted within each row), and a key-major copy (CSC) for the backward's transposed
    products, built on first use (inference never sorts). Off the CPU (fastrg.host_syncs) the sizes stay those
    fastRG read: `live` flags the edges of M, and the work is cut at whole graphs (graph_ptr), not queries."""

    R: int
    N: int
    M: int
    row_ptr: Tensor  # (R·N + 1,) int32
    row_len: Tensor  # (R·N,) int32 edges per query
    col: Tensor  # (E,) int32 global key r·M + j
    live: Optional[Tensor] = None  # (E,) bool, the edges of M; None: all
    graph_ptr: Optional[np.ndarray] = None  # (R + 1,) int64 row_ptr at each graph's first row, on the host
    _key_major: Optional[tuple] = field(default=None, repr=False)
    _query_chunks: Optional[list] = field(default=None, repr=False)  # _ranges of the queries, cut once a graph

    @classmethod
    def from_csr(cls, row_ptr: Tensor, col: Tensor, R: int, N: int, M: int, live=None, graph_ptr=None) -> "Edges":
        return cls(R, N, M, row_ptr, row_ptr.diff(), col, live, graph_ptr)

    @classmethod
    def from_mask(cls, mask: Tensor) -> "Edges":
        """(..., N, M) bool → Edges, graphs in row-major order of the leading dims."""
        N, M = mask.shape[-2:]
        R = mask.numel() // max(N * M, 1)
        row, j = mask.reshape(R * N, M).nonzero(as_tuple=True)  # row-major: sorted by (row, j)
        ptr = _offsets(fastrg.count_integers(row, R * N))
        # off the CPU, work is cut at whole graphs from their offsets on the host: one read, after nonzero's
        graph_ptr = ptr[::N].cpu().numpy().astype(np.int64) if fastrg.host_syncs(mask.device) else None
        return cls.from_csr(ptr, (row // N * M + j).int(), R, N, M, graph_ptr=graph_ptr)

    def key_major(self) -> tuple:
        """(col_ptr (R·M + 1,), blocks), built a block of whole graphs (about BLOCK edges, chunk_size) at a time. Block
        (row_t, perm, its keys' _ranges): row_t (E_b,) each edge's query in key-major order, perm (E_b,) its
        CSR position, int32, from one sort of the integers key·2^b + CSR position (b = bits of E): queries
        stay in order within a key. perm and row_t are the low and high halves of the sorted int64 keys
        (row_t written over), one allocation of 8 bytes an edge; the build adds 4 (queries in CSR order)."""
        if self._key_major is None:
            bits, blocks = max(self.E - 1, 0).bit_length(), []
            chunk, block = fastrg.chunk_size(CHUNK, self.col.device), fastrg.chunk_size(BLOCK, self.col.device)
            col_ptr = _offsets(fastrg.count_integers(self.col, self.R * self.M))
            graphs = self.row_ptr[:: self.N].numpy() if self.graph_ptr is None else self.graph_ptr
            for g0, g1, a, b in _ranges(graphs, 1, 0, self.R, block):
                key = torch.empty(b - a, dtype=torch.int64, device=self.col.device)  # dense strides: viewed
                key.copy_(self.col[a:b]).bitwise_left_shift_(bits)  # as int32 pairs below
                for c in range(0, b - a, chunk):  # + CSR position, a chunk at a time (no E-sized arange)
                    key[c : c + chunk] += torch.arange(a + c, min(a + c + chunk, b), device=key.device)
                key = fastrg.sort_integers(key)  # by (key, query)
                perm, row_t = key.view(torch.int32).view(-1, 2).unbind(1)
                perm.bitwise_and_((1 << bits) - 1)
                row = torch.repeat_interleave(
                    torch.arange(g0 * self.N, g1 * self.N, dtype=torch.int32, device=key.device),
                    self.row_len[g0 * self.N : g1 * self.N],
                    output_size=b - a,
                )  # CSR order
                for c in range(0, b - a, chunk):
                    row_t[c : c + chunk] = row.index_select(0, perm[c : c + chunk] - a)
                del key, row  # before the next block's
                blocks.append((row_t, perm, _ranges(*self.host_ptr(col_ptr, self.M), g0 * self.M, g1 * self.M, chunk)))
            self._key_major = (col_ptr, blocks)
        return self._key_major

    def to_mask(self) -> Tensor:
        """(R, N, M) bool."""
        mask = torch.zeros(self.R * self.N, self.M, dtype=torch.bool, device=self.col.device)
        row, col = self.to_rows(torch.arange(self.R * self.N, device=mask.device)), self.col.long() % self.M
        if self.live is not None:
            row, col = row[self.live], col[self.live]
        mask[row, col] = True
        return mask.view(self.R, self.N, self.M)

    @property
    def E(self) -> int:
        return len(self.col)

    def per_graph(self) -> Tensor:
        """(R,) edges of M per graph."""
        ptr = self.row_ptr[:: self.N]
        return ptr.diff() if self.live is None else _kept_offsets(self.live, ptr).diff()

    def host_ptr(self, ptr: Tensor, rows: int) -> tuple:
        """Offsets to cut chunks at, on the host, and the rows between two: ptr itself (1) on the CPU, graph_ptr
        (a graph's `rows`) off it, where reading ptr would wait for the device."""
        return (ptr.numpy(), 1) if self.graph_ptr is None else (self.graph_ptr, rows)

    def csr(self, values: Tensor) -> Tensor:
        return _csr(self.row_ptr, self.col, values, (self.R * self.N, self.R * self.M))

    def to_rows(self, per_row: Tensor) -> Tensor:
        """(R·N,) → (E,): each edge gets its query's value (edges are grouped by query)."""
        return torch.repeat_interleave(per_row, self.row_len, output_size=self.E)

    def chunks(self, key_major: bool = False):
        """Consecutive ranges of whole queries (of whole keys with key_major=True) holding about CHUNK edges
        (chunk_size): yields (first query (key), at, part): `at` the CSR positions of its edges (a slice; in key-major
        order, an index), part the range as one graph over all R·M keys (R·N queries), whose csr() is those rows of
        csr() (of the transposed graph). Every query (key) is in one range; a product of a part gives its rows of the
        whole product, bit for bit."""
        chunk = fastrg.chunk_size(CHUNK, self.col.device)
        if not key_major:
            if self._query_chunks is None:
                self._query_chunks = _ranges(*self.host_ptr(self.row_ptr, self.N), 0, self.R * self.N, chunk)
            for start, end, e0, e1 in self._query_chunks:
                offsets = self.row_ptr[start : end + 1] - e0 if e0 else self.row_ptr[start : end + 1]  # first: no op
                yield (
                    start,
                    slice(e0, e1),
                    Edges(1, end - start, self.R * self.M, offsets, self.row_len[start:end], self.col[e0:e1]),
                )
            return
        col_ptr, blocks = self.key_major()
        for row_t, perm, ranges in blocks:
            base = ranges[0][2]  # the block's first edge
            for start, end, c0, c1 in ranges:
                offsets, at = col_ptr[start : end + 1] - c0, slice(c0 - base, c1 - base)
                yield (
                    start,
                    perm[at],
                    Edges(1, end - start, self.R * self.N, offsets, offsets.diff(), row_t[at].contiguous()),
                )


def _ranges(host: np.ndarray, stride: int, start: int, stop: int, size: int) -> list:
    """Consecutive ranges [a, b) covering start..stop − 1 (multiples of `stride`), each of whole `stride` entries
    of offsets ptr holding about `size` items (at least `stride` entries), with their offsets: (a, b, ptr[a],
    ptr[b]). `host` holds every stride-th entry of ptr, on the host: cutting reads nothing from the device."""
    host, ranges, a, last = host[start // stride : stop // stride + 1], [], 0, (stop - start) // stride
    while a < last:
        target = min(int(host[a]) + size, int(host[last]))
        b = min(last, max(a + 1, int(np.searchsorted(host, target, side="right")) - 1))
        ranges.append((start + a * stride, start + b * stride, int(host[a]), int(host[b])))
        a = b
    return ranges


def _sddmm(edges: Edges, a: Tensor, b: Tensor, scale: float = 1.0) -> Tensor:
    """(E,) scale·(a bᵀ) at the edges: one dot product per edge, O(E·width). Written over a pattern
    of zeros (finite: sampled_addmm reads them, NaN · 0), so the graph's indices are not copied
    (sampled_addmm without `out` copies them: 3 E-sized buffers where this takes one)."""
    pattern = edges.csr(a.new_zeros(edges.E))
    return torch.sparse.sampled_addmm(pattern, a, b.t(), beta=0.0, alpha=scale, out=pattern).values()


def _select(values: Tensor, keep: Tensor) -> Tensor:
    """values[keep], 1-D; on CPU by numpy, which allocates only the output (masked_select: + 8 bytes each)."""
    if values.device.type == "cpu":
        return torch.from_numpy(values.numpy()[keep.numpy()])
    return values.masked_select(keep)


def _kept_offsets(keep: Tensor, row_ptr: Tensor) -> Tensor:
    """Row offsets of the edges `keep` (E,) keeps, from row_ptr of all: the number kept before each row."""
    before = torch.zeros(len(keep) + 1, dtype=torch.int32, device=keep.device)
    torch.cumsum(keep, 0, dtype=torch.int32, out=before[1:])
    return before.index_select(0, row_ptr)


@torch.compiler.disable  # data-dependent sizes (the number of edges): torch.compile runs the sampler eagerly
def sample_edges(x, z, w, s, valid, causal, delta: float, self_loops: bool, generator) -> Edges:
    """M_ij ~ Bernoulli(min(1, π_ij)), π = p + δ, p = x_i · w_j = Q̂_iŜK̂_jᵀ, from a fastRG proposal thinned to exact.

    fastRG draws Poisson(λ_ij) copies of each pair; merged, a pair is present with probability 1 − e^{−λ_ij},
    never above 0.632 for λ ≤ 1, so Algorithm 1 as printed cannot reach Fig. 4's full attention although Eq. 8
    states p(i, j) = Q̂_iŜK̂_jᵀ. We propose with λ_ij = c_i π_ij (still rank K + 1) and keep a pair with
    probability min(1, π)/(1 − e^{−c_i π}) ≤ 1 (thin): P(edge) = min(1, π_ij), the official code's law.
    c_i = −ln(1 − u_i)/u_i for a bound u_i = Q̂_iŜ·max_j K̂_j + δ ≥ max_j π_ij, capped at 1 − CAP; the overhead
    c_i − 1 ≈ u_i/2 is about 15% at initialisation, up to 5.9 as π → 1 (there the reference path is faster).
    Causal: pairs with j > i are dropped before thinning, so each pair's law depends only on its query and
    key; for a fixed generator the realised draw of one row still depends on the other tokens (one vectorised
    proposal per batch), so realisation-level invariance to future tokens holds on the dense path, and on the
    sparse path given the graph (tests). The proposal comes grouped by query (fastrg.sample_block_csr);
    thinning keeps that order: no sort."""
    B, H, N, K = x.shape
    M, R = z.shape[2], B * H
    keys = valid[:, None, :, None].to(x.dtype)  # (B, 1, M, 1): padded keys get no edge
    if fastrg.host_syncs(x.device) or not bool(valid.all()):  # on the CPU, without padding, no pass over z
        z = z * keys
    # u_i = Q̂_i Ŝ max_j K̂_j + δ ≥ max_j π_ij; c_i = −ln(1 − u)/u ≥ −ln(1 − π)/π for every π ≤ u.
    bound = (x @ (z.amax(2, keepdim=True) @ s.transpose(1, 2)).transpose(-1, -2)).squeeze(-1) + delta
    bound = bound.clamp(1e-6, 1 - CAP)  # (B, H, N) u_i
    scale = -torch.log1p(-bound) / bound * valid[:, None, :]  # (B, H, N) c_i, 0 for padded queries
    xs, zs = x * scale[..., None], z  # (B, H, N, K) X = diag(c) Q̂
    if delta > 0:  # δ·11ᵀ is the rank-one SBM term [Q̂, 1] blockdiag(Ŝ, δ) [K̂, 1]ᵀ (fastrg.py); its column
        xs, zs = (xs, scale[..., None]), (z, keys)  # goes beside, never concatenated (no copy of K̂)
        s = F.pad(s, (0, 1, 0, 1))
        s[:, K, K] = delta
    row_ptr, col, first, graph_ptr = fastrg.sample_block_csr(xs, s, zs, generator=generator)
    del xs, zs, z  # before thinning's temporaries
    edges = thin(Edges.from_csr(row_ptr, col, R, N, M, first, graph_ptr), causal, x, w, bound, scale, delta, generator)
    del col  # the proposal's (on the CPU)
    return _with_loops(edges, valid) if self_loops else edges


def thin(proposed: Edges, causal: bool, x, w, bound, scale, delta: float, generator) -> Edges:
    """The kept edges, compacted on the CPU, flagged off it: keep each proposed pair (with causal, one whose key is
    not after its query; of repeats, the first copy) with probability a(π) = min(1, π)/(1 − e^{−c_i π}), so that
    P(edge) = min(1, π). a grows with π from 1/c_i (π → 0), so on the CPU U < 1/c_i keeps a pair without its p (a
    squeeze); only the others, a fraction ≈ 1 − 1/c_i ≈ u_i/2, need p_e = x_i · w_j, the K-wide product; off it
    every pair does (the squeeze's count would be a read). A chunk of queries at a time, their U drawn in turn."""
    R, N, M, K = proposed.R, proposed.N, proposed.M, x.shape[-1]
    sure = (bound / -torch.log1p(-bound) * (1 - 2**-20)).reshape(R * N)  # 1/c_i, rounded down
    x, w, rate = x.reshape(R * N, K), w.reshape(-1, K), scale.reshape(R * N).neg()
    if causal:  # key index j ≤ query index i, both as r·M + ·
        diagonal = (torch.arange(R, device=x.device)[:, None] * M + torch.arange(N, device=x.device)).view(-1).int()
    keep = torch.empty(proposed.E, dtype=torch.bool, device=x.device)
    kept = torch.empty(R * N, dtype=torch.int32, device=x.device)  # (R·N,) kept edges per query
    for q0, at, part in proposed.chunks():
        q1 = q0 + part.N
        U = torch.rand(part.E, generator=generator, device=x.device, dtype=x.dtype)
        if proposed.live is not None:  # the same test on every pair, flagged in place
            pi = _sddmm(part, x[q0:q1], w) + delta
            ok = (U.mul_(part.to_rows(rate[q0:q1]).mul_(pi).expm1_().neg_()) < pi.clamp_(max=1.0)) & proposed.live[at]
            keep[at] = ok & (part.col <= part.to_rows(diagonal[q0:q1])) if causal else ok
            continue
        ok = U < part.to_rows(sure[q0:q1])
        unsure = ~ok
        if causal:
            allowed = part.col <= part.to_rows(diagonal[q0:q1])
            unsure &= allowed
            ok &= allowed
        index = unsure.nonzero().squeeze(1)
        checked = Edges.from_csr(
            _kept_offsets(unsure, part.row_ptr), part.col.index_select(0, index), 1, part.N, part.M
        )
        pi = _sddmm(checked, x[q0:q1], w) + delta
        U = U.index_select(0, index).mul_(checked.to_rows(rate[q0:q1]).mul_(pi).expm1_().neg_())
        ok.index_put_((index,), U < pi.clamp_(max=1.0))  # U·(1 − e^{−c_i π}) < min(1, π)
        keep[at] = ok
        kept[q0:q1] = _kept_offsets(ok, part.row_ptr).diff()
    if proposed.live is not None:  # the sizes stay those fastRG read
        return Edges.from_csr(proposed.row_ptr, proposed.col, R, N, M, keep, proposed.graph_ptr)
    return Edges.from_csr(_offsets(kept), _select(proposed.col, keep), R, N, M)


def _alpha(s: Tensor, top: Tensor, edges: Edges, at) -> Tensor:
    """exp(s_e − top_i) of the edges at CSR positions `at`, 0 where flagged (a query without live edges: top −∞)."""
    alpha = (s - top).exp_()
    return alpha if edges.live is None else alpha.masked_fill_(~edges.live[at], 0.0)


def _with_loops(edges: Edges, valid: Tensor) -> Edges:
    """Edges with (+I)'s self-loops: a sampled (i, i) flagged off, and a slot a query inserted in key order after its
    keys ≤ i, live for a valid token; sizes E + R·N, known without a read."""
    R, N, M = edges.R, edges.N, edges.M
    rows = torch.arange(R * N, device=edges.col.device)
    row, key = edges.to_rows(rows), edges.col.long() % M  # (E,) each edge's query and local key
    after = key > row % N
    at = torch.arange(edges.E, device=row.device) + row + after  # (E,) positions past the slots before them
    loop = edges.row_ptr[:-1] + rows + _kept_offsets(~after, edges.row_ptr).diff()  # (R·N,) each query's slot
    col, live = edges.col.new_empty(edges.E + R * N), torch.empty(edges.E + R * N, dtype=torch.bool, device=at.device)
    col[at], col[loop] = edges.col, (rows // N * M + rows % N).int()
    live[at] = key != row % N if edges.live is None else edges.live & (key != row % N)
    live[loop] = valid.repeat_interleave(R // len(valid), 0).reshape(-1)
    ptr = edges.row_ptr + torch.arange(R * N + 1, dtype=torch.int32, device=col.device)
    graph_ptr = None if edges.graph_ptr is None else edges.graph_ptr + np.arange(R + 1) * N
    return Edges.from_csr(ptr, col, R, N, M, live, graph_ptr)


class EdgeAttention(torch.autograd.Function):
    """σ_M(QKᵀ/√D) V on the edges (Eq. 3-4) with the STE of Eq. 9 as the gradient of `p`.

    Inputs q (R·N, D), k, v (R·M, D), p (E,) edge probabilities (their value is not used: the mask is the
    binary M), edges, keep (E,) bool dropout mask or None, p_drop, ste. Saves two floats per query (the
    softmax's maximum and sum) and nothing per edge but the graph: the backward recomputes s_e and α with the
    forward's kernels, bit for bit (fwd+bwd 10-25% longer at n = 2048-8192, D = 32). Products are
    sparse kernels over the edges: SDDMM for scores and ∂L/∂α, CSR products for the output and dQ,
    the same on the key-major copy for dK, dV (its SDDMMs k_j·q_i, v_j·dO_i give the query-major
    values). Chunks (Edges.chunks) change no bit; the peak holds four E-sized arrays of 4 bytes. The
    backward's sparse products have no derivative: a double backward (create_graph=True: a gradient
    penalty, gradgradcheck) raises at once."""

    @staticmethod
    def forward(ctx, q, k, v, p, edges: Edges, keep: Optional[Tensor], p_drop: float, ste: str):
        scale = q.shape[-1] ** -0.5
        s = _sddmm(edges, q, k, scale)  # (E,) scores s_e = q_i·k_j/√D
        live = s if edges.live is None else s.masked_fill(~edges.live, -torch.inf)  # flagged edges: no weight
        top = torch.segment_reduce(live, "max", offsets=edges.row_ptr, unsafe=True)  # (R·N,) stabiliser
        total = torch.empty_like(top)  # (R·N,) Σ_e exp(s_e − top_i), ≥ 1 if any edge
        y = v.new_empty(q.shape[0], v.shape[1])  # (R·N, D); a query without edges gets 0
        for q0, at, part in edges.chunks():
            q1 = q0 + part.N
            alpha = _alpha(s[at], part.to_rows(top[q0:q1]), edges, at)
            total[q0:q1] = torch.segment_reduce(alpha, "sum", offsets=part.row_ptr, unsafe=True)
            if edges.live is not None:  # a query without live edges: α = 0/1
                total[q0:q1].clamp_(min=1.0)
            alpha /= part.to_rows(total[q0:q1])  # softmax over each query's edges (Eq. 4)
            weights = alpha if keep is None else alpha * keep[at] / (1 - p_drop)
            y[q0:q1] = part.csr(weights) @ v
        ctx.save_for_backward(q, k, v, top, total, keep)
        ctx.edges, ctx.p_drop, ctx.ste = edges, p_drop, ste
        return y

    @staticmethod
    @fastrg.one_thread()
    def backward(ctx, grad_out):
        # Grad mode is on here only under create_graph=True. once_differentiable would not do: its error node hangs
        # off detached copies, so torch.autograd.grad never reaches it and returns the second derivative without
        # this function's part (gradgradcheck: a mismatch, not an error).
        if torch.is_grad_enabled():
            raise RuntimeError(
                "EdgeAttention has no second derivative: a double backward (create_graph=True) is "
                "refused; SBMAttention's reference path (path='reference') has one"
            )
        q, k, v, top, total, keep = ctx.saved_tensors
        edges, scale = ctx.edges, q.shape[-1] ** -0.5
        grad_out = grad_out.contiguous()
        drop = 1.0 if keep is None else 1 / (1 - ctx.p_drop)
        edges.key_major()  # built first, with only the graph held; StraightThroughEdges' backward reuses it
        dq, row_dot = torch.empty_like(q), torch.empty_like(top)  # (R·N,) Σ_e α_e ∂L/∂α_e per query
        dp_edge = q.new_empty(edges.E) if ctx.needs_input_grad[3] else None
        for q0, at, part in edges.chunks():  # query-major: dQ and Eq. 9
            q1 = q0 + part.N
            s = _sddmm(part, q[q0:q1], k, scale)  # the forward's scores, recomputed
            alpha = _alpha(s, part.to_rows(top[q0:q1]), edges, at)
            alpha /= part.to_rows(total[q0:q1])
            dp = _sddmm(part, grad_out[q0:q1], v, drop)  # ∂L/∂α_e = dO_i·v_j (÷ keep)
            if keep is not None:
                dp *= keep[at]
            row_dot[q0:q1] = torch.segment_reduce(alpha * dp, "sum", offsets=part.row_ptr, unsafe=True)
            ds = (dp - part.to_rows(row_dot[q0:q1])).mul_(alpha)  # ∂L/∂s_e, softmax backward
            dq[q0:q1] = (part.csr(ds) @ k).mul_(scale)
            if dp_edge is not None:
                # Eq. 9: ∂L/∂p_e := ∂L/∂A_e · s_e with A = M ⊙ QKᵀ/√D, i.e. the score's gradient times the score;
                # ste="official": the official code's hardtanh of the score's gradient.
                dp_edge[at] = ds.mul_(s) if ctx.ste == "paper" else ds.clamp_(-1.0, 1.0)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        for j0, at, part in edges.chunks(key_major=True):  # key-major: the same values, for dK and dV
            j1, rows = j0 + part.N, part.col
            s = _sddmm(part, k[j0:j1], q, scale)
            alpha = _alpha(s, top.index_select(0, rows), edges, at).div_(total.index_select(0, rows))
            dp = _sddmm(part, v[j0:j1], grad_out, drop)
            weights = alpha
            if keep is not None:
                kept = keep[at]
                dp *= kept
                weights = alpha * kept * drop
            dv[j0:j1] = part.csr(weights) @ grad_out
            ds = (dp - row_dot.index_select(0, rows)).mul_(alpha)
            dk[j0:j1] = (part.csr(ds) @ q).mul_(scale)
        return dq, dk, dv, dp_edge, None, None, None, None


class StraightThroughEdges(torch.autograd.Function):
    """The straight-through estimator of Eq. 9 on the sampled edges: forward the mask itself, M_e = 1 on every
    edge (a zero-stride view: no memory), and its count Σ_e M_e per graph (R,); backward ∂L/∂p_e := ∂L/∂M_e,
    the count's gradient included, into p_e = x_i · w_j (x = Q̂, w = K̂Ŝᵀ, so p_e = Q̂_iŜK̂_jᵀ): ∂x = G w, ∂w = Gᵀ x,
    O(E·K), per edge K/2D times the attention's backward (2× at Table 7's K = 128, D = 32). The attention core
    takes M from here and the density the counts, so each sampled edge's probability receives their gradients;
    p_e itself is never formed, nor G whole: a chunk of queries (keys) at a time. With self_loops the forced
    edges (i, i) are not sampled and receive none."""

    @staticmethod
    def forward(ctx, x, w, edges: Edges, self_loops: bool):
        ctx.save_for_backward(x, w)
        ctx.edges, ctx.self_loops = edges, self_loops
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no E-sized zeros
        return x.new_ones(()).expand(edges.E), edges.per_graph().to(x.dtype)

    @staticmethod
    @fastrg.one_thread()
    def backward(ctx, grad_mask, grad_counts):
        x, w = ctx.saved_tensors
        edges = ctx.edges
        if grad_mask is None and grad_counts is None:
            return None, None, None, None

        def edge_grad(start: int, at, part: Edges, key_major: bool) -> Tensor:
            """G on the edges of a chunk (Edges.chunks) at CSR positions `at` (a slice or an index)."""
            grad = None if grad_mask is None else grad_mask[at].contiguous()
            if grad_counts is None and not ctx.self_loops:
                return grad
            own = part.to_rows(torch.arange(start, start + part.N, device=part.col.device))  # the chunk's side
            rows, keys = (part.col, own) if key_major else (own, part.col)  # each edge's query and key
            if grad_counts is not None:  # each edge's share of its graph's count (an edge of M's)
                grad = grad_counts.index_select(0, rows // edges.N) + (0 if grad is None else grad)
                grad = grad if edges.live is None else grad.masked_fill(~edges.live[at], 0.0)
            if ctx.self_loops:
                grad = grad.masked_fill(rows % edges.N == keys % edges.M, 0.0)
            return grad

        dx, dw = torch.empty_like(x), torch.empty_like(w)
        for q0, at, part in edges.chunks():
            dx[q0 : q0 + part.N] = part.csr(edge_grad(q0, at, part, False)) @ w
        for j0, at, part in edges.chunks(key_major=True):
            dw[j0 : j0 + part.N] = part.csr(edge_grad(j0, at, part, True)) @ x
        edges._key_major = None  # the last use of the key-major copy (8 bytes an edge): freed before the rest of
        return dx, dw, None, None  # the backward; a second backward (retain_graph) builds it again


@torch.compiler.disable  # sparse CSR products on a data-dependent graph: eager under torch.compile
def attend_edges(q, k, v, graph: dict, p_drop: float, ste: str, self_loops: bool, generator):
    """SBMAttention.attend on the fast path: y (B, H, N, D) by EdgeAttention, and the (B, H) edge counts Σ_e M_e
    with the STE's gradient path (StraightThroughEdges), as the reference path computes them on a mask."""
    B, H, N, D = q.shape
    x, w, edges = graph["x"], graph["w"], graph["edges"]
    mask, counts = StraightThroughEdges.apply(x.reshape(-1, x.shape[-1]), w.reshape(-1, w.shape[-1]), edges, self_loops)
    keep = None
    if p_drop > 0:  # on the normalised weights, as on the reference path
        source = generator.device if generator is not None else q.device
        keep = torch.rand(edges.E, generator=generator, device=source).to(q.device) >= p_drop
    y = EdgeAttention.apply(
        q.reshape(B * H * N, D), k.reshape(B * H * N, D), v.reshape(B * H * N, D), mask, edges, keep, p_drop, ste
    ).view(B, H, N, D)
    return y, counts.view(B, H)


# ---------------------------------------------------------------------------------------------- procedures
def make_attention_factory(cfg: SBMConfig, dim: int, heads: int, head_dim: int, dropout: float, depth: int):
    """The backbone's make_attention(layer_index): the same SBM attention in every layer; the regulariser
    λ·(mean density over layers and heads) is split as λ/L per layer (§5.2)."""

    def make_attention(layer_index: int) -> SBMAttention:
        return SBMAttention(
            dim,
            heads,
            head_dim,
            dropout,
            clusters=cfg.clusters,
            delta=cfg.delta,
            density_weight=cfg.density_weight / depth,
            self_loops=cfg.self_loops,
            path=cfg.path,
            ste=cfg.ste,
            explore_in_eval=cfg.explore_in_eval,
            shared_mlp=cfg.shared_mlp,
        )

    return make_attention


def at_density(module: SBMAttention, x: Tensor, density: float) -> SBMAttention:
    """The module with its membership logits shifted by one constant β (module.shift), bisected so
    that its expected density on the inputs x (B, N, dim), Σ_ij (p_ij + δ) / (B·H·N²) (Eq. 6-8; p ≪ 1
    there, so min(1, ·) is inactive), is `density`: SBM as a trained model at that density samples."""
    b, n, _ = x.shape
    with torch.no_grad():
        qkv = module.qkv(x).view(b, n, 3, module.heads, module.head_dim)
        q, k, _ = qkv.permute(2, 0, 3, 1, 4)  # 3×(B, H, N, D)
        low, high = -40.0, 40.0
        for _ in range(50):
            module.shift = (low + high) / 2
            x_hat, z_hat = module.memberships(q), module.memberships(k)  # (B, H, N, K)
            edges = fastrg.expected_edges(x_hat, module.block_matrix(), z_hat)  # (B·H,)
            above = float(edges.sum()) / (b * module.heads * n * n) + module.delta > density
            low, high = (low, module.shift) if above else (module.shift, high)
    return module


def density_profile(model: nn.Module, evaluate, split: str, limit: Optional[int]) -> dict:
    """Mean and standard deviation over examples of each layer's and head's density (App. C, Fig. 5)."""
    seen = {i: [] for i in range(len(model.blocks))}

    def record(i):
        return lambda module, args, out: seen[i].append(out[1]["density_per_example"])

    hooks = [block.attn.register_forward_hook(record(i)) for i, block in enumerate(model.blocks)]
    try:
        evaluate(split, limit)
    finally:
        for hook in hooks:
            hook.remove()
    per_layer = [torch.cat(seen[i]).float() for i in range(len(seen))]  # (examples, H) per layer
    return {
        "split": split,
        "mean": [d.mean(0).tolist() for d in per_layer],
        "std": [d.std(0).tolist() if len(d) > 1 else [0.0] * d.shape[1] for d in per_layer],
    }


# -------------------------------------------------------------------------------------------------- main
def main(argv=None, prog: str = "python sbm_transformer.py") -> int:
    """SBM-Transformer trained on the shared loop (bench/): every step samples each head's graph and adds the
    regulariser λ·density (§5.2) to the loss; the record adds the test split's density per layer and head (App.
    C, Fig. 5) and, where δ is dropped in evaluation, the test metric with δ's random edges kept. It needs the
    repository's bench/; SBMAttention above does not."""
    import importlib.util

    if importlib.util.find_spec("bench") is None:  # this file alone, away from its repository
        sys.exit(
            f"{prog}: training needs the repository's bench/ beside this file (SBMAttention needs only torch and fastrg.py)"
        )
    from bench import cli, loop
    from bench.tasks import get_task

    cfg, sbm = cli.parse(
        argv,
        "sbm",
        prog,
        "Train and evaluate SBM-Transformer (Cho et al., NeurIPS 2022) on one task.",
        SBMConfig,
        flags={
            "official": "the official code's choices where no other is "
            "given: the reference path, hardtanh STE, δ in evaluation, one MLP for all heads"
        },
    )
    if cfg.flags["official"]:
        cfg = cfg.with_settings(**vars(SBMConfig.official()))
        sbm = cfg.settings
    with cli.one_line_errors():
        run = loop.setup(
            cfg,
            get_task(cfg.task),
            lambda m: make_attention_factory(sbm, m.dim, m.heads, m.head_dim, m.attn_dropout, m.depth),
        )
        # Departure from §5.2, where λ acts from the first step: with density_from > 0 it waits. From step 0, any
        # λ ≥ 1e-3 thins the graph to δ's floor within ~200 steps, before a task's signal (duplicates) appears.
        layers = [m for m in run.model.modules() if isinstance(m, SBMAttention)]
        for m in layers:
            m.density_weight = 0.0
        loop.train(run, until=sbm.density_from)
        for m in layers:
            m.density_weight = sbm.density_weight / cfg.depth
        loop.train(run)
        record = loop.final_record(run)
        if record is not None:
            limit = cfg.final_eval_batches
            record["sbm"] = {**vars(sbm), "density": density_profile(run.model, run.evaluate, "test", limit)}
            # the test split again with δ's random edges, which §4.2 adds for training and
            # evaluation otherwise drops: how much of the accuracy they bring
            if sbm.delta > 0 and not sbm.explore_in_eval:
                for m in layers:
                    m.explore_in_eval = True
                explored = run.evaluate("test", limit)
                record["sbm"]["test_with_exploration"] = {"metric": explored["metric"], "density": explored["density"]}
        loop.finish(run, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
