"""bench/tasks/lra.py: the LRA tasks read the local data (or skip with the reason when it is absent), cache it,
give batches of the right shapes, balanced labels and seed-determined data; the Pathfinder generator keeps
its geometric promises; archives with unsafe members and corrupt downloads are refused; missing data gives
one clear message; and a two-step training run works for every task that has data."""

import hashlib
import importlib.util
import io
import json
import os
import pickle
import sys
import tarfile
import time
import zipfile
from collections import deque
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
import torch

from bench import train as harness
from bench.tasks import data_files as data, image, lra, pathfinder
from bench.tasks import DataError, get_task

from conftest import DATA as SHARED_DATA, exit_code

IMDB = SHARED_DATA / "imdb" / "aclImdb_v1_labeled.tar.gz"
CIFAR_JPEG = SHARED_DATA / "cifar10" / "cifar10_jpeg.tar.gz"
TINY = [
    "--dim",
    "16",
    "--heads",
    "2",
    "--head-dim",
    "8",
    "--mlp-dim",
    "16",
    "--depth",
    "1",
    "--batch-size",
    "4",
    "--eval-batches",
    "2",
    "--final-eval-batches",
    "2",
    "--warmup",
    "2",
    "--steps",
    "2",
]

HAVE_PILLOW = importlib.util.find_spec("PIL") is not None


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache folder for the whole file, so the training runs reuse what the unit tests decoded."""
    return tmp_path_factory.mktemp("lra-cache")


@pytest.fixture(autouse=True)
def environment(cache, monkeypatch):
    monkeypatch.setenv("SPARSE_ATTN_CACHE", str(cache))
    monkeypatch.setenv("SPARSE_ATTN_OFFLINE", "1")


def train(*args):
    """python -m bench.train's main(args) in this process (a test adjusts a constant with
    monkeypatch first); the run's record."""
    code = exit_code(harness.main, args)
    assert code == 0, f"exit {code}"
    return json.loads((Path(args[args.index("--out") + 1]) / "metrics.json").read_text())


# --------------------------------------------------------------------------------------------- archives
def _tar(path, members):
    """members: (name, kind, payload) with kind file / symlink / hardlink / fifo."""
    with tarfile.open(path, "w:gz") as tf:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = payload.decode() if payload else ""
            tf.addfile(info)
    return path


@pytest.mark.parametrize(
    "name,kind,payload",
    [
        ("../evil.txt", "file", b"x"),
        ("data/../../evil.txt", "file", b"x"),
        ("/tmp/evil.txt", "file", b"x"),
        ("data/link", "symlink", b"/etc/passwd"),
        ("data/hard", "hardlink", b"../../evil.txt"),
        ("data/pipe", "fifo", b""),
        ("data\\..\\evil.txt", "file", b"x"),
    ],
)
def test_unsafe_tar_members_are_refused(tmp_path, name, kind, payload):
    archive = _tar(tmp_path / "bad.tar.gz", [("data/ok.txt", "file", b"fine"), (name, kind, payload)])
    dest = tmp_path / "sandbox" / "out"
    dest.mkdir(parents=True)
    with pytest.raises(DataError, match="refusing the archive .*bad.tar.gz"):
        data.safe_extract(archive, dest)
    with pytest.raises(DataError, match="refusing"):
        list(data.iter_archive(archive))
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "sandbox" / "evil.txt").exists()
    assert not any(p.is_symlink() for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(
    "name,symlink", [("../evil.txt", False), ("/abs/evil.txt", False), ("a/../../evil.txt", False), ("data/link", True)]
)
def test_unsafe_zip_members_are_refused(tmp_path, name, symlink):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("data/ok.txt", b"fine")
        info = zipfile.ZipInfo(name)
        if symlink:
            info.external_attr = 0o120777 << 16
        zf.writestr(info, b"/etc/passwd" if symlink else b"x")
    dest = tmp_path / "sandbox"
    dest.mkdir()
    with pytest.raises(DataError, match="refusing the archive"):
        data.safe_extract(archive, dest)
    assert not (tmp_path / "evil.txt").exists() and not any(p.is_symlink() for p in tmp_path.rglob("*"))


def test_safe_archives_extract_inside_the_destination(tmp_path):
    archive = _tar(tmp_path / "good.tar.gz", [("top/a.txt", "file", b"A"), ("top/sub/b.txt", "file", b"BB")])
    written = data.safe_extract(archive, tmp_path / "out", want=lambda p: p.name != "a.txt")
    assert written == [tmp_path / "out" / "top" / "sub" / "b.txt"] and written[0].read_bytes() == b"BB"
    assert not list((tmp_path / "out").rglob("*.tmp"))
    (tmp_path / "broken.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(DataError, match="cannot read the archive"):
        list(data.iter_archive(tmp_path / "broken.tar.gz"))


def test_a_download_with_the_wrong_checksum_is_refused_and_deleted(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARSE_ATTN_OFFLINE")  # the downloader itself, its network a stand-in
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"<html>moved</html>"))
    target = tmp_path / "imdb" / "aclImdb_v1.tar.gz"
    with pytest.raises(DataError, match=f"expected {lra.Text.SHA256}.*deleted"):
        data.fetch(lra.Text.URL, target, "text:", sha256=lra.Text.SHA256)
    assert not target.exists() and not list(tmp_path.rglob("*.partial"))
    good = b"payload"
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(good))
    data.fetch("http://x", target, "t:", md5=hashlib.md5(good).hexdigest())
    assert target.read_bytes() == good
    with pytest.raises(DataError, match=r"t: \(Downloads are off.\)"):  # a task's --no-download
        data.fetch("http://x", tmp_path / "other", "t:", allowed=False)


