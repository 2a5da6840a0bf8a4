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
- Checkpoints are written atomically and carry the sha256 of their payload in a one-line header; a damaged,
  truncated or empty one is refused in one line before torch reads it.
"""
import hashlib
import io
import json
from pathlib import Path
from typing import List, Optional

from bench.config import SetupError, resume_conflicts
from bench.files import DataError, write_atomic

CHECKPOINT_HEADER = b"bench.train checkpoint, sha256 of the rest: "


def save_checkpoint(path: Path, state: dict) -> None:
    """torch.save's bytes behind a one-line header with their sha256, written atomically."""
    import torch
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    write_atomic(path, CHECKPOINT_HEADER + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    """The state saved by ``save_checkpoint``. A file that is empty, has no header, fails its checksum
    (truncated, bytes altered) or cannot be read is refused with a SetupError naming it, before torch sees it."""
    import torch

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
        raise SetupError(f"--resume: {out / 'checkpoint.pt'} (step {saved['step']}) was trained with other settings: "
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
