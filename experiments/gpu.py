"""The GPU job: every method on CUDA in one command, within a time budget, into compact records.

    python -m experiments.gpu                               # a CUDA machine: ~7 minutes
    python -m experiments.gpu --budget 300 --stages scaling # some stages, a shorter budget
    python -m experiments.gpu --device cpu --tiny --out DIR # every stage at toy sizes (CI)

The stages, in order; each starts while budget remains, and stops at its next run once it is spent:
1. ``correctness``: ``pytest -m on_device`` (reference and fast paths agree; the contract, fuzzed);
2. ``entry``: each method's own training command on ListOps at 2,048 tokens, batch 128, 100 steps
   (SBM 10): step time, peak memory and density as metrics.json records them;
3. ``scaling``: each attention's forward+backward time and peak memory from 1K to 16K tokens beside
   full attention (SDPA, float32 and under bf16 autocast; each row says its precision), SBM at 1, 5 and 26%
   density, and the length from which each is faster than float32 SDPA;
4. ``frontier``: recall at 1,024 tokens (64 pairs), 1,500 steps under bf16 autocast, seed 0, for full attention and
   each family at 12.5% of the pairs, SBM on the path the scaling stage timed faster: accuracy against computed
   pairs and measured step time. Resumable: each run keeps its folder under OUT/frontier, and a job whose budget
   ends mid-run continues it the next time.
Records: OUT/gpu.json, OUT/README.md, OUT/correctness.log, a folder per device (a table never mixes
devices); a job of some --stages keeps the others' records of its device.
"""

import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import cli
from bench.files import default_data_dir, read_json, write_json
from experiments import grid, scaling
from experiments.claims import matched_cost

STAGES = ("correctness", "entry", "scaling", "frontier")
# full-bf16: SDPA under bf16 autocast, the FlashAttention class, beside float32's kernel; sbm@D: SBM at density D set
# through its memberships (sbm_transformer.at_density); /tile: its tile path (sbm_tile.py), the same cost at any density
SCALING_METHODS = tuple(
    "full full-bf16 full-ref sbm sbm@0.01 sbm@0.05 sbm@0.26 sbm@0.01/tile sbm@0.26/tile ssa kernel window bigbird "
    "reformer performer linformer nystromformer linear".split()
)
# method → its own training command; SBM first, a stage cut short losing the last, on 10 steps (0.2-0.4 s a step at
# this size on an H200, 10-20× full attention's), on its tile path (Triton), its fast path (linear in its edges) and
# its reference path
ENTRY = {
    "sbm (tile path)": ["sbm_transformer.py", "--path", "tile"],
    "sbm": ["sbm_transformer.py", "--path", "fast"],
    "sbm (reference path)": ["sbm_transformer.py"],
    **{
        m: ["-m", "bench.train", "--method", m]
        for m in ("full", "window", "bigbird", "reformer", "performer", "linformer", "nystromformer", "linear")
    },
    "ssa": ["ssa.py"],
    "kernel": ["kernel_sparse.py"],
}
FEW_STEPS = dict.fromkeys(("sbm", "sbm (reference path)", "sbm (tile path)"), "--steps 10 --eval-every 10".split())
RUN = {  # an entry point's run options, per --tiny or not
    "full": "--steps 100 --eval-every 100 --eval-batches 2 --final-eval-batches 2".split(),
    "tiny": (
        "--seq-len 32 --batch-size 4 --warmup 1 --steps 2 --eval-every 2 --eval-batches 1 --final-eval-batches 1"
    ).split(),
}
TASK = {"full": ["--task", "listops", "--preset", "paper"], "tiny": ["--task", "duplicates"]}
KERNEL_TASK = ["--task", "wikitext2", "--analysis-sequences", "8", "--predictor-steps", "20", "--finetune-steps", "10"]
SCALING_LENGTHS = {"full": (1024, 2048, 4096, 8192, 16384), "tiny": (64,)}
SLOW_CELL = 30  # seconds: a method whose next length would take longer (4× its last cell's) stops there
FRONTIER = {  # size → recall's length, steps and evaluation; the model is the matched-cost claim's
    "full": dict(seq_len=1024, steps=1500, eval_every=250, eval_batches=4, final_eval_batches=8),
    "tiny": dict(seq_len=32, steps=2, eval_every=2, eval_batches=1, final_eval_batches=1, batch_size=4, warmup=1),
}


