"""Long Range Arena tasks (Tay et al. 2021, arXiv:2011.04006): text, image, pathfinder, retrieval.

Every task has a ``cpu`` preset (a few minutes of training on 2 cores: 256-token sequences, batch 32 or 16,
800 steps, evaluation on 1024-example prefixes of the fixed validation and test splits) and a ``paper``
preset: the SBM paper's Table 7 (Cho et al. 2022, App. C: 2 layers, 2 heads, width 64, FFN 128, head dim 32,
dropout and attention dropout 0.1, mean pooling; per task length, batch, learning rate and steps) with the
warm-up, evaluation period and weight decay 0 of the LRA configuration its code uses (``lra_config.py``
of the Nyströmformer/SBM PyTorch LRA code). Table 7 calls the step counts "epochs"; they are optimiser steps.
The harness's schedule (linear warm-up, cosine decay to 10%) replaces that code's linear decay.

- ``text`` — byte-level IMDB sentiment (Maas et al. 2011), 2 classes. A byte b is token b + 1 and 0 is
  padding (vocabulary 257; TFDS's ByteTextEncoder, which LRA uses, likewise shifts bytes past reserved ids).
  Reviews are truncated to ``seq_len`` bytes: paper 3072 (Table 7; the SBM code keeps 3000 bytes and pads to
  3072, LRA's own config 1000, S4-style loaders 4096). Splits: LRA has none for validation and evaluates on
  the test set (valid = test); we hold out a fixed 10% of the training reviews (2,500, drawn with a fixed
  seed, whatever ``--seed``) as validation, train on the other 22,500 and keep the 25,000 test reviews for
  the test metric. Reads the aclImdb layout (train/pos, train/neg, test/pos, test/neg) from an extracted
  folder or straight from the .tar.gz (the local ``imdb/aclImdb_v1_labeled.tar.gz`` or the official
  ``aclImdb_v1.tar.gz``, whose ``train/unsup`` is skipped); downloads the official archive (sha256-checked)
  when none is present and downloads are allowed.
- ``image`` — CIFAR-10 (Krizhevsky 2009) as a sequence of grayscale pixels, 10 classes. LRA's conversion
  (``tf.image.rgb_to_grayscale``: 0.2989 R + 0.5870 G + 0.1140 B in float32, back to uint8 by truncating
  x * 255.5). Tokens are the intensities 0-255 (vocabulary 256). Every pixel is a real token: there is no
  padding and ``key_padding_mask`` is None (loaders that treat 0 as padding mask black pixels). Splits
  45,000 / 5,000 / 10,000 as LRA (train[:90%] / train[90%:] / test): from ``cifar-10-python`` the last 5,000
  training images in batch order are the validation set (LRA takes TFDS's stored, hash-shuffled order, which
  cannot be reproduced without TFDS); from an image-folder tree the last 500 per class. Paper length 1024
  (32x32); a shorter ``seq_len`` (256 = 16x16, 64 = 8x8) averages 2x2 or 4x4 blocks — the CPU preset uses 256.
  Reads the lossless ``cifar-10-python.tar.gz`` (or its extracted ``cifar-10-batches-py/``; md5 of every
  batch checked before it is unpickled, and unpickled with only numpy's array constructors allowed) or an
  image-folder tree ``{train,test}/<class>/*.jpg|png`` such as the local ``cifar10/cifar10_jpeg.tar.gz``
  (lossy JPEG; decoding needs Pillow: ``pip install -r requirements-extra.txt``).
- ``pathfinder`` — LRA Pathfinder-style images (Linsley et al. 2018) from our own generator (see
  ``generate_pathfinder``), 2 classes: are the two markers joined by one path? Pixels 0-255 as tokens, no
  padding. LRA's 32x32 settings at seq_len 1024 (paper); the CPU preset draws 16x16 images (seq_len 256)
  with the lengths scaled down (``PathfinderParams.for_side``). Sizes: LRA's 80/10/10 of 200,000 images at
  32x32 and above, 12,000 / 2,000 / 2,000 below; generated from ``--seed`` (like ``listops``) and cached.
- ``retrieval`` — LRA's AAN citation matching (Radev et al. 2009): two byte-level documents (tokens as in
  ``text``, each truncated to ``seq_len`` after LRA's 10,000-byte clip), encoded by the same encoder (the
  ``pair`` head), 2 classes. Reads LRA's released TSVs ``tsv_data/new_aan_pairs.{train,eval,test}.tsv``
  (tab-separated, no header, columns label, id1, id2, text1, text2; 147,086 / 18,090 / 17,437 pairs) from
  the extracted LRA release, or extracts just them from ``lra_release.gz`` when that archive is in the data
  folder. Paper length 4096 per document (Table 7; the SBM code keeps 4000 bytes and pads to 4096).

Data and caches. Files are looked up under ``--data-dir`` (``$SPARSE_ATTN_DATA``, else ``./data``), or at
``--data-file`` (an archive or folder for text / image, the TSV folder for retrieval). Decoded data are
cached as uncompressed ``.npz`` files keyed by the source's sha256 (archives) or by a listing of names,
sizes and modification times (folders, TSVs), written atomically, under ``$SPARSE_ATTN_CACHE``, else
``<data-dir>/cache`` when it is writable, else ``~/.cache/sparse-attn`` (a cache found in any of them is
read; the folder is made only when a cache is written, after the data were read successfully). Archives are
read or extracted member by member: absolute names, ``..`` components, links and device files are refused
with a DataError and nothing is written outside the destination folder. A member is read into memory only up
to ``MAX_MEMBER_BYTES`` (64 MiB; the largest real one, a CIFAR-10 batch, is 31 MB) and extracted to disk only
up to ``MAX_EXTRACTED_BYTES`` (16 GiB): a larger declared size is refused before anything of it is read.
Extraction goes to a temporary folder, moved into place only once the whole archive passed, so a refused
archive leaves no members behind. Downloads go to a ``.partial`` file and are renamed only after their
checksum matched; a failed download is deleted, with the folders made for it.

Shape legend: B batch, N tokens (seq_len), S image side, P pixels (S*S), K snake steps.
"""
import hashlib
import io
import math
import os
import pickle
import tarfile
import shutil
import tempfile
import urllib.request
import zipfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Callable, Collection, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from bench.tasks import DataError, Preset, Task, created_folders, plain_mode, sha256_file, write_atomic_with

