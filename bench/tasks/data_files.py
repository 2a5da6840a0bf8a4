"""The tasks' data files, looked up under ``--data-dir`` ($SPARSE_ATTN_DATA, else ./data): archives read or
extracted safely, the one downloader, and the caches of decoded data. A missing or corrupt file is a DataError
saying what was looked for, where, and how to get it (exit 1). ``SPARSE_ATTN_OFFLINE`` turns every download
off. Caches are uncompressed ``.npz`` files keyed by the source's sha256 (archives) or its names, sizes and
times (folders).
"""

import contextlib
import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Callable, Collection, Dict, Iterator, List, Optional, Tuple

from bench.files import DataError, folder_problem, plain_mode, write_atomic_with

if TYPE_CHECKING:  # numpy is imported where a cache is read or written: the command lines' --help stays light
    import numpy as np

MAX_MEMBER_BYTES = 64 << 20  # an archive member read into memory (the largest real one: a 31 MB CIFAR-10 batch)
MAX_EXTRACTED_BYTES = 16 << 30  # an archive member extracted to disk (LRA's AAN TSVs)


# ------------------------------------------------------------------------------------------ files
@contextlib.contextmanager
def created_folders(folder: Path):
    """Creates ``folder`` with its missing parents for the block; if the block fails, removes the ones it
    created (deepest first, and only while empty), so a failed download or extraction leaves no folders."""
    missing, parent = [], Path(folder)
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the folder {folder}: {exc.strerror}") from None
    try:
        yield
    except BaseException:
        for created in missing:
            try:
                created.rmdir()
            except OSError:
                break
        raise


# ------------------------------------------------------------------------------------------ archives
def check_member(name: str, archive: Path, kind: str = "file") -> PurePosixPath:
    """A member's path relative to the archive root; DataError for anything that could land outside it."""
    reason = None
    if kind not in ("file", "dir"):
        reason = f"is a {kind}"
    elif not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        reason = "has an absolute path"
    elif "\\" in name or "\x00" in name:
        reason = "has a backslash or NUL in its name"
    elif ".." in PurePosixPath(name).parts:
        reason = "has a '..' component"
    if reason:
        raise DataError(
            f"refusing the archive {archive}: member {name!r} {reason} (links, absolute or '..' "
            f"paths could write outside the data folder). Use an untampered copy of the archive."
        )
    return PurePosixPath(name)


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.isfile():
        return "file"
    if member.isdir():
        return "dir"
    return {tarfile.SYMTYPE: "symbolic link", tarfile.LNKTYPE: "hard link"}.get(member.type, "special file")


def _zip_kind(info: zipfile.ZipInfo) -> str:
    mode = info.external_attr >> 16
    if (mode & 0o170000) == 0o120000:
        return "symbolic link"
    if mode and (mode & 0o170000) not in (0, 0o100000, 0o040000):
        return "special file"
    return "dir" if info.is_dir() else "file"


def check_size(name: PurePosixPath, size: int, archive: Path, limit: int) -> None:
    if size > limit:
        raise DataError(
            f"refusing the archive {archive}: member {name} declares {size:,} bytes, more than the "
            f"{limit:,} allowed for it (a damaged or hostile archive). Use an untampered copy."
        )


def archive_members(
    path: Path, want: Callable[[PurePosixPath], bool], limit: int, consume: Callable[[PurePosixPath, IO[bytes]], object]
) -> Iterator[Tuple[PurePosixPath, object]]:
    """(member path, consume(member path, member stream)) for the regular files of a tar (any compression) or
    zip archive that ``want`` selects, in archive order, in one sequential pass. Every member is checked
    (``check_member``) before anything of it is used, and its declared size against ``limit`` before it is
    read (the readers stop at the declared size): an unsafe one stops the whole archive with a DataError."""
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                infos = zf.infolist()
                for info in infos:
                    check_member(info.filename, path, _zip_kind(info))
                for info in infos:
                    name = PurePosixPath(info.filename)
                    if not info.is_dir() and want(name):
                        check_size(name, info.file_size, path, limit)
                        with zf.open(info) as stream:
                            yield name, consume(name, stream)
            return
        with tarfile.open(path, "r|*") as tf:  # streaming: no seeking back through a compressed archive
            for member in tf:
                name = check_member(member.name, path, _tar_kind(member))
                if member.isfile() and want(name):
                    check_size(name, member.size, path, limit)
                    yield name, consume(name, tf.extractfile(member))
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise DataError(f"cannot read the archive {path}: {exc}. Delete it and fetch it again.") from None


