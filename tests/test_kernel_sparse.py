"""Tests for kernel_sparse.py: the 17 standard kernels against their offsets, the OR of the selected kernels
(threshold and top-K, local, global-column and global-row kernels) against a union built by hand, Eq. 1 and
the per-kernel loss against numbers worked out by hand, the sparse (query, key)-list path against dense masked
attention (outputs and gradients, padding, causal, empty rows), the all-kernels mask against the dense
teacher, causality, bad input and the CLI, and a tiny end-to-end run of main(), the method's procedure. The paper's
comparisons (experiments/kernel_pipeline.py) are tests/test_kernel_pipeline.py."""

import json
import math
import subprocess
import sys

import pytest
import torch

import kernel_sparse as ks
from bench.model import Model, ModelConfig
from conftest import DATA, ROOT, seeded

H, D, DIM, L, N = 2, 4, 16, 12, 10


def padding(batch=2, n=N):
    """(B, N) bool, True at padding: sample 0 full, sample 1 right-padded, sample 2 (if any) left-padded."""
    mask = torch.zeros(batch, n, dtype=torch.bool)
    if batch > 1:
        mask[1, n - 3 :] = True
    if batch > 2:
        mask[2, :2] = True
    return mask


def make(bank=None, seed=0, **kwargs) -> ks.KernelSparseAttention:
    torch.manual_seed(seed)
    attn = ks.KernelSparseAttention(DIM, H, D, max_len=L, hidden=16, **kwargs)
    if bank is not None:
        attn.predictor = ks.KernelPredictor(DIM, H, bank, hidden=16)
    return attn.eval()


# ------------------------------------------------------------------------------------ hand-built references
def union_by_hand(bank: ks.KernelBank, sel: torch.Tensor, valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, H, N, N) bool: for each valid query, the OR over its selected kernels κ of
    K_κ(i, s) = local_κ[s − i + L − 1] > ½ or (row_κ[i] and col_κ[s]), kept on valid keys (s ≤ i if causal)."""
    b, n, heads, kernels = sel.shape
    length = bank.max_len
    local = (bank.local() > 0.5).tolist()
    row, col = (bank.row > 0.5).tolist(), (bank.col > 0.5).tolist()
    sel_, valid_ = sel.tolist(), valid.tolist()
    out = [[[[False] * n for _ in range(n)] for _ in range(heads)] for _ in range(b)]
    for bi in range(b):
        for h in range(heads):
            g = h if bank.row.shape[0] > 1 else 0
            for i in range(n):
                if not valid_[bi][i]:
                    continue
                for k in range(kernels):
                    if not sel_[bi][i][h][k]:
                        continue
                    for s in range(n):
                        hit = local[g][k][s - i + length - 1] or (row[g][k][i] and col[g][k][s])
                        if hit and valid_[bi][s] and (not causal or s <= i):
                            out[bi][h][i][s] = True
    return torch.tensor(out, dtype=torch.bool)


def edges_to_mask(row: torch.Tensor, col: torch.Tensor, b: int, heads: int, n: int) -> torch.Tensor:
    """(B, H, N, N) bool from global (query, key) indices; checks they pair within one (batch, head) block, are
    sorted by query and have no repeats."""
    assert torch.equal(row // n, col // n), "an edge joins two different (batch, head) blocks"
    assert bool((row[1:] >= row[:-1]).all()), "edges are not sorted by query"
    pairs = row * n + col % n
    assert len(torch.unique(pairs)) == len(pairs), "repeated edges"
    mask = torch.zeros(b * heads * n * n, dtype=torch.bool)
    mask[pairs] = True
    return mask.view(b, heads, n, n)


def mask_to_edges(mask: torch.Tensor):
    """(B, H, N, M) bool → global (row, col) lists."""
    b, h, i, s = mask.nonzero(as_tuple=True)
    heads, n, m = mask.shape[1:]
    return (b * heads + h) * n + i, (b * heads + h) * m + s


def reference_attention(attn: ks.KernelSparseAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention written out on an explicit (B, H, N, N) mask: −inf fills, empty rows → 0; with the
    module's ALiBi slopes, −m_h·|i − s| added by loops (the teacher's bias, ours)."""
    b, n, _ = x.shape
    q, k, v = attn.qkv(x).view(b, n, 3, H, D).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    if attn.slopes is not None:
        bias = torch.tensor(
            [[[-float(attn.slopes[h]) * abs(i - j) for j in range(n)] for i in range(n)] for h in range(H)]
        )
        scores = scores + bias
    scores = scores.masked_fill(~mask, -math.inf)
    y = scores.softmax(-1).nan_to_num(0.0) @ v  # (B, H, N, D)
    return attn.out(y.transpose(1, 2).reshape(b, n, H * D))


