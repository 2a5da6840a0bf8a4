"""A run's configuration as data (``RunConfig``: a task's ``Preset`` with the command line's overrides and the
run's options), and the rules that read it: the learning-rate schedule, the seeds of every draw, the device, whether
its activations fit the device's memory.
"""

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Optional, Tuple

import torch

from bench.model import Backbone

LR_DECAYS = ("cosine", "linear")


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
    init_from: Optional[str] = None  # a checkpoint whose model weights a fresh run starts from
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
    flags: Dict[str, bool] = field(default_factory=dict)  # a method's own switches (SBM's --official)
    given: FrozenSet[str] = field(default=frozenset(), repr=False)  # preset and settings fields given

    @classmethod
    def of(cls, values: Preset, overrides: Dict[str, object], **options) -> "RunConfig":
        """A preset's ``values`` with ``overrides`` (preset fields given, None = not given) and the run's
        ``options``. An LM's evaluation context keeps its fraction of the window when only the length changes."""
        values = dataclasses.asdict(values)
        given = {name: value for name, value in overrides.items() if value is not None}
        if "seq_len" in given and "eval_context" not in given:
            values["eval_context"] = values["eval_context"] * given["seq_len"] // values["seq_len"]
        # A run shorter than its preset's that sets none of its warm-up and evaluation sizes takes the warm-up and
        # final evaluation in proportion (rounded up); setting any keeps the preset's others, as records' commands do
        recipe = {"warmup", "eval_batches", "final_eval_batches"}
        if 0 < given.get("steps", 0) < values["steps"] and not recipe & set(given):
            for name in ("warmup", "final_eval_batches"):
                values[name] = -(-values[name] * given["steps"] // values["steps"])
        return cls(**{**values, **given}, **options, given=frozenset(given))

    def with_defaults(self, **values) -> "RunConfig":
        """Where a method changes its preset (SSA's ALiBi decoder has no positional embeddings): each value
        replaces the preset's unless the command line gave one."""
        return dataclasses.replace(self, **{k: v for k, v in values.items() if k not in self.given})

    def with_settings(self, **values) -> "RunConfig":
        """Where a method's flag changes its settings (SBM's --official): each value replaces the parsed one
        unless the command line gave one."""
        kept = {k: v for k, v in values.items() if k not in self.given}
        return dataclasses.replace(self, settings=dataclasses.replace(self.settings, **kept))

    @property
    def folder(self) -> Path:
        return Path(self.out or f"runs/{self.method}-{self.task}-{self.preset}-s{self.seed}")

    def as_record(self) -> dict:
        """The flat dict that checkpoints and metrics.json store (a JSON round trip: tuples are lists)."""
        own = [f.name for f in dataclasses.fields(self) if f.name not in (*PRESET_FIELDS, "settings", "flags", "given")]
        values = {name: getattr(self, name) for name in [*own, *PRESET_FIELDS]}
        if self.settings is not None:
            values.update(dataclasses.asdict(self.settings))
        values.update(self.flags)
        return json.loads(json.dumps(values, default=str))  # as stored and compared


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


def available_memory(device: str) -> Tuple[int, str]:
    """(bytes, where) a run on ``device`` may use: the GPU's, else MemAvailable, else the machine's RAM."""
    from bench.measure import proc_kib

    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        try:
            index = torch.device(device).index if device.startswith("cuda") else None
            return torch.cuda.get_device_properties(index or 0).total_memory, "on the GPU"
        except (RuntimeError, AssertionError, ValueError):
            pass  # no such device: refused as the run starts (resolve_device)
    available = proc_kib("/proc/meminfo", "MemAvailable")
    if available is not None:
        return available * 1024, "available on this machine"
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "on this machine"  # macOS


def activation_bytes(cfg) -> int:
    """A lower bound of a training step's memory: the tokens and targets (int64), the embeddings (float32), and
    per layer what any attention keeps for the backward — the two LayerNorm inputs and outputs, the query and
    key projections, the attention's output and the MLP's hidden layer — at 2 bytes a value (bf16). A run
    needs more (values, scores, gradients, optimizer state): above this, it cannot fit."""
    tokens = cfg.batch_size * cfg.seq_len
    per_layer = 4 * cfg.dim + 3 * cfg.heads * cfg.head_dim + cfg.mlp_dim
    return tokens * (16 + 4 * cfg.dim + (2 * per_layer * cfg.depth if cfg.steps > 0 else 0))


def memory_problem(cfg) -> Optional[str]:
    """Why a run's sizes cannot fit in the memory it would run in (``activation_bytes``), or None."""
    need = activation_bytes(cfg)
    if need < 2**30:  # a GiB: every machine this runs on has that; nothing to look up
        return None
    have, where = available_memory(cfg.device)
    if need <= have:
        return None
    return (
        f"--batch-size {cfg.batch_size} × --seq-len {cfg.seq_len} (depth {cfg.depth}, width {cfg.dim}) needs at "
        f"least {need / 2**30:,.1f} GiB for the activations alone, more than the "
        f"{have / 2**30:,.1f} GiB {where}; lower --batch-size or --seq-len"
    )
