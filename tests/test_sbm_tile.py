"""Tests for sbm_tile.py, SBM-Transformer's tile path, against its oracle: the reference path given the kernel's
mask. On the CPU the kernels run under TRITON_INTERPRET=1 (conftest.py sets it before triton is imported); on_device tests
run them compiled on SPARSE_ATTN_TEST_DEVICE=cuda.

- the kernel's mask is its torch twin's, sbm_tile.sample_mask (read out exactly: zero scores, one-hot values), and
  the twin's hash is Philox4x32-10 (Random123's known answers);
- the twin's law: each pair is an edge with probability min(1, P + δ), Monte Carlo over 4,000 seeds at 5σ (a
  two-sided normal tail of 5.7e-7 per pair, as tests/test_fastrg.py);
- outputs, density and every gradient (input and parameters) equal the reference path's given that mask (float32,
  1e-5): padded and causal cases, self-loops, both estimators; dropout against the same expression with the twin's
  dropout draws;
- memory linear in N: no op makes an N × N tensor; on CUDA no host synchronisation (torch's sync debug mode);
- the kernels compiled for sm_90 (H100/H200) fit a block's shared memory, checked on any machine;
- bad input: no triton, a CPU tensor without the interpreter, a non-finite membership, another dtype, a given mask
  off the reference path, a second derivative: one clear error each.
"""

import copy
import os
import subprocess
import sys

import pytest
import torch
from conftest import DEVICE, ROOT
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

pytest.importorskip("triton", reason="the tile path needs triton (requirements-extra.txt)")

import sbm_tile
from sbm_transformer import SBMAttention

Z = 5.0
SEEDS = 4_000


def factors(b: int, h: int, n: int, k: int, seed: int, spread: float = 1.0) -> tuple:
    """Memberships x (B, H, N, K) and w = K̂Ŝᵀ (B, H, N, K) whose products P = x wᵀ spread over [0, spread]."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.rand(b, h, n, k, generator=g), torch.rand(b, h, n, k, generator=g)
    return x.to(DEVICE), (w * spread / k).to(DEVICE)


def padding(b: int, n: int, seed: int) -> torch.Tensor:
    """valid (B, N) bool: random padding; with B > 1, one example padded but for its first token."""
    g = torch.Generator().manual_seed(seed)
    valid = torch.rand(b, n, generator=g) > 0.25
    if b > 1:
        valid[0, 1:] = False
    return valid.to(DEVICE)


# ----------------------------------------------------------------------------------------------------- the law
@pytest.mark.on_device
@pytest.mark.parametrize("b, h, causal, self_loops, p_drop", [(2, 1, False, False, 0.0), (1, 2, True, True, 0.3)])
def test_the_kernel_draws_its_twin_s_mask(b, h, causal, self_loops, p_drop):
    """Zero scores make α uniform over a query's edges, and one-hot values (D = N) read α out: y_ij > 0 exactly on
    the edges the kernel drew and dropout kept. Two tiles of queries and keys (N = 80 > BLOCK)."""
    n = 80
    x, w = factors(b, h, n, 4, seed=1, spread=1.2)
    valid = padding(b, n, seed=2)
    q, k = torch.zeros(b, h, n, n, device=DEVICE), torch.zeros(b, h, n, n, device=DEVICE)
    v = torch.eye(n, device=DEVICE).expand(b, h, n, n).contiguous()
    graph = {"x": x, "w": w, "causal": causal, "delta": 0.05, "self_loops": self_loops}
    g = torch.Generator(DEVICE)
    y, counts = sbm_tile.attend(q, k, v, graph, valid, p_drop, "paper", g.manual_seed(3))
    seed = sbm_tile.draw_seed(g.manual_seed(3), DEVICE)
    mask = sbm_tile.sample_mask(seed, x, w, valid, causal, 0.05, self_loops)
    keep = sbm_tile.uniforms(seed, b, h, n, n)[1][0] >= p_drop
    assert torch.equal(y > 0, mask & keep)
    assert torch.equal(counts, mask.sum((2, 3)).float())
    assert 0.02 < mask.float().mean() < 0.5 and (y > 0).any(-1).logical_not().any()  # a mixed graph, empty rows
    assert not mask[:, :, ~valid[0]].any() if b == 1 else not mask[0, :, 1:].any()  # padding, in every head


def test_the_twin_s_pairs_are_edges_with_their_probabilities():
    """Each pair of SEEDS independent draws is an edge with probability min(1, P + δ) (Eq. 8), P from 0 to 1.3 (some
    pairs sure); the counters give every pair and graph its own draw."""
    b, h, n, delta = 1, 2, 12, 0.01
    x = torch.linspace(0, 1, n, dtype=torch.float64).view(1, 1, n, 1).expand(b, h, n, 1)
    w = torch.linspace(0, 1.3, n, dtype=torch.float64).view(1, 1, n, 1).expand(b, h, n, 1)
    prob = x @ w.transpose(-1, -2) + delta  # (B, H, N, N)
    u = sbm_tile.uniforms(torch.arange(SEEDS) * 7919 + 11, b, h, n, n)[0]  # (SEEDS, B, H, N, N)
    frequency = (u < prob).double().mean(0)
    prob = prob.clamp(max=1)
    sd = (prob * (1 - prob) / SEEDS).sqrt()
    assert float(((frequency - prob).abs() - Z * sd).max()) <= 0  # sure pairs: exactly 1
    assert (prob == 1).sum() > 10 and (prob < 0.05).sum() > 10


def test_the_twin_is_philox4x32_10():
    """Random123's known answers (kat_vectors): counter and key all zeros, and all ones."""
    zero, ones = torch.tensor(0), torch.tensor(0xFFFFFFFF)
    assert [int(t) for t in sbm_tile.philox(zero, zero, zero, zero, zero)] == [
        0x6627E8D5,
        0xE169C58D,
        0xBC57AC4C,
        0x9B00DBD8,
    ]
    words = sbm_tile.philox(ones | (ones << 32), ones, ones, ones, ones)
    assert [int(t) for t in words] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


