"""The fixed-sparse baselines: baselines/window.py (a chunked band) and baselines/bigbird.py (block gathers).
For each, the fast and reference (dense mask) paths agree in outputs and gradients, the density matches a
brute-force count of the pattern, the density helpers and target-density budgets hold, causality, padded keys,
empty rows, dropout and BigBird's random blocks come from the generator, bad arguments are refused. The
interface contract is tests/test_interface.py."""

import pytest
import torch

from baselines.bigbird import BigBirdAttention, bigbird_budget, bigbird_density, fixed_blocks, random_candidates
from baselines.window import WindowAttention, window_density, window_for_density
from conftest import DEVICE

DIM, H, D = 12, 3, 4


def make_pair(cls, **budget):
    torch.manual_seed(0)
    fast = cls(DIM, H, D, path="fast", **budget).double()
    reference = cls(DIM, H, D, path="reference", **budget).double()
    reference.load_state_dict(fast.state_dict())
    return fast.to(DEVICE), reference.to(DEVICE)


def padding(batch: int, n: int) -> torch.Tensor:
    pad = torch.rand(batch, n, generator=torch.Generator().manual_seed(n)) < 0.3
    pad[0, : n // 2] = True  # leading padding: with causal and a narrow window, early queries see no key
    return pad


def assert_paths_agree(fast, reference, x, pad, causal, generator=lambda: None):
    """Outputs, densities and the gradients of the input and every parameter agree to float64 rounding."""
    grad_out = torch.randn(x.shape, dtype=torch.float64).to(x.device)
    results = []
    for module in (fast, reference):
        y, stats = module(x, pad, causal, generator())
        (y * grad_out).sum().backward()
        results.append([y.detach(), stats["density"], x.grad.clone()] + [p.grad.clone() for p in module.parameters()])
        x.grad = None
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def same(a: torch.Tensor, b: torch.Tensor):
    """Bitwise on the CPU; on CUDA to float32 rounding (atomics' summation order may differ between runs)."""
    if a.device.type == "cpu":
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ window
def band_mask(n: int, w: int, causal: bool) -> torch.Tensor:
    """(N, M) bool written out pair by pair."""
    return torch.tensor([[(0 <= i - j <= w) if causal else abs(i - j) <= w for j in range(n)] for i in range(n)])


# N = 1, N < w, N < the chunk (64), spans covering N (the dense form); chunked: N not a multiple of the chunk,
# several chunks, w = 0, a span wider than a chunk.
@pytest.mark.parametrize(
    "n, w", [(1, 0), (1, 3), (5, 2), (5, 9), (37, 0), (130, 40), (100, 7), (129, 3), (150, 0), (200, 40), (256, 70)]
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.on_device
@pytest.mark.parametrize("padded", [False, True])
def test_fast_and_reference_agree_window(n, w, causal, padded):
    fast, reference = make_pair(WindowAttention, window=w)
    x = torch.randn(2, n, DIM, dtype=torch.float64).to(DEVICE).requires_grad_()
    pad = padding(2, n).to(DEVICE) if padded else None
    assert_paths_agree(fast, reference, x, pad, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("w", [0, 2, 50])
def test_density_is_the_brute_force_count_of_the_mask(causal, w):
    n = 23
    pad = padding(3, n)
    _, stats = WindowAttention(DIM, H, D, window=w)(torch.randn(3, n, DIM), pad, causal)
    valid = ~pad
    band = band_mask(n, w, causal)
    pairs = sum(int((band & valid[b][:, None] & valid[b][None, :]).sum()) for b in range(3))
    total = sum(int(valid[b].sum()) ** 2 for b in range(3))
    assert stats["density"].shape == (H,) and not stats["density"].requires_grad
    torch.testing.assert_close(stats["density"], torch.full((H,), pairs / total))


@pytest.mark.parametrize("causal", [False, True])
def test_density_helpers_are_exact_and_the_budget_is_the_nearest(causal):
    for n in (1, 2, 9, 40):
        for w in range(n + 2):
            assert window_density(n, w, causal) == pytest.approx(band_mask(n, w, causal).sum().item() / n**2)
        for target in (0.01, 0.07, 0.3, 0.5, 1.0):
            errors = [abs(window_density(n, w, causal) - target) for w in range(n)]
            assert errors[window_for_density(n, target, causal)] == pytest.approx(min(errors))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1000, 4096])
def test_realised_density_is_within_one_over_n_of_the_target(causal, n):
    """Stated tolerance: the nearest w is within half a step of the target, and a step of w moves the density by
    at most 2/N (causal: 1/N), so |realised − target| ≤ 1/N at any length where the target is reachable."""
    module = WindowAttention(8, 2, 4, density=0.07)
    with torch.no_grad():
        _, stats = module(torch.randn(1, n, 8), causal=causal)
    assert (stats["density"] - 0.07).abs().max() <= 1 / n
    assert "window=None, density=0.07" in module.extra_repr()


@pytest.mark.on_device
@pytest.mark.parametrize("path", ["fast", "reference"])
def test_causal_outputs_ignore_later_tokens_and_padding_window(path):
    module = WindowAttention(DIM, H, D, window=5, path=path)
    n, t = 100, 80  # t inside the second chunk (64-127): its chunk also scores later keys, which must be masked
    x = torch.randn(2, n, DIM).to(DEVICE).requires_grad_()
    pad = padding(2, n).to(DEVICE)
    y, _ = module.to(DEVICE)(x, pad, causal=True)
    x2, pad2 = x.detach().clone(), pad.clone()
    x2[:, t:] = 1e3 * torch.randn(2, n - t, DIM).to(DEVICE)
    pad2[:, t:] = ~pad2[:, t:]
    y2, _ = module(x2, pad2, causal=True)
    same(y2[:, :t], y[:, :t].detach())
    (grad,) = torch.autograd.grad(y[:, :t].sum(), x)
    assert grad[:, t:].abs().max() == 0


@pytest.mark.on_device
@pytest.mark.parametrize("path", ["fast", "reference"])
def test_padded_keys_receive_no_weight_window(path):
    module = WindowAttention(DIM, H, D, window=4, path=path)
    x, pad = torch.randn(2, 150, DIM).to(DEVICE), padding(2, 150).to(DEVICE)
    y, _ = module.to(DEVICE)(x, pad)
    y2, _ = module(torch.where(pad[..., None], 1e3 * torch.randn(x.shape).to(DEVICE), x), pad)
    torch.testing.assert_close(y2[~pad], y[~pad])


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_a_window_of_padding_outputs_zeros_with_finite_gradients(path):
    module = WindowAttention(DIM, H, D, window=1, path=path)
    x = torch.randn(1, 150, DIM, requires_grad=True)
    pad = torch.zeros(1, 150, dtype=torch.bool)
    pad[0, 3:6] = True  # query 4's window {3, 4, 5} is all padding, though the example has valid keys
    y, _ = module(x, pad)
    torch.testing.assert_close(y[0, 4], module.out.bias)
    assert not torch.allclose(y[0, 3], module.out.bias)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_dropout_comes_from_the_generator_and_leaves_the_global_rng_alone():
    module = WindowAttention(DIM, H, D, dropout=0.5, window=3).train()
    x = torch.randn(2, 150, DIM)
    state = torch.get_rng_state()
    a, b, c = (module(x, generator=torch.Generator().manual_seed(s))[0] for s in (1, 1, 2))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_bad_arguments_are_clear_value_errors_window():
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool tensor of shape \(2, 5\)"):
        WindowAttention(DIM, H, D)(torch.randn(2, 5, DIM), torch.zeros(2, 5))
    for budget, words in [
        (dict(window=-1), "window .* must be >= 0"),
        (dict(density=0.0), r"density must be in \(0, 1\]"),
        (dict(density=1.5), r"density must be in \(0, 1\]"),
        (dict(window=3, density=0.1), "window or density, not both"),
        (dict(path="dense"), "path must be 'reference' or 'fast'"),
    ]:
        with pytest.raises(ValueError, match=words):
            WindowAttention(DIM, H, D, **budget)


def test_extra_repr_shows_the_budget_window():
    assert "window=64, density=None, full_heads=0, path=fast" in WindowAttention(DIM, H, D).extra_repr()
    assert (
        "window=3, density=None, full_heads=1, path=reference"
        in WindowAttention(DIM, H, D, window=3, full_heads=1, path="reference").extra_repr()
    )


# ------------------------------------------------------------------------ a fixed head allocation (full_heads)
@pytest.mark.parametrize("n, w", [(1, 0), (9, 2), (130, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("full_heads", [1, H])
def test_full_heads_are_full_attention_and_the_rest_keep_the_window(n, w, causal, full_heads):
    """Head by head, before the output projection: the first full_heads heads equal a window of N − 1 (every
    admissible key), the others the window w, in outputs and densities; both paths agree."""
    fast, reference = make_pair(WindowAttention, window=w, full_heads=full_heads)
    x = torch.randn(2, n, DIM, dtype=torch.float64, requires_grad=True)
    pad = padding(2, n)
    assert_paths_agree(fast, reference, x, pad, causal)
    alone = {width: WindowAttention(DIM, H, D, window=width).double() for width in (max(n - 1, 0), w)}
    weights = fast.state_dict()
    for module in (fast, *alone.values()):
        module.load_state_dict(weights)
        module.out = torch.nn.Identity()  # (B, N, H·D): the heads side by side
    y, stats = fast(x, pad, causal)
    (y_full, full), (y_window, window) = (alone[width](x, pad, causal) for width in (max(n - 1, 0), w))
    split = full_heads * D  # the head groups' products run at other batch shapes than three heads': a rounding apart
    torch.testing.assert_close(y[..., :split], y_full[..., :split], rtol=0, atol=1e-12)
    torch.testing.assert_close(y[..., split:], y_window[..., split:], rtol=0, atol=1e-12)
    torch.testing.assert_close(
        stats["density"], torch.cat([full["density"][:full_heads], window["density"][full_heads:]])
    )


def test_full_heads_out_of_range_is_a_clear_value_error():
    for full_heads in (-1, H + 1):
        with pytest.raises(ValueError, match=r"full_heads must be in \[0, heads=3\]"):
            WindowAttention(DIM, H, D, full_heads=full_heads)


def test_a_layer_allocation_makes_its_first_layers_full_and_the_model_s_factory_names_the_layer():
    """full_layers = 1: layer 0 is full attention (every head), layer 1 keeps its window and full_heads; the
    backbone's factory passes each layer its index, and `layer` is no --attn option."""
    from types import SimpleNamespace

    from bench.methods import option_names, same_in_every_layer

    cfg = SimpleNamespace(dim=DIM, heads=H, head_dim=D, attn_dropout=0.0, max_len=16)
    make = same_in_every_layer(WindowAttention, cfg, {"window": 1, "full_layers": 1, "full_heads": 1})
    assert [make(layer).full_heads for layer in (0, 1)] == [H, 1]
    x = torch.randn(2, 10, DIM)
    assert torch.equal(make(0)(x)[1]["density"], torch.ones(H))
    assert torch.allclose(make(1)(x)[1]["density"], torch.tensor([1.0, 0.28, 0.28]))  # 28 of 100 pairs in |i − j| ≤ 1
    assert "layer" not in option_names("window") and "full_layers" in option_names("window")
    with pytest.raises(ValueError, match="full_layers and layer must be >= 0"):
        WindowAttention(DIM, H, D, full_layers=-1)


# ------------------------------------------------------------------------------------------------ BigBird
def seeded(seed: int = 7, device="cpu") -> torch.Generator:
    return torch.Generator(device).manual_seed(seed)


# (N, block, window_blocks, global_blocks, random_blocks): N = 1 and N < b, N not a multiple of b, no global
# blocks, b = 1, every block global (g ≥ nb), r above the candidates left.
CONFIGS = [
    (1, 4, 1, 2, 3),
    (7, 2, 1, 1, 1),
    (30, 4, 1, 2, 3),
    (32, 4, 0, 0, 2),
    (33, 1, 2, 1, 5),
    (20, 4, 1, 9, 1),
    (64, 8, 1, 2, 30),
]


@pytest.mark.parametrize("n, block, w, g, r", CONFIGS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.on_device
@pytest.mark.parametrize("padded", [False, True])
def test_fast_and_reference_agree_bigbird(n, block, w, g, r, causal, padded):
    fast, reference = make_pair(BigBirdAttention, block=block, window_blocks=w, global_blocks=g, random_blocks=r)
    x = torch.randn(2, n, DIM, dtype=torch.float64).to(DEVICE).requires_grad_()
    pad = padding(2, n).to(DEVICE) if padded else None
    assert_paths_agree(fast, reference, x, pad, causal, lambda: seeded(device=DEVICE))


@pytest.mark.parametrize("causal", [False, True])
def test_density_is_the_brute_force_count_of_the_pattern(causal):
    n, block = 23, 4
    module = BigBirdAttention(DIM, H, D, block=block, window_blocks=1, global_blocks=1, random_blocks=2)
    pad = padding(3, n)
    _, stats = module(torch.randn(3, n, DIM), pad, causal, seeded())
    pattern, _ = module.draw_pattern(n, causal, seeded(), "cpu")  # the same draw
    valid = (~pad).tolist()
    total = sum(sum(v) ** 2 for v in valid)
    for h in range(H):
        pairs = sum(
            valid[b][i] and valid[b][j] and bool(pattern[h, i // block, j // block]) and (j <= i or not causal)
            for b in range(3)
            for i in range(n)
            for j in range(n)
        )
        assert stats["density"][h].item() == pytest.approx(pairs / total)
    assert not stats["density"].requires_grad and stats["density"].dtype == torch.float32


@pytest.mark.parametrize("causal", [False, True])
def test_random_blocks_are_min_r_candidates_per_row_and_causal_rows_look_back(causal):
    nb, w, g, r = 12, 1, 2, 3
    module = BigBirdAttention(DIM, H, D, block=1, window_blocks=w, global_blocks=g, random_blocks=r)
    pattern, _ = module.draw_pattern(nb, causal, seeded(), "cpu")  # block 1: one block per token
    fixed = fixed_blocks(nb, w, g, causal)
    candidates = random_candidates(fixed, causal)
    assert (pattern >= fixed).all()
    extra = pattern & ~fixed
    assert not (extra & ~candidates).any()
    torch.testing.assert_close(extra.sum(-1), candidates.sum(-1).clamp_max(r).expand(H, nb))
    if causal:
        assert not pattern.triu(1).any()
    assert not torch.equal(pattern[0], pattern[1]) or not torch.equal(pattern[1], pattern[2])  # drawn per head


@pytest.mark.parametrize("causal", [False, True])
def test_expected_density_is_exact(causal):
    """With N a multiple of b every draw has the expected density; otherwise the tail block's pick varies, and the
    mean over draws converges to it."""
    module = BigBirdAttention(4, 1, 4, block=4, window_blocks=1, global_blocks=1, random_blocks=2)
    for n in (64, 62):
        with torch.no_grad():
            realised = torch.stack(
                [module(torch.randn(1, n, 4), None, causal, seeded(s))[1]["density"][0] for s in range(300)]
            ).double()
        expected = bigbird_density(n, 4, 1, 1, 2, causal)
        if n == 64:
            torch.testing.assert_close(realised, torch.full_like(realised, expected), rtol=1e-6, atol=1e-7)
        else:
            assert abs(realised.mean().item() - expected) < 4 * realised.std().item() / 300**0.5 + 1e-7


@pytest.mark.parametrize("causal", [False, True])
def test_budget_is_the_nearest_r_for_the_widest_window_not_above_the_target(causal):
    for n, target in [(40, 0.3), (64, 0.5), (64, 0.05), (100, 0.6)]:
        block, w, r = bigbird_budget(n, target, 4, 2, 1, causal)
        assert block == 4 or bigbird_density(n, block + 1, 0, 1, 0, causal) > target  # the largest that fits
        if w < 2:
            assert bigbird_density(n, block, w + 1, 1, 0, causal) > target
        assert w == 0 or bigbird_density(n, block, w, 1, 0, causal) <= target
        errors = [abs(bigbird_density(n, block, w, 1, rr, causal) - target) for rr in range(-(-n // block) + 1)]
        assert errors[r] == pytest.approx(min(errors))


@pytest.mark.parametrize("causal", [False, True])
def test_a_target_below_the_blocks_floor_takes_smaller_blocks_down_to_single_tokens(causal):
    """At N = 512 one global block of 64 and the diagonal hold a third of the pairs (causal: a sixth): a target of
    5% takes the largest block whose floor fits, and one below every block's floor takes single tokens, the least
    pattern."""
    n, g = 512, 1
    block, w, r = bigbird_budget(n, 0.05, 64, 1, g, causal)
    assert bigbird_density(n, 64, 0, g, 0, causal) > 0.15
    assert bigbird_density(n, block, 0, g, 0, causal) <= 0.05 < bigbird_density(n, block + 1, 0, g, 0, causal)
    assert abs(bigbird_density(n, block, w, g, r, causal) - 0.05) <= block / n
    assert bigbird_budget(n, 1e-4, 64, 1, g, causal) == (1, 0, 0)
    module = BigBirdAttention(8, 2, 4, density=1e-4, global_blocks=g)
    with torch.no_grad():
        _, stats = module(torch.randn(1, n, 8), causal=causal, generator=seeded())
    assert stats["density"][0].item() == pytest.approx(bigbird_density(n, 1, 0, g, 0, causal))  # 3 keys a query or so
    assert module.draw_pattern(n, causal, seeded(), "cpu")[1] == 1


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [2048, 4096])
def test_realised_density_is_within_b_over_n_of_the_target(causal, n):
    """Stated tolerance: one more random block per row moves the density by about b/N (causal less), the nearest r
    is within half of that, and the tail block's draw adds less: |realised − target| ≤ b/N where reachable."""
    module = BigBirdAttention(8, 2, 4, block=16, density=0.07)
    with torch.no_grad():
        _, stats = module(torch.randn(1, n, 8), causal=causal, generator=seeded())
    assert (stats["density"] - 0.07).abs().max() <= 16 / n
    assert "random_blocks=None, density=0.07" in module.extra_repr()


@pytest.mark.on_device
@pytest.mark.parametrize("path", ["fast", "reference"])
def test_causal_outputs_ignore_later_tokens_and_padding_bigbird(path):
    module = BigBirdAttention(DIM, H, D, block=4, window_blocks=1, global_blocks=1, random_blocks=2, path=path)
    n, t = 40, 22  # t inside block 5: its own block holds later keys, which must be masked
    x = torch.randn(2, n, DIM).to(DEVICE).requires_grad_()
    pad = padding(2, n).to(DEVICE)
    y, _ = module.to(DEVICE)(x, pad, True, seeded(device=DEVICE))
    x2, pad2 = x.detach().clone(), pad.clone()
    x2[:, t:] = 1e3 * torch.randn(2, n - t, DIM).to(DEVICE)
    pad2[:, t:] = ~pad2[:, t:]
    y2, _ = module(x2, pad2, True, seeded(device=DEVICE))
    same(y2[:, :t], y[:, :t].detach())
    (grad,) = torch.autograd.grad(y[:, :t].sum(), x)
    assert grad[:, t:].abs().max() == 0


@pytest.mark.on_device
@pytest.mark.parametrize("path", ["fast", "reference"])
def test_padded_keys_receive_no_weight_bigbird(path):
    module = BigBirdAttention(DIM, H, D, block=4, window_blocks=1, global_blocks=1, random_blocks=2, path=path)
    x, pad = torch.randn(2, 30, DIM).to(DEVICE), padding(2, 30).to(DEVICE)
    y, _ = module.to(DEVICE)(x, pad, False, seeded(device=DEVICE))
    y2, _ = module(
        torch.where(pad[..., None], 1e3 * torch.randn(x.shape).to(DEVICE), x), pad, False, seeded(device=DEVICE)
    )
    torch.testing.assert_close(y2[~pad], y[~pad])


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_queries_with_no_admissible_key_output_zeros_with_finite_gradients(path):
    module = BigBirdAttention(DIM, H, D, block=2, window_blocks=0, global_blocks=0, random_blocks=0, path=path)
    x = torch.randn(1, 8, DIM, requires_grad=True)
    pad = torch.zeros(1, 8, dtype=torch.bool)
    pad[0, 2:4] = True  # block 1 is padding: with only the diagonal block, its queries see nothing
    y, _ = module(x, pad)
    torch.testing.assert_close(y[0, 2:4], module.out.bias.expand(2, -1))
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_the_generator_drives_every_draw_and_the_global_rng_otherwise():
    module = BigBirdAttention(
        DIM, H, D, dropout=0.3, block=2, window_blocks=1, global_blocks=1, random_blocks=2
    ).train()
    x = torch.randn(2, 40, DIM)
    state = torch.get_rng_state()
    a, b, c = (module(x, generator=seeded(s))[0] for s in (1, 1, 2))
    assert torch.equal(torch.get_rng_state(), state), "a forward with a generator drew from the global RNG"
    assert torch.equal(a, b) and not torch.allclose(a, c)
    assert not torch.equal(
        module.draw_pattern(40, False, seeded(1), "cpu")[0], module.draw_pattern(40, False, seeded(2), "cpu")[0]
    )
    torch.manual_seed(3)
    d = module(x)[0]
    assert not torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(3)
    assert torch.equal(module(x)[0], d)


def test_bad_arguments_are_clear_value_errors_bigbird():
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool tensor of shape \(2, 5\)"):
        BigBirdAttention(DIM, H, D)(torch.randn(2, 5, DIM), torch.zeros(2, 5, dtype=torch.int64))
    for budget, words in [
        (dict(block=0), "block must be >= 1"),
        (dict(window_blocks=-1), "window_blocks"),
        (dict(global_blocks=-1), "global_blocks"),
        (dict(random_blocks=-2), "random_blocks"),
        (dict(density=0.0), r"density must be in \(0, 1\]"),
        (dict(random_blocks=3, density=0.1), "random_blocks or density, not both"),
        (dict(path="sparse"), "path must be 'reference' or 'fast'"),
    ]:
        with pytest.raises(ValueError, match=words):
            BigBirdAttention(DIM, H, D, **budget)


def test_extra_repr_shows_the_budget_bigbird():
    text = BigBirdAttention(DIM, H, D).extra_repr()
    assert "block=64, window_blocks=1, global_blocks=2, random_blocks=3, density=None, path=fast" in text
