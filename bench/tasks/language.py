"""Byte-level language modelling: enwik8, any local text, and WikiText-2 as a masked LM.

- ``enwik8`` — the first 10⁸ bytes of Wikipedia (Mahoney), split 90M/5M/5M, bits per byte: ``--data-file``
  (the zip or the unzipped file), else the data folder, else downloaded; sha256 of the unzipped bytes checked.
- ``bytes`` — the same LM on local text: a folder with train/valid/test.txt, or any file split 90/5/5; by
  default the data folder's WikiText-2 (with only valid.txt and test.txt, valid.txt is split 95/5).
- ``wikitext2`` — the same bytes as a masked LM (15% scored, RoBERTa's 80/10/10), the dense teacher's task in
  kernel_sparse.py; perplexity per masked byte.

LM evaluation slides a window of N bytes with stride N − ``eval_context`` (the SSA paper: 3072 bytes of context
in 4096-byte windows): every byte is scored once, with at least the context before it but at the start.
"""

import hashlib
import zipfile
import zlib
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import Tensor

from bench.config import Preset
from bench.tasks.base import IGNORE, Task
from bench.tasks.data_files import DataError, fetch, iter_archive

MASK_ID = 256  # the [MASK] symbol of the masked-LM task `wikitext2` (bytes are 0-255)


class ByteLM(Task):
    """Byte-level language modelling on a byte array per split; bits per byte."""

    reads_files = True

    def __init__(self, name: str):
        cpu = Preset(
            seq_len=256,
            dim=128,
            depth=2,
            heads=4,
            head_dim=32,
            mlp_dim=512,
            dropout=0.0,
            steps=1500,
            batch_size=16,
            lr=2e-3,
            weight_decay=0.01,
            warmup=100,
            eval_every=250,
            eval_batches=8,
            final_eval_batches=64,
            eval_context=128,
        )
        # SSA paper App. B.1 scale: 4096-byte windows scored with 3072 bytes of context (a GPU run).
        paper = Preset(
            seq_len=4096,
            dim=512,
            depth=12,
            heads=8,
            head_dim=64,
            mlp_dim=2048,
            dropout=0.1,
            pos_emb=False,
            steps=100000,
            batch_size=16,
            lr=5e-4,
            weight_decay=0.01,
            warmup=2000,
            eval_every=5000,
            eval_batches=32,
            final_eval_batches=1000000,
            eval_context=3072,
        )
        super().__init__(
            name, "lm", vocab_size=256, num_classes=256, metric="bpb", presets={"cpu": cpu, "paper": paper}
        )

    def load(self, data_dir: Path) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        if not 0 <= eval_context < seq_len:
            raise ValueError(f"eval_context must be in [0, seq_len={seq_len}), got {eval_context}")
        self.seq_len, self.eval_context = seq_len, eval_context
        self.data = self.load(data_dir)
        for split, array in self.data.items():
            if len(array) < seq_len + 1:
                raise DataError(
                    f"{self.name}: the {split} split has {len(array)} bytes, fewer than seq_len + 1 = {seq_len + 1}"
                )
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
            starts = starts[: limit * batch_size]
        for i in range(0, len(starts), batch_size):
            chunk = torch.tensor(starts[i : i + batch_size])
            windows = data[chunk[:, None] + torch.arange(n + 1)].long()  # (B, N+1)
            targets = windows[:, 1:].clone()
            scored_from = torch.where(chunk == 0, 0, self.eval_context)  # first window scores everything
            targets[torch.arange(n)[None, :] < scored_from[:, None]] = IGNORE
            yield {"tokens": windows[:, :-1], "targets": targets}


