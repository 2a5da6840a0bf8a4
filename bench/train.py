"""The one training loop, shared by every method and task.

    python -m bench.train --method full --task duplicates [--steps N --seed S --out DIR ...]
    torchrun --nproc_per_node 2 -m bench.train --method full --task listops      # DDP (gloo on CPU, nccl on CUDA)

AdamW (weight decay on matrices only), linear warm-up then cosine (default) or linear decay to a floor (default
10% of the peak learning rate; ``--lr-decay linear --lr-floor 0.5`` is the SSA paper's App. B.1 schedule),
gradient clipping, bf16 autocast on CUDA, periodic evaluation, a progress line, a JSON-lines log
(``log.jsonl``), atomic checkpoints at each evaluation and ``--resume``, and the results record
``metrics.json`` (DESIGN.md) written atomically at the end.

Reproducibility: every random draw of step t — the batch, dropout, a method's sampled attention — comes from
seeds derived from (seed, rank, t), and each evaluation from (seed, step). A run killed and resumed from its
last checkpoint therefore ends with exactly the metrics of an uninterrupted one (tests/test_train.py).

The run folder ``--out`` holds one run: ``checkpoint.pt`` (and ``checkpoint-STEP.pt`` snapshots), ``log.jsonl``
and, once the run has finished, ``metrics.json`` — the only sign of a finished run (``"status": "complete"``).
- A fresh run refuses a folder that already holds a run's files (exit 2) unless ``--overwrite`` is given: an
  earlier run's hours are not replaced because a command was repeated or an --out mistyped. Files of others
  (a caller's train.log) do not count. With ``--overwrite`` (as with ``--resume``) the old files go only once
  the new run's settings, data and model are ready — so a run refused for bad input changes nothing — and
  metrics.json goes first: a run killed at any instant never leaves a folder that looks finished beside a
  checkpoint and log of another run.
- ``--resume`` continues from checkpoint.pt, which must have been trained with this run's settings (see
  ``resume_conflicts``: what may differ only says where the run lives and what it reports, or acts only after
  the checkpoint's step); a mismatch is refused naming each setting, old → new. log.jsonl keeps its complete
  lines up to the checkpoint's step: a line torn by a kill mid-write, and what was logged after the
  checkpoint, are dropped.
- Checkpoints are written atomically and carry the sha256 of their payload in a one-line header; a damaged,
  truncated or empty one is refused in one line before torch reads it.
Bad settings (an unknown device, a negative learning rate, an attention option of the wrong type, a causal task
for an attention with no causal form) are refused in one line, exit 2, before any data are read or folders made.

Methods plug in two ways (bench/methods.py registers them). A baseline is a class built with the interface's core
arguments plus ``--attn key=value`` budget options. A method with its own settings and procedures (SSA's
fine-tuning tail, SBM's regulariser, the kernel pipeline) has a recipe (bench/recipes/): its settings dataclass
gives its options, its plan the attention factory and the hooks. Its file's ``main()`` calls ``main(argv,
method=NAME)`` here, so ``python ssa.py --task T`` and ``python -m bench.train --method ssa --task T`` run the
same code. Control goes one way: the command line is parsed, the task made and the config resolved once, the
recipe plans the run, ``run`` trains (setup, loop, final record); the method file is never called back.
"""
import argparse
import dataclasses
import datetime
import hashlib
import inspect
import io
import json
import math
import os
import platform
import statistics
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bench import measure
from bench import methods as registry
from bench.cli import HelpFormatter, device_option
from bench.data import write_atomic
from bench.model import Model, ModelConfig
from bench.recipes import Hooks, Plan, Recipe, same_in_every_layer
from bench.tasks import IGNORE, TASKS, DataError, Preset, default_data_dir, get_task

PRESET_FIELDS = [f.name for f in dataclasses.fields(Preset)]
LOG_EVERY = 50
LR_DECAYS = ("cosine", "linear")
CORE_ARGUMENTS = ("dim", "heads", "head_dim", "dropout")  # the interface's; any other constructor argument is a budget
# What --resume lets differ from the checkpoint's settings, beside a method's Hooks.later_settings:
# settings that only say where the run lives and what it reports (the device string: its type and the bf16
# autocast are compared instead, as they change the numbers; eval_every: evaluations draw from their own seeds)
OBSERVING = ("out", "resume", "overwrite", "log_every", "snapshot_at", "eval_every", "final_eval_batches",
             "data_dir", "no_download", "device")
# and the learning-rate schedule where it gives every step already taken the same rate (lr_at): e.g. more steps
# while still in the warm-up; after it the decay's length changes the rate of the steps taken
SCHEDULE = ("steps", "lr", "warmup", "lr_decay", "lr_floor")
CHECKPOINT_HEADER = b"bench.train checkpoint, sha256 of the rest: "


