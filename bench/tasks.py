"""Tasks: data, presets and metrics. Every task gives batches as dicts of tensors:

    tokens (B, N) long · targets ((B,) or (B, N) long, -100 where not scored) · key_padding_mask (B, N) bool
    (True at padding) or None · for the ``pair`` head also tokens2 / key_padding_mask2.

A task has ``train_batch(batch_size, generator)`` (a fresh, reproducible draw for every step) and
``eval_batches(split, batch_size, limit)`` (a fixed, deterministic pass over the validation or test split).

- ``duplicates`` — SBM paper §5.1: N integers uniform in {1..N}; a token's label is 1 when its value occurs
  elsewhere in the sequence. New training sequences every step (the paper samples a batch per epoch);
  validation and test sets generated from the seed.
- ``listops`` — LRA ListOps (Tay et al. 2021; Nangia & Bowman 2018) with LRA's generator rules (values 0-9,
  MAX/MIN/MED/SM, operator with probability 0.25 below the maximum depth, 2..max_args arguments, accepted
  when min_len < length < max_len, deduplicated): see shared/data/README.md §3. Tokens as in the PyTorch
  ports: the brackets' "(" ")" dropped, "]" a token of its own. Ten classes.
- ``enwik8`` — byte-level LM on the first 10⁸ bytes of Wikipedia (Mahoney), standard 90M/5M/5M split; read
  from ``--data-file`` (enwik8.zip or the unzipped file) or the data folder (the file or the zip), else
  downloaded from the canonical URL; checked against the sha256 of the unzipped bytes; bits per byte.
- ``bytes`` — the same LM on local text: a folder with train/valid/test.txt, or any file split 90/5/5.
  The default is the WikiText-2 copy under the data folder; with only its valid.txt and test.txt present
  (as in shared/data), valid.txt is split 95/5 into train/valid and test.txt is the test split.
- ``wikitext2`` — the same bytes as a masked LM (15% scored, RoBERTa's 80/10/10), the dense teacher's task in
  kernel_sparse.py; perplexity per masked byte.

LM evaluation slides a window of N bytes with stride N − context (``eval_context``, the SSA paper scores
enwik8 with 3072 bytes of context in 4096-byte windows): the first window scores all its positions, later
ones only their last ``stride`` positions, so every byte is scored once with at least ``context`` bytes
before it (fewer only at the start).

Data live in ``--data-dir`` (default ``$SPARSE_ATTN_DATA`` or ``./data``). A missing or corrupt file raises
``DataError`` with what was looked for, where, and how to get it; the entry points print it and exit 1.
A failure leaves no trace: a download or extraction goes through temporary files that are renamed into place
only once checked, and the folders made for it are removed again when it fails (``created_folders``).
"""
import contextlib
import hashlib
import importlib
import io
import os
import random
import shutil
import tempfile
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

IGNORE = -100
MASK_ID = 256  # the [MASK] symbol of the masked-LM task `wikitext2` (bytes are 0-255)


class DataError(RuntimeError):
    """A dataset is missing, corrupt or cannot be fetched; the message says what to do."""


def default_data_dir() -> Path:
    return Path(os.environ.get("SPARSE_ATTN_DATA", "data"))


# ----------------------------------------------------------------------------------------------- presets
@dataclass
class Preset:
    """Model and training recipe of a task at one scale. Any field can be overridden from the CLI."""
    seq_len: int
    dim: int = 64
    depth: int = 2
    heads: int = 2
    head_dim: int = 32
    mlp_dim: int = 128
    dropout: float = 0.1
    attn_dropout: float = 0.0
    pos_emb: bool = True
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 100
    eval_every: int = 200
    eval_batches: int = 8  # batches per periodic evaluation; the final evaluation uses final_eval_batches
    final_eval_batches: int = 32
    eval_context: int = 0  # LM tasks: bytes of context kept between evaluation windows