def union_edges_by_sort(bank: ks.KernelBank, sel: torch.Tensor, valid: torch.Tensor, causal: bool):
    """The edge builder the fast path had before its sort-free one: every selected kernel's candidates (offsets,
    global-block columns), then `unique` to drop repeats and sort by query; (row, col) global indices."""

    def positions(flags):  # (..., F) bool → left-aligned indices of the True entries, and which are real
        count = flags.sum(-1)
        width = int(count.max()) if flags.numel() else 0
        order = flags.to(torch.int8).argsort(dim=-1, descending=True, stable=True)[..., :width]
        return order, torch.arange(width) < count[..., None]

    n, heads = sel.shape[1], sel.shape[2]
    local = bank.local()[:, :, bank.max_len - n : bank.max_len - 1 + n] > 0.5
    offsets, offset_ok = positions(local)
    offsets = offsets - (n - 1)
    columns, column_ok = positions(bank.col[:, :, :n] > 0.5)
    b, i, h, k = (sel & valid[:, :, None, None]).nonzero(as_tuple=True)
    g = h if bank.row.shape[0] > 1 else torch.zeros_like(h)
    query = (b * heads + h) * n + i
    near, slot = offset_ok[g, k].nonzero(as_tuple=True)
    block = (bank.row[g, k, i] > 0.5).nonzero().squeeze(1)
    far, column = column_ok[g[block], k[block]].nonzero(as_tuple=True)
    far = block[far]
    owner = torch.cat([query[near], query[far]])
    keys = torch.cat([i[near] + offsets[g[near], k[near], slot], columns[g[far], k[far], column]])
    keep = (keys >= 0) & (keys < n)
    if not bool(valid.all()):
        keep &= valid.reshape(-1)[owner // (heads * n) * n + keys.clamp(0, n - 1)]
    if causal:
        keep &= keys <= owner % n
    pair = torch.unique(owner[keep] * n + keys[keep])
    row = pair // n
    return row, row // n * n + pair % n


def random_bank(generator: torch.Generator, groups: int, kernels: int, length: int) -> ks.KernelBank:
    """Kernels of every kind at random densities: local offset sets, global columns, global rows, and mixes."""

    def draw(*shape):
        return (torch.rand(*shape, generator=generator) < torch.rand((), generator=generator)).float()

    kind = torch.randint(4, (groups, kernels, 1), generator=generator)  # 0 local, 1 columns, 2 rows, 3 mixed
    local = draw(groups, kernels, 2 * length - 1) * (kind != 1) * (kind != 2)
    row = torch.where(kind == 1, 1.0, draw(groups, kernels, length)) * (kind != 0)
    col = torch.where(kind == 2, 1.0, draw(groups, kernels, length)) * (kind != 0)
    return ks.KernelBank(local, row, col)


def handmade_bank(seed=0) -> ks.KernelBank:
    """Per head (G = H) four kernels of every kind: a local one, a global-column one (all queries see keys
    `col`), a global-row one (queries `row` see all keys) and one mixing a local part and a global block."""
    g = seeded(seed)
    local = (torch.rand(H, 4, 2 * L - 1, generator=g) < 0.2).float()
    local[:, 1:3] = 0.0
    row, col = torch.zeros(H, 4, L), torch.zeros(H, 4, L)
    row[:, 1] = 1.0
    col[:, 1] = (torch.rand(H, L, generator=g) < 0.3).float()
    row[:, 2] = (torch.rand(H, L, generator=g) < 0.3).float()
    col[:, 2] = 1.0
    row[:, 3, 2:5] = 1.0
    col[:, 3, 6:8] = 1.0
    return ks.KernelBank(local, row, col)


def synthetic_layer_data(n=8, sequences=6):
    """Targets where every query attends to its previous token and to key 0, and query 3 to every key."""
    target = torch.zeros(n, n, dtype=torch.bool)
    target[torch.arange(1, n), torch.arange(n - 1)] = True
    target[:, 0] = True
    target[3, :] = True
    x = torch.randn(sequences, n, DIM, generator=seeded(5))
    valid = torch.ones(sequences, n, dtype=torch.bool)
    return ks.LayerData(x, valid, target.expand(sequences, H, n, n).clone())


BANKS = {
    "standard": lambda: ks.standard_kernels(L),
    "handmade": handmade_bank,
    "learned": lambda: ks.init_learned_kernels(L, 5, seeded(3)),
    "handcrafted": lambda: ks.handcrafted_kernels(
        synthetic_layer_data(), False, L, k=3, samples=64, generator=seeded(4)
    ),
}


# ------------------------------------------------------------------------------- 1. the standard kernels
def test_standard_windows_are_the_documented_seventeen():
    assert len(ks.STANDARD_WINDOWS) == 8 and 1 + 2 * len(ks.STANDARD_WINDOWS) == 17
    assert [w for w, d in ks.STANDARD_WINDOWS[:6]] == [1, 2, 4, 8, 16, 32]  # nested, dilation 1
    assert all(d == 1 for _, d in ks.STANDARD_WINDOWS[:6])


@pytest.mark.parametrize("max_len", [5, 40, 300])
def test_standard_kernels_shapes_and_offsets(max_len):
    bank = ks.standard_kernels(max_len)
    assert bank.num_kernels == 17 and bank.max_len == max_len and not bank.learned
    assert bank.local().shape == (1, 17, 2 * max_len - 1)
    assert bank.row.shape == bank.col.shape == (1, 17, max_len)
    assert not bank.row.any() and not bank.col.any()  # no global block
    assert set(bank.local().unique().tolist()) <= {0.0, 1.0}
    centre = max_len - 1
    offsets = [(torch.nonzero(bank.local()[0, k]).flatten() - centre).tolist() for k in range(17)]
    assert offsets[0] == [0]  # identity
    for j, (w, d) in enumerate(ks.STANDARD_WINDOWS):
        expected = [d * t for t in range(1, w + 1) if d * t < max_len]
        assert offsets[1 + j] == expected, (w, d)  # forward: s = i + d, …, i + w·d
        assert offsets[1 + 8 + j] == sorted(-e for e in expected), (w, d)  # backward, mirrored


@pytest.mark.parametrize("n", [70, 23])
def test_standard_kernel_patterns_match_explicit_masks(n):
    bank = ks.standard_kernels(70)
    patterns = bank.patterns(n)
    assert patterns.shape == (1, 17, n, n)
    expected = torch.zeros(17, n, n)
    for i in range(n):
        expected[0, i, i] = 1.0
        for j, (w, d) in enumerate(ks.STANDARD_WINDOWS):
            for t in range(1, w + 1):
                if i + t * d < n:
                    expected[1 + j, i, i + t * d] = 1.0
                if i - t * d >= 0:
                    expected[9 + j, i, i - t * d] = 1.0
    assert torch.equal(patterns[0], expected)
    rows = torch.tensor([0, 7, n - 1])
    assert torch.equal(bank.patterns(n, rows)[0], expected[:, rows])
    # the union of the 17: every pair within 32 tokens, beyond it every 4th up to 64 and every 8th up to 256
    d = (torch.arange(n)[None] - torch.arange(n)[:, None]).abs()
    assert torch.equal(expected.amax(0) > 0, (d <= 32) | ((d % 4 == 0) & (d <= 64)) | ((d % 8 == 0) & (d <= 256)))


def test_kernel_module_has_the_standard_bank_by_default():
    attn = make()
    assert attn.predictor.bank.num_kernels == 17 and torch.equal(
        attn.predictor.bank.local(), ks.standard_kernels(L).local()
    )
    x = torch.randn(2, N, DIM, generator=seeded(0))
    assert attn.predictor(x, torch.ones(2, N, dtype=torch.bool), False).shape == (2, N, H, 17)


# --------------------------------------------------------------------------- 2. the OR of selected kernels
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bank_name", list(BANKS))
def test_mask_and_edges_equal_the_union_of_random_selections(bank_name, causal):
    bank = BANKS[bank_name]()
    b = 3
    valid = ~padding(b)
    sel = torch.rand(b, N, H, bank.num_kernels, generator=seeded(1)) < 0.3
    expected = union_by_hand(bank, sel, valid, causal)
    assert expected.any() and not expected.all()
    assert torch.equal(bank.mask(sel, valid, causal), expected)
    row, col = bank.edges(sel, valid, causal)
    assert torch.equal(edges_to_mask(row, col, b, H, N), expected)


@pytest.mark.parametrize("causal", [False, True])
def test_sort_free_edges_equal_the_dense_mask_and_the_sorted_builders_edges(causal):
    """The edge builder (offset lists per distinct selection, global columns without repeats, a merge by counting)
    gives the pairs of the dense mask (KernelBank.mask) and of the builder with `unique`, grouped by query without
    repeats: 200 random banks (shared by the heads or one per head, every kernel kind) and selections at random
    rates, lengths, with and without padding, the four test banks and two of more than 31 kernels (a selection's
    code spans several numbers), one shared, one per head."""
    g = seeded(12)
    cases = [(BANKS[name](), N) for name in BANKS] + [(random_bank(g, 1, 70, 16), 12), (random_bank(g, H, 40, 9), 9)]
    for _ in range(200):
        length = int(torch.randint(1, 24, (), generator=g))
        groups = H if bool(torch.rand((), generator=g) < 0.5) else 1
        kernels = int(torch.randint(1, 7, (), generator=g))
        cases.append((random_bank(g, groups, kernels, length), int(torch.randint(1, length + 1, (), generator=g))))
    for bank, n in cases:
        b = int(torch.randint(1, 4, (), generator=g))
        sel = torch.rand(b, n, H, bank.num_kernels, generator=g) < torch.rand((), generator=g)
        valid = (
            torch.rand(b, n, generator=g) < 0.8
            if bool(torch.rand((), generator=g) < 0.5)
            else torch.ones(b, n, dtype=torch.bool)
        )
        old, new = union_edges_by_sort(bank, sel, valid, causal), bank.edges(sel, valid, causal)
        assert torch.equal(edges_to_mask(*new, b, H, n), bank.mask(sel, valid, causal))  # checks grouping, repeats
        assert torch.equal(edges_to_mask(*new, b, H, n), edges_to_mask(*old, b, H, n))
        assert torch.equal(torch.sort(new[0] * b * H * n + new[1]).values, old[0] * b * H * n + old[1])


def test_global_kernels_reach_far_keys_and_rows():
    """A global-column kernel gives every query its keys, a global-row kernel gives its queries every key."""
    row, col = torch.zeros(1, 2, L), torch.zeros(1, 2, L)
    row[0, 0], col[0, 0, [0, 9]] = 1.0, 1.0  # global columns {0, 9}
    row[0, 1, [4]], col[0, 1] = 1.0, 1.0  # global row {4}
    bank = ks.KernelBank(torch.zeros(1, 2, 2 * L - 1), row, col)
    valid = torch.ones(1, N, dtype=torch.bool)
    for kernel, expected in (
        (0, torch.zeros(N, N, dtype=torch.bool).index_fill(1, torch.tensor([0, 9]), True)),
        (1, torch.zeros(N, N, dtype=torch.bool).index_fill(0, torch.tensor([4]), True)),
    ):
        sel = torch.zeros(1, N, H, 2, dtype=torch.bool)
        sel[..., kernel] = True
        assert torch.equal(bank.mask(sel, valid, False)[0, 0], expected)
        assert torch.equal(edges_to_mask(*bank.edges(sel, valid, False), 1, H, N)[0, 1], expected)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("select", ["threshold", "topk"])
@pytest.mark.parametrize("bank_name", ["standard", "handmade", "handcrafted"])
def test_selection_rule_and_module_output_follow_the_union(bank_name, select, causal):
    """α from the predictor; S(i) = {κ : α_κ > τ} or the top-K α; the module's masked and sparse outputs and
    density equal softmax attention on the hand-built union of S(i)."""
    bank = BANKS[bank_name]()
    attn = make(bank, select=select, threshold=0.5, top_k=3)
    b = 3
    x = torch.randn(b, N, DIM, generator=seeded(2))
    pad = padding(b)
    valid = ~pad
    with torch.no_grad():
        alpha = attn.predictor(x, valid, causal)  # (B, N, H, K)
    if select == "threshold":
        expected_sel = alpha > 0.5
    else:
        expected_sel = torch.zeros_like(alpha, dtype=torch.bool)
        flat = expected_sel.view(-1, alpha.shape[-1])
        for r, values in enumerate(alpha.reshape(-1, alpha.shape[-1]).tolist()):
            for k in sorted(range(len(values)), key=lambda k: -values[k])[:3]:
                flat[r, k] = True
    sel = attn.selected(x, valid, causal)
    assert torch.equal(sel, expected_sel)
    assert 0 < sel.float().mean() < 1
    expected = union_by_hand(bank, sel, valid, causal)
    reference = reference_attention(attn, x, expected)
    density = expected.sum((0, 2, 3)).double() / (valid.sum(1).double() ** 2).sum()
    for path in ("reference", "fast"):
        attn.path = path
        with torch.no_grad():
            y, stats = attn(x, key_padding_mask=pad, causal=causal)
        assert torch.allclose(y, reference, atol=1e-5), path
        assert torch.allclose(stats["density"].double(), density, atol=1e-6), path


def test_padded_queries_select_nothing():
    bank = ks.standard_kernels(L)
    valid = ~padding(2)
    sel = torch.ones(2, N, H, 17, dtype=torch.bool)
    mask = bank.mask(sel, valid, False)
    assert not mask[1, :, N - 3 :].any() and not mask[1, :, :, N - 3 :].any()
    row, col = bank.edges(sel, valid, False)
    i, s = row % N, col % N
    from_second = row // (H * N) == 1
    assert not (i[from_second] >= N - 3).any() and not (s[from_second] >= N - 3).any()


def test_learned_kernels_binarise_at_one_half():
    logits = torch.tensor([-3.0, -0.01, 0.01, 2.0, -1.0]).repeat(1, 1, 1)  # L = 3: offsets −2 … 2
    bank = ks.KernelBank(logits, torch.zeros(1, 1, 3), torch.zeros(1, 1, 3), learned=True)
    assert torch.allclose(bank.local(), logits.sigmoid())
    sel = torch.ones(1, 3, H, 1, dtype=torch.bool)
    mask = bank.mask(sel, torch.ones(1, 3, dtype=torch.bool), False)[0, 0]
    expected = torch.tensor([[(s - i) in (0, 1) for s in range(3)] for i in range(3)])  # σ > ½ at offsets 0, 1
    assert torch.equal(mask, expected)
    assert torch.equal(
        edges_to_mask(*bank.edges(sel, torch.ones(1, 3, dtype=torch.bool), False), 1, H, 3)[0, 0], expected
    )


def test_handcrafted_kernels_structure_on_synthetic_targets():
    n = 8
    bank = BANKS["handcrafted"]()
    assert bank.row.shape == (H, 6, L) and bank.local().shape == (H, 6, 2 * L - 1) and not bank.learned
    centre = L - 1
    for h in range(H):
        # kernels 0, 1: local (no global block), at most k = 3 offsets inside |d| < n
        for k in (0, 1):
            ones = torch.nonzero(bank.local()[h, k]).flatten() - centre
            assert 1 <= len(ones) <= 3 and bool((ones.abs() < n).all())
            assert not bank.row[h, k].any()
        # top-k local offsets: the distance-normalised frequency is 1 at d = −1 and at d = −(n − 1) only
        top = set((torch.nonzero(bank.local()[h, 0]).flatten() - centre).tolist())
        assert {-1, -(n - 1)} <= top
        # kernels 2, 3: global columns (every query), holding key 0; kernels 4, 5: global rows, holding query 3
        for k in (2, 3):
            assert bank.row[h, k].all() and not bank.local()[h, k].any()
            assert bank.col[h, k, 0] == 1 and 1 <= bank.col[h, k].sum() <= 3
        for k in (4, 5):
            assert bank.col[h, k].all() and not bank.local()[h, k].any()
            assert bank.row[h, k, 3] == 1 and 1 <= bank.row[h, k].sum() <= 3


# --------------------------------------------------------------------------------- 3. the losses (Eq. 1)
def tiny_loss_inputs():
    """B = H = G = 1, R = 2 rows, K = 2 kernels, M = 3 keys; key 2 of row 1 is not a valid pair."""
    alpha = torch.tensor([[0.2, 0.9], [0.6, 0.1]])[None, None]  # (1, 1, R, K)
    patterns = torch.tensor(
        [
            [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]],  # kernel 0, rows 0 and 1
            [[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]],
        ]
    )[None]  # kernel 1;  (1, K, R, M)
    target = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)[None, None]  # (1, 1, R, M)
    weight = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])[None, None]  # (1, 1, R, M)
    return alpha, patterns, target, weight


