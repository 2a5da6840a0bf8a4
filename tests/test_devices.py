"""What only a GPU would otherwise show, checked on any device (DEVICE, tests/conftest.py): for every variant of the
method registry (test_interface.VARIANTS), a training forward + backward with a generator on DEVICE

- leaves the output, every stats tensor and every gradient on DEVICE;
- creates no tensor on the default device where it meant DEVICE: the forward runs with torch's default device set
  to "meta", so a factory call without device= (torch.arange(n), torch.rand(..., generator=g), torch.tensor(...))
  asks for a meta tensor; a dispatch mode records the call (file:function) and makes it on DEVICE, so the run goes
  on. On the CPU this is the only way to see a missing device= (everything there is on the CPU). Calls that are right
  on every device are in FACTORIES_WITHOUT_DEVICE, each with its reason;
- makes only the host syncs in HOST_SYNCS: every aten._local_scalar_dense (what .item(), int(t), float(t), bool(t)
  call) on a DEVICE tensor is recorded by file:function. Syncs inside an op (nonzero, boolean-mask indexing,
  repeat_interleave without output_size) do not pass through that op and are not seen here.
"""

import random
import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import DEVICE, ROOT
from test_interface import VARIANTS, build

META = torch.device("meta")

# file:function of a factory call without device= that is right on every device → why.
FACTORIES_WITHOUT_DEVICE = {
    "bigbird.py:bigbird_density": "the expected density at length n, a Python float computed on the host (cached)",
    "sbm_transformer.py:_csr": "torch.sparse_csr_tensor takes its device from its index and value tensors",
    "kernel_sparse.py:csr": "torch.sparse_csr_tensor takes its device from its index and value tensors",
    "fastrg.py:_uniforms": "the CPU branch only: one seed for numpy's stream, drawn from the CPU generator",
}

# variant → {file:function of a host sync: why it is there}. A variant not named makes none.
HOST_SYNCS = {
    "performer": {
        "performer.py:forward": "the feature-redraw schedule reads the forward counter (a buffer, so it is "
        "saved with the model) once per training forward"
    },
    "bigbird-fast": {
        "bigbird.py:fast_core": "a data-dependent size: topk's k, the most blocks any query block holds",
        "bigbird.py:bigbird_density": "a host (CPU) tensor: the expected density as a Python float",
    },
    "nystromformer": {
        "nystromformer.py:attend": "a shortcut: without padding and with full segments, plain "
        "segment means (no masking passes)"
    },
    "reformer": {"reformer.py:attend": "a shortcut: the general path only where a key is padded (or N needs it)"},
    "hybrid-reformer": {"reformer.py:attend": "its Reformer head's shortcut (above)"},
    "kernel-sparse": {
        "kernel_sparse.py:union_edges": "a data-dependent size (the distinct selections) and two "
        "shortcuts: no padding, no global kernel"
    },
    "sbm-fast": {  # off the CPU one read a layer instead, a copy (fastrg.py:_counts; counted by Counter below)
        "fastrg.py:_search": "the CPU branch only: the widest guide interval sizes the bisection",
        "fastrg.py:_uniforms": "the CPU branch only: the seed of numpy's stream",
        "sbm_transformer.py:sample_edges": "the CPU branch only: a shortcut, without padding no pass over the "
        "edge weights",
    },
}
FACTORY_NAMES = {
    "arange",
    "randperm",
    "rand",
    "randint",
    "randn",
    "empty",
    "zeros",
    "ones",
    "full",
    "scalar_tensor",
    "linspace",
    "eye",
    "tensor",
}


def where() -> str:
    """file:function of the innermost function in a method file (not the tests; a generator expression's is its
    caller's)."""
    tests = ROOT / "tests"
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename)
        if path.is_relative_to(ROOT) and not path.is_relative_to(tests) and not frame.name.startswith("<"):
            return f"{path.name}:{frame.name}"
    return "torch (no method frame)"


class Recorder(TorchDispatchMode):
    """Factory calls that asked for the default (meta) device, made on DEVICE instead; host syncs on DEVICE."""

    def __init__(self):
        super().__init__()
        self.factories, self.syncs = {}, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("device") == META:
            self.factories.setdefault(where(), func.__name__)
            kwargs["device"] = DEVICE
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device == DEVICE:
            self.syncs.setdefault(where(), func.__name__)
        return func(*args, **kwargs)


