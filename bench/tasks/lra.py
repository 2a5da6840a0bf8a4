"""Long Range Arena (Tay et al. 2021, arXiv:2011.04006): the tasks' base, ``text`` and ``retrieval``
(``image``: bench/tasks/image.py, ``pathfinder``: bench/tasks/pathfinder.py).

Each task has a ``cpu`` preset (minutes on 2 cores: 256 tokens, batch 32 or 16, 800 steps, evaluation on
1024-example prefixes of the fixed splits) and a ``paper`` preset: the SBM paper's Table 7 (Cho et al. 2022,
App. C: 2 layers, 2 heads, width 64, FFN 128, head dim 32, dropout and attention dropout 0.1, mean pooling; per
task length, batch, learning rate and steps; its "epochs" are optimiser steps) with the warm-up, evaluation
period and weight decay 0 of the ``lra_config.py`` its code uses. The harness's schedule (warm-up, cosine to
10%) replaces that code's linear decay.

- ``text`` — byte-level IMDB sentiment (Maas et al. 2011), 2 classes; byte b is token b + 1, 0 is padding (as
  TFDS's ByteTextEncoder, which LRA uses). Reviews truncated to ``seq_len`` bytes: paper 3072 (Table 7; the
  SBM code keeps 3000 and pads, LRA's config 1000). LRA evaluates on test (valid = test); we hold out a fixed
  10% of the training reviews (2,500, whatever ``--seed``) as validation, train on 22,500, test on 25,000.
  Reads the aclImdb layout from a folder or the .tar.gz (the local ``imdb/aclImdb_v1_labeled.tar.gz`` or the
  official ``aclImdb_v1.tar.gz``, ``train/unsup`` skipped); else downloads the official one (sha256 checked).
- ``retrieval`` — LRA's AAN citation matching (Radev et al. 2009): two byte documents (tokens as ``text``,
  each truncated to ``seq_len`` after LRA's 10,000-byte clip) through the same encoder (the ``pair`` head), 2
  classes. Reads LRA's ``tsv_data/new_aan_pairs.{train,eval,test}.tsv`` (label, id1, id2, text1, text2;
  147,086 / 18,090 / 17,437 pairs) from the extracted release, or extracts them from ``lra_release.gz`` in the
  data folder. Paper length 4096 per document (Table 7; the SBM code keeps 4000 bytes and pads).

Shape legend: B batch, N tokens (seq_len).
"""

import dataclasses
import itertools
import math
from pathlib import Path, PurePosixPath
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from bench.config import Preset
from bench.tasks.base import ExampleSetTask
from bench.tasks.data_files import (
    DataError,
    array_problem,
    cached,
    fetch,
    iter_archive,
    ragged_problem,
    safe_extract,
    source_key,
)

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
class LRATask(ExampleSetTask):
    """Fixed splits of arrays held in memory, read from data files (or generated: pathfinder)."""

    reads_files = True

    def split_size(self, split: str) -> int:
        return len(self.splits[split][-1])  # its labels

    def batch(self, split: str, idx: np.ndarray) -> Dict[str, torch.Tensor]:
        """The examples ``idx`` of a split of (pixels, labels) arrays (image, pathfinder; text and retrieval
        have their own)."""
        x, y = self.splits[split]
        return {"tokens": torch.from_numpy(x[idx].astype(np.int64)), "targets": torch.from_numpy(y[idx])}

    def look_up(self, found: Iterator[Path], help_text: str, url: str, target: Path, **checksum) -> Path:
        """--data-file (which must exist), else the first of ``found``, else ``url`` fetched to
        ``target`` and checked."""
        if self.data_file is not None and not Path(self.data_file).exists():
            raise DataError(f"{self.name}: nothing at {self.data_file} (given by --data-file)")
        path = Path(self.data_file) if self.data_file is not None else next(found, None)
        return path if path is not None else fetch(url, target, help_text, allowed=self.download_allowed, **checksum)


def lra_presets(
    seq_len: int,
    batch_size: int,
    lr: float,
    steps: int,
    warmup: int,
    eval_every: int,
    eval_batches: int,
    cpu_batch: int = 32,
) -> Dict[str, Preset]:
    """The CPU preset (256 tokens, 800 steps) and the paper preset (Table 7 with the given values), both on
    Table 7's backbone, bench.model.Backbone's defaults."""
    cpu = Preset(
        seq_len=256,
        steps=800,
        batch_size=cpu_batch,
        lr=1e-3,
        weight_decay=0.01,
        warmup=80,
        eval_every=200,
        eval_batches=8,
        final_eval_batches=1024 // cpu_batch,
    )
    return {
        "cpu": cpu,
        "paper": dataclasses.replace(
            cpu,
            seq_len=seq_len,
            attn_dropout=0.1,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            weight_decay=0.0,
            warmup=warmup,
            eval_every=eval_every,
            eval_batches=eval_batches,
            final_eval_batches=1_000_000,
        ),
    }