def test_a_refused_archive_leaves_no_extracted_members(tmp_path):
    """The members before the bad one were written in place before (and a later run used them)."""
    archive = _tar(
        tmp_path / "bad.tar.gz",
        [("data/ok.txt", "file", b"fine"), ("data/sub/ok2.txt", "file", b"x"), ("../evil.txt", "file", b"x")],
    )
    dest = tmp_path / "data" / "out"
    with pytest.raises(DataError, match="refusing the archive"):
        data.safe_extract(archive, dest)
    assert not (tmp_path / "data").exists()  # nor the folders made for the extraction
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "old.txt").write_bytes(b"old")
    with pytest.raises(DataError, match="refusing the archive"):
        data.safe_extract(archive, tmp_path / "kept")
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["old.txt"]
    with pytest.raises(DataError, match=r"lacks \['data/absent.txt'\]"):
        data.safe_extract(
            _tar(tmp_path / "good.tar.gz", [("data/ok.txt", "file", b"fine")]),
            tmp_path / "new",
            required=["data/absent.txt"],
        )
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar.gz", "good.tar.gz", "kept"]  # no staging left


def test_retrieval_refuses_an_archive_with_a_bad_member_after_its_tsvs_and_keeps_nothing(tmp_path):
    _lra_release(tmp_path, last_member="lra_release/../../escape.tsv")
    for _ in range(2):  # the second run is refused the same way: nothing of the first was kept
        with pytest.raises(DataError, match="refusing the archive"):
            get_task("retrieval").setup(32, 0, tmp_path / "data")
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["lra_release.gz"]


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_archive_members_larger_than_the_limit_are_refused_before_they_are_read(tmp_path, monkeypatch, kind):
    """A zip of 2 MB of zeros is a few kilobytes; its declared size is checked against the limit first."""
    big = b"\0" * 5000
    original_open, original_extractfile = zipfile.ZipFile.open, tarfile.TarFile.extractfile
    if kind == "zip":
        archive = tmp_path / "bomb.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("data/small.txt", b"fine")
            zf.writestr("data/big.bin", big)
        monkeypatch.setattr(zipfile.ZipFile, "open", _refuse_reading(zipfile.ZipFile.open, "big.bin"))
    else:
        archive = _tar(tmp_path / "bomb.tar.gz", [("data/small.txt", "file", b"fine"), ("data/big.bin", "file", big)])
        monkeypatch.setattr(tarfile.TarFile, "extractfile", _refuse_reading(tarfile.TarFile.extractfile, "big.bin"))
    monkeypatch.setattr(data, "MAX_MEMBER_BYTES", 4096)
    monkeypatch.setattr(data, "MAX_EXTRACTED_BYTES", 4096)
    with pytest.raises(DataError, match="member data/big.bin declares 5,000 bytes, more than the 4,096 allowed"):
        list(data.iter_archive(archive))
    with pytest.raises(DataError, match="declares 5,000 bytes"):
        data.safe_extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(zipfile.ZipFile, "open", original_open)
    monkeypatch.setattr(tarfile.TarFile, "extractfile", original_extractfile)
    monkeypatch.setattr(data, "MAX_MEMBER_BYTES", 5000)
    assert dict(data.iter_archive(archive))[PurePosixPath("data/big.bin")] == big  # at the limit: read