def cases(variant: str):
    """(budget, causal, padding) for a few budgets of the fuzz, with and without causality and padding; one budget
    for SBM's tile path, whose kernels take ~10× a case's time in triton's interpreter on a CPU."""
    for index in range(1 if variant == "sbm-tile" and DEVICE.type == "cpu" else 3):
        budget = VARIANTS[variant].budget(random.Random(f"devices/{variant}/{index}"))
        for causal in (False, True) if VARIANTS[variant].causal else (False,):
            for padded in (False, True):
                yield budget, causal, padded


def train_step(variant: str, budget: dict, causal: bool, padded: bool, record=None):
    torch.manual_seed(0)
    module = build(variant, 16, 2, 8, 0.1, budget).train().to(DEVICE)
    x = torch.randn(2, 33, 16).to(DEVICE).requires_grad_()
    pad = None
    if padded:
        pad = torch.zeros(2, 33, dtype=torch.bool)
        pad[1, 20:] = True
        pad = pad.to(DEVICE)
    generator = torch.Generator(DEVICE).manual_seed(1)
    if record is None:
        y, stats = module(x, pad, causal, generator)
    else:
        torch.set_default_device(META)
        try:
            with record:
                y, stats = module(x, pad, causal, generator)
                aux = stats.get("aux_loss")
                (y.sum() + (0 if aux is None else aux)).backward()
        finally:
            torch.set_default_device(None)
        return module, x, y, stats
    aux = stats.get("aux_loss")
    (y.sum() + (0 if aux is None else aux)).backward()
    return module, x, y, stats


@pytest.mark.on_device
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_outputs_stats_and_gradients_stay_on_the_device(variant):
    for budget, causal, padded in cases(variant):
        module, x, y, stats = train_step(variant, budget, causal, padded)
        where_ = f"{variant} {budget} causal={causal} padded={padded}"
        assert y.device == DEVICE and x.grad.device == DEVICE, where_
        off = [key for key, value in stats.items() if isinstance(value, torch.Tensor) and value.device != DEVICE]
        assert not off, f"{where_}: stats {off} not on {DEVICE}"
        off = [name for name, p in module.named_parameters() if p.grad is not None and p.grad.device != DEVICE]
        assert not off, f"{where_}: gradients of {off} not on {DEVICE}"
        off = [name for name, b in module.named_buffers() if b.device != DEVICE]
        assert not off, f"{where_}: buffers {off} not on {DEVICE}"


@pytest.mark.on_device
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_no_factory_call_falls_to_the_default_device_and_only_documented_host_syncs(variant):
    factories, syncs = {}, {}
    for budget, causal, padded in cases(variant):
        record = Recorder()
        train_step(variant, budget, causal, padded, record)
        factories.update(record.factories)
        syncs.update(record.syncs)
    stray = {at: op for at, op in factories.items() if at not in FACTORIES_WITHOUT_DEVICE}
    assert not stray, f"{variant}: tensors made without device= (on the default device, not the inputs'): {stray}"
    allowed = HOST_SYNCS.get(variant, {})
    unexpected = sorted(set(syncs) - set(allowed))
    assert not unexpected, f"{variant}: host syncs (.item(), int(t), bool(t)) not in HOST_SYNCS: {unexpected}"
    if DEVICE.type == "cpu":  # on CUDA the CPU-only branches (numpy's stream, host tensors) are not taken
        assert not allowed or syncs, f"{variant}: HOST_SYNCS names syncs this variant no longer makes"


def test_the_recorder_sees_a_missing_device_and_a_host_sync():
    """The checks above can fail: a factory call without device= and an .item() are both seen, by file:function."""
    record = Recorder()
    torch.set_default_device(META)
    try:
        with record:
            x = torch.ones(3, device=DEVICE)
            x = x + torch.arange(3)  # no device=: meta, recorded, made on DEVICE
            x.sum().item()
    finally:
        torch.set_default_device(None)
    assert x.device == DEVICE
    assert list(record.factories.values()) == ["arange.default"]
    assert list(record.syncs.values()) == ["_local_scalar_dense.default"]


