"""Tests for ssa.py: SSA against an independent dense reference restricted to the drawn pattern, the
sampling distribution against the exact rank distribution of Eq. 3, and the procedures (+FT, ensembling)."""

import functools
import json
import math

import pytest
import torch
from torch import nn

import ssa
from alibi import alibi_slopes
from conftest import LowPrecisionMath, seeded

H, D, DIM = 2, 8, 16


def make(**kwargs) -> ssa.SSAttention:
    torch.manual_seed(0)
    return ssa.SSAttention(DIM, H, D, **kwargs).train()


def reference(module, x, key_padding_mask=None, causal=False, pattern=None):
    """Dense attention written from Eq. 2 with the full N×N ALiBi bias −2^(−8h/H)·|i − j|, key padding,
    causal mask and an optional (N, N) pattern of computed pairs; rows with no admissible key give 0."""
    b, n, _ = x.shape
    q, k, v = module.qkv(x).view(b, n, 3, H, D).permute(2, 0, 3, 1, 4)  # 3×(B, H, N, D)
    pos = torch.arange(n, dtype=torch.float32)
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])
    bias = -slopes[:, None, None] * (pos[:, None] - pos[None]).abs()  # (H, N, N)
    allowed = torch.ones(b, 1, n, n, dtype=torch.bool)
    if key_padding_mask is not None:
        allowed &= ~key_padding_mask[:, None, None, :]
    if causal:
        allowed &= torch.ones(n, n, dtype=torch.bool).tril()
    if pattern is not None:
        allowed &= pattern
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D) + (bias if module.alibi else 0)).masked_fill(~allowed, -math.inf)
    probs = scores.softmax(-1).nan_to_num(0.0)
    y = (probs @ v).transpose(1, 2).reshape(b, n, H * D)
    valid = torch.ones(b, n) if key_padding_mask is None else (~key_padding_mask).float()
    density = (allowed[:, 0].float() * valid[:, :, None]).sum() / (valid.sum(1) ** 2).sum().clamp_min(1)
    return module.out(y), density


def pattern_of(sources: torch.Tensor, n: int) -> torch.Tensor:
    """(N, N) bool: query i may use key j iff j is among the sources of i's window."""
    windows = sources.shape[0]
    pattern = torch.zeros(n, n, dtype=torch.bool)
    for w, rows in enumerate(torch.arange(n).view(windows, -1)):
        pattern[rows[:, None], sources[w][None, :]] = True
    return pattern


def padding(n: int, lengths) -> torch.Tensor:
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]  # (B, N), True at padding


VARIANTS = [
    dict(windows=4, sigma=0.3),
    dict(windows=2, sigma=0.3, grid=(4, 4)),
    dict(unbiased=0.5),
    dict(windows=4, sigma=0.2, alibi=False),
]


@pytest.mark.on_device
@pytest.mark.usefixtures("default_device")
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kwargs", VARIANTS)
@pytest.mark.parametrize("path", ["fast", "reference"])
def test_sampled_output_equals_dense_reference_on_drawn_pattern(kwargs, causal, path, padded):
    # One draw shared by both heads and both batch rows: the whole output equals dense attention with the
    # dense ALiBi bias and masks, restricted to that single pattern (Alg. 1/2, bias re-indexing).
    m = make(path=path, **kwargs)
    x, kpm = torch.randn(2, 16, DIM), padding(16, [16, 11]) if padded else None
    sources = m.draw_sources(16, causal, seeded(3))
    y, stats = m(x, kpm, causal=causal, generator=seeded(3))
    y_ref, density = reference(m, x, kpm, causal, pattern_of(sources, 16))
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats["density"], density.expand(H))


