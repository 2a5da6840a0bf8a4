"""Benchmark: fastRG sampling time against the number of edges drawn, beside a naive dense Bernoulli draw.

    python -m experiments.fastrg_bench
    python -m experiments.fastrg_bench --threads 1 --clock cpu      # on a shared machine
    python -m experiments.fastrg_bench --threads 1 --igraph         # beside igraph (pip install igraph)

For n = m in --lengths, K = 128 and each density: X, Y (n × K) uniform(0, 1) (overlapping clusters,
like SBM-Transformer's memberships), S (K × K) uniform, scaled so that Σλ / (n·m) = density, λ = X S
Yᵀ. naive: P = X S Yᵀ, then rand(n, m) < P (the official SBM-Transformer dense path), once per n
(its cost does not depend on the density). "fixed" (one expected edge) and "tables" (8K: every CDF
entry built): what a draw pays before its edges (Rohe et al. 2018: O((n + m)K + E)).
igraph.Graph.SBM draws the same edge counts, not the same law (hard clusters). --allocator keep:
glibc keeps freed memory, not page-faulting large buffers back on every call.
"""

import ctypes
import ctypes.util
import importlib.util
import math
import os
import platform
import sys
import time

import torch
from tabulate import tabulate

import fastrg
from bench import cli, measure
from bench.files import write_json
from experiments import scaling

K = 128
NAIVE_BLOCK = 1 << 24  # entries of P per block in the naive draw


def keep_freed_memory() -> str:
    """Ask glibc to keep freed memory in the process; return a description of the allocator setting."""
    libc_name = ctypes.util.find_library("c")
    if platform.system() != "Linux" or libc_name is None:
        return "platform default (mallopt unavailable)"
    libc = ctypes.CDLL(libc_name)
    m_trim_threshold, m_mmap_max = -1, -4
    ok = libc.mallopt(m_mmap_max, 0) == 1 and libc.mallopt(m_trim_threshold, 2**31 - 1) == 1
    return "glibc keeps freed memory (M_MMAP_MAX=0, M_TRIM_THRESHOLD=2^31-1)" if ok else "mallopt failed: default"


