"""LRA ``image`` (Tay et al. 2021; presets as bench/tasks/lra.py says): CIFAR-10 (Krizhevsky 2009) as a
sequence of grayscale pixels, 10 classes, by LRA's conversion (``tf.image.rgb_to_grayscale``: 0.2989 R + 0.5870
G + 0.1140 B in float32, to uint8 by truncating x * 255.5). Tokens are the intensities 0-255; no padding
(loaders that treat 0 as padding mask black pixels). Splits 45,000 / 5,000 / 10,000 as LRA: the last 5,000
training images in batch order are validation (LRA's TFDS order cannot be reproduced without TFDS), or the
last 500 per class of an image-folder tree. Paper length 1024 (32x32); 256 (the CPU preset) or 64 average
2x2 or 4x4 blocks. Reads ``cifar-10-python.tar.gz`` or its extracted folder (every batch's md5 checked, then
unpickled with numpy's array constructors only), or an image-folder tree ``{train,test}/<class>/*.jpg|png``
such as the local ``cifar10/cifar10_jpeg.tar.gz`` (lossy JPEG; needs Pillow, requirements-extra.txt).

Shape legend: B batch, S image side, P pixels (S*S).
"""

import hashlib
import io
import math
import pickle
from pathlib import Path, PurePosixPath
from typing import Dict, Optional

import numpy as np

from bench.tasks.data_files import DataError, cached, iter_archive, source_key
from bench.tasks.lra import LRATask, fixed_permutation, images_problem, lra_presets, square_side

# ------------------------------------------------------------------------------------------ image (CIFAR-10)
CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR_PY_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}


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

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        if module == "numpy.core.multiarray":  # numpy 1.x pickles; numpy 2 moved it
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


