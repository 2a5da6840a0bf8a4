"""Scaling of attention modules with sequence length: time, peak memory, FLOPs and density in one run.

    python -m experiments.scaling --methods full,full-ref --lengths 1024,2048,4096     # into runs/scaling/
    python -m experiments.scaling --methods full,performer --attn performer.features=128 --lengths 1024,8192 --causal

``full-ref`` is full attention's reference path (materialised scores); ``sbm@D`` SBM at density D as
a trained model samples, ``sbm`` an untrained one at ~25%, both on the fast path unless ``--attn
sbm.path=reference``. Each cell runs in its own process (its own peak memory), with the glibc
allocator setting, which changes CPU timings 1.5-4×.
"""

import argparse
import inspect
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
from typing import Dict, List

from tabulate import tabulate

from bench import cli
from bench.files import read_json, write_json

ALLOCATORS = {"keep": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"}, "default": {}}


def shifted_module(dim: int, heads: int, head_dim: int, x, density: float, path: str):
    """SBMAttention on `path` at expected density `density` on x (sbm_transformer.at_density)."""
    import sbm_transformer

    module = sbm_transformer.SBMAttention(dim, heads, head_dim, path=path).to(x.device).train()
    return sbm_transformer.at_density(module, x, density)


def resolve_method(method: str, options: Dict[str, str]) -> tuple:
    """A --methods name and its --attn texts → (registry name, {key: value text}, SBM's density):
    ``full-ref``: full attention's reference path; ``sbm@D``: SBM at density D (else ValueError)."""
    if method == "full-ref":  # a method name of its own: a second setting of full
        return "full", {"path": "reference", **options}, None
    if not method.startswith("sbm@"):
        return method, options, None
    try:
        density = float(method[4:])
    except ValueError:
        density = 0.0
    if not 0 < density <= 1:
        raise ValueError(f"{method}: sbm@D takes a density D in (0, 1], e.g. sbm@0.01")
    return "sbm", options, density


def attn_options(items: List[str], methods: List[str]) -> Dict[str, Dict[str, str]]:
    """``--attn METHOD.KEY=VALUE`` items → {method: {key: value text}}; ValueError for a method not measured."""
    options: Dict[str, Dict[str, str]] = {m: {} for m in methods}
    for item in items:
        target, value = item.split("=", 1)
        method, key = target.split(".", 1)
        if method not in options:
            raise ValueError(f"--attn {item}: {method} is not among --methods {','.join(methods)}")
        options[method][key] = value
    return options


def measure_cell(cell: dict) -> dict:
    """Runs in the child process: builds one attention module and measures it."""
    import torch
    from bench.methods import attention_options, get

    torch.manual_seed(0)
    device = torch.device(cell["device"])
    name, texts, density = resolve_method(cell["method"], cell.get("options", {}))
    cls = get(name).load()
    options = attention_options(name, texts)
    if name == "sbm":  # the method's claim is a cost linear in its edges: the fast path, unless --attn says
        options.setdefault("path", "fast")
    if "max_len" in inspect.signature(cls).parameters:
        options.setdefault("max_len", cell["n"])
    dim = cell["heads"] * cell["head_dim"]
    x = torch.randn(cell["batch"], cell["n"], dim, device=device, requires_grad=True)
    if density is not None:
        module = shifted_module(dim, cell["heads"], cell["head_dim"], x, density, options["path"])
    else:
        module = cls(dim, cell["heads"], cell["head_dim"], 0.0, **options).to(device)
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
    small = x[:, : min(64, cell["n"])].detach().requires_grad_()
    module(small, causal=cell["causal"], generator=generator)[0].sum().backward()
    module.zero_grad(set_to_none=True)
    result = costs(forward, forward_backward, device, cell["warmup"], cell["repeats"])
    _, stats = forward()
    result["density"] = stats["density"].float().mean().item()
    return result


def costs(forward, forward_backward, device, warmup: int, repeats: int) -> dict:
    """A cell's peak memory above baseline, forward and forward+backward ms, tensor peak, FLOPs."""
    import torch
    from bench import measure

    measure.synchronize(device)
    meter = measure.PeakRSS() if device.type == "cpu" else None
    base_cuda = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    measure.reset_peak_memory(device)
    forward_backward()
    return {
        "peak_bytes": measure.peak_memory_bytes(device, meter) - base_cuda,
        "fwd_ms": measure.time_fn(forward, device, warmup, repeats),
        "fwdbwd_ms": measure.time_fn(forward_backward, device, warmup, repeats),
        "tensor_peak_bytes": measure.tensor_peak_bytes(forward_backward, device),
        "flops": measure.count_flops(forward)["total"],
    }


def run_cell(cell: dict, allocator: str, timeout: int, module: str = "experiments.scaling") -> dict:
    """One cell measured in a process that dies with this one (its own peak memory): its row."""
    from experiments.grid import ROOT, die_with_parent

    env = {k: v for k, v in os.environ.items() if k not in ALLOCATORS["keep"]}  # the one asked for
    threads = {"OMP_NUM_THREADS": str(cell["threads"])} if cell.get("threads") else {}
    env.update(ALLOCATORS[allocator], **threads)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, "--cell", json.dumps(cell)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=die_with_parent,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if proc.returncode < 0:  # killed: by the kernel for memory, most often
        return {"error": f"killed by {signal.Signals(-proc.returncode).name} (out of memory?)"}
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()
        return {"error": lines[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_benchmark_arguments(p, warmup_iters: int, repeats: int, out: str) -> None:
    """The options every attention benchmark shares: shapes, repetitions, threads, output folder."""
    p.add_argument(
        "--batch-size", type=cli.bounded_int(1, cli.MAX_LENGTH, "a batch size"), default=1, help="sequences per forward"
    )
    p.add_argument("--heads", type=cli.layers, default=2, help="attention heads")
    p.add_argument("--head-dim", type=cli.width, default=32, help="size of each head")
    p.add_argument(
        "--warmup-iters",
        type=cli.non_negative_int,
        default=warmup_iters,
        help="untimed iterations before the timed ones",
    )
    p.add_argument(
        "--repeats", type=cli.positive_int, default=repeats, help="timed iterations (the median is reported)"
    )
    p.add_argument(
        "--threads",
        type=cli.threads,
        default=0,
        help="torch intra-op threads (0: torch's default, the machine's cores)",
    )
    p.add_argument("--out", metavar="DIR", default=out, help="folder for what the benchmark writes")


def add_measurement_arguments(
    p: argparse.ArgumentParser, warmup_iters: int, repeats: int, timeout: int, out: str
) -> None:
    """add_benchmark_arguments', and the cells' own: device, allocator, time limit."""
    add_benchmark_arguments(p, warmup_iters, repeats, out)
    p.add_argument(
        "--device", default="auto", type=cli.device_option, help="auto (CUDA when present), cpu, cuda or cuda:N"
    )
    p.add_argument(
        "--allocator",
        choices=sorted(ALLOCATORS),
        default="keep",
        help="glibc allocator setting of every cell: keep = MALLOC_MMAP_MAX_=0 "
        "MALLOC_TRIM_THRESHOLD_=68719476736, default = glibc's",
    )
    p.add_argument("--timeout", type=cli.positive_int, default=timeout, help="seconds per cell")
    p.add_argument("--cell", help=argparse.SUPPRESS)


def device_or_exit(p: argparse.ArgumentParser, device: str) -> str:
    """--device resolved (auto: CUDA when present), or the parser's exit if the machine lacks it."""
    from bench.config import resolve_device

    try:
        return str(resolve_device(device))
    except ValueError as exc:
        p.error(str(exc))


def describe(device: str, allocator: str) -> tuple:
    """(where the cells ran, the allocator setting) in words, for the table's conditions."""
    import torch

    where = (
        torch.cuda.get_device_name()
        if device.startswith("cuda")
        else f"CPU {platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    )
    return where, " ".join(f"{k}={v}" for k, v in ALLOCATORS[allocator].items()) or "glibc defaults"


def label(row: dict) -> str:
    """A row's method with the --attn options it was measured with: "performer (features=128)"."""
    options = row.get("options") or {}
    return row["method"] + (f" ({', '.join(f'{k}={v}' for k, v in options.items())})" if options else "")


def table(rows: list, reference: str) -> str:
    refs = {r["n"]: r for r in rows if label(r) == reference and "error" not in r}
    out = []
    for r in rows:
        if "error" in r:
            said = r["error"] if r["error"].startswith(("not run", "out of memory")) else "failed: " + r["error"]
            out.append([label(r), r["n"], said] + [""] * 8)
            continue
        ref = refs.get(r["n"])
        ratio = {k: f"{r[k] / ref[k]:.2f}" if ref and ref[k] else "–" for k in ("fwdbwd_ms", "peak_bytes", "flops")}
        out.append(
            [
                label(r),
                r["n"],
                f"{r['fwd_ms']:.1f}",
                f"{r['fwdbwd_ms']:.1f}",
                ratio["fwdbwd_ms"],
                f"{r['peak_bytes'] / 2**20:.1f}",
                ratio["peak_bytes"],
                f"{r['flops'] / 1e9:.3f}",
                ratio["flops"],
                f"{r['density']:.4f}",
            ]
        )
    headers = ["method", "n", "fwd ms", "fwd+bwd ms", "× full", "peak MiB", "× full", "fwd GFLOP", "× full", "density"]
    return tabulate(out, headers=headers, tablefmt="github", disable_numparse=True)


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("python -m experiments.scaling", __doc__.splitlines()[0])
    p.add_argument("--methods", default="full,full-ref", help="comma-separated registry names (and full-ref)")
    p.add_argument(
        "--attn",
        action="append",
        default=[],
        type=cli.attn_item,
        metavar="METHOD.KEY=VALUE",
        help="a constructor option of one method (repeatable), e.g. performer.features=128",
    )
    p.add_argument(
        "--lengths", default="1024,2048,4096", type=cli.positive_ints, help="comma-separated sequence lengths"
    )
    p.add_argument("--causal", action="store_true", help="causal attention (default: non-causal)")
    p.add_argument("--resume", action="store_true", help="keep --out's rows measured with these settings")
    add_measurement_arguments(p, warmup_iters=2, repeats=5, timeout=900, out="runs/scaling")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.cell:
        print(json.dumps(measure_cell(json.loads(args.cell))))
        return 0
    try:
        methods = [m for m in args.methods.split(",") if m]
        options = attn_options(args.attn, methods)
        from bench.methods import attention_options, available

        for method in methods:
            name, texts, _ = resolve_method(method, options[method])
            if name not in available():
                raise ValueError(f"unknown method {method!r}; available: {sorted(available())}")
            attention_options(name, texts)  # an unknown key or a value of the wrong type fails here, not in a cell
    except (ValueError, ImportError) as exc:
        p.error(str(exc))
    device = device_or_exit(p, args.device)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)  # the cells' count, as the table's conditions say
    where, allocator = describe(device, args.allocator)
    memory = "CUDA max_memory_allocated" if device.startswith("cuda") else "CPU peak RSS"
    settings = {**vars(args), "lengths": ",".join(map(str, args.lengths)), "resume": False}
    with cli.one_line_errors():  # a folder that cannot be written: one line
        path = cli.out_file(args.out, "scaling.json")
        earlier = (read_json(path) or {}) if args.resume else {}
        kept = {
            (r["method"], r["n"]): r
            for r in earlier.get("rows", [])
            if earlier.get("args") == settings and "error" not in r
        }
        result = {
            "device": where,
            "torch": torch.__version__,
            "allocator": allocator,
            "memory": memory,
            "args": settings,
            "rows": [],
        }
        for n in args.lengths:
            for method in methods:
                cell = {
                    "method": method,
                    "options": options[method],
                    "n": n,
                    "batch": args.batch_size,
                    "heads": args.heads,
                    "head_dim": args.head_dim,
                    "causal": args.causal,
                    "device": device,
                    "warmup": args.warmup_iters,
                    "repeats": args.repeats,
                    "threads": args.threads,
                }
                row = {"method": method, "n": n, **({"options": options[method]} if options[method] else {})}
                measured = kept.get((method, n)) or run_cell(cell, args.allocator, args.timeout)
                result["rows"].append({**row, **measured})
                print(f"{'kept' if (method, n) in kept else 'measured'} {method} n={n}", file=sys.stderr)
                write_json(path, result)  # row by row: a killed table resumes (--resume) where it stopped
    print(render(result))
    print(f"wrote {path}", file=sys.stderr, flush=True)
    return exit_code(result["rows"])


def exit_code(rows: list) -> int:
    """1 when a cell failed, said on stderr; else 0."""
    failed = sum("error" in row for row in rows)
    if failed:
        print(f"error: {failed} of {len(rows)} cells failed (their rows say why)", file=sys.stderr, flush=True)
    return 1 if failed else 0


def line_fit(xs: list, ys: list) -> tuple:
    """(intercept, slope) of the least-squares line through the points (xs, ys)."""
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def load_average() -> float:
    """The machine's load over the last minute (NaN where the OS does not say)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def render(result: dict) -> str:
    """The scaling table with its conditions, from what main() measured or wrote with --out."""
    args, rows = result["args"], result["rows"]
    methods = list(dict.fromkeys(label(r) for r in rows))
    reference = "full" if "full" in methods else methods[0]
    return (
        f"Attention scaling — {result['device']}, torch {result['torch']}; batch {args['batch_size']}, "
        f"{args['heads']} heads, head dim {args['head_dim']}, {'causal' if args['causal'] else 'non-causal'}; "
        f"allocator: {result['allocator']}; median of {args['repeats']} after {args['warmup_iters']} warm-up; "
        f"memory: peak of one fwd+bwd above baseline ({result['memory']}); ratios to {reference}.\n\n"
        + table(rows, reference)
    )


if __name__ == "__main__":
    sys.exit(main())
