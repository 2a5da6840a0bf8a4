"""SBM scaling: the attention core and the module at controlled densities, beside full attention.

    python -m experiments.sbm_scaling                        # n 1024..8192 × densities 1, 5, 25 %
    python -m experiments.sbm_scaling --threads 1 --rounds 3 # interleaved: fair on a busy CPU

Cells (--kinds), each in a fresh process as experiments.scaling's (training mode, non-causal):
- ``full``, ``full-ref``: experiments.scaling's, full attention (fused SDPA; materialised scores);
- ``core@d``: EdgeAttention on a uniform random CSR graph of density d, built in the timed region;
- ``sbm@d``: the SBMAttention module (regulariser off) at expected density d, δ included;
- ``sbm-dense@d``: the module's dense reference path, whose cost does not depend on d: the first d.
Per n, the tables printed say where SBM meets full attention, its memory per edge, its time's parts.
"""

import contextlib
import json
import statistics
import sys
import time
from unittest import mock

import torch
from tabulate import tabulate

from bench import cli, measure
from bench.files import write_json
from experiments import scaling
from experiments.scaling import line_fit
from bench.config import resolve_device

KINDS = ("full", "full-ref", "core", "sbm", "sbm-dense")
# The parts of the module's step: each the time inside one function of sbm_transformer (class, name)
# less the parts inside it. Memberships: Q̂, K̂ and K̂Ŝᵀ; proposal: the bounds and fastRG's draw.
PARTS = {
    "memberships": ("SBMAttention", "factors"),
    "block matrix": ("SBMAttention", "block_matrix"),
    "proposal": (None, "sample_edges"),
    "thinning": (None, "thin"),
    "CSR/CSC build": ("Edges", "key_major"),
    "p_e and STE": ("StraightThroughEdges", "apply"),
    "core": ("EdgeAttention", "apply"),
}