def iter_archive(
    path: Path, want: Callable[[PurePosixPath], bool] = lambda p: True
) -> Iterator[Tuple[PurePosixPath, bytes]]:
    """(member path, bytes) of the selected regular files (``archive_members``), each at most
    ``MAX_MEMBER_BYTES``."""
    return archive_members(path, want, MAX_MEMBER_BYTES, lambda name, stream: stream.read())


def safe_extract(
    archive: Path,
    dest: Path,
    want: Callable[[PurePosixPath], bool] = lambda p: True,
    rename: Callable[[PurePosixPath], PurePosixPath] = lambda p: p,
    required: Collection[PurePosixPath] = (),
) -> List[Path]:
    """Writes the selected regular files of ``archive`` under ``dest`` (at ``rename(member path)``), each
    streamed to disk (at most ``MAX_EXTRACTED_BYTES``). Links, absolute and '..' paths are refused
    (``archive_members``) and every target is checked to lie inside ``dest``. Everything goes first to a
    temporary folder beside ``dest`` and is moved into place only when the whole archive passed and every
    path in ``required`` was among the files: otherwise nothing is left (nor the folders made for it)."""
    dest = Path(dest)
    root = os.path.normpath(os.path.abspath(dest))

    def stage(name: PurePosixPath, stream: IO[bytes]) -> PurePosixPath:
        relative = check_member(str(rename(name)), archive)
        target = os.path.normpath(os.path.join(root, *relative.parts))
        if os.path.commonpath([root, target]) != root:
            raise DataError(f"refusing the archive {archive}: {name} would land outside {dest}")
        staged = staging.joinpath(*relative.parts)
        staged.parent.mkdir(parents=True, exist_ok=True)
        with open(staged, "wb") as out:
            shutil.copyfileobj(stream, out, 1 << 20)
        return relative

    with created_folders(dest.parent):
        staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial"))
        os.chmod(staging, plain_mode(0o777))  # mkdtemp's are 0700, and the folder may become dest itself
        try:
            relatives = [relative for _, relative in archive_members(archive, want, MAX_EXTRACTED_BYTES, stage)]
            missing = sorted(set(map(str, required)) - set(map(str, relatives)))
            if missing:
                raise DataError(f"{archive} lacks {missing} (found {sorted(map(str, relatives))})")
            if not dest.exists():
                os.replace(staging, dest)  # one rename: every file appears at once
            for relative in relatives:
                staged, target = staging.joinpath(*relative.parts), dest.joinpath(*relative.parts)
                if staged.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staged, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return [dest.joinpath(*relative.parts) for relative in relatives]


# ------------------------------------------------------------------------------------------ downloads
def offline() -> bool:
    return bool(os.environ.get("SPARSE_ATTN_OFFLINE"))


