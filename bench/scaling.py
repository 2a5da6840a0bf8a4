"""Scaling of attention modules with sequence length: time, peak memory, FLOPs and density in one run.

    python -m bench.scaling --methods full,full-ref --lengths 1024,2048,4096
    python -m bench.scaling --methods full,linear,performer:features=256 --lengths 1024,8192 --causal

A method is a registry name (bench.train.METHODS) with optional constructor options, ``name:key=value;...``;
``full-ref`` is full attention on its reference path (materialised scores). Each (method, length) cell runs in
a fresh process, so its peak memory is its own: peak memory of one forward+backward is taken first, above the
baseline after the module and the input exist (CPU: peak RSS; CUDA: max_memory_allocated), then forward
time (no autograd) and forward+backward time as medians after warm-up, then forward FLOPs (bench.measure
conventions) and density. Ratios are to the first ``full`` method of the run. A small forward+backward
precedes the memory measurement, so one-time lazy allocations (thread pools, kernels) are not counted.

The glibc allocator setting changes CPU timings 1.5-4× (shared/notes/cpu_attention_limits.md): by default
every cell runs with MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 (``--allocator keep``), and the
setting is printed with the table; ``--allocator default`` uses glibc's defaults. Never mix the two in a table.
"""
import argparse
import inspect
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch
from tabulate import tabulate

from bench import measure