def available_methods() -> Dict[str, str]:
    """Registered methods (bench/methods.py) whose module exists in this checkout: name → module:Class."""
    return {name: method.attention for name, method in registry.available().items()}


def load_method(name: str):
    return registry.get(name).load()


class SetupError(RuntimeError):
    """A setting that cannot work (bad shapes, unknown option): reported as one line, exit 2."""


# ------------------------------------------------------------------------------------------------ CLI
def parse_attn_option(text: str):
    """KEY=VALUE → (KEY, VALUE text); ``attention_options`` gives VALUE the type the attention declares."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--attn expects key=value, got {text!r}")
    key, value = text.split("=", 1)
    return key, value


def checked_number(cast, accept, requirement: str):
    """An argparse type: ``cast(text)``, finite and accepted by ``accept``, else 'must be REQUIREMENT'."""
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not accept(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value
    return parse


positive_int = checked_number(int, lambda v: v >= 1, "a positive integer")
non_negative_int = checked_number(int, lambda v: v >= 0, "a non-negative integer")
positive_float = checked_number(float, lambda v: v > 0, "a positive number")
non_negative_float = checked_number(float, lambda v: v >= 0, "a non-negative number")
unit_fraction = checked_number(float, lambda v: 0 <= v <= 1, "a fraction in [0, 1]")
dropout_rate = checked_number(float, lambda v: 0 <= v < 1, "a rate in [0, 1)")


def parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0"):
        return False
    raise ValueError(text)


def boolean(text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be true or false, got {text}") from None


def method_option(method: str):
    """--method of a method file's parser: only its own method (``python -m bench.train`` runs the others)."""
    def parse(text: str) -> str:
        if text != method:
            raise argparse.ArgumentTypeError(f"this file trains {method} only; run python -m bench.train --method "
                                             f"{text} for {text}")
        return text
    return parse


PRESET_TABLES = (("model", ("seq_len", "dim", "depth", "heads", "head_dim", "mlp_dim", "dropout", "attn_dropout",
                            "pos_emb")),
                 ("training", ("steps", "batch_size", "lr", "weight_decay", "warmup", "eval_every", "eval_batches",
                               "final_eval_batches", "eval_context")))


def shown(value) -> str:
    return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def preset_tables() -> str:
    """Every task's presets, the values a preset override takes when not given (the --help epilog)."""
    presets = [(name, preset, values) for name in sorted(TASKS)
               for preset, values in get_task(name).presets.items()]
    text = []
    for title, names in PRESET_TABLES:
        header = ["task", "preset", *(n.replace("_", "-") for n in names)]
        rows = [[task, preset, *(shown(getattr(values, n)) for n in names)] for task, preset, values in presets]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
                 for row in [header, *rows]]
        text.append(f"{title} presets (what each override, --{names[0].replace('_', '-')} ..., is when not given):\n"
                    + "\n".join("  " + line.rstrip() for line in lines))
    return "\n\n".join(text)