def images_problem(arrays, sizes: Dict[str, int], shape: Tuple[int, ...]) -> Optional[str]:
    """What is wrong with cached images, ``sizes[split]`` of ``shape`` uint8 pixels and labels per split, or None."""
    return array_problem(
        arrays,
        {**{f"{s}_x": (n, *shape) for s, n in sizes.items()}, **{f"{s}_y": (n,) for s, n in sizes.items()}},
        {**{f"{s}_x": "u" for s in sizes}, **{f"{s}_y": "i" for s in sizes}},
    )


def fixed_permutation(n: int, salt: int = 0) -> np.ndarray:
    return np.random.default_rng(SPLIT_SEED + salt).permutation(n)


def square_side(seq_len: int, task: str, sides=None) -> int:
    side = int(round(math.sqrt(seq_len)))
    if side * side != seq_len or (sides is not None and side not in sides):
        allowed = ", ".join(str(s * s) for s in sides) if sides else "a square"
        raise ValueError(f"{task}: seq_len must be {allowed} (an image of side² pixels), got {seq_len}")
    return side


# ------------------------------------------------------------------------------------------ text (IMDB)
class Text(LRATask):
    """LRA byte-level text classification on IMDB; the paper preset is Table 7's "Text" column."""

    URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
    SHA256 = "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe"
    FOLDERS = ("imdb/aclImdb", "aclImdb")
    ARCHIVES = ("imdb/aclImdb_v1_labeled.tar.gz", "imdb/aclImdb_v1.tar.gz", "aclImdb_v1.tar.gz")
    PER_FOLDER = 12_500  # reviews in each of train/pos, train/neg, test/pos, test/neg
    VALID_FRACTION = 0.1

    def __init__(self):
        super().__init__(
            "text",
            "cls",
            vocab_size=257,
            num_classes=2,
            metric="accuracy",
            presets=lra_presets(3072, 128, 5e-4, 20_000, 8000, 500, 20),
        )

    def locate(self, data_dir: Path) -> Path:
        found = itertools.chain(
            (data_dir / f for f in self.FOLDERS if (data_dir / f / "train" / "pos").is_dir()),
            (data_dir / a for a in self.ARCHIVES if (data_dir / a).is_file()),
        )
        help_text = (
            f"text: no IMDB reviews under {data_dir} (looked for the folders "
            f"{', '.join(str(data_dir / f) for f in self.FOLDERS)} with train/pos, train/neg, test/pos, "
            f"test/neg, and the archives {', '.join(str(data_dir / a) for a in self.ARCHIVES)}). "
            f"Download {self.URL} (sha256 {self.SHA256}) into {data_dir / 'imdb'}, or pass --data-file, "
            f"or set --data-dir / SPARSE_ATTN_DATA."
        )
        return self.look_up(found, help_text, self.URL, data_dir / "imdb" / "aclImdb_v1.tar.gz", sha256=self.SHA256)

    def read(self, source: Path) -> Dict[str, np.ndarray]:
        """All labelled reviews, ordered by (split, label, review id): bytes, offsets, label, split (1 = test)."""
        found = {}

        def keep(rel: PurePosixPath) -> bool:
            parts = rel.parts
            return (
                len(parts) >= 3
                and parts[-3] in ("train", "test")
                and parts[-2] in ("pos", "neg")
                and parts[-1].endswith(".txt")
            )

        items = (
            ((PurePosixPath(p.relative_to(source).as_posix()), p.read_bytes()) for p in source.rglob("*.txt"))
            if source.is_dir()
            else iter_archive(source, keep)
        )
        for rel, data in items:
            if keep(rel):
                split, label, stem = rel.parts[-3], rel.parts[-2], rel.parts[-1][:-4]
                review_id = int(stem.split("_")[0]) if stem.split("_")[0].isdigit() else stem
                found[(split == "test", label == "pos", review_id)] = data
        for split, label in itertools.product(("train", "test"), ("pos", "neg")):
            count = sum(1 for k in found if k[0] == (split == "test") and k[1] == (label == "pos"))
            if count != self.PER_FOLDER:
                raise DataError(
                    f"text: {source} has {count} reviews in {split}/{label}, expected "
                    f"{self.PER_FOLDER} (the aclImdb layout). Fetch {self.URL} again."
                )
        keys = sorted(found, key=lambda k: (k[0], k[1], str(type(k[2])), k[2]))
        docs = Docs.from_list([found[k] for k in keys])
        return {
            "bytes": docs.data,
            "offsets": docs.offsets,
            "label": np.array([k[1] for k in keys], np.int64),
            "test": np.array([k[0] for k in keys], bool),
        }

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        self.seq_len = seq_len
        source = self.locate(Path(data_dir))
        arrays = cached(
            data_dir, f"imdb-bytes-{source_key(source)[:20]}", lambda: self.read(source), self.cache_problem
        )
        docs = Docs(arrays["bytes"], arrays["offsets"])
        train, test = np.flatnonzero(~arrays["test"]), np.flatnonzero(arrays["test"])
        train = train[fixed_permutation(len(train))]
        n_valid = int(round(len(train) * self.VALID_FRACTION))
        order = {"train": train[n_valid:], "valid": train[:n_valid], "test": test[fixed_permutation(len(test), 1)]}
        self.splits = {split: (docs, idx, arrays["label"][idx]) for split, idx in order.items()}

    def cache_problem(self, arrays) -> Optional[str]:
        """What ``read`` makes: every review of the four folders, half of them the test split."""
        n = 4 * self.PER_FOLDER
        problem = array_problem(arrays, {"label": (n,), "test": (n,)}, {"label": "i", "test": "b"}) or ragged_problem(
            arrays, "bytes", "offsets", n
        )
        if problem is None and int(arrays["test"].sum()) != n // 2:
            problem = f"has {int(arrays['test'].sum())} test reviews, expected {n // 2}"
        return problem

    def batch(self, split, idx):
        docs, rows, labels = self.splits[split]
        tokens, mask = docs.tokens(rows[idx], self.seq_len)
        return {"tokens": tokens, "targets": torch.from_numpy(labels[idx]), "key_padding_mask": mask}


