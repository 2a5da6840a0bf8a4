"""Run folders and the files they hold: checkpoints, the log, files written atomically, JSON, locks, and where
the data live. The standard library only at the top (torch where a checkpoint is read or written).

- A file is written to a temporary file beside it, synced and renamed over it: a reader, or a run killed at any
  instant, sees the old file or the whole new one, never a part.
- A run folder (``--out``) holds one run: ``checkpoint.pt`` (and ``checkpoint-STEP.pt`` snapshots),
  ``log.jsonl`` and, once finished, ``metrics.json``. The old files of an ``--overwrite`` go only once the new
  run is ready to train, metrics.json first, so a refused run changes nothing and a killed one never leaves a
  folder that looks finished beside another run's files. OUT/run.lock names the one process training there.
- A run that should differ from a checkpoint's (a fine-tuning, other settings from a step on) is not a
  ``--resume`` but a fresh one with ``--init-from CHECKPOINT``: its weights with the run's own settings.
"""

import errno
import fcntl
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import BinaryIO, Callable, List, Optional

# What --resume lets differ from the checkpoint's settings: where the run lives and what it reports (the device
# string: its type and the bf16 autocast are compared instead, as they change the numbers; eval_every:
# evaluations draw from their own seeds)
OBSERVING = (
    "out",
    "resume",
    "overwrite",
    "log_every",
    "snapshot_at",
    "eval_every",
    "final_eval_batches",
    "data_dir",
    "no_download",
    "device",
)


class DataError(RuntimeError):
    """A dataset is missing, corrupt or cannot be fetched; the message says what to do (exit 1)."""


class WriteError(OSError):
    """A file that could not be written (no space left, over the file-size limit, read-only): which, and why.
    What was there before is untouched (the write was to a temporary file)."""

    def __str__(self):
        return f"cannot write {self.filename}: {self.strerror}; what was there before is kept"


def os_error_line(exc: OSError) -> str:
    if isinstance(exc, WriteError) or not exc.strerror:
        return str(exc)
    return exc.strerror + (f": {exc.filename}" if exc.filename else "")


def default_data_dir() -> Path:
    """$SPARSE_ATTN_DATA, else ./data."""
    return Path(os.environ.get("SPARSE_ATTN_DATA", "data"))


def folder_problem(path) -> Optional[str]:
    """What stops ``path`` from being an output folder, or None. A missing folder is probed by making and removing
    a folder in its nearest existing parent (permissions alone do not tell: root, read-only file systems)."""
    if str(path) == "":  # a str; Path("") is "."
        return "must name a folder (use . for the current one)"
    path = Path(os.path.abspath(path))
    limit = os.pathconf("/", "PC_PATH_MAX")
    if len(os.fsencode(str(path))) >= limit:
        return f"the path is longer than the {limit} bytes this system allows"
    existing = path
    try:
        while not existing.exists():
            existing = existing.parent
    except OSError as exc:  # a component too long for the file system, a loop of links
        return f"cannot be used: {exc.strerror}"
    if not existing.is_dir():
        return "is a file, not a folder" if existing == path else f"cannot be made: {existing} is a file"
    try:
        name_limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_limit = 255
    too_long = [part for part in path.relative_to(existing).parts if len(os.fsencode(part)) > name_limit]
    if too_long:
        return f"the name {too_long[0][:40]}... is longer than the {name_limit} bytes this file system allows"
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".write-probe-"))
    except OSError as exc:
        where = "" if existing == path else f" in {existing}"
        reason = "read-only" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else exc.strerror
        return f"cannot be written{where}: {reason}" + (f" ({exc.strerror})" if reason != exc.strerror else "")
    return None