def test_length_not_divisible_by_windows_pads_internally():
    m = make(windows=4, sigma=0.3)
    x = torch.randn(2, 14, DIM)
    sources = m.draw_sources(16, True, seeded(5))
    y, _ = m(x, causal=True, generator=seeded(5))
    y_ref, _ = reference(m, x, causal=True, pattern=pattern_of(sources, 16)[:14, :14])
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.on_device
@pytest.mark.usefixtures("default_device")
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kwargs", [dict(windows=1, sigma=0.5), dict(unbiased=1.0), dict(sampling="never")])
def test_one_window_unbiased_p1_and_no_sampling_equal_dense_attention(kwargs, causal, padded):
    m = make(**kwargs)
    x, kpm = torch.randn(2, 12, DIM), padding(12, [12, 7]) if padded else None
    y, stats = m(x, kpm, causal=causal, generator=seeded(0))
    y_ref, density = reference(m, x, kpm, causal)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats["density"], density.expand(H))


def test_a_window_that_drew_only_padded_sources_outputs_zeros():
    # One draw serves the whole batch, so a short sequence's window may draw only padding: its valid queries
    # output zeros (not NaN), and the density counts no pair for them.
    m = make(windows=4, sigma=100.0)
    x, kpm = torch.randn(2, 16, DIM), padding(16, [16, 5])
    seed = next(s for s in range(100) if (m.draw_sources(16, False, seeded(s))[1] >= 5).all())
    y, stats = m(x, kpm, generator=seeded(seed))
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y[1, 4], m.out.bias)  # query 4 (window 1) attended to nothing
    sources = m.draw_sources(16, False, seeded(seed))
    y_ref, density = reference(m, x, kpm, pattern=pattern_of(sources, 16))
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats["density"], density.expand(H))


def test_eval_is_dense_by_default_and_sampling_always_samples():
    m = make(windows=4, sigma=0.3).eval()
    x = torch.randn(1, 16, DIM)
    torch.testing.assert_close(m(x, causal=True)[0], reference(m, x, causal=True)[0], atol=1e-5, rtol=1e-5)
    m.sampling = "always"
    assert m(x, causal=True, generator=seeded(0))[1]["density"][0] < 0.5


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("grid", [None, (8, 2)])
def test_sigma_zero_is_block_local_attention(causal, grid):
    m = make(windows=4, sigma=0.0, grid=grid)
    x = torch.randn(2, 16, DIM)
    blocks = torch.block_diag(*[torch.ones(4, 4, dtype=torch.bool)] * 4)
    y, stats = m(x, causal=causal, generator=seeded(1))
    torch.testing.assert_close(y, reference(m, x, causal=causal, pattern=blocks)[0], atol=1e-5, rtol=1e-5)
    expected = (4 * 5 / 2 if causal else 16) * 4 / 256
    assert stats["density"].tolist() == pytest.approx([expected] * H)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(windows=4, sigma=0.5),
        dict(windows=2, sigma=0.5, grid=(4, 4)),
        dict(unbiased=0.25),
        dict(windows=4, sigma=5.0),
    ],
)
def test_causal_never_sees_the_future_and_never_leaves_a_row_empty(kwargs):
    m = make(**kwargs)
    for seed in range(200):  # admissible source for every query: some source j ≤ i in its window
        sources = m.draw_sources(16, True, seeded(seed))  # (W, K)
        query = torch.arange(16).view(sources.shape[0], -1)
        assert (sources[:, None, :] <= query[:, :, None]).any(-1).all(), (seed, sources)
        assert all(len(set(row.tolist())) == len(row) for row in sources)  # without replacement per window
        assert (sources < (torch.arange(1, sources.shape[0] + 1) * query.shape[1])[:, None]).all()
    x = torch.randn(1, 16, DIM)
    y, _ = m(x, causal=True, generator=seeded(7))
    assert (y.abs().sum(-1) > 0).all()
    for t in range(15):  # changing the future leaves the past untouched, same draw
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn(1, 15 - t, DIM)
        torch.testing.assert_close(m(x2, causal=True, generator=seeded(7))[0][:, : t + 1], y[:, : t + 1])


