"""Files written atomically, JSON read and written, and where the data live: what run folders, grids and the
tasks' data files share.

A file is written into a temporary file beside it, synced and renamed over it, so a reader (or a run killed
at any instant) sees the old file or the whole new one, never a part. Standard library only: the command
lines' ``--help`` stays light.
"""
import errno
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Optional, Tuple


class DataError(RuntimeError):
    """A dataset is missing, corrupt or cannot be fetched; the message says what to do (exit 1)."""


class WriteError(OSError):
    """A file that could not be written (no space left, over the file-size limit, read-only): which, and why.
    What was there before is untouched (the write was to a temporary file)."""

    def __str__(self):
        return f"cannot write {self.filename}: {self.strerror}; what was there before is kept"


def os_error_line(exc: OSError) -> str:
    """An OSError as one line: what failed, on which file."""
    if isinstance(exc, WriteError) or not exc.strerror:
        return str(exc)
    return exc.strerror + (f": {exc.filename}" if exc.filename else "")


def default_data_dir() -> Path:
    """$SPARSE_ATTN_DATA, else ./data."""
    return Path(os.environ.get("SPARSE_ATTN_DATA", "data"))


def folder_problem(path) -> Optional[str]:
    """What stops ``path`` from being an output folder, or None: a file there or above it, a name or path too
    long, a folder that cannot be written. A missing folder is probed by making and removing a folder in its
    nearest existing parent (permissions alone do not tell: root, read-only file systems), so nothing is left."""
    if str(path) == "":  # a str; Path("") is "."
        return "must name a folder (use . for the current one)"
    path = Path(os.path.abspath(path))
    try:
        limit = os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError):
        limit = 4096
    if len(os.fsencode(str(path))) >= limit:
        return f"the path is longer than the {limit} bytes this system allows"
    existing = path
    try:
        while not existing.exists():
            existing = existing.parent
    except OSError as exc:  # a component too long for the file system, a loop of links
        return f"cannot be used: {exc.strerror}"
    if not existing.is_dir():
        return ("is a file, not a folder" if existing == path else f"cannot be made: {existing} is a file")
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


def temporary_file(path: Path) -> Tuple[int, str]:
    """A temporary file beside ``path`` with the permissions a plain open() would give (mkstemp's are 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.chmod(tmp, plain_mode(0o666))
    return fd, tmp


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write(file)`` into a temporary file, synced and renamed over ``path``. An OS error (no space, a file
    over the size limit) is a WriteError naming ``path``; the temporary file is removed, ``path`` untouched."""
    try:
        fd, tmp = temporary_file(Path(path))
    except OSError as exc:
        raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
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
    """``obj`` with every NaN or infinite float replaced by None."""
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def read_json(path: Path) -> Optional[dict]:
    """The JSON in ``path``, or None when it is absent or unreadable."""
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
            raise SetupError(f"another {self.what} is running in {self.path.parent} (pid {holder}); wait for it or "
                             f"stop it first") from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(str(os.getpid()))
        self.file.flush()
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()