# ------------------------------------------------------------------------------------------------ tasks
@dataclass
class Task:
    name: str
    head: str  # bench.model.HEADS
    vocab_size: int
    num_classes: int
    metric: str  # "accuracy" or "bpb"
    presets: Dict[str, Preset] = field(default_factory=dict)
    reads_files = False  # True: setup() reads data files and raises DataError when they are missing

    def setup(self, seq_len: int, seed: int, data_dir: Path, eval_context: int = 0) -> None:
        raise NotImplementedError

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Dict[str, Tensor]:
        raise NotImplementedError

    def eval_batches(self, split: str, batch_size: int, limit: Optional[int]) -> Iterator[Dict[str, Tensor]]:
        raise NotImplementedError


class ExampleSetTask(Task):
    """A task whose splits are fixed example tensors (tokens, targets, padding) held in memory."""
    splits: Dict[str, Dict[str, Tensor]]

    def train_batch(self, batch_size, generator):
        train = self.splits["train"]
        idx = torch.randint(len(train["tokens"]), (batch_size,), generator=generator)
        return {key: value[idx] for key, value in train.items()}

    def eval_batches(self, split, batch_size, limit):
        data = self.splits[split]
        total = len(data["tokens"])
        stop = total if limit is None else min(total, limit * batch_size)
        for start in range(0, stop, batch_size):
            yield {key: value[start:start + batch_size] for key, value in data.items()}


class Duplicates(ExampleSetTask):
    """SBM paper §5.1 (Fig. 4). Tokens 1..N (0 is unused), per-token binary labels."""
    EVAL_EXAMPLES = 1024

    def __init__(self):
        # The paper (§5.1, Table 7): one layer, one head, 32 dims, FFN 32, a fresh batch of 256 sequences for
        # each of 2000 steps, lr 1e-3. That is affordable on 2 CPU cores (about 4 minutes), so both presets
        # use it; with 8× fewer sequences (batch 32) full attention stalled near 82% token accuracy.
        paper = Preset(seq_len=256, dim=32, depth=1, heads=1, head_dim=32, mlp_dim=32, dropout=0.0, steps=2000,
                       batch_size=256, lr=1e-3, weight_decay=0.0, warmup=100, eval_every=250, eval_batches=4,
                       final_eval_batches=32)
        cpu = paper
        super().__init__("duplicates", "token", vocab_size=257, num_classes=2, metric="accuracy",
                         presets={"cpu": cpu, "paper": paper})

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        self.seq_len = seq_len
        self.vocab_size = seq_len + 1
        self.splits = {}
        for offset, split in enumerate(("valid", "test")):
            g = torch.Generator().manual_seed(seed * 1000 + 7 + offset)
            self.splits[split] = self.generate(self.EVAL_EXAMPLES, g)

    def generate(self, count: int, generator: torch.Generator) -> Dict[str, Tensor]:
        tokens = torch.randint(1, self.seq_len + 1, (count, self.seq_len), generator=generator)  # (B, N)
        counts = torch.zeros(count, self.seq_len + 1, dtype=torch.long).scatter_add_(1, tokens,
                                                                                     torch.ones_like(tokens))
        targets = (counts.gather(1, tokens) > 1).long()  # (B, N): 1 where the value occurs twice or more
        return {"tokens": tokens, "targets": targets}

    def train_batch(self, batch_size, generator):
        return self.generate(batch_size, generator)


LISTOPS_OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
LISTOPS_VOCAB = ["<pad>"] + [str(d) for d in range(10)] + list(LISTOPS_OPERATORS) + ["]"]


def listops_tree(rng: random.Random, depth: int, max_depth: int, max_args: int):
    """LRA's generate_tree: a leaf digit with probability 0.75 below max_depth (always at max_depth),
    otherwise an operator with 2..max_args subtrees."""
    if depth < max_depth and rng.random() <= 0.25:
        op = rng.choice(LISTOPS_OPERATORS)
        return (op, [listops_tree(rng, depth + 1, max_depth, max_args) for _ in range(rng.randint(2, max_args))])
    return rng.randint(0, 9)


def listops_value(tree) -> int:
    if isinstance(tree, int):
        return tree
    op, args = tree
    values = sorted(listops_value(a) for a in args)
    if op == "[MAX":
        return values[-1]
    if op == "[MIN":
        return values[0]
    if op == "[SM":
        return sum(values) % 10
    mid = len(values) // 2  # [MED: int() of the median, as LRA (numpy median, then int)
    return values[mid] if len(values) % 2 else int((values[mid - 1] + values[mid]) / 2)


