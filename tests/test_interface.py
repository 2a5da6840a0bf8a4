"""The attention contract of INTERFACE.md, fuzzed over every attention in the method registry.

Every variant (a registry class with one of its execution paths) gets CASES_PER_VARIANT cases (SBM's tile path,
whose Triton kernels the CPU runs in triton's interpreter, a sixth of them) drawn from a seed fixed by (variant,
case index), so a failing case id reruns alone: batch 1-3, length in {1, 2, 3, 7, 64,
129}, several (dim, heads, head_dim), masks (none, random, all but one padded, one example fully padded, first
token padded), causal on/off, train/eval, dropout 0 / 0.1, float32 / float64 / bf16 autocast / float16 autocast
(what a GPU without bf16 runs; the CPU's autocast takes the same code path), with and without a generator, and
the variant's own budget drawn from small values. Each case checks:
- shapes, finite outputs and gradients (inputs and parameters; under float16 with inputs of size 100 a weight
  gradient may pass float16's range, as in float32 it would be above 65504), stats["density"] detached, (H,), in
  [0, 1],
  stats["aux_loss"] (if any) a finite scalar;
- softmax / exp / feature maps in float32 under autocast (every such op the forward dispatches is recorded);
- a query with no admissible key outputs zeros: its output is the output projection of zeros;
- padded-key invariance: new content at padded positions changes no valid position's output (same draw);
- causality: new content (and new padding) from position t on changes no output before t, and no gradient
  flows from an output before t to an input from t on;
- reproducibility: the same seed gives the same output bitwise; with a generator, the global RNG is untouched
  (every draw comes from the generator);
- a method without a causal form raises a ValueError naming it.
Documented exceptions (DOCUMENTED) are checks a variant does not promise; each names the docstring line that
documents it, and a test asserts the line is still there. Masks of another dtype or shape are a ValueError for
every variant (test_bad_masks_are_a_clear_value_error), and extra_repr() shows the budget it was built with
(test_extra_repr_shows_the_budget). The method files' own tests check what is particular to each method.
"""

import copy
import functools
import importlib
import os
import random
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Optional

import pytest
import torch

from bench import methods as registry
from bench.methods import available, get, same_in_every_layer
from conftest import DEVICE, LowPrecisionMath


def cases_per_variant() -> int:
    """SPARSE_ATTN_FUZZ_CASES: the first N cases of each variant's sequence, 30 unless set (.ci/run
    sets 250). A case's seed depends on its index only, so a case that fails in CI reruns here by
    its id."""
    text = os.environ.get("SPARSE_ATTN_FUZZ_CASES", "30")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"SPARSE_ATTN_FUZZ_CASES must be a positive integer, got {text!r}")
    return int(text)


CASES_PER_VARIANT = cases_per_variant()
LENGTHS = (1, 2, 3, 7, 64, 129)
LENGTH_WEIGHTS = (3, 3, 3, 4, 1, 1)  # long cases are the slow ones: fewer of them
SHAPES = ((8, 1, 8), (16, 2, 8), (12, 3, 4), (8, 2, 2), (6, 1, 3))  # (dim, heads, head_dim)
MASKS = ("none", "random", "all_but_one", "example_padded", "first_padded")
MASK_WEIGHTS = (2, 1, 1, 1, 1)  # no mask takes the fast paths (SDPA's own causal kernel, no padding branch)
PRECISIONS = ("float32", "float64", "bf16", "float16")
LOW_PRECISION = {"bf16": torch.bfloat16, "float16": torch.float16}  # the autocast dtypes


@functools.lru_cache(maxsize=None)
def cpu_autocast_runs(dtype: torch.dtype) -> bool:
    """Whether this torch's CPU autocast takes ``dtype`` (an unsupported one is switched off with a warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("cpu", dtype=dtype):
            return torch.nn.functional.linear(torch.ones(1, 1), torch.ones(1, 1)).dtype == dtype


MAX_LEN = max(LENGTHS)


@dataclass(frozen=True)
class Variant:
    method: str  # the registry name
    budget: Callable[[random.Random], dict]  # constructor options, drawn for a case

    @property
    def causal(self) -> bool:
        """The registry's word (bench/methods.py): False means causal=True must raise ValueError."""
        return registry.get(self.method).causal


