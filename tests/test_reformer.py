"""ReformerAttention: strict causality under adversarial future tokens, and agreement with a brute-force softmax
over the scored pairs (which checks hashing, chunking or the causal bucket window, the self rule, the round
combination and the duplicate correction). The interface contract (shapes, density, the repr's budget) is
tests/test_interface.py."""

import math

import pytest
import torch
import torch.nn.functional as F

from baselines.common import attention_density
from baselines.reformer import ReformerAttention, softmax_with_lse

DIM, HEADS, HEAD_DIM = 16, 2, 8


def make(**budget) -> ReformerAttention:
    torch.manual_seed(0)
    return ReformerAttention(DIM, HEADS, HEAD_DIM, **budget).double()


def padding(b: int, n: int, padded: dict) -> torch.Tensor:
    """(B, N) bool key_padding_mask, True at padded[i] positions of sample i."""
    mask = torch.zeros(b, n, dtype=torch.bool)
    for i, positions in padded.items():
        mask[i, positions] = True
    return mask


def softmax_over(m: ReformerAttention, x, mask, causal: bool, scored: torch.Tensor):
    """Exact shared-QK softmax attention over the (B, H, N, N) ``scored`` pairs, the paper's self rule
    (self only when nothing else is admissible), output projection applied. Also returns the density."""
    b, n, _ = x.shape
    q = m.qk(x).view(b, n, HEADS, HEAD_DIM).transpose(1, 2)  # (B, H, N, D)
    v = m.v(x).view(b, n, HEADS, HEAD_DIM).transpose(1, 2)
    s = q @ F.normalize(q, dim=-1).transpose(-1, -2) / math.sqrt(HEAD_DIM)  # (B, H, N, N)
    valid = ~mask
    admissible = valid[:, None, :, None] & valid[:, None, None, :] & scored
    if causal:
        admissible = admissible & torch.ones(n, n, dtype=torch.bool).tril()
    eye = torch.eye(n, dtype=torch.bool)
    other = admissible & ~eye
    allowed = other | (admissible & eye & ~other.any(-1, keepdim=True))
    p = s.masked_fill(~allowed, -torch.inf).softmax(-1).nan_to_num(0.0)
    y = m.out((p @ v).transpose(1, 2).reshape(b, n, HEADS * HEAD_DIM))
    density = admissible.sum((0, 2, 3)) / (valid.sum(1) ** 2).sum()
    return y, density