def listops_tokens(tree) -> List[str]:
    if isinstance(tree, int):
        return [str(tree)]
    op, args = tree
    return [op] + [t for a in args for t in listops_tokens(a)] + ["]"]


class ListOps(ExampleSetTask):
    def __init__(self):
        # CPU preset: LRA's rules at lengths 50-200 (max depth 5, LRA's 10 arguments); paper preset: 500-2000.
        cpu = Preset(seq_len=200, dim=64, depth=2, heads=2, head_dim=32, mlp_dim=128, dropout=0.1, steps=1500,
                     batch_size=32, lr=1e-3, weight_decay=0.01, warmup=150, eval_every=250, eval_batches=8,
                     final_eval_batches=63)
        # Paper preset: SBM paper Table 7 (LISTOPS column: 2 layers, 2 heads, width 64, FFN 128, head dim 32,
        # length 2048, dropout and attention dropout 0.1, batch 128, lr 5e-4, 5000 steps); warm-up as LRA's.
        paper = Preset(seq_len=2048, dim=64, depth=2, heads=2, head_dim=32, mlp_dim=128, dropout=0.1,
                       attn_dropout=0.1, steps=5000, batch_size=128, lr=5e-4, weight_decay=0.0, warmup=1000,
                       eval_every=500, eval_batches=16, final_eval_batches=16)
        super().__init__("listops", "cls", vocab_size=len(LISTOPS_VOCAB), num_classes=10, metric="accuracy",
                         presets={"cpu": cpu, "paper": paper})
        self.sizes = {"train": 20000, "valid": 2000, "test": 2000}

    def generator_params(self, seq_len: int):
        """(max_depth, max_args, min_len, max_len): LRA's at length ≥ 2000, scaled-down rules below."""
        if seq_len >= 2000:
            return 10, 10, 500, 2000
        return 5, 10, seq_len // 4, seq_len

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        max_depth, max_args, min_len, max_len = self.generator_params(seq_len)
        rng = random.Random(seed)
        seen, examples = set(), []
        total = sum(self.sizes.values())
        while len(examples) < total:
            tree = listops_tree(rng, 1, max_depth, max_args)
            tokens = listops_tokens(tree)
            if not min_len < len(tokens) < max_len:
                continue
            key = " ".join(tokens)
            if key in seen:
                continue
            seen.add(key)
            examples.append((tokens, listops_value(tree)))
        index = {tok: i for i, tok in enumerate(LISTOPS_VOCAB)}
        ids = np.zeros((total, seq_len), dtype=np.int64)
        for row, (tokens, _) in enumerate(examples):
            ids[row, :len(tokens)] = [index[t] for t in tokens]
        tokens = torch.from_numpy(ids)
        targets = torch.tensor([label for _, label in examples])
        self.splits, start = {}, 0
        for split, size in self.sizes.items():
            part = slice(start, start + size)
            self.splits[split] = {"tokens": tokens[part], "targets": targets[part],
                                  "key_padding_mask": tokens[part] == 0}
            start += size


