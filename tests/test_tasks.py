"""bench/tasks (synthetic.py, language.py): generators follow their rules, determinism from the seed, LM windows score every byte once,
clear errors for missing or corrupt data."""

import hashlib
import io
import json
import random
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.tasks import data_files, language, synthetic
from bench.tasks import IGNORE, DataError, base_rate, get_task
from bench.train import main as train_main

from conftest import DATA as SHARED_DATA


def test_duplicates_labels_mark_values_that_occur_twice():
    task = get_task("duplicates")
    task.setup(16, 0, Path("unused"))
    batch = task.train_batch(64, torch.Generator().manual_seed(1))
    tokens, targets = batch["tokens"], batch["targets"]
    assert tokens.shape == targets.shape == (64, 16)
    assert tokens.min() >= 1 and tokens.max() <= 16
    for row, labels in zip(tokens.tolist(), targets.tolist()):
        assert labels == [int(row.count(v) > 1) for v in row]


def test_duplicates_is_deterministic_from_the_seed_and_the_paper_example():
    a, b, c = get_task("duplicates"), get_task("duplicates"), get_task("duplicates")
    a.setup(32, 3, Path("x")), b.setup(32, 3, Path("x")), c.setup(32, 4, Path("x"))
    assert torch.equal(a.splits["test"]["tokens"], b.splits["test"]["tokens"])
    assert not torch.equal(a.splits["test"]["tokens"], c.splits["test"]["tokens"])
    assert not torch.equal(a.splits["valid"]["tokens"], a.splits["test"]["tokens"])
    # SBM paper §5.1: input 1 4 3 7 3 2 3 1 → target 1 0 1 0 1 0 1 1
    a.seq_len = 8
    tokens = torch.tensor([[1, 4, 3, 7, 3, 2, 3, 1]])
    counts = torch.zeros(1, 9, dtype=torch.long).scatter_add_(1, tokens, torch.ones_like(tokens))
    assert (counts.gather(1, tokens) > 1).long().tolist() == [[1, 0, 1, 0, 1, 0, 1, 1]]


def test_listops_evaluation_rules():
    tree = ("[MAX", [2, 9, ("[MIN", [4, 7]), 0])
    assert synthetic.listops_value(tree) == 9
    assert synthetic.listops_tokens(tree) == ["[MAX", "2", "9", "[MIN", "4", "7", "]", "0", "]"]
    assert synthetic.listops_value(("[SM", [7, 8, 9])) == 4  # sum mod 10
    assert synthetic.listops_value(("[MED", [1, 5, 2])) == 2
    assert synthetic.listops_value(("[MED", [1, 4, 2, 9])) == 3  # int((2 + 4) / 2)
    assert synthetic.listops_value(("[MED", [1, 2])) == 1  # int(1.5)


def test_listops_generator_respects_depth_and_arity():
    rng = random.Random(0)

    def depth_and_arity(tree):
        if isinstance(tree, int):
            return 0, 0
        children = [depth_and_arity(c) for c in tree[1]]
        return 1 + max(d for d, _ in children), max([len(tree[1])] + [a for _, a in children])

    for _ in range(2000):
        depth, arity = depth_and_arity(synthetic.listops_tree(rng, 1, 4, 6))
        assert depth <= 3 and arity <= 6  # operators only at depths 1..max_depth-1


@pytest.fixture(scope="module")
def listops():
    task = get_task("listops")
    task.sizes = {"train": 300, "valid": 100, "test": 100}
    task.setup(100, 0, Path("unused"))
    return task


def test_listops_splits_are_distinct_bounded_and_padded(listops):
    _, _, min_len, max_len = listops.generator_params(100)
    seen = set()
    for split in ("train", "valid", "test"):
        data = listops.splits[split]
        lengths = (~data["key_padding_mask"]).sum(1)
        assert ((lengths > min_len) & (lengths < max_len)).all()
        assert torch.equal(data["key_padding_mask"], data["tokens"] == 0)
        assert data["targets"].min() >= 0 and data["targets"].max() <= 9
        rows = {tuple(r) for r in data["tokens"].tolist()}
        assert not rows & seen  # deduplicated across splits, as LRA
        seen |= rows


def test_listops_labels_are_the_values_of_the_token_sequences(listops):
    vocab = synthetic.LISTOPS_VOCAB
    data = listops.splits["valid"]
    for ids, label in zip(data["tokens"].tolist(), data["targets"].tolist()):
        stack = [[]]
        for tok in (vocab[i] for i in ids if i != 0):
            if tok.startswith("["):
                stack.append([tok])
            elif tok == "]":
                op, *args = stack.pop()
                stack[-1].append(synthetic.listops_value((op, args)))
            else:
                stack[-1].append(int(tok))
        assert stack == [[label]]