def build_parser(prog: str = "python -m bench.train", method: Optional[str] = None,
                 recipe: Optional[Recipe] = None) -> argparse.ArgumentParser:
    """The harness's options, and a recipe's. ``method``: the parser of that method's own file (``prog``), whose
    --method takes only it."""
    description = recipe.description if recipe is not None else "Train and evaluate one method on one task."
    p = argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter,
                                epilog=preset_tables())
    if method is None:
        p.add_argument("--method", default="full", help="attention method (registry name: bench/methods.py)")
    else:
        p.add_argument("--method", default=method, type=method_option(method),
                       help=f"only {method} here (python -m bench.train --method NAME runs the others)")
    p.add_argument("--task", required=True, choices=sorted(TASKS), help="task to train on")
    p.add_argument("--preset", default="cpu", choices=["cpu", "paper"], help="task preset: sizes and recipe")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--device", default="auto", type=device_option, help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="the run's folder (default: runs/METHOD-TASK-PRESET-sSEED)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its checkpoint (trained with the same settings)")
    again.add_argument("--overwrite", action="store_true",
                       help="replace the run already in --out (without it, a folder holding a run is refused)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="data folder (default: $SPARSE_ATTN_DATA, else ./data)")
    p.add_argument("--data-file", default=None, metavar="PATH",
                   help="bytes: any text file (split 90/5/5); enwik8: enwik8.zip or the unzipped file; text/image: an "
                        "archive or folder; retrieval: the folder of LRA's AAN TSV files (default: the task's own)")
    p.add_argument("--no-download", action="store_true", help="never download; fail with instructions instead")
    p.add_argument("--attn", action="append", type=parse_attn_option, default=[], metavar="KEY=VALUE",
                   help="budget option passed to the attention constructor (repeatable; a method with its own "
                        "options below takes its settings there instead)")
    p.add_argument("--grad-clip", type=non_negative_float, default=1.0, help="gradient-norm clipping (0 = off)")
    p.add_argument("--lr-decay", choices=LR_DECAYS, default="cosine",
                   help="shape of the decay after warm-up, from the peak to the floor at the last step")
    p.add_argument("--lr-floor", type=unit_fraction, default=0.1, metavar="FRACTION",
                   help="learning rate at the last step, as a fraction of the peak")
    p.add_argument("--log-every", type=positive_int, default=LOG_EVERY, help="steps between progress lines")
    p.add_argument("--no-amp", action="store_true", help="disable bf16 autocast on CUDA")
    p.add_argument("--snapshot-at", type=positive_int, action="append", default=[], metavar="STEP",
                   help="also keep the checkpoint after STEP steps as OUT/checkpoint-STEP.pt, from which a run "
                        "that differs only later can --resume (repeatable)")
    group = p.add_argument_group("preset overrides (default: the task preset's value, in the tables below)")
    group.add_argument("--seq-len", type=positive_int, help="sequence length")
    group.add_argument("--dim", type=positive_int, help="model width")
    group.add_argument("--depth", type=positive_int, help="number of layers")
    group.add_argument("--heads", type=positive_int, help="attention heads")
    group.add_argument("--head-dim", type=positive_int, help="dimension per head")
    group.add_argument("--mlp-dim", type=positive_int, help="MLP hidden width")
    group.add_argument("--dropout", type=dropout_rate, help="dropout rate")
    group.add_argument("--attn-dropout", type=dropout_rate, help="attention dropout rate")
    group.add_argument("--pos-emb", type=boolean, metavar="BOOL", help="learned positional embeddings")
    group.add_argument("--steps", type=non_negative_int, help="training steps (0: evaluate the untrained model)")
    group.add_argument("--batch-size", type=positive_int, help="batch size per process")
    group.add_argument("--lr", type=positive_float, help="peak learning rate")
    group.add_argument("--weight-decay", type=non_negative_float, help="AdamW weight decay")
    group.add_argument("--warmup", type=non_negative_int, help="linear warm-up steps")
    group.add_argument("--eval-every", type=positive_int, help="steps between evaluations and checkpoints")
    group.add_argument("--eval-batches", type=positive_int, help="batches per periodic evaluation")
    group.add_argument("--final-eval-batches", type=positive_int, help="batches per final evaluation")
    group.add_argument("--eval-context", type=non_negative_int, help="LM: context bytes between eval windows")
    if recipe is not None:
        recipe.add_arguments(p)
    return p


def resolve_config(args, task, method_presets: Optional[dict] = None) -> dict:
    """Preset values, changed where the method changes them (``method_presets``), overridden by the options given
    on the command line. An LM's evaluation context keeps its fraction of the window when only --seq-len is
    changed."""
    preset = {**dataclasses.asdict(task.presets[args.preset]), **(method_presets or {})}
    if args.seq_len is not None and args.eval_context is None:
        preset["eval_context"] = preset["eval_context"] * args.seq_len // preset["seq_len"]
    for name in PRESET_FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            preset[name] = value
    config = {k: v for k, v in vars(args).items() if k not in PRESET_FIELDS}
    config.update(preset)
    config["attn"] = attention_options(args.method, dict(args.attn)) if args.attn else {}
    return config


def attention_options(method: str, texts: Dict[str, str]) -> dict:
    """--attn KEY=VALUE texts as the values the attention's constructor declares: KEY must be one of its budget
    arguments, VALUE is parsed to that argument's annotation (else its default's type). ValueError naming the
    option, the value and the type expected, or the options there are."""
    _, cls = load_method(method)
    params = {name: p for name, p in inspect.signature(cls).parameters.items() if name not in CORE_ARGUMENTS}
    try:
        hints = typing.get_type_hints(cls.__init__)
    except (NameError, TypeError):
        hints = {}
    options = {}
    for key, text in texts.items():
        if key not in params:
            raise ValueError(f"{method} takes no option {key!r}; its options: {list(params)}")
        default = params[key].default
        declared = hints.get(key, type(default) if default not in (inspect.Parameter.empty, None) else str)
        try:
            options[key] = parse_as(text, declared)
        except ValueError:
            raise ValueError(f"--attn {key}={text}: {method}'s {key} takes {type_words(declared)}") from None
    return options


def optional_of(declared):
    """X for Optional[X], else None."""
    args = typing.get_args(declared)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return None


def parse_as(text: str, declared):
    """``text`` as a value of the type ``declared`` (bool, int, float, str, Optional of one); ValueError if not."""
    if optional_of(declared) is not None:
        return None if text.lower() == "none" else parse_as(text, optional_of(declared))
    if declared is bool:
        return parse_bool(text)
    if declared is int:
        return int(text)
    if declared is float and math.isfinite(float(text)):
        return float(text)
    if declared is str:
        return text
    raise ValueError(text)


def type_words(declared) -> str:
    if optional_of(declared) is not None:
        return f"{type_words(optional_of(declared))} or none"
    words = {bool: "true or false", int: "an integer", float: "a finite number", str: "text"}
    return words.get(declared, f"{declared} values, which --attn cannot give")


# ------------------------------------------------------------------------------------------------ helpers
def derive_seed(*parts) -> int:
    """A 63-bit seed from any tuple of parts (stable across runs and platforms)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name} was asked for, but CUDA is not available on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def lr_at(step: int, config: dict) -> float:
    """Linear warm-up to the peak, then a cosine or linear decay to floor × peak at the last step."""
    peak, warmup, total = config["lr"], config["warmup"], max(1, config["steps"])
    floor = config["lr_floor"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    remaining = 1 - progress if config["lr_decay"] == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return peak * (floor + (1 - floor) * remaining)


def model_inputs(batch: dict, device: torch.device) -> dict:
    inputs = {"tokens": batch["tokens"].to(device),
              "key_padding_mask": batch["key_padding_mask"].to(device) if "key_padding_mask" in batch else None}
    if "tokens2" in batch:
        inputs["tokens2"] = batch["tokens2"].to(device)
        inputs["key_padding_mask2"] = batch["key_padding_mask2"].to(device)
    return inputs


def task_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in float32 over scored positions (targets ≠ IGNORE)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def write_json_atomic(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2).encode())


def as_json(obj):
    """What ``obj`` is after a JSON round trip (tuples become lists): how configs are stored and compared."""
    return json.loads(json.dumps(obj, default=str))


def save_checkpoint(path: Path, state: dict) -> None:
    """torch.save's bytes behind a one-line header with their sha256, written atomically."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    write_atomic(path, CHECKPOINT_HEADER + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    """The state saved by ``save_checkpoint``. A file that is empty, has no header, fails its checksum
    (truncated, bytes altered) or cannot be read is refused with a SetupError naming it, before torch sees it."""
    def refuse(reason: str):
        return SetupError(f"the checkpoint {path} {reason}; it cannot be used: start afresh with --overwrite "
                          f"(or resume from a good copy)")

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})") from None
    if not data:
        raise refuse("is empty")
    header, newline, _ = data[:len(CHECKPOINT_HEADER) + 65].partition(b"\n")
    if not header.startswith(CHECKPOINT_HEADER) or not newline:
        raise refuse("has no checksum header (damaged, or not written by bench.train)")
    payload = memoryview(data)[len(header) + 1:]
    if hashlib.sha256(payload).hexdigest().encode() != header[len(CHECKPOINT_HEADER):]:
        raise refuse(f"is damaged: its {len(payload)}-byte payload does not match the sha256 in its header "
                     f"(truncated or altered)")
    try:
        return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 — any failure of a checked file is one line, not a torch traceback
        raise refuse(f"cannot be read by this torch ({type(exc).__name__})") from None


def parameter_fingerprint(model: nn.Module) -> str:
    """sha256 of all parameters' bytes, in registration order: equal iff the weights are identical."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def make_baseline_factory(method: str, model_cfg: ModelConfig, budget: dict) -> Callable[[int], nn.Module]:
    """The registry's class for ``method`` with the interface's arguments and the (typed) budget options."""
    return same_in_every_layer(load_method(method)[1], model_cfg, budget)


# ------------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model: nn.Module, task, split: str, limit: Optional[int], batch_size: int, device: torch.device,
             seed: int, amp: bool, forward: Optional[Callable] = None) -> dict:
    """The task metric on a split: accuracy, or bits per byte for LM tasks; also the mean loss and density
    (mean over batches, per layer and head). Random draws come from a seed fixed per (seed, split)."""
    was_training = model.training
    model.eval()
    torch.manual_seed(derive_seed(seed, "eval", split))
    nll, correct, count, densities, target_counts = 0.0, 0, 0, [], torch.zeros(task.num_classes)
    for batch in task.eval_batches(split, batch_size, limit):
        inputs, targets = model_inputs(batch, device), batch["targets"].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits, stats = forward(model, inputs) if forward is not None else model(**inputs)
        logits = logits.float().reshape(-1, logits.shape[-1])
        flat = targets.reshape(-1)
        scored = flat != IGNORE
        nll += F.cross_entropy(logits, flat, ignore_index=IGNORE, reduction="sum").item()
        correct += (logits.argmax(-1)[scored] == flat[scored]).sum().item()
        count += scored.sum().item()
        target_counts += torch.bincount(flat[scored].cpu(), minlength=task.num_classes)
        densities.append(stats["density"].float().cpu())
    model.train(was_training)
    if count == 0:
        raise DataError(f"{task.name}: the {split} split produced no scored targets")
    loss = nll / count
    density = torch.stack(densities).mean(0)  # (L, H)
    metric = loss / math.log(2) if task.metric == "bpb" else correct / count
    return {"metric": metric, "loss": loss, "density": density.mean().item(),
            "density_per_layer": density.mean(1).tolist(), "scored": count,
            "base_rate": base_rate(target_counts, task.metric)}