# ---------------------------------------------------------------------------------------- against the reference
def pair(**budget) -> tuple:
    """(tile, reference): one SBMAttention with the same parameters on both paths."""
    torch.manual_seed(0)
    tile = SBMAttention(16, 2, 8, clusters=4, path="tile", **budget).to(DEVICE)
    reference = copy.deepcopy(tile)
    reference.path = "reference"
    return tile, reference


def kernel_mask(module, x, pad, causal: bool, seed: int):
    """The mask module's tile path draws on x with a generator seeded `seed`, from its twin."""
    b, n, _ = x.shape
    valid = torch.ones(b, n, dtype=torch.bool, device=DEVICE) if pad is None else ~pad
    with torch.no_grad():
        q, k, _ = module.qkv(x).view(b, n, 3, module.heads, module.head_dim).permute(2, 0, 3, 1, 4)
        memberships, _, _, w = module.factors(q, k)
        drawn = sbm_tile.draw_seed(torch.Generator(DEVICE).manual_seed(seed), DEVICE)
        return sbm_tile.sample_mask(drawn, memberships, w, valid, causal, module.exploration(), module.self_loops)


CASES = {  # (batch, length, padded, causal, budget)
    "padded": (1, 100, True, False, {"delta": 0.05, "ste": "paper", "density_weight": 0.1}),
    "causal-official-loops": (
        2,
        70,
        True,
        True,
        {"delta": 0.01, "ste": "official", "self_loops": True, "density_weight": 0.1},
    ),
    "causal-paper-short": (3, 7, False, True, {"delta": 0.5, "ste": "paper", "explore_in_eval": True}),
}


