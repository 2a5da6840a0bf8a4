"""The command lines: one vocabulary for every entry point, a method's settings dataclass as its flags, and bad
input as one line. The standard library only at the top: ``--help`` of the light tools stays fast.

One name means one thing everywhere: --seq-len / --lengths, --batch-size, --heads, --head-dim, --methods /
--method, --tasks / --task, --seeds / --seed, --warmup (learning-rate warm-up steps), --warmup-iters (untimed
timing iterations), --repeats, --threads, --device, --attn, --path, --alibi / --no-alibi, --out DIR (always a
folder), --data-dir. Bad input is refused while the options parse, before anything is made.
"""

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import typing
from pathlib import Path
from typing import Dict, List, Optional, Tuple


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """An option's default shown where it has one (never "(default: None)": the help says what an absent option
    means), and descriptions and epilogs (the preset tables) as written."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        unset = default is None or default is False or default == [] or default is argparse.SUPPRESS
        if "(default" in text or not action.option_strings or unset:
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ``--out`` added without a type of its own is checked as a folder (``out_folder``), its default too."""

    def add_argument(self, *names, **kwargs):
        if "--out" in names and "type" not in kwargs and kwargs.get("action", "store") == "store":
            kwargs["type"] = out_folder
        return super().add_argument(*names, **kwargs)

    def format_help(self):  # an epilog given as a function is made only when --help asks for it
        self.epilog = self.epilog() if callable(self.epilog) else self.epilog
        return super().format_help()