class ByteLM(Task):
    """Byte-level language modelling on a byte array per split; bits per byte."""
    reads_files = True

    def __init__(self, name: str):
        cpu = Preset(seq_len=256, dim=128, depth=2, heads=4, head_dim=32, mlp_dim=512, dropout=0.0, steps=1500,
                     batch_size=16, lr=2e-3, weight_decay=0.01, warmup=100, eval_every=250, eval_batches=8,
                     final_eval_batches=64, eval_context=128)
        # SSA paper App. B.1 scale: 4096-byte windows scored with 3072 bytes of context (a GPU run).
        paper = Preset(seq_len=4096, dim=512, depth=12, heads=8, head_dim=64, mlp_dim=2048, dropout=0.1,
                       pos_emb=False, steps=100000, batch_size=16, lr=5e-4, weight_decay=0.01, warmup=2000,
                       eval_every=5000, eval_batches=32, final_eval_batches=1000000, eval_context=3072)
        super().__init__(name, "lm", vocab_size=256, num_classes=256, metric="bpb",
                         presets={"cpu": cpu, "paper": paper})

    def load(self, data_dir: Path) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        if not 0 <= eval_context < seq_len:
            raise ValueError(f"eval_context must be in [0, seq_len={seq_len}), got {eval_context}")
        self.seq_len, self.eval_context = seq_len, eval_context
        self.data = self.load(data_dir)
        for split, array in self.data.items():
            if len(array) < seq_len + 1:
                raise DataError(f"{self.name}: the {split} split has {len(array)} bytes, fewer than "
                                f"seq_len + 1 = {seq_len + 1}")
        self.train_tensor = torch.from_numpy(self.data["train"])  # uint8: enwik8's 9·10⁷ bytes stay 90 MB

    def train_batch(self, batch_size, generator):
        n = self.seq_len
        starts = torch.randint(len(self.train_tensor) - n, (batch_size,), generator=generator)
        windows = self.train_tensor[starts[:, None] + torch.arange(n + 1)].long()  # (B, N+1)
        return {"tokens": windows[:, :-1], "targets": windows[:, 1:]}

    def eval_batches(self, split, batch_size, limit):
        """Sliding windows (see the module docstring); ``limit`` caps the number of batches."""
        data = torch.from_numpy(self.data[split])
        n, stride = self.seq_len, self.seq_len - self.eval_context
        starts = list(range(0, len(data) - n, stride))  # windows [s, s+n] incl. the last target
        if limit is not None:
            starts = starts[:limit * batch_size]
        for i in range(0, len(starts), batch_size):
            chunk = torch.tensor(starts[i:i + batch_size])
            windows = data[chunk[:, None] + torch.arange(n + 1)].long()  # (B, N+1)
            targets = windows[:, 1:].clone()
            scored_from = torch.where(chunk == 0, 0, self.eval_context)  # first window scores everything
            targets[torch.arange(n)[None, :] < scored_from[:, None]] = IGNORE
            yield {"tokens": windows[:, :-1], "targets": targets}


class Enwik8(ByteLM):
    """The first 10⁸ bytes of enwik8, split 90/5/5 (90M/5M/5M). Read from ``--data-file`` (enwik8.zip or the
    unzipped file), else from the data folder (DATA/enwik8/enwik8, DATA/enwik8/enwik8.zip or DATA/enwik8.zip,
    in that order), else downloaded to DATA/enwik8/enwik8. Whichever is read, the bytes are checked against
    the sha256 of the unzipped file (a zip is checked by its content, which is what the split is made of)."""
    URL = "http://mattmahoney.net/dc/enwik8.zip"
    SHA256 = "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"
    MEMBER = "enwik8"  # the zip holds this one file
    SIZE = 100_000_000  # its size in bytes
    download_allowed = True

    def __init__(self):
        super().__init__("enwik8")
        self.data_file: Optional[Path] = None  # set from --data-file

    def candidates(self, data_dir: Path) -> List[Path]:
        if self.data_file is not None:
            return [Path(self.data_file)]
        data_dir = Path(data_dir)
        return [data_dir / "enwik8" / "enwik8", data_dir / "enwik8" / "enwik8.zip", data_dir / "enwik8.zip"]

    def load(self, data_dir):
        found = [path for path in self.candidates(data_dir) if path.is_file()]
        if self.data_file is not None and not found:
            raise DataError(f"enwik8: no file at {self.data_file} (given by --data-file). Pass enwik8.zip from "
                            f"{self.URL} or the unzipped file enwik8 (sha256 {self.SHA256}).")
        if found:
            path = found[0]
        else:
            path = Path(data_dir) / "enwik8" / "enwik8"
            self.fetch(path)
        data = read_enwik8(path, self.MEMBER)
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.SHA256:
            what = f"the file {self.MEMBER!r} in {path}" if zipfile.is_zipfile(path) else str(path)
            raise DataError(f"enwik8: {what} has sha256 {digest}, expected {self.SHA256} (the first 10^8 bytes of "
                            f"enwik8, unzipped, from {self.URL}). Delete it and fetch it again.")
        train_end, valid_end = enwik8_split(len(data))
        return {"train": data[:train_end], "valid": data[train_end:valid_end], "test": data[valid_end:]}

    def fetch(self, path: Path) -> None:
        """Downloads the zip into memory (36 MB) and extracts its one member through a temporary file, which
        becomes ``path`` only when its size and sha256 are right; on any failure nothing is left behind (the
        temporary file and the folders this created are removed)."""
        looked = ", ".join(str(p) for p in self.candidates(path.parent.parent))
        help_text = (f"enwik8: not found (looked for {looked}). Download {self.URL} and pass it with --data-file "
                     f"(the zip or the unzipped file 'enwik8', sha256 {self.SHA256}), or put either there, or "
                     f"point --data-dir / SPARSE_ATTN_DATA at a folder holding enwik8/enwik8.")
        if not self.download_allowed or os.environ.get("SPARSE_ATTN_OFFLINE"):
            raise DataError(help_text + " (Downloads are off.)")
        with created_folders(path.parent):
            print(f"downloading {self.URL} to {path.parent} ...", flush=True)
            try:
                with urllib.request.urlopen(self.URL, timeout=60) as response:
                    archive = response.read()
                with zipfile.ZipFile(io.BytesIO(archive)) as zf:
                    infos = zf.infolist()
                    if [info.filename for info in infos] != [self.MEMBER] or infos[0].file_size != self.SIZE:
                        raise DataError(f"enwik8: the archive from {self.URL} holds "
                                        f"{[(i.filename, i.file_size) for i in infos[:5]]}, expected one member "
                                        f"'enwik8' of {self.SIZE} bytes")
                    fd, partial = temporary_file(path)
                    try:
                        with zf.open(infos[0]) as src, os.fdopen(fd, "wb") as dst:
                            shutil.copyfileobj(src, dst)
                        digest = sha256_file(Path(partial))
                        if digest != self.SHA256:
                            raise DataError(f"{help_text} The download has sha256 {digest}, expected "
                                            f"{self.SHA256}; it was deleted.")
                        os.replace(partial, path)
                    finally:
                        Path(partial).unlink(missing_ok=True)
            except (OSError, zipfile.BadZipFile) as exc:
                raise DataError(f"{help_text} The download failed: {exc}") from None


