"""Measurement: FLOPs, peak memory and time, with one set of conventions for every method.

FLOPs (forward, per example). ``torch.utils.flop_counter.FlopCounterMode`` counts only matrix products and
the CUDA attention kernels, at 2 FLOPs per multiply-add. Sparse attention does its arithmetic in
elementwise, reduction and scatter ops, and CPU SDPA is not counted at all, so we register formulas for them
(``EXTRA_FORMULAS``) and count, by one convention:
- matrix products (mm, bmm, addmm, baddbmm, conv, CUDA SDPA): torch's formulas, 2 FLOPs per multiply-add;
  with a sparse (CSR) operand, and for SDDMM (``sparse_sampled_addmm``), 2 per stored entry and column;
- CPU SDPA (``_scaled_dot_product_flash_attention_for_cpu``): torch's SDPA formula (4·B·H·N·M·D forward,
  its backward formula for the backward) plus the softmax below, like every other SDPA kernel here;
- softmax and log-softmax: ``SOFTMAX_FLOPS_PER_ELEMENT`` = 4 per element (max-subtract, exp, sum, divide);
  their backward 3 per element. SDPA forward includes the softmax of its N·M scores the same way;
- elementwise arithmetic and special functions (add, mul, div, exp, sigmoid, GELU …): 1 per output element;
- reductions (sum, mean, amax): 1 per input element;
- scatter-add, index-add and scatter-reduce: 1 per source element (one add each);
- gather, index, index_select, copies, masking and views: 0 (data movement only).
A sparse method is thereby counted from the work it actually does on its edges: scoring E edges with an
elementwise product and a sum is 2·E·D, the same as the dense multiply-add count for E pairs.

Computed pairs (a comparison's cost axis, DESIGN.md): the (query, key) pairs an attention's kernel scores, as a
fraction of the admissible pairs (valid query, valid key, and j ≤ i when causal), per head, summed over the batch
before dividing (``computed_pairs``). An attention whose scored pairs differ from the distinct pairs of its density
reports them as ``stats["computed_pairs"]`` (INTERFACE.md): Reformer, R rounds × 2C keys a query, duplicates
included, capped at the query's admissible keys. For every other attention its density's pairs are the ones it
scores: full attention and the low-rank and kernel methods (linear, Performer, Linformer, Nyströmformer) touch each
admissible pair once through their products (1.0 by this convention), the window's band, BigBird's blocks, a head
allocation's heads (a layer's value is the mean over them), SBM's sampled edges, SSA's sampled keys, the kernel
method's selected keys, MoBA's own and routed blocks.

Peak memory: CUDA's ``max_memory_allocated`` after a reset; on CPU, the peak resident set above a baseline
taken just before the measured work (``PeakRSS``; the scaling benchmarks run each cell in its own process).
Time: warm-up, then the median of repeated calls, CUDA synchronised around each (``time_fn``); variants side
by side with their calls interleaved (``interleaved``).
"""

import contextlib
import ctypes
import ctypes.util
import platform
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from torch import nn
from torch.utils import flop_counter

aten = torch.ops.aten

SOFTMAX_FLOPS_PER_ELEMENT = 4
SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT = 3
ELEMENTWISE_OPS = [
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "pow",
    "sigmoid",
    "tanh",
    "gelu",
    "relu",
    "elu",
    "erf",
    "reciprocal",
    "maximum",
    "minimum",
    "clamp",
    "clamp_min",
    "addcmul",
    "addcdiv",
    "lerp",
    "abs",
    "silu",
    "gelu_backward",
    "sigmoid_backward",
    "tanh_backward",
    "threshold_backward",
    "elu_backward",
]
REDUCTION_OPS = [
    "sum",
    "mean",
    "amax",
    "amin",
    "logsumexp",
    "prod",
    "cumsum",
    "norm",
    "linalg_vector_norm",
    "segment_reduce",
]
SCATTER_OPS = ["scatter_add", "index_add", "scatter_reduce", "index_reduce"]


def _raw(formula: Callable) -> Callable:
    """Mark a formula as taking the op's real arguments (tensors), not their shapes (FlopCounterMode's flag)."""
    formula._get_raw = True
    return formula


def _numel(x) -> int:
    return x.numel() if isinstance(x, torch.Tensor) else 0


