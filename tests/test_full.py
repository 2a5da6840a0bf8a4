"""baselines/full.py: the two paths agree (outputs and gradients, with padding, causal and ALiBi), fully
masked rows give zeros through the dummy key, density, the softmax scale; causality on the path
taken for a generator's dropout draw. The interface contract is tests/test_interface.py."""

import math

import pytest
import torch

from baselines.common import attention_density
from baselines.full import FullAttention
from conftest import DEVICE


def make_pair(alibi=False, dtype=torch.float64):
    torch.manual_seed(0)
    fast = FullAttention(24, 3, 8, alibi=alibi, path="fast").to(dtype)
    reference = FullAttention(24, 3, 8, alibi=alibi, path="reference").to(dtype)
    reference.load_state_dict(fast.state_dict())
    return fast.to(DEVICE), reference.to(DEVICE)


def padding(batch=3, n=9):
    mask = torch.zeros(batch, n, dtype=torch.bool)
    mask[1, 5:] = True  # right padding
    mask[2, :3] = True  # left padding: with causal, queries 0-2 of sample 2 have no admissible key
    return mask


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.on_device
@pytest.mark.parametrize("padded", [False, True])
def test_fast_and_reference_agree(alibi, causal, padded):
    fast, reference = make_pair(alibi)
    x = torch.randn(3, 9, 24, dtype=torch.float64).to(DEVICE).requires_grad_()
    mask = padding().to(DEVICE) if padded else None
    grad_out = torch.randn(3, 9, 24, dtype=torch.float64).to(DEVICE)
    outputs, grads = [], []
    for module in (fast, reference):
        y, stats = module(x, mask, causal)
        (y * grad_out).sum().backward()
        outputs.append(y.detach())
        grads.append([x.grad.clone()] + [p.grad.clone() for p in module.parameters()])
        x.grad = None
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-10, atol=1e-10)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.on_device
@pytest.mark.parametrize("path", ["fast", "reference"])
def test_fully_masked_rows_are_zero_with_finite_gradients(path):
    module = FullAttention(16, 2, 8, path=path).to(DEVICE)
    x = torch.randn(2, 6, 16).to(DEVICE).requires_grad_()
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0] = True  # every key of sample 0 is padding
    mask[1, :2] = True
    y, _ = module(x, mask.to(DEVICE), causal=True)
    core = module.out.bias  # an empty row's attention is zero, so its output is the out-projection bias
    torch.testing.assert_close(y[0], core.expand(6, -1))
    torch.testing.assert_close(y[1, :2], core.expand(2, -1))
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert x.grad[0].abs().max() == 0  # nothing flows through rows that attend to nothing


def test_density_counts_admissible_pairs():
    mask = padding()
    density = attention_density(mask, True, 3, 9, 2, "cpu")
    valid = (~mask).tolist()
    pairs = sum(valid[b][i] and valid[b][j] for b in range(3) for i in range(9) for j in range(i + 1))
    total = sum(sum(v) ** 2 for v in valid)
    assert density.shape == (2,)
    assert density[0].item() == pytest.approx(pairs / total)
    assert attention_density(None, False, 2, 9, 2, "cpu").tolist() == [1.0, 1.0]
    _, stats = FullAttention(16, 2, 8)(torch.randn(3, 9, 16), mask, causal=True)
    torch.testing.assert_close(stats["density"], density)


def test_softmax_scale_is_one_over_sqrt_head_dim():
    module = FullAttention(8, 1, 8, path="reference")
    with torch.no_grad():
        module.qkv.weight.zero_()
        module.qkv.bias.zero_()
        module.qkv.weight[:8].copy_(torch.eye(8))  # q = x
        module.qkv.weight[8:16].copy_(torch.eye(8))  # k = x
        module.qkv.weight[16:].copy_(torch.eye(8))  # v = x
        module.out.weight.copy_(torch.eye(8))
        module.out.bias.zero_()
    x = torch.randn(1, 4, 8)
    y, _ = module(x)
    expected = torch.softmax(x[0] @ x[0].T / math.sqrt(8), -1) @ x[0]
    torch.testing.assert_close(y[0], expected)


def test_causal_holds_when_a_generator_dropout_draw_takes_the_reference_path():
    """The fast path with causal, no padding and no ALiBi leaves causality to SDPA; a training forward
    with dropout and a generator runs the reference core instead, which must then get the causal mask."""
    module = FullAttention(16, 2, 8, dropout=0.1).train()
    x = torch.randn(1, 8, 16, requires_grad=True)
    y, _ = module(x, causal=True, generator=torch.Generator().manual_seed(1))
    (grad,) = torch.autograd.grad(y[:, :4].sum(), x)
    assert grad[:, 4:].abs().max() == 0 and grad[:, :4].abs().max() > 0


def float16_leaks(module, seed: int, scale: float = 1000.0):
    """Under float16 autocast (what a GPU without bf16 runs): the largest gradient from the outputs before t to the
    inputs from t on (causal), and from the valid outputs to the padded inputs."""
    g = torch.Generator().manual_seed(seed)
    pad = torch.zeros(2, 7, dtype=torch.bool, device=DEVICE)
    pad[:, 5:] = True
    leaks = []
    for causal, mask in ((True, None), (False, pad)):
        x = (scale * torch.randn(2, 7, 16, generator=g)).to(DEVICE).requires_grad_()
        with torch.autocast(DEVICE.type, dtype=torch.float16):
            y, _ = module(x, mask, causal)
        seen, hidden = ((slice(None), slice(0, 3)), (slice(None), slice(3, None))) if causal else (~pad, pad)
        (grad,) = torch.autograd.grad(y[seen].float().sum(), x)
        leaks.append(grad[hidden].abs().max().item())
    return leaks


@pytest.mark.on_device
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("path", ["fast", "reference"])
def test_float16_autocast_lets_no_masked_key_through(path, alibi):
    """Before: the fast path's additive mask (ALiBi) was finfo(float16).min = −65504, which a float16 score passes
    in size, so the future and padded keys got weight (gradients of 1e3 through them)."""
    torch.manual_seed(0)
    module = FullAttention(16, 2, 8, path=path, alibi=alibi).to(DEVICE)
    for seed in range(4):
        assert float16_leaks(module, seed) == [0.0, 0.0], seed