ALLOCATORS = {"keep": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"}, "default": {}}
ALIASES = {"full-ref": "full:fused=False"}


def parse_method(spec: str):
    """'name:key=value;key=value' → (registry name, {key: value text}); bench.train.attention_options types them."""
    from bench.train import parse_attn_option
    spec = ALIASES.get(spec, spec)
    name, _, rest = spec.partition(":")
    options = dict(parse_attn_option(item) for item in rest.split(";") if item)
    return name, options


def measure_cell(cell: dict) -> dict:
    """Runs in the child process: builds one attention module and measures it."""
    from bench.train import attention_options, load_method
    torch.manual_seed(0)
    device = torch.device(cell["device"])
    name, texts = parse_method(cell["method"])
    _, cls = load_method(name)
    options = attention_options(name, texts)
    if "max_len" in inspect.signature(cls).parameters:
        options.setdefault("max_len", cell["n"])
    dim = cell["heads"] * cell["head_dim"]
    module = cls(dim, cell["heads"], cell["head_dim"], 0.0, **options).to(device)
    x = torch.randn(cell["batch"], cell["n"], dim, device=device, requires_grad=True)
    grad = torch.randn(cell["batch"], cell["n"], dim, device=device)
    generator = torch.Generator(device).manual_seed(0)

    def forward_backward():
        y, _ = module(x, causal=cell["causal"], generator=generator)
        y.backward(grad)

    def forward():
        with torch.no_grad():
            return module(x, causal=cell["causal"], generator=generator)

    # One small forward+backward first: thread pools, kernels and autograd allocate once, lazily, and that
    # one-time cost is not the cell's.
    small = x[:, :min(64, cell["n"])].detach().requires_grad_()
    module(small, causal=cell["causal"], generator=generator)[0].sum().backward()
    module.zero_grad(set_to_none=True)
    measure.synchronize(device)
    meter = measure.PeakRSS() if device.type == "cpu" else None
    base_cuda = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    measure.reset_peak_memory(device)
    forward_backward()
    peak = measure.peak_memory_bytes(device, meter) - base_cuda
    result = {"peak_bytes": peak,
              "fwd_ms": measure.time_fn(forward, device, cell["warmup"], cell["repeats"]),
              "fwdbwd_ms": measure.time_fn(forward_backward, device, cell["warmup"], cell["repeats"])}
    result["flops"] = measure.count_flops(forward)["total"]
    _, stats = forward()
    result["density"] = stats["density"].float().mean().item()
    return result


def run_cell(cell: dict, allocator: str, timeout: int, module: str = "bench.scaling") -> dict:
    """Measure one cell in a fresh process (`python -m MODULE --cell JSON`), so peak memory is its own and
    no allocator state carries over; the row, or {"error": reason}."""
    env = dict(os.environ, **ALLOCATORS[allocator])
    for key in ALLOCATORS["keep"]:
        if allocator == "default":
            env.pop(key, None)
    try:
        proc = subprocess.run([sys.executable, "-m", module, "--cell", json.dumps(cell)], env=env,
                              capture_output=True, text=True, timeout=timeout,
                              cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()
        return {"error": lines[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_measurement_arguments(p: argparse.ArgumentParser, warmup: int, repeats: int, timeout: int) -> None:
    """The options every scaling benchmark shares (shapes, device, repetitions, allocator, output)."""
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--allocator", choices=sorted(ALLOCATORS), default="keep", help="glibc allocator setting")
    p.add_argument("--timeout", type=int, default=timeout, help="seconds per cell")
    p.add_argument("--out", default=None, help="also write the rows as JSON here")
    p.add_argument("--cell", help=argparse.SUPPRESS)


def resolve_device(name: str) -> str:
    return "cuda" if name == "auto" and torch.cuda.is_available() else ("cpu" if name == "auto" else name)


def describe(device: str, allocator: str) -> tuple:
    """(where the cells ran, the allocator setting) in words, for the table's conditions."""
    where = (torch.cuda.get_device_name() if device.startswith("cuda") else
             f"CPU {platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads")
    return where, " ".join(f"{k}={v}" for k, v in ALLOCATORS[allocator].items()) or "glibc defaults"


def table(rows: list, reference: str) -> str:
    refs = {r["n"]: r for r in rows if r["method"] == reference and "error" not in r}
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["method"], r["n"], "failed: " + r["error"]] + [""] * 8)
            continue
        ref = refs.get(r["n"])

        def ratio(key):
            return f"{r[key] / ref[key]:.2f}" if ref and ref[key] else "–"

        out.append([r["method"], r["n"], f"{r['fwd_ms']:.1f}", f"{r['fwdbwd_ms']:.1f}", ratio("fwdbwd_ms"),
                    f"{r['peak_bytes'] / 2 ** 20:.1f}", ratio("peak_bytes"), f"{r['flops'] / 1e9:.3f}",
                    ratio("flops"), f"{r['density']:.4f}"])
    headers = ["method", "n", "fwd ms", "fwd+bwd ms", "× full", "peak MiB", "× full", "fwd GFLOP", "× full",
               "density"]
    return tabulate(out, headers=headers, tablefmt="github", disable_numparse=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--methods", default="full,full-ref", help="comma-separated method specs")
    p.add_argument("--lengths", default="1024,2048,4096", help="comma-separated sequence lengths")
    p.add_argument("--causal", action="store_true", help="causal attention")
    add_measurement_arguments(p, warmup=2, repeats=5, timeout=900)
    args = p.parse_args(argv)
    if args.cell:
        print(json.dumps(measure_cell(json.loads(args.cell))))
        return 0
    try:
        methods = [m for m in args.methods.split(",") if m]
        lengths = [int(n) for n in args.lengths.split(",") if n]
        from bench.train import available_methods
        for spec in methods:
            if parse_method(spec)[0] not in available_methods():
                raise ValueError(f"unknown method {spec!r}; available: {sorted(available_methods())}")
        if not lengths or min(lengths) < 1 or min(args.batch, args.heads, args.head_dim, args.repeats) < 1:
            raise ValueError("lengths, batch, heads, head-dim and repeats must be positive")
    except (ValueError, ImportError) as exc:
        p.error(str(exc))
    device = resolve_device(args.device)
    rows = []
    for n in lengths:
        for method in methods:
            cell = {"method": method, "n": n, "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim,
                    "causal": args.causal, "device": device, "warmup": args.warmup, "repeats": args.repeats}
            rows.append({"method": method, "n": n, **run_cell(cell, args.allocator, args.timeout)})
            print(f"measured {method} n={n}", file=sys.stderr, flush=True)
    where, allocator = describe(device, args.allocator)
    memory = "CUDA max_memory_allocated" if device.startswith("cuda") else "CPU peak RSS"
    result = {"device": where, "torch": torch.__version__, "allocator": allocator, "memory": memory,
              "args": vars(args), "rows": rows}
    print(render(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


def render(result: dict) -> str:
    """The scaling table with its conditions, from what main() measured or wrote with --out."""
    args, rows = result["args"], result["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    reference = next((m for m in methods if parse_method(m) == ("full", {})), methods[0])
    return (f"Attention scaling — {result['device']}, torch {result['torch']}; batch {args['batch']}, "
            f"{args['heads']} heads, head dim {args['head_dim']}, {'causal' if args['causal'] else 'non-causal'}; "
            f"allocator: {result['allocator']}; median of {args['repeats']} after {args['warmup']} warm-up; memory: "
            f"peak of one fwd+bwd above baseline ({result['memory']}); ratios to {reference}.\n\n" + table(rows, reference))


if __name__ == "__main__":
    sys.exit(main())