def base_rate(counts: torch.Tensor, metric: str) -> float:
    """What the split's own target distribution gives with no input: the majority class's accuracy, or the
    entropy of the unigram distribution in bits (a model must beat it to have learned anything)."""
    p = counts / counts.sum()
    if metric == "bpb":
        return -(p[p > 0] * p[p > 0].log2()).sum().item()
    return p.max().item()


# ------------------------------------------------------------------------------------------------ run folders
def run_files(out: Path) -> List[Path]:
    """The files of a run in ``out``: record, checkpoint, snapshots and log (not leftovers of atomic writes)."""
    if not out.is_dir():
        return []
    found = [out / name for name in ("metrics.json", "checkpoint.pt", "log.jsonl") if (out / name).is_file()]
    return found + sorted(out.glob("checkpoint-*.pt"))


def resume_conflicts(saved: dict, config: dict, context: dict, later: Dict[str, Callable[[dict], int]]
                     ) -> List[str]:
    """'--name old → new' for each setting of this run that differs from the one the checkpoint was trained
    with and would have changed the steps it has already taken. Free to differ: OBSERVING; the SCHEDULE
    settings while lr_at gives every step before the checkpoint's the same rate (and --steps is not below
    it); a method's later settings (Hooks.later_settings) that act from a step no earlier than the
    checkpoint's, in both runs. ``context``: the processes, the device type and the bf16 autocast, which
    change every step's numbers and must match too."""
    old, new, step = saved["config"], as_json(config), saved["step"]
    absent = object()

    def differs(name):
        return old.get(name, absent) != new.get(name, absent)

    def acts_later(name):
        try:
            return min(later[name](old), later[name](new)) >= step
        except (KeyError, TypeError, ValueError):
            return False

    def show(value):
        return "(absent)" if value is absent else json.dumps(value)

    def entry(name, note=""):
        return f"--{name.replace('_', '-')} {show(old.get(name, absent))} → {show(new.get(name, absent))}{note}"

    names = [n for n in dict.fromkeys([*new, *old]) if differs(n)]
    conflicts = [entry(n) for n in names
                 if n not in OBSERVING and n not in SCHEDULE and not (n in later and acts_later(n))]
    if new["steps"] < step:
        conflicts.append(entry("steps", f" (below the checkpoint's step {step})"))
    elif not all(n in old for n in SCHEDULE) or any(lr_at(t, old) != lr_at(t, new) for t in range(step)):
        conflicts += [entry(n, " (sets the learning rate of the steps already taken)") for n in SCHEDULE if differs(n)]
    conflicts += [f"{key.replace('_', ' ')} {show(saved.get(key, absent))} → {show(value)}"
                  for key, value in context.items() if saved.get(key, absent) != value]
    return conflicts


