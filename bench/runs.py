"""Run folders: what a run keeps on disk, and how a fresh, overwriting or resumed run treats what is there.

A run folder (``--out``) holds one run: ``checkpoint.pt`` (and ``checkpoint-STEP.pt`` snapshots), ``log.jsonl``
and, once the run has finished, ``metrics.json`` — the only sign of a finished run (``"status": "complete"``).
- A fresh run refuses a folder that already holds a run's files (exit 2) unless ``--overwrite`` is given: an
  earlier run's hours are not replaced because a command was repeated or an --out mistyped. Files of others
  (a caller's train.log) do not count. With ``--overwrite`` (as with ``--resume``) the old files go only once
  the new run's settings, data and model are ready (``begin``), so a run refused for bad input changes
  nothing, and metrics.json goes first: a run killed at any instant never leaves a folder that looks finished
  beside a checkpoint and log of another run.
- ``--resume`` continues from checkpoint.pt, which must have been trained with this run's settings
  (bench.config.resume_conflicts); log.jsonl keeps its complete lines up to the checkpoint's step: a line torn
  by a kill mid-write, and what was logged after the checkpoint, are dropped.
- A folder holds one run at a time: OUT/run.lock, held while the run trains, names its holder.
- Checkpoints are plain ``torch.save`` dicts (``torch.load(path, weights_only=True)`` reads one), written
  atomically; before one is used, every member of its archive is read against its CRC-32, so a damaged,
  truncated or empty one is refused in one line before torch reads it.
"""
import hashlib
import io
import json
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

import torch

from bench.config import SetupError, resume_conflicts
from bench.files import DataError, write_atomic, write_json

@dataclass
class Progress:
    """What a run has done, kept in its checkpoints: a resumed run ends with an uninterrupted one's record."""
    step: int = 0
    elapsed: float = 0.0  # seconds of training steps
    wall_time_s: float = 0.0  # seconds of the whole run: set-up, evaluations, every process
    step_times: List[float] = field(default_factory=list)  # ms per step
    train_density: List = field(default_factory=list)  # (L,) tensors: the density each step computed, per layer
    peak_memory_bytes: int = 0  # of the training steps

    def state(self) -> dict:
        return {**asdict(self), "train_density": torch.stack(self.train_density) if self.train_density else None}

    @classmethod
    def of(cls, state: dict) -> "Progress":
        density = state["train_density"]
        return cls(**{**state, "step_times": list(state["step_times"]),
                      "train_density": list(density) if density is not None else []})


def record_divergence(cfg, step: int, lr: float, done: Progress) -> None:
    """metrics.json of a run stopped at a non-finite loss: status "diverged", the step and its learning rate."""
    write_json(cfg.folder / "metrics.json", {
        "status": "diverged", "method": cfg.method, "task": cfg.task, "preset": cfg.preset, "seed": cfg.seed,
        "diverged_at_step": step, "lr": lr, "steps": cfg.steps, "train_time_s": done.elapsed,
        "wall_time_s": done.wall_time_s, "config": cfg.as_record()})


def save_checkpoint(path: Path, state: dict) -> None:
    """``torch.save(state)``, written atomically."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(path, buffer.getvalue())


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    """The state saved by ``save_checkpoint``. A file that is empty, not a torch archive, has a member whose bytes
    fail their CRC-32 (truncated, altered) or cannot be read is refused with a SetupError naming it."""

    def refuse(reason: str):
        return SetupError(f"the checkpoint {path} {reason}; it cannot be used: start afresh with --overwrite "
                          f"(or resume from a good copy)")

    try:
        if not Path(path).is_file():  # a device or a link to one would be read without bound
            raise refuse("is not a regular file")
        if Path(path).stat().st_size == 0:
            raise refuse("is empty")
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":  # torch.save's archive begins with its first member
                raise refuse("is damaged: not a torch archive (altered, or written by something else)")
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()  # reads every member against the CRC-32 its header records
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})") from None
    except (zipfile.BadZipFile, EOFError, ValueError):
        raise refuse("is damaged: not a whole torch archive (truncated or altered)") from None
    if damaged is not None:
        raise refuse(f"is damaged: its member {damaged} fails its CRC-32 (altered)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 — any failure of a checked file is one line, not a torch traceback
        raise refuse(f"cannot be read by this torch ({type(exc).__name__})") from None


def run_files(out: Path) -> List[Path]:
    """The files of a run in ``out``: record, checkpoint, snapshots and log (not leftovers of atomic writes)."""
    if not out.is_dir():
        return []
    found = [out / name for name in ("metrics.json", "checkpoint.pt", "log.jsonl") if (out / name).is_file()]
    return found + sorted(out.glob("checkpoint-*.pt"))


def open_folder(cfg, context: dict, later: dict, device) -> Optional[dict]:
    """The run folder checked before anything is read or made: a fresh run refuses a folder holding a run unless
    --overwrite; with --resume the checkpoint, verified and trained with this run's settings (``context``: the
    processes, device type and autocast; ``later``: a method's settings that act only from a step on), is
    returned, else None."""
    out = cfg.folder
    if not cfg.resume:
        existing = run_files(out)
        if existing and not cfg.overwrite:
            raise SetupError(f"{out} already holds a run ({', '.join(f.name for f in existing)}): continue it "
                             f"with --resume, or replace it with --overwrite")
        return None
    if not (out / "checkpoint.pt").exists():
        raise DataError(f"--resume: no checkpoint at {out / 'checkpoint.pt'}")
    saved = load_checkpoint(out / "checkpoint.pt", map_location=device)
    conflicts = resume_conflicts(saved, cfg.as_record(), context, later)
    if conflicts:
        raise SetupError(f"--resume: {out / 'checkpoint.pt'} (step {saved['progress']['step']}) was trained with other settings: "
                         f"{', '.join(conflicts)}; what changes the steps already taken must match (or start afresh "
                         f"with --overwrite)")
    return saved


def parameter_fingerprint(model) -> str:
    """sha256 of all parameters' bytes, in registration order: equal iff the weights are identical."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


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


def begin(out: Path, resume: bool, step: int) -> None:
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