def slug(text: str) -> str:
    """A folder name for TEXT: lower case, each run of other characters one hyphen."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def frontier_settings(n: int, sbm_path: str = "fast") -> dict:
    """label → (entry point, its options): full attention, and each family at 12.5% of the pairs at length n (a
    Reformer round scores 2C keys, a routed query its own block and one more, a full head is 1/8 of the heads);
    SBM learns its own density, on ``sbm_path``."""
    c = n // 16
    train = lambda method: ["-m", "bench.train", "--method", method]  # noqa: E731
    return {
        "full": (train("full"), {}),
        "window": (train("window"), {"attn": ["density=0.125"]}),
        "head allocation (1 of 8 full)": (train("window"), {"attn": ["full_heads=1", "density=0.01"]}),
        "reformer": (train("reformer"), {"attn": ["n_hashes=1", f"bucket_size={c}"]}),
        "block router": (train("moba"), {"attn": [f"block={c}", "topk=1"]}),
        "hybrid: 7 window heads, 1 reformer head": (
            train("hybrid"),
            {"attn": ["adaptive=reformer", "density=0.125", f"budget=n_hashes=1;bucket_size={c}"]},
        ),
        f"sbm ({sbm_path} path)": (["sbm_transformer.py", "--path", sbm_path], {}),
    }


def fastest_sbm_path(scaling: list, n: int, out: Path) -> str:
    """SBM's path in the frontier: the one its run started on, else the one the scaling stage timed faster at the
    density SBM starts from (26%), at length n where measured, else at the shortest length measured. Chosen before
    training: a tile costs the same at any density, the edge path more as SBM's learned density rises."""
    for path in ("tile", "fast"):
        if any((out / "frontier" / slug(f"sbm ({path} path)") / f).exists() for f in ("checkpoint.pt", "metrics.json")):
            return path
    timed = [r for r in scaling if r["method"] in ("sbm", "sbm@0.26/tile") and "error" not in r]
    at = n if any(r["n"] == n for r in timed) else min((r["n"] for r in timed), default=n)
    ms = {r["method"]: r["fwdbwd_ms"] for r in timed if r["n"] == at}
    return "tile" if ms.get("sbm@0.26/tile", math.inf) < ms.get("sbm", math.inf) else "fast"


FUZZ_CASES = {"full": 10, "tiny": 1}
SHARE = {"correctness": 0.15, "entry": 0.5, "scaling": 0.25}  # a stage's most: part of the budget (H200: 43, 198, 46 s)


def left(deadline: float) -> float:
    """Seconds until ``deadline`` (time.monotonic's clock): what is left of a budget."""
    return deadline - time.monotonic()


def run(argv, deadline: float, env=None, cap: float = 600) -> dict:
    """``python ARGV`` stopped at ``deadline`` (or after `cap` s): exit code, seconds and output."""
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, *argv],
            cwd=grid.ROOT,
            capture_output=True,
            text=True,
            env=env,
            timeout=max(1.0, min(cap, left(deadline))),
        )
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""  # str in text mode, but bytes on some Pythons
        code, output = "timed out", out.decode(errors="replace") if isinstance(out, bytes) else out
    return {"code": code, "seconds": round(time.monotonic() - start, 1), "output": output}


# ------------------------------------------------------------------------------------------------ the stages
def correctness(device: str, size: str, deadline: float, out: Path) -> list:
    cases = str(FUZZ_CASES[size])
    selection = ["-m", "on_device"] + (["-k", "contract and (sbm or full)"] if size == "tiny" else [])
    env = dict(os.environ, SPARSE_ATTN_TEST_DEVICE=device, SPARSE_ATTN_FUZZ_CASES=cases)
    result = run(["-m", "pytest", "-q", "-p", "no:randomly", *selection], deadline, env)
    (out / "correctness.log").write_text(result["output"])
    summary = next(
        (line for line in reversed(result["output"].splitlines()) if re.search(r"passed|failed|error", line)),
        "no summary",
    )
    return [
        {
            "tests": "pytest -m on_device",
            "cases per variant": cases,
            "code": result["code"],
            "seconds": result["seconds"],
            "summary": summary.strip("= "),
        }
    ]