def _refuse_reading(method, name):
    def wrapped(self, member, *args, **kwargs):
        assert name not in str(getattr(member, "name", getattr(member, "filename", member))), "read before refused"
        return method(self, member, *args, **kwargs)

    return wrapped


def test_a_failed_download_leaves_no_file_and_no_folder(tmp_path, monkeypatch):
    def unreachable(url, timeout):
        raise OSError("network unreachable (test)")

    monkeypatch.delenv("SPARSE_ATTN_OFFLINE")
    monkeypatch.setattr(data.urllib.request, "urlopen", unreachable)
    missing = tmp_path / "no" / "such" / "data"
    for name in ("text", "image"):
        with pytest.raises(DataError, match="The download failed: network unreachable"):
            get_task(name).setup(256, 0, missing)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(b"<html>moved</html>"))
    with pytest.raises(DataError, match="it was deleted"):
        get_task("text").setup(256, 0, missing)
    assert list(tmp_path.iterdir()) == []


def test_missing_data_messages_say_what_where_and_how(tmp_path):
    for name, needles in [
        ("text", [str(tmp_path / "imdb" / "aclImdb"), lra.Text.URL, lra.Text.SHA256]),
        ("image", [str(tmp_path / "cifar10" / "cifar-10-python.tar.gz"), image.Image.URL, image.Image.MD5]),
        ("retrieval", [str(tmp_path / "lra_release" / "tsv_data"), "new_aan_pairs", lra.Retrieval.RELEASE_URL]),
    ]:
        with pytest.raises(DataError) as info:
            get_task(name).setup(256, 0, tmp_path)
        for needle in needles:
            assert needle in str(info.value), (name, needle, str(info.value))
    with pytest.raises(ValueError, match="seq_len"):
        get_task("image").setup(300, 0, tmp_path)
    with pytest.raises(ValueError, match="at least 16 px"):
        get_task("pathfinder").setup(144, 0, tmp_path)


# --------------------------------------------------------------------------------------------- text
def _imdb_tree(root: Path, per_folder: int, extras: bool = True) -> Path:
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            folder = root / "aclImdb" / split / label
            folder.mkdir(parents=True)
            for i in range(per_folder):
                (folder / f"{i}_{7 if label == 'pos' else 2}.txt").write_bytes(
                    f"{split} {label} review {i} <br />caf\u00e9".encode()
                )
    if extras:  # what the official archive has besides the labelled reviews
        (root / "aclImdb" / "train" / "unsup").mkdir()
        (root / "aclImdb" / "train" / "unsup" / "0_0.txt").write_bytes(b"unlabelled")
        (root / "aclImdb" / "train" / "urls_pos.txt").write_bytes(b"http://")
    return root / "aclImdb"


def test_text_reads_folder_and_archive_alike(tmp_path, monkeypatch):
    monkeypatch.setattr(lra.Text, "PER_FOLDER", 10)
    folder = _imdb_tree(tmp_path / "src", 10)
    with tarfile.open(tmp_path / "aclImdb_v1.tar.gz", "w:gz") as tf:
        tf.add(folder, arcname="aclImdb")
    from_folder, from_archive = lra.Text().read(folder), lra.Text().read(tmp_path / "aclImdb_v1.tar.gz")
    for key in from_folder:
        assert np.array_equal(from_folder[key], from_archive[key]), key
    assert len(from_folder["label"]) == 40 and from_folder["label"].sum() == 20 and from_folder["test"].sum() == 20
    task = get_task("text")
    task.data_file = str(tmp_path / "aclImdb_v1.tar.gz")
    task.setup(12, 0, tmp_path)
    assert [task.split_size(s) for s in ("train", "valid", "test")] == [18, 2, 20]
    batch = next(task.eval_batches("test", 20, None))
    text = bytes((batch["tokens"][0][~batch["key_padding_mask"][0]] - 1).tolist())
    assert text.startswith(b"test ") and len(text) == 12  # truncated to seq_len bytes, shifted by one
    (folder / "test" / "neg" / "3_2.txt").unlink()
    with pytest.raises(DataError, match="9 reviews in test/neg, expected 10"):
        lra.Text().read(folder)