def lsh_scored_pairs(m: ReformerAttention, x, mask, seed: int) -> torch.Tensor:
    """(B, H, N, N) bool: pairs LSH attention scores, rebuilt with Python loops from the paper's recipe.
    Draws the rotations exactly as the module does (one (B, H, R, D, n_buckets/2) normal draw)."""
    b, n, _ = x.shape
    r, c = m.n_hashes, m.bucket_size
    chunks = -(-n // c)
    n_buckets = max(2, chunks + chunks % 2)
    k = F.normalize(m.qk(x).view(b, n, HEADS, HEAD_DIM).transpose(1, 2), dim=-1)
    rot = torch.randn(
        b, HEADS, r, HEAD_DIM, n_buckets // 2, generator=torch.Generator().manual_seed(seed), dtype=x.dtype
    )
    scored = torch.zeros(b, HEADS, n, n, dtype=torch.bool)
    for bi in range(b):
        for h in range(HEADS):
            for ri in range(r):
                xr = k[bi, h] @ rot[bi, h, ri]
                bucket = torch.cat([xr, -xr], -1).argmax(-1).tolist()
                key = [(n_buckets if mask[bi, i] else bucket[i], i) for i in range(n)]
                order = sorted(range(n), key=lambda i: key[i]) + [None] * (chunks * c - n)
                for u in range(chunks):
                    queries = order[u * c : (u + 1) * c]
                    keys = queries + order[((u - 1) % chunks) * c : ((u - 1) % chunks + 1) * c]
                    for i in queries:
                        for j in keys:
                            if i is not None and j is not None:
                                scored[bi, h, i, j] = True
    return scored


def causal_lsh_scored_pairs(m: ReformerAttention, x, mask, seed: int):
    """Causal LSH attention rebuilt with Python loops from the module docstring ("Causal attention"): in each
    round, valid query i scores itself and the last 2C − 1 earlier valid tokens of its own bucket. Returns
    (B, H, N, N) counts of rounds scoring (i, j), and whether some bucket history was longer than the window.
    Draws the rotations exactly as the module does (needs N > C, i.e. more than one bucket)."""
    b, n, _ = x.shape
    r, c = m.n_hashes, m.bucket_size
    chunks = -(-n // c)
    assert chunks > 1, "one chunk means one bucket and no draw"
    n_buckets = chunks + chunks % 2
    k = F.normalize(m.qk(x).view(b, n, HEADS, HEAD_DIM).transpose(1, 2), dim=-1)
    rot = torch.randn(
        b, HEADS, r, HEAD_DIM, n_buckets // 2, generator=torch.Generator().manual_seed(seed), dtype=x.dtype
    )
    rounds = torch.zeros(b, HEADS, n, n, dtype=torch.long)
    truncated = False
    for bi in range(b):
        for h in range(HEADS):
            for ri in range(r):
                xr = k[bi, h] @ rot[bi, h, ri]
                bucket = torch.cat([xr, -xr], -1).argmax(-1).tolist()
                for i in range(n):
                    if mask[bi, i]:
                        continue
                    history = [j for j in range(i) if not mask[bi, j] and bucket[j] == bucket[i]]
                    truncated |= len(history) > 2 * c - 1
                    for j in history[-(2 * c - 1) :] + [i]:
                        rounds[bi, h, i, j] += 1
    return rounds, truncated


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_causal_outputs_depend_only_on_the_past(seed):
    """Strict causality: replacing every token at positions ≥ t (content and padding alike) leaves the
    outputs at positions < t unchanged up to rounding (the blocked matmuls may place a query's keys at other
    columns; attend_causal) — with dropout in training, several rounds and small buckets, so the hashes of
    the replaced tokens do move. (The paper's whole-sequence sort fails this, by up to ~1.)"""
    m = make(n_hashes=3, bucket_size=3, dropout=0.2).train()
    n = 20
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(2, n, DIM, dtype=torch.float64, generator=g)
    mask = padding(2, n, {0: [3, 15], 1: [9, 16, 17, 18, 19]})
    y, _ = m(x, mask, causal=True, generator=torch.Generator().manual_seed(seed))
    for t in (1, 4, 10, 17):
        x2 = x.clone()
        x2[:, t:] = 10 * torch.randn(2, n - t, DIM, dtype=torch.float64, generator=g)
        mask2 = mask.clone()
        mask2[:, t:] = torch.rand(2, n - t, generator=g) < 0.4
        y2, _ = m(x2, mask2, causal=True, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(
            y[:, :t], y2[:, :t], rtol=0, atol=1e-12, msg=lambda m: f"seed {seed}: outputs before t={t} moved: {m}"
        )
        assert not torch.equal(y[:, t:], y2[:, t:])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_hashes", [1, 3])
def test_one_chunk_is_full_shared_qk_attention(causal, n_hashes):
    """bucket_size ≥ N, the limiting case. Chunked: one chunk that sees itself twice per round — every key
    scored 2R times — and the duplicate correction makes that the exact softmax. Causal: one bucket and a
    window of N, so every earlier token R times. Both: exact (causal) shared-QK softmax with the self rule;
    density equals full attention's."""
    for n, padded in ((11, {1: [0, 7, 8, 9, 10]}), (16, {})):  # masked path; no padding at all
        m = make(n_hashes=n_hashes, bucket_size=16).eval()
        x = torch.randn(2, n, DIM, dtype=torch.float64)
        mask = padding(2, n, padded)
        y, stats = m(x, mask, causal=causal)
        y_ref, _ = softmax_over(m, x, mask, causal, torch.ones(2, HEADS, n, n, dtype=torch.bool))
        torch.testing.assert_close(y[~mask], y_ref[~mask], rtol=0, atol=1e-12)
        torch.testing.assert_close(stats["density"], attention_density(mask, causal, 2, n, HEADS, x.device))


@pytest.mark.parametrize("n, padded", [(14, {0: [4], 1: [11, 12, 13]}), (15, {})])
def test_matches_softmax_over_scored_pairs(n, padded):
    """Several chunks and rounds: keys are scored 1..2R times, so outputs match only if the log N_ij
    correction and the round weighting are right. With padding (masked path) and without (N a multiple of
    the chunk length, no padded key: no padding mask, the self rule alone)."""
    m = make(n_hashes=3, bucket_size=3).eval()
    x = torch.randn(2, n, DIM, dtype=torch.float64)
    mask = padding(2, n, padded)
    y, stats = m(x, mask, generator=torch.Generator().manual_seed(5))
    scored = lsh_scored_pairs(m, x, mask, seed=5)
    assert not scored.all()  # a real sparse pattern
    y_ref, density = softmax_over(m, x, mask, False, scored)
    torch.testing.assert_close(y[~mask], y_ref[~mask], rtol=0, atol=1e-12)
    torch.testing.assert_close(stats["density"], density.float())


def test_causal_matches_softmax_over_bucket_windows():
    """Causal, several rounds, small buckets: the window cuts some bucket histories and some non-self pairs
    are scored in several rounds, so outputs match only if the window, the self rule, the log N_ij correction
    and the round weighting are right."""
    m = make(n_hashes=3, bucket_size=2).eval()
    x = torch.randn(2, 24, DIM, dtype=torch.float64)
    mask = padding(2, 24, {0: [4, 23], 1: [0, 19, 20, 21, 22, 23]})
    y, stats = m(x, mask, causal=True, generator=torch.Generator().manual_seed(5))
    rounds, truncated = causal_lsh_scored_pairs(m, x, mask, seed=5)
    off_diagonal = rounds * ~torch.eye(24, dtype=torch.bool)
    assert truncated and off_diagonal.max() >= 2 and not (rounds > 0).tril().all()
    y_ref, density = softmax_over(m, x, mask, True, rounds > 0)
    torch.testing.assert_close(y[~mask], y_ref[~mask], rtol=0, atol=1e-12)
    torch.testing.assert_close(stats["density"], density.float())


def test_softmax_with_lse_values_and_gradients():
    """The fused softmax + logsumexp of the chunked path: values as torch's, gradients by gradcheck."""
    s = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    probs, lse = softmax_with_lse(s)
    torch.testing.assert_close(probs, s.softmax(-1), rtol=0, atol=1e-15)
    torch.testing.assert_close(lse, s.logsumexp(-1), rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda t: softmax_with_lse(t), (s,))
    assert torch.autograd.gradcheck(lambda t: softmax_with_lse(t)[1], (s,))
