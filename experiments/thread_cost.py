"""Whether more threads hurt: fastRG's sampler and one SBM-Transformer forward+backward at torch's default thread
count against one thread, on the machine as it is and beside a busy process on every core.

    python -m experiments.thread_cost                                  # n = 4096, densities 0.1% and 1%
    python -m experiments.thread_cost --lengths 1024,8192 --repeats 9 --out runs/thread_cost

Per (load, case, n, density): the wall time of the same call at the default thread count and at one thread
(torch.set_num_threads around the call), the two interleaved call by call, median and [min-max] of --repeats
calls after a warm-up. The cases: `fastrg.sample(X, S, Y, csr=True)` with K = 128 (experiments.fastrg_bench's
setting), and SBMAttention's fast path forward and backward at the density (experiments.scaling's shifted
module: B = 1, H = 2, D = 32, K = 128). The loads: the machine as it is, then with `python -c "while True:
pass"` on each of --competitors cores, started and ended here. The ratio default ÷ one thread is what a second
thread costs (> 1) or gains (< 1); the sampler and the module's sparse operations run in fastrg.one_thread,
so that ratio stays near 1 under load. A benchmark, not a test: the figures depend on the machine.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from tabulate import tabulate

from bench import cli
from experiments import scaling
from experiments.fastrg_bench import K
import fastrg


def cases(n: int, density: float, seed: int) -> dict:
    """name → a call of the case at (n, density)."""
    g = torch.Generator().manual_seed(seed)
    X, Y, S0 = torch.rand(n, K, generator=g), torch.rand(n, K, generator=g), torch.rand(K, K, generator=g)
    S = S0 * (density * n * n / float(fastrg.expected_edges(X, S0, Y)))
    x = torch.randn(1, n, 64, generator=g)
    module = scaling.shifted_module(64, 2, 32, x, density, "fast")
    x.requires_grad_(True)

    def sbm():
        y, _ = module(x, generator=g)
        y.sum().backward()

    return {"fastrg.sample": lambda: fastrg.sample(X, S, Y, generator=g, csr=True), "SBM fwd+bwd": sbm}


def at(threads: int, fn):
    def call():
        default = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        finally:
            torch.set_num_threads(default)
    return call


def measure(args, load: str) -> list:
    rows, default = [], torch.get_num_threads()
    for n in args.lengths:
        for density in args.densities:
            for name, fn in cases(n, density, args.seed).items():
                variants = {f"{default} threads": at(default, fn), "1 thread": at(1, fn)}
                times = {v: [] for v in variants}
                for _ in range(args.warmup_iters):
                    for call in variants.values():
                        call()
                for _ in range(args.repeats):
                    for v, call in variants.items():
                        times[v].append(call())
                rows.append({"load": load, "case": name, "n": n, "density": density,
                             **{v: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
                                for v, t in times.items()}})
                print(f"  {load} {name} n={n} density={density:g}: " + ", ".join(
                    f"{v} {statistics.median(t):.1f} ms" for v, t in times.items()), file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    p = cli.parser("python -m experiments.thread_cost", __doc__.splitlines()[0])
    p.add_argument("--lengths", type=cli.positive_ints, default="4096", help="comma-separated n = m")
    p.add_argument("--densities", default="0.001,0.01", help="comma-separated expected densities in (0, 1)")
    p.add_argument("--repeats", type=cli.positive_int, default=7, help="timed calls per variant (median)")
    p.add_argument("--warmup-iters", type=cli.positive_int, default=1, help="untimed calls of each variant first")
    p.add_argument("--competitors", type=cli.layers, default=os.cpu_count() or 1,
                   help="busy processes of the second load (one per core)")
    p.add_argument("--seed", type=cli.seed, default=0, help="seed of the inputs and draws")
    p.add_argument("--out", metavar="DIR", default="runs/thread_cost", help="folder for thread_cost.json")
    args = p.parse_args(argv)
    try:
        args.densities = [float(d) for d in args.densities.split(",") if d]
    except ValueError:
        args.densities = []
    if not args.densities or not all(0 < d < 1 for d in args.densities):
        p.error(f"--densities takes comma-separated numbers in (0, 1), got {args.densities}")
    load = os.getloadavg()[0]
    rows = measure(args, "as is")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.competitors)]
    try:
        time.sleep(0.5)
        rows += measure(args, f"{args.competitors} busy")
    finally:
        for process in busy:
            process.kill()
            process.wait()
    default, one = f"{torch.get_num_threads()} threads", "1 thread"
    span = lambda cell: f"{cell['median_ms']:.1f} [{cell['min_ms']:.1f}-{cell['max_ms']:.1f}]"  # noqa: E731
    print(f"Thread cost on {os.cpu_count()} cores, torch {torch.__version__}, wall clock, median [min-max] of "
          f"{args.repeats} interleaved calls; load average {load:.2f} at start")
    print(tabulate([[r["load"], r["case"], r["n"], f"{r['density']:.1%}", span(r[default]), span(r[one]),
                     f"{r[default]['median_ms'] / r[one]['median_ms']:.2f}"] for r in rows],
                   headers=["load", "case", "n", "density", f"{default} ms", f"{one} ms", "default ÷ one thread"],
                   tablefmt="github", disable_numparse=True))
    path = cli.out_file(args.out, "thread_cost.json")
    path.write_text(json.dumps({"settings": {k: v for k, v in vars(args).items() if k != "out"},
                                "default_threads": torch.get_num_threads(), "load_average": load, "rows": rows},
                               indent=2))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