class Enwik8(ByteLM):
    """enwik8, from --data-file, else the data folder (in ``candidates``' order), else downloaded; whichever is
    read, the bytes are checked against the sha256 of the unzipped file (what the split is made of)."""

    URL = "http://mattmahoney.net/dc/enwik8.zip"
    SHA256 = "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"
    MEMBER = "enwik8"  # the zip holds this one file
    SIZE = 100_000_000  # its size in bytes

    def __init__(self):
        super().__init__("enwik8")

    def candidates(self, data_dir: Path) -> List[Path]:
        if self.data_file is not None:
            return [Path(self.data_file)]
        data_dir = Path(data_dir)
        return [data_dir / "enwik8" / "enwik8", data_dir / "enwik8" / "enwik8.zip", data_dir / "enwik8.zip"]

    def load(self, data_dir):
        found = [path for path in self.candidates(data_dir) if path.is_file()]
        if self.data_file is not None and not found:
            raise DataError(
                f"enwik8: no file at {self.data_file} (given by --data-file). Pass enwik8.zip from "
                f"{self.URL} or the unzipped file enwik8 (sha256 {self.SHA256})."
            )
        path = found[0] if found else self.download(Path(data_dir))
        data = read_enwik8(path, self.MEMBER)
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.SHA256:
            what = f"the file {self.MEMBER!r} in {path}" if zipfile.is_zipfile(path) else str(path)
            raise DataError(
                f"enwik8: {what} has sha256 {digest}, expected {self.SHA256} (the first 10^8 bytes of "
                f"enwik8, unzipped, from {self.URL}). Delete it and fetch it again."
            )
        train_end, valid_end = enwik8_split(len(data))
        return {"train": data[:train_end], "valid": data[train_end:valid_end], "test": data[valid_end:]}

    def download(self, data_dir: Path) -> Path:
        """The zip (36 MB) fetched to DATA/enwik8/enwik8.zip, kept only when its one member has the right size
        and sha256 (``fetch`` deletes a download that fails the check, with the folders made for it)."""
        looked = ", ".join(str(p) for p in self.candidates(data_dir))
        help_text = (
            f"enwik8: not found (looked for {looked}). Download {self.URL} and pass it with --data-file "
            f"(the zip or the unzipped file 'enwik8', sha256 {self.SHA256}), or put either there, or "
            f"point --data-dir / SPARSE_ATTN_DATA at a folder holding enwik8/enwik8."
        )
        return fetch(
            self.URL,
            data_dir / "enwik8" / "enwik8.zip",
            help_text,
            verify=self.check_download,
            allowed=self.download_allowed,
        )

    def check_download(self, path: Path) -> Optional[str]:
        """What is wrong with a downloaded archive, or None: it must hold one member 'enwik8' of ``SIZE`` bytes
        (checked before the member is read) whose sha256 is ``SHA256``."""
        try:
            with zipfile.ZipFile(path) as zf:
                infos = zf.infolist()
                if [info.filename for info in infos] != [self.MEMBER] or infos[0].file_size != self.SIZE:
                    return (
                        f"holds {[(i.filename, i.file_size) for i in infos[:5]]}, expected one member "
                        f"'enwik8' of {self.SIZE} bytes"
                    )
                digest = hashlib.sha256()
                with zf.open(infos[0]) as member:
                    for block in iter(lambda: member.read(1 << 22), b""):
                        digest.update(block)
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            return f"is not a readable zip ({exc})"
        if digest.hexdigest() != self.SHA256:
            return f"has sha256 {digest.hexdigest()} (its member 'enwik8'), expected {self.SHA256}"
        return None


def enwik8_split(length: int):
    """(end of train, end of valid) for the standard 90/5/5 split: 90M/5M/5M bytes of the real 10⁸."""
    return length * 9 // 10, length * 19 // 20


def read_enwik8(path: Path, member: str) -> np.ndarray:
    """The bytes of enwik8 as a uint8 array, from the unzipped file or from the one member of a zip."""
    if not zipfile.is_zipfile(path):
        if path.suffix == ".zip":
            raise DataError(
                f"enwik8: {path} is not a zip archive (damaged or incomplete?); pass enwik8.zip from "
                f"{Enwik8.URL} or the unzipped file."
            )
        return np.fromfile(path, dtype=np.uint8)
    try:
        with zipfile.ZipFile(path) as zf:
            if member not in zf.namelist():
                raise DataError(
                    f"enwik8: {path} is a zip without a file {member!r} (it holds "
                    f"{zf.namelist()[:5]}); pass enwik8.zip from {Enwik8.URL} or the unzipped file."
                )
            data = np.empty(zf.getinfo(member).file_size, dtype=np.uint8)
            with zf.open(member) as src:  # decompressed straight into the array: no second copy of 10⁸ bytes
                view, filled = memoryview(data), 0
                while filled < len(data):
                    got = src.readinto(view[filled : filled + (1 << 22)])
                    if not got:
                        raise DataError(f"enwik8: {path} ends early: {filled} of {len(data)} bytes of {member!r}")
                    filled += got
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise DataError(
            f"enwik8: cannot read {path} as a zip ({exc}); pass enwik8.zip from {Enwik8.URL} or the unzipped file."
        ) from None
    return data