def test_byte_lm_sliding_windows_score_every_byte_exactly_once(tmp_path):
    text = bytes(range(256)) * 20  # 5120 bytes
    path = tmp_path / "text.txt"
    path.write_bytes(text)
    task = get_task("bytes")
    task.data_file = path
    task.setup(64, 0, tmp_path, eval_context=48)
    split = task.data["valid"]
    scored = []
    for batch in task.eval_batches("valid", 3, None):
        tokens, targets = batch["tokens"], batch["targets"]
        assert torch.equal(tokens[:, 1:][targets[:, :-1] != IGNORE], targets[:, :-1][targets[:, :-1] != IGNORE])
        scored += targets[targets != IGNORE].tolist()
    # every target byte after the first window's start is scored once, in order, up to the last full window
    assert scored == list(split[1 : 1 + len(scored)])
    assert len(split) - 1 - len(scored) < 64 - 48


def test_byte_lm_train_batches_are_next_byte_pairs(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    task = get_task("bytes")
    task.data_file = path
    task.setup(32, 0, tmp_path)
    batch = task.train_batch(4, torch.Generator().manual_seed(0))
    assert batch["tokens"].shape == batch["targets"].shape == (4, 32)
    assert torch.equal(batch["tokens"][:, 1:], batch["targets"][:, :-1])
    assert batch["tokens"].dtype == torch.long


@pytest.mark.skipif(
    not (SHARED_DATA / "wikitext-2" / "valid.txt").exists(),
    reason="no WikiText-2 copy in $SPARSE_ATTN_DATA (valid.txt and test.txt)",
)
def test_bytes_reads_the_local_wikitext2_copy():
    task = get_task("bytes")
    task.setup(128, 0, SHARED_DATA, eval_context=64)
    assert len(task.data["test"]) == 1_256_449
    assert len(task.data["train"]) + len(task.data["valid"]) == 1_121_681


def wikitext_release(path, splits=("train", "valid", "test")) -> bytes:
    """A small fake of the WikiText-2 release archive: wikitext-2/wiki.{split}.tokens, ` = Heading = ` lines."""
    with zipfile.ZipFile(path, "w") as zf:
        for index, split in enumerate(splits):
            zf.writestr(
                f"wikitext-2/wiki.{split}.tokens", f" = {split.title()} = \n words of {split} \n".encode() * 300
            )
    return path.read_bytes()


@pytest.mark.parametrize("where", ["folder/wikitext-2-v1.zip", "wikitext-2-v1.zip", "tokens"])
def test_bytes_reads_the_wikitext2_release_layout(tmp_path, where):
    """The release names its files wiki.{train,valid,test}.tokens inside wikitext-2-v1.zip: read from the archive
    (in the data folder or its wikitext-2/ folder) or from the extracted files, whole splits, no download."""
    folder = tmp_path / "wikitext-2"
    folder.mkdir()
    archive = wikitext_release(tmp_path / "release.zip")
    if where == "tokens":
        with zipfile.ZipFile(tmp_path / "release.zip") as zf:
            for split in ("train", "valid", "test"):
                (folder / f"wiki.{split}.tokens").write_bytes(zf.read(f"wikitext-2/wiki.{split}.tokens"))
    else:
        (tmp_path / where.replace("folder", "wikitext-2")).write_bytes(archive)
    task = get_task("bytes")
    task.download_allowed = False
    task.setup(32, 0, tmp_path, eval_context=8)
    assert bytes(task.data["valid"][:19]) == b" = Valid = \n words " and len(task.data["train"]) == 300 * 29


def test_bytes_downloads_the_wikitext2_release_from_its_mirror_md5_checked(tmp_path, monkeypatch):
    archive = wikitext_release(tmp_path / "served.zip")
    monkeypatch.delenv("SPARSE_ATTN_OFFLINE", raising=False)
    asked = []

    def serve(request, timeout):
        asked.append((request.full_url, request.get_header("User-agent")))
        return io.BytesIO(archive)

    monkeypatch.setattr(data_files.urllib.request, "urlopen", serve)
    task = get_task("bytes")
    with pytest.raises(DataError, match=f"expected {language.LocalBytes.WIKITEXT_MD5}; it was deleted"):
        task.setup(32, 0, tmp_path / "data")
    assert not (tmp_path / "data").exists()  # nothing kept of a download that failed its check
    monkeypatch.setattr(language.LocalBytes, "WIKITEXT_MD5", hashlib.md5(archive).hexdigest())
    task = get_task("bytes")
    task.setup(32, 0, tmp_path / "data")
    assert (tmp_path / "data" / "wikitext-2" / "wikitext-2-v1.zip").read_bytes() == archive
    assert asked[-1][0] == language.LocalBytes.WIKITEXT_URL and asked[-1][1].startswith("Mozilla/5.0")
    assert bytes(task.data["test"][:18]) == b" = Test = \n words "


def test_missing_data_messages_say_where_and_how(tmp_path):
    bytes_task = get_task("bytes")
    bytes_task.download_allowed = False
    with pytest.raises(DataError, match=str(tmp_path / "wikitext-2")):
        bytes_task.setup(64, 0, tmp_path)
    enwik8 = get_task("enwik8")
    enwik8.download_allowed = False
    with pytest.raises(DataError) as info:
        enwik8.setup(64, 0, tmp_path)
    message = str(info.value)
    assert str(tmp_path / "enwik8" / "enwik8") in message
    assert language.Enwik8.URL in message and language.Enwik8.SHA256 in message


def test_corrupt_enwik8_is_refused_with_its_checksum(tmp_path):
    (tmp_path / "enwik8").mkdir()
    (tmp_path / "enwik8" / "enwik8").write_bytes(b"<mediawiki>" * 100)
    with pytest.raises(DataError, match="expected " + language.Enwik8.SHA256):
        get_task("enwik8").setup(64, 0, tmp_path)


def test_an_enwik8_download_with_the_wrong_checksum_is_deleted_with_its_folder(tmp_path, monkeypatch):
    """A stand-in archive (the real one is 36 MB): before, the file was renamed into place, then refused."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("enwik8", b"<mediawiki>" * 10)
    monkeypatch.delenv("SPARSE_ATTN_OFFLINE", raising=False)
    monkeypatch.setattr(language.Enwik8, "SIZE", 110)
    monkeypatch.setattr(data_files.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(archive.getvalue()))
    with pytest.raises(DataError, match=f"has sha256 .*, expected {language.Enwik8.SHA256}; it was deleted"):
        get_task("enwik8").setup(64, 0, tmp_path / "data")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(language.Enwik8, "SIZE", 100)  # a member of another size is refused before it is read
    with pytest.raises(DataError, match="expected one member 'enwik8' of 100 bytes"):
        get_task("enwik8").setup(64, 0, tmp_path / "data")
    assert list(tmp_path.iterdir()) == []


def test_an_enwik8_download_that_passes_its_checks_is_kept_as_the_zip_and_read(tmp_path, monkeypatch):
    """The one downloader (bench.tasks.data_files.fetch) with enwik8's check of the member: a stand-in archive of the right
    size and sha256 lands at DATA/enwik8/enwik8.zip, and the split is read from it."""
    payload = FAKE_ENWIK8.tobytes()
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("enwik8", payload)
    monkeypatch.delenv("SPARSE_ATTN_OFFLINE", raising=False)
    monkeypatch.setattr(language.Enwik8, "SIZE", len(payload))
    monkeypatch.setattr(language.Enwik8, "SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(data_files.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(archive.getvalue()))
    task = get_task("enwik8")
    task.setup(64, 0, tmp_path / "data")
    assert sorted(p.name for p in (tmp_path / "data" / "enwik8").iterdir()) == ["enwik8.zip"]
    assert np.array_equal(task.data["test"], FAKE_ENWIK8[19_000:])


def test_enwik8_split_is_90_5_5_of_the_real_length():
    assert language.enwik8_split(100_000_000) == (90_000_000, 95_000_000)


FAKE_ENWIK8 = np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8)  # stands in for the 10⁸ bytes


@pytest.fixture
def fake_enwik8(tmp_path, monkeypatch):
    """A small stand-in for enwik8, unzipped and zipped (one member, as the real archive), with its sha256
    injected as the expected one."""
    plain = tmp_path / "copy" / "enwik8"
    plain.parent.mkdir()
    FAKE_ENWIK8.tofile(plain)
    archive = tmp_path / "copy" / "enwik8.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.write(plain, "enwik8")
    monkeypatch.setattr(language.Enwik8, "SHA256", hashlib.sha256(FAKE_ENWIK8.tobytes()).hexdigest())
    return plain, archive


def enwik8_from(data_dir, data_file=None):
    task = get_task("enwik8")
    task.download_allowed = False
    task.data_file = data_file
    task.setup(64, 0, data_dir)
    return task


@pytest.mark.parametrize("given", ["zip", "file"])
def test_enwik8_data_file_zip_or_unzipped_gives_the_scaled_split(fake_enwik8, tmp_path, given):
    plain, archive = fake_enwik8
    task = enwik8_from(tmp_path / "empty", archive if given == "zip" else plain)
    assert [len(task.data[s]) for s in ("train", "valid", "test")] == [18_000, 1_000, 1_000]  # 90/5/5
    assert np.array_equal(np.concatenate([task.data[s] for s in ("train", "valid", "test")]), FAKE_ENWIK8)


@pytest.mark.parametrize("where", ["enwik8/enwik8.zip", "enwik8.zip", "enwik8/enwik8"])
def test_enwik8_is_found_in_the_data_folder(fake_enwik8, tmp_path, where):
    plain, archive = fake_enwik8
    target = tmp_path / "data" / where
    target.parent.mkdir(parents=True)
    shutil.copy(plain if where.endswith("enwik8/enwik8") else archive, target)
    assert np.array_equal(enwik8_from(tmp_path / "data").data["test"], FAKE_ENWIK8[19_000:])


@pytest.mark.parametrize("given", ["zip", "file"])
def test_enwik8_wrong_checksum_names_the_expected_hash(fake_enwik8, tmp_path, monkeypatch, given):
    plain, archive = fake_enwik8
    monkeypatch.setattr(language.Enwik8, "SHA256", "0" * 64)
    with pytest.raises(DataError, match="expected " + "0" * 64) as info:
        enwik8_from(tmp_path, archive if given == "zip" else plain)
    assert hashlib.sha256(FAKE_ENWIK8.tobytes()).hexdigest() in str(info.value)


def test_enwik8_bad_archives_and_missing_data_file(fake_enwik8, tmp_path):
    plain, _ = fake_enwik8
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as zf:
        zf.write(plain, "enwik9")
    with pytest.raises(DataError, match="without a file 'enwik8'"):
        enwik8_from(tmp_path, other)
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataError, match="not a zip archive"):
        enwik8_from(tmp_path, broken)
    truncated = tmp_path / "truncated.zip"
    truncated.write_bytes(fake_enwik8[1].read_bytes()[:-200])  # the central directory cut off
    with pytest.raises(DataError, match="not a zip archive"):
        enwik8_from(tmp_path, truncated)
    damaged = bytearray(fake_enwik8[1].read_bytes())
    damaged[5_000] ^= 0xFF  # inside the compressed member
    (tmp_path / "damaged.zip").write_bytes(damaged)
    with pytest.raises(DataError, match="cannot read .* as a zip"):
        enwik8_from(tmp_path, tmp_path / "damaged.zip")
    with pytest.raises(DataError, match="given by --data-file"):
        enwik8_from(tmp_path, tmp_path / "absent.zip")


@pytest.mark.parametrize("given", ["zip", "file"])
def test_enwik8_trains_from_a_data_file(fake_enwik8, tmp_path, given):
    """A few training steps through the command line's code path, with --data-file the zip or the file."""
    plain, archive = fake_enwik8
    out = tmp_path / "run"
    code = train_main(
        [
            "--task",
            "enwik8",
            "--data-file",
            str(archive if given == "zip" else plain),
            "--no-download",
            "--seq-len",
            "32",
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
            "--steps",
            "3",
            "--eval-every",
            "3",
            "--eval-batches",
            "2",
            "--final-eval-batches",
            "2",
            "--warmup",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    record = json.loads((out / "metrics.json").read_text())
    assert record["task"] == "enwik8" and record["steps"] == 3 and record["metric"] == "bpb"
    assert 0 < record["test"] < 16


def test_unknown_task_and_bad_context():
    with pytest.raises(ValueError, match="unknown task"):
        get_task("imagenet")
    task = get_task("bytes")
    with pytest.raises(ValueError, match="eval_context"):
        task.setup(64, 0, SHARED_DATA, eval_context=64)


@pytest.mark.parametrize("seq_len", [2, 8, 64, 129])
def test_recall_asks_each_key_again_after_its_pair_and_scores_only_the_questions(seq_len):
    """Every scored position holds a key; exactly one earlier token is a (key, value) pair of that key, and the
    target is its value; nothing else is scored; no key occurs elsewhere; pairs and questions scattered."""
    task = get_task("recall")
    task.setup(seq_len, seed=0, data_dir=Path("."))
    batch = task.train_batch(32, torch.Generator().manual_seed(1))
    tokens, targets = batch["tokens"], batch["targets"]
    first_pair = task.KEYS + 1
    starts = []
    for row, target in zip(tokens.tolist(), targets.tolist()):
        asked = [i for i, t in enumerate(target) if t != IGNORE]
        assert len(asked) == task.pairs()
        for i in asked:
            key = row[i]
            pairs = [
                j
                for j, t in enumerate(row)
                if first_pair <= t < first_pair + task.KEYS * task.VALUES and (t - first_pair) // task.VALUES == key - 1
            ]
            assert 1 <= key <= task.KEYS and row.count(key) == 1 and len(pairs) == 1 and pairs[0] < i
            assert target[i] == (row[pairs[0]] - first_pair) % task.VALUES
        starts.append(min(asked))
    assert all(t < task.vocab_size for row in tokens.tolist() for t in row)
    assert len(set(starts)) > 1 or seq_len == 2  # the questions are not all at one place
    again = task.train_batch(32, torch.Generator().manual_seed(1))
    assert torch.equal(again["tokens"], tokens) and torch.equal(again["targets"], targets)


def test_recall_s_chance_is_one_in_the_number_of_values():
    task = get_task("recall")
    task.setup(64, seed=0, data_dir=Path("."))
    targets = task.splits["test"]["targets"]
    counts = torch.bincount(targets[targets != IGNORE], minlength=task.VALUES).float()
    assert task.num_classes == task.VALUES
    assert base_rate(counts, "accuracy") < 1.5 / task.VALUES


@pytest.mark.parametrize("name, per_pair", [("recall-few", 16), ("recall", 8), ("recall-many", 4)])
def test_recall_s_difficulty_axis_is_the_number_of_pairs(name, per_pair):
    task = get_task(name)
    task.setup(128, seed=0, data_dir=Path("."))
    targets = task.train_batch(4, torch.Generator().manual_seed(0))["targets"]
    assert task.name == name and ((targets != IGNORE).sum(1) == 128 // per_pair).all()


def test_a_chain_s_answer_is_two_reads_by_content_away_from_its_question():
    """Walked by hand: the question's first key finds one link (first, second), the second key one pair
    (second, value), and the target is that value; every token id is in the vocabulary."""
    task = get_task("chain")
    task.setup(128, seed=0, data_dir=Path("."))
    batch = task.train_batch(16, torch.Generator().manual_seed(3))
    keys, values = task.KEYS, task.VALUES
    links, pairs = 1 + 2 * keys, 1 + 2 * keys + keys * keys
    for row, target in zip(batch["tokens"].tolist(), batch["targets"].tolist()):
        asked = [i for i, t in enumerate(target) if t != IGNORE]
        assert len(asked) == 128 // 16
        for i in asked:
            first = row[i] - 1
            assert 0 <= first < keys and row.count(row[i]) == 1
            found = [j for j, t in enumerate(row) if links <= t < pairs and (t - links) // keys == first]
            assert len(found) == 1 and found[0] < i
            second = (row[found[0]] - links) % keys
            hop = [
                j for j, t in enumerate(row) if pairs <= t < pairs + keys * values and (t - pairs) // values == second
            ]
            assert len(hop) == 1 and hop[0] < i
            assert target[i] == (row[hop[0]] - pairs) % values
    assert batch["tokens"].max() < task.vocab_size


def test_ngram_s_target_is_its_table_of_the_tokens_three_apart_and_a_short_window_s_limit_is_exact():
    """The target at i is TABLE[x_{i−3}, x_i]; window_limit, the best accuracy from x_i alone, equals the accuracy
    of the rule that predicts each x_i's most frequent class, measured on 200,000 positions (5σ of a binomial)."""
    task = get_task("ngram")
    task.setup(128, seed=0, data_dir=Path("."))
    batch = task.train_batch(1600, torch.Generator().manual_seed(5))
    x, targets = batch["tokens"] - 1, batch["targets"]
    assert (targets[:, :3] == IGNORE).all() and torch.equal(targets[:, 3:], task.table[x[:, :-3], x[:, 3:]])
    guess = torch.mode(task.table, dim=0).values  # (V,): per x_i, the class most x_{i−3} give (a tie: any of them)
    hits = (guess[x[:, 3:]] == targets[:, 3:]).double()
    limit = task.window_limit(task.seq_len, task.OFFSET - 1)
    sigma = (limit * (1 - limit) / hits.numel()) ** 0.5
    assert abs(hits.mean().item() - limit) < 5 * sigma, (hits.mean().item(), limit)
    assert 1 / task.CLASSES < limit < 0.5