_elementwise = _raw(lambda *args, out_val=None, **kwargs: _numel(out_val))
_reduction = _raw(lambda *args, out_val=None, **kwargs: _numel(args[0]))
# scatter_add(self, dim, index, src) / index_add(self, dim, index, source): one add per source element
_scatter = _raw(
    lambda *args, out_val=None, **kwargs: (
        _numel(args[3]) if len(args) > 3 else _numel(kwargs.get("src", kwargs.get("source")))
    )
)
_softmax = _raw(lambda *args, out_val=None, **kwargs: SOFTMAX_FLOPS_PER_ELEMENT * _numel(out_val))
_softmax_backward = _raw(lambda *args, out_val=None, **kwargs: SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT * _numel(out_val))


@_raw
def _mm(a, b, *args, out_val=None, **kwargs) -> int:
    """torch's 2·m·k·n, or 2 per stored entry of a sparse operand and column of the other (computed work)."""
    if a.layout != torch.strided:
        return 2 * a._nnz() * b.shape[-1]
    if b.layout != torch.strided:
        return 2 * b._nnz() * a.shape[0]
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


_addmm = _raw(lambda bias, a, b, *args, out_val=None, **kwargs: _mm(a, b))
# SDDMM: one dot product of length a.shape[-1] per stored entry
_sampled_addmm = _raw(lambda pattern, a, b, *args, out_val=None, **kwargs: 2 * pattern._nnz() * a.shape[-1])


@_raw
def _cpu_sdpa(query, key, value, *args, out_val=None, **kwargs) -> int:
    b, h, n, _ = query.shape
    matmuls = flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape)
    return matmuls + SOFTMAX_FLOPS_PER_ELEMENT * b * h * n * key.shape[-2]


@_raw
def _cpu_sdpa_backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    b, h, n, _ = query.shape
    matmuls = flop_counter.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)
    return matmuls + SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT * b * h * n * key.shape[-2]


def _packets(names: List[str]) -> list:
    """The OpOverloadPackets for names and their in-place variants that exist in this torch build."""
    return [getattr(aten, v) for name in names for v in (name, name + "_") if hasattr(aten, v)]


EXTRA_FORMULAS: Dict = {}
EXTRA_FORMULAS.update({op: _elementwise for op in _packets(ELEMENTWISE_OPS)})
EXTRA_FORMULAS.update({op: _reduction for op in _packets(REDUCTION_OPS)})
EXTRA_FORMULAS.update({op: _scatter for op in _packets(SCATTER_OPS)})
EXTRA_FORMULAS.update({aten.mm: _mm, aten.addmm: _addmm, aten.sparse_sampled_addmm: _sampled_addmm})
EXTRA_FORMULAS.update(
    {
        aten._softmax: _softmax,
        aten._log_softmax: _softmax,
        aten._softmax_backward_data: _softmax_backward,
        aten._log_softmax_backward_data: _softmax_backward,
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward,
    }
)


def count_flops(
    fn: Callable[[], object], modules: Optional[Dict[str, nn.Module]] = None, root: Optional[nn.Module] = None
) -> Dict[str, int]:
    """Runs fn() once under the counter. Returns {"total": FLOPs} plus, for each submodule of
    ``root`` given in ``modules`` (a {label: module} dict), the FLOPs spent inside it."""
    # this file's extra formulas; a depth deep enough for nested attention modules
    with flop_counter.FlopCounterMode(depth=64, display=False, custom_mapping=EXTRA_FORMULAS) as mode:
        fn()
    result = {"total": int(mode.get_total_flops())}
    if modules:
        counts = mode.get_flop_counts()  # by the module's path, as "RootClass.blocks.0.attn"
        paths = {id(m): f"{type(root).__name__}.{name}" for name, m in root.named_modules()}
        for label, module in modules.items():
            result[label] = int(sum(counts.get(paths.get(id(module)), {}).values()))
    return result