def entry_points(device: str, size: str, deadline: float, scratch: Path) -> list:
    rows = []
    for name, command in ENTRY.items():
        if left(deadline) < 10 or (name == "kernel" and not (default_data_dir() / "wikitext-2").is_dir()):
            rows.append(
                {
                    "method": name,
                    "status": "not run: "
                    + ("budget spent" if left(deadline) < 10 else f"no WikiText-2 in {default_data_dir()}"),
                }
            )
            continue
        folder = scratch / re.sub(r"\W+", "-", name)
        task = KERNEL_TASK if name == "kernel" else TASK[size]
        steps = FEW_STEPS.get(name, []) if size == "full" else []
        argv = [*command, *task, *RUN[size], *steps, "--device", device]
        result = run([*argv, "--out", str(folder), "--overwrite"], deadline, cap=150)
        record = read_json(folder / "metrics.json") or {}
        row = {
            "method": name,
            "command": " ".join(["python", *command]),
            "argv": " ".join(["python", *argv]),
            "code": result["code"],
            "seconds": result["seconds"],
        }
        if record.get("status") == "complete":
            row.update(
                {
                    key: record.get(key)
                    for key in (
                        "task",
                        "steps",
                        "median_step_ms",
                        "peak_memory_bytes",
                        "density",
                        "test",
                        "metric",
                        "device",
                    )
                }
            )
            row["config"] = {k: record["config"].get(k) for k in ("seq_len", "batch_size", "dim", "depth", "heads")}
        else:
            said = (result["output"].strip().splitlines() or ["no output"])[-1][:300]
            row["status"] = "failed: " + ("timed out" if result["code"] == "timed out" else said)
        rows.append(row)
    return rows


def scaling_rows(device: str, size: str, deadline: float) -> list:
    import torch

    rows, stopped = [], {}
    for n in SCALING_LENGTHS[size]:
        for method in SCALING_METHODS:
            row = {"method": method, "n": n}
            if method in stopped or left(deadline) < 5:
                rows.append({**row, "error": stopped.get(method, "not run: budget spent")})
                continue
            bf16 = method == "full-bf16"
            row["precision"] = "bfloat16 autocast" if bf16 else "float32"
            name, _, path = method.partition("/")  # "sbm@D/tile": SBM at density D on its tile path
            cell = {
                "method": "full" if bf16 else name,
                "options": {"path": path} if path else {},
                "n": n,
                "batch": 4,
                "heads": 4,
                "head_dim": 64,
                "causal": False,
                "device": device,
                # at toy sizes the job checks that every cell runs, not its time: the tile path in triton's
                # interpreter takes ~5 s a forward+backward on the CPU
                "warmup": 3 if size == "full" else 1,
                "repeats": 10 if size == "full" else 2,
            }
            start = time.monotonic()
            try:
                with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
                    row.update(scaling.measure_cell(cell))
            except torch.OutOfMemoryError:
                row["error"] = stopped[method] = f"out of memory at {n}"
            except Exception as exc:  # a failing cell is a row of the table, not the end of the job
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            if 4 * (time.monotonic() - start) > SLOW_CELL and method not in stopped:
                stopped[method] = f"not run: its cell at {n} took {time.monotonic() - start:.0f} s"
            rows.append(row)
    return rows


def crossovers(rows: list) -> list:
    """Per method: the first length from which it beats full attention (float32) at each longer one run."""
    full = {r["n"]: r["fwdbwd_ms"] for r in rows if r["method"] == "full" and "error" not in r}
    result = []
    for method in dict.fromkeys(r["method"] for r in rows if r["method"] != "full"):
        faster = [
            (r["n"], r["fwdbwd_ms"] < full[r["n"]])
            for r in rows
            if r["method"] == method and "error" not in r and r["n"] in full
        ]
        first = next((n for i, (n, _) in enumerate(faster) if all(f for _, f in faster[i:])), None)
        result.append({"method": method, "faster than full from": first, "lengths measured": len(faster)})
    return result