VARIANTS = {
    "full-fast": Variant("full", lambda r: dict(path="fast", alibi=r.random() < 0.3)),
    "full-reference": Variant("full", lambda r: dict(path="reference", alibi=r.random() < 0.3)),
    "linear": Variant("linear", lambda r: dict(chunk=r.choice([1, 3, 64]))),
    "linformer": Variant("linformer", lambda r: dict(rank=r.choice([1, 4, 16]), max_len=MAX_LEN)),
    "performer": Variant(
        "performer",
        lambda r: dict(features=r.choice([4, 8, 16]), chunk=r.choice([1, 3, 64]), redraw_interval=r.choice([0, 1, 2])),
    ),
    "nystromformer": Variant(
        "nystromformer", lambda r: dict(landmarks=r.choice([1, 2, 4, 8]), conv_kernel=r.choice([0, 3]))
    ),
    "reformer": Variant("reformer", lambda r: dict(n_hashes=r.choice([1, 2, 3]), bucket_size=r.choice([1, 2, 4, 8]))),
    **{
        f"window-{path}": Variant(
            "window",
            lambda r, path=path: dict(
                path=path,
                **(
                    dict(window=r.choice([0, 1, 2, 5, 40]), density=None)
                    if r.random() < 0.7
                    else dict(window=None, density=r.choice([0.05, 0.3, 1.0]))
                ),
            ),
        )
        for path in ("reference", "fast")
    },
    **{
        f"bigbird-{path}": Variant(
            "bigbird",
            lambda r, path=path: dict(
                path=path,
                block=r.choice([1, 2, 4, 8]),
                window_blocks=r.choice([0, 1, 2]),
                global_blocks=r.choice([0, 1, 2]),
                **(
                    dict(random_blocks=r.choice([0, 1, 3]), density=None)
                    if r.random() < 0.7
                    else dict(random_blocks=None, density=r.choice([0.05, 0.3, 1.0]))
                ),
            ),
        )
        for path in ("reference", "fast")
    },
    **{
        f"moba-{path}": Variant(
            "moba", lambda r, path=path: dict(path=path, block=r.choice([1, 2, 4, 8]), topk=r.choice([0, 1, 2, 5]))
        )
        for path in ("reference", "fast")
    },
    **{
        f"hybrid-{adaptive}": Variant(
            "hybrid",
            lambda r, adaptive=adaptive, budget=budget: dict(
                adaptive=adaptive, adaptive_heads=1, density=r.choice([0.05, 0.3, 1.0]), budget=budget(r)
            ),
        )
        for adaptive, budget in (
            ("reformer", lambda r: f"n_hashes={r.choice([1, 2])};bucket_size={r.choice([1, 2, 4])}"),
            ("moba", lambda r: f"block={r.choice([1, 2, 4])};topk={r.choice([0, 1, 2])}"),
            ("sbm", lambda r: f"path=reference;clusters={r.choice([2, 4])};delta={r.choice([0.0, 0.01])}"),
        )
    },
    **{
        f"sbm-{path}": Variant(
            "sbm",
            lambda r, path=path: dict(
                path=path,
                clusters=r.choice([2, 4, 8]),
                delta=r.choice([0.0, 0.01, 0.5]),
                self_loops=r.random() < 0.3,
                ste=r.choice(["paper", "official"]),
                density_weight=r.choice([0.0, 0.1]),
                explore_in_eval=r.random() < 0.3,
                shared_mlp=r.random() < 0.3,
            ),
        )
        for path in ("fast", "reference", "tile")
    },
    "ssa": Variant(
        "ssa",
        lambda r: dict(
            windows=r.choice([1, 2, 4]),
            sigma=r.choice([0.0, 0.2, 1.0]),
            unbiased=r.choice([None, None, 0.5, 1.0]),
            path=r.choice(["fast", "reference"]),
            sampling=r.choice(["training", "training", "never", "always"]),
            alibi=r.random() < 0.5,
        ),
    ),
    **{
        f"kernel-{name}": Variant(
            "kernel",
            lambda r, sparse=sparse, path=path: dict(
                sparse=sparse,
                path=path,
                max_len=MAX_LEN,
                kernels=r.choice(["standard", "learned"]),
                hidden=8,
                window=r.choice([1, 3, 5]),
                select=r.choice(["threshold", "topk"]),
                threshold=r.choice([-1.0, 0.3, 0.5, 0.9]),
                top_k=r.choice([1, 3]),
                alibi=r.random() < 0.3,
            ),
        )
        for name, sparse, path in (("dense", False, "fast"), ("masked", True, "reference"), ("sparse", True, "fast"))
    },
}