def test_one_draw_is_shared_by_heads_and_batch():
    m = make(windows=4, sigma=0.5)
    with torch.no_grad():  # head 1 = head 0: identical weights give identical head outputs iff same sources
        w = m.qkv.weight.view(3, H, D, DIM)
        w[:, 1] = w[:, 0]
        m.qkv.bias.view(3, H, D)[:, 1] = m.qkv.bias.view(3, H, D)[:, 0]
    m.slopes.fill_(0.1)
    x = torch.randn(1, 16, DIM).expand(3, 16, DIM)
    m.out = nn.Identity()
    for seed in range(5):
        y = m(x, causal=seed % 2 == 1, generator=seeded(seed))[0].view(3, 16, H, D)
        torch.testing.assert_close(y[:, :, 0], y[:, :, 1])
        torch.testing.assert_close(y[0], y[2])


def test_alibi_reindexing_equals_dense_bias_gathered_on_blocks():
    m = make(windows=4, sigma=0.4)
    pos = torch.arange(16.0)
    dense = -alibi_slopes(H)[:, None, None] * (pos[:, None] - pos[None]).abs()  # (H, N, N)
    for causal in (False, True):
        sources = m.draw_sources(16, causal, seeded(2))
        query = torch.arange(16).view(4, 4)
        gathered = torch.stack([dense[:, query[w]][:, :, sources[w]] for w in range(4)], 1)  # (H, W, Nw, K)
        torch.testing.assert_close(m.block_bias(query, sources), gathered)


@functools.lru_cache(maxsize=None)
def exact_window_probabilities(n: int, j: int, sigma: float, windows: int) -> torch.Tensor:
    """P(position j lands in slot w of argsort(i + σ·n_i)), exactly: given n_j = z, each other i ranks below
    j independently with p_i(z) = Φ((j − i)/σ + z), so rank_j | z is Poisson-binomial; integrate over z."""
    z = torch.linspace(-9, 9, 3601, dtype=torch.float64)  # (Z,)
    others = torch.tensor([i for i in range(n) if i != j], dtype=torch.float64)
    p = torch.special.ndtr((j - others)[None, :] / sigma + z[:, None])  # (Z, N−1)
    pmf = torch.zeros(len(z), n, dtype=torch.float64)
    pmf[:, 0] = 1.0
    for i in range(n - 1):  # add one Bernoulli(p_i) to the rank
        pmf = pmf * (1 - p[:, i : i + 1]) + torch.nn.functional.pad(pmf[:, :-1], (1, 0)) * p[:, i : i + 1]
    weight = torch.exp(-(z**2) / 2) / math.sqrt(2 * math.pi) * (z[1] - z[0])  # (Z,)
    return (weight[:, None] * pmf).sum(0).view(windows, -1).sum(1)  # (W,)


