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
  bench/tasks/pathfinder.py), 2 classes: are the two markers joined by one path? Pixels 0-255 as tokens, no
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
``--data-file`` (an archive or folder for text / image, the TSV folder for retrieval). Archives are read
safely, downloads checked, and decoded data cached by bench/tasks/data_files.py (see there); the Pathfinder images come
from bench/tasks/pathfinder.py and are cached the same way.

Shape legend: B batch, N tokens (seq_len), S image side, P pixels (S*S).
"""
import hashlib
import io
import math
import pickle
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from bench.config import Preset
from bench.tasks.base import Task
from bench.tasks.data_files import (DataError, array_problem, cached, fetch, iter_archive, offline, ragged_problem,
                                    safe_extract, source_key)
from bench.tasks.pathfinder import PathfinderParams, generate_pathfinder

SPLIT_SEED = 20240611  # fixed hold-out and evaluation order of the real-data splits, independent of --seed


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
        arrays = cached(data_dir, f"imdb-bytes-{source_key(source)[:20]}", lambda: self.read(source),
                        self.cache_problem)
        docs = Docs(arrays["bytes"], arrays["offsets"])
        train, test = np.flatnonzero(~arrays["test"]), np.flatnonzero(arrays["test"])
        train = train[fixed_permutation(len(train))]
        n_valid = int(round(len(train) * self.VALID_FRACTION))
        order = {"train": train[n_valid:], "valid": train[:n_valid], "test": test[fixed_permutation(len(test), 1)]}
        self.splits = {split: (docs, idx, arrays["label"][idx]) for split, idx in order.items()}

    def cache_problem(self, arrays) -> Optional[str]:
        """What ``read`` makes: every review of the four folders, half of them the test split."""
        n = 4 * self.PER_FOLDER
        problem = (array_problem(arrays, {"label": (n,), "test": (n,)}, {"label": "i", "test": "b"})
                   or ragged_problem(arrays, "bytes", "offsets", n))
        if problem is None and int(arrays["test"].sum()) != n // 2:
            problem = f"has {int(arrays['test'].sum())} test reviews, expected {n // 2}"
        return problem

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

    def cache_problem(self, arrays) -> Optional[str]:
        """What ``read`` makes: 32x32 grayscale images and labels, split 45,000 / 5,000 / 10,000."""
        counts = {"train": self.COUNTS["train"] - self.VALID, "valid": self.VALID, "test": self.COUNTS["test"]}
        return array_problem(arrays, {**{f"{s}_x": (n, 1024) for s, n in counts.items()},
                                      **{f"{s}_y": (n,) for s, n in counts.items()}},
                             {**{f"{s}_x": "u" for s in counts}, **{f"{s}_y": "i" for s in counts}})

    def _check_counts(self, source, train, test):
        if (train, test) != (self.COUNTS["train"], self.COUNTS["test"]):
            raise DataError(f"image: {source} has {train} training and {test} test images, expected "
                            f"{self.COUNTS['train']} and {self.COUNTS['test']}")

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        side = square_side(seq_len, "image", sides=(32, 16, 8, 4))
        source = self.locate(Path(data_dir))
        kind = "py" if source.name.startswith("cifar-10") else "img"
        arrays = cached(data_dir, f"cifar10-gray-{kind}-{source_key(source)[:20]}", lambda: self.read(source),
                        self.cache_problem)
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
        arrays = cached(data_dir, f"pathfinder-{key.hexdigest()[:20]}", lambda: self.generate(params, sizes, seed),
                        lambda arrays: self.cache_problem(arrays, side, sizes))
        self.splits = {split: (arrays[f"{split}_x"].reshape(-1, side * side), arrays[f"{split}_y"])
                       for split in ("train", "valid", "test")}

    @staticmethod
    def cache_problem(arrays, side: int, sizes: Dict[str, int]) -> Optional[str]:
        """What ``generate`` makes: ``sizes[split]`` images of side × side pixels and their labels per split."""
        return array_problem(arrays, {**{f"{s}_x": (n, side, side) for s, n in sizes.items()},
                                      **{f"{s}_y": (n,) for s, n in sizes.items()}},
                             {**{f"{s}_x": "u" for s in sizes}, **{f"{s}_y": "i" for s in sizes}})

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
        arrays = cached(data_dir, f"aan-bytes-{key.hexdigest()[:20]}", lambda: self.read(folder), self.cache_problem)
        self.splits = {}
        for split in self.FILES:
            a = Docs(arrays[f"{split}_a_bytes"], arrays[f"{split}_a_offsets"])
            b = Docs(arrays[f"{split}_b_bytes"], arrays[f"{split}_b_offsets"])
            order = np.arange(len(a)) if split == "train" else fixed_permutation(len(a), 2)
            self.splits[split] = (a, b, order, arrays[f"{split}_y"])

    def cache_problem(self, arrays) -> Optional[str]:
        """What ``read`` makes: per split, labels and two ragged byte documents per pair."""
        for split in self.FILES:
            problem = array_problem(arrays, {f"{split}_y": (None,)}, {f"{split}_y": "i"})
            for side in "ab":
                problem = problem or ragged_problem(arrays, f"{split}_{side}_bytes", f"{split}_{side}_offsets",
                                                    len(arrays.get(f"{split}_y", ())))
            if problem:
                return problem
        return None

    def split_size(self, split):
        return len(self.splits[split][2])

    def batch(self, split, idx):
        a, b, order, labels = self.splits[split]
        rows = order[idx]
        tokens, mask = a.tokens(rows, self.seq_len)
        tokens2, mask2 = b.tokens(rows, self.seq_len)
        return {"tokens": tokens, "key_padding_mask": mask, "tokens2": tokens2, "key_padding_mask2": mask2,
                "targets": torch.from_numpy(labels[rows])}
