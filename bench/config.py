"""A run's configuration as data, and the rules that read it.

``RunConfig`` is everything one training run is made of: the task's preset (the backbone's sizes and the
training recipe, ``Preset``) with the command line's overrides, where the run lives and how it reports, a
baseline's budget (``attn``) or a method's own settings dataclass (``settings``). It is built once, by
bench/cli.py or by code, and read by the loop; ``as_record()`` is the flat dict that checkpoints and
metrics.json store.

The rules: the learning-rate schedule (``lr_at``), the seeds of every random draw (``derive_seed``), the
device (``resolve_device``) and which settings ``--resume`` may change (``resume_conflicts``).
"""
import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

import torch

from bench.model import Backbone

LR_DECAYS = ("cosine", "linear")
# What --resume lets differ from the checkpoint's settings, beside a method's own later settings: what only says
# where the run lives and what it reports (the device string: its type and the bf16 autocast are compared
# instead, as they change the numbers; eval_every: evaluations draw from their own seeds)
OBSERVING = ("out", "resume", "overwrite", "log_every", "snapshot_at", "eval_every", "final_eval_batches",
             "data_dir", "no_download", "device")
# and the learning-rate schedule where it gives every step already taken the same rate (lr_at): e.g. more steps
# while still in the warm-up; after it the decay's length changes the rate of the steps taken
SCHEDULE = ("steps", "lr", "warmup", "lr_decay", "lr_floor")


class SetupError(RuntimeError):
    """A setting that cannot work (bad shapes, unknown option, a checkpoint of other settings): one line, exit 2."""


class Diverged(RuntimeError):
    """A training loss that is not finite: the run stops and records it (one line, exit 3)."""


@dataclass(kw_only=True)
class Preset(Backbone):
    """Model (bench.model.Backbone's fields) and training recipe of a task at one scale (bench/tasks/)."""
    seq_len: int
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 100
    eval_every: int = 200
    eval_batches: int = 8  # batches per periodic evaluation; the final evaluation uses final_eval_batches
    final_eval_batches: int = 32
    eval_context: int = 0  # LM tasks: bytes of context kept between evaluation windows


PRESET_FIELDS = tuple(f.name for f in dataclasses.fields(Preset))


@dataclass(kw_only=True)
class RunConfig(Preset):
    """One run: its preset's values as changed by the command line, and the run's own options."""
    method: str
    task: str
    preset: str = "cpu"
    seed: int = 0
    device: str = "auto"
    out: Optional[str] = None
    resume: bool = False
    overwrite: bool = False
    data_dir: Optional[str] = None
    data_file: Optional[str] = None
    no_download: bool = False
    grad_clip: float = 1.0
    lr_decay: str = "cosine"
    lr_floor: float = 0.1
    log_every: int = 50
    no_amp: bool = False
    snapshot_at: Tuple[int, ...] = ()
    attn: Dict[str, object] = field(default_factory=dict)  # a baseline's budget: constructor options, typed
    settings: Optional[object] = None  # a method's settings dataclass (sbm_transformer.SBMConfig, ...)
    given: FrozenSet[str] = field(default=frozenset(), repr=False)  # preset fields set on the command line

    @classmethod
    def of(cls, values: Preset, overrides: Dict[str, object], **options) -> "RunConfig":
        """A preset's ``values`` with ``overrides`` (preset fields given, None = not given) and the run's
        ``options``. An LM's evaluation context keeps its fraction of the window when only the length changes."""
        values = dataclasses.asdict(values)
        given = {name: value for name, value in overrides.items() if value is not None}
        if "seq_len" in given and "eval_context" not in given:
            values["eval_context"] = values["eval_context"] * given["seq_len"] // values["seq_len"]
        return cls(**{**values, **given}, **options, given=frozenset(given))

    def with_defaults(self, **values) -> "RunConfig":
        """Where a method changes its preset (SSA's ALiBi decoder has no positional embeddings): each value
        replaces the preset's unless the command line gave one."""
        return dataclasses.replace(self, **{k: v for k, v in values.items() if k not in self.given})

    @property
    def folder(self) -> Path:
        return Path(self.out or f"runs/{self.method}-{self.task}-{self.preset}-s{self.seed}")

    def as_record(self) -> dict:
        """The flat dict that checkpoints and metrics.json store (a JSON round trip: tuples are lists)."""
        own = [f.name for f in dataclasses.fields(self) if f.name not in (*PRESET_FIELDS, "settings", "given")]
        values = {name: getattr(self, name) for name in [*own, *PRESET_FIELDS]}
        if self.settings is not None:
            values.update(dataclasses.asdict(self.settings))
        return as_json(values)


def as_json(obj):
    """What ``obj`` is after a JSON round trip (tuples become lists): how configs are stored and compared."""
    return json.loads(json.dumps(obj, default=str))


def derive_seed(*parts) -> int:
    """A 63-bit seed from any tuple of parts (stable across runs and platforms)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


def lr_at(step: int, schedule: dict) -> float:
    """Linear warm-up to the peak, then a cosine or linear decay to floor × peak at the last step. ``schedule``:
    lr, warmup, steps, lr_decay, lr_floor (a run's record, or any dict of them)."""
    peak, warmup, total = schedule["lr"], schedule["warmup"], max(1, schedule["steps"])
    floor = schedule["lr_floor"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    remaining = 1 - progress if schedule["lr_decay"] == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return peak * (floor + (1 - floor) * remaining)


def resolve_device(name: str) -> torch.device:
    """auto → CUDA when present, else the CPU; a CUDA device this machine lacks is a ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name} was asked for, but CUDA is not available on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def resume_conflicts(saved: dict, config: dict, context: dict, later: Dict[str, Callable[[dict], int]]
                     ) -> List[str]:
    """'--name old → new' for each setting of this run that differs from the one the checkpoint was trained
    with and would have changed the steps it has already taken. Free to differ: OBSERVING; the SCHEDULE
    settings while lr_at gives every step before the checkpoint's the same rate (and --steps is not below
    it); a method's ``later`` settings ({name: first step it acts on, from a config}) that act from a step no
    earlier than the checkpoint's, in both runs. ``context``: the processes, the device type and the bf16
    autocast, which change every step's numbers and must match too."""
    old, new, step = saved["config"], config, saved["progress"]["step"]
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