@pytest.mark.parametrize("causal", [False, True])
def test_window_membership_matches_the_gaussian_shift_model(causal):
    # Empirical frequency of "source j in window w" over T draws against the exact rank distribution of
    # Eq. 3 (causal: window w ranks its own prefix and keeps its last N/W ranks). Bound: 5 binomial
    # standard deviations per cell (plus 1e-4 for the quadrature), with a fixed seed.
    n, windows, sigma, trials = 16, 4, 3.0, 4000
    generator, counts = seeded(0), torch.zeros(windows, n)
    for _ in range(trials):
        sources = ssa.window_sources(n, 1, windows, sigma, 0.0, causal, generator)
        counts.scatter_add_(1, sources, torch.ones(sources.shape))
    block = n // windows
    for w in range(windows):
        prefix = (w + 1) * block if causal else n
        for j in range(prefix):  # causal: window w keeps ranks [w·Nw, prefix) of its own draw over the prefix
            p = min(1.0, exact_window_probabilities(prefix, j, sigma, prefix // block)[w].item())
            tolerance = 5 * math.sqrt(p * (1 - p) / trials) + 1e-4
            assert abs(counts[w, j].item() / trials - p) <= tolerance, (w, j, counts[w, j].item() / trials, p)
        assert counts[w, prefix:].sum() == 0


def test_grid_row_bands_follow_the_one_dimensional_model_per_column():
    # 2-D: a token's band depends only on its column's vertical shuffle, so its band frequencies follow the
    # 1-D model over the rows whatever the horizontal shuffle does.
    rows, cols, windows, trials = 8, 3, 2, 3000
    generator, counts = seeded(1), torch.zeros(windows, rows * cols)
    for _ in range(trials):
        sources = ssa.window_sources(rows, cols, windows, 2.0, 1.0, False, generator)
        counts.scatter_add_(1, sources, torch.ones(sources.shape))
    assert (counts.sum(0) == trials).all()  # non-causal: the windows partition the sources
    for token in range(rows * cols):
        p = exact_window_probabilities(rows, token // cols, 2.0, windows)[0].item()
        assert abs(counts[0, token].item() / trials - p) <= 5 * math.sqrt(p * (1 - p) / trials) + 1e-4


@pytest.mark.parametrize("sampling", ["training", "never"])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_invariance(sampling, causal):
    m = make(windows=4, sigma=0.4, sampling=sampling)
    x, kpm = torch.randn(2, 16, DIM), padding(16, [16, 10])
    y = m(x, kpm, causal=causal, generator=seeded(4))[0]
    x2 = x.clone()
    x2[1, 10:] = 100 * torch.randn(6, DIM)  # padded content changes nothing at valid positions
    torch.testing.assert_close(m(x2, kpm, causal=causal, generator=seeded(4))[0][1, :10], y[1, :10])
    if sampling == "never":  # and appending padding changes nothing either
        short = m(x[1:, :10], causal=causal)[0]
        torch.testing.assert_close(short, y[1:, :10], atol=1e-5, rtol=1e-5)


@pytest.mark.on_device
@pytest.mark.usefixtures("default_device")
def test_fast_and_reference_paths_agree_in_gradients():
    x, kpm = torch.randn(2, 16, DIM), padding(16, [16, 9])
    grads = []
    for path in ("fast", "reference"):
        m = make(windows=4, sigma=0.3, path=path)
        m(x, kpm, causal=True, generator=seeded(8))[0].square().sum().backward()
        grads.append(m.qkv.weight.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_reference_core_under_bf16_autocast_runs_its_softmax_in_float32(path):
    """Masked scores with dropout in training (or path="reference") take the reference core; under bf16 autocast its
    score product must not run in bf16, where the float32 mask fill would overflow it."""
    m = make(windows=4, sigma=0.3, dropout=0.1, alibi=False, path=path)
    record = LowPrecisionMath()
    with torch.autocast("cpu", dtype=torch.bfloat16), record:
        y, _ = m(torch.randn(2, 8, DIM), padding(8, [8, 5]), causal=True, generator=seeded(0))
    assert torch.isfinite(y).all() and not record.seen, record.seen


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="1/integer"):
        make(unbiased=0.3)(torch.randn(1, 16, DIM), causal=True)
    with pytest.raises(ValueError, match="grid"):
        make(grid=(4, 4))(torch.randn(1, 12, DIM))
    with pytest.raises(ValueError):
        make(sampling="sometimes")


class TinyModel(nn.Module):
    """A two-layer residual stack built through the factory, returning (logits, stats) like bench's."""

    def __init__(self, cfg: ssa.SSAConfig, layers: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(11, DIM)
        make_attention = ssa.make_attention_factory(cfg, DIM, H, D, 0.0, layers)
        self.blocks = nn.ModuleList(make_attention(i) for i in range(layers))
        self.head = nn.Linear(DIM, 11)

    def forward(self, tokens, key_padding_mask=None, generator=None):
        x, densities = self.embed(tokens), []
        for block in self.blocks:
            y, stats = block(x, key_padding_mask, causal=True, generator=generator)
            x, densities = x + y, densities + [stats["density"]]
        return self.head(x), {"density": torch.stack(densities)}


def test_factory_samples_the_last_layers_with_a_sigma_ramp():
    cfg = ssa.SSAConfig(layers=3, windows=4, sigma=(0.1, 0.2))
    modules = TinyModel(cfg, layers=5).blocks
    assert [m.sampling for m in modules] == ["never"] * 2 + ["training"] * 3
    assert [m.sigma for m in modules][2:] == pytest.approx([0.1, 0.15, 0.2])
    assert cfg.name(5) == "S3-L4" and ssa.SSAConfig(unbiased=0.8).name(6) == "S6-U20"


def test_self_ensemble_of_one_sample_equals_one_ssa_forward():
    model = TinyModel(ssa.SSAConfig(layers=2, windows=4, sigma=(0.2, 0.4))).train()
    tokens, kpm = torch.randint(0, 11, (2, 16)), padding(16, [16, 12])
    ensembled = ssa.self_ensemble(model, tokens, kpm, n_samples=1, generator=seeded(6))
    assert model.training and [m.sampling for m in model.blocks] == ["never", "training", "training"]
    model.eval()
    for m in model.blocks[1:]:
        m.sampling = "always"
    logits, stats = model(tokens, key_padding_mask=kpm, generator=seeded(6))
    torch.testing.assert_close(ensembled, logits.log_softmax(-1))
    assert stats["density"][0, 0] > stats["density"][1, 0]  # the first layer stayed dense
    generator, probs = seeded(6), 0
    for _ in range(3):
        probs = probs + model(tokens, key_padding_mask=kpm, generator=generator)[0].softmax(-1) / 3
    torch.testing.assert_close(ssa.self_ensemble(model, tokens, kpm, 3, seeded(6)), probs.log())


def test_self_ensembling_samples_again_after_the_dense_tail():
    """+FT sets every layer to "never"; self-ensembling samples the layers built as SSA layers again, in eval mode
    (dropout off), and restores the dense setting and the training mode on exit."""
    model = TinyModel(ssa.SSAConfig(layers=2, windows=4, sigma=(0.2, 0.4))).train()
    for m in model.blocks:
        m.sampling = "never"
    tokens = torch.randint(0, 11, (2, 16))
    with ssa.sampling_in_eval(model):
        assert not model.training and [m.sampling for m in model.blocks] == ["never", "always", "always"]
        density = model(tokens, generator=seeded(1))[1]["density"][:, 0]
    assert density[0] > density[1] and density[0] > density[2]
    assert model.training and [m.sampling for m in model.blocks] == ["never"] * 3


def test_the_dense_tail_is_the_last_fraction_of_the_steps():
    assert ssa.fine_tune_start(20, 0.1) == 18 and ssa.fine_tune_start(20, 0.0) == 20
    assert ssa.fine_tune_start(10, 1.0) == 0 and ssa.fine_tune_start(100, 0.001) == 100


def test_command_line_trains_sub_models_then_the_dense_tail(tmp_path):
    """main(): 2 steps of sampled sub-models (a quarter of the pairs each), then 2 dense steps (+FT)."""
    out = tmp_path / "run"
    argv = [
        "--task",
        "duplicates",
        "--seq-len",
        "32",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--eval-every",
        "4",
        "--eval-batches",
        "1",
        "--final-eval-batches",
        "1",
        "--finetune-fraction",
        "0.5",
        "--log-every",
        "1",
        "--out",
        str(out),
    ]
    assert ssa.main(argv) == 0
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [line["density"] for line in log if line["split"] == "train"] == pytest.approx([0.25, 0.25, 1.0, 1.0])
    record = json.loads((out / "metrics.json").read_text())
    assert record["train_density"] == pytest.approx(0.625)


def test_command_line_trains_with_fine_tuning_and_self_ensembling(tmp_path):
    out = tmp_path / "run"
    argv = [
        "--task",
        "duplicates",
        "--seq-len",
        "32",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--eval-every",
        "4",
        "--eval-batches",
        "1",
        "--final-eval-batches",
        "1",
        "--finetune-fraction",
        "0.5",
        "--ensemble-samples",
        "3",
        "--sigma",
        "0.2",
        "--out",
        str(out),
    ]
    assert ssa.main(argv) == 0
    record = json.loads((out / "metrics.json").read_text())
    assert record["method"] == "ssa" and record["ssa"]["setting"] == "S1-L4+FT"
    assert record["ssa"]["sigma_per_layer"] == [0.2] and 0 <= record["ssa"]["ensemble_test"] <= 1
    curve = record["ssa"]["ensemble_curve"]  # Fig. 7: sizes 1, 2 and the requested 3
    assert list(curve) == ["1", "2", "3"] and record["ssa"]["ensemble_valid"] == curve["3"]
    assert all(0 <= v <= 1 for v in curve.values())
    # evaluation is dense; a training step's sub-model sees a quarter of the keys and costs less attention
    assert record["density"] == pytest.approx(1.0) and record["ssa"]["sampled_density"] == pytest.approx(0.25)
    sampled, dense = record["ssa"]["sampled_flops_per_example"], record["flops_per_example"]
    assert (
        sampled["attention"] < dense["attention"]
        and sampled["model"] - sampled["attention"] == dense["model"] - dense["attention"]
    )


def test_ensemble_sizes_double_up_to_the_requested_count():
    assert ssa.ensemble_sizes(1) == [1] and ssa.ensemble_sizes(8) == [1, 2, 4, 8]
    assert ssa.ensemble_sizes(50) == [1, 2, 4, 8, 16, 32, 50]


@pytest.mark.parametrize(
    "bad",
    [
        ["--grid", "3x5"],
        ["--attn", "windows=2"],
        ["--ssa-layers", "5"],
        ["--unbiased", "1.5"],
        ["--sigma", "0.1", "0.2", "0.3"],
    ],
)
def test_command_line_rejects_bad_settings_with_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        ssa.main(["--task", "duplicates"] + bad)
    assert exc.value.code == 2


@pytest.mark.parametrize("extra, expected", [([], False), (["--pos-emb", "true"], True), (["--no-alibi"], True)])
def test_lm_tasks_drop_positional_embeddings_under_alibi(tmp_path, extra, expected):
    """App. B.1: the ALiBi decoder has no positional embeddings; asking for them, or dropping ALiBi, keeps the
    preset's learned positions."""
    text = tmp_path / "text.txt"
    text.write_bytes(bytes(range(32, 127)) * 40)
    out = tmp_path / "run"
    argv = [
        "--task",
        "bytes",
        "--data-file",
        str(text),
        "--seq-len",
        "32",
        "--steps",
        "0",
        "--batch-size",
        "2",
        "--eval-batches",
        "1",
        "--final-eval-batches",
        "1",
        "--eval-context",
        "8",
        "--out",
        str(out),
        *extra,
    ]
    assert ssa.main(argv) == 0
    assert json.loads((out / "metrics.json").read_text())["config"]["pos_emb"] is expected


@pytest.mark.parametrize("kwargs", [dict(), dict(alibi=False), dict(sampling="never")])
def test_float16_autocast_lets_no_masked_source_through(kwargs):
    """Before: the fast core's additive mask was finfo(float16).min = −65504, which a float16 score passes in size,
    so the future and padded sources got weight (gradients of 1e3 through them). Now −inf, with a dummy source for
    a row that has none (zeroed after)."""
    from test_full import float16_leaks

    m = make(**kwargs)
    for seed in range(4):
        m.train(seed % 2 == 0)
        assert float16_leaks(m, seed) == [0.0, 0.0], seed