def parser(prog: str, description: str, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser whose usage line is how a user calls the tool (``python -m bench.X``)."""
    return Parser(prog=prog, description=description, formatter_class=HelpFormatter, **kwargs)


# ------------------------------------------------------------------------------------------------ option types
def checked_number(cast, accept, requirement: str):
    """An argparse type: ``cast(text)``, finite and accepted by ``accept``, else 'must be REQUIREMENT'."""

    def parse_number(text: str):
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not accept(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    return parse_number


MAX_COUNT = 10**9  # steps, batches, repetitions: more is never meant, and C++ sizes overflow far above it
MAX_LENGTH = 2**20  # a sequence length (--seq-len, --lengths): 1M tokens
MAX_WIDTH = 2**16  # a model width, MLP width or head dimension
MAX_LAYERS = 2**10  # layers or heads


def bounded_int(low: int, high: int, what: str):
    """An argparse type: an integer in [low, high], else 'must be WHAT from LOW to HIGH'."""
    return checked_number(int, lambda v: low <= v <= high, f"{what} from {low:,} to {high:,}")


positive_int = bounded_int(1, MAX_COUNT, "a positive integer")
non_negative_int = bounded_int(0, MAX_COUNT, "a non-negative integer")
length = bounded_int(1, MAX_LENGTH, "a length")
width = bounded_int(1, MAX_WIDTH, "a size")
layers = bounded_int(1, MAX_LAYERS, "a count")
any_int = bounded_int(-MAX_COUNT, MAX_COUNT, "an integer")  # a method's integer setting: its own check follows
seed = bounded_int(0, 2**32 - 1, "a seed")  # what torch.manual_seed and numpy's generators take
threads = bounded_int(0, MAX_LAYERS, "a thread count (0: torch's default)")
non_negative_float = checked_number(float, lambda v: v >= 0, "a non-negative number")
# AdamW's first step is 10× the learning rate (bias correction 1 - 0.9): above 1e37 it overflows a float32
learning_rate = checked_number(float, lambda v: 0 < v <= 1e37, "a positive number up to 1e37")
finite_float = checked_number(float, lambda v: True, "a finite number")
unit_fraction = checked_number(float, lambda v: 0 <= v <= 1, "a fraction in [0, 1]")
dropout_rate = checked_number(float, lambda v: 0 <= v < 1, "a rate in [0, 1)")


def parse_bool(text: str) -> bool:
    if text.lower() not in ("true", "yes", "1", "false", "no", "0"):
        raise ValueError(text)
    return text.lower() in ("true", "yes", "1")


def boolean(text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be true or false, got {text}") from None


def device_option(text: str) -> str:  # whether CUDA is there is checked when the run starts
    kind, _, index = text.partition(":")
    if text in ("auto", "cpu", "cuda") or (kind == "cuda" and index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N, got {text!r}")


def positive_ints(text: str) -> List[int]:
    """A comma-separated list of lengths, each from 1 to MAX_LENGTH (--lengths)."""
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        values = []
    if not values or min(values) < 1 or max(values) > MAX_LENGTH:
        raise argparse.ArgumentTypeError(f"must be comma-separated lengths from 1 to {MAX_LENGTH:,}, got {text!r}")
    return values


def out_folder(text: str) -> str:
    """``--out DIR``: a folder that exists or can be made, and written (bench.files.folder_problem)."""
    from bench.files import folder_problem

    problem = folder_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}" if text else problem)
    return text


def attn_item(text: str) -> str:
    """One ``--attn METHOD.KEY=VALUE`` of a multi-method tool (the method's constructor option KEY)."""
    target, sep, _ = text.partition("=")
    method, dot, key = target.partition(".")
    if not (sep and dot and method and key):
        raise argparse.ArgumentTypeError(f"takes METHOD.KEY=VALUE (e.g. performer.features=128), got {text!r}")
    return text


def out_file(out: str, name: str) -> Path:
    """``--out DIR``'s file ``name``: the folder is made, the path returned for the tool to write and report."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def clock(seconds: float) -> str:
    """m:ss, for progress lines and estimates."""
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


# ------------------------------------------------------------------------------------------------ training runs
PRESET_TABLES = (
    ("model", ("seq_len", "dim", "depth", "heads", "head_dim", "mlp_dim", "dropout", "attn_dropout", "pos_emb")),
    (
        "training",
        (
            "steps",
            "batch_size",
            "lr",
            "weight_decay",
            "warmup",
            "eval_every",
            "eval_batches",
            "final_eval_batches",
            "eval_context",
        ),
    ),
)


def shown(value, joiner: str = ",") -> str:
    """A default as a user types it: lists joined, booleans lower-case, floats short."""
    if isinstance(value, (tuple, list)):
        return joiner.join(shown(v) for v in value) if value else "none"
    return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def preset_tables(tasks: Optional[Tuple[str, ...]] = None) -> str:
    """The presets of ``tasks``, by default every task's (the --help epilog: it imports each task's module)."""
    from bench.tasks import TASKS, get_task

    presets = [
        (name, preset, values) for name in sorted(tasks or TASKS) for preset, values in get_task(name).presets.items()
    ]
    text = []
    for title, names in PRESET_TABLES:
        header = ["task", "preset", *(n.replace("_", "-") for n in names)]
        rows = [[task, preset, *(shown(getattr(values, n)) for n in names)] for task, preset, values in presets]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        lines = [
            "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            for row in [header, *rows]
        ]
        text.append(
            f"{title} presets (what each override, --{names[0].replace('_', '-')} ..., is when not given):\n"
            + "\n".join("  " + line.rstrip() for line in lines)
        )
    return "\n\n".join(text)


def task_parser(prog: str, description: str, out_help: str) -> argparse.ArgumentParser:
    """The options of a tool that builds a task's model: task, preset, seed, device, folders, the overrides."""
    from bench.tasks import TASKS

    p = parser(prog, description, epilog=preset_tables, allow_abbrev=False)
    p.add_argument("--task", required=True, choices=sorted(TASKS), help="task to train on")
    p.add_argument("--preset", default="cpu", choices=["cpu", "paper"], help="task preset: sizes and recipe")
    p.add_argument("--seed", type=seed, default=0, help="random seed")
    p.add_argument("--device", default="auto", type=device_option, help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--out", default=None, metavar="DIR", help=out_help)
    p.add_argument(
        "--data-dir", default=None, metavar="DIR", help="data folder (default: $SPARSE_ATTN_DATA, else ./data)"
    )
    p.add_argument(
        "--data-file",
        default=None,
        metavar="PATH",
        help="bytes: any text file (split 90/5/5); enwik8: enwik8.zip or the unzipped file; text/image: an "
        "archive or folder; retrieval: the folder of LRA's AAN TSV files (default: the task's own)",
    )
    p.add_argument("--no-download", action="store_true", help="never download; fail with instructions instead")
    group = p.add_argument_group("preset overrides (default: the task preset's value, in the tables below)")
    group.add_argument("--seq-len", type=length, help="sequence length")
    group.add_argument("--dim", type=width, help="model width")
    group.add_argument("--depth", type=layers, help="number of layers")
    group.add_argument("--heads", type=layers, help="attention heads")
    group.add_argument("--head-dim", type=width, help="dimension per head")
    group.add_argument("--mlp-dim", type=width, help="MLP hidden width")
    group.add_argument("--dropout", type=dropout_rate, help="dropout rate")
    group.add_argument("--attn-dropout", type=dropout_rate, help="attention dropout rate")
    group.add_argument("--pos-emb", type=boolean, metavar="BOOL", help="learned positional embeddings")
    group.add_argument("--steps", type=non_negative_int, help="training steps (0: evaluate the untrained model)")
    group.add_argument("--batch-size", type=bounded_int(1, MAX_LENGTH, "a batch size"), help="batch size per process")
    group.add_argument("--lr", type=learning_rate, help="peak learning rate")
    group.add_argument("--weight-decay", type=non_negative_float, help="AdamW weight decay")
    group.add_argument("--warmup", type=non_negative_int, help="linear warm-up steps")
    group.add_argument("--eval-every", type=positive_int, help="steps between evaluations and checkpoints")
    group.add_argument("--eval-batches", type=positive_int, help="batches per periodic evaluation")
    group.add_argument("--final-eval-batches", type=positive_int, help="batches per final evaluation")
    group.add_argument(
        "--eval-context", type=bounded_int(0, MAX_LENGTH - 1, "a length"), help="LM: context bytes between eval windows"
    )
    return p


def run_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The options of every training entry point: task_parser's, and the run's own (resume, schedule, logging)."""
    from bench.config import LR_DECAYS, RunConfig  # its defaults are the options'

    p = task_parser(prog, description, "the run's folder (default: runs/METHOD-TASK-PRESET-sSEED)")
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its checkpoint (trained with the same settings)",
    )
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (without it, a folder holding a run is refused)",
    )
    p.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="start from the model weights of CHECKPOINT (a snapshot, or a finished run's "
        "OUT/checkpoint.pt), with this run's own settings, optimizer and schedule",
    )
    p.add_argument(
        "--grad-clip", type=non_negative_float, default=RunConfig.grad_clip, help="gradient-norm clipping (0 = off)"
    )
    p.add_argument(
        "--lr-decay",
        choices=LR_DECAYS,
        default=RunConfig.lr_decay,
        help="shape of the decay after warm-up, from the peak to the floor at the last step",
    )
    p.add_argument(
        "--lr-floor",
        type=unit_fraction,
        default=RunConfig.lr_floor,
        metavar="FRACTION",
        help="learning rate at the last step, as a fraction of the peak",
    )
    p.add_argument("--log-every", type=positive_int, default=RunConfig.log_every, help="steps between progress lines")
    p.add_argument("--no-amp", action="store_true", help="disable bf16 autocast on CUDA")
    p.add_argument(
        "--snapshot-at",
        type=positive_int,
        action="append",
        default=[],
        metavar="STEP",
        help="also keep the checkpoint after STEP steps as OUT/checkpoint-STEP.pt, from whose weights "
        "another run may start (--init-from; repeatable)",
    )
    return p


def run_config(args: argparse.Namespace, method: str, settings=None, attn: Optional[dict] = None):
    """The RunConfig of parsed arguments; a run folder that cannot be written (the default one too), or sizes
    whose activations alone would not fit in memory, are a SetupError."""
    import torch
    from bench.config import PRESET_FIELDS, RunConfig, SetupError, memory_problem
    from bench.tasks import get_task

    overrides = {name: getattr(args, name) for name in PRESET_FIELDS}
    options = (
        "seed",
        "device",
        "out",
        "resume",
        "overwrite",
        "init_from",
        "data_dir",
        "data_file",
        "no_download",
        "grad_clip",
        "lr_decay",
        "lr_floor",
        "log_every",
        "no_amp",
    )
    cfg = RunConfig.of(
        get_task(args.task).presets[args.preset],
        overrides,
        method=method,
        task=args.task,
        preset=args.preset,
        snapshot_at=tuple(args.snapshot_at),
        attn=attn or {},
        settings=settings,
        **{name: getattr(args, name) for name in options},
    )
    if "OMP_NUM_THREADS" not in os.environ:  # a thread per 2^20 values of a batch's activations, at most one per core:
        # a small model's ops are too short to share out, and on busy cores the extra threads wait for each other
        torch.set_num_threads(max(1, min(torch.get_num_threads(), cfg.batch_size * cfg.seq_len * cfg.dim >> 20)))
    from bench.files import folder_problem

    problem = folder_problem(cfg.folder)
    problem = f"--out {cfg.folder}: {problem}" if problem else memory_problem(cfg)
    if problem:
        raise SetupError(problem)
    return cfg


def parse(
    argv: Optional[List[str]],
    method: str,
    prog: str,
    description: str,
    settings: type,
    flags: Optional[Dict[str, str]] = None,
    tasks: Optional[Tuple[str, ...]] = None,
):
    """A method file's command line → (RunConfig, the method's settings). ``flags``: the method's own switches
    (name → help, e.g. SBM's --official), each a plain flag whose value, in ``cfg.flags``, the method's main
    applies; ``cfg.given`` names the settings given on the command line. ``tasks``: the only tasks the method
    has a form for. A bad setting (the dataclass's ValueError) is argparse's one-line error, exit 2."""
    p = run_parser(prog, description)
    if tasks is not None:
        p._option_string_actions["--task"].choices = list(tasks)
        p.epilog = lambda: preset_tables(tasks)
    group = add_settings(p, settings, f"{method} options")
    for name, help_text in (flags or {}).items():
        group.add_argument(f"--{name}", action="store_true", help=help_text)
    args = p.parse_args(argv)
    from bench.config import SetupError

    try:
        chosen = settings_of(args, settings)
        cfg = run_config(args, method, chosen)
        given = {f.name for f, _, dest, _ in settings_flags(settings) if getattr(args, dest) is not None}
        return dataclasses.replace(
            cfg, flags={name: getattr(args, name) for name in flags or {}}, given=cfg.given | given
        ), chosen
    except (ValueError, SetupError) as exc:
        p.error(str(exc))


# ------------------------------------------------------------------------------------------------ settings
def settings_flags(settings: type):
    """(field, flag, dest, add_argument's kwargs) for each field of the settings dataclass (its metadata may give
    ``flag``, ``help``, ``metavar``, ``type``, ``nargs``, ``choices``; a bool true by default is
    ``--name/--no-name``); a flag not given parses as None (the field's default), so that what was given is known."""
    hints = typing.get_type_hints(settings)
    for f in dataclasses.fields(settings):
        meta, default = f.metadata, f.default
        flag = meta.get("flag", "--" + f.name.replace("_", "-"))
        dest = flag.lstrip("-").replace("-", "_")
        default_text = f" (default: {shown(default, ' ' if 'nargs' in meta else ',')})"
        kwargs = {"dest": dest, "default": None}
        if hints[f.name] is bool:
            action = argparse.BooleanOptionalAction if default is True else "store_true"
            kwargs.update(action=action, help=meta.get("help", "") + default_text)
        else:
            kind = meta.get("type", plain_type(hints[f.name]))
            kwargs.update(
                type={float: finite_float, int: any_int}.get(kind, kind),
                help=meta.get("help", "") + ("" if default is None else default_text),
            )
            kwargs.update({k: meta[k] for k in ("metavar", "nargs", "choices") if k in meta})
        yield f, flag, dest, kwargs


def add_settings(p: argparse.ArgumentParser, settings: type, title: str):
    group = p.add_argument_group(title)
    for _, flag, _, kwargs in settings_flags(settings):
        group.add_argument(flag, **kwargs)
    return group


def settings_of(args: argparse.Namespace, settings: type):
    """The settings from parsed arguments, a field not given at its default (the dataclass's ValueError)."""
    return settings(
        **{f.name: getattr(args, dest) for f, _, dest, _ in settings_flags(settings) if getattr(args, dest) is not None}
    )


def plain_type(declared):
    """int for int and Optional[int], and so on: what argparse converts the text with."""
    args = [a for a in typing.get_args(declared) if a is not type(None)]
    return args[0] if typing.get_origin(declared) is typing.Union and len(args) == 1 else declared


@contextlib.contextmanager
def one_line_errors():
    """Bad data (DataError) ends the process with exit 1, a bad setting (SetupError) 2, a Diverged run 3, an OS
    error while writing (a disk full, a folder gone read-only) 1, Ctrl-C 130, each as one line on stderr."""
    from bench.config import Diverged, SetupError
    from bench.files import DataError, os_error_line

    try:
        yield
    except (DataError, SetupError, Diverged) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit({DataError: 1, SetupError: 2, Diverged: 3}[type(exc)]) from None
    except OSError as exc:
        print(f"error: {os_error_line(exc)}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt as exc:  # Ctrl-C: the training loop says at which step (bench.loop.train)
        print(f"error: {exc or 'interrupted; rerun, with --resume where a checkpoint was saved'}", file=sys.stderr)
        raise SystemExit(130) from None