# ------------------------------------------------------------------------------------------ retrieval (AAN)
class Retrieval(LRATask):
    """LRA document retrieval (AAN), a dual encoder; the paper preset is Table 7's "Retrieval" column."""

    RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
    README_URL = "https://github.com/google-research/long-range-arena"
    FILES = {"train": "new_aan_pairs.train.tsv", "valid": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
    FOLDERS = ("lra_release/tsv_data", "lra_release/lra_release/tsv_data", "tsv_data", "aan")
    ARCHIVES = ("lra_release.gz", "lra_release.tar.gz")
    CLIP = 10_000  # LRA encodes the first 10,000 bytes of each text

    def __init__(self):
        super().__init__(
            "retrieval",
            "pair",
            vocab_size=257,
            num_classes=2,
            metric="accuracy",
            presets=lra_presets(4096, 32, 1e-4, 30_000, 800, 300, 565, cpu_batch=16),
        )

    def locate(self, data_dir: Path) -> Path:
        candidates = [Path(self.data_file)] if self.data_file is not None else [data_dir / f for f in self.FOLDERS]
        for folder in candidates:
            if all((folder / name).is_file() for name in self.FILES.values()):
                return folder
        if self.data_file is None:
            for name in self.ARCHIVES:
                if (data_dir / name).is_file():
                    return self.extract(data_dir / name, data_dir / self.FOLDERS[0])
        raise DataError(
            f"retrieval: LRA's AAN pairs are not there (looked for new_aan_pairs.{{train,eval,test}}.tsv "
            f"in {', '.join(str(c) for c in candidates)}). Download the LRA release "
            f"{self.RELEASE_URL} (see {self.README_URL}), then put it at {data_dir / self.ARCHIVES[0]} "
            f"(its three TSVs are extracted on first use) or extract it so that "
            f"{data_dir / self.FOLDERS[0]} holds them; or pass --data-file with the folder."
        )

    def extract(self, archive: Path, dest: Path) -> Path:
        print(f"extracting the AAN TSVs from {archive} to {dest} (one pass over the archive) ...", flush=True)
        names = sorted(self.FILES.values())
        try:
            safe_extract(
                archive,
                dest,
                want=lambda p: p.name in names and p.parent.name == "tsv_data",
                rename=lambda p: PurePosixPath(p.name),
                required=[PurePosixPath(n) for n in names],
            )
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
                        raise DataError(
                            f"retrieval: {folder / name} line {number}: {exc} (expected label, id1, "
                            f"id2, text1, text2 as in LRA's new_aan_pairs TSVs)"
                        ) from None
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
        arrays = cached(data_dir, f"aan-bytes-{source_key(folder)[:20]}", lambda: self.read(folder), self.cache_problem)
        self.splits = {}
        for split in self.FILES:
            a, b = (Docs(arrays[f"{split}_{side}_bytes"], arrays[f"{split}_{side}_offsets"]) for side in "ab")
            order = np.arange(len(a)) if split == "train" else fixed_permutation(len(a), 2)
            self.splits[split] = (a, b, order, arrays[f"{split}_y"])

    def cache_problem(self, arrays) -> Optional[str]:
        """What ``read`` makes: per split, labels and two ragged byte documents per pair."""
        for split in self.FILES:
            problem = array_problem(arrays, {f"{split}_y": (None,)}, {f"{split}_y": "i"})
            for side in "ab":
                problem = problem or ragged_problem(
                    arrays, f"{split}_{side}_bytes", f"{split}_{side}_offsets", len(arrays.get(f"{split}_y", ()))
                )
            if problem:
                return problem
        return None

    def batch(self, split, idx):
        a, b, order, labels = self.splits[split]
        rows = order[idx]
        tokens, mask = a.tokens(rows, self.seq_len)
        tokens2, mask2 = b.tokens(rows, self.seq_len)
        return {
            "tokens": tokens,
            "key_padding_mask": mask,
            "tokens2": tokens2,
            "key_padding_mask2": mask2,
            "targets": torch.from_numpy(labels[rows]),
        }