SPLIT_SEED = 20240611  # fixed hold-out and evaluation order of the real-data splits, independent of --seed
MAX_MEMBER_BYTES = 64 << 20  # an archive member read into memory (the largest real one: a 31 MB CIFAR-10 batch)
MAX_EXTRACTED_BYTES = 16 << 30  # an archive member extracted to disk (LRA's AAN TSVs)


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
        raise DataError(f"refusing the archive {archive}: member {name!r} {reason} (links, absolute or '..' "
                        f"paths could write outside the data folder). Use an untampered copy of the archive.")
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
        raise DataError(f"refusing the archive {archive}: member {name} declares {size:,} bytes, more than the "
                        f"{limit:,} allowed for it (a damaged or hostile archive). Use an untampered copy.")


def archive_members(path: Path, want: Callable[[PurePosixPath], bool], limit: int,
                    consume: Callable[[PurePosixPath, IO[bytes]], object]) -> Iterator[Tuple[PurePosixPath, object]]:
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


def iter_archive(path: Path, want: Callable[[PurePosixPath], bool] = lambda p: True
                 ) -> Iterator[Tuple[PurePosixPath, bytes]]:
    """(member path, bytes) of the selected regular files (``archive_members``), each at most
    ``MAX_MEMBER_BYTES``."""
    return archive_members(path, want, MAX_MEMBER_BYTES, lambda name, stream: stream.read())


def safe_extract(archive: Path, dest: Path, want: Callable[[PurePosixPath], bool] = lambda p: True,
                 rename: Callable[[PurePosixPath], PurePosixPath] = lambda p: p,
                 required: Collection[PurePosixPath] = ()) -> List[Path]:
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