def model_flops_per_example(model: nn.Module, forward: Callable[[], object], examples: int) -> Dict[str, int]:
    """Forward FLOPs per example of a backbone (bench.model.Model): whole model and inside its attention
    modules (their projections included)."""
    attention = {f"attn{i}": block.attn for i, block in enumerate(model.blocks)}
    counts = count_flops(forward, attention, root=model)
    attn_total = sum(counts[label] for label in attention)
    return {"model": counts["total"] // examples, "attention": attn_total // examples}


def attention_part_flops(
    model: nn.Module, forward: Callable[[], object], examples: int, parts: Dict[str, List[str]]
) -> Dict[str, float]:
    """Forward FLOPs per example of a backbone, of its attention modules, and of their children grouped as ``parts``
    ({label: child names}, summed over layers); "core", what the attention does outside its children (scores,
    softmax, weighted sum, building a sparse pattern): the part that sparsity can change."""
    children = [(label, child) for label, names in parts.items() for child in names]
    modules = {f"attn{i}": block.attn for i, block in enumerate(model.blocks)}
    for i, block in enumerate(model.blocks):
        modules.update({f"{child}{i}": getattr(block.attn, child) for _, child in children})
    counts = count_flops(forward, modules, root=model)

    def per_example(name: str) -> float:
        return sum(counts[f"{name}{i}"] for i in range(len(model.blocks))) / examples

    result = {"model": counts["total"] / examples, "attention": per_example("attn")}
    result.update({label: sum(per_example(child) for child in names) for label, names in parts.items()})
    result["core"] = result["attention"]
    for label in parts:
        result["core"] -= result[label]
    return result


def model_costs(model: nn.Module, inputs: dict, device: torch.device, seed_for: Callable[[str], int]) -> tuple:
    """({"train": FLOPs, "eval": FLOPs} per example, inference peak memory in bytes) of ``model(**inputs)``.
    Training FLOPs are those of what a training step computes (SSA's sub-model, SBM's sampled masks), evaluation
    FLOPs those of inference, where a method may differ (SSA evaluates dense); random draws seeded by
    ``seed_for("flops")`` and ``seed_for("memory")``, the caller's seeds (bench.model imports this module, which
    therefore imports nothing of bench)."""
    flops = {}
    for mode, training in (("train", True), ("eval", False)):
        model.train(training)
        torch.manual_seed(seed_for("flops"))
        with torch.no_grad():
            flops[mode] = model_flops_per_example(model, lambda: model(**inputs), len(inputs["tokens"]))
    model.eval()
    torch.manual_seed(seed_for("memory"))
    return flops, inference_peak_memory_bytes(lambda: model(**inputs), device)


def counted_forward(model: nn.Module, inputs: dict, flops: dict):
    """``model(**inputs)``, its FLOPs per example (model_flops_per_example) written into ``flops``."""
    out = {}
    flops.update(
        model_flops_per_example(model, lambda: out.setdefault("result", model(**inputs)), len(inputs["tokens"]))
    )
    return out["result"]


def computed_pairs(stats: dict, key_padding_mask: Optional[torch.Tensor], causal: bool, n: int) -> torch.Tensor:
    """(H,) the pairs one attention forward scored / the admissible pairs (module docstring): its
    ``stats["computed_pairs"]``, else its ``stats["density"]``, both over valid queries × valid keys
    (INTERFACE.md), rescaled to the admissible pairs. key_padding_mask (B, N) True at padding, or None."""
    scored = stats.get("computed_pairs", stats["density"]).double()  # (H,)
    valid = (
        torch.ones(1, n, dtype=torch.float64, device=scored.device)
        if key_padding_mask is None
        else (~key_padding_mask).double()
    )  # (B|1, N)
    squares = (valid.sum(1) ** 2).sum()  # Σ_b (valid count)²: density's denominator
    admissible = (valid * valid.cumsum(1)).sum() if causal else squares  # causal: valid keys j ≤ i per valid query
    return (scored * squares / admissible.clamp_min(1)).float()


def proc_kib(path: str, field: str) -> Optional[int]:
    """A ``FIELD: N kB`` line's N from a Linux /proc file (/proc/self/status, /proc/meminfo), else None."""
    try:
        with open(path) as f:
            return next((int(line.split()[1]) for line in f if line.startswith(field + ":")), None)
    except (OSError, ValueError, IndexError):
        return None


class PeakRSS:
    """Peak resident memory above a baseline taken at construction. The heap's free pages go back
    to the OS first (glibc's ``malloc_trim``): with the benchmarks' allocator setting (glibc keeps
    freed memory, see experiments/scaling.py) a warm-up pass of the same size would leave its pages
    resident, and the measured pass would reuse them without raising the high-water mark, reading
    as ~0 bytes. On Linux the high-water mark (VmHWM) is then reset (writing 5 to
    /proc/self/clear_refs), so what ran before — data loading, imports — does not count; elsewhere
    the lifetime peak ``ru_maxrss`` is used, and the measured work must be the process's largest
    (which is why each measured cell runs in its own process)."""

    def __init__(self):
        with contextlib.suppress(OSError, AttributeError):  # without glibc, nothing to return
            ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.resettable = proc_kib("/proc/self/status", "VmHWM") is not None
        except OSError:
            self.resettable = False
        self.baseline = (proc_kib("/proc/self/status", "VmRSS") or 0) * 1024  # the resident set now (0 off Linux)

    def peak_above_baseline(self) -> int:
        peak_kib = (
            proc_kib("/proc/self/status", "VmHWM")
            if self.resettable
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        )
        return max(0, peak_kib * 1024 - self.baseline)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device, cpu_meter: Optional[PeakRSS] = None) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return cpu_meter.peak_above_baseline() if cpu_meter is not None else 0