def test_eq1_loss_by_hand():
    alpha, patterns, target, weight = tiny_loss_inputs()
    # soft OR max_κ α_κ K_κs: row 0: (0.2, 0.9, 0.9); row 1: (0, 0.6, ·)
    # squared errors against the targets: 0.64 + 0.01 + 0.81 and 0 + 0.16 (key 2 of row 1 has weight 0)
    # ours: a mean over the 5 weighted entries (Table 1 reports sums)
    expected = (0.64 + 0.01 + 0.81 + 0.0 + 0.16) / 5
    assert ks.eq1_loss(alpha, patterns, target, weight).item() == pytest.approx(expected, abs=1e-6)
    # a mean, not a sum: two identical heads give the same value
    two = ks.eq1_loss(alpha.expand(1, 2, -1, -1), patterns, target.expand(1, 2, -1, -1), weight)
    assert two.item() == pytest.approx(expected, abs=1e-6)


def test_eq1_loss_with_binary_coefficients_counts_or_mismatches():
    """With α ∈ {0, 1} (a selection), the soft OR is the OR of the selected kernels: Eq. 1 × entries counts the
    entries where the OR mask and the targets differ."""
    g = seeded(7)
    alpha = (torch.rand(2, H, 5, 4, generator=g) < 0.5).float()
    patterns = (torch.rand(1, 4, 5, 6, generator=g) < 0.3).float()
    target = torch.rand(2, H, 5, 6, generator=g) < 0.4
    weight = (torch.rand(2, 1, 5, 6, generator=g) < 0.8).float()
    union = torch.zeros(2, H, 5, 6, dtype=torch.bool)
    for k in range(4):
        union |= (alpha[..., k, None] > 0) & (patterns[0, k] > 0)
    mismatches = ((union != target).float() * weight).sum()
    loss = ks.eq1_loss(alpha, patterns, target, weight)
    assert loss.item() * (weight.sum() * H).item() == pytest.approx(mismatches.item(), abs=1e-5)


