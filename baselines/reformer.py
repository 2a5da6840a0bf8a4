"""Reformer LSH attention: shared-QK attention restricted to keys that share an angular-LSH bucket.

Kitaev, Kaiser, Levskaya, "Reformer: The Efficient Transformer" (ICLR 2020), §2. Per head:

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
bucket, at most W − 1 sorted slots back), so N_ij = Σ_r' of that test, R lookups per scored pair,
O(N·R²·C) elementwise work; the first occurrence (lowest round, own chunk first) counts the distinct pairs.

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
  output is a function of the past alone, bitwise. W = 2C is the paper's per-round window and its largest
  causal lookback (a query at the end of its chunk sees 2C − 1 earlier sorted slots; the average is about
  1.5C). Keys of other buckets that the paper's chunks also catch (an artefact of cutting the sort) are
  not scored, so causal density is below the paper's (about 2/3 of it on random inputs with N = 256,
  C = 32, R = 4: 0.22 against 0.33). Same self rule, rounds, log N_ij correction (N_ij ≤ R here: a round
  scores a key at most once), dropout and density. When N ≤ C the hash uses one bucket (no draw): the
  paper's single chunk is then exactly full causal attention, and so is this window. Cost O(N·R·W·D), as
  the chunked path; no N × N tensor. Dropout is drawn per (round, query position, window offset), so even
  the dropped pairs do not depend on later tokens.
- Density: distinct scored (query, key) pairs that are admissible as in full attention (valid key, j ≤ i
  when causal; the self pair included) / (valid queries × valid keys), per head, summed over the batch.

Shape legend: B batch, H heads, N queries (= M keys; N' after padding to a multiple of C), D head dim,
R hash rounds, C chunk length (bucket_size), U chunks per round (N'/C), W keys per query window (2C chunked;
min(2C, N) causal).
"""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.common import generator_dropout



def gather_slots(t: Tensor, index: Tensor) -> Tensor:
    """t (B, H, R, N', ...) re-ordered along dim 3 by index (B, H, R, N'): out[..., s, :] = t[..., index[s], :]."""
    index = index.view(*index.shape, *([1] * (t.dim() - 4))).expand_as(t)
    return t.gather(3, index)


def with_previous_chunk(t: Tensor) -> Tensor:
    """(B, H, R, U, C, ...) → (B, H, R, U, 2C, ...): each chunk followed by the chunk before it (wrapping)."""
    return torch.cat([t, t.roll(1, dims=3)], dim=4)