def plain_mode(mode: int) -> int:
    """``mode`` less the process's umask: what open() (0o666) or mkdir() (0o777) would give."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write(file)`` into a temporary file (with the permissions a plain open() gives; mkstemp's are 0600),
    synced and renamed over ``path``. An OS error is a WriteError naming ``path``, which is left untouched."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=Path(path).name + ".", suffix=".tmp")
        os.chmod(tmp, plain_mode(0o666))
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise


def write_atomic(path: Path, data: bytes) -> None:
    write_atomic_with(path, lambda f: f.write(data))


def write_json(path: Path, obj) -> None:
    """``obj`` as JSON, a non-finite number written as null (JSON has no NaN)."""
    write_atomic(path, json.dumps(finite(obj), indent=2, allow_nan=False).encode())


def finite(obj):
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


class FolderLock:
    """One process at a time in a folder: an exclusive lock on ``folder/name``, which names its holder (pid)."""

    def __init__(self, folder: Path, name: str, what: str):
        self.path, self.what, self.file = Path(folder) / name, what, None

    def __enter__(self):
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            from bench.config import SetupError

            self.file.seek(0)
            holder = self.file.read().strip() or "unknown"
            self.file.close()
            raise SetupError(
                f"another {self.what} is running in {self.path.parent} (pid {holder}); wait for it or stop it first"
            ) from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(str(os.getpid()))
        self.file.flush()
        return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)  # while still held, so no other process takes a lock on the file going
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


# ------------------------------------------------------------------------------------------------ run folders
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
        import torch

        return {**asdict(self), "train_density": torch.stack(self.train_density) if self.train_density else None}

    @classmethod
    def of(cls, state: dict) -> "Progress":
        density = state["train_density"]
        return cls(
            **{
                **state,
                "step_times": list(state["step_times"]),
                # on the CPU, where the steps to come add theirs (loop.py), whatever device the checkpoint loaded onto
                "train_density": list(density.cpu()) if density is not None else [],
            }
        )


def record_divergence(cfg, step: int, lr: float, done: Progress) -> None:
    """metrics.json of a run stopped at a non-finite loss: status "diverged", the step and its learning rate."""
    write_json(
        cfg.folder / "metrics.json",
        {
            "status": "diverged",
            "method": cfg.method,
            "task": cfg.task,
            "preset": cfg.preset,
            "seed": cfg.seed,
            "diverged_at_step": step,
            "lr": lr,
            "steps": cfg.steps,
            "train_time_s": done.elapsed,
            "wall_time_s": done.wall_time_s,
            "config": cfg.as_record(),
        },
    )


def save_checkpoint(path: Path, state: dict) -> None:
    import torch

    write_atomic_with(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    """The state saved by ``save_checkpoint``: every member of the archive is read against its CRC-32 first, so a
    damaged, truncated or empty one is refused in one line (a SetupError naming it)."""
    import torch
    from bench.config import SetupError

    def refuse(reason: str):
        return SetupError(
            f"the checkpoint {path} {reason}; it cannot be used: start afresh with --overwrite "
            f"(or resume from a good copy)"
        )

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
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 — any failure of a checked file is one line, not a torch traceback
        raise refuse(f"cannot be read by this torch ({type(exc).__name__})") from None
    if not (isinstance(state, dict) and {"model", "optimizer", "progress", "config"} <= state.keys()):
        raise refuse("is not a run's checkpoint: a torch file without a run's model, optimizer, progress and config")
    return state


def run_files(out: Path) -> List[Path]:
    """The files of a run in ``out``: record, checkpoint, snapshots and log (not leftovers of atomic writes)."""
    if not out.is_dir():
        return []
    found = [out / name for name in ("metrics.json", "checkpoint.pt", "log.jsonl") if (out / name).is_file()]
    return found + sorted(out.glob("checkpoint-*.pt"))


def open_folder(cfg, context: dict, device) -> Optional[dict]:
    """The run folder checked before anything is read or made: a fresh run refuses a folder holding a run unless
    --overwrite; with --resume the checkpoint, trained with this run's settings but for those that only observe
    (``OBSERVING``) and in the same ``context`` (processes, device type, autocast), is returned, else None."""
    from bench.config import SetupError

    out = cfg.folder
    if not cfg.resume:
        existing = run_files(out)
        if existing not in ([], [out / "log.jsonl"]) and not cfg.overwrite:  # a log alone: nothing saved to lose
            go_on = "continue it with --resume, or " if (out / "checkpoint.pt").exists() else "it has no checkpoint: "
            raise SetupError(
                f"{out} already holds a run ({', '.join(f.name for f in existing)}): {go_on}replace it with --overwrite"
            )
        return None
    if not (out / "checkpoint.pt").exists():
        raise DataError(f"--resume: no checkpoint at {out / 'checkpoint.pt'}")
    saved = load_checkpoint(out / "checkpoint.pt", map_location=device)
    record, trained = cfg.as_record(), saved["config"]  # a setting a checkpoint predates counts as null
    conflicts = [
        f"--{name.replace('_', '-')} {json.dumps(trained.get(name))} → {json.dumps(record.get(name))}"
        for name in dict.fromkeys([*record, *trained])
        if name not in OBSERVING and trained.get(name) != record.get(name)
    ]
    conflicts += [
        f"{key.replace('_', ' ')} {json.dumps(saved.get(key))} → {json.dumps(value)}"
        for key, value in context.items()
        if saved.get(key) != value
    ]
    if conflicts:
        raise SetupError(
            f"--resume: {out / 'checkpoint.pt'} (step {saved['progress']['step']}) was trained with "
            f"other settings: {', '.join(conflicts)}; a resumed run changes only what observes (start "
            f"afresh with --overwrite, or from its weights with --init-from)"
        )
    return saved


def full_attention_beside(cfg) -> str:
    """What full attention reached with cfg's task and preset values, from its record in its default folder, or
    the command that runs it: the figure a method's final line is read against."""
    from bench.config import PRESET_FIELDS

    full = replace(cfg, method="full", out=None)
    record = read_json(full.folder / "metrics.json") or {}
    same = ("seed", *PRESET_FIELDS)
    if record.get("status") == "complete" and all(record["config"].get(n) == getattr(cfg, n) for n in same):
        return f"full attention {record['test']:.4f} ({full.folder})"
    given = "".join(f" --{name.replace('_', '-')} {getattr(cfg, name)}" for name in PRESET_FIELDS if name in cfg.given)
    return (
        f"full attention: python -m bench.train --method full --task {cfg.task} --preset {cfg.preset} "
        f"--seed {cfg.seed}{given}"
    )


def parameter_fingerprint(model) -> str:
    """sha256 of all parameters' bytes, in registration order: equal iff the weights are identical."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def kept_log(log_file: Path, step: int) -> bytes:
    """log.jsonl's complete JSON lines with a step ≤ ``step`` (a line torn by a kill mid-write is dropped)."""
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
