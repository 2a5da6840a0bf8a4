"""Files written atomically, JSON read and written, and where the data live: what run folders, grids and the
tasks' data files share.

A file is written into a temporary file beside it, synced and renamed over it, so a reader (or a run killed
at any instant) sees the old file or the whole new one, never a part. Standard library only: the command
lines' ``--help`` stays light.
"""
import json
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Optional, Tuple


class DataError(RuntimeError):
    """A dataset is missing, corrupt or cannot be fetched; the message says what to do (exit 1)."""


def default_data_dir() -> Path:
    """$SPARSE_ATTN_DATA, else ./data."""
    return Path(os.environ.get("SPARSE_ATTN_DATA", "data"))


def plain_mode(mode: int) -> int:
    """``mode`` less the process's umask: what open() (0o666) or mkdir() (0o777) would give."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def temporary_file(path: Path) -> Tuple[int, str]:
    """A temporary file beside ``path`` with the permissions a plain open() would give (mkstemp's are 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.chmod(tmp, plain_mode(0o666))
    return fd, tmp


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write(file)`` into a temporary file, synced and renamed over ``path``."""
    fd, tmp = temporary_file(Path(path))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    write_atomic_with(path, lambda f: f.write(data))


def write_json(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2).encode())


def read_json(path: Path) -> Optional[dict]:
    """The JSON in ``path``, or None when it is absent or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
