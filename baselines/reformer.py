"""Reformer LSH attention: shared-QK attention restricted to keys that share an angular-LSH bucket.

Kitaev, Kaiser, Levskaya, "Reformer: The Efficient Transformer" (ICLR 2020, arXiv 2001.04451), §2. Per head:

    k_j = q_j / ‖q_j‖                                  (shared-QK: keys are the normalised queries)
    h(x) = argmax([xR ; −xR]),  R: D × n_buckets/2     (angular LSH by a random rotation)
    per round r: sort tokens by (h_r, position), cut the sorted order into chunks of C = bucket_size;
    a query scores the keys of its own chunk and of the previous one (the chunked sets P̃_i^(r));
    causal=True replaces this by a window over the query's own bucket (deviation "Causal attention")
    o_i^(r) = Σ_{j ∈ P̃_i^(r)} exp(q_i·k_j/√D − m_ij − z(i, P̃_i^(r))) v_j,  z = logsumexp  (per round)
    m_ij = ∞ for padding / causally masked / self (unless nothing else is admissible), log N_ij otherwise
    o_i = Σ_r exp(z(i, P̃_i^(r)) − z(i, P_i)) o_i^(r)   (multi-round combination, z(i, P_i) = logsumexp_r z_r)

n_buckets = ⌈N / bucket_size⌉ rounded up to even (the hash needs n_buckets/2 directions), at least 2
(causal with N ≤ C: 1, see below), so an average bucket fills about one chunk, as in the paper.

Duplicate correction (implemented exactly): N_ij is the number of times key j is scored for query i over
all rounds *and* both chunks of a round (with a single chunk, U = 1, a round's window holds it twice).
Subtracting log N_ij from every occurrence makes Σ_occurrences exp(s_ij − log N_ij) = Σ_distinct exp(s_ij),
so o_i is the exact softmax over the union of the scored keys. N_ij is counted without sorting: key j is in
query i's window of round r' iff its chunk in round r' is i's chunk or the one before it (causal: same
bucket, at most W − 1 sorted slots back), so N_ij = Σ_r' of that test (chunked: the pair's own round always
passes it, so R − 1 lookups per scored pair), O(N·R²·C) elementwise work; the first occurrence (lowest round,
own chunk first) counts the distinct pairs.

Deviations from the paper and the official (trax) code:
- Self-masking: the paper penalises i = j by a finite 10⁵ so that a token attends to itself only when it
  has no other target. We implement that rule exactly: self is masked unless query i has no other
  admissible key in any round's window; then self is its only key.
- R has i.i.d. N(0, 1) entries, not orthogonalised (as in the official code); drawn per sample, head
  and round from ``generator`` when given.
- Rounds are chunked separately; the first chunk of a round looks back to the last chunk of the *same*
  round (wrap-around; trax concatenates the rounds, so its wrap reaches the previous round).
- Key padding (not discussed by the paper): padded tokens get a bucket after every real one, so they sort
  to the end in position order whatever their content; real tokens' chunks therefore do not depend on
  padded content, and padded keys are masked. N is padded to a multiple of C the same way. A padded
  query outputs zeros (full attention would mix valid keys there; either output is discarded).
- Dropout on the per-round attention weights, with the forward's generator (the paper does not say where).
- Causal attention (named deviation, causal=True only): the paper sorts the *whole* sequence by bucket and
  masks j > i inside the chunks (official code alike), so future tokens' hashes move the chunk boundaries
  and decide which *past* keys query t scores: outputs at t change when tokens after t change. The rule here
  is absolute, so causal attention keeps the paper's hash set P_i = {j : h(k_j) = h(q_i)} (§2) restricted
  to j ≤ i, and replaces "own chunk + previous chunk of the global sort" by a fixed window over the bucket's
  history: per round, query i scores itself and its W − 1 most recent same-bucket predecessors,
  W = min(2C, N). That depends only on tokens ≤ i (a token's hash is its own content and the draw R), so an
  output is a function of the past alone (up to floating-point rounding, see ``attend_causal``; gradients
  from later tokens are exactly zero). W = 2C is the paper's per-round window and its largest
  causal lookback (a query at the end of its chunk sees 2C − 1 earlier sorted slots; the average is about
  1.5C). Keys of other buckets that the paper's chunks also catch (an artefact of cutting the sort) are
  not scored, so causal density is below the paper's (about 2/3 of it on random inputs with N = 256,
  C = 32, R = 4: 0.22 against 0.33). Same self rule, rounds, log N_ij correction (N_ij ≤ R here: a round
  scores a key at most once), dropout and density. When N ≤ C the hash uses one bucket (no draw): the
  paper's single chunk is then exactly full causal attention, and so is this window. Cost O(N·R·W·D): the
  sorted order is cut into blocks of W and each block's queries score the previous block and their own
  (2W keys, masked to each query's window), as the chunked path; no N × N tensor and no per-pair copy of
  the keys. Dropout is drawn per (round, query position, window slot), so even the dropped pairs do not
  depend on later tokens.
- Density: distinct scored (query, key) pairs that are admissible as in full attention (valid key, j ≤ i
  when causal; the self pair included) / (valid queries × valid keys), per head, summed over the batch.
  Computed pairs (INTERFACE.md) count the work instead: R·2C scored keys a query, duplicates and masked slots
  included, capped at its admissible keys, on the same denominator.

Shape legend: B batch, H heads, N queries (= M keys; N' after padding to a multiple of C), D head dim,
R hash rounds, C chunk length (bucket_size), U chunks per round (N'/C), W keys per query window (2C chunked;
min(2C, N) causal).
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.common import check_padding_mask, generator_dropout


def gather_slots(t: Tensor, index: Tensor) -> Tensor:
    """t (B, H, R, N', ...) re-ordered along dim 3 by index (B, H, R, N'): out[..., s, :] = t[..., index[s], :]."""
    index = index.view(*index.shape, *([1] * (t.dim() - 4))).expand_as(t)
    return t.gather(3, index)


def with_previous_chunk(t: Tensor) -> Tensor:
    """(B, H, R, U, C, ...) → (B, H, R, U, 2C, ...): each chunk followed by the chunk before it (wrapping)."""
    return torch.cat([t, t.roll(1, dims=3)], dim=4)


def lsh_buckets(
    k: Tensor, valid: Tensor, n_rounds: int, n_buckets: int, generator: Optional[torch.Generator]
) -> Tensor:
    """Angular LSH h(x) = argmax([xR; −xR]), one random R per sample, head and round: k (B, H, N, D), valid
    (B, N) → buckets (B, H, R, N). Padding gets bucket n_buckets (after every real one) whatever its content.
    n_buckets = 1 (causal, N ≤ C) hashes nothing and draws nothing."""
    b, h, n, d = k.shape
    if n_buckets == 1:
        buckets = torch.zeros(b, h, n_rounds, n, dtype=torch.long, device=k.device)
    else:
        rot = torch.randn(b, h, n_rounds, d, n_buckets // 2, generator=generator, device=k.device, dtype=k.dtype)
        with torch.no_grad():  # integer buckets: no gradient, so nothing to record
            proj = torch.einsum("bhnd,bhrdk->bhrnk", k, rot)  # (B, H, R, N, n_buckets/2)
            buckets = torch.cat([proj, -proj], dim=-1).argmax(-1)  # (B, H, R, N)
    return buckets.masked_fill(~valid[:, None, None, :], n_buckets)  # padding last, content ignored


class SoftmaxWithLSE(torch.autograd.Function):
    """Row softmax P = softmax(S) and its log-normaliser z = logsumexp(S) in one fused softmax; the backward,
    ∂L/∂S = P ⊙ (G − rowsum(G ⊙ P) + g_z), is the fused softmax backward plus one term (∂z/∂S = P)."""

    @staticmethod
    def forward(ctx, scores: Tensor):
        probs = scores.softmax(-1)
        # z = s_j − log p_j for any j; at the row's maximum p_j ≥ 1/W, so the log is well conditioned.
        lse = scores.amax(-1) - probs.amax(-1).log()
        ctx.save_for_backward(probs)
        return probs, lse

    @staticmethod
    def backward(ctx, grad_probs: Tensor, grad_lse: Tensor):
        (probs,) = ctx.saved_tensors
        grad = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        return grad.addcmul_(probs, grad_lse[..., None])


def softmax_with_lse(scores: Tensor):
    """(…, W) scores → (softmax over W, logsumexp over W), see SoftmaxWithLSE."""
    return SoftmaxWithLSE.apply(scores)


def first_occurrences(seen: Optional[Tensor], this_round: int, u: int, c: int, admissible: Optional[Tensor]):
    """Pairs of one round of the chunked path that no earlier round scored, per (B, H): seen (B, H, U, C, W)
    marks those an earlier round did (None in round 0); admissible (same shape) restricts the count (None: all
    pairs are). With one chunk (U = 1) a round's window holds the chunk twice and every round scores every
    pair: only round 0's own-chunk copy is a first occurrence."""
    if u == 1:
        if this_round > 0:
            return 0
        return admissible[..., :c].sum((2, 3, 4)) if admissible is not None else c * c
    if admissible is not None:
        return (admissible if seen is None else admissible & ~seen).sum((2, 3, 4))
    pairs = u * c * 2 * c
    return pairs if seen is None else pairs - seen.sum((2, 3, 4))


