"""baselines/window.py: the fast (chunked band) and reference (dense mask) paths agree in outputs and gradients,
the density against a brute-force count of the mask, the density helpers and the target-density budget,
causality, padded keys, empty windows, dropout from the generator, bad arguments. The interface contract is
tests/test_interface.py."""
import pytest
import torch

from baselines.window import WindowAttention, window_density, window_for_density

DIM, H, D = 12, 3, 4


def make_pair(**budget):
    torch.manual_seed(0)
    fast = WindowAttention(DIM, H, D, path="fast", **budget).double()
    reference = WindowAttention(DIM, H, D, path="reference", **budget).double()
    reference.load_state_dict(fast.state_dict())
    return fast, reference


def padding(batch: int, n: int) -> torch.Tensor:
    pad = torch.rand(batch, n, generator=torch.Generator().manual_seed(n)) < 0.3
    pad[0, : n // 2] = True  # leading padding: with causal and a narrow window, early queries see no key
    return pad


def band_mask(n: int, w: int, causal: bool) -> torch.Tensor:
    """(N, M) bool written out pair by pair."""
    return torch.tensor([[(0 <= i - j <= w) if causal else abs(i - j) <= w for j in range(n)] for i in range(n)])


# N = 1, N < w, N < the chunk (64), spans covering N (the dense form); chunked: N not a multiple of the chunk,
# several chunks, w = 0, a span wider than a chunk.
@pytest.mark.parametrize("n, w", [(1, 0), (1, 3), (5, 2), (5, 9), (37, 0), (130, 40), (100, 7), (129, 3), (150, 0),
                                  (200, 40), (256, 70)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_fast_and_reference_agree(n, w, causal, padded):
    fast, reference = make_pair(window=w)
    x = torch.randn(2, n, DIM, dtype=torch.float64, requires_grad=True)
    pad = padding(2, n) if padded else None
    grad_out = torch.randn(2, n, DIM, dtype=torch.float64)
    results = []
    for module in (fast, reference):
        y, stats = module(x, pad, causal)
        (y * grad_out).sum().backward()
        results.append([y.detach(), stats["density"], x.grad.clone()] + [p.grad.clone() for p in module.parameters()])
        x.grad = None
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


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
            assert window_density(n, w, causal) == pytest.approx(band_mask(n, w, causal).sum().item() / n ** 2)
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


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_causal_outputs_ignore_later_tokens_and_padding(path):
    module = WindowAttention(DIM, H, D, window=5, path=path)
    n, t = 100, 80  # t inside the second chunk (64-127): its chunk also scores later keys, which must be masked
    x = torch.randn(2, n, DIM, requires_grad=True)
    pad = padding(2, n)
    y, _ = module(x, pad, causal=True)
    x2, pad2 = x.detach().clone(), pad.clone()
    x2[:, t:] = 1e3 * torch.randn(2, n - t, DIM)
    pad2[:, t:] = ~pad2[:, t:]
    y2, _ = module(x2, pad2, causal=True)
    assert torch.equal(y2[:, :t], y[:, :t].detach())
    (grad,) = torch.autograd.grad(y[:, :t].sum(), x)
    assert grad[:, t:].abs().max() == 0


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_padded_keys_receive_no_weight(path):
    module = WindowAttention(DIM, H, D, window=4, path=path)
    x, pad = torch.randn(2, 150, DIM), padding(2, 150)
    y, _ = module(x, pad)
    y2, _ = module(torch.where(pad[..., None], 1e3 * torch.randn_like(x), x), pad)
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


def test_bad_arguments_are_clear_value_errors():
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool tensor of shape \(2, 5\)"):
        WindowAttention(DIM, H, D)(torch.randn(2, 5, DIM), torch.zeros(2, 5))
    for budget, words in [(dict(window=-1), "window .* must be >= 0"),
                          (dict(density=0.0), r"density must be in \(0, 1\]"),
                          (dict(density=1.5), r"density must be in \(0, 1\]"),
                          (dict(window=3, density=0.1), "window or density, not both"),
                          (dict(path="dense"), "path must be 'reference' or 'fast'")]:
        with pytest.raises(ValueError, match=words):
            WindowAttention(DIM, H, D, **budget)


def test_extra_repr_shows_the_budget():
    assert "window=64, density=None, path=fast" in WindowAttention(DIM, H, D).extra_repr()
    assert "window=3, density=None, path=reference" in WindowAttention(DIM, H, D, window=3,
                                                                       path="reference").extra_repr()