def frontier_rows(device: str, size: str, deadline: float, out: Path, scaling: list = ()) -> list:
    """Each setting's run in OUT/frontier/SLUG: its record where complete, else run (or resumed) until the deadline;
    SBM on the path ``scaling`` (the scaling stage's rows) timed faster."""
    recipe = {**matched_cost.MODEL, "lr": "1e-3", **FRONTIER[size]}
    n, rows = recipe["seq_len"], []
    for label, (entry, options) in frontier_settings(n, fastest_sbm_path(scaling, n, out)).items():
        folder = out / "frontier" / slug(label)
        record = read_json(folder / "metrics.json") or {}
        result = {"code": 0}
        if record.get("status") != "complete" and left(deadline) >= 20:
            again = "--resume" if (folder / "checkpoint.pt").exists() else "--overwrite"
            argv = [*entry, "--task", "recall", "--device", device, *grid.flags({**recipe, **options})]
            result = run([*argv, "--out", str(folder), again], deadline, cap=3600)
            record = read_json(folder / "metrics.json") or {}
        done = record.get("status") == "complete"
        rows.append(
            {
                "setting": label,
                "n": n,
                "code": None if result["code"] == "timed out" else result["code"],  # cut at the deadline: resumable
                "status": "complete" if done else "not run: budget spent" if "seconds" not in result else "resumable",
                **{k: record.get(k) for k in ("test", "computed_pairs", "density", "median_step_ms")},
            }
        )
    return rows


# ------------------------------------------------------------------------------------------------ the records
def markdown(record: dict) -> str:
    from tabulate import tabulate

    def table(rows, columns):
        return tabulate([[r.get(c, "") for c in columns] for r in rows], headers=columns, tablefmt="github")

    parts = [
        f"# The GPU job on {record['device']}\n",
        f"torch {record['torch']}, Python {record['python']}, "
        f"budget {record['budget_s']} s, size {record['size']}; `{record['command']}`\n",
        table([{"stage": k, **v} for k, v in record["stages"].items()], ["stage", "status", "seconds", "date"]),
    ]
    stages = record["stages"]
    if stages.get("correctness", {}).get("rows"):
        parts.append(table(stages["correctness"]["rows"], ["tests", "cases per variant", "code", "seconds", "summary"]))
    if stages.get("entry", {}).get("rows"):
        rows = [
            {
                **r,
                "peak MiB": f"{r['peak_memory_bytes'] / 2**20:.0f}" if r.get("peak_memory_bytes") else "",
                "step ms": f"{r['median_step_ms']:.1f}" if r.get("median_step_ms") else "",
                "density": f"{r['density']:.4f}" if r.get("density") is not None else "",
            }
            for r in stages["entry"]["rows"]
        ]
        parts.append(
            "Each method's own entry point (one short timing run each):\n\n"
            + table(
                rows,
                ["method", "command", "task", "step ms", "peak MiB", "density", "test", "metric", "seconds", "status"],
            )
        )
    if stages.get("scaling", {}).get("rows"):
        rows = stages["scaling"]["rows"]
        shown = [{**r, "method": f"{r['method']} ({r['precision']})"} if "precision" in r else r for r in rows]
        parts.append(
            "Scaling: batch 4, 4 heads, head dim 64, non-causal; ratios to full (SDPA):\n\n"
            + scaling.table(shown, "full (float32)" if "precision" in rows[0] else "full")
        )
        parts.append(table(crossovers(rows), ["method", "faster than full from", "lengths measured"]))
    if stages.get("frontier", {}).get("rows"):
        rows = stages["frontier"]["rows"]
        if "computed_pairs" in rows[0]:
            columns = ["setting", "n", "test", "computed_pairs", "density", "median_step_ms", "status"]
            parts.append("Recall at matched pairs (seed 0):\n\n" + table(rows, columns))
        else:  # the earlier stage's records: duplicates at 512 tokens, the families of results/frontier-2-heads
            parts.append(table(rows, ["n", "family", "setting", "test", "density", "median_step_ms", "code"]))
    return "\n\n".join(parts) + "\n"