def density_of(distinct: Tensor, valid: Tensor) -> Tensor:
    """Distinct admissible pairs (B, H) → density (H,): summed over the batch, over valid queries × valid keys."""
    tokens = valid.sum(1).double()  # (B,)
    return (distinct.double().sum(0) / (tokens**2).sum().clamp_min(1)).float()


def scored_pairs(valid: Tensor, causal: bool, keys: int) -> Tensor:
    """() Σ over valid queries of min(keys, the query's admissible keys) / Σ_b (valid count)²: valid (B, N)."""
    valid = valid.double()
    admissible = valid.cumsum(1) if causal else valid.sum(1, keepdim=True)  # (B, N|1): valid keys j (≤ i)
    return ((admissible.clamp_max(keys) * valid).sum() / (valid.sum(1) ** 2).sum().clamp_min(1)).float()


class ReformerAttention(nn.Module):
    """Multi-round LSH attention with shared QK (INTERFACE.md).

    Budget: ``n_hashes`` rounds R; ``bucket_size`` C (chunk length; n_buckets = ⌈N/C⌉ rounded up to even).
    Projections: ``qk`` (shared query/key) and ``v``, as the paper's shared-QK Transformer.
    """

    def __init__(
        self, dim: int, heads: int, head_dim: int, dropout: float = 0.0, *, n_hashes: int = 4, bucket_size: int = 64
    ):
        super().__init__()
        if min(dim, heads, head_dim, n_hashes, bucket_size) < 1:
            raise ValueError(
                f"dim, heads, head_dim, n_hashes and bucket_size must be positive, got "
                f"{dim}, {heads}, {head_dim}, {n_hashes}, {bucket_size}"
            )
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.n_hashes, self.bucket_size = n_hashes, bucket_size
        self.qk = nn.Linear(dim, heads * head_dim)
        self.v = nn.Linear(dim, heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, head_dim={self.head_dim}, n_hashes={self.n_hashes}, bucket_size={self.bucket_size}"

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
    ):
        b, n, _ = x.shape
        check_padding_mask(key_padding_mask, b, n)
        valid = (
            torch.ones(b, n, dtype=torch.bool, device=x.device) if key_padding_mask is None else ~key_padding_mask
        )  # (B, N)
        q = self.qk(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)  # (B, H, N, D)
        v = self.v(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)  # (B, H, N, D)
        # Hashing, scores and softmax in float32 at least (float64 kept), even under autocast.
        with torch.autocast(device_type=x.device.type, enabled=False):
            compute = torch.promote_types(q.dtype, torch.float32)
            attend = self.attend_causal if causal else self.attend
            y, density = attend(q.to(compute), v.to(compute), valid, generator)
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        scored = scored_pairs(valid, causal, 2 * self.n_hashes * self.bucket_size).expand(self.heads).clone()
        return self.out(y), {"density": density, "computed_pairs": scored}  # (H,) each

    def attend(self, q: Tensor, v: Tensor, valid: Tensor, generator: Optional[torch.Generator]):
        """The paper's sorted-chunk attention (non-causal). (B, H, N, D) ×2, (B, N) valid → y (B, H, N, D),
        density (H,).

        Work per scored pair is kept to the score matmul, one additive bias (−log N_ij, or the mask fill) that
        the matmul adds as it writes, a fused softmax and the P·V matmul: a query's own key sits on the
        diagonal of its chunk's block (and, with one chunk, also C columns on), so the self rule touches C
        entries per chunk, and the padding mask is applied only when there is padding."""
        b, h, n, d = q.shape
        r, c = self.n_hashes, self.bucket_size
        u = -(-n // c)  # chunks per round
        n_pad = u * c
        n_buckets = max(2, u + u % 2)
        # Without padding (and N > 1) every query has another key in its window: no padding mask, and the self
        # rule always masks self. Otherwise the general masks below.
        general = n_pad > n or n == 1 or not bool(valid.all())
        if n_pad > n:
            q, v = F.pad(q, (0, 0, 0, n_pad - n)), F.pad(v, (0, 0, 0, n_pad - n))  # (B, H, N', D)
            valid = F.pad(valid, (0, n_pad - n), value=False)  # (B, N')
        k = F.normalize(q, dim=-1)  # shared-QK keys

        buckets = lsh_buckets(k, valid, r, n_buckets, generator)  # (B, H, R, N')
        pos = torch.arange(n_pad, device=q.device)  # (N',)
        perm = (buckets * n_pad + pos).argsort(-1)  # (B, H, R, N'): sorted slot → position, by (bucket, pos)
        inv = perm.argsort(-1)  # (B, H, R, N'): position → sorted slot
        rows = (perm + torch.arange(b * h, device=q.device).view(b, h, 1, 1) * n_pad).flatten()  # (B·H·R·N',)

        # One row lookup gathers q, k and v in sorted order (its backward adds the R copies back in place).
        qkv = torch.cat([q / math.sqrt(d), k, v], dim=-1).view(b * h * n_pad, 3 * d)
        sq, sk, sv = qkv.index_select(0, rows).view(b, h, r, u, c, 3 * d).split(d, dim=-1)  # (B, H, R, U, C, D)
        wk, wv = with_previous_chunk(sk), with_previous_chunk(sv)  # (B, H, R, U, W, D)
        q_pos = perm.view(b, h, r, u, c)  # (B, H, R, U, C) original positions of the sorted queries
        k_pos = with_previous_chunk(q_pos)  # (B, H, R, U, W)

        if general:  # admissible pairs: valid query and valid key, as in full attention
            q_valid = valid.expand(b, n_pad)[:, None, None].expand(b, h, r, n_pad).gather(3, perm).view(b, h, r, u, c)
            k_valid = with_previous_chunk(q_valid)  # (B, H, R, U, W)
            admissible = q_valid[..., :, None] & k_valid[..., None, :]  # (B, H, R, U, C, W)

        # N_ij: occurrences of key j among query i's R·W scored keys (all rounds, both chunks). In its own round
        # every scored key occurs once; round r' ≠ r scores it iff its chunk there is i's chunk or the one before
        # (chunk −1 wraps as in the sort): one test per pair and other round. `seen` marks the pairs of round r
        # that an earlier round already scored; `first` counts the rest, the distinct pairs of the density.
        chunk = inv // c  # (B, H, R, N'): chunk of each position in each round
        count = torch.ones(b, h, r, u, c, 2 * c, dtype=q.dtype, device=q.device)  # (B, H, R, U, C, W)
        first = torch.zeros(b, h, dtype=torch.long, device=q.device)  # (B, H)
        for this_round in range(r):
            seen = None
            for other_round in range(r):
                if other_round == this_round:
                    continue
                there = chunk[:, :, other_round]  # (B, H, N')
                key_chunk = there.gather(2, k_pos[:, :, this_round].reshape(b, h, -1)).view(b, h, u, 1, 2 * c)
                query_chunk = there.gather(2, q_pos[:, :, this_round].reshape(b, h, -1)).view(b, h, u, c, 1)
                hit = (key_chunk == query_chunk) | (key_chunk == (query_chunk - 1) % u)  # (B, H, U, C, W)
                count[:, :, this_round] += hit
                if other_round < this_round:
                    seen = hit if seen is None else seen | hit
            first += first_occurrences(seen, this_round, u, c, admissible[:, :, this_round] if general else None)
        if u == 1:  # one chunk: it is its own previous chunk, so every key occurs twice per round
            count *= 2
        bias = count.log_().neg_()  # (B, H, R, U, C, W): −log N_ij

        # Masks: padded queries and keys, then the self rule: query i's own key is masked unless i has no other
        # admissible key in any round's window.
        fill = torch.finfo(bias.dtype).min
        if general:
            bias.masked_fill_(~admissible, fill)
            others = k_valid.sum(-1, keepdim=True) - (2 if u == 1 else 1)  # (B, H, R, U, 1) valid keys but self
            has_other = (q_valid & (others > 0)).view(b, h, r, n_pad)  # (B, H, R, N')
            has_other = has_other.gather(3, inv).any(2, keepdim=True).expand(b, h, r, n_pad)  # per position
            self_masked = has_other.gather(3, perm).view(b, h, r, u, c)  # (B, H, R, U, C)
        else:
            self_masked = torch.ones(b, h, r, u, c, dtype=torch.bool, device=q.device)
        for offset in (0, c) if u == 1 else (0,):
            bias.diagonal(offset, dim1=-2, dim2=-1).masked_fill_(self_masked, fill)

        scores = torch.baddbmm(bias.view(-1, c, 2 * c), sq.reshape(-1, c, d), wk.reshape(-1, 2 * c, d).transpose(1, 2))
        probs, lse = softmax_with_lse(scores)  # (B·H·R·U, C, W), (B·H·R·U, C): z(i, P̃_i^(r))
        if self.training:
            probs = generator_dropout(probs, self.dropout, generator)
        o = torch.bmm(probs, wv.reshape(-1, 2 * c, d)).view(b, h, r, n_pad, d)  # o_i^(r), in sorted order

        # Multi-round combination, weights exp(z_r − logsumexp_r z_r) per position, added back in position
        # order by the inverse of the row lookup.
        lse = lse.view(b, h, r, n_pad)
        weight = lse.gather(3, inv).softmax(2).gather(3, perm)  # (B, H, R, N'), sorted order
        y = (o * weight[..., None]).view(-1, d)
        y = torch.zeros(b * h * n_pad, d, dtype=y.dtype, device=y.device).index_add(0, rows, y)
        # A valid query always has at least itself; a padded query has nothing admissible: zeros.
        y = (y.view(b, h, n_pad, d) * valid[:, None, :, None])[:, :, :n]  # (B, H, N, D)

        return y, density_of(first, valid)

    def attend_causal(self, q: Tensor, v: Tensor, valid: Tensor, generator: Optional[torch.Generator]):
        """Strictly causal LSH attention (module docstring, "Causal attention"): per round, query i scores
        itself and its W − 1 most recent same-bucket predecessors, i.e. the sorted slots s_i − W + 1, …, s_i
        (a bucket's slots are contiguous and in position order; other buckets' slots are masked).

        Two layouts of the same pairs. *Window* layout (…, slot s_i, j ∈ [0, W) for key slot s_i − W + 1 + j;
        j = W − 1 is the query itself): every per-pair quantity (masks, N_ij, softmax, dropout) lives here, so
        which keys a query scores, their weights' inputs and its dropout draws are functions of the past alone.
        *Blocked* layout (sorted slots cut into blocks of W; a block's queries score the previous block and
        their own, 2W keys): the two matmuls, so keys and values are read once per block instead of gathered
        once per (query, key) pair. A query's keys sit at columns set by its sorted slot, which later tokens
        can move, so a matmul may round a score differently (1 ulp): outputs before t agree to rounding, not
        bitwise, when tokens from t on change; gradients from the future are exactly zero.
        (B, H, N, D) ×2, (B, N) valid → y (B, H, N, D), density (H,)."""
        b, h, n, d = q.shape
        r, c = self.n_hashes, self.bucket_size
        u = -(-n // c)
        n_buckets = 1 if u == 1 else u + u % 2  # as the chunked path, but one bucket when one chunk holds all
        w = min(2 * c, n)
        blocks = -(-n // w)
        n_pad = blocks * w
        k = F.normalize(q, dim=-1)  # shared-QK keys
        buckets = lsh_buckets(k, valid, r, n_buckets, generator)  # (B, H, R, N)
        pos = torch.arange(n, device=q.device)  # (N,)
        perm = (buckets * n + pos).argsort(-1)  # (B, H, R, N): sorted slot → position, by (bucket, position)
        inv = perm.argsort(-1)  # (B, H, R, N): position → sorted slot

        def sort(t: Tensor) -> Tensor:  # per position (B, H, N, ...) → per sorted slot (B, H, R, N, ...)
            return gather_slots(t.unsqueeze(2).expand(b, h, r, *t.shape[2:]), perm)

        def window(t: Tensor, fill) -> Tensor:  # per slot (B, H, R, N) → (B, H, R, N, W): [s, j] = t[s − W + 1 + j]
            return F.pad(t, (w - 1, 0), value=fill).unfold(-1, w, 1)

        def blocked(t: Tensor) -> Tensor:  # per slot (B, H, R, N, D) → keys of each block (B, H, R, blocks, 2W, D)
            t = F.pad(t, (0, 0, w, n_pad - n)).view(b, h, r, blocks + 1, w, t.shape[-1])
            return torch.cat([t[:, :, :, :-1], t[:, :, :, 1:]], dim=4)  # previous block (zeros before 0), own

        # Window layout of the pairs. Padding has its own bucket n_buckets, so a same-bucket key of a valid
        # query is valid, and the bucket sorts after the real ones: slots before slot 0 read bucket −1.
        sorted_bucket = buckets.gather(3, perm)  # (B, H, R, N)
        same_bucket = window(sorted_bucket, -1) == sorted_bucket[..., None]  # (B, H, R, N, W)
        admissible = same_bucket & sort(valid[:, None].expand(b, h, n))[..., None]  # (B, H, R, N, W)
        is_self = torch.zeros(w, dtype=torch.bool, device=q.device)
        is_self[-1] = True  # the last key of a window is the query itself
        other = admissible & ~is_self
        has_other = gather_slots(other.any(-1), inv).any(2)  # (B, H, N): some round scores a non-self key for i
        self_needed = ~sort(has_other)  # (B, H, R, N)
        allowed = other | (admissible & is_self & self_needed[..., None])  # (B, H, R, N, W)

        # N_ij: rounds whose window scores key j for query i: same bucket in round r' and at most W − 1 sorted
        # slots before i there. Per slot of round r: its bucket and slot in round r'; the key's via window().
        rounds = torch.arange(r, device=q.device).view(r, 1, 1)  # (R, 1, 1): the slot's own round
        count = torch.zeros(b, h, r, n, w, dtype=q.dtype, device=q.device)  # (B, H, R, N, W)
        earlier = torch.zeros(b, h, r, n, w, dtype=torch.bool, device=q.device)
        for other_round in range(r):
            bucket_there = buckets[:, :, other_round, None].expand(b, h, r, n).gather(3, perm)  # (B, H, R, N)
            slot_there = inv[:, :, other_round, None].expand(b, h, r, n).gather(3, perm)  # (B, H, R, N)
            back = slot_there[..., None] - window(slot_there, n)  # (B, H, R, N, W): slots from i back to j
            hit = (window(bucket_there, -1) == bucket_there[..., None]) & (back >= 0) & (back < w)
            count += hit
            earlier |= hit & (rounds > other_round)
        count.clamp_(min=1)  # unscored slots are masked below; keep their log finite

        # Scores in the blocked layout, read out in window order: the 2W columns of a block are slots from the
        # start of the previous block on, so key j of the block's query a is column a + 1 + j.
        sq = F.pad(sort(q / math.sqrt(d)), (0, 0, 0, n_pad - n)).view(b, h, r, blocks, w, d)
        wk, wv = blocked(sort(k)), blocked(sort(v))  # (B, H, R, blocks, 2W, D)
        a = torch.arange(w, device=q.device)
        column = (a[:, None] + 1 + a[None, :]).expand(b, h, r, blocks, w, w)  # (…, query a, window j)
        scores = (sq @ wk.transpose(-1, -2)).gather(-1, column).view(b, h, r, n_pad, w)[:, :, :, :n]
        scores = scores - count.log()
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)  # (B, H, R, N, W)
        lse = scores.logsumexp(-1)  # (B, H, R, N): z(i, P̃_i^(r))
        # masked_fill: a round with nothing allowed for i outputs exactly 0 (its round weight is 0 anyway).
        probs = (scores - lse[..., None]).exp().masked_fill(~allowed, 0.0)
        if self.training and self.dropout > 0:
            # Drawn per (round, query position, window j), then carried to the sorted slots.
            keep = generator_dropout(
                torch.ones(b, h, r, n, w, dtype=probs.dtype, device=probs.device), self.dropout, generator
            )
            probs = probs * gather_slots(keep, perm)
        # Back to the blocked layout (column a + 1 + j; the row's other W columns read a zero) for P·V.
        key = torch.arange(2 * w, device=q.device) - a[:, None] - 1  # (W, 2W): window j of column, row a
        key = torch.where((key >= 0) & (key < w), key, w).expand(b, h, r, blocks, w, 2 * w)
        probs = F.pad(probs, (0, 1, 0, n_pad - n)).view(b, h, r, blocks, w, w + 1).gather(-1, key)
        o = (probs @ wv).view(b, h, r, n_pad, d)[:, :, :, :n]  # (B, H, R, N, D): o_i^(r), per sorted slot
        o, lse = gather_slots(o, inv), gather_slots(lse, inv)  # back to position order
        y = (lse.softmax(2)[..., None] * o).sum(2)  # (B, H, N, D): multi-round combination
        y = y * valid[:, None, :, None]  # a padded query has nothing admissible: zeros

        distinct = (admissible & ~earlier).sum((2, 3, 4))  # (B, H): first occurrences of admissible pairs
        return y, density_of(distinct, valid)