def fetch(
    url: str,
    path: Path,
    help_text: str,
    sha256: Optional[str] = None,
    md5: Optional[str] = None,
    verify: Optional[Callable[[Path], Optional[str]]] = None,
    allowed: bool = True,
) -> Path:
    """Downloads ``url`` to ``path`` through ``path.partial``, renamed into place only when the bytes have the
    given checksum (sha256 or md5) and ``verify(partial)`` (a check of the content: what is wrong, or None)
    finds nothing wrong. On any failure the partial file and the folders made for it are deleted. The one
    downloader of the harness; ``allowed=False`` (a task's --no-download) or SPARSE_ATTN_OFFLINE: none."""
    if not allowed or offline():
        raise DataError(help_text + " (Downloads are off.)")
    partial = path.with_name(path.name + ".partial")
    digest = hashlib.sha256() if sha256 else hashlib.md5()
    with created_folders(path.parent):
        try:
            # a browser's User-Agent: some hosts (WikiText's) answer urllib's default with 403
            request = urllib.request.Request(url, headers={"User-Agent": "Mozilla/5.0 (compatible; sparse-attn)"})
            with urllib.request.urlopen(request, timeout=60) as response, open(partial, "wb") as out:
                size = getattr(response, "headers", {}).get("Content-Length")  # a test's file-like has none
                size = f"{int(size) / 2**20:.0f} MiB" if size and size.isdigit() else "size unknown"
                print(f"downloading {url} ({size}) to {path} ...", flush=True)
                for block in iter(lambda: response.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
            expected = sha256 or md5
            problem = None
            if expected is not None and digest.hexdigest() != expected:
                problem = f"has {digest.name} {digest.hexdigest()}, expected {expected}"
            elif verify is not None:
                problem = verify(partial)
            if problem is not None:
                raise DataError(f"{help_text} The download from {url} {problem}; it was deleted.")
            partial.replace(path)
        except OSError as exc:
            raise DataError(f"{help_text} The download failed: {exc}") from None
        finally:
            partial.unlink(missing_ok=True)
    return path


# ------------------------------------------------------------------------------------------ caches
def cache_folders(data_dir: Path) -> List[Path]:
    """Where caches live, in order: $SPARSE_ATTN_CACHE alone, else <data_dir>/cache and ~/.cache/sparse-attn."""
    if os.environ.get("SPARSE_ATTN_CACHE"):
        return [Path(os.environ["SPARSE_ATTN_CACHE"])]
    return [Path(data_dir) / "cache", Path.home() / ".cache" / "sparse-attn"]


def source_key(path: Path) -> str:
    """sha256 of an archive file; for a folder, of its listing (relative names, sizes, mtimes)."""
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_file():
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        return digest.hexdigest()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        digest.update(f"{file.relative_to(path).as_posix()}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def cached(
    data_dir: Path,
    name: str,
    build: Callable[[], Dict[str, "np.ndarray"]],
    check: Callable[[Dict[str, "np.ndarray"]], Optional[str]],
) -> Dict[str, "np.ndarray"]:
    """The cache ``name`` from the first cache folder that holds a readable one that ``check`` (what is wrong
    with its arrays, or None) accepts, else ``build()``, saved. A cache that fails the check (other keys, cut
    short, another shape) is said and rebuilt, never trained on. Where the cache will go is found before the
    build; with no writable cache folder the data are built and used, not kept (said in one line). The folder is
    made only once the build succeeded, so a build that fails leaves none."""
    import numpy as np

    for folder in cache_folders(data_dir):
        path = folder / f"{name}.npz"
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {key: f[key] for key in f.files}
        except (OSError, ValueError, zipfile.BadZipFile):  # none there, or damaged: built again
            continue
        try:
            problem = check(arrays)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            problem = f"does not hold the arrays expected ({type(exc).__name__}: {exc})"
        if problem is None:
            return arrays
        print(f"the cache {path} {problem}; it is rebuilt", flush=True)
    # the first folder that exists or can be made, and can be written (probed, nothing made)
    target = next((folder for folder in cache_folders(data_dir) if folder_problem(folder) is None), None)
    arrays = build()
    if target is None:
        print(
            f"no writable cache folder (tried {', '.join(map(str, cache_folders(data_dir)))}): the decoded data are "
            f"used but not kept; set SPARSE_ATTN_CACHE to a writable folder to keep them",
            flush=True,
        )
        return arrays
    try:
        target.mkdir(parents=True, exist_ok=True)
        write_atomic_with(target / f"{name}.npz", lambda f: np.savez(f, **arrays))
    except OSError as exc:
        print(
            f"the cache {target / f'{name}.npz'} could not be written ({exc}); the data are used but not kept",
            flush=True,
        )
    return arrays


def array_problem(
    arrays: Dict[str, "np.ndarray"], shapes: Dict[str, tuple], dtypes: Dict[str, str] = None
) -> Optional[str]:
    """What is wrong with a cache's ``arrays`` against the expected ``shapes`` ({key: shape}, None where any size
    goes) and dtype kinds ({key: "u", "i", "b", ...}), or None."""
    missing = sorted(set(shapes) - set(arrays))
    if missing:
        return f"lacks the arrays {missing} (holds {sorted(arrays)})"
    for key, shape in shapes.items():
        actual = arrays[key].shape
        if len(actual) != len(shape) or any(want is not None and want != got for want, got in zip(shape, actual)):
            return f"has {key} of shape {actual}, expected {tuple('any' if d is None else d for d in shape)}"
        if dtypes and key in dtypes and arrays[key].dtype.kind != dtypes[key]:
            return f"has {key} of dtype {arrays[key].dtype}"
    return None


def ragged_problem(arrays: Dict[str, "np.ndarray"], data: str, offsets: str, count: int) -> Optional[str]:
    """What is wrong with ``count`` ragged documents stored as bytes ``data`` and ``count + 1`` ``offsets``, or None."""
    problem = array_problem(arrays, {data: (None,), offsets: (count + 1,)}, {data: "u", offsets: "i"})
    if problem is None:
        o = arrays[offsets]
        if o[0] != 0 or o[-1] != len(arrays[data]) or (len(o) > 1 and (o[1:] < o[:-1]).any()):
            problem = f"has offsets {offsets} that do not cover {data}"
    return problem