def naive_draw(X, S, Y, generator):
    """Dense Bernoulli mask (n, m): P = X S Yᵀ block by block, then rand < P."""
    n, m = X.shape[0], Y.shape[0]
    mask = torch.empty(n, m, dtype=torch.bool, device=X.device)
    SYt = S @ Y.T  # (K, M)
    rows = max(1, NAIVE_BLOCK // m)
    for a in range(0, n, rows):
        P = X[a : a + rows] @ SYt  # (rows, M)
        torch.lt(torch.rand(P.shape, device=X.device, generator=generator), P, out=mask[a : a + rows])
    return mask


def above_fixed(ms: float, fixed_ms: float, edges: int) -> str:
    """(ms − fixed) per edge in ns, or "–" where the edges take less than a tenth of the call: a difference of
    two timings that is within their noise, not a per-edge cost."""
    return f"{(ms - fixed_ms) * 1e6 / max(edges, 1):.0f}" if ms - fixed_ms >= 0.1 * ms else "–"


def igraph_sbm(n: int, density: float, S: torch.Tensor):
    """A function drawing igraph's SBM (len(S) blocks, preference ∝ S): the edges drawn."""
    import igraph

    k = len(S)
    sizes = [n // k + (b < n % k) for b in range(k)]
    pref = (S.double().cpu() * (density / float(S.double().mean()))).clamp(max=1.0).tolist()
    return lambda: igraph.Graph.SBM(pref, sizes, directed=True, allowed_edge_types="loops").ecount()


def densities(text: str) -> list:
    """--densities: comma-separated densities, each in (0, 1]."""
    density = cli.checked_number(float, lambda v: 0 < v <= 1, "comma-separated densities in (0, 1]")
    return [density(v) for v in text.split(",") if v.strip()] or [density(text)]


def main(argv=None) -> int:
    ap = cli.parser(
        "python -m experiments.fastrg_bench",
        "fastRG sampling time vs edges, beside a naive dense Bernoulli draw.",
        allow_abbrev=False,
    )
    ap.add_argument(
        "--lengths", type=cli.positive_ints, default="1024,2048,4096,8192,16384", help="comma-separated n = m values"
    )
    ap.add_argument(
        "--densities",
        type=densities,
        default="0.001,0.01,0.1",
        help="comma-separated expected densities Σλ/(n·m), each in (0, 1]",
    )
    ap.add_argument(
        "--warmup-iters", type=cli.positive_int, default=1, help="untimed calls of each function first (at least 1)"
    )
    ap.add_argument("--repeats", type=cli.positive_int, default=5, help="timed calls per cell (median)")
    ap.add_argument(
        "--device", default="auto", type=cli.device_option, help="auto (CUDA when present), cpu, cuda or cuda:N"
    )
    ap.add_argument("--seed", type=cli.seed, default=0, help="seed of inputs and draws")
    ap.add_argument("--threads", type=cli.threads, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument(
        "--allocator",
        choices=["default", "keep"],
        default="keep",
        help="glibc's memory setting in this process (keep: freed memory stays in the process)",
    )
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall time, or the process's CPU time (with --threads 1: time other processes hold the "
        "core is not counted, for a shared machine)",
    )
    ap.add_argument(
        "--igraph",
        action="store_true",
        help="time igraph's C stochastic block model generator beside fastRG (needs python-igraph)",
    )
    ap.add_argument(
        "--out",
        metavar="DIR",
        default="runs/fastrg_bench",
        help="folder for fastrg_bench.json (the table's rows, slope and settings)",
    )
    args = ap.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu adds up the CPU time of every thread: use it with --threads 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.igraph and importlib.util.find_spec("igraph") is None:  # the table without igraph's columns
        print("igraph's columns left out: python-igraph is not installed (pip install igraph)", flush=True)
        args.igraph = False
    device = torch.device(scaling.device_or_exit(ap, args.device))
    allocator = "glibc defaults" if args.allocator == "default" or device.type == "cuda" else keep_freed_memory()

    load = scaling.load_average()
    rows, fitted = [], []  # logs of E, ms and ms above the fixed cost and the tables where E ≥ 1e5
    for n in args.lengths:
        g = torch.Generator(device).manual_seed(args.seed)
        X = torch.rand(n, K, device=device, generator=g)
        Y = torch.rand(n, K, device=device, generator=g)
        S0 = torch.rand(K, K, device=device, generator=g)
        base = float(fastrg.expected_edges(X, S0, Y))
        scaled = [S0 * (density * n * n / base) for density in args.densities]
        fns = [lambda: naive_draw(X, S0 * (0.01 * n * n / base), Y, g).shape[0]]
        # one expected edge: what a call costs before its edges (the O((n + m)K) checks and column sums, the K²
        # Poisson counts, the CDF rows of the columns drawn from); it runs twice, and the first call, right after
        # the naive draw's n·m buffers, is not reported: it pays for the cache they leave cold, which no fastRG call
        # reported here should. 8K expected edges: every CDF row is built
        fns += [
            lambda S=S: len(fastrg.sample(X, S, Y, generator=g, csr=True)[0])
            for S in [S0 / base, S0 / base, S0 * (8 * K / base), *scaled]
        ]
        if args.igraph:
            fns += [igraph_sbm(n, density, S0) for density in [1 / (n * n), *args.densities]]
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        timed = measure.interleaved(
            {str(k): lambda _, fn=fn: fn() for k, fn in enumerate(fns)}, device, args.repeats, args.warmup_iters, clock
        )
        times, outs = [t.median for t in timed.values()], [t.results[-1] for t in timed.values()]
        naive_ms, _, fixed_ms, tables_ms = times[:4]
        fast_ms, edges = times[4 : 4 + len(args.densities)], outs[4 : 4 + len(args.densities)]
        graph_ms = times[4 + len(args.densities) :] or [None] * (1 + len(args.densities))
        for density, ms, E, ig in zip(args.densities, fast_ms, edges, graph_ms[1:]):
            rows.append(
                [
                    n,
                    f"{density:.1%}",
                    E,
                    f"{ms:.1f}",
                    f"{naive_ms:.1f}",
                    f"{naive_ms / ms:.1f}",
                    f"{ms * 1e6 / max(E, 1):.0f}",
                    f"{fixed_ms:.1f}",
                    above_fixed(ms, fixed_ms, E),
                    f"{tables_ms:.1f}",
                ]
                + ([f"{ig:.1f}", f"{graph_ms[0]:.1f}", f"{ms / ig:.2f}"] if args.igraph else [])
            )
            if E >= 1e5:
                above = (max(ms - fixed_ms, 1e-6), max(ms - tables_ms, 1e-6))
                fitted.append([math.log(v) for v in (E, ms, *above)])
            print(
                f"  n={n} density={density:g}: {E} edges, fastRG {ms:.1f} ms, naive {naive_ms:.1f} ms"
                + (f", igraph {ig:.1f} ms" if args.igraph else ""),
                file=sys.stderr,
                flush=True,
            )

    end_load = scaling.load_average()
    print(
        f"fastRG vs naive dense Bernoulli, K = {K}, torch {torch.__version__}, device {device} "
        f"({os.cpu_count()} cores), {torch.get_num_threads()} threads, {args.clock} clock, allocator: {allocator}, "
        f"median of {args.repeats} after {args.warmup_iters} warm-up, calls interleaved; load average {load:.2f} at "
        f"start, {end_load:.2f} at end"
    )
    print("fastRG = sample(..., dedup=True, csr=True); naive = P = X S Yᵀ and rand < P (one cell per n)")
    print(
        "fixed ms: a call with one expected edge at that n (the O((n + m)K) checks and column sums and the K² "
        "Poisson counts that any draw costs); tables ms: a call with 8K expected edges (all (n + m)K CDF "
        "entries built); ns/edge above fixed: (fastRG − fixed) / edges, – where the edges take under a tenth "
        "of the call"
    )
    headers = [
        "n",
        "density",
        "edges",
        "fastRG ms",
        "naive ms",
        "speed-up",
        "ns/edge",
        "fixed ms",
        "ns/edge above fixed",
        "tables ms",
    ] + (["igraph ms", "igraph fixed ms", "fastRG/igraph"] if args.igraph else [])
    if args.igraph:
        print(
            "igraph ms: igraph.Graph.SBM, hard clusters of n/K nodes, the same expected edges; igraph fixed ms: "
            "one expected edge; fastRG/igraph: the ratio of the two times"
        )
    print(tabulate(rows, headers=headers, tablefmt="github", colalign=("right",) * len(headers)))
    log_edges, *log_ms = zip(*fitted) if len(fitted) >= 2 else [None] * 4
    slope, slope_above, slope_tables = (scaling.line_fit(log_edges, y)[1] if log_edges else None for y in log_ms)
    if slope is not None:
        print(
            f"log-log slope of fastRG time vs edges over {len(fitted)} cells with E >= 1e5: {slope:.2f} "
            f"(target 0.8-1.2); of the time above the fixed cost: {slope_above:.2f}; above the tables: "
            f"{slope_tables:.2f}"
        )
    else:
        print("log-log slope: fewer than 2 cells with E >= 1e5")
    path = cli.out_file(args.out, "fastrg_bench.json")
    keys = [
        "n",
        "density",
        "edges",
        "fastrg_ms",
        "naive_ms",
        "speed_up",
        "ns_per_edge",
        "fixed_ms",
        "ns_per_edge_above_fixed",
        "tables_ms",
    ] + (["igraph_ms", "igraph_fixed_ms", "fastrg_over_igraph"] if args.igraph else [])
    settings = {k: v for k, v in vars(args).items() if k != "out"}  # where it was written is no setting
    write_json(
        path,
        {
            "settings": {
                **settings,
                "device": str(device),
                "threads": torch.get_num_threads(),
                "allocator": allocator,
                "load_average": [load, end_load],
            },
            "rows": [dict(zip(keys, row)) for row in rows],
            "slope": slope,
            "slope_above_fixed": slope_above,
            "slope_above_tables": slope_tables,
        },
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