def random_graph(r: int, n: int, density: float, generator: torch.Generator):
    """R uniform random graphs with about density·n² distinct edges each, as the sampler gives them: one
    block-diagonal CSR (row_ptr (R·n + 1,), col (E,) global keys), int32."""
    draws = int(-n * n * torch.log1p(torch.tensor(-density)).item())  # E[distinct] = n²(1 − e^(−draws/n²))
    key = torch.randint(0, r * n * n, (r * draws,), generator=generator).unique()  # sorted (graph, i, j)
    row = key // n
    row_ptr = torch.zeros(r * n + 1, dtype=torch.int32)
    torch.cumsum(torch.bincount(row, minlength=r * n), 0, dtype=torch.int32, out=row_ptr[1:])
    return row_ptr, (row // n * n + key % n).int()


@contextlib.contextmanager
def labelled():
    """Each function of PARTS wrapped in a profiler label `sbm: PART` while inside; restored on exit."""
    import sbm_transformer

    def wrap(fn, part: str):
        def wrapper(*args, **kwargs):  # a method's self comes in args; Function.apply is called on its class
            with torch.profiler.record_function("sbm: " + part):
                return fn(*args, **kwargs)

        return wrapper

    with contextlib.ExitStack() as stack:
        for part, (owner, name) in PARTS.items():
            where = getattr(sbm_transformer, owner) if owner else sbm_transformer
            stack.enter_context(mock.patch.object(where, name, wrap(getattr(where, name), part)))
        yield


def profile_parts(step, steps: int) -> dict:
    """Milliseconds per call of `step` (SBMAttention's forward+backward) in each part (PARTS), by
    torch.profiler: an op is the innermost part label's it runs under, a backward op that of the
    forward op that made its autograd node; the rest is "other" (profiling adds µs an op)."""
    from torch.profiler import ProfilerActivity, profile

    with labelled(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.events()
    backward = "autograd::engine::evaluate_function: "

    def label(event):
        """The part of the innermost `sbm: ` label above event (itself included), or of its backward anchor."""
        while event is not None:
            if event.name.startswith("sbm: "):
                return event.name[len("sbm: ") :]
            if event.name.startswith(backward):
                return created.get(event.sequence_nr)
            event = event.cpu_parent
        return None

    def in_backward(event):
        while event is not None and not event.name.startswith(backward):
            event = event.cpu_parent
        return event is not None

    created = {}  # sequence number of a forward op → its part
    for event in events:
        if event.sequence_nr >= 0 and event.sequence_nr not in created and not in_backward(event):
            created[event.sequence_nr] = label(event)
    totals = dict.fromkeys((*PARTS, "other"), 0.0)
    for event in events:
        totals[label(event) or "other"] += event.self_cpu_time_total / 1e3 / steps
    return totals


def measure_cell(cell: dict) -> dict:
    """Runs in the child process: builds one cell and measures it."""
    import sbm_transformer

    torch.manual_seed(0)
    device = torch.device(cell["device"])
    b, h, d, n = cell["batch"], cell["heads"], cell["head_dim"], cell["n"]
    generator = torch.Generator(device).manual_seed(0)
    if cell["kind"] == "core":
        row_ptr, col = random_graph(b * h, n, cell["density"], torch.Generator().manual_seed(0))
        row_ptr, col = row_ptr.to(device), col.to(device)
        q, k, v = (torch.randn(b * h * n, d, device=device, requires_grad=True) for _ in range(3))
        p = torch.rand(len(col), device=device, requires_grad=True)
        grad = torch.randn(b * h * n, d, device=device)

        def run(backward: bool):
            edges = sbm_transformer.Edges.from_csr(row_ptr, col, b * h, n, n)
            y = sbm_transformer.EdgeAttention.apply(q, k, v, p, edges, None, 0.0, "paper")
            if backward:
                y.backward(grad)
            return edges.E / (b * h * n * n)
    else:
        x = torch.randn(b, n, h * d, device=device, requires_grad=True)
        module = scaling.shifted_module(
            h * d, h, d, x, cell["density"], "reference" if cell["kind"] == "sbm-dense" else "fast"
        )
        grad = torch.randn(b, n, h * d, device=device)

        def run(backward: bool):
            y, stats = module(x, generator=generator)
            if backward:
                y.backward(grad)
            return stats["density"].float().mean().item()

    def forward():
        with torch.no_grad():
            return run(False)

    run(True)  # one-time lazy allocations (thread pools, kernels) are not the cell's
    result = scaling.costs(forward, lambda: run(True), device, cell["warmup"], cell["repeats"])
    result["density"] = forward()
    if cell["kind"] == "sbm":
        result["parts_ms"] = profile_parts(lambda: run(True), cell["repeats"])
        # The unit of the floor: one elementwise pass over the graph's E float32 values (two read, one written).
        a, c = (torch.rand(max(1, round(result["density"] * b * h * n * n)), device=device) for _ in range(2))
        result["pass_ms"] = measure.time_fn(lambda: torch.add(a, c), device, 1, max(5, cell["repeats"]))
    return result


def run_cell(cell: dict, allocator: str, timeout: int) -> dict:
    if cell["kind"] == "full":
        return scaling.run_cell({**cell, "causal": False}, allocator, timeout)
    return scaling.run_cell(cell, allocator, timeout, module="experiments.sbm_scaling")


def crossover(rows: list, key: str, reference) -> str:
    """The density at which a least-squares line through the rows' (density, key) meets the
    reference's: "none" if it only would below 0, "> 100%" above 1, "–" without a fit."""
    if len(rows) < 2 or reference is None:
        return "–"
    intercept, slope = line_fit([r["density"] for r in rows], [float(r[key]) for r in rows])
    if slope <= 0:
        return "–"
    density = (reference[key] - intercept) / slope
    return "none" if density < 0 else "> 100%" if density > 1 else f"{density:.2%}"


def summary(rows: list) -> list:
    """Per n, core and module crossovers: time against fused SDPA's, memory the explicit path's."""
    out = []
    for n in sorted({r["n"] for r in rows}):
        cells = {r["method"]: r for r in rows if r["n"] == n and "error" not in r}
        mine = {k: [r for m, r in cells.items() if m.startswith(k + "@")] for k in ("core", "sbm")}
        out.append(
            [
                n,
                *(
                    crossover(mine[k], key, cells.get(ref))
                    for k in ("core", "sbm")
                    for key, ref in (("fwdbwd_ms", "full"), ("peak_bytes", "full-ref"))
                ),
            ]
        )
    return out


def memory_fit(rows: list, densities: list, batch: int, heads: int) -> list:
    """Per n, the module's peak memory as a + b·E per round (median [range]) beside full's."""

    def spread(values, unit):
        return f"{statistics.median(values) / unit:.1f} [{min(values) / unit:.1f}, {max(values) / unit:.1f}]"

    out = []
    for n in sorted({r["n"] for r in rows}):
        cells = {r["method"]: r for r in rows if r["n"] == n and "error" not in r}
        sbm = [cells.get(f"sbm@{d:g}") for d in densities]
        if sum(r is not None for r in sbm) < 2:
            continue
        done = [r for r in sbm if r is not None]
        edges = [r["density"] * batch * heads * n * n for r in done]
        fits = [line_fit(edges, peaks) for peaks in zip(*(r["peak_rounds"] for r in done))]  # a fit a round
        tensor_fits = [line_fit(edges, peaks) for peaks in zip(*(r["tensor_peak_rounds"] for r in done))]
        full, ref = (cells[name]["peak_bytes"] if name in cells else None for name in ("full", "full-ref"))
        full_tensors = cells["full"]["tensor_peak_bytes"] if "full" in cells else None
        line = [
            n,
            spread([a for a, _ in fits], 2**20),
            spread([b for _, b in fits], 1),
            spread([a for a, _ in tensor_fits], 2**20),
            spread([b for _, b in tensor_fits], 1),
            f"{full / 2**20:.1f}" if full else "–",
            f"{full_tensors / 2**20:.1f}" if full_tensors else "–",
            f"{ref / 2**20:.1f}" if ref else "–",
        ]
        for r in sbm:
            ratios = " / ".join(f"{r['peak_bytes'] / base:.2f}" if base else "–" for base in (full, ref)) if r else ""
            line.append(f"{r['peak_bytes'] / 2**20:.1f} ({ratios})" if r else "–")
        out.append(line)
    return out


def median_row(runs: list) -> dict:
    """One cell's rounds → each figure's median, beside every round's peak memory (memory_fit's)."""
    done = [r for r in runs if "error" not in r]
    if not done:
        return runs[-1]
    row = dict(
        done[0], peak_rounds=[r["peak_bytes"] for r in done], tensor_peak_rounds=[r["tensor_peak_bytes"] for r in done]
    )
    for key in ("fwd_ms", "fwdbwd_ms", "peak_bytes", "tensor_peak_bytes", "pass_ms"):
        if key in row:
            row[key] = statistics.median(r[key] for r in done)
    if "parts_ms" in row:
        row["parts_ms"] = {part: statistics.median(r["parts_ms"][part] for r in done) for part in row["parts_ms"]}
    return row


def parts_table(rows: list, profiled: list) -> str:
    names = (*PARTS, "other")
    core = {
        (r["n"], r["method"].split("@")[1]): r["fwdbwd_ms"]
        for r in rows
        if r["method"].startswith("core@") and "error" not in r
    }
    out = []
    for r in profiled:
        parts = r["parts_ms"]
        core_ms = core.get((r["n"], r["method"].split("@")[1]))
        sampler = (parts["proposal"] + parts["thinning"]) / sum(parts.values())  # share of the step
        row = [r["n"], f"{r['density']:.2%}"] + [f"{parts[name]:.1f}" for name in names]
        row += [
            f"{sum(parts.values()):.1f}",
            f"{r['fwdbwd_ms']:.1f}",
            f"{core_ms:.1f}" if core_ms else "–",
            f"{r['fwdbwd_ms'] / core_ms:.2f}" if core_ms else "–",
            f"{r['fwdbwd_ms'] * (1 - sampler) / core_ms:.2f}" if core_ms else "–",
        ]
        if "pass_ms" in r:
            row += [f"{r['pass_ms']:.3f}", f"{r['fwdbwd_ms'] * sampler / r['pass_ms']:.0f}"]
        out.append(row)
    headers = ["n", "density"] + list(names) + ["sum", "step", "core cell", "step ÷ core", "without sampler ÷ core"]
    if all("pass_ms" in r for r in profiled):
        headers += ["E-pass ms", "sampler in E-passes"]
    return tabulate(out, headers=headers, tablefmt="github", disable_numparse=True)


def main(argv=None) -> int:
    p = cli.parser("python -m experiments.sbm_scaling", __doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument(
        "--lengths", type=cli.positive_ints, default="1024,2048,4096,8192", help="comma-separated sequence lengths"
    )
    p.add_argument("--densities", default="0.01,0.05,0.25", help="comma-separated densities per head")
    p.add_argument("--kinds", default="full,full-ref,core,sbm,sbm-dense", help="which cells (see the docstring)")
    p.add_argument(
        "--rounds",
        type=cli.positive_int,
        default=1,
        help="measure every cell this many times, cells interleaved round by round; report the medians",
    )
    scaling.add_measurement_arguments(p, warmup_iters=1, repeats=3, timeout=1800, out="runs/sbm_scaling")
    args = p.parse_args(argv)
    if args.cell:
        print(json.dumps(measure_cell(json.loads(args.cell))))
        return 0
    try:
        densities = [float(v) for v in args.densities.split(",") if v]
        kinds = [v for v in args.kinds.split(",") if v]
        if not densities or not all(0 < v < 1 for v in densities):
            raise ValueError(f"--densities must be comma-separated densities in (0, 1), got {args.densities!r}")
        if set(kinds) - set(KINDS):
            raise ValueError(f"unknown kinds {sorted(set(kinds) - set(KINDS))}; choose from {KINDS}")
        device = str(resolve_device(args.device))
    except ValueError as exc:
        p.error(str(exc))
    if args.threads:
        torch.set_num_threads(args.threads)  # the cells' count, as the table's conditions say
    load, started = scaling.load_average(), time.time()
    base = {
        "batch": args.batch_size,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "device": device,
        "warmup": args.warmup_iters,
        "repeats": args.repeats,
        "threads": args.threads,
    }
    named = [(kind, kind, None) for kind in kinds if kind in ("full", "full-ref")]
    named += [(f"{k}@{d:g}", k, d) for k in kinds if k in ("core", "sbm") for d in densities]
    named += [(f"sbm-dense@{densities[0]:g}", "sbm-dense", densities[0])] * ("sbm-dense" in kinds)
    cells = [
        (
            name,
            n,
            {
                **base,
                "n": n,
                "kind": "full" if d is None else kind,
                "density": d,
                "method": kind if d is None else None,
            },
        )
        for n in args.lengths
        for name, kind, d in named
    ]
    measured = [[] for _ in cells]
    for round_ in range(args.rounds):  # every round measures every cell once: load falls on all cells alike
        for (name, n, cell), runs in zip(cells, measured):
            runs.append(run_cell(cell, args.allocator, args.timeout))
            print(f"measured {name} n={n} (round {round_ + 1})", file=sys.stderr, flush=True)
    rows = [{**median_row(runs), "method": name, "n": n} for (name, n, _), runs in zip(cells, measured)]
    where, allocator = scaling.describe(device, args.allocator)
    end_load = scaling.load_average()
    print(
        f"SBM-Transformer scaling — {where}, torch {torch.__version__}; batch {args.batch_size}, {args.heads} heads, "
        f"head dim {args.head_dim}, training mode; allocator: {allocator}; median of {args.repeats} after "
        f"{args.warmup_iters} warm-up"
        + (f", then the median over {args.rounds} interleaved rounds" if args.rounds > 1 else "")
        + f"; load average {load:.2f} at start, {end_load:.2f} at end; {time.time() - started:.0f} s.\n"
    )
    print(scaling.table(rows, "full"))
    print(
        "\nCrossover densities (least squares over the measured densities): SBM fwd+bwd time = fused SDPA's; "
        'peak memory = the reference path\'s ("none": above it at every density; "> 100%": below it up to '
        "full density).\n"
    )
    print(
        tabulate(
            summary(rows),
            headers=["n", "core: time", "core: memory", "module: time", "module: memory"],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    fits = memory_fit(rows, densities, args.batch_size, args.heads)
    if fits:
        print(
            f"\nThe module's peak memory = a + b·E over its densities (least squares, E = density · {args.batch_size}"
            f" · {args.heads} · n² edges drawn; each round fitted apart: the median [range over rounds]), beside "
            "fused SDPA and the explicit path; per density its peak in MiB (÷ fused SDPA / ÷ explicit). "
            '"Tensors": the same fit of the bytes tensors hold at the peak (torch.profiler\'s allocations on '
            "CPU, as CUDA's max_memory_allocated counts them); the peak RSS adds what the heap keeps beside "
            "them.\n"
        )
        print(
            tabulate(
                fits,
                headers=[
                    "n",
                    "a MiB",
                    "b bytes/edge",
                    "a MiB (tensors)",
                    "b bytes/edge (tensors)",
                    "fused SDPA MiB",
                    "fused SDPA MiB (tensors)",
                    "explicit MiB",
                ]
                + [f"sbm@{d:g}" for d in densities],
                tablefmt="github",
                disable_numparse=True,
            )
        )
    profiled = [r for r in rows if "parts_ms" in r]
    if profiled:
        print(
            "\nWhere the module's fwd+bwd time goes (torch.profiler, ms per step; `other`: projections and glue; "
            "`step`: the unprofiled fwd+bwd median above; `core cell`: EdgeAttention alone on a graph of that "
            "density; `without sampler`: the step less its proposal and thinning share, a floor for any "
            "sampler; `E-pass`: one elementwise pass over the graph's E values, and the sampler's time in "
            "such passes).\n"
        )
        print(parts_table(rows, profiled))
    path = cli.out_file(args.out, "sbm_scaling.json")
    write_json(
        path,
        {
            "device": where,
            "allocator": allocator,
            "load_average": [load, end_load],
            "args": {**vars(args), "lengths": ",".join(map(str, args.lengths))},
            "rows": rows,
        },
    )
    print(f"wrote {path}", file=sys.stderr, flush=True)
    return scaling.exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