# (variant, check) → (object, its docstring's words): a check the variant does not promise, and where it says so.
DOCUMENTED = {
    ("sbm-fast", "causal outputs"): (
        "sbm_transformer:sample_edges",
        "for a fixed generator the realised draw of one row still depends on the "
        "other tokens (one vectorised proposal per batch), so realisation-level invariance to future tokens holds on "
        "the dense path, and on the sparse path given the graph",
    ),
    ("hybrid-reformer", "causal outputs exactly"): (
        "baselines.reformer:ReformerAttention.attend_causal",
        "outputs before t agree to rounding, not bitwise, "
        "when tokens from t on change; gradients from the future are exactly zero.",
    ),
    ("reformer", "causal outputs exactly"): (
        "baselines.reformer:ReformerAttention.attend_causal",
        "outputs before t agree to rounding, not bitwise, "
        "when tokens from t on change; gradients from the future are exactly zero.",
    ),
    ("performer", "finite gradients of causal large inputs"): (
        "baselines.performer",
        "Limitation: where the keys' log-features spread over more than float32's exp range "
        "(about 87) across features, a query's denominator can underflow, and its gradient is then not finite",
    ),
}


def documented(variant: str, check: str) -> bool:
    return (variant, check) in DOCUMENTED


def docstring_of(where: str) -> str:
    module_name, _, attribute = where.partition(":")
    target = importlib.import_module(module_name)
    for name in filter(None, attribute.split(".")):
        target = getattr(target, name)
    return " ".join(target.__doc__.split())


@pytest.mark.parametrize("key", sorted(DOCUMENTED), ids="/".join)
def test_documented_exceptions_are_still_documented(key):
    where, words = DOCUMENTED[key]
    assert " ".join(words.split()) in docstring_of(where), f"{where} no longer documents: {words}"


def build(variant: str, dim: int, heads: int, head_dim: int, dropout: float, budget: dict):
    if budget.get("path") == "tile":
        pytest.importorskip("triton", reason="SBM's tile path needs triton (requirements-extra.txt)")
    return get(VARIANTS[variant].method).load()(dim, heads, head_dim, dropout, **budget)