def fetch(url: str, path: Path, help_text: str, sha256: Optional[str] = None, md5: Optional[str] = None) -> Path:
    """Downloads ``url`` to ``path`` through ``path.partial``; renamed only when the checksum matches. On any
    failure the partial file and the folders made for it are deleted."""
    partial = path.with_name(path.name + ".partial")
    digest = hashlib.sha256() if sha256 else hashlib.md5()
    with created_folders(path.parent):
        print(f"downloading {url} to {path} ...", flush=True)
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
                for block in iter(lambda: response.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
            expected = sha256 or md5
            if digest.hexdigest() != expected:
                raise DataError(f"{help_text} The download from {url} has {digest.name} {digest.hexdigest()}, "
                                f"expected {expected}; it was deleted.")
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


def writable_cache_folder(data_dir: Path) -> Path:
    """The first of ``cache_folders`` that exists or can be made, and can be written."""
    folders = cache_folders(data_dir)
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder
        except OSError:
            pass
    raise DataError(f"no writable cache folder: set SPARSE_ATTN_CACHE (tried {', '.join(map(str, folders))})")


def load_cache(path: Path) -> Optional[Dict[str, np.ndarray]]:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            return {key: f[key] for key in f.files}
    except (OSError, ValueError, zipfile.BadZipFile):
        return None  # a damaged cache is rebuilt


def save_cache(path: Path, arrays: Dict[str, np.ndarray]) -> None:
    write_atomic_with(path, lambda f: np.savez(f, **arrays))


def source_key(path: Path) -> str:
    """sha256 of an archive file; for a folder, of its listing (relative names, sizes, mtimes)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        digest.update(f"{file.relative_to(path).as_posix()}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def cached(data_dir: Path, name: str, build: Callable[[], Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """The cache ``name`` from the first cache folder that holds a readable one, else ``build()``, saved; the
    cache folder is made only then, so a build that fails leaves none."""
    for folder in cache_folders(data_dir):
        arrays = load_cache(folder / f"{name}.npz")
        if arrays is not None:
            return arrays
    arrays = build()
    save_cache(writable_cache_folder(data_dir) / f"{name}.npz", arrays)
    return arrays


# ------------------------------------------------------------------------------------------ byte documents
class Docs:
    """Variable-length byte documents stored ragged: one uint8 array and offsets (n + 1)."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data, self.offsets = data, offsets

    @classmethod
    def from_list(cls, docs: List[bytes], clip: Optional[int] = None) -> "Docs":
        docs = [d[:clip] for d in docs] if clip else docs
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(d) for d in docs])
        return cls(np.frombuffer(b"".join(docs), dtype=np.uint8).copy(), offsets)

    def __len__(self):
        return len(self.offsets) - 1

    def tokens(self, idx: np.ndarray, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, n) long tokens (byte + 1, 0 = padding) of the first n bytes, and the (B, n) padding mask."""
        starts = self.offsets[idx]
        lengths = np.minimum(self.offsets[idx + 1] - starts, n)
        valid = np.arange(n)[None, :] < lengths[:, None]  # (B, n)
        flat = np.where(valid, starts[:, None] + np.arange(n)[None, :], 0)
        tokens = np.where(valid, self.data[flat].astype(np.int64) + 1, 0)
        return torch.from_numpy(tokens), torch.from_numpy(~valid)


# ------------------------------------------------------------------------------------------ the task base
class LRATask(Task):
    """Fixed splits held in memory; a batch is built from example indices by ``batch``."""
    download_allowed = True
    reads_files = True
    data_file: Optional[str] = None

    def split_size(self, split: str) -> int:
        raise NotImplementedError

    def batch(self, split: str, idx: np.ndarray) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def train_batch(self, batch_size, generator):
        idx = torch.randint(self.split_size("train"), (batch_size,), generator=generator).numpy()
        return self.batch("train", idx)

    def eval_batches(self, split, batch_size, limit):
        total = self.split_size(split)
        stop = total if limit is None else min(total, limit * batch_size)
        for start in range(0, stop, batch_size):
            yield self.batch(split, np.arange(start, min(stop, start + batch_size)))

    def may_download(self) -> bool:
        return self.download_allowed and not offline()

    def given_file(self) -> Optional[Path]:
        """The path named by --data-file (which must exist), or None when the data is looked up."""
        if self.data_file is None:
            return None
        path = Path(self.data_file)
        if not path.exists():
            raise DataError(f"{self.name}: nothing at {path} (given by --data-file)")
        return path


def lra_presets(seq_len: int, batch_size: int, lr: float, steps: int, warmup: int, eval_every: int,
                eval_batches: int, cpu_batch: int = 32) -> Dict[str, Preset]:
    """The CPU preset (256 tokens, 800 steps) and the paper preset (Table 7 with the given values)."""
    cpu = Preset(seq_len=256, dim=64, depth=2, heads=2, head_dim=32, mlp_dim=128, dropout=0.1, attn_dropout=0.0,
                 steps=800, batch_size=cpu_batch, lr=1e-3, weight_decay=0.01, warmup=80, eval_every=200,
                 eval_batches=8, final_eval_batches=1024 // cpu_batch)
    paper = Preset(seq_len=seq_len, dim=64, depth=2, heads=2, head_dim=32, mlp_dim=128, dropout=0.1,
                   attn_dropout=0.1, steps=steps, batch_size=batch_size, lr=lr, weight_decay=0.0, warmup=warmup,
                   eval_every=eval_every, eval_batches=eval_batches, final_eval_batches=1_000_000)
    return {"cpu": cpu, "paper": paper}


def fixed_permutation(n: int, salt: int = 0) -> np.ndarray:
    return np.random.default_rng(SPLIT_SEED + salt).permutation(n)


# ------------------------------------------------------------------------------------------ text (IMDB)
class Text(LRATask):
    """LRA byte-level text classification on IMDB. CPU preset: the first 256 bytes of each review, batch 32,
    800 steps. Paper preset (Table 7 "Text"): 3072 bytes, batch 128, lr 5e-4, 20,000 steps, warm-up 8000."""
    URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
    SHA256 = "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe"
    FOLDERS = ("imdb/aclImdb", "aclImdb")
    ARCHIVES = ("imdb/aclImdb_v1_labeled.tar.gz", "imdb/aclImdb_v1.tar.gz", "aclImdb_v1.tar.gz")
    PER_FOLDER = 12_500  # reviews in each of train/pos, train/neg, test/pos, test/neg
    VALID_FRACTION = 0.1

    def __init__(self):
        super().__init__("text", "cls", vocab_size=257, num_classes=2, metric="accuracy",
                         presets=lra_presets(3072, 128, 5e-4, 20_000, 8000, 500, 20))

    def locate(self, data_dir: Path) -> Path:
        given = self.given_file()
        if given is not None:
            return given
        for name in self.FOLDERS:
            if (data_dir / name / "train" / "pos").is_dir():
                return data_dir / name
        for name in self.ARCHIVES:
            if (data_dir / name).is_file():
                return data_dir / name
        help_text = (f"text: no IMDB reviews under {data_dir} (looked for the folders "
                     f"{', '.join(str(data_dir / f) for f in self.FOLDERS)} with train/pos, train/neg, test/pos, "
                     f"test/neg, and the archives {', '.join(str(data_dir / a) for a in self.ARCHIVES)}). "
                     f"Download {self.URL} (sha256 {self.SHA256}) into {data_dir / 'imdb'}, or pass --data-file, "
                     f"or set --data-dir / SPARSE_ATTN_DATA.")
        if not self.may_download():
            raise DataError(help_text + " (Downloads are off.)")
        return fetch(self.URL, data_dir / "imdb" / "aclImdb_v1.tar.gz", help_text, sha256=self.SHA256)

    def read(self, source: Path) -> Dict[str, np.ndarray]:
        """All labelled reviews, ordered by (split, label, review id): bytes, offsets, label, split (1 = test)."""
        found = {}

        def keep(rel: PurePosixPath) -> bool:
            parts = rel.parts
            return (len(parts) >= 3 and parts[-3] in ("train", "test") and parts[-2] in ("pos", "neg")
                    and parts[-1].endswith(".txt"))

        if source.is_dir():
            items = ((PurePosixPath(p.relative_to(source).as_posix()), p.read_bytes())
                     for p in source.rglob("*.txt"))
        else:
            items = iter_archive(source, keep)
        for rel, data in items:
            if keep(rel):
                split, label, stem = rel.parts[-3], rel.parts[-2], rel.parts[-1][:-4]
                review_id = int(stem.split("_")[0]) if stem.split("_")[0].isdigit() else stem
                found[(split == "test", label == "pos", review_id)] = data
        for split in ("train", "test"):
            for label in ("pos", "neg"):
                count = sum(1 for k in found if k[0] == (split == "test") and k[1] == (label == "pos"))
                if count != self.PER_FOLDER:
                    raise DataError(f"text: {source} has {count} reviews in {split}/{label}, expected "
                                    f"{self.PER_FOLDER} (the aclImdb layout). Fetch {self.URL} again.")
        keys = sorted(found, key=lambda k: (k[0], k[1], str(type(k[2])), k[2]))
        docs = Docs.from_list([found[k] for k in keys])
        return {"bytes": docs.data, "offsets": docs.offsets, "label": np.array([k[1] for k in keys], np.int64),
                "test": np.array([k[0] for k in keys], bool)}

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        self.seq_len = seq_len
        source = self.locate(Path(data_dir))
        arrays = cached(data_dir, f"imdb-bytes-{source_key(source)[:20]}", lambda: self.read(source))
        docs = Docs(arrays["bytes"], arrays["offsets"])
        train, test = np.flatnonzero(~arrays["test"]), np.flatnonzero(arrays["test"])
        train = train[fixed_permutation(len(train))]
        n_valid = int(round(len(train) * self.VALID_FRACTION))
        order = {"train": train[n_valid:], "valid": train[:n_valid], "test": test[fixed_permutation(len(test), 1)]}
        self.splits = {split: (docs, idx, arrays["label"][idx]) for split, idx in order.items()}

    def split_size(self, split):
        return len(self.splits[split][1])

    def batch(self, split, idx):
        docs, rows, labels = self.splits[split]
        tokens, mask = docs.tokens(rows[idx], self.seq_len)
        return {"tokens": tokens, "targets": torch.from_numpy(labels[idx]), "key_padding_mask": mask}


# ------------------------------------------------------------------------------------------ image (CIFAR-10)
CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR_PY_MD5 = {"data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
                "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
                "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e"}


def lra_grayscale(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 RGB → (...) uint8, as tf.image.rgb_to_grayscale on uint8 images: the weighted sum in
    float32 of the [0, 1] values, converted back by truncating x * 255.5."""
    weights = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
    gray = (rgb.astype(np.float32) / np.float32(255.0)) @ weights
    return (gray * np.float32(255.5)).astype(np.uint8)


def pool_image(pixels: np.ndarray, side: int) -> np.ndarray:
    """(n, S*S) uint8 → (n, side*side): the mean of each (S/side)² block, rounded."""
    full = int(round(math.sqrt(pixels.shape[1])))
    if side == full:
        return pixels
    f = full // side
    blocks = pixels.reshape(-1, side, f, side, f).astype(np.float32).mean((2, 4))
    return np.round(blocks).astype(np.uint8).reshape(len(pixels), side * side)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles CIFAR batches allowing only numpy's array reconstruction (no arbitrary code)."""
    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        if module == "numpy.core.multiarray":  # numpy 1.x pickles; numpy 2 moved it
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


def square_side(seq_len: int, task: str, sides=None) -> int:
    side = int(round(math.sqrt(seq_len)))
    if side * side != seq_len or (sides is not None and side not in sides):
        allowed = ", ".join(str(s * s) for s in sides) if sides else "a square"
        raise ValueError(f"{task}: seq_len must be {allowed} (an image of side² pixels), got {seq_len}")
    return side