def open_run_folder(out: Path, args, config: dict, context: dict, hooks: Hooks, device: torch.device
                    ) -> Optional[dict]:
    """Checks ``out`` before anything is read or made: with --resume, its checkpoint (verified, and trained with
    this run's settings) is returned; a fresh run refuses a folder holding a run unless --overwrite."""
    ckpt_path = out / "checkpoint.pt"
    if not args.resume:
        existing = run_files(out)
        if existing and not args.overwrite:
            raise SetupError(f"{out} already holds a run ({', '.join(f.name for f in existing)}): continue it "
                             f"with --resume, or replace it with --overwrite")
        return None
    if not ckpt_path.exists():
        raise DataError(f"--resume: no checkpoint at {ckpt_path}")
    saved = load_checkpoint(ckpt_path, map_location=device)
    conflicts = resume_conflicts(saved, config, context, hooks.later_settings)
    if conflicts:
        raise SetupError(f"--resume: {ckpt_path} (step {saved['step']}) was trained with other settings: "
                         f"{', '.join(conflicts)}; what changes the steps already taken must match (or start "
                         f"afresh with --overwrite)")
    return saved


def kept_log(log_file: Path, step: int) -> bytes:
    """log.jsonl's complete lines with a step ≤ ``step``: what follows the last newline (a line torn by a kill
    mid-write) and any line that is not a JSON record are dropped."""
    if not log_file.is_file():
        return b""
    kept = []
    for line in log_file.read_bytes().split(b"\n")[:-1]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
            kept.append(line + b"\n")
    return b"".join(kept)