def lsh_buckets(k: Tensor, valid: Tensor, n_rounds: int, n_buckets: int,
                generator: Optional[torch.Generator]) -> Tensor:
    """Angular LSH h(x) = argmax([xR; −xR]), one random R per sample, head and round: k (B, H, N, D), valid
    (B, N) → buckets (B, H, R, N). Padding gets bucket n_buckets (after every real one) whatever its content.
    n_buckets = 1 (causal, N ≤ C) hashes nothing and draws nothing."""
    b, h, n, d = k.shape
    if n_buckets == 1:
        buckets = torch.zeros(b, h, n_rounds, n, dtype=torch.long, device=k.device)
    else:
        rot = torch.randn(b, h, n_rounds, d, n_buckets // 2, generator=generator, device=k.device, dtype=k.dtype)
        proj = torch.einsum("bhnd,bhrdk->bhrnk", k, rot)  # (B, H, R, N, n_buckets/2)
        buckets = torch.cat([proj, -proj], dim=-1).argmax(-1)  # (B, H, R, N)
    return buckets.masked_fill(~valid[:, None, None, :], n_buckets)  # padding last, content ignored


def gather_keys(t: Tensor, index: Tensor) -> Tensor:
    """t (B, H, N, ...) at positions index (B, H, R, N, W) → (B, H, R, N, W, ...), one row lookup per key."""
    b, h, r, n, w = index.shape
    base = torch.arange(b * h, device=index.device).view(b, h, 1, 1, 1) * t.shape[2]  # row of (b, h, 0)
    rows = t.reshape(b * h * t.shape[2], *t.shape[3:])  # (B·H·N, ...)
    return rows.index_select(0, (index + base).flatten()).view(b, h, r, n, w, *t.shape[3:])


def density_of(distinct: Tensor, valid: Tensor) -> Tensor:
    """Distinct admissible pairs (B, H) → density (H,): summed over the batch, over valid queries × valid keys."""
    tokens = valid.sum(1).double()  # (B,)
    return (distinct.double().sum(0) / (tokens ** 2).sum().clamp_min(1)).float()


class ReformerAttention(nn.Module):
    """Multi-round LSH attention with shared QK (INTERFACE.md).

    Budget: ``n_hashes`` rounds R; ``bucket_size`` C (chunk length; n_buckets = ⌈N/C⌉ rounded up to even).
    Projections: ``qk`` (shared query/key) and ``v``, as the paper's shared-QK Transformer.
    """

    def __init__(self, dim: int, heads: int, head_dim: int, dropout: float = 0.0, *, n_hashes: int = 4,
                 bucket_size: int = 64):
        super().__init__()
        if min(dim, heads, head_dim, n_hashes, bucket_size) < 1:
            raise ValueError(f"dim, heads, head_dim, n_hashes and bucket_size must be positive, got "
                             f"{dim}, {heads}, {head_dim}, {n_hashes}, {bucket_size}")
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.n_hashes, self.bucket_size = n_hashes, bucket_size
        self.qk = nn.Linear(dim, heads * head_dim)
        self.v = nn.Linear(dim, heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, head_dim={self.head_dim}, n_hashes={self.n_hashes}, "
                f"bucket_size={self.bucket_size}")

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None, causal: bool = False,
                generator: Optional[torch.Generator] = None):
        b, n, _ = x.shape
        if key_padding_mask is not None and key_padding_mask.shape != (b, n):
            raise ValueError(f"key_padding_mask must have shape {(b, n)}, got {tuple(key_padding_mask.shape)}")
        valid = (torch.ones(b, n, dtype=torch.bool, device=x.device) if key_padding_mask is None
                 else ~key_padding_mask)  # (B, N)
        q = self.qk(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)  # (B, H, N, D)
        v = self.v(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)  # (B, H, N, D)
        # Hashing, scores and softmax in float32 at least (float64 kept), even under autocast.
        with torch.autocast(device_type=x.device.type, enabled=False):
            compute = torch.promote_types(q.dtype, torch.float32)
            attend = self.attend_causal if causal else self.attend
            y, density = attend(q.to(compute), v.to(compute), valid, generator)
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        return self.out(y), {"density": density}

    def attend(self, q: Tensor, v: Tensor, valid: Tensor, generator: Optional[torch.Generator]):
        """The paper's sorted-chunk attention (non-causal). (B, H, N, D) ×2, (B, N) valid → y (B, H, N, D),
        density (H,)."""
        b, h, n, d = q.shape
        r, c = self.n_hashes, self.bucket_size
        u = -(-n // c)  # chunks per round
        n_pad = u * c
        n_buckets = max(2, u + u % 2)
        q, v = F.pad(q, (0, 0, 0, n_pad - n)), F.pad(v, (0, 0, 0, n_pad - n))  # (B, H, N', D)
        valid = F.pad(valid, (0, n_pad - n), value=False)  # (B, N')
        k = F.normalize(q, dim=-1)  # shared-QK keys

        buckets = lsh_buckets(k, valid, r, n_buckets, generator)  # (B, H, R, N')
        pos = torch.arange(n_pad, device=q.device)  # (N',)
        perm = (buckets * n_pad + pos).argsort(-1)  # (B, H, R, N'): sorted slot → position, by (bucket, pos)
        inv = perm.argsort(-1)  # (B, H, R, N'): position → sorted slot

        def to_chunks(t: Tensor) -> Tensor:  # (B, H, N', ...) → (B, H, R, U, C, ...) in sorted order
            t = gather_slots(t.unsqueeze(2).expand(b, h, r, *t.shape[2:]), perm)
            return t.view(b, h, r, u, c, *t.shape[4:])

        sq, sk, sv = to_chunks(q), to_chunks(k), to_chunks(v)  # (B, H, R, U, C, D)
        q_pos = perm.view(b, h, r, u, c)  # (B, H, R, U, C) original positions of the sorted queries
        q_valid = to_chunks(valid[:, None].expand(b, h, n_pad))  # (B, H, R, U, C)
        k_pos, k_valid = with_previous_chunk(q_pos), with_previous_chunk(q_valid)  # (B, H, R, U, W)
        wk, wv = with_previous_chunk(sk), with_previous_chunk(sv)  # (B, H, R, U, W, D)

        # Masks over (query, scored key): admissible as in full attention, then the self rule.
        admissible = q_valid[..., :, None] & k_valid[..., None, :]  # (B, H, R, U, C, W)
        is_self = k_pos[..., None, :] == q_pos[..., :, None]  # (B, H, R, U, C, W)
        other = admissible & ~is_self
        # has_other: query i has an admissible non-self key in some round's window.
        has_other = gather_slots(other.any(-1).view(b, h, r, n_pad), inv).any(2)  # (B, H, N')
        self_needed = ~gather_slots(has_other[:, :, None].expand(b, h, r, n_pad), perm)  # (B, H, R, N')
        allowed = other | (admissible & is_self & self_needed.view(b, h, r, u, c, 1))  # (B, H, R, U, C, W)

        # N_ij: occurrences of key j among query i's R·W scored keys (all rounds, both chunks). Within a chunk
        # every query scores the same W keys, so round r' needs the chunks of (B, H, R, U, W) keys and
        # (B, H, R, U, C) queries; only the test itself is (B, H, R, U, C, W). Chunk −1 wraps as in the sort.
        chunk = inv // c  # (B, H, R, N'): chunk of each position in each round
        rounds = torch.arange(r, device=q.device).view(r, 1, 1, 1)  # (R, 1, 1, 1): the slot's own round
        count = torch.zeros(b, h, r, u, c, 2 * c, dtype=q.dtype, device=q.device)  # (B, H, R, U, C, W)
        earlier = torch.zeros(b, h, r, u, c, 2 * c, dtype=torch.bool, device=q.device)
        for other_round in range(r):
            key_chunk = chunk[:, :, other_round].gather(2, k_pos.view(b, h, -1)).view(b, h, r, u, 1, 2 * c)
            query_chunk = chunk[:, :, other_round].gather(2, q_pos.view(b, h, -1)).view(b, h, r, u, c, 1)
            hit = (key_chunk == query_chunk) | (key_chunk == (query_chunk - 1) % u)  # (B, H, R, U, C, W)
            count += hit
            earlier |= hit & (rounds > other_round)
        if u == 1:  # one chunk: it is its own previous chunk, so every key occurs twice per round
            count *= 2
        first = ~earlier  # the key's first occurrence for this query: lowest round, own-chunk copy if U = 1
        if u == 1:
            first[..., c:] = False

        scores = torch.einsum("bhrucd,bhruwd->bhrucw", sq / math.sqrt(d), wk) - count.log()
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)  # (B, H, R, U, C, W)
        lse = scores.logsumexp(-1, keepdim=True)  # (B, H, R, U, C, 1): z(i, P̃_i^(r))
        probs = (scores - lse).exp()
        if self.training:
            probs = generator_dropout(probs, self.dropout, generator)
        o = probs @ wv  # (B, H, R, U, C, D): o_i^(r)

        # Multi-round combination: weights exp(z_r − logsumexp_r z_r), back in position order.
        o = gather_slots(o.view(b, h, r, n_pad, d), inv)  # (B, H, R, N', D)
        weight = gather_slots(lse.view(b, h, r, n_pad), inv).softmax(2)  # (B, H, R, N')
        y = (weight[..., None] * o).sum(2)  # (B, H, N', D)
        # A valid query always has at least itself; a padded query has nothing admissible: zeros.
        y = (y * valid[:, None, :, None])[:, :, :n]  # (B, H, N, D)

        distinct = (first & admissible).sum((2, 3, 4, 5))  # (B, H): first occurrences of admissible pairs
        return y, density_of(distinct, valid)

    def attend_causal(self, q: Tensor, v: Tensor, valid: Tensor, generator: Optional[torch.Generator]):
        """Strictly causal LSH attention (module docstring, "Causal attention"): per round, query i scores
        itself and its W − 1 most recent same-bucket predecessors. Queries stay in position order throughout,
        so every per-query quantity (window, dropout draw, round weights) is indexed by the past alone.
        (B, H, N, D) ×2, (B, N) valid → y (B, H, N, D), density (H,)."""
        b, h, n, d = q.shape
        r, c = self.n_hashes, self.bucket_size
        u = -(-n // c)
        n_buckets = 1 if u == 1 else u + u % 2  # as the chunked path, but one bucket when one chunk holds all
        w = min(2 * c, n)
        k = F.normalize(q, dim=-1)  # shared-QK keys
        buckets = lsh_buckets(k, valid, r, n_buckets, generator)  # (B, H, R, N)
        pos = torch.arange(n, device=q.device)  # (N,)
        perm = (buckets * n + pos).argsort(-1)  # (B, H, R, N): sorted slot → position, by (bucket, position)
        inv = perm.argsort(-1)  # (B, H, R, N): position → sorted slot

        # Window of query i: the sorted slots inv_i, inv_i − 1, …, inv_i − W + 1 (offset 0 is i itself). A
        # bucket's slots are contiguous and in position order, so the same-bucket ones are exactly i's most
        # recent same-bucket predecessors; the other slots (other buckets, any position) are masked.
        slot = inv[..., None] - torch.arange(w, device=q.device)  # (B, H, R, N, W)
        key_pos = perm.gather(3, slot.clamp_min(0).view(b, h, r, n * w)).view(b, h, r, n, w)  # (B, H, R, N, W)
        key_bucket = buckets.gather(3, key_pos.view(b, h, r, n * w)).view(b, h, r, n, w)
        # Padding has its own bucket n_buckets, so a key in the bucket of a valid query is valid.
        admissible = ((slot >= 0) & (key_bucket == buckets[..., None]) & (key_pos <= pos[:, None])
                      & valid[:, None, None, :, None])  # (B, H, R, N, W)
        is_self = key_pos == pos[:, None]  # (B, H, R, N, W)
        other = admissible & ~is_self
        has_other = other.any(-1).any(2)  # (B, H, N): some round scores a non-self key for query i
        allowed = other | (admissible & is_self & ~has_other[:, :, None, :, None])  # (B, H, R, N, W)

        # N_ij: rounds whose window scores key j for query i: same bucket in round r' and at most W − 1 sorted
        # slots before i there (a bucket's slots are in position order, so j ≤ i holds).
        rounds = torch.arange(r, device=q.device).view(r, 1, 1)  # (R, 1, 1): the slot's own round
        count = torch.zeros(b, h, r, n, w, dtype=q.dtype, device=q.device)  # (B, H, R, N, W)
        earlier = torch.zeros(b, h, r, n, w, dtype=torch.bool, device=q.device)
        for other_round in range(r):
            bucket_of_key = buckets[:, :, other_round].gather(2, key_pos.view(b, h, -1)).view(b, h, r, n, w)
            behind = inv[:, :, other_round, None, :, None] - inv[:, :, other_round].gather(
                2, key_pos.view(b, h, -1)).view(b, h, r, n, w)  # (B, H, R, N, W) sorted slots from i back to j
            hit = (bucket_of_key == buckets[:, :, other_round, None, :, None]) & (behind >= 0) & (behind < w)
            count += hit
            earlier |= hit & (rounds > other_round)
        count.clamp_(min=1)  # unscored slots are masked below; keep their log finite

        wk, wv = gather_keys(k, key_pos), gather_keys(v, key_pos)  # (B, H, R, N, W, D)
        scores = (wk @ (q / math.sqrt(d))[:, :, None, :, :, None]).squeeze(-1) - count.log()  # (B, H, R, N, W)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)  # (B, H, R, N, W)
        lse = scores.logsumexp(-1)  # (B, H, R, N): z(i, P̃_i^(r))
        # masked_fill: a round with nothing allowed for i outputs exactly 0 (its round weight is 0 anyway).
        probs = (scores - lse[..., None]).exp().masked_fill(~allowed, 0.0)
        if self.training:
            probs = generator_dropout(probs, self.dropout, generator)
        o = (probs[..., None, :] @ wv).squeeze(-2)  # (B, H, R, N, D): o_i^(r)
        y = (lse.softmax(2)[..., None] * o).sum(2)  # (B, H, N, D): multi-round combination
        y = y * valid[:, None, :, None]  # a padded query has nothing admissible: zeros

        distinct = (admissible & ~earlier).sum((2, 3, 4))  # (B, H): first occurrences of admissible pairs
        return y, density_of(distinct, valid)