class Image(LRATask):
    """LRA image classification on CIFAR-10 grayscale. CPU preset: 16x16 (2x2 block means, 256 tokens), batch
    32, 800 steps. Paper preset (Table 7 "Image"): 1024 pixels, batch 1024, lr 5e-4, 35,000 steps, warm-up 175."""
    URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    MD5 = "c58f30108f718f92721af3b95e74349a"
    PYTHON_FOLDERS = ("cifar10/cifar-10-batches-py", "cifar-10-batches-py")
    PYTHON_ARCHIVES = ("cifar10/cifar-10-python.tar.gz", "cifar-10-python.tar.gz")
    IMAGE_FOLDERS = ("cifar10/cifar10_jpeg", "cifar10_jpeg")
    IMAGE_ARCHIVES = ("cifar10/cifar10_jpeg.tar.gz",)
    COUNTS = {"train": 50_000, "test": 10_000}
    VALID = 5_000

    def __init__(self):
        super().__init__("image", "cls", vocab_size=256, num_classes=10, metric="accuracy",
                         presets=lra_presets(1024, 1024, 5e-4, 35_000, 175, 175, 5))

    def locate(self, data_dir: Path) -> Path:
        given = self.given_file()
        if given is not None:
            return given
        for name in self.PYTHON_FOLDERS + self.PYTHON_ARCHIVES + self.IMAGE_FOLDERS + self.IMAGE_ARCHIVES:
            if (data_dir / name).exists():
                return data_dir / name
        looked = self.PYTHON_FOLDERS + self.PYTHON_ARCHIVES + self.IMAGE_FOLDERS + self.IMAGE_ARCHIVES
        help_text = (f"image: no CIFAR-10 under {data_dir} (looked for "
                     f"{', '.join(str(data_dir / n) for n in looked)}). "
                     f"Download {self.URL} (md5 {self.MD5}) into {data_dir / 'cifar10'}, or pass --data-file with "
                     f"cifar-10-python.tar.gz or an image-folder tree {{train,test}}/<class>/*.jpg, or set --data-dir "
                     f"/ SPARSE_ATTN_DATA.")
        if not self.may_download():
            raise DataError(help_text + " (Downloads are off.)")
        return fetch(self.URL, data_dir / "cifar10" / "cifar-10-python.tar.gz", help_text, md5=self.MD5)

    def read(self, source: Path) -> Dict[str, np.ndarray]:
        """Grayscale 32x32 pixels and labels per split: train_x (45000, 1024) uint8, train_y, valid_*, test_*."""
        if source.is_dir():
            files = ((PurePosixPath(p.relative_to(source).as_posix()), p) for p in sorted(source.rglob("*"))
                     if p.is_file())
            items = ((rel, p.read_bytes()) for rel, p in files if self._wanted(rel))
        else:
            items = iter_archive(source, self._wanted)
        batches, images = {}, []
        for rel, data in items:
            if rel.name in CIFAR_PY_MD5:
                batches[rel.name] = data
            else:
                images.append((rel, data))
        if batches:
            return self._from_python(source, batches)
        if images:
            return self._from_images(source, images)
        raise DataError(f"image: {source} holds neither cifar-10-batches-py/{{data_batch_1..5,test_batch}} nor "
                        f"{{train,test}}/<class>/*.jpg|png images")

    @staticmethod
    def _wanted(rel: PurePosixPath) -> bool:
        if rel.name in CIFAR_PY_MD5:
            return True
        return (len(rel.parts) >= 3 and rel.parts[-3] in ("train", "test")
                and rel.suffix.lower() in (".jpg", ".jpeg", ".png"))

    def _from_python(self, source, batches):
        missing = sorted(set(CIFAR_PY_MD5) - set(batches))
        if missing:
            raise DataError(f"image: {source} lacks {missing} of cifar-10-batches-py. Fetch {self.URL} again.")
        x, y = {}, {}
        for name in sorted(CIFAR_PY_MD5):
            digest = hashlib.md5(batches[name]).hexdigest()
            if digest != CIFAR_PY_MD5[name]:
                raise DataError(f"image: {source}: {name} has md5 {digest}, expected {CIFAR_PY_MD5[name]}; refusing "
                                f"to unpickle it. Fetch {self.URL} (md5 {self.MD5}) again.")
            try:
                batch = _ArrayUnpickler(io.BytesIO(batches[name]), encoding="bytes").load()
                data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
                x[name], y[name] = data.transpose(0, 2, 3, 1), np.asarray(batch[b"labels"], dtype=np.int64)
            except (pickle.UnpicklingError, KeyError, ValueError, EOFError) as exc:
                raise DataError(f"image: cannot read {name} from {source}: {exc}") from None
        train_x = lra_grayscale(np.concatenate([x[f"data_batch_{i}"] for i in range(1, 6)])).reshape(-1, 1024)
        train_y = np.concatenate([y[f"data_batch_{i}"] for i in range(1, 6)])
        test_x, test_y = lra_grayscale(x["test_batch"]).reshape(-1, 1024), y["test_batch"]
        self._check_counts(source, len(train_x), len(test_x))
        cut = len(train_x) - self.VALID  # LRA: train[:90%] / train[90%:]
        return {"train_x": train_x[:cut], "train_y": train_y[:cut], "valid_x": train_x[cut:],
                "valid_y": train_y[cut:], "test_x": test_x, "test_y": test_y}

    def _from_images(self, source, images):
        try:
            from PIL import Image as PILImage
        except ImportError:
            raise DataError(f"image: decoding the images in {source} needs Pillow: pip install pillow (or pip "
                            f"install -r requirements-extra.txt). Or use the lossless {self.URL} (md5 {self.MD5}), "
                            f"which needs nothing extra.") from None
        rows = {"train": [], "test": []}
        for rel, data in images:
            split, label = rel.parts[-3], rel.parts[-2]
            if label not in CIFAR_CLASSES:
                raise DataError(f"image: {source}: unknown class folder {label!r} at {rel} (expected {CIFAR_CLASSES})")
            try:
                with PILImage.open(io.BytesIO(data)) as img:
                    rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
            except OSError as exc:
                raise DataError(f"image: cannot decode {rel} in {source}: {exc}") from None
            if rgb.shape != (32, 32, 3):
                raise DataError(f"image: {rel} in {source} is {rgb.shape[1]}x{rgb.shape[0]}, expected 32x32")
            stem = rel.stem
            number = int(stem) if stem.isdigit() else -1
            # Order by (number within the class, class): classes interleave, so any prefix and the last 10%
            # (the validation split: the last 500 per class) stay class-balanced.
            rows[split].append(((number, stem, CIFAR_CLASSES.index(label)), lra_grayscale(rgb).reshape(1024),
                                CIFAR_CLASSES.index(label)))
        for split in rows:
            rows[split].sort(key=lambda r: r[0])
        self._check_counts(source, len(rows["train"]), len(rows["test"]))
        train_x = np.stack([r[1] for r in rows["train"]])
        train_y = np.array([r[2] for r in rows["train"]], np.int64)
        cut = len(train_x) - self.VALID
        return {"train_x": train_x[:cut], "train_y": train_y[:cut], "valid_x": train_x[cut:], "valid_y": train_y[cut:],
                "test_x": np.stack([r[1] for r in rows["test"]]),
                "test_y": np.array([r[2] for r in rows["test"]], np.int64)}

    def _check_counts(self, source, train, test):
        if (train, test) != (self.COUNTS["train"], self.COUNTS["test"]):
            raise DataError(f"image: {source} has {train} training and {test} test images, expected "
                            f"{self.COUNTS['train']} and {self.COUNTS['test']}")

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        side = square_side(seq_len, "image", sides=(32, 16, 8, 4))
        source = self.locate(Path(data_dir))
        kind = "py" if source.name.startswith("cifar-10") else "img"
        arrays = cached(data_dir, f"cifar10-gray-{kind}-{source_key(source)[:20]}", lambda: self.read(source))
        self.splits = {}
        for salt, split in enumerate(("train", "valid", "test")):
            # a fixed shuffle of each split, so that any evaluation prefix mixes the classes
            order = fixed_permutation(len(arrays[f"{split}_y"]), 3 + salt)
            self.splits[split] = (pool_image(arrays[f"{split}_x"][order], side), arrays[f"{split}_y"][order])

    def split_size(self, split):
        return len(self.splits[split][1])

    def batch(self, split, idx):
        x, y = self.splits[split]
        return {"tokens": torch.from_numpy(x[idx].astype(np.int64)), "targets": torch.from_numpy(y[idx])}