def begin_run(out: Path, resume: bool, step: int) -> None:
    """Once the run is ready to train: metrics.json goes first (from then on the folder does not look finished),
    then leftovers of atomic writes; a resumed run keeps its checkpoints and its log up to the checkpoint's step
    (rewritten atomically), a fresh one removes the old checkpoints, then the old log."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").unlink(missing_ok=True)
    for leftover in [*out.glob("metrics.json*.tmp"), *out.glob("checkpoint*.pt*.tmp"), *out.glob("log.jsonl*.tmp")]:
        leftover.unlink(missing_ok=True)
    log_file = out / "log.jsonl"
    if resume:
        if log_file.exists():
            write_atomic(log_file, kept_log(log_file, step))
        return
    for checkpoint in [out / "checkpoint.pt", *out.glob("checkpoint-*.pt")]:
        checkpoint.unlink(missing_ok=True)
    log_file.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ the run
def check_attention(factory: Callable[[int], nn.Module], model_cfg: ModelConfig, device: torch.device,
                    causal: bool) -> None:
    """Builds every layer's attention and runs it once, in training mode, on a zero sequence of the task's
    length, so that a setting it refuses (a causal task for an attention with no causal form, a length it cannot
    take) raises its ValueError now, before any data are read. Throwaway modules, and the random state is
    restored: the run's initialisation and draws are unchanged."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        for layer in range(model_cfg.depth):
            factory(layer).to(device).train()(torch.zeros(1, model_cfg.max_len, model_cfg.dim, device=device),
                                              causal=causal)


def run_folder(args) -> Path:
    return Path(args.out or f"runs/{args.method}-{args.task}-{args.preset}-s{args.seed}")


def build_model(args, task, config: dict, device: torch.device, make_attention: Callable):
    """The task with its data and the model on its device (initialised from the seed); the attention is
    checked (``check_attention``) before the data are read."""
    if args.data_file is not None:
        task.data_file = args.data_file
    if args.no_download:
        task.download_allowed = False
    model_cfg = ModelConfig.of(config, vocab_size=task.vocab_size, num_classes=task.num_classes, head=task.head,
                               max_len=config["seq_len"])
    factory = make_attention(model_cfg)
    try:
        check_attention(factory, model_cfg, device, causal=task.head == "lm")
    except ValueError as exc:
        raise ValueError(f"{args.method} cannot run task {args.task} with these settings: {exc}") from None
    task.setup(config["seq_len"], args.seed, Path(args.data_dir) if args.data_dir else default_data_dir(),
               config["eval_context"])
    # the data set the vocabulary (duplicates: seq_len + 1); the attention depends on none of these fields
    model_cfg = dataclasses.replace(model_cfg, vocab_size=task.vocab_size, num_classes=task.num_classes)
    torch.manual_seed(derive_seed(args.seed, "init"))
    return Model(model_cfg, factory).to(device)


@dataclass
class Session:
    """One process's share of a run: what setup made and what the loop advances (step, time)."""
    args: argparse.Namespace
    task: object
    config: dict
    hooks: Hooks
    out: Path
    world: int
    rank: int
    device: torch.device
    amp: bool
    context: dict  # what --resume compares besides the config: processes, device type, bf16 autocast
    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: int = 0
    elapsed: float = 0.0
    step_times: List[float] = field(default_factory=list)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def evaluate(self, split: str, limit: Optional[int], forward: Optional[Callable] = None) -> dict:
        return evaluate(self.model, self.task, split, limit, self.config["batch_size"], self.device, self.args.seed,
                        self.amp, forward)

    def log(self, record: dict) -> None:
        if self.is_main:
            with open(self.out / "log.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def save(self, path: Path) -> None:
        save_checkpoint(path, {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                               "step": self.step, "elapsed": self.elapsed, "step_times": self.step_times,
                               "config": as_json(self.config), **self.context})


def setup(args, task, config: dict, plan: Plan) -> Session:
    """Device, run folder (checked; a checkpoint loaded with --resume), data and model, optimizer, processes.
    Any bad setting is refused (SetupError) before the folder's old files go."""
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    out = run_folder(args)
    try:
        device = resolve_device(args.device)
        if device.type == "cuda" and world > 1:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        amp = device.type == "cuda" and not args.no_amp
        context = {"world_size": world, "device_type": device.type, "bf16_autocast": amp}
        saved = open_run_folder(out, args, config, context, plan.hooks, device)
        model = build_model(args, task, config, device, plan.make_attention)
    except ValueError as exc:
        raise SetupError(str(exc)) from None
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config["lr"])
    session = Session(args, task, config, plan.hooks, out, world, rank, device, amp, context, model, optimizer)
    if saved is not None:
        try:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise SetupError(f"--resume: {out / 'checkpoint.pt'} does not fit this model: "
                             f"{str(exc).splitlines()[0]}") from None
        session.step, session.elapsed, session.step_times = saved["step"], saved["elapsed"], list(saved["step_times"])
    if world > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if session.is_main:
        begin_run(out, args.resume, session.step)
    return session


