"""The SSA paper's Table 1 and Fig. 7 on one task, measured in one run: dense S0 beside the SSA settings.

    python -m experiments.ssa_table                                   # bytes (WikiText-2 text), length 1024
    python -m experiments.ssa_table --steps 600 --out runs/ssa_table  # other options go to every setting's run

Settings (the paper's names, §4 and Table 8; SSA on every layer, σ ramped 0.1 → 0.225 × length):
    S0        dense attention                       ssa.py --ssa-layers 0
    S-L2      locally biased SSA, 2 windows         ssa.py --windows 2
    S-L4      locally biased SSA, 4 windows         ssa.py --windows 4 (+ the self-ensembling curve)
    S-L4+FT   S-L4, dense for the last 10 % (§3.4)  ssa.py --windows 4 --finetune-fraction 0.1
    S-U75     unbiased SSA keeping 25 % of sources  ssa.py --unbiased 0.25 (L4's budget; Table 8)
Each setting trains in its own process, one after another, on the same model, data and budget; a
complete one is kept. S-L4+FT is S-L4 (every draw of step t is seeded by t) until its dense tail.
App. B.1's ALiBi decoder at the CPU preset's width, with its schedule: after warm-up the rate falls
linearly to half its peak, so the +FT tail (§3.4: "the schedule simply continues") trains at half of
it. Columns ÷ S0's as in Table 1; bits per byte of the dense ("renormalised", §3.4) evaluation.
"""

import contextlib
import io
import subprocess
import sys
from pathlib import Path

from tabulate import tabulate

from bench import cli
from bench.files import default_data_dir, read_json, write_atomic, write_json
from experiments import scaling
from experiments.grid import ROOT, die_with_parent

FT_FRACTION = 0.1  # §3.4: "the last 10% of the training epochs"
SETTINGS = {
    "S0": ["--ssa-layers", "0"],
    "S-L2": ["--windows", "2"],
    "S-L4": ["--windows", "4"],
    "S-L4+FT": ["--windows", "4", "--finetune-fraction", str(FT_FRACTION)],
    "S-U75": ["--unbiased", "0.25"],
}
PAPER_SCHEDULE = ["--lr-decay", "linear", "--lr-floor", "0.5"]  # App. B.1; options given later override it
ENSEMBLED = "S-L4"