class Image(LRATask):
    """LRA image classification on CIFAR-10 grayscale; the paper preset is Table 7's "Image" column."""

    URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    MD5 = "c58f30108f718f92721af3b95e74349a"
    PYTHON_FOLDERS = ("cifar10/cifar-10-batches-py", "cifar-10-batches-py")
    PYTHON_ARCHIVES = ("cifar10/cifar-10-python.tar.gz", "cifar-10-python.tar.gz")
    IMAGE_FOLDERS = ("cifar10/cifar10_jpeg", "cifar10_jpeg")
    IMAGE_ARCHIVES = ("cifar10/cifar10_jpeg.tar.gz",)
    COUNTS = {"train": 50_000, "test": 10_000}
    VALID = 5_000

    def __init__(self):
        super().__init__(
            "image",
            "cls",
            vocab_size=256,
            num_classes=10,
            metric="accuracy",
            presets=lra_presets(1024, 1024, 5e-4, 35_000, 175, 175, 5),
        )

    def locate(self, data_dir: Path) -> Path:
        looked = self.PYTHON_FOLDERS + self.PYTHON_ARCHIVES + self.IMAGE_FOLDERS + self.IMAGE_ARCHIVES
        help_text = (
            f"image: no CIFAR-10 under {data_dir} (looked for "
            f"{', '.join(str(data_dir / n) for n in looked)}). "
            f"Download {self.URL} (md5 {self.MD5}) into {data_dir / 'cifar10'}, or pass --data-file with "
            f"cifar-10-python.tar.gz or an image-folder tree {{train,test}}/<class>/*.jpg, or set --data-dir "
            f"/ SPARSE_ATTN_DATA."
        )
        return self.look_up(
            (data_dir / n for n in looked if (data_dir / n).exists()),
            help_text,
            self.URL,
            data_dir / "cifar10" / "cifar-10-python.tar.gz",
            md5=self.MD5,
        )

    def read(self, source: Path) -> Dict[str, np.ndarray]:
        """Grayscale 32x32 pixels and labels per split: train_x (45000, 1024) uint8, train_y, valid_*, test_*."""
        if source.is_dir():
            files = (
                (PurePosixPath(p.relative_to(source).as_posix()), p) for p in sorted(source.rglob("*")) if p.is_file()
            )
            items = ((rel, p.read_bytes()) for rel, p in files if self._wanted(rel))
        else:
            items = iter_archive(source, self._wanted)
        batches, images = {}, []
        for rel, data in items:
            if rel.name in CIFAR_PY_MD5:
                batches[rel.name] = data
            else:
                images.append((rel, data))
        if not batches and not images:
            raise DataError(
                f"image: {source} holds neither cifar-10-batches-py/{{data_batch_1..5,"
                f"test_batch}} nor {{train,test}}/<class>/*.jpg|png images"
            )
        train_x, train_y, test_x, test_y = (
            self._from_python(source, batches) if batches else self._from_images(source, images)
        )
        if (len(train_x), len(test_x)) != (self.COUNTS["train"], self.COUNTS["test"]):
            raise DataError(
                f"image: {source} has {len(train_x)} training and {len(test_x)} test "
                f"images, expected {self.COUNTS['train']} and {self.COUNTS['test']}"
            )
        cut = len(train_x) - self.VALID  # LRA: train[:90%] / train[90%:]
        return {
            "train_x": train_x[:cut],
            "train_y": train_y[:cut],
            "valid_x": train_x[cut:],
            "valid_y": train_y[cut:],
            "test_x": test_x,
            "test_y": test_y,
        }

    @staticmethod
    def _wanted(rel: PurePosixPath) -> bool:
        if rel.name in CIFAR_PY_MD5:
            return True
        return (
            len(rel.parts) >= 3
            and rel.parts[-3] in ("train", "test")
            and rel.suffix.lower() in (".jpg", ".jpeg", ".png")
        )

    def _from_python(self, source, batches):
        """(train pixels, train labels, test pixels, test labels) from cifar-10-batches-py."""
        missing = sorted(set(CIFAR_PY_MD5) - set(batches))
        if missing:
            raise DataError(f"image: {source} lacks {missing} of cifar-10-batches-py. Fetch {self.URL} again.")
        x, y = {}, {}
        for name in sorted(CIFAR_PY_MD5):
            digest = hashlib.md5(batches[name]).hexdigest()
            if digest != CIFAR_PY_MD5[name]:
                raise DataError(
                    f"image: {source}: {name} has md5 {digest}, expected {CIFAR_PY_MD5[name]}; refusing "
                    f"to unpickle it. Fetch {self.URL} (md5 {self.MD5}) again."
                )
            try:
                batch = _ArrayUnpickler(io.BytesIO(batches[name]), encoding="bytes").load()
                data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
                x[name], y[name] = data.transpose(0, 2, 3, 1), np.asarray(batch[b"labels"], dtype=np.int64)
            except (pickle.UnpicklingError, KeyError, ValueError, EOFError) as exc:
                raise DataError(f"image: cannot read {name} from {source}: {exc}") from None
        train_x = lra_grayscale(np.concatenate([x[f"data_batch_{i}"] for i in range(1, 6)])).reshape(-1, 1024)
        train_y = np.concatenate([y[f"data_batch_{i}"] for i in range(1, 6)])
        return train_x, train_y, lra_grayscale(x["test_batch"]).reshape(-1, 1024), y["test_batch"]

    def _from_images(self, source, images):
        """The same from an image-folder tree."""
        try:
            from PIL import Image as PILImage
        except ImportError:
            raise DataError(
                f"image: decoding the images in {source} needs Pillow: pip install pillow (or pip "
                f"install -r requirements-extra.txt). Or use the lossless {self.URL} (md5 {self.MD5}), "
                f"which needs nothing extra."
            ) from None
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
            rows[split].append(
                (
                    (number, stem, CIFAR_CLASSES.index(label)),
                    lra_grayscale(rgb).reshape(1024),
                    CIFAR_CLASSES.index(label),
                )
            )
        for split in rows:
            rows[split].sort(key=lambda r: r[0])
        pixels = {split: np.array([r[1] for r in rows[split]], np.uint8) for split in rows}
        labels = {split: np.array([r[2] for r in rows[split]], np.int64) for split in rows}
        return pixels["train"], labels["train"], pixels["test"], labels["test"]

    def cache_problem(self, arrays) -> Optional[str]:
        """What ``read`` makes: 32x32 grayscale images and labels, split 45,000 / 5,000 / 10,000."""
        counts = {"train": self.COUNTS["train"] - self.VALID, "valid": self.VALID, "test": self.COUNTS["test"]}
        return images_problem(arrays, counts, (1024,))

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        side = square_side(seq_len, "image", sides=(32, 16, 8, 4))
        source = self.locate(Path(data_dir))
        kind = "py" if source.name.startswith("cifar-10") else "img"
        arrays = cached(
            data_dir, f"cifar10-gray-{kind}-{source_key(source)[:20]}", lambda: self.read(source), self.cache_problem
        )
        self.splits = {}
        for salt, split in enumerate(("train", "valid", "test")):
            # a fixed shuffle of each split, so that any evaluation prefix mixes the classes
            order = fixed_permutation(len(arrays[f"{split}_y"]), 3 + salt)
            self.splits[split] = (pool_image(arrays[f"{split}_x"][order], side), arrays[f"{split}_y"][order])