@pytest.mark.skipif(not IMDB.exists(), reason=f"the IMDB copy {IMDB} is absent")
def test_text_on_the_local_imdb_archive_is_cached(cache):
    start = time.perf_counter()
    task = get_task("text")
    task.setup(256, 0, SHARED_DATA)
    first = time.perf_counter() - start
    assert [task.split_size(s) for s in ("train", "valid", "test")] == [22_500, 2_500, 25_000]
    docs = task.splits["train"][0]
    assert len(docs) == 50_000 and len(docs.data) == 65_483_508  # the README's count of review bytes
    assert list(cache.glob("imdb-bytes-*.npz"))
    labels = {s: task.splits[s][2] for s in ("train", "valid", "test")}
    assert labels["train"].sum() + labels["valid"].sum() == 12_500 and labels["test"].sum() == 12_500
    assert abs(labels["valid"].mean() - 0.5) < 0.05
    assert not set(task.splits["train"][1]) & set(task.splits["valid"][1])
    batch = task.train_batch(8, torch.Generator().manual_seed(0))
    assert batch["tokens"].shape == batch["key_padding_mask"].shape == (8, 256) and batch["targets"].shape == (8,)
    assert batch["tokens"].dtype == torch.long and batch["key_padding_mask"].dtype == torch.bool
    assert torch.equal(batch["key_padding_mask"], batch["tokens"] == 0)
    assert 1 <= batch["tokens"][~batch["key_padding_mask"]].min() and batch["tokens"].max() <= 256
    again = get_task("text")
    start = time.perf_counter()
    again.setup(256, 5, SHARED_DATA)  # another seed: the same fixed splits, now from the cache
    assert time.perf_counter() - start < first
    assert np.array_equal(again.splits["valid"][1], task.splits["valid"][1])
    assert torch.equal(again.train_batch(8, torch.Generator().manual_seed(0))["tokens"], batch["tokens"])