def cuda_peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """CUDA's allocator peak while ``fn()`` runs, above what was allocated when it started."""
    before = torch.cuda.memory_allocated(device)
    reset_peak_memory(device)
    fn()
    synchronize(device)
    return max(0, int(torch.cuda.max_memory_allocated(device)) - before)


def inference_peak_memory_bytes(forward: Callable[[], object], device: torch.device) -> int:
    """Peak memory of one inference call above what was allocated before it (weights and inputs excluded):
    CUDA's allocator counter, or on CPU the resident set's high-water mark above a fresh baseline (PeakRSS),
    which is why the records of SBM Table 3 are compared within one claim, never across machines."""
    if device.type == "cuda":
        return cuda_peak_bytes(torch.no_grad()(forward), device)
    meter = PeakRSS()
    with torch.no_grad():
        forward()
    return meter.peak_above_baseline()


def tensor_peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """The most bytes that tensors hold at once while ``fn()`` runs, above those held when it starts. On CUDA that
    is max_memory_allocated's count; on CPU the same count is read from torch.profiler's allocation events, the
    tensors alone, where peak RSS (PeakRSS) also holds what the heap keeps around them."""
    if device.type == "cuda":
        return cuda_peak_bytes(fn, device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        fn()
    held = peak = 0
    for event in sorted(
        (e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    ):  # one event per allocation (+bytes) and per free (−bytes)
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def device_name(device: torch.device) -> str:
    """The device in words, for records and tables."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    threads = torch.get_num_threads()
    return f"cpu ({platform.processor() or platform.machine()}, {threads} thread{'s' * (threads > 1)})"


def versions() -> dict:
    """What a record's numbers came from, the processor among them with the instruction set torch's kernels dispatch
    to on it: kernels of other vector widths sum floats in other orders, so reruns are bit-identical on one kind."""
    model = platform.machine()  # where /proc/cpuinfo names no model
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    cpu = f"{model}, {torch.backends.cpu.get_cpu_capability()}"
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__, "cpu": cpu}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timed:
    """One variant's times (ms) over the timed rounds and what each of its calls returned."""

    ms: List[float]
    results: list

    @property
    def median(self) -> float:
        return statistics.median(self.ms)


def interleaved(
    variants: Dict[str, Callable[[int], object]],
    device: torch.device,
    repeats: int,
    warmup: int = 1,
    alternate: bool = False,
    after_round: Optional[Callable[[int], None]] = None,
) -> Dict[str, Timed]:
    """Each variant timed side by side: ``warmup`` untimed rounds, then ``repeats`` timed ones, each round calling
    every variant once with the round's index (``alternate``: in reverse order every other round), so that load
    on a shared machine falls on all alike; CUDA synchronised around each call. Returns each
    variant's ms and results of the timed rounds (keep the results small: they all stay alive)."""
    timed = {name: Timed([], []) for name in variants}
    names = list(variants)
    for round_ in range(warmup + repeats):
        for name in names[::-1] if alternate and round_ % 2 else names:
            synchronize(device)
            start = time.perf_counter()
            result = variants[name](round_)
            synchronize(device)
            if round_ >= warmup:
                timed[name].ms.append((time.perf_counter() - start) * 1e3)
                timed[name].results.append(result)
        if after_round is not None:
            after_round(round_)
    return timed


def time_fn(fn: Callable[[], object], device: torch.device, warmup: int = 2, repeats: int = 5) -> float:
    """Median wall time of fn() in milliseconds, after warm-up, synchronised on CUDA."""
    return interleaved({"fn": lambda _: fn()}, device, repeats, warmup)["fn"].median