def train_loop(s: Session) -> List[torch.Tensor]:
    """Steps from the session's step to config["steps"], with progress lines, periodic evaluations and
    checkpoints; returns the density of what each step computed, (L,) per step (SSA's sub-model, SBM's masks)."""
    args, config, task, model, device = s.args, s.config, s.task, s.model, s.device
    trained = nn.parallel.DistributedDataParallel(model) if s.world > 1 else model
    total = config["steps"]
    trained.train()
    window_loss, window_metric, window_density = [], [], []
    train_density = []
    while s.step < total:
        if s.hooks.on_step is not None:
            s.hooks.on_step(model, s.step, total)
        for group in s.optimizer.param_groups:
            group["lr"] = lr_at(s.step, config)
        torch.manual_seed(derive_seed(args.seed, s.rank, s.step))
        batch = task.train_batch(config["batch_size"],
                                 torch.Generator().manual_seed(derive_seed(args.seed, s.rank, s.step, "data")))
        measure.synchronize(device)
        start = time.perf_counter()
        inputs, targets = model_inputs(batch, device), batch["targets"].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.amp):
            logits, stats = trained(**inputs)
        loss = task_loss(logits, targets)
        s.optimizer.zero_grad(set_to_none=True)
        (loss + stats["aux_loss"]).backward()
        if args.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        s.optimizer.step()
        measure.synchronize(device)
        s.step_times.append((time.perf_counter() - start) * 1e3)
        s.elapsed += s.step_times[-1] / 1e3
        s.step += 1
        with torch.no_grad():
            scored = targets != IGNORE
            window_loss.append(loss.item())
            window_metric.append(loss.item() / math.log(2) if task.metric == "bpb" else
                                 (logits.argmax(-1)[scored] == targets[scored]).float().mean().item())
            window_density.append(stats["density"].mean().item())
            train_density.append(stats["density"].float().mean(-1).cpu())
        if s.is_main and (s.step % args.log_every == 0 or s.step == total):
            report_progress(s, window_loss, window_metric, window_density)
            window_loss, window_metric, window_density = [], [], []
        if s.step % config["eval_every"] == 0 or s.step == total:
            if s.is_main:
                result = s.evaluate("valid", config["eval_batches"])
                s.log({"step": s.step, "split": "valid", "lr": lr_at(s.step - 1, config), **result})
                print(f"eval step {s.step}: valid {task.metric} {result['metric']:.4f} loss {result['loss']:.4f} "
                      f"density {result['density']:.3f}", flush=True)
                s.save(s.out / "checkpoint.pt")
            if s.world > 1:
                dist.barrier()
        if s.is_main and s.step in args.snapshot_at:
            s.save(s.out / f"checkpoint-{s.step}.pt")
    return train_density


def report_progress(s: Session, losses: List[float], metrics: List[float], densities: List[float]) -> None:
    """The progress line and the log's training record: means over the steps since the last one."""
    total = s.config["steps"]
    median_ms = statistics.median(s.step_times[-s.args.log_every:])
    eta = datetime.timedelta(seconds=round(median_ms * (total - s.step) / 1e3))
    metric_name = "bpb" if s.task.metric == "bpb" else "acc"
    print(f"step {s.step}/{total} | loss {np.mean(losses):.4f} | {metric_name} {np.mean(metrics):.4f} | density "
          f"{np.mean(densities):.3f} | {median_ms:.1f} ms/step | ETA {eta}", flush=True)
    s.log({"step": s.step, "split": "train", "loss": float(np.mean(losses)), "metric": float(np.mean(metrics)),
           "density": float(np.mean(densities))})


def final_record(s: Session, train_density: List[torch.Tensor], peak_memory: Optional[int],
                 fingerprints: List[str]) -> dict:
    """The results record (DESIGN.md): final evaluations, densities, FLOPs, memory, timings, provenance, and what
    the method's after-training hook adds."""
    config, device, model, task = s.config, s.device, s.model, s.task
    valid = s.evaluate("valid", config["final_eval_batches"])
    test = s.evaluate("test", config["final_eval_batches"])
    example = next(task.eval_batches("valid", min(4, config["batch_size"]), 1))
    inputs = model_inputs(example, device)
    flops = {}
    for mode, training in (("train", True), ("eval", False)):
        # Training FLOPs are those of what a training step computes (SSA's sub-model, SBM's sampled masks);
        # evaluation FLOPs those of inference, where a method may differ (SSA evaluates dense).
        model.train(training)
        torch.manual_seed(derive_seed(s.args.seed, "flops"))
        with torch.no_grad():
            flops[mode] = measure.model_flops_per_example(model, lambda: model(**inputs), len(example["tokens"]))
    model.eval()
    torch.manual_seed(derive_seed(s.args.seed, "memory"))
    inference_memory = measure.inference_peak_memory_bytes(lambda: model(**inputs), device)
    trained = torch.stack(train_density) if train_density else None  # (steps, L)
    record = {
        "status": "complete", "method": s.args.method, "task": s.args.task, "preset": s.args.preset,
        "seed": s.args.seed, "device": device_name(device), "world_size": s.world,
        "metric": task.metric, "valid": valid["metric"], "test": test["metric"],
        "valid_loss": valid["loss"], "test_loss": test["loss"],
        "scored": {"valid": valid["scored"], "test": test["scored"]},
        "base_rate": test["base_rate"],
        "density": test["density"], "density_per_layer": test["density_per_layer"],
        "train_density": trained.mean().item() if trained is not None else None,
        "train_density_per_layer": trained.mean(0).tolist() if trained is not None else None,
        "params": sum(p.numel() for p in model.parameters()),
        "flops_per_example": flops["eval"], "train_flops_per_example": flops["train"],
        "flops_convention": "forward; 1 multiply-add = 2 FLOPs; bench/measure.py",
        "peak_memory_bytes": peak_memory,
        "inference_memory_per_example_bytes": inference_memory // len(example["tokens"]),
        "peak_memory_kind": "cuda max_memory_allocated" if device.type == "cuda" else
                            "CPU peak RSS above the pre-training baseline",
        "median_step_ms": statistics.median(s.step_times[5:] or s.step_times) if s.step_times else None,
        "steps": config["steps"], "wall_time_s": s.elapsed,
        "param_fingerprints": fingerprints,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__},
        "allocator": {k: os.environ[k] for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ},
        "config": as_json(config),
    }
    if s.hooks.after_training is not None:
        record.update(s.hooks.after_training(model, s.evaluate))
    return record