def enwik8_split(length: int):
    """(end of train, end of valid) for the standard 90/5/5 split: 90M/5M/5M bytes of the real 10⁸."""
    return length * 9 // 10, length * 19 // 20


def read_enwik8(path: Path, member: str) -> np.ndarray:
    """The bytes of enwik8 as a uint8 array, from the unzipped file or from the one member of a zip."""
    if not zipfile.is_zipfile(path):
        if path.suffix == ".zip":
            raise DataError(f"enwik8: {path} is not a zip archive (damaged or incomplete?); pass enwik8.zip from "
                            f"{Enwik8.URL} or the unzipped file.")
        return np.fromfile(path, dtype=np.uint8)
    try:
        with zipfile.ZipFile(path) as zf:
            if member not in zf.namelist():
                raise DataError(f"enwik8: {path} is a zip without a file {member!r} (it holds "
                                f"{zf.namelist()[:5]}); pass enwik8.zip from {Enwik8.URL} or the unzipped file.")
            data = np.empty(zf.getinfo(member).file_size, dtype=np.uint8)
            with zf.open(member) as src:  # decompressed straight into the array: no second copy of 10⁸ bytes
                view, filled = memoryview(data), 0
                while filled < len(data):
                    got = src.readinto(view[filled:filled + (1 << 22)])
                    if not got:
                        raise DataError(f"enwik8: {path} ends early: {filled} of {len(data)} bytes of {member!r}")
                    filled += got
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise DataError(f"enwik8: cannot read {path} as a zip ({exc}); pass enwik8.zip from {Enwik8.URL} or the "
                        f"unzipped file.") from None
    return data