def stage_status(rows: list) -> str:
    """ "ok", or how many of the stage's rows failed and how many the budget left out."""
    skipped = sum("not run" in str(r.get("status", r.get("error", ""))) for r in rows)
    failed = sum(
        r.get("code", 0) not in (0, None)
        or str(r.get("status", "")).startswith("failed")
        or (r.get("error") is not None and not r["error"].startswith(("out of memory", "not run")))
        for r in rows
    )
    said = [f"{failed} of {len(rows)} failed"] * bool(failed) + [f"{skipped} not run"] * bool(skipped)
    return "; ".join(said) or "ok"


def build_parser():
    p = cli.parser("python -m experiments.gpu", __doc__.splitlines()[0], epilog=__doc__[__doc__.index("The stages") :])
    p.add_argument("--device", default="cuda", type=cli.device_option, help="cuda, cuda:N, or cpu (with --tiny)")
    p.add_argument("--budget", type=cli.positive_int, default=420, help="seconds of compute for all stages")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    p.add_argument("--tiny", action="store_true", help="toy sizes: checks that every stage runs, measures nothing")
    p.add_argument("--out", metavar="DIR", type=cli.out_folder, help="records folder (default: results/gpu/DEVICE)")
    p.add_argument("--render", metavar="DIR", help="only rewrite DIR/README.md from DIR/gpu.json; runs nothing")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.render:
        record = read_json(Path(args.render) / "gpu.json") or p.error(f"--render {args.render}: no readable gpu.json")
        (Path(args.render) / "README.md").write_text(markdown(record))
        return 0
    if args.device == "cpu":  # SBM's tile path in triton's interpreter, which triton reads when it is first imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    stages = [s for s in args.stages.split(",") if s]
    if not stages or set(stages) - set(STAGES):
        p.error(f"--stages takes a comma-separated list of {', '.join(STAGES)}, got {args.stages!r}")
    device = scaling.device_or_exit(p, args.device)
    import torch

    if device == "cpu" and not args.tiny:
        p.error("--device cpu measures nothing a GPU would: add --tiny (the job's own check)")
    size = "tiny" if args.tiny else "full"
    name = torch.cuda.get_device_name(device) if device != "cpu" else "cpu"
    out = Path(args.out or grid.ROOT / "results" / "gpu" / slug(name))
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    record = {
        "device": name,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "budget_s": args.budget,
        "size": size,
        "command": "python -m experiments.gpu " + " ".join(argv if argv is not None else sys.argv[1:]),
        "stages": {},
    }
    earlier = read_json(out / "gpu.json") or {}
    if earlier.get("device") == record["device"] and earlier.get("size") == size:  # stages not run now are kept
        record["stages"] = {k: v for k, v in earlier["stages"].items() if k not in stages and "rows" in v}
    with tempfile.TemporaryDirectory(prefix="gpu-job-") as scratch:
        for stage in stages:
            if left(deadline) < 10:
                record["stages"][stage] = {"status": "skipped: budget spent", "seconds": 0}
                continue
            parts = sum(SHARE.get(s, 0) for s in stages)
            last = stage == stages[-1] or stage == "frontier"  # the last stage and the frontier take what is left
            start = time.monotonic()  # the stage's deadline: its share, or the job's if sooner
            share = deadline if last else min(deadline, start + SHARE[stage] / parts * args.budget)
            print(f"stage {stage} ({left(deadline):.0f} s of budget left)", flush=True)
            rows = {
                "correctness": lambda: correctness(device, size, share, out),
                "entry": lambda: entry_points(device, size, share, Path(scratch)),
                "scaling": lambda: scaling_rows(device, size, share),
                "frontier": lambda: frontier_rows(
                    device, size, share, out, record["stages"].get("scaling", {}).get("rows", [])
                ),
            }[stage]()
            record["stages"][stage] = {
                "status": stage_status(rows),
                "torch": torch.__version__,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "seconds": round(time.monotonic() - start, 1),
                "rows": rows,
            }
            write_json(out / "gpu.json", record)  # after each stage: a job stopped later keeps what it measured
    (out / "README.md").write_text(markdown(record))
    print(markdown(record))
    print(f"wrote {out}/gpu.json, README.md", file=sys.stderr)
    return int(any("failed" in s["status"] for s in record["stages"].values()))


if __name__ == "__main__":
    sys.exit(main())