# INTERFACE.md: extra_repr() shows the budget. The options each method's repr names as KEY=VALUE.
SHOWN_BUDGET = {
    "full": ("path", "alibi"),
    "linear": ("chunk",),
    "linformer": ("rank", "max_len"),
    "performer": ("features", "chunk", "redraw_interval"),
    "nystromformer": ("landmarks", "conv_kernel"),
    "reformer": ("n_hashes", "bucket_size"),
    "window": ("window", "density", "path"),
    "bigbird": ("block", "window_blocks", "global_blocks", "random_blocks", "density", "path"),
    "moba": ("block", "topk", "path"),
    "hybrid": ("adaptive", "adaptive_heads", "density", "budget"),
    "sbm": ("path", "clusters", "delta", "self_loops", "ste", "explore_in_eval", "shared_mlp"),
    "ssa": ("path", "sampling", "alibi"),
    "kernel": ("sparse", "path", "select", "alibi"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_extra_repr_shows_the_budget(variant):
    method = VARIANTS[variant].method
    cls = get(method).load()
    for index in range(5):
        budget = VARIANTS[variant].budget(random.Random(f"repr/{variant}/{index}"))
        text = cls(16, 2, 8, 0.0, **budget).extra_repr()
        missing = [f"{key}={budget[key]}" for key in SHOWN_BUDGET[method] if f"{key}={budget[key]}" not in text]
        assert not missing, f"{variant}: {text!r} lacks {missing}"


def test_every_registered_method_is_fuzzed():
    assert {v.method for v in VARIANTS.values()} == set(available()) == set(SHOWN_BUDGET)


# ----------------------------------------------------------------------------------------------- the cases
@dataclass
class Case:
    variant: str
    seed: int
    budget: dict
    batch: int
    n: int
    dim: int
    heads: int
    head_dim: int
    mask: str
    causal: bool
    train: bool
    dropout: float
    precision: str
    generator: bool
    scale: float  # of the inputs: 100 stresses exp ranges and denominators (Performer's features)

    @classmethod
    def draw(cls, variant: str, index: int) -> "Case":
        r = random.Random(f"contract/{variant}/{index}")
        dim, heads, head_dim = r.choice(SHAPES)
        causal = r.random() < (0.5 if VARIANTS[variant].causal else 0.15)  # a refusal needs few cases
        return cls(
            variant,
            r.randrange(2**31),
            VARIANTS[variant].budget(r),
            r.randint(1, 3),
            r.choices(LENGTHS, LENGTH_WEIGHTS)[0],
            dim,
            heads,
            head_dim,
            r.choices(MASKS, MASK_WEIGHTS)[0],
            causal,
            r.random() < 0.6,
            r.choice([0.0, 0.1, 0.1]),
            r.choice(PRECISIONS),
            r.random() < 0.5,
            r.choice([1.0, 1.0, 1.0, 1.0, 100.0]),
        )

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64 if self.precision == "float64" else torch.float32

    def autocast(self):
        low = LOW_PRECISION.get(self.precision)
        return torch.autocast(DEVICE.type, dtype=low) if low is not None else nullcontext()

    def padding(self, g: torch.Generator) -> Optional[torch.Tensor]:
        """(B, N) bool, True at padding, of the case's kind."""
        b, n = self.batch, self.n
        if self.mask == "none":
            return None
        pad = torch.zeros(b, n, dtype=torch.bool)
        if self.mask == "random":
            pad = torch.rand(b, n, generator=g) < 0.3
        elif self.mask == "all_but_one":
            pad[:] = True
            pad[torch.arange(b), torch.randint(n, (b,), generator=g)] = False
        elif self.mask == "example_padded":
            pad[torch.randint(b, (), generator=g)] = True
        else:
            pad[:, 0] = True
        return pad


FEWER = {"sbm-tile": max(1, CASES_PER_VARIANT // 6)}
CASES = [(variant, index) for variant in VARIANTS for index in range(FEWER.get(variant, CASES_PER_VARIANT))]


def run(module, x, pad, causal, case: Case, seed: int, record=None):
    """One forward on a copy of `module` (so module state, e.g. Performer's redraw counter, starts equal in every
    run): the draw from a fresh generator, or from the global RNG reseeded when the case has none."""
    module = copy.deepcopy(module)
    generator = torch.Generator(DEVICE).manual_seed(seed) if case.generator else None
    if generator is None:
        torch.manual_seed(seed)
    with case.autocast(), record or nullcontext():
        y, stats = module(x, pad, causal, generator)
    return module, y, stats


def close(a: torch.Tensor, b: torch.Tensor, precision: str, what: str):
    atol = {"float64": 1e-10, "float32": 1e-5, "bf16": 1e-2, "float16": 1e-2}[precision]
    torch.testing.assert_close(a.float(), b.float(), rtol=atol, atol=atol, msg=lambda m: f"{what}: {m}")


def same(a: torch.Tensor, b: torch.Tensor, precision: str, what: str):
    """Bitwise on the CPU; on CUDA to close()'s tolerance, since atomics' summation order (index_add, scatter,
    the backward of gathers) may differ from one run to the next."""
    if DEVICE.type == "cpu":
        assert torch.equal(a, b), what
    else:
        close(a, b, precision, what)


@pytest.mark.on_device
@pytest.mark.parametrize("variant, index", CASES, ids=[f"{v}-{i}" for v, i in CASES])
def test_contract(variant, index):
    """On DEVICE (tests/conftest.py): the case's draws come from the CPU generator as ever and move to DEVICE; the
    module's own draws come from a generator on DEVICE (or the global RNG)."""
    case = Case.draw(variant, index)
    if (
        DEVICE.type == "cpu"
        and case.precision in LOW_PRECISION
        and not cpu_autocast_runs(LOW_PRECISION[case.precision])
    ):
        pytest.skip(f"this torch's CPU autocast does not take {case.precision}")
    g = torch.Generator().manual_seed(case.seed)
    torch.manual_seed(case.seed)
    module = build(variant, case.dim, case.heads, case.head_dim, case.dropout, case.budget)
    module = module.to(case.dtype).train(case.train).to(DEVICE)
    x = (case.scale * torch.randn(case.batch, case.n, case.dim, generator=g, dtype=case.dtype)).to(DEVICE)
    pad = case.padding(g)
    pad = None if pad is None else pad.to(DEVICE)
    draw = int(torch.randint(2**31, (), generator=g))

    if case.causal and not VARIANTS[variant].causal:
        with pytest.raises(ValueError, match="causal"):
            run(module, x, pad, True, case, draw)
        return
    if case.budget.get("path") == "tile" and DEVICE.type == "cuda" and case.dtype == torch.float64:
        with pytest.raises(ValueError, match="float32 on CUDA"):  # sbm_tile.attend: triton does not compile it there
            run(module, x, pad, case.causal, case, draw)
        return

    # Shapes, finite outputs, float32 math under autocast, the statistics; the global RNG untouched.
    rng_state = torch.get_rng_state()
    device_rng_state = torch.cuda.get_rng_state(DEVICE) if DEVICE.type == "cuda" else None
    record = LowPrecisionMath() if case.precision in LOW_PRECISION else None
    xg = x.clone().requires_grad_()
    copy_, y, stats = run(module, xg, pad, case.causal, case, draw, record)
    if case.generator:
        assert torch.equal(torch.get_rng_state(), rng_state), "a forward with a generator drew from the global RNG"
        assert device_rng_state is None or torch.equal(torch.cuda.get_rng_state(DEVICE), device_rng_state), (
            "a forward with a generator drew from the device's global RNG"
        )
    assert y.shape == x.shape and y.device == DEVICE and torch.isfinite(y).all(), "output shape, device or non-finite"
    assert record is None or not record.seen, f"low-precision softmax/exp under autocast: {record.seen}"
    density = stats["density"]
    assert density.shape == (case.heads,) and density.is_floating_point() and not density.requires_grad
    assert ((density >= 0) & (density <= 1 + 1e-6)).all(), f"density {density} outside [0, 1]"
    aux = stats.get("aux_loss")
    assert aux is None or (aux.dim() == 0 and torch.isfinite(aux)), "aux_loss must be a finite scalar"

    # Finite gradients, inputs and parameters.
    upstream = torch.randn(y.shape, generator=g).to(DEVICE)
    loss = (y.float() * upstream).sum() + (0 if aux is None else aux.float())
    loss.backward()
    finite_gradients = not (
        case.causal
        and case.scale > 1
        and case.dtype == torch.float32
        and documented(variant, "finite gradients of causal large inputs")
    )
    if finite_gradients:
        assert torch.isfinite(xg.grad).all(), "non-finite input gradient"
        bad = [name for name, p in copy_.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        # float16's range: a projection's weight gradient sums B·N products of inputs of size 100 with their
        # gradients, which can pass 65504 (float32 gives up to 5e5 in such cases). A float16 trainer's GradScaler
        # skips that step and lowers its scale; the attention's own gradients (the inputs') must stay finite.
        assert not bad or (case.precision == "float16" and case.scale > 1), f"non-finite parameter gradients: {bad}"

    # A query with no admissible key outputs zeros: only the output projection of zeros remains.
    valid = torch.ones(case.batch, case.n, dtype=torch.bool, device=DEVICE) if pad is None else ~pad
    seen = valid.cumsum(1) > 0 if case.causal else valid.any(1, keepdim=True).expand_as(valid)  # (B, N)
    if (~seen).any():
        with case.autocast(), torch.no_grad():
            zero = copy_.out(torch.zeros(1, case.heads * case.head_dim, dtype=case.dtype, device=DEVICE))[0]
        same(y.detach()[~seen], zero.expand(int((~seen).sum()), -1), case.precision, "empty query is not zero")

    # Reproducibility: the same seed, the same output, bitwise.
    with torch.no_grad():
        _, again, _ = run(module, x, pad, case.causal, case, draw)
    same(again, y.detach(), case.precision, "not reproducible with the same seed")

    # Padded keys: new content there changes no valid position (the same draw).
    if pad is not None and pad.any() and valid.any():
        x2 = torch.where(
            pad[..., None], 10 * case.scale * torch.randn(x.shape, generator=g, dtype=case.dtype).to(DEVICE), x
        )
        with torch.no_grad():
            _, y2, _ = run(module, x2, pad, case.causal, case, draw)
        close(y2[valid], y.detach()[valid], case.precision, "padded content reached a valid position")

    if not case.causal or case.n < 2:
        return
    # Causality: change every token (content and padding) from t on; nothing before t moves.
    t = int(torch.randint(1, case.n, (), generator=g))
    x3 = x.clone()
    x3[:, t:] = (
        10 * case.scale * torch.randn(case.batch, case.n - t, case.dim, generator=g, dtype=case.dtype).to(DEVICE)
    )
    pad3 = None if pad is None else pad.clone()
    if pad3 is not None:
        pad3[:, t:] = (torch.rand(case.batch, case.n - t, generator=g) < 0.5).to(DEVICE)
    if not documented(variant, "causal outputs"):
        with torch.no_grad():
            _, y3, _ = run(module, x3, pad3, True, case, draw)
        if documented(variant, "causal outputs exactly"):
            close(y3[:, :t], y.detach()[:, :t], case.precision, f"an output before t={t} moved with later tokens")
        else:
            same(y3[:, :t], y.detach()[:, :t], case.precision, f"an output before t={t} moved with later tokens")
    if not finite_gradients:
        return
    xg = x.clone().requires_grad_()
    _, y4, _ = run(module, xg, pad, True, case, draw)
    (grad,) = torch.autograd.grad((y4[:, :t].float() * upstream[:, :t]).sum(), xg)
    assert (grad[:, t:] == 0).all(), f"gradient from outputs before t={t} reached later inputs"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dropout_draws_come_from_the_generator(variant):
    """The fuzz shows a seed reproduces its draw and leaves the global RNG alone; here a different seed must give
    a different draw, so the generator really drives the dropout."""
    torch.manual_seed(0)
    module = build(variant, 8, 2, 4, 0.5, VARIANTS[variant].budget(random.Random(0))).train()
    x = torch.randn(2, 7, 8)
    with torch.no_grad():
        a, b, c = (copy.deepcopy(module)(x, generator=torch.Generator().manual_seed(seed))[0] for seed in (1, 1, 2))
    assert torch.equal(a, b) and not torch.allclose(a, c)


# ------------------------------------------------------------------------------------------------ bad masks
BAD_MASKS = {
    **{
        str(dtype).removeprefix("torch."): lambda b, n, dtype=dtype: torch.zeros(b, n, dtype=dtype)
        for dtype in (
            torch.float32,
            torch.float64,
            torch.float16,
            torch.bfloat16,
            torch.int64,
            torch.int32,
            torch.int16,
            torch.int8,
            torch.uint8,
        )
    },
    "bool (B, N + 1)": lambda b, n: torch.zeros(b, n + 1, dtype=torch.bool),
    "bool (N,)": lambda b, n: torch.zeros(n, dtype=torch.bool),
}


@pytest.mark.parametrize("mask", list(BAD_MASKS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bad_masks_are_a_clear_value_error(variant, mask):
    """INTERFACE.md: key_padding_mask is (B, N) bool; anything else is a ValueError that names the expectation."""
    torch.manual_seed(0)
    module = build(variant, 8, 2, 4, 0.0, VARIANTS[variant].budget(random.Random(0)))
    with pytest.raises(ValueError, match=r"key_padding_mask must be a bool tensor of shape \(2, 5\)"):
        module(torch.randn(2, 5, 8), BAD_MASKS[mask](2, 5))


def test_a_baseline_s_budget_reaches_each_layer_s_constructor_with_the_model_s_max_len():
    """bench.methods.same_in_every_layer: the interface's arguments, the budget by name, and the model's max_len
    where the constructor takes one."""

    class Budgeted(torch.nn.Module):
        def __init__(self, dim, heads, head_dim, dropout=0.0, budget=1, max_len=0):
            super().__init__()
            self.seen = (dim, heads, head_dim, dropout, budget, max_len)

    model_cfg = SimpleNamespace(dim=8, heads=2, head_dim=4, attn_dropout=0.1, max_len=16)
    assert same_in_every_layer(Budgeted, model_cfg, {"budget": 5})(0).seen == (8, 2, 4, 0.1, 5, 16)
    assert same_in_every_layer(Budgeted, model_cfg, {"max_len": 7})(0).seen == (8, 2, 4, 0.1, 1, 7)