class LocalBytes(ByteLM):
    def __init__(self):
        super().__init__("bytes")
        self.data_file: Optional[Path] = None  # set from --data-file

    def load(self, data_dir):
        if self.data_file is not None:
            path = Path(self.data_file)
            if not path.is_file():
                raise DataError(f"bytes: no file at {path} (given by --data-file).")
            data = np.fromfile(path, dtype=np.uint8)
            a, b = int(len(data) * 0.9), int(len(data) * 0.95)
            return {"train": data[:a], "valid": data[a:b], "test": data[b:]}
        folder = Path(data_dir) / "wikitext-2"
        files = {split: folder / f"{split}.txt" for split in ("train", "valid", "test")}
        if files["train"].is_file() and files["valid"].is_file() and files["test"].is_file():
            return {split: np.fromfile(p, dtype=np.uint8) for split, p in files.items()}
        if files["valid"].is_file() and files["test"].is_file():
            valid = np.fromfile(files["valid"], dtype=np.uint8)
            cut = int(len(valid) * 0.95)
            return {"train": valid[:cut], "valid": valid[cut:], "test": np.fromfile(files["test"], dtype=np.uint8)}
        raise DataError(f"bytes: no WikiText-2 text in {folder} (looked for train/valid/test.txt, or valid.txt and "
                        f"test.txt). Get wikitext-2-v1.zip from https://s3.amazonaws.com/research.metamind.io/"
                        f"wikitext/wikitext-2-v1.zip (md5 542ccefacc6c27f945fb54453812b3cd), or pass --data-file "
                        f"with any text file, or set --data-dir / SPARSE_ATTN_DATA.")


class MaskedBytes(LocalBytes):
    """`wikitext2`: the byte data of `bytes` (WikiText-2 from the data folder, or --data-file) as a masked LM, the
    task of kernel_sparse.py's dense teacher (paper 003 §4; deviation 1 there): 15% of the positions are scored,
    of which 80% become [MASK], 10% a random byte and 10% stay (RoBERTa). Evaluation windows do not overlap, and
    their masks are fixed by (split, batch index)."""

    def __init__(self):
        super().__init__()
        self.name, self.head, self.vocab_size, self.num_classes = "wikitext2", "token", MASK_ID + 1, 256
        # CPU: minutes on one core. Paper: §4's sequence length 512 and RoBERTa-base sizes (a GPU run).
        self.presets = {
            "cpu": Preset(seq_len=256, dim=128, depth=4, heads=4, head_dim=32, mlp_dim=512, dropout=0.0,
                          steps=1000, batch_size=16, lr=2e-3, warmup=100, eval_every=250, eval_batches=16,
                          final_eval_batches=16),
            "paper": Preset(seq_len=512, dim=768, depth=12, heads=12, head_dim=64, mlp_dim=3072, dropout=0.1,
                            steps=20000, batch_size=32, lr=3e-4, warmup=1000, eval_every=2000, eval_batches=32,
                            final_eval_batches=1000000)}

    @staticmethod
    def mask(tokens: Tensor, generator: torch.Generator) -> Dict[str, Tensor]:
        draw = torch.rand(tokens.shape, generator=generator)  # (B, N)
        scored = draw < 0.15
        inputs = torch.where(draw < 0.15 * 0.8, MASK_ID, tokens)
        noise = torch.randint(256, tokens.shape, generator=generator)
        inputs = torch.where((draw >= 0.15 * 0.8) & (draw < 0.15 * 0.9), noise, inputs)
        return {"tokens": inputs, "targets": torch.where(scored, tokens, IGNORE)}

    def train_batch(self, batch_size, generator):
        return self.mask(super().train_batch(batch_size, generator)["tokens"], generator)

    def eval_batches(self, split, batch_size, limit):
        for index, batch in enumerate(super().eval_batches(split, batch_size, limit)):
            yield self.mask(batch["tokens"], torch.Generator().manual_seed(1_000_003 * index + len(split)))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


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


def write_atomic(path: Path, data: bytes) -> None:
    write_atomic_with(path, lambda f: f.write(data))


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write(file)`` into a temporary file, synced and renamed over ``path``: a reader (or a run killed at any
    instant) sees the old file or the whole new one, never a part."""
    fd, tmp = temporary_file(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def lra_task(class_name: str):
    """The LRA tasks live in bench/lra.py, which imports this module: import it only when a task is built."""
    return lambda: getattr(importlib.import_module("bench.lra"), class_name)()


TASKS = {"duplicates": Duplicates, "listops": ListOps, "enwik8": Enwik8, "bytes": LocalBytes, "wikitext2": MaskedBytes,
         "text": lra_task("Text"), "image": lra_task("Image"), "pathfinder": lra_task("Pathfinder"),
         "retrieval": lra_task("Retrieval")}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)}")
    return TASKS[name]()