class Counter(TorchDispatchMode):
    """Dispatched ops (on a GPU a kernel launch each, views aside) and host syncs: .item(), the ops that size their
    output by the data (nonzero, masked_select, boolean indexing, unique, repeat_interleave without output_size,
    bincount, which a GPU sizes by its maximum) and copies to the host (.cpu(), fastrg's reads), but not the seed of
    fastrg's numpy stream (_uniforms: a CPU branch)."""

    SIZED = {"nonzero", "masked_select", "unique_consecutive", "_unique2", "unique_dim", "bincount"}

    def __init__(self):
        super().__init__()
        self.ops = self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs, name = kwargs or {}, func.__name__.split(".")[0]
        self.ops += 1
        self.syncs += (
            name in self.SIZED
            or (name == "_local_scalar_dense" and where() != "fastrg.py:_uniforms")
            or (name == "repeat_interleave" and kwargs.get("output_size") is None)
            or (name == "index" and any(i is not None and i.dtype == torch.bool for i in args[1]))
            or (name == "_to_copy" and kwargs.get("device") == torch.device("cpu"))
        )
        return func(*args, **kwargs)


def sbm_step(n: int, batch: int = 2, density=None):
    """A training forward + backward of one SBM layer (fast path) under the Counter: (counter, [y, gradients])."""
    import sbm_transformer as sbm

    torch.manual_seed(0)
    attn, x = sbm.SBMAttention(64, 4, 16, path="fast"), torch.randn(batch, n, 64, requires_grad=True)
    if density:
        sbm.at_density(attn, x, density)
    with Counter() as counted:
        y, stats = attn(x, generator=torch.Generator().manual_seed(1))
        (y.sum() + stats["density"].sum()).backward()
    return counted, [y, x.grad] + [p.grad for p in attn.parameters()]


@pytest.mark.parametrize("density, fewer", [(None, 4), (0.01, 1.5)], ids=["initial", "1%"])
def test_sbm_at_the_gpus_chunk_sizes_makes_fewer_ops_and_the_same_bits(monkeypatch, density, fewer):
    """On a GPU every op is a launch: at the CPU's chunk sizes SBM's fast path makes ops in proportion to its edges,
    at fastrg.chunk_size's GPU sizes far fewer, with the same output and gradients, bit for bit; at its initial
    density (~26%, many chunks) and at 1% (CDF rows without draws between those with: blocks cut at
    chunk_size(_GAP))."""
    import fastrg

    cuda, chunk_size = torch.device("cuda"), fastrg.chunk_size
    assert chunk_size(8, torch.device("cpu")) == 8 and chunk_size(8, cuda) == 8 * fastrg.GPU_CHUNKS == 512
    cpu, results = sbm_step(1024, density=density)
    monkeypatch.setattr(fastrg, "chunk_size", lambda size, device: chunk_size(size, cuda))
    gpu, results_gpu = sbm_step(1024, density=density)
    assert all(torch.equal(a, b) for a, b in zip(results, results_gpu, strict=True))
    assert cpu.ops > fewer * gpu.ops  # initial: 5,815 ops against 996; 1%: 2,061 against 1,019


@pytest.mark.parametrize("density", [None, 0.01], ids=["initial", "1%"])
def test_sbm_off_the_cpu_reads_the_device_once_a_layer_whatever_the_batch_and_length(monkeypatch, density):
    """Off the CPU (simulated: fastrg.host_syncs, with its GPU chunk sizes) one SBM layer's forward + backward reads
    the device once, fastRG's sampled sizes (fastrg._counts), at two batch sizes and two lengths (4× the edges):
    no more than 4 syncs (its ops still grow with the graphs: fastRG builds CDF rows graph by graph)."""
    import fastrg

    monkeypatch.setattr(fastrg, "host_syncs", lambda device: True)
    n = 256 if density is None else 512  # and 4n: 16× the edges a graph
    sizes = [(1, n), (4, n), (1, 4 * n), (4, 4 * n)]
    counted = {size: sbm_step(size[1], size[0], density)[0] for size in sizes}
    assert all(c.syncs <= 4 for c in counted.values()), {size: c.syncs for size, c in counted.items()}