@pytest.mark.on_device
@pytest.mark.parametrize("case", list(CASES))
def test_the_tile_path_is_the_reference_path_given_the_kernel_s_mask(case):
    b, n, padded, causal, budget = CASES[case]
    tile, reference = pair(**budget)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(b, n, 16, generator=g).to(DEVICE)
    pad = (torch.rand(b, n, generator=g) < 0.3).to(DEVICE) if padded else None
    upstream = torch.randn(b, n, 16, generator=g).to(DEVICE)
    results = []
    for module, mask in ((tile, None), (reference, kernel_mask(tile, x, pad, causal, seed=6))):
        xg = x.clone().requires_grad_()
        extra = {} if mask is None else {"mask": mask}
        y, stats = module(xg, pad, causal, torch.Generator(DEVICE).manual_seed(6), **extra)
        loss = (y * upstream).sum() + stats.get("aux_loss", 0)
        grads = torch.autograd.grad(loss, [xg, *module.parameters()])
        results.append((y, stats["density"], *grads))
    names = ["output", "density", "input", *(name for name, _ in tile.named_parameters())]
    for name, got, want in zip(names, *results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.on_device
def test_dropout_and_the_count_s_gradient_are_the_twin_s_expression():
    """Dropout on the normalised weights, as the reference path, with the twin's second uniform; the gradients of
    q, k, v, x and w from y and from the edge counts (the density regulariser's path)."""
    b, h, n, d, p_drop = 2, 2, 70, 8, 0.3
    x, w = factors(b, h, n, 4, seed=7, spread=0.4)
    valid = padding(b, n, seed=8)
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    x, w = x.requires_grad_(), w.requires_grad_()
    graph = {"x": x, "w": w, "causal": True, "delta": 0.02, "self_loops": False}
    y, counts = sbm_tile.attend(q, k, v, graph, valid, p_drop, "official", torch.Generator(DEVICE).manual_seed(3))
    seed = sbm_tile.draw_seed(torch.Generator(DEVICE).manual_seed(3), DEVICE)
    mask = sbm_tile.sample_mask(seed, x.detach(), w.detach(), valid, True, 0.02, False)
    keep = sbm_tile.uniforms(seed, b, h, n, n)[1][0] >= p_drop
    prob = x @ w.transpose(-1, -2)
    scores = (q * d**-0.5) @ k.transpose(-1, -2)
    alpha = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(-1) * mask.any(-1, keepdim=True)
    want_y = (alpha * keep / (1 - p_drop)) @ v
    want_counts = mask.sum((2, 3)).float() + (prob * mask).sum((2, 3)) - (prob * mask).sum((2, 3)).detach()
    upstream, count_weight = torch.randn_like(y), torch.randn(b, h, device=DEVICE)
    got = torch.autograd.grad((y * upstream).sum() + (counts * count_weight).sum(), [q, k, v, x, w])
    grad_scores = torch.autograd.grad((want_y * upstream).sum(), scores, retain_graph=True)[0]
    want = torch.autograd.grad((want_y * upstream).sum() + (want_counts * count_weight).sum(), [q, k, v, x, w])
    ste = grad_scores.clamp(-1, 1)  # (B, H, N, N) the official estimator ∂L/∂P := hardtanh(∂L/∂S), 0 off the edges
    want = (*want[:3], want[3] + ste @ w.detach(), want[4] + ste.transpose(-1, -2) @ x.detach())
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    for name, a, e in zip("qkvxw", got, want):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"d{name}: {m}")


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an op makes while the mode is on."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.largest = max([self.largest, *sizes])
        return out


@pytest.mark.on_device
def test_no_tensor_grows_with_n_squared_and_nothing_synchronises():
    """Memory linear in N: at N = 128, D = K = 4 no op of the forward or backward makes a tensor of N² elements (the
    kernels hold their tiles in registers). On CUDA, torch's sync debug mode turns a host synchronisation into an
    error."""
    n = 128
    x, w = factors(1, 1, n, 4, seed=0, spread=0.5)
    q, k, v = (torch.randn(1, 1, n, 4, device=DEVICE, requires_grad=True) for _ in range(3))
    x, w = x.requires_grad_(), w.requires_grad_()
    graph = {"x": x, "w": w, "causal": True, "delta": 0.01, "self_loops": True}
    valid = torch.ones(1, n, dtype=torch.bool, device=DEVICE)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
        torch.cuda.set_sync_debug_mode("error")
    try:
        with LargestTensor() as sizes:
            y, counts = sbm_tile.attend(q, k, v, graph, valid, 0.1, "paper", torch.Generator(DEVICE).manual_seed(0))
            (y.sum() + counts.sum()).backward()
    finally:
        if DEVICE.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    assert 0 < sizes.largest < n * n