def run_setting(folder: Path, name: str, common: list, ensemble: int) -> dict:
    """Runs one setting in its own process (or skips it if complete)."""
    done = read_json(folder / "metrics.json") or {}
    if done.get("status") == "complete":
        print(f"{name}: complete, skipped", flush=True)
        return done
    folder.mkdir(parents=True, exist_ok=True)
    extra = ["--ensemble-samples", str(ensemble)] if name == ENSEMBLED and ensemble else []
    cmd = [
        sys.executable,
        str(ROOT / "ssa.py"),
        *common,
        *SETTINGS[name],
        *extra,
        "--out",
        str(folder),
        "--overwrite",
    ]  # an unfinished setting starts again
    print(f"{name}: {' '.join(cmd[1:])}", flush=True)
    with open(folder / "train.log", "w") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)  # dies with us
    if code != 0:
        tail = (folder / "train.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise SystemExit(f"error: {name} failed (exit {code}): " + " | ".join(tail))
    return read_json(folder / "metrics.json")


def check_settings(p, names: list, common: list, out: Path):
    """S0's RunConfig: each setting's command line parsed as ssa.py does before any trains."""
    from ssa import SSAConfig

    configs = []
    for name in names:
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                configs.append(
                    cli.parse([*common, *SETTINGS[name], "--out", str(out / name)], "ssa", p.prog, "", SSAConfig)[0]
                )
        except SystemExit:
            p.error(said.getvalue().strip().splitlines()[-1].split("error: ", 1)[-1])
    scaling.device_or_exit(p, configs[0].device)  # refused once, not by the first setting's run
    return configs[0]


def training_flops(record: dict) -> dict:
    """Forward FLOPs per example of a training step, averaged over the steps (+FT: its dense tail)."""
    dense, sampled = record["flops_per_example"], record["ssa"]["sampled_flops_per_example"]
    tail = record["ssa"]["finetune_fraction"]
    return {k: (1 - tail) * sampled[k] + tail * dense[k] for k in dense}


def render(records: dict) -> str:
    s0 = records["S0"]
    base_flops = training_flops(s0)
    rows = [
        [
            name,
            r["ssa"]["setting"],
            f"{r['valid']:.4f}",
            f"{r['test']:.4f}",
            f"{r['test'] / s0['test']:.3f}",
            f"{r['ssa']['sampled_density']:.3f}",
            *(f"{training_flops(r)[k] / base_flops[k]:.2f}" for k in ("attention", "model")),
            f"{r['peak_memory_bytes'] / s0['peak_memory_bytes']:.2f}",
            f"{r['median_step_ms']:.0f}",
            f"{r['median_step_ms'] / s0['median_step_ms']:.2f}",
        ]
        for name, r in records.items()
    ]
    headers = [
        "setting",
        "ssa.py name",
        "valid bpb",
        "test bpb",
        "test bpb × S0",
        "train density",
        "attn FLOPs × S0",
        "model FLOPs × S0",
        "peak mem × S0",
        "step ms",
        "step × S0",
    ]
    c = s0["config"]
    lines = [
        f"SSA paper Table 1 shape, task `{s0['task']}` (test split: {s0['scored']['test']} bytes scored), "
        f"{s0['device']}, torch {s0['versions']['torch']}, seed {s0['seed']}: length {c['seq_len']}, "
        f"{c['depth']} layers × {c['heads']} heads × {c['head_dim']}, width {c['dim']}, "
        f"{c['steps']} steps × batch {c['batch_size']}, learning rate {c['lr']:g} ({c['warmup']} warm-up steps, "
        f"{c['lr_decay']} decay to {c['lr_floor']:g} × peak), evaluation context {c['eval_context']} bytes, "
        f"allocator {s0.get('allocator') or 'default'}.",
        "",
        tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True),
        "",
    ]
    l4, ft, u = records.get("S-L4"), records.get("S-L4+FT"), records.get("S-U75")
    checks = []
    if l4:
        ratio = l4["median_step_ms"] / s0["median_step_ms"]
        checks.append(f"S-L4 step time {ratio:.2f} × S0 (target ≤ 0.65): {'met' if ratio <= 0.65 else 'not met'}")
    if ft:
        gap = ft["test"] / s0["test"] - 1
        checks.append(
            f"S-L4+FT test bpb {100 * gap:+.1f} % from S0 (target within 2 %): "
            f"{'met' if abs(gap) <= 0.02 or gap < 0 else 'not met'}"
        )
    if l4 and u:
        checks.append(
            f"S-L4 {l4['test']:.4f} vs S-U75 {u['test']:.4f} bpb (target: locally biased better): "
            f"{'met' if l4['test'] < u['test'] else 'not met'}"
        )
    lines += [f"- {c}" for c in checks]
    if l4 and "ensemble_curve" in l4["ssa"]:
        curve = l4["ssa"]["ensemble_curve"]
        lines += [
            "",
            f"Self-ensembling (Fig. 7 shape), S-L4, validation bits per byte: dense (renormalised) {l4['valid']:.4f}",
            "",
            tabulate(
                [[n, f"{v:.4f}", f"{v - l4['valid']:+.4f}"] for n, v in curve.items()],
                headers=["sub-models", "valid bpb", "− dense"],
                tablefmt="github",
                disable_numparse=True,
            ),
        ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = cli.parser(
        "python -m experiments.ssa_table",
        __doc__.splitlines()[0],
        epilog="Other options (e.g. --batch-size, --lr, --data-dir) go to every run.",
    )
    p.add_argument("--task", default="bytes", help="an LM task (bytes, enwik8)")
    p.add_argument("--seq-len", type=cli.length, default=1024, help="attention-dominated length (≥ 1024 on this CPU)")
    p.add_argument("--preset", default="cpu", choices=["cpu", "paper"], help="the task preset of every run")
    p.add_argument(
        "--steps", type=cli.non_negative_int, default=None, help="training steps of every run (default: the preset's)"
    )
    p.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated, from " + ",".join(SETTINGS))
    p.add_argument(
        "--ensemble-samples", type=cli.non_negative_int, default=16, help="Fig. 7 curve up to this many sub-models"
    )
    p.add_argument(
        "--out", metavar="DIR", default="runs/ssa_table", help="folder: one sub-folder per setting, table.md"
    )
    args, extra = p.parse_known_args(argv)
    names = args.settings.split(",")
    if not set(names) <= set(SETTINGS) or "S0" not in names:
        p.error(f"--settings must include S0 and come from {list(SETTINGS)}, got {names}")
    from bench.tasks import TASKS, get_task  # after parsing: --help imports nothing heavy

    if args.task not in TASKS or get_task(args.task).metric != "bpb":
        p.error(f"--task must be a language-modelling task (bits per byte), got {args.task!r}")
    steps = args.steps if args.steps is not None else get_task(args.task).presets[args.preset].steps
    common = [
        "--task",
        args.task,
        "--preset",
        args.preset,
        "--steps",
        str(steps),
        "--seq-len",
        str(args.seq_len),
        "--pos-emb",
        "false",
        *PAPER_SCHEDULE,
        *extra,
    ]
    out = Path(args.out)
    cfg = check_settings(p, names, common, out)
    with cli.one_line_errors():  # the data, before any setting's folder is made
        task = get_task(args.task)
        task.data_file, task.download_allowed = cfg.data_file, not cfg.no_download
        task.setup(args.seq_len, cfg.seed, Path(cfg.data_dir) if cfg.data_dir else default_data_dir(), 0)
    records = {name: run_setting(out / name, name, common, args.ensemble_samples) for name in names}
    text = render(records)
    with cli.one_line_errors():
        write_atomic(out / "table.md", text.encode())
        write_json(out / "table.json", records)
    print(text)
    print(f"wrote {out / 'table.md'} and {out / 'table.json'}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