class LocalBytes(ByteLM):
    """`bytes`: --data-file (split 90/5/5), else WikiText-2 under the data folder (a folder of splits, or the
    release's archive), else that archive downloaded from its author's mirror (md5-checked)."""

    WIKITEXT_URL = "https://wikitext.smerity.com/wikitext-2-v1.zip"  # the original S3 address answers 403
    WIKITEXT_MD5 = "542ccefacc6c27f945fb54453812b3cd"
    SPLITS = ("train", "valid", "test")

    def __init__(self):
        super().__init__("bytes")

    def load(self, data_dir):
        if self.data_file is not None:
            path = Path(self.data_file)
            if not path.is_file():
                raise DataError(f"{self.name}: no file at {path} (given by --data-file).")
            data = np.fromfile(path, dtype=np.uint8)
            a, b = int(len(data) * 0.9), int(len(data) * 0.95)
            return {"train": data[:a], "valid": data[a:b], "test": data[b:]}
        folder = Path(data_dir) / "wikitext-2"
        for names in ({s: f"{s}.txt" for s in self.SPLITS}, {s: f"wiki.{s}.tokens" for s in self.SPLITS}):
            files = {split: folder / name for split, name in names.items()}
            if all(p.is_file() for p in files.values()):
                return {split: np.fromfile(p, dtype=np.uint8) for split, p in files.items()}
            if files["valid"].is_file() and files["test"].is_file():
                valid = np.fromfile(files["valid"], dtype=np.uint8)
                cut = int(len(valid) * 0.95)
                return {"train": valid[:cut], "valid": valid[cut:], "test": np.fromfile(files["test"], dtype=np.uint8)}
        archive = next(
            (p for p in (folder / "wikitext-2-v1.zip", Path(data_dir) / "wikitext-2-v1.zip") if p.is_file()), None
        )
        help_text = (
            f"{self.name}: no WikiText-2 text in {folder} (looked for train/valid/test.txt, "
            f"wiki.{{train,valid,test}}.tokens, or valid and test alone, and for wikitext-2-v1.zip). Download "
            f"{self.WIKITEXT_URL} (md5 {self.WIKITEXT_MD5}) into {folder}, or pass --data-file with any text "
            f"file, or set --data-dir / SPARSE_ATTN_DATA."
        )
        if archive is None:
            archive = fetch(
                self.WIKITEXT_URL,
                folder / "wikitext-2-v1.zip",
                help_text,
                md5=self.WIKITEXT_MD5,
                allowed=self.download_allowed,
            )
        members = {
            path.name: data
            for path, data in iter_archive(archive, lambda p: p.name in {f"wiki.{s}.tokens" for s in self.SPLITS})
        }
        missing = [f"wiki.{s}.tokens" for s in self.SPLITS if f"wiki.{s}.tokens" not in members]
        if missing:
            raise DataError(
                f"{self.name}: {archive} lacks {missing} (the WikiText-2 release holds "
                f"wikitext-2/wiki.{{train,valid,test}}.tokens). {help_text}"
            )
        return {s: np.frombuffer(members[f"wiki.{s}.tokens"], dtype=np.uint8).copy() for s in self.SPLITS}


class MaskedBytes(LocalBytes):
    """`wikitext2`: the byte data of `bytes` (WikiText-2 from the data folder, or --data-file) as a masked LM, the
    task of kernel_sparse.py's dense teacher (Karkhanis et al. §4: our teacher replaces their pretrained RoBERTa): 15% of the positions are scored,
    of which 80% become [MASK], 10% a random byte and 10% stay (RoBERTa). Evaluation windows do not overlap, and
    their masks are fixed by (split, batch index)."""

    def __init__(self):
        super().__init__()
        self.name, self.head, self.vocab_size, self.num_classes = "wikitext2", "token", MASK_ID + 1, 256
        # CPU: minutes on one core. Paper: §4's sequence length 512 and RoBERTa-base sizes (a GPU run).
        self.presets = {
            "cpu": Preset(
                seq_len=256,
                dim=128,
                depth=4,
                heads=4,
                head_dim=32,
                mlp_dim=512,
                dropout=0.0,
                steps=1000,
                batch_size=16,
                lr=2e-3,
                warmup=100,
                eval_every=250,
                eval_batches=16,
                final_eval_batches=16,
            ),
            "paper": Preset(
                seq_len=512,
                dim=768,
                depth=12,
                heads=12,
                head_dim=64,
                mlp_dim=3072,
                dropout=0.1,
                steps=20000,
                batch_size=32,
                lr=3e-4,
                warmup=1000,
                eval_every=2000,
                eval_batches=32,
                final_eval_batches=1000000,
            ),
        }

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