# ------------------------------------------------------------------------------------------------------ bad input
def test_without_triton_the_tile_path_says_what_it_needs(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    monkeypatch.delitem(sys.modules, "sbm_tile")
    module = SBMAttention(8, 2, 4, clusters=2, path="tile")
    with pytest.raises(ImportError, match="path='tile' needs triton"):
        module(torch.randn(1, 5, 8))


def test_a_cpu_tensor_needs_the_interpreter(monkeypatch):
    monkeypatch.setattr(sbm_tile, "INTERPRETED", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        SBMAttention(8, 2, 4, clusters=2, path="tile")(torch.randn(1, 5, 8))


def test_a_non_finite_membership_is_refused():
    x, w = factors(1, 1, 5, 2, seed=0)
    x[0, 0, 3, 1] = float("nan")
    q = torch.randn(1, 1, 5, 4)
    graph = {"x": x.cpu(), "w": w.cpu(), "causal": False, "delta": 0.0, "self_loops": False}
    with pytest.raises(RuntimeError, match="memberships must be finite"):
        sbm_tile.attend(q, q, q, graph, torch.ones(1, 5, dtype=torch.bool), 0.0, "paper", None)


def test_another_dtype_is_refused():
    x, w = factors(1, 1, 5, 2, seed=0)
    q = torch.randn(1, 1, 5, 4, dtype=torch.float16)
    graph = {"x": x.cpu().half(), "w": w.cpu().half(), "causal": False, "delta": 0.0, "self_loops": False}
    with pytest.raises(ValueError, match="float32 or float64"):
        sbm_tile.attend(q, q, q, graph, torch.ones(1, 5, dtype=torch.bool), 0.0, "paper", None)


@pytest.mark.parametrize(
    "path, shape, dtype",
    [("tile", (1, 2, 5, 5), torch.bool), ("fast", (1, 2, 5, 5), torch.bool), ("reference", (1, 5, 5), torch.bool)]
    + [("reference", (1, 2, 5, 5), torch.float32)],
)
def test_a_given_mask_is_the_reference_path_s_bool_m(path, shape, dtype):
    with pytest.raises(ValueError, match=r"a given mask is the reference path's bool M of shape \(1, 2, 5, 5\)"):
        SBMAttention(8, 2, 4, clusters=2, path=path)(torch.randn(1, 5, 8), mask=torch.ones(shape, dtype=dtype))


def test_a_second_derivative_is_refused():
    x = torch.randn(1, 5, 8, requires_grad=True)
    y, _ = SBMAttention(8, 2, 4, clusters=2, path="tile")(x)
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(y.square().sum(), x, create_graph=True)


SHARED_MEMORY = 232_448  # bytes a block may hold on an H100/H200
COMPILE = """
import sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import sbm_tile
width, p = int(sys.argv[1]), "*fp32"
inputs, scalars = (p,) * 5 + ("*u8", "*i64"), ("i32",) * 3 + ("fp32",) * 3
kernels = {"_forward": {"outputs": (p, p, "*i32")}, "_backward_queries": {"grads": (p,) * 4, "outputs": (p, p)},
           "_backward_keys": {"grads": (p,) * 4, "outputs": (p,) * 3}}
for name, args in kernels.items():
    const = dict(BD=width, BK=width, CAUSAL=True, SELF_LOOPS=True, **({} if name == "_forward" else {"PAPER": True}))
    signature = {"inputs": inputs, **args, "scalars": scalars, **dict.fromkeys(const, "constexpr")}
    source = ASTSource(getattr(sbm_tile, name), signature, const)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_stages": sbm_tile.STAGES})
    print(name, kernel.metadata.shared)
"""


def test_the_kernels_compiled_for_an_h200_fit_a_block_s_shared_memory(tmp_path):
    """Compiled for sm_90 by the installed triton, which needs no GPU for it (its ptxas ships with it), at head dim and
    clusters 128: each kernel within a block's shared memory. Tiles of 64 with triton's default 3 stages asked 263,296
    bytes at head dim 64 and 128 clusters on an H200, and the kernels did not run there; at 128, 240 KiB with one."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted,
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # and compiled now, not read from an earlier compilation
    result = subprocess.run(
        [sys.executable, "-c", COMPILE, "128"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shared = {name: int(size) for name, size in map(str.split, result.stdout.splitlines())}
    assert len(shared) == 3 and max(shared.values()) <= SHARED_MEMORY, shared