def test_per_kernel_loss_by_hand():
    alpha, patterns, target, weight = tiny_loss_inputs()
    # ours (§6.2): Σ_s K_κs (α_κ − a_s)² / Σ_s K_κs on the valid keys, a mean over non-empty (row, kernel):
    # row 0, kernel 0 (α 0.2, keys 0, 2): (0.64 + 0.04) / 2; kernel 1 (α 0.9, keys 1, 2): (0.01 + 0.81) / 2;
    # row 1, kernel 0 (α 0.6, key 1; key 2 invalid): 0.16 / 1; kernel 1 (key 2 only, invalid): empty, left out
    expected = ((0.64 + 0.04) / 2 + (0.01 + 0.81) / 2 + 0.16) / 3
    assert ks.per_kernel_loss(alpha, patterns, target, weight).item() == pytest.approx(expected, abs=1e-6)


def test_per_kernel_loss_is_minimised_at_each_kernels_precision():
    g = seeded(8)
    patterns = (torch.rand(H, 3, 4, 7, generator=g) < 0.5).float()  # G = H
    target = torch.rand(1, H, 4, 7, generator=g) < 0.5
    weight = torch.ones(1, 1, 4, 7)
    support = patterns.transpose(1, 2)[None]  # (1, H, R, K, M)
    precision = (support * target[:, :, :, None].float()).sum(-1) / support.sum(-1).clamp_min(1)
    alpha = precision.clone().requires_grad_()
    ks.per_kernel_loss(alpha, patterns, target, weight).backward()
    assert alpha.grad.abs().max() < 1e-6
    moved = (precision + 0.1).requires_grad_()
    ks.per_kernel_loss(moved, patterns, target, weight).backward()
    used = support.sum(-1) > 0
    assert bool((moved.grad[used] > 0).all())  # every coefficient of a non-empty kernel gets a gradient


def test_kernel_loss_trains_learned_kernels_and_rejects_per_kernel_for_them():
    bank = ks.init_learned_kernels(L, 3, seeded(0))
    torch.manual_seed(0)
    predictor = ks.KernelPredictor(DIM, H, bank, hidden=8)
    data = synthetic_layer_data()
    loss = ks.kernel_loss(predictor, data.x, data.valid, data.target, False, "max")
    loss.backward()
    assert bank.logits.grad is not None and bank.logits.grad.abs().sum() > 0
    cfg = ks.KernelConfig(predictor_steps=1)
    with pytest.raises(ValueError, match="binary kernels"):
        ks.fit_predictor(predictor, data, False, "per-kernel", cfg, seeded(0))


def test_fit_predictor_is_reproducible_and_lowers_eq1():
    data = synthetic_layer_data()
    cfg = ks.KernelConfig(predictor_steps=25, predictor_batch=2, predictor_rows=4, predictor_lr=1e-2)
    results = []
    for _ in range(2):
        torch.manual_seed(1)
        predictor = ks.KernelPredictor(DIM, H, ks.standard_kernels(L), hidden=8)
        with torch.no_grad():
            before = ks.kernel_loss(predictor, data.x, data.valid, data.target, False, "max").item()
        results.append(ks.fit_predictor(predictor, data, False, "max", cfg, seeded(2)))
    assert results[0] == results[1]
    assert results[0] < before