def run(args, task, config: dict, plan: Plan) -> Optional[dict]:
    """Trains and evaluates ``plan``'s attention on ``task`` with the resolved ``config``; returns the results
    record, written to OUT/metrics.json by rank 0 (other ranks: None)."""
    s = setup(args, task, config, plan)
    memory = measure.PeakRSS() if s.device.type == "cpu" else None
    measure.reset_peak_memory(s.device)
    train_density = train_loop(s)
    peak_memory = measure.peak_memory_bytes(s.device, memory) if config["steps"] > 0 else None
    fingerprints = [parameter_fingerprint(s.model)]
    if s.world > 1:
        gathered = [None] * s.world
        dist.all_gather_object(gathered, fingerprints[0])
        fingerprints = gathered
    record = None
    if s.is_main:
        record = final_record(s, train_density, peak_memory, fingerprints)
        write_json_atomic(s.out / "metrics.json", record)
        print(f"final: valid {task.metric} {record['valid']:.4f} | test {task.metric} {record['test']:.4f} | "
              f"density {record['density']:.3f} | {record['wall_time_s']:.1f} s | record {s.out / 'metrics.json'}",
              flush=True)  # the record's figures: an after-training hook may replace the dense evaluation's
    if s.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return record


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


# ------------------------------------------------------------------------------------------------ command line
def command_line(argv: List[str], method: Optional[str], prog: str):
    """The parser of the method asked for (``method``: the one of the calling method file) with its recipe's
    options, and the recipe (None for a baseline)."""
    if method is None:
        pre = argparse.ArgumentParser(add_help=False)
        pre.add_argument("--method", default="full")
        method_asked = pre.parse_known_args(argv)[0].method
        if method_asked not in available_methods():
            build_parser(prog).error(f"argument --method: invalid choice {method_asked!r} "
                                     f"(available: {sorted(available_methods())})")
    recipe = registry.get(method or method_asked).load_recipe()
    return build_parser(prog, method, recipe), recipe


def configure(args, task, recipe: Optional[Recipe], parser: argparse.ArgumentParser):
    """The run's config (the task's preset, what the method changes in it, the command line) and its plan. A
    method's bad setting is argparse's one-line error (exit 2), a baseline's --attn a SetupError."""
    if recipe is None:
        try:
            config = resolve_config(args, task)
        except ValueError as exc:
            raise SetupError(str(exc)) from None
        return config, Plan(lambda model_cfg: make_baseline_factory(args.method, model_cfg, config["attn"]))
    if args.attn:
        flags = ", ".join(flag for _, flag, _, _ in list(recipe.options())[:2])
        parser.error(f"{parser.prog} takes its settings as flags ({flags}, ...), not --attn")
    try:
        settings = recipe.settings(args)
        config = resolve_config(args, task, recipe.preset_changes(settings, task) if recipe.preset_changes else {})
        return config, recipe.plan(settings, args, config, task)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv=None, method: Optional[str] = None, prog: str = "python -m bench.train") -> int:
    """The command line: parsed, the task made, the config resolved and the run planned once, then ``run``. Bad
    input is one clear message: exit 2 for bad settings, 1 for data problems. ``method``: called from that
    method's file (``prog``: how it is run), which trains only it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, recipe = command_line(argv, method, prog)
    args = parser.parse_args(argv)
    try:
        task = get_task(args.task)
        config, plan = configure(args, task, recipe, parser)
        run(args, task, config, plan)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
