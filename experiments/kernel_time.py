"""Inference wall-clock of one KernelSparseAttention layer, sparse (the edge-list fast path) against dense (the same
module with sparse=False: the teacher's SDPA), side by side in one process.

    OMP_NUM_THREADS=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 python -m experiments.kernel_time
    python -m experiments.kernel_time --lengths 256 --top-k 5 --repeats 11 --out runs/kernel_time
    python -m experiments.kernel_time --compare OLD/kernel_sparse.py     # another version's sparse path beside this one

The layer: width 128, 4 heads of 32, ALiBi, the 17 standard kernels (kernel_sparse.py's CPU preset), a predictor
at its seeded initialisation selecting the top-K kernels (K = 3: 28.6 keys per query at n = 256, near the 25.7 of
the preset's fine-tuned model, its trained predictor's top 8) or those above a threshold; batch = --tokens ÷ n,
eval mode, no gradient. Per n: keys per query (edges ÷ valid queries, from the layer's reported density), then the
wall time of each variant, called in turn (dense, sparse[, compared]) so that a shared machine's load falls on all
alike: median and [min-max] of --repeats rounds after --warmup-iters. The ratio sparse ÷ dense is that of the
medians; beside it, the same ratio of the process's CPU time per call, which leaves out the time spent waiting for
a core and so moves less with a shared machine's load. --compare loads another copy of kernel_sparse.py (an
earlier version, say) and times its sparse path with the same weights. A benchmark, not a test: the figures depend
on the machine.
"""
import importlib.util
import json
import os
import statistics
import sys
import time

import torch
from tabulate import tabulate

import kernel_sparse
from bench import cli

DIM, HEADS, HEAD_DIM = 128, 4, 32


def layer(module, n: int, args) -> torch.nn.Module:
    """The measured layer from `module` (kernel_sparse or a copy), its weights seeded alike whatever the copy."""
    torch.manual_seed(args.seed)
    rule = {"select": "topk", "top_k": args.top_k} if args.threshold is None else {"threshold": args.threshold}
    return module.KernelSparseAttention(DIM, HEADS, HEAD_DIM, max_len=n, alibi=True, **rule).eval()


def measure(n: int, args, compared=None) -> dict:
    x = torch.randn(max(1, args.tokens // n), n, DIM, generator=torch.Generator().manual_seed(args.seed + 1))
    dense, sparse = layer(kernel_sparse, n, args), layer(kernel_sparse, n, args)
    dense.sparse = False
    variants = {"dense": dense, "sparse": sparse}
    if compared is not None:
        variants["compared"] = layer(compared, n, args)
        variants["compared"].load_state_dict(sparse.state_dict())
    times, cpu = {name: [] for name in variants}, {name: [] for name in variants}
    with torch.no_grad():
        density = float(sparse(x)[1]["density"].mean())
        for repeat in range(args.warmup_iters + args.repeats):
            for name, module in variants.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                module(x)
                if repeat >= args.warmup_iters:
                    times[name].append((time.perf_counter() - start) * 1e3)
                    cpu[name].append((time.process_time() - start_cpu) * 1e3)
    return {"n": n, "batch": len(x), "keys_per_query": density * n,
            **{name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
                      "cpu_median_ms": statistics.median(cpu[name])} for name, t in times.items()}}


def main(argv=None) -> int:
    p = cli.parser("python -m experiments.kernel_time", __doc__.splitlines()[0])
    p.add_argument("--lengths", type=cli.positive_ints, default="256,1024,4096", help="comma-separated n")
    p.add_argument("--tokens", type=cli.positive_int, default=4096, help="batch × n (batch = tokens ÷ n, at least 1)")
    p.add_argument("--top-k", type=cli.positive_int, default=3, help="kernels each query takes (top-K selection)")
    p.add_argument("--threshold", type=cli.finite_float, default=None,
                   help="select the kernels above it instead of the top-K")
    p.add_argument("--repeats", type=cli.positive_int, default=9, help="timed rounds (median)")
    p.add_argument("--warmup-iters", type=cli.positive_int, default=2, help="untimed rounds first")
    p.add_argument("--compare", metavar="FILE", default=None, help="another kernel_sparse.py to time beside")
    p.add_argument("--seed", type=cli.seed, default=0, help="seed of the weights and inputs")
    p.add_argument("--out", metavar="DIR", default="runs/kernel_time", help="folder for kernel_time.json")
    args = p.parse_args(argv)
    compared = None
    if args.compare is not None:
        spec = importlib.util.spec_from_file_location("kernel_sparse_compared", args.compare)
        if spec is None or not os.path.isfile(args.compare):
            p.error(f"--compare: no Python file at {args.compare}")
        compared = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(compared)
    load = os.getloadavg()[0]
    rows = []
    for n in args.lengths:
        rows.append(measure(n, args, compared))
        print(f"  n={n}: " + ", ".join(f"{v} {rows[-1][v]['median_ms']:.1f} ms" for v in ("dense", "sparse")),
              file=sys.stderr, flush=True)
    names = ["dense", "sparse"] + (["compared"] if compared is not None else [])
    span = lambda cell: f"{cell['median_ms']:.1f} [{cell['min_ms']:.1f}-{cell['max_ms']:.1f}]"  # noqa: E731
    print(f"One KernelSparseAttention layer (width {DIM}, {HEADS} heads, ALiBi), inference, torch "
          f"{torch.__version__}, {torch.get_num_threads()} thread(s); wall clock, median [min-max] of {args.repeats} "
          f"interleaved rounds; load average {load:.2f} at start")
    print(tabulate([[r["n"], r["batch"], f"{r['keys_per_query']:.1f}", *(span(r[v]) for v in names),
                     *(f"{r[v]['median_ms'] / r['dense']['median_ms']:.2f}" for v in names[1:]),
                     *(f"{r[v]['cpu_median_ms'] / r['dense']['cpu_median_ms']:.2f}" for v in names[1:])] for r in rows],
                   headers=["n", "batch", "keys per query", *(f"{v} ms" for v in names),
                            *(f"{v} ÷ dense" for v in names[1:]), *(f"{v} ÷ dense, CPU time" for v in names[1:])],
                   tablefmt="github", disable_numparse=True))
    path = cli.out_file(args.out, "kernel_time.json")
    path.write_text(json.dumps({"settings": {k: v for k, v in vars(args).items() if k != "out"},
                                "threads": torch.get_num_threads(), "load_average": load, "rows": rows}, indent=2))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