# --------------------------------------------------------------------------------------------- image
def _cifar_python(path: Path, per_batch: int = 12, test: int = 10) -> Path:
    """A cifar-10-python.tar.gz stand-in: six pickled batches of random images."""
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tf:
        for name in list(image.CIFAR_PY_MD5):
            n = test if name == "test_batch" else per_batch
            batch = {
                b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                b"labels": [int(v) for v in rng.integers(0, 10, n)],
                b"batch_label": name.encode(),
            }
            payload = pickle.dumps(batch, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    return path


def _md5s(path: Path):
    return {name.name: hashlib.md5(data).hexdigest() for name, data in data.iter_archive(path)}


def test_lra_grayscale_matches_tensorflows_rounding():
    rgb = np.array([[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255], [10, 200, 30]], np.uint8)
    expected = [
        int(np.float32(v) * np.float32(255.5))
        for v in (np.array(rgb, np.float32) / np.float32(255)) @ np.array([0.2989, 0.5870, 0.1140], np.float32)
    ]
    assert image.lra_grayscale(rgb).tolist() == expected == [0, 255, 76, 149, 29, 124]
    pixels = np.arange(16, dtype=np.uint8).reshape(1, 16)  # a 4x4 image
    assert image.pool_image(pixels, 2).tolist() == [[2, 4, 10, 12]]  # 2x2 block means, rounded half to even


def test_image_reads_cifar_python_with_checked_md5s_and_a_safe_unpickler(tmp_path, monkeypatch):
    archive = _cifar_python(tmp_path / "cifar-10-python.tar.gz")
    monkeypatch.setattr(image.Image, "COUNTS", {"train": 60, "test": 10})
    monkeypatch.setattr(image.Image, "VALID", 6)
    task = get_task("image")
    task.data_file = str(archive)
    with pytest.raises(DataError, match="data_batch_1 has md5 .* refusing to unpickle"):
        task.setup(1024, 0, tmp_path)
    monkeypatch.setattr(image, "CIFAR_PY_MD5", _md5s(archive))
    arrays = task.read(archive)
    assert arrays["train_x"].shape == (54, 1024) and arrays["valid_x"].shape == (6, 1024)
    assert arrays["test_x"].shape == (10, 1024) and arrays["train_x"].dtype == np.uint8
    with tarfile.open(archive) as tf:  # the last 6 training images (data_batch_5's tail) are the validation set
        last = pickle.loads(tf.extractfile("cifar-10-batches-py/data_batch_5").read())
    rgb = last[b"data"][-6:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    assert np.array_equal(arrays["valid_x"], image.lra_grayscale(rgb).reshape(6, 1024))
    assert arrays["valid_y"].tolist() == last[b"labels"][-6:]
    task.setup(256, 0, tmp_path)
    batch = task.train_batch(5, torch.Generator().manual_seed(0))
    assert batch["tokens"].shape == (5, 256) and "key_padding_mask" not in batch  # no padding: every pixel counts
    assert sorted(task.splits["valid"][1].tolist()) == sorted(arrays["valid_y"].tolist())
    # a pickle that would run code is refused even when its md5 is "right"
    evil = tmp_path / "evil.tar.gz"
    payload = pickle.dumps({b"data": os.system}, protocol=2)
    members = [(f"cifar-10-batches-py/{n}", "file", payload) for n in image.CIFAR_PY_MD5]
    _tar(evil, members)
    monkeypatch.setattr(image, "CIFAR_PY_MD5", {n: hashlib.md5(payload).hexdigest() for n in image.CIFAR_PY_MD5})
    with pytest.raises(DataError, match="refused global"):
        image.Image().read(evil)


def test_image_folder_without_pillow_names_the_extra(tmp_path, monkeypatch):
    folder = tmp_path / "cifar10" / "cifar10_jpeg"
    (folder / "train" / "cat").mkdir(parents=True)
    (folder / "train" / "cat" / "0000.jpg").write_bytes(b"\xff\xd8 not decoded")
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL now fails as if it were not installed
    monkeypatch.delenv("SPARSE_ATTN_CACHE")  # the default cache folders: <data-dir>/cache, then ~/.cache
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(DataError, match="needs Pillow: pip install pillow"):
        get_task("image").setup(1024, 0, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar10"]  # no cache folder made for nothing


@pytest.mark.skipif(not HAVE_PILLOW, reason="Pillow is not installed (pip install -r requirements-extra.txt)")
def test_image_folder_tree_with_pillow(tmp_path, monkeypatch):
    from PIL import Image as PILImage

    rng = np.random.default_rng(0)
    root = tmp_path / "tree"
    for split, per_class in (("train", 4), ("test", 1)):
        for label in image.CIFAR_CLASSES:
            (root / split / label).mkdir(parents=True)
            for i in range(per_class):
                PILImage.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                    root / split / label / f"{i:04d}.png"
                )
    monkeypatch.setattr(image.Image, "COUNTS", {"train": 40, "test": 10})
    monkeypatch.setattr(image.Image, "VALID", 10)
    arrays = image.Image().read(root)
    assert sorted(arrays["valid_y"].tolist()) == list(range(10))  # the last one per class
    assert arrays["train_x"].shape == (30, 1024) and sorted(arrays["test_y"].tolist()) == list(range(10))


# --------------------------------------------------------------------------------------------- pathfinder
def _dense(joints, step=0.1):
    pts = [
        a + np.linspace(0, 1, max(1, int(np.ceil(np.linalg.norm(b - a) / step))), endpoint=False)[:, None] * (b - a)
        for a, b in zip(joints[:-1], joints[1:])
    ]
    return np.concatenate(pts + [joints[-1:]])


def _connected(mask, start, goal):
    """8-connected flood fill on a boolean grid."""
    seen, todo = {start}, deque([start])
    while todo:
        y, x = todo.popleft()
        if (y, x) == goal:
            return True
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                n = (y + dy, x + dx)
                if n not in seen and 0 <= n[0] < mask.shape[0] and 0 <= n[1] < mask.shape[1] and mask[n]:
                    seen.add(n)
                    todo.append(n)
    return False


@pytest.mark.parametrize("side,count", [(32, 120), (16, 120)])
def test_pathfinder_images_keep_their_promises(side, count):
    params = pathfinder.PathfinderParams.for_side(side)
    images, labels, records = pathfinder.generate_pathfinder(count, params, np.random.default_rng(3), records=True)
    assert images.shape == (count, side, side) and images.dtype == np.uint8
    assert labels.sum() == count // 2  # exactly balanced
    scale = 8  # path mask: the centre lines of every snake, rasterised at 8 cells per pixel
    for picture, label, rec in zip(images, labels, records):
        snakes = [_dense(rec["joints"][0]), _dense(rec["joints"][1])] + [_dense(d) for d in rec["distractors"]]
        tips = rec["tips"]
        assert np.linalg.norm(tips[0] - tips[1]) > 2 * params.marker_radius  # markers never overlap
        assert (rec["owner"][0] == rec["owner"][1]) == bool(label)
        coarse = [pts[::3] for pts in snakes]  # every 0.3 px or less: a distance found ≥ 1.5 is truly ≥ 1.2
        for a in range(len(coarse)):  # distinct snakes never touch (1 px wide strokes touch at 1 px)
            for b in range(a + 1, len(coarse)):
                assert np.linalg.norm(coarse[a][:, None] - coarse[b][None], axis=-1).min() >= 1.5
        mask = np.zeros((side * scale, side * scale), bool)
        for pts in snakes:
            cells = np.floor(pts * scale).astype(int)
            mask[cells[:, 0], cells[:, 1]] = True
        ends = []
        for t, owner in zip(tips, rec["owner"]):  # each marker sits on (the tip of) a target snake
            distance = np.linalg.norm(snakes[owner] - t, axis=1)
            assert distance.min() <= 0.05 + 1e-9  # half the sampling step of the dense centre line
            ends.append(tuple(np.floor(snakes[owner][distance.argmin()] * scale).astype(int)))
        assert _connected(mask, *ends) == bool(label)  # one snake joins them iff the label is 1
        for t in tips:  # both markers are drawn
            assert picture[int(t[0]), int(t[1])] >= 128
        assert (np.concatenate(snakes) >= params.padding - 1e-9).all()
        assert (np.concatenate(snakes) <= side - params.padding + 1e-9).all()


def test_pathfinder_is_determined_by_the_seed():
    params = pathfinder.PathfinderParams.for_side(16)
    a = pathfinder.generate_pathfinder(50, params, np.random.default_rng(1))
    b = pathfinder.generate_pathfinder(50, params, np.random.default_rng(1))
    c = pathfinder.generate_pathfinder(50, params, np.random.default_rng(2))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


PATHFINDER_SIZES = {"train": 600, "valid": 200, "test": 200}  # small stand-ins for the CPU preset's sizes


def test_pathfinder_task_generates_caches_and_batches(cache):
    assert pathfinder.Pathfinder.default_sizes(16) == {"train": 12_000, "valid": 2_000, "test": 2_000}
    assert pathfinder.Pathfinder.default_sizes(32) == {"train": 160_000, "valid": 20_000, "test": 20_000}
    task = get_task("pathfinder")  # the CPU preset's images: 16x16
    task.sizes = PATHFINDER_SIZES
    start = time.perf_counter()
    task.setup(256, 0, cache)
    first = time.perf_counter() - start
    assert [task.split_size(s) for s in ("train", "valid", "test")] == [600, 200, 200]
    for split in ("train", "valid", "test"):
        assert task.splits[split][1].sum() == task.split_size(split) // 2
    batch = next(task.eval_batches("test", 64, 1))
    assert batch["tokens"].shape == (64, 256) and batch["tokens"].max() <= 255 and "key_padding_mask" not in batch
    assert batch["targets"].shape == (64,) and 0.25 < batch["targets"].float().mean() < 0.75
    again = get_task("pathfinder")
    again.sizes = PATHFINDER_SIZES
    start = time.perf_counter()
    again.setup(256, 0, cache)
    assert time.perf_counter() - start < min(1.0, first)
    assert np.array_equal(again.splits["test"][0], task.splits["test"][0])
    assert not np.array_equal(again.splits["train"][0][:100], task.splits["test"][0][:100])


def test_a_cache_of_other_keys_or_cut_short_is_rebuilt_not_trained_on(tmp_path, monkeypatch, capsys):
    """Before: a cache holding other arrays was a KeyError traceback (text, pathfinder), and one cut to a fraction
    of its images trained on what was left, silently."""
    monkeypatch.setenv("SPARSE_ATTN_CACHE", str(tmp_path / "cache"))
    sizes = {"train": 40, "valid": 10, "test": 10}
    task = get_task("pathfinder")
    task.sizes = sizes
    task.setup(256, 0, tmp_path)
    (path,) = (tmp_path / "cache").glob("pathfinder-*.npz")
    good = dict(np.load(path))
    for damage in (
        {"other": np.zeros(3)},
        {k: v[: len(v) // 10] for k, v in good.items()},
        {**good, "train_x": good["train_x"].reshape(40, -1)},
    ):
        np.savez(path, **damage)
        again = get_task("pathfinder")
        again.sizes = sizes
        again.setup(256, 0, tmp_path)
        assert [again.split_size(s) for s in sizes] == [40, 10, 10]
        assert np.array_equal(again.splits["test"][0], task.splits["test"][0])
        assert f"the cache {path} " in capsys.readouterr().out and np.load(path)["train_x"].shape == (40, 16, 16)
    monkeypatch.setattr(lra.Text, "PER_FOLDER", 10)
    text = get_task("text")
    text.data_file = str(_imdb_tree(tmp_path / "imdb", 10))
    text.setup(12, 0, tmp_path)
    (path,) = (tmp_path / "cache").glob("imdb-bytes-*.npz")
    np.savez(path, bytes=np.zeros(5, np.uint8))
    text.setup(12, 0, tmp_path)
    assert [text.split_size(s) for s in ("train", "valid", "test")] == [18, 2, 20]
    assert "lacks the arrays" in capsys.readouterr().out


def test_with_no_writable_cache_folder_the_data_are_used_and_not_kept(tmp_path, monkeypatch, capsys):
    """Before: a read-only data folder and no writable cache folder failed only after the whole archive was
    decoded. The cache folder is probed first; without one the decoded data are used, and the run says so."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPARSE_ATTN_CACHE", str(blocker / "cache"))  # under a file: nothing can be made there
    monkeypatch.setattr(lra.Text, "PER_FOLDER", 10)
    folder = _imdb_tree(tmp_path / "imdb", 10)
    before = sorted(tmp_path.rglob("*"))
    task = get_task("text")
    task.data_file = str(folder)
    task.setup(12, 0, tmp_path)
    assert [task.split_size(s) for s in ("train", "valid", "test")] == [18, 2, 20]
    assert "no writable cache folder" in capsys.readouterr().out and sorted(tmp_path.rglob("*")) == before


# --------------------------------------------------------------------------------------------- retrieval
def _aan(folder: Path, rows=12):
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(lra.Retrieval.FILES.values()):
        lines = [
            f"{float(j % 2)}\tid{j}a\tid{j}b\tfirst text {j} of {name} " + "x" * j + f"\tsecond {j}"
            for j in range(rows + i)
        ]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


def test_retrieval_reads_lras_tsvs_as_pairs(tmp_path):
    _aan(tmp_path / "lra_release" / "tsv_data")
    task = get_task("retrieval")
    task.setup(16, 0, tmp_path)
    assert [task.split_size(s) for s in ("train", "valid", "test")] == [12, 13, 14]
    batch = next(task.eval_batches("train", 12, None))
    assert batch["tokens"].shape == batch["tokens2"].shape == (12, 16) and batch["targets"].tolist() == [0, 1] * 6
    assert bytes((batch["tokens"][1] - 1).tolist()) == b"first text 1 of "
    assert bytes((batch["tokens2"][1][~batch["key_padding_mask2"][1]] - 1).tolist()) == b"second 1"
    assert torch.equal(batch["key_padding_mask2"], batch["tokens2"] == 0)
    (tmp_path / "lra_release" / "tsv_data" / "new_aan_pairs.eval.tsv").write_text("1\tonly\tthree\n")
    with pytest.raises(DataError, match="new_aan_pairs.eval.tsv line 1: 3 tab-separated fields"):
        lra.Retrieval().read(tmp_path / "lra_release" / "tsv_data")


def _lra_release(tmp_path, last_member):
    """data/lra_release.gz: the AAN TSVs of ``_aan``, then one more member."""
    source = _aan(tmp_path / "src" / "lra_release" / "tsv_data")
    (tmp_path / "data").mkdir()
    with tarfile.open(tmp_path / "data" / "lra_release.gz", "w:gz") as tf:
        tf.add(source.parent, arcname="lra_release")
        info = tarfile.TarInfo(last_member)
        info.size = 4
        tf.addfile(info, io.BytesIO(b"x\ty\n"))


def test_retrieval_extracts_its_tsvs_from_the_lra_release_archive(tmp_path):
    _lra_release(tmp_path, last_member="lra_release/listops-1000/basic_test.tsv")
    task = get_task("retrieval")
    task.setup(32, 0, tmp_path / "data")
    assert task.split_size("test") == 14
    assert sorted(p.name for p in (tmp_path / "data" / "lra_release" / "tsv_data").iterdir()) == sorted(
        lra.Retrieval.FILES.values()
    )


# --------------------------------------------------------------------------------------------- training runs
@pytest.mark.skipif(not IMDB.exists(), reason=f"the IMDB copy {IMDB} is absent")
def test_text_training_run(tmp_path):
    rec = train(
        "--task", "text", "--seq-len", "64", *TINY, "--data-dir", str(SHARED_DATA), "--out", str(tmp_path / "run")
    )
    assert rec["task"] == "text" and 0 <= rec["test"] <= 1 and rec["scored"]["test"] == 8


def test_image_training_run_on_cifar_python(tmp_path, monkeypatch):
    archive = _cifar_python(tmp_path / "cifar-10-python.tar.gz")
    monkeypatch.setattr(image, "CIFAR_PY_MD5", _md5s(archive))
    monkeypatch.setattr(image.Image, "COUNTS", {"train": 60, "test": 10})
    monkeypatch.setattr(image.Image, "VALID", 6)
    rec = train(
        "--task", "image", "--seq-len", "64", *TINY, "--data-file", str(archive), "--out", str(tmp_path / "run")
    )
    assert rec["task"] == "image" and rec["config"]["seq_len"] == 64


@pytest.mark.skipif(
    not (HAVE_PILLOW and CIFAR_JPEG.exists()),
    reason="needs Pillow (requirements-extra.txt) and the local CIFAR-10 JPEG copy",
)
def test_image_training_run_on_the_local_jpeg_copy(tmp_path, monkeypatch):
    # Decoding all 60,000 JPEGs takes 10-25 s on 2 cores; the run reads the archive but decodes only the
    # first 50 images per class and split (the cache lives in this test session's folder only).
    wanted = image.Image._wanted
    first_50 = staticmethod(lambda rel: wanted(rel) and int(rel.stem) < 50)
    monkeypatch.setattr(image.Image, "_wanted", first_50)
    monkeypatch.setattr(image.Image, "COUNTS", {"train": 500, "test": 500})
    monkeypatch.setattr(image.Image, "VALID", 50)
    rec = train(
        "--task", "image", "--seq-len", "256", *TINY, "--data-dir", str(SHARED_DATA), "--out", str(tmp_path / "run")
    )
    assert rec["task"] == "image" and rec["config"]["seq_len"] == 256


def test_pathfinder_training_run(tmp_path, cache, monkeypatch):
    small = staticmethod(lambda side: PATHFINDER_SIZES)
    monkeypatch.setattr(pathfinder.Pathfinder, "default_sizes", small)
    rec = train(
        "--task", "pathfinder", "--seq-len", "256", *TINY, "--data-dir", str(cache), "--out", str(tmp_path / "run")
    )
    assert rec["task"] == "pathfinder" and rec["scored"]["valid"] == 8


def test_retrieval_training_run(tmp_path):
    _aan(tmp_path / "aan")
    rec = train(
        "--task",
        "retrieval",
        "--seq-len",
        "32",
        *TINY,
        "--data-file",
        str(tmp_path / "aan"),
        "--out",
        str(tmp_path / "run"),
    )
    assert rec["task"] == "retrieval" and rec["density"] == 1.0