# ---------------------------------------------------------------- 4. sparse (query, key) list = dense mask
@pytest.mark.on_device
@pytest.mark.usefixtures("default_device")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_sparse_attention_equals_masked_attention_outputs_and_gradients(padded, causal):
    g = seeded(11)
    b = 3
    q0, k0, v0 = (torch.randn(b, H, N, D, generator=g, dtype=torch.float64) for _ in range(3))
    valid = ~padding(b) if padded else torch.ones(b, N, dtype=torch.bool)
    mask = (torch.rand(b, H, N, N, generator=g) < 0.4) & ks.valid_pairs(valid, causal)
    mask[0, 1, 4] = False  # a valid query whose mask is empty
    mask[1, 0, 2] = False
    upstream = torch.randn(b, H, N, D, generator=g, dtype=torch.float64)
    bias0 = torch.randn(H, N, N, generator=g, dtype=torch.float64)  # an additive score bias (H, N, M), as ALiBi's

    def run(path):
        q, k, v, bias = (t.clone().requires_grad_() for t in (q0, k0, v0, bias0))
        if path == "masked":
            y = ks.masked_attention(q, k, v, mask, bias=bias)
        elif path == "sparse":
            row, col = mask_to_edges(mask)
            per_edge = bias[row // N % H, row % N, col % N]  # (E,)
            y = ks.sparse_attention(q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D), row, col, bias=per_edge).view(
                b, H, N, D
            )
        else:  # an independent reference: −inf fills, NaN rows → 0
            scores = (q @ k.transpose(-1, -2) / math.sqrt(D) + bias).masked_fill(~mask, -math.inf)
            y = scores.softmax(-1).nan_to_num(0.0) @ v
        (y * upstream).sum().backward()
        return y.detach(), q.grad, k.grad, v.grad, bias.grad

    reference, masked, sparse = run("reference"), run("masked"), run("sparse")
    for name, r, m, s in zip("y q k v bias".split(), reference, masked, sparse):
        assert torch.isfinite(m).all() and torch.isfinite(s).all(), name
        assert torch.allclose(m, r, atol=1e-12), name
        assert torch.allclose(s, r, atol=1e-12), name
    empty = ~mask.any(-1)  # (B, H, N)
    assert empty[0, 1, 4] and empty[1, 0, 2]
    for y in (masked[0], sparse[0]):
        assert (y[empty] == 0).all()
    assert (sparse[1][empty] == 0).all()  # no gradient reaches an empty row's query