# ------------------------------------------------------------------------------------------ pathfinder
@dataclass(frozen=True)
class PathfinderParams:
    """Generator settings in pixels of the output image; the defaults are LRA's pathfinder32 values
    (shared/data/README.md §4) with the hardest contour length, 14 (``curv_contour_length_14``)."""
    side: int = 32
    padding: float = 1.0
    paddle_length: float = 2.0
    paddle_margin: float = 1.0  # gap between consecutive paddles, and the least gap between distinct strokes
    stroke_radius: float = 0.5  # paddles are drawn 1 px wide
    contour_length: int = 14  # paddles per target snake
    distractor_length: int = 4  # contour_length // 3
    num_distractors: int = 5  # 20 // distractor_length
    marker_radius: float = 1.5
    seed_distance: float = 7.0
    continuity: float = 1.0

    @classmethod
    def for_side(cls, side: int) -> "PathfinderParams":
        """LRA's values at 32 px. Other sides scale the seed distance and the contour length with the side
        (14·side/32 paddles above 32 px, 12·side/32 below, where longer snakes seldom fit: 6 at 16 px),
        distractor_length = contour_length // 3 and the number of distractors with the area; paddle, stroke
        and marker sizes stay in pixels."""
        if side == 32:
            return cls()
        scale = side / 32
        contour = max(3, round((14 if side > 32 else 12) * scale))
        distractor = max(1, contour // 3)
        return cls(side=side, contour_length=contour, distractor_length=distractor,
                   num_distractors=max(1, round((20 // distractor) * scale * scale)),
                   seed_distance=float(max(3, round(7 * scale))))


_OCC, _RENDER, _BINS = 2, 4, 64  # occupancy and render grids: cells per pixel; orientation bins of the stamps
_TURNS = np.deg2rad(np.arange(-80.0, 81.0, 20.0))  # candidate turns per step, each jittered by ±10°


def _capsule(length: float, radius: float) -> np.ndarray:
    """(BINS, M, 2) integer (dy, dx) offsets of the cells within ``radius`` of a segment of ``length`` (cells)
    starting at a cell centre, one set per orientation bin, padded by repeating the first offset."""
    r = int(math.ceil(length + radius)) + 1
    grid = np.stack(np.mgrid[-r:r + 1, -r:r + 1], -1).reshape(-1, 2).astype(np.float64)
    sets = []
    for b in range(_BINS):
        u = np.array([math.sin(2 * math.pi * b / _BINS), math.cos(2 * math.pi * b / _BINS)])
        t = np.clip(grid @ u, 0.0, length)
        sets.append(grid[np.linalg.norm(grid - t[:, None] * u, axis=1) <= radius].astype(np.int64))
    size = max(len(s) for s in sets)
    return np.stack([np.concatenate([s, np.repeat(s[:1], size - len(s), 0)]) for s in sets])


def _unit(theta: np.ndarray) -> np.ndarray:
    return np.stack([np.sin(theta), np.cos(theta)], -1)  # (..., 2) as (dy, dx)


class _SnakeDrawer:
    """Vectorised over images: grows snakes on per-image occupancy grids and renders them."""

    def __init__(self, p: PathfinderParams, rng: np.random.Generator):
        self.p, self.rng = p, rng
        self.step = p.paddle_length + p.paddle_margin  # joint to joint; the paddle is centred in the step
        self.sep = 2 * p.stroke_radius + p.paddle_margin  # least centre-line distance between distinct strokes
        self.occ_stamp = _capsule(self.step * _OCC, self.sep * _OCC)
        self.paddle_stamp = _capsule(p.paddle_length * _RENDER, p.stroke_radius * _RENDER)
        self.marker_stamp = _capsule(0.0, p.marker_radius * _RENDER)
        self.marker_keepout = _capsule(0.0, (p.marker_radius + self.sep) * _OCC)
        self.margin = int(math.ceil((self.step + self.sep + p.marker_radius) * _RENDER)) + 2
        self.checks = np.arange(1, 7) * self.step / 6  # points checked along a candidate step (t > 0)

    def canvas(self, n: int, scale: int, walls: bool = False) -> np.ndarray:
        """(n, G, G) bool canvases with a margin around the image; ``walls`` marks everything closer than
        ``padding`` to the image border as occupied (exact at scale 2 for padding in half pixels)."""
        g = self.p.side * scale + 2 * self.margin
        canvas = np.zeros((n, g, g), bool)
        if walls:
            lo = self.margin + int(math.ceil(self.p.padding * scale))
            hi = self.margin + int(math.floor((self.p.side - self.p.padding) * scale))
            canvas[:, :lo], canvas[:, hi:], canvas[:, :, :lo], canvas[:, :, hi:] = True, True, True, True
        return canvas

    def stamp(self, canvas, rows, starts, thetas, offsets, scale):
        """Marks the cells of ``offsets`` around each start point (px) on the canvases of ``rows``."""
        g = canvas.shape[1]
        bins = np.round(np.asarray(thetas) / (2 * math.pi) * _BINS).astype(np.int64) % _BINS
        base = np.floor(starts * scale).astype(np.int64) + self.margin
        cells = base[:, None, :] + offsets[bins]  # (n, M, 2), inside the canvas thanks to the margin
        canvas.reshape(-1)[((rows[:, None] * g + cells[..., 0]) * g + cells[..., 1]).ravel()] = True

    def choose(self, occ, rows, starts, thetas, weights, include_start):
        """Per image, one of C candidate steps (starts (n, C, 2), thetas (n, C)) whose check points are inside
        the padded canvas and free, drawn with the given weights. Returns (index (n,), found (n,))."""
        g = occ.shape[1]
        ts = np.concatenate([[0.0], self.checks]) if include_start else self.checks
        u = _unit(thetas).astype(np.float32) * np.float32(_OCC)
        origin = (starts.astype(np.float32) * _OCC + self.margin)[:, :, None, :]  # (n, C, 1, 2) in cells
        pts = origin + ts.astype(np.float32)[None, None, :, None] * u[:, :, None, :]  # (n, C, T, 2)
        cells = np.clip(pts, 0, g - 1).astype(np.int64)  # the walls make anything near or past the border "hit"
        hit = occ.reshape(-1)[(rows[:, None, None] * g + cells[..., 0]) * g + cells[..., 1]]
        cum = np.cumsum(weights * ~hit.any(-1), 1)  # (n, C)
        total = cum[:, -1]
        idx = np.argmax(cum > (self.rng.random(len(rows)) * total)[:, None], 1)
        return idx, total > 0

    def grow(self, occ, rows, seed_starts, seed_thetas, steps):
        """Grows one snake per image from the first free of T seeds (seed_starts (n, T, 2)). A step turns by
        Δ with weight cos²(continuity·Δ) among the free candidates; the newest step is committed to the
        occupancy only when the next is placed (it touches its successor). Returns joints (n, steps+1, 2),
        step orientations (n, steps) and the number of steps placed (n,)."""
        n, ar = len(rows), np.arange(len(rows))
        joints, thetas = np.zeros((n, steps + 1, 2)), np.zeros((n, steps))
        idx, alive = self.choose(occ, rows, seed_starts, seed_thetas, np.ones(seed_thetas.shape), True)
        joints[:, 0], thetas[:, 0] = seed_starts[ar, idx], seed_thetas[ar, idx]
        joints[:, 1] = joints[:, 0] + self.step * _unit(thetas[:, 0])
        placed = alive.astype(np.int64)
        pending = alive.copy()
        for k in range(1, steps):
            live = np.flatnonzero(alive)
            delta = _TURNS[None, :] + (self.rng.random((len(live), len(_TURNS))) - 0.5) * np.deg2rad(20.0)
            cand = thetas[live, k - 1, None] + delta
            weights = np.cos(np.minimum(np.abs(delta) * self.p.continuity, np.pi / 2)) ** 2
            starts = np.repeat(joints[live, k][:, None, :], len(_TURNS), 1)
            idx, found = self.choose(occ, rows[live], starts, cand, weights, False)
            done = np.flatnonzero(pending)
            self.stamp(occ, rows[done], joints[done, k - 1], thetas[done, k - 1], self.occ_stamp, _OCC)
            pending[:] = False
            grown = live[found]
            thetas[grown, k] = cand[found, idx[found]]
            joints[grown, k + 1] = joints[grown, k] + self.step * _unit(thetas[grown, k])
            placed[grown] += 1
            alive[:] = False
            alive[grown] = pending[grown] = True
        done = np.flatnonzero(pending)
        last = placed[done] - 1
        self.stamp(occ, rows[done], joints[done, last], thetas[done, last], self.occ_stamp, _OCC)
        return joints, thetas, placed

    def grow_full(self, occ, rows, make_seeds, steps, attempts=3):
        """``grow`` until the snake has all its steps, up to ``attempts`` times per image (each failed
        attempt is erased from the occupancy first). make_seeds(i) → (starts (len(i), T, 2), thetas (len(i), T))
        for the local indices i. Returns joints, thetas and whether the snake is complete (n,)."""
        n = len(rows)
        snapshot = occ[rows].copy()
        joints, thetas, complete = np.zeros((n, steps + 1, 2)), np.zeros((n, steps)), np.zeros(n, bool)
        todo = np.arange(n)
        for _ in range(attempts):
            starts, angles = make_seeds(todo)
            j, t, placed = self.grow(occ, rows[todo], starts, angles, steps)
            joints[todo], thetas[todo] = j, t
            complete[todo] = placed == steps
            todo = todo[placed < steps]
            occ[rows[todo]] = snapshot[todo]
            if not len(todo):
                break
        return joints, thetas, complete

    def centre_line(self, joints):
        """(n, K+1, 2) joints → (n, 6K+1, 2) points every half step-sixth along the centre line."""
        t = np.arange(6) / 6
        seg = joints[:, :-1, None, :] + t[None, None, :, None] * (joints[:, 1:, None, :] - joints[:, :-1, None, :])
        return np.concatenate([seg.reshape(len(joints), -1, 2), joints[:, -1:]], 1)


def generate_pathfinder(count: int, params: PathfinderParams, rng: np.random.Generator, records: bool = False,
                        chunk: int = 2048):
    """``count`` Pathfinder images (count, S, S) uint8 and labels (count,) int64, exactly half positive
    (count // 2 negatives), in random order. With ``records`` also the snakes' joints and the markers.

    One image: (1) target snake A from a seed in the central square [2·seed_distance, S − 2·seed_distance)²,
    then target snake B from a seed ``seed_distance`` from A's seed, each ``contour_length`` paddles;
    (2) two markers (discs of ``marker_radius``): A's or B's origin tip, and the terminal tip of the same
    snake (label 1) or of the other one (label 0); (3) ``num_distractors`` snakes of ``distractor_length``
    paddles anywhere free; (4) strokes rendered 1 px wide at 4x resolution and averaged to 0-255.
    A snake is a chain of steps of paddle_length + paddle_margin px; the paddle (a dash) is centred in its
    step, so consecutive paddles are separated by ``paddle_margin``; each step turns by Δ drawn with weight
    cos²(continuity·Δ) (|Δ| < 90°) among candidates whose centre line keeps at least 2·stroke_radius +
    paddle_margin from every other stroke (and from the markers, for distractors) and ``padding`` from the
    border. Images whose target snakes cannot reach full length, whose markers lie closer than
    2·marker_radius + 1 px, or where the other target snake passes within marker_radius + 2·stroke_radius +
    paddle_margin of a marker, are rejected and drawn again.

    Differences from the original generator (drewlinsley/pathfinder, snakes2.py, as used by LRA): the two
    target snakes grow one after the other (there, in alternation); collisions are tested on a 2x occupancy
    grid with capsule stamps (there, dilated anti-aliased masks); turning candidates are 9 jittered angles
    (there, the pixels on a circle); distractors keep away from the markers, and a distractor that is boxed
    in stays shorter (there, it is dropped); no single-paddle clutter; all strokes have full contrast (there,
    per-paddle contrasts); labels are exactly balanced (there, Bernoulli(0.5))."""
    p = params
    draw = _SnakeDrawer(p, rng)
    side_r = p.side * _RENDER
    quota = {1: count - count // 2, 0: count // 2}
    kept = {0: [], 1: []}
    tried, made = 0, 0
    while quota[0] > 0 or quota[1] > 0:
        # candidates for what is missing at the yield seen so far (deterministic: depends only on the draws)
        if tried >= 20_000 and made == 0:
            raise ValueError(f"pathfinder: no image fits these settings ({p}); use a larger side")
        rate = max(made / tried, 0.05) if tried else 0.3
        n = int(min(chunk, max(64, 1.2 * (quota[0] + quota[1]) / rate)))
        occ = draw.canvas(n, _OCC, walls=True)
        rows = np.arange(n)
        lo, hi = 2 * p.seed_distance, p.side - 2 * p.seed_distance
        if hi - lo < 2:
            lo, hi = p.side / 2 - 1, p.side / 2 + 1
        ja, ta, ok = draw.grow_full(occ, rows, lambda i: (rng.uniform(lo, hi, (len(i), 8, 2)),
                                                          rng.uniform(-np.pi, np.pi, (len(i), 8))), p.contour_length)
        rows, ja, ta = rows[ok], ja[ok], ta[ok]
        jb, tb, ok = draw.grow_full(occ, rows, lambda i: (
            ja[i, None, 0] + p.seed_distance * _unit(rng.uniform(-np.pi, np.pi, (len(i), 8))),
            rng.uniform(-np.pi, np.pi, (len(i), 8))), p.contour_length)
        rows, ja, ta, jb, tb = rows[ok], ja[ok], ta[ok], jb[ok], tb[ok]
        joints, thetas = np.stack([ja, jb], 1), np.stack([ta, tb], 1)  # (m, 2, K+1, 2), (m, 2, K)
        half = p.paddle_margin / 2
        origin = joints[:, :, 0] + half * _unit(thetas[:, :, 0])  # (m, 2, 2) tips of the first paddles
        terminal = joints[:, :, -1] - half * _unit(thetas[:, :, -1])  # tips of the last paddles
        m, ar = len(rows), np.arange(len(rows))
        labels = rng.integers(0, 2, m)
        first = rng.integers(0, 2, m)  # the snake whose origin tip is marked
        second = np.where(labels == 1, first, 1 - first)
        tips = np.stack([origin[ar, first], terminal[ar, second]], 1)  # (m, 2, 2)
        owner = np.stack([first, second], 1)
        good = np.linalg.norm(tips[:, 0] - tips[:, 1], axis=-1) >= 2 * p.marker_radius + 1
        lines = np.stack([draw.centre_line(ja), draw.centre_line(jb)], 1)  # (m, 2, L, 2)
        for j in range(2):  # the snake that does not own marker j keeps clear of it
            other = lines[ar, 1 - owner[:, j]]
            gap = np.linalg.norm(other - tips[:, j, None, :], axis=-1).min(1)
            good &= gap >= p.marker_radius + draw.sep
        rows, joints, thetas, tips, owner, labels = (a[good] for a in (rows, joints, thetas, tips, owner, labels))
        for j in range(2):
            draw.stamp(occ, rows, tips[:, j], np.zeros(len(rows)), draw.marker_keepout, _OCC)
        distractors = []
        for _ in range(p.num_distractors):
            seeds = rng.uniform(p.padding, p.side - p.padding, (len(rows), 8, 2))
            distractors.append(draw.grow(occ, rows, seeds, rng.uniform(-np.pi, np.pi, (len(rows), 8)),
                                         p.distractor_length))
        # render: every placed step's paddle and the two marker discs on a 4x canvas, then block means
        canvas = draw.canvas(len(rows), _RENDER)
        local = np.arange(len(rows))
        for s in range(2):
            for k in range(p.contour_length):
                start = joints[:, s, k] + half * _unit(thetas[:, s, k])
                draw.stamp(canvas, local, start, thetas[:, s, k], draw.paddle_stamp, _RENDER)
        for dj, dt, dn in distractors:
            for k in range(p.distractor_length):
                has = np.flatnonzero(dn > k)
                start = dj[has, k] + half * _unit(dt[has, k])
                draw.stamp(canvas, local[has], start, dt[has, k], draw.paddle_stamp, _RENDER)
        for j in range(2):
            draw.stamp(canvas, local, tips[:, j], np.zeros(len(rows)), draw.marker_stamp, _RENDER)
        inner = canvas[:, draw.margin:draw.margin + side_r, draw.margin:draw.margin + side_r]
        images = np.round(inner.reshape(-1, p.side, _RENDER, p.side, _RENDER).mean((2, 4)) * 255).astype(np.uint8)
        tried, made = tried + n, made + len(rows)
        for i in range(len(rows)):
            label = int(labels[i])
            if quota[label] > 0:
                quota[label] -= 1
                record = None
                if records:
                    record = {"joints": joints[i], "tips": tips[i], "owner": owner[i],
                              "distractors": [dj[i, :dn[i] + 1] for dj, _, dn in distractors if dn[i] > 0]}
                kept[label].append((images[i], record))
    everything = [(img, 1, rec) for img, rec in kept[1]] + [(img, 0, rec) for img, rec in kept[0]]
    order = rng.permutation(len(everything))
    images = np.stack([everything[i][0] for i in order]) if count else np.zeros((0, p.side, p.side), np.uint8)
    labels = np.array([everything[i][1] for i in order], dtype=np.int64)
    if records:
        return images, labels, [everything[i][2] for i in order]
    return images, labels


class Pathfinder(LRATask):
    """LRA Pathfinder from our generator. CPU preset: 16x16 images (256 tokens), 12,000 training images,
    batch 32, 800 steps. Paper preset (Table 7 "Pathfinder"): 32x32 (1024 tokens), 160,000 training images,
    batch 1024, lr 5e-4, 62,400 steps, warm-up 312."""
    GENERATOR_VERSION = 1  # bump when the generator changes: old caches are then ignored
    reads_files = False  # generated

    def __init__(self):
        super().__init__("pathfinder", "cls", vocab_size=256, num_classes=2, metric="accuracy",
                         presets=lra_presets(1024, 1024, 5e-4, 62_400, 312, 312, 20))
        self.sizes: Optional[Dict[str, int]] = None  # None: by image side (see the module docstring)

    @staticmethod
    def default_sizes(side: int) -> Dict[str, int]:
        if side >= 32:
            return {"train": 160_000, "valid": 20_000, "test": 20_000}
        return {"train": 12_000, "valid": 2_000, "test": 2_000}

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        side = square_side(seq_len, "pathfinder")
        if side < 16:
            raise ValueError(f"pathfinder: images need a side of at least 16 px (seq_len 256), got {seq_len}")
        params = PathfinderParams.for_side(side)
        sizes = self.sizes or self.default_sizes(side)
        key = hashlib.sha256(repr((self.GENERATOR_VERSION, asdict(params), sorted(sizes.items()), seed)).encode())
        arrays = cached(data_dir, f"pathfinder-{key.hexdigest()[:20]}", lambda: self.generate(params, sizes, seed))
        self.splits = {split: (arrays[f"{split}_x"].reshape(-1, side * side), arrays[f"{split}_y"])
                       for split in ("train", "valid", "test")}

    @staticmethod
    def generate(params, sizes, seed):
        arrays = {}
        for offset, split in enumerate(("train", "valid", "test")):
            rng = np.random.default_rng([seed % 2**32, offset, 7])
            arrays[f"{split}_x"], arrays[f"{split}_y"] = generate_pathfinder(sizes[split], params, rng)
        return arrays

    def split_size(self, split):
        return len(self.splits[split][1])

    def batch(self, split, idx):
        x, y = self.splits[split]
        return {"tokens": torch.from_numpy(x[idx].astype(np.int64)), "targets": torch.from_numpy(y[idx])}


# ------------------------------------------------------------------------------------------ retrieval (AAN)
class Retrieval(LRATask):
    """LRA document retrieval (AAN), a dual encoder. CPU preset: 256 bytes per document, batch 16, 800 steps.
    Paper preset (Table 7 "Retrieval"): 4096 bytes per document, batch 32, lr 1e-4, 30,000 steps, warm-up 800."""
    RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
    README_URL = "https://github.com/google-research/long-range-arena"
    FILES = {"train": "new_aan_pairs.train.tsv", "valid": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
    FOLDERS = ("lra_release/tsv_data", "lra_release/lra_release/tsv_data", "tsv_data", "aan")
    ARCHIVES = ("lra_release.gz", "lra_release.tar.gz")
    CLIP = 10_000  # LRA encodes the first 10,000 bytes of each text

    def __init__(self):
        super().__init__("retrieval", "pair", vocab_size=257, num_classes=2, metric="accuracy",
                         presets=lra_presets(4096, 32, 1e-4, 30_000, 800, 300, 565, cpu_batch=16))

    def locate(self, data_dir: Path) -> Path:
        candidates = [Path(self.data_file)] if self.data_file is not None else [data_dir / f for f in self.FOLDERS]
        for folder in candidates:
            if all((folder / name).is_file() for name in self.FILES.values()):
                return folder
        if self.data_file is None:
            for name in self.ARCHIVES:
                if (data_dir / name).is_file():
                    return self.extract(data_dir / name, data_dir / self.FOLDERS[0])
        raise DataError(f"retrieval: LRA's AAN pairs are not there (looked for new_aan_pairs.{{train,eval,test}}.tsv "
                        f"in {', '.join(str(c) for c in candidates)}). Download the LRA release "
                        f"{self.RELEASE_URL} (see {self.README_URL}), then put it at {data_dir / self.ARCHIVES[0]} "
                        f"(its three TSVs are extracted on first use) or extract it so that "
                        f"{data_dir / self.FOLDERS[0]} holds them; or pass --data-file with the folder.")

    def extract(self, archive: Path, dest: Path) -> Path:
        print(f"extracting the AAN TSVs from {archive} to {dest} (one pass over the archive) ...", flush=True)
        names = sorted(self.FILES.values())
        try:
            safe_extract(archive, dest, want=lambda p: p.name in names and p.parent.name == "tsv_data",
                         rename=lambda p: PurePosixPath(p.name), required=[PurePosixPath(n) for n in names])
        except DataError as exc:
            raise DataError(f"retrieval: {exc} (LRA's AAN pairs are its tsv_data/{{{','.join(names)}}})") from None
        return dest

    def read(self, folder: Path) -> Dict[str, np.ndarray]:
        arrays = {}
        for split, name in self.FILES.items():
            first, second, labels = [], [], []
            with open(folder / name, "rb") as f:
                for number, line in enumerate(f, 1):
                    line = line.rstrip(b"\r\n")
                    if not line:
                        continue
                    fields = line.split(b"\t")
                    try:
                        if len(fields) != 5:
                            raise ValueError(f"{len(fields)} tab-separated fields, expected 5")
                        label = int(float(fields[0]))
                        if label not in (0, 1):
                            raise ValueError(f"label {label}")
                    except ValueError as exc:
                        raise DataError(f"retrieval: {folder / name} line {number}: {exc} (expected label, id1, "
                                        f"id2, text1, text2 as in LRA's new_aan_pairs TSVs)") from None
                    first.append(fields[3])
                    second.append(fields[4])
                    labels.append(label)
            for key, docs in (("a", Docs.from_list(first, self.CLIP)), ("b", Docs.from_list(second, self.CLIP))):
                arrays[f"{split}_{key}_bytes"], arrays[f"{split}_{key}_offsets"] = docs.data, docs.offsets
            arrays[f"{split}_y"] = np.array(labels, np.int64)
        return arrays

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        self.seq_len = seq_len
        folder = self.locate(Path(data_dir))
        key = hashlib.sha256()
        for name in self.FILES.values():
            stat = (folder / name).stat()
            key.update(f"{name}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
        arrays = cached(data_dir, f"aan-bytes-{key.hexdigest()[:20]}", lambda: self.read(folder))
        self.splits = {}
        for split in self.FILES:
            a = Docs(arrays[f"{split}_a_bytes"], arrays[f"{split}_a_offsets"])
            b = Docs(arrays[f"{split}_b_bytes"], arrays[f"{split}_b_offsets"])
            order = np.arange(len(a)) if split == "train" else fixed_permutation(len(a), 2)
            self.splits[split] = (a, b, order, arrays[f"{split}_y"])

    def split_size(self, split):
        return len(self.splits[split][2])

    def batch(self, split, idx):
        a, b, order, labels = self.splits[split]
        rows = order[idx]
        tokens, mask = a.tokens(rows, self.seq_len)
        tokens2, mask2 = b.tokens(rows, self.seq_len)
        return {"tokens": tokens, "key_padding_mask": mask, "tokens2": tokens2, "key_padding_mask2": mask2,
                "targets": torch.from_numpy(labels[rows])}