def test_sparse_attention_forward_and_backward_cost_order_edges_times_width():
    """The list's products and their gradients are sparse kernels: forward and backward FLOPs stay within a few
    times E·D on a list of ~5% of R² pairs (a gradient formed as a dense R × R product would count 2·R²·D)."""
    from bench.measure import count_flops

    r, width = 600, 8
    g = seeded(13)
    mask = torch.rand(r, r, generator=g) < 0.05
    row, col = mask.nonzero(as_tuple=True)
    q, k, v = (torch.randn(r, width, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.randn(len(row), generator=g, requires_grad=True)
    y = ks.sparse_attention(q, k, v, row, col, bias=bias)
    forward = count_flops(lambda: ks.sparse_attention(q, k, v, row, col, bias=bias))["total"]
    backward = count_flops(lambda: y.square().sum().backward())["total"]
    assert 4 * len(row) * width <= forward <= 6 * len(row) * width
    assert backward <= 12 * len(row) * width < 2 * r * r * width
    assert all(t.grad is not None for t in (q, k, v, bias))


def test_sparse_attention_refuses_a_double_backward():
    """Before: torch.autograd.grad of a gradient penalty left ListAttention's part out, and gradgradcheck reported a
    mismatch (False) rather than a refusal."""
    g = seeded(5)
    row, col = (torch.rand(6, 6, generator=g) < 0.5).nonzero(as_tuple=True)
    q, k, v = (torch.randn(6, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    attend = lambda a, b, c: ks.sparse_attention(a, b, c, row, col)  # noqa: E731
    with pytest.raises(RuntimeError, match="ListAttention has no second derivative"):
        torch.autograd.grad(attend(q, k, v).square().sum(), [q, k, v], create_graph=True)
    with pytest.raises(RuntimeError, match="ListAttention has no second derivative"):
        torch.autograd.gradgradcheck(attend, (q, k, v), raise_exception=False)
    assert torch.autograd.gradcheck(attend, (q, k, v))


def test_sparse_attention_without_edges_gives_zeros():
    q = torch.randn(6, D)
    empty = torch.zeros(0, dtype=torch.long)
    y = ks.sparse_attention(q, q, q, empty, empty)
    assert y.shape == (6, D) and (y == 0).all()


@pytest.mark.on_device
@pytest.mark.usefixtures("default_device")
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_module_reference_and_fast_paths_agree_in_outputs_and_gradients(causal, alibi):
    """Fine-tuning runs the masked reference path (ours); it must give the sparse path's outputs and gradients
    (with the teacher's ALiBi bias too: per entry in one, per edge in the other)."""
    attn = make(ks.standard_kernels(L), select="topk", top_k=4, alibi=alibi)
    x0 = torch.randn(3, N, DIM, generator=seeded(3))
    pad = padding(3)
    upstream = torch.randn(3, N, DIM, generator=seeded(4))
    results = []
    for path in ("reference", "fast"):
        attn.path = path
        attn.zero_grad()
        x = x0.clone().requires_grad_()
        y, stats = attn(x, key_padding_mask=pad, causal=causal)
        (y * upstream).sum().backward()
        results.append(
            (y.detach(), x.grad, attn.qkv.weight.grad.clone(), attn.out.weight.grad.clone(), stats["density"])
        )
    for m, s in zip(*results):
        assert torch.allclose(m, s, atol=1e-5)
    assert results[0][-1].shape == (H,) and bool((results[0][-1] < 1).all())


# -------------------------------------------------------------------- 5. the all-kernels mask = the teacher
def tiny_model(head="token", max_len=L, sparse=False, **attn_kwargs):
    cfg = ModelConfig(
        vocab_size=20,
        num_classes=5,
        head=head,
        max_len=max_len,
        dim=DIM,
        depth=2,
        heads=H,
        head_dim=D,
        mlp_dim=32,
        dropout=0.0,
    )
    torch.manual_seed(0)
    return Model(
        cfg, lambda layer: ks.KernelSparseAttention(DIM, H, D, max_len=max_len, hidden=16, sparse=sparse, **attn_kwargs)
    ).eval()


def set_path(model, path: str) -> None:
    for block in model.blocks:
        block.attn.path = path


def full_cover_bank(kind: str) -> ks.KernelBank:
    ones, zeros = torch.ones(1, 1, L), torch.zeros(1, 1, L)
    if kind == "local":  # one local kernel with every offset
        return ks.KernelBank(torch.ones(1, 1, 2 * L - 1), zeros, zeros)
    return ks.KernelBank(torch.zeros(1, 1, 2 * L - 1), ones, ones)  # one global block of all pairs


COVERS = {  # (bank or None for the standard one, install kwargs) whose union is every admissible pair
    "standard-threshold": (None, dict(select="threshold", threshold=-1.0)),
    "standard-top17": (None, dict(select="topk", top_k=17)),
    "local-top1": ("local", dict(select="topk", top_k=1)),
    "global-threshold": ("global", dict(select="threshold", threshold=0.0)),
}


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("head", ["token", "lm"])
@pytest.mark.parametrize("cover", list(COVERS))
def test_all_kernels_reproduce_the_dense_teacher(cover, head, alibi):
    model = tiny_model(head, alibi=alibi)
    bank, rule = COVERS[cover]
    predictors = None
    if bank is not None:
        torch.manual_seed(1)
        predictors = [ks.KernelPredictor(DIM, H, full_cover_bank(bank), hidden=16) for _ in model.blocks]
    tokens = torch.randint(20, (3, N), generator=seeded(0))
    pad = padding(3)
    with torch.no_grad():
        dense, dense_stats = model(tokens, key_padding_mask=pad)
        for path in ("reference", "fast"):
            ks.install(model, predictors, **rule)
            set_path(model, path)
            assert all(block.attn.sparse for block in model.blocks)
            logits, stats = model(tokens, key_padding_mask=pad)
            # padded queries output 0 on the sparse paths (ours): compare the valid positions
            assert torch.allclose(logits[~pad], dense[~pad], atol=1e-5, rtol=1e-5), path
            assert torch.allclose(stats["density"], dense_stats["density"], atol=1e-6), path
            ks.install(model, sparse=False)
    # and a mask that is not complete does change the logits (the comparison can fail)
    ks.install(model, predictors, select="topk", top_k=1)
    set_path(model, "fast")
    if bank is None:
        with torch.no_grad():
            assert not torch.allclose(model(tokens, key_padding_mask=pad)[0][~pad], dense[~pad], atol=1e-3)


@pytest.mark.parametrize("alibi", [False, True])
def test_dense_teacher_density_and_sdpa_paths(alibi):
    """The teacher's density counts admissible pairs over valid² (causal: the lower triangle); its outputs,
    ALiBi included, equal the written-out reference on every SDPA path (unpadded, padded, causal)."""
    attn = make(sparse=False, alibi=alibi)
    x = torch.randn(3, N, DIM, generator=seeded(6))
    if alibi:
        assert torch.allclose(attn.slopes, torch.tensor([2.0 ** (-8 * h / H) for h in range(1, H + 1)]))
        with torch.no_grad():
            y, _ = attn(x)  # no padding: the unmasked SDPA call
        everything = torch.ones(3, H, N, N, dtype=torch.bool)
        assert torch.allclose(y, reference_attention(attn, x, everything), atol=1e-5)
        with torch.no_grad():
            plain = make(sparse=False)(x)[0]
        assert not torch.allclose(y, plain, atol=1e-3)  # the bias does change the teacher
    pad = padding(3)
    valid = ~pad
    for causal in (False, True):
        with torch.no_grad():
            y, stats = attn(x, key_padding_mask=pad, causal=causal)
        allowed = ks.valid_pairs(valid, causal).expand(-1, H, -1, -1)
        reference = reference_attention(attn, x, allowed)
        assert torch.allclose(y[valid], reference[valid], atol=1e-5)
        expected = allowed.sum((0, 2, 3)).float() / (valid.sum(1).float() ** 2).sum()
        assert torch.allclose(stats["density"], expected)


def test_float64_model_runs_both_sparse_paths():
    """A module moved to float64 (as the reference tests of the other methods do) must run on every path, and
    then the all-kernels sparse model equals the dense teacher to float64 precision."""
    model = tiny_model("token").double()
    tokens = torch.randint(20, (2, N), generator=seeded(0))
    with torch.no_grad():
        dense, _ = model(tokens)
        for path in ("reference", "fast"):
            ks.install(model, select="threshold", threshold=-1.0)
            set_path(model, path)
            logits, _ = model(tokens)
            assert logits.dtype == torch.float64
            assert torch.allclose(logits, dense, atol=1e-10), path


# --------------------------------------------------------------------------------------------- 7. causal
def test_causal_kernels_are_cut_at_the_query():
    bank = handmade_bank()
    valid = ~padding(3)
    sel = torch.ones(3, N, H, 4, dtype=torch.bool)
    mask = bank.mask(sel, valid, True)
    assert not (mask & ~torch.ones(N, N, dtype=torch.bool).tril()).any()
    row, col = bank.edges(sel, valid, True)
    assert len(row) > 0 and bool((col % N <= row % N).all())
    assert (bank.mask(sel, valid, False) & ~torch.ones(N, N, dtype=torch.bool).tril()).any()  # non-causal: not cut


@pytest.mark.parametrize("path", ["reference", "fast"])
@pytest.mark.parametrize("threshold", [-1.0, 0.5])
def test_causal_sparse_attention_never_sees_the_future(path, threshold):
    attn = make(path=path, threshold=threshold)
    x = torch.randn(2, N, DIM, generator=seeded(9))
    t = 4
    changed = x.clone()
    changed[:, t + 1 :] = torch.randn(2, N - t - 1, DIM, generator=seeded(10))
    with torch.no_grad():
        y, _ = attn(x, causal=True)
        y_changed, _ = attn(changed, causal=True)
        y_open, _ = attn(x, causal=False)
        y_open_changed, _ = attn(changed, causal=False)
    assert torch.allclose(y[:, : t + 1], y_changed[:, : t + 1], atol=1e-6)
    assert not torch.allclose(y_open[:, : t + 1], y_open_changed[:, : t + 1], atol=1e-4)  # the test can fail
    # gradients: output t depends on no later input
    xg = x.clone().requires_grad_()
    attn(xg, causal=True)[0][:, t].sum().backward()
    assert (xg.grad[:, t + 1 :] == 0).all() and (xg.grad[:, : t + 1] != 0).any()


def test_causal_lm_model_logits_ignore_future_tokens():
    model = tiny_model("lm")
    ks.install(model, select="topk", top_k=5)
    tokens = torch.randint(20, (2, N), generator=seeded(1))
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 20
    with torch.no_grad():
        a, _ = model(tokens)
        b, _ = model(changed)
    assert torch.allclose(a[:, :6], b[:, :6], atol=1e-6) and not torch.allclose(a[:, 6:], b[:, 6:], atol=1e-4)


def test_causal_predictor_window_ends_at_the_query():
    torch.manual_seed(0)
    predictor = ks.KernelPredictor(DIM, H, ks.standard_kernels(L), window=5, hidden=8)
    x = torch.randn(1, N, DIM, generator=seeded(2))
    changed = x.clone()
    changed[:, 5:] += 1.0
    valid = torch.ones(1, N, dtype=torch.bool)
    with torch.no_grad():
        assert torch.equal(predictor(x, valid, True)[:, :5], predictor(changed, valid, True)[:, :5])
        # non-causal: a centred 5-token window, so query 3 sees token 5
        assert not torch.equal(predictor(x, valid, False)[:, 3], predictor(changed, valid, False)[:, 3])
        assert torch.equal(predictor(x, valid, False)[:, :3], predictor(changed, valid, False)[:, :3])


# ---------------------------------------------------------------------- 6. reproducibility and bad input
def test_learned_kernels_build_and_run():
    """kernels="learned" builds a learned bank of `learned_kernels` kernels (the count must not shadow the bank's
    constructor) and runs."""
    attn = ks.KernelSparseAttention(DIM, H, D, max_len=L, hidden=16, kernels="learned", learned_kernels=5)
    assert attn.predictor.bank.learned and attn.predictor.bank.num_kernels == 5
    y, stats = attn(torch.randn(2, N, DIM), padding(), causal=True)
    assert torch.isfinite(y).all() and stats["density"].shape == (H,)


def test_causal_sparse_dropout_never_sees_the_future():
    """A flat dropout draw over the edge list would let a later token's edges shift the draws of earlier queries;
    pair_dropout draws per pair, so the past is unchanged under a fixed generator."""
    attn = make(dropout=0.3, threshold=0.5).train()
    x = torch.randn(2, N, DIM, generator=seeded(1))
    y = attn(x, padding(), causal=True, generator=seeded(2))[0]
    for t in range(1, N):
        changed = x.clone()
        changed[:, t:] = torch.randn(2, N - t, DIM, generator=seeded(t))
        assert torch.equal(attn(changed, padding(), causal=True, generator=seeded(2))[0][:, :t], y[:, :t]), t


@pytest.mark.parametrize("causal", [False, True])
def test_reference_and_fast_paths_drop_the_same_pairs(causal):
    """The masked path (every pair) and the sparse path (the edges) draw each pair's dropout from the same hash,
    so fine-tuning on the masked path trains what the sparse path computes, dropout included."""
    attn = make(dropout=0.3, select="topk", top_k=4).train()
    x = torch.randn(3, N, DIM, generator=seeded(3))
    results = []
    for path in ("reference", "fast"):
        attn.path = path
        attn.zero_grad()
        y, _ = attn(x, padding(3), causal, generator=seeded(4))
        y.square().sum().backward()
        results.append((y.detach(), attn.qkv.weight.grad.clone()))
    for m, s in zip(*results):
        assert torch.allclose(m, s, atol=1e-5)
    assert not torch.allclose(results[0][0], attn.eval()(x, padding(3), causal)[0], atol=1e-3)  # it does drop


def test_fine_tuning_runs_the_reference_path_and_leaves_the_predictors_out():
    """Fine-tuning (§6.2, ours): inside switched(path="reference") the sparse layers run the masked reference path
    (restored on exit), and backbone_parameters are every parameter but the frozen predictors'."""
    model = tiny_model("token")
    ks.install(model, select="topk", top_k=3)
    with ks.switched(model, path="reference"):
        assert [block.attn.path for block in model.blocks] == ["reference", "reference"]
    assert [block.attn.path for block in model.blocks] == ["fast", "fast"]
    trained = {id(p) for p in ks.backbone_parameters(model)}
    frozen = {id(p) for block in model.blocks for p in block.attn.predictor.parameters()}
    assert frozen and not trained & frozen and trained | frozen == {id(p) for p in model.parameters()}


def test_switched_restores_each_layer_s_own_setting():
    """The timing's dense runs (switched(sparse=False)) leave one sparse layer over one dense as they were."""
    model = tiny_model("token")
    ks.install(model, layers=1)
    with ks.switched(model, sparse=False):
        assert [block.attn.sparse for block in model.blocks] == [False, False]
    assert [block.attn.sparse for block in model.blocks] == [False, True]


def test_pair_dropout_keeps_pairs_independently_at_rate_one_minus_p():
    """Keep rate and pairwise independence over 40 seeds × 64² pairs: the mean keep rate's z-score, and the
    excess of adjacent pairs kept together over rate², within 4 standard errors of the sampling variance."""
    p, n, seeds = 0.3, 64, 40
    row, col = torch.arange(n)[:, None], torch.arange(n)[None]
    keep = torch.stack([ks.pair_dropout(torch.ones(n, n), row, col, p, seeded(s)) > 0 for s in range(seeds)])
    rate = keep.float().mean()
    assert abs(rate - (1 - p)) < 4 * (p * (1 - p) / keep.numel()) ** 0.5, rate
    both = (keep[:, :, 1:] & keep[:, :, :-1]).float().mean()
    assert abs(both - rate**2) < 4 * (rate**2 * (1 - rate**2) / keep[:, :, 1:].numel()) ** 0.5, both
    assert (keep[0] != keep[1]).any()  # seeds draw different masks


def test_default_config_is_the_paper_s():
    cfg = ks.KernelConfig()
    assert (cfg.family, cfg.loss, cfg.variant) == ("standard", "max", "standard/max")
    assert (cfg.target_threshold, cfg.handcrafted_k, cfg.learned_kernels, cfg.window) == (0.05, 20, 14, 5)


@pytest.mark.parametrize(
    "bad",
    [
        dict(family="bogus"),
        dict(loss="l1"),
        dict(family="learned", loss="per-kernel"),
        dict(target="soft"),
        dict(select="all"),
        dict(window=4),
        dict(window=0),
        dict(target_topk=0),
        dict(handcrafted_k=0),
        dict(learned_kernels=0),
        dict(hidden=0),
        dict(hidden_layers=0),
        dict(top_k=0),
        dict(analysis_sequences=0),
        dict(predictor_batch=0),
        dict(predictor_rows=0),
        dict(predictor_steps=-1),
        dict(finetune_steps=-1),
        dict(threshold=float("nan")),
        dict(learned_init=float("inf")),
    ],
)
def test_kernel_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        ks.KernelConfig(**bad)


@pytest.mark.parametrize(
    "bad",
    [
        dict(path="sparse"),
        dict(select="all"),
        dict(kernels="handcrafted"),
        dict(window=4),
        dict(dropout=1.0),
        dict(max_len=0),
        dict(top_k=0),
    ],
)
def test_attention_rejects_bad_arguments(bad):
    with pytest.raises(ValueError):
        ks.KernelSparseAttention(DIM, H, D, **bad)


def test_bad_shapes_and_inputs_raise():
    with pytest.raises(ValueError, match="kernel shapes"):
        ks.KernelBank(torch.zeros(1, 2, 2 * L), torch.zeros(1, 2, L), torch.zeros(1, 2, L))
    with pytest.raises(ValueError, match="groups"):
        ks.KernelPredictor(
            DIM, H, ks.KernelBank(torch.zeros(3, 1, 2 * L - 1), torch.zeros(3, 1, L), torch.zeros(3, 1, L))
        )
    attn = make()
    with pytest.raises(ValueError, match="max_len"):
        attn(torch.randn(1, L + 1, DIM))
    attn.sparse = False
    assert attn(torch.randn(1, L + 1, DIM))[0].shape == (1, L + 1, DIM)  # the teacher has no length limit
    with pytest.raises(ValueError, match="key_padding_mask"):
        attn(torch.randn(1, N, DIM), key_padding_mask=torch.zeros(1, N))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--attn", "window=3"], "unrecognized arguments: --attn"),
        (["--window", "4"], "odd"),
        (["--family", "learned", "--loss", "per-kernel"], "learned kernels: max only"),
        (["--family", "bogus"], "argument --family: invalid choice: 'bogus'"),
        (["--thresholds", "0.5"], "unrecognized arguments: --thresholds"),  # the pipeline's: experiments/
        (["--task", "duplicates"], "argument --task: invalid choice: 'duplicates'"),
    ],
)
def test_cli_rejects_bad_settings(argv, message, capsys, tmp_path):
    # a data folder without data and no training: were the check missing, main() would return 1 at once
    # rather than exit 2 (and never start a real training run)
    cheap = ["--device", "cpu", "--data-dir", str(tmp_path / "none"), "--no-download", "--steps", "0"]
    with pytest.raises(SystemExit) as exit_info:
        ks.main(["--task", "wikitext2", "--out", str(tmp_path / "out"), *cheap, *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_reports_missing_data(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ks.main(
            [
                "--task",
                "wikitext2",
                "--device",
                "cpu",
                "--data-dir",
                str(tmp_path / "none"),
                "--out",
                str(tmp_path / "out"),
                "--steps",
                "0",
                "--no-download",
            ]
        )
    assert exit_info.value.code == 1 and "WikiText-2" in capsys.readouterr().err


def test_script_entry_point_exits_non_zero_with_a_message():
    result = subprocess.run(
        [
            sys.executable,
            "kernel_sparse.py",
            "--task",
            "wikitext2",
            "--attn",
            "top_k=2",
            "--device",
            "cpu",
            "--data-dir",
            "/nonexistent",
            "--no-download",
            "--steps",
            "0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "unrecognized arguments: --attn" in result.stderr


@pytest.mark.parametrize("task", ["wikitext2", "bytes"])  # a masked-LM teacher, and a causal one
def test_main_end_to_end_smoke(task, tmp_path):
    """main(): the teacher, §4.1, one family's predictors installed with the selection rule, fine-tuning; the record
    is the fine-tuned sparse model's, the teacher's and the fit's numbers under `kernel`."""
    if not ((DATA / "wikitext-2" / "valid.txt").is_file() and (DATA / "wikitext-2" / "test.txt").is_file()):
        pytest.skip(f"no WikiText-2 in {DATA} (set SPARSE_ATTN_DATA)")
    out = tmp_path / "run"
    tiny = ["--seq-len", "32", "--dim", "16", "--depth", "2", "--heads", "2", "--head-dim", "8", "--mlp-dim", "32"]
    steps = ["--steps", "4", "--batch-size", "4", "--eval-every", "4", "--eval-batches", "1"]
    method = ["--analysis-sequences", "8", "--predictor-steps", "3", "--predictor-batch", "2", "--predictor-rows", "8"]
    chosen = ["--family", "handcrafted", "--handcrafted-k", "4", "--select", "topk", "--top-k", "2", "--hidden", "8"]
    where = ["--task", task, "--device", "cpu", "--data-dir", str(DATA), "--out", str(out)]
    tune = ["--final-eval-batches", "1", "--finetune-steps", "2"]
    assert ks.main([*where, *tiny, *steps, *method, *chosen, *tune]) == 0
    record = json.loads((out / "metrics.json").read_text())
    kernel = record["kernel"]
    assert record["method"] == "kernel" and record["config"]["family"] == "handcrafted"
    assert kernel["fit"]["kernels_per_layer"] == 6 and len(kernel["fit"]["train_loss_per_layer"]) == 2
    assert kernel["finetune"]["steps"] == 2 and math.isfinite(kernel["finetune"]["train_loss_last"])
    assert all(math.isfinite(v) for v in [*kernel["teacher"].values(), kernel["sparse_valid_ppl"]])
    # the record is the sparse model's: two handcrafted kernels a query, of ≤ 4 offsets, keys or queries each
    dense = 1.0 if task == "wikitext2" else 33 / 64  # causal: (N+1)/2N
    assert 0 < record["density"] < dense and record["valid_loss"] == pytest.approx(record["valid"] * math.log(2))


@pytest.mark.parametrize("init, selected", [(0.0, False), (-4.0, True)])
def test_learned_kernels_learn_the_previous_token_only_from_a_near_empty_start(init, selected):
    """The learned family's defect and its fix (ours): from logits N(0, 1) each kernel is a random half of the
    offsets, Eq. 1 switches every α off and the kernels never move, so τ = 0.5 selects nothing; from N(−4, 1) with
    the kernels' own learning rate a kernel comes to hold offset −1 (every query's previous token) and is selected."""
    n, data = 64, synthetic_layer_data(64, 8)
    data.target[:, :, :, 0] = False  # the previous token only
    data.target[:, :, 3] = False
    data.target[:, :, 3, 2] = True
    cfg = ks.KernelConfig(predictor_steps=150, predictor_rows=16, learned_init=init)
    predictor = ks.KernelPredictor(DIM, H, ks.init_learned_kernels(n, 4, seeded(0), init), hidden=16)
    ks.fit_predictor(predictor, data, False, "max", cfg, seeded(1))
    with torch.no_grad():
        mask = predictor.bank.mask(predictor(data.x, data.valid, False) > 0.5, data.valid, False)
    recall = float((mask & data.target).sum() / data.target.sum())
    assert (recall > 0.9) == selected and (float(mask.float().mean()) < 3 / n or not selected)
