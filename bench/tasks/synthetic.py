"""The synthetic tasks, generated from the seed (no files).

- ``duplicates`` — SBM paper §5.1: N integers uniform in {1..N}; a token's label is 1 when its value occurs
  elsewhere in the sequence. New training sequences every step (the paper samples a batch per epoch);
  validation and test sets generated from the seed.
- ``recall`` — scattered-key associative recall: (key, value) pairs, one token each, anywhere in the sequence,
  each key asked again later; the target at the question is its value. Generated like ``duplicates``.
  ``recall-few`` and ``recall-many``: the same at N/16 and N/4 pairs rather than N/8, the difficulty axis of MQAR.
- ``chain`` — two-hop recall: a question's key names a link (key → second key), whose second key names a pair
  (second key → value); the target is the value, so both layers must address by content.
- ``ngram`` — the positional control: tokens uniform, the target at i a fixed random table of the tokens at i − 3
  and i. A window reaching offset 3 can be exact; one that does not has a known Bayes limit (``window_limit``).
- ``listops`` — LRA ListOps (Tay et al. 2021; Nangia & Bowman 2018) with LRA's generator rules (values 0-9,
  MAX/MIN/MED/SM, operator with probability 0.25 below the maximum depth, 2..max_args arguments, accepted
  when min_len < length < max_len, deduplicated). Tokens as in the PyTorch ports: the brackets' "(" ")"
  dropped, "]" a token of its own. Ten classes.
"""

import dataclasses
import hashlib
import random
from typing import Dict, List

import numpy as np
import torch
from torch import Tensor

from bench.config import Preset
from bench.tasks.base import IGNORE, ExampleSetTask
from bench.tasks.data_files import array_problem, cached


class Duplicates(ExampleSetTask):
    """SBM paper §5.1 (Fig. 4). Tokens 1..N (0 is unused), per-token binary labels."""

    EVAL_EXAMPLES = 1024

    def __init__(self):
        # The paper (§5.1, Table 7): one layer, one head, 32 dims, FFN 32, a fresh batch of 256 sequences for
        # each of 2000 steps, lr 1e-3. That is affordable on 2 CPU cores (about 4 minutes), so both presets
        # use it; with 8× fewer sequences (batch 32) full attention stalled near 82% token accuracy.
        paper = Preset(  # the rest Preset's defaults: head dim 32, lr 1e-3, 100 warm-up steps, 32 final batches
            seq_len=256,
            dim=32,
            depth=1,
            heads=1,
            mlp_dim=32,
            dropout=0.0,
            steps=2000,
            batch_size=256,
            weight_decay=0.0,
            eval_every=250,
            eval_batches=4,
        )
        super().__init__(
            "duplicates",
            "token",
            vocab_size=257,
            num_classes=2,
            metric="accuracy",
            presets={"cpu": paper, "paper": paper},
        )

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        self.seq_len, self.vocab_size = seq_len, seq_len + 1
        self.splits = {
            split: self.generate(self.EVAL_EXAMPLES, torch.Generator().manual_seed(seed * 1000 + 7 + i))
            for i, split in enumerate(("valid", "test"))
        }

    def generate(self, count: int, generator: torch.Generator) -> Dict[str, Tensor]:
        tokens = torch.randint(1, self.seq_len + 1, (count, self.seq_len), generator=generator)  # (B, N)
        counts = torch.zeros(count, self.seq_len + 1, dtype=torch.long).scatter_add_(1, tokens, torch.ones_like(tokens))
        targets = (counts.gather(1, tokens) > 1).long()  # (B, N): 1 where the value occurs twice or more
        return {"tokens": tokens, "targets": targets}

    def train_batch(self, batch_size, generator):
        return self.generate(batch_size, generator)

    def window_limit(self, n: int, w: int) -> float:
        """The Bayes limit of a window of w keys each side at length n: a duplicate seen is certain; unseen, the
        likelier label given the rest of the sequence unseen (values uniform over n)."""
        q, seen = 1 - 1 / n, (min(i, w) + min(n - 1 - i, w) for i in range(n))  # q: another token's value differs
        return sum(1 - q**s * min(q ** (n - 1 - s), 1 - q ** (n - 1 - s)) for s in seen) / n


class Recall(ExampleSetTask):
    """K (key, value) pairs at random places among filler tokens, each key asked again at a random place after
    its pair; the target there is the value (K = N / 8). A pair is one token, (key, value), so that one hop of
    content addressing answers a question, as in duplicates, but across token types and with a 16-way readout;
    as two tokens (key, then value) a 2-layer model must first learn a previous-token head, and full attention sat
    at ~31% for 3,000 steps (results/frontier-2-heads/calibration.md). Zoology's MQAR (Arora et al. 2023, arXiv
    2312.04927) puts its pairs in a prefix, which a pattern attending to the prefix solves without reading content;
    here a question must find its pair by content. Chance: 1/VALUES."""

    EVAL_EXAMPLES = 1024
    KEYS, VALUES, FILLERS = 64, 16, 16  # token ids: keys 1..64, pairs 65..1088 (key-major), filler 1089..1104
    TOKENS_PER_PAIR = 8  # K = N / 8; MQAR (arXiv 2312.04927) varies K as its difficulty axis: the subclasses below

    def __init__(self, name: str = "recall"):
        cpu = Preset(  # the rest Preset's defaults: width 64, 2 layers of 2 heads × 32, MLP 128, lr 1e-3, warm-up 100
            seq_len=64,
            dropout=0.0,
            steps=1500,
            batch_size=64,
            weight_decay=0.0,
            eval_every=250,
            eval_batches=4,
            final_eval_batches=16,
        )
        super().__init__(
            name,
            "token",
            vocab_size=1 + self.KEYS * (1 + self.VALUES) + self.FILLERS,
            num_classes=self.VALUES,
            metric="accuracy",
            presets={"cpu": cpu, "paper": cpu},
        )

    def pairs(self) -> int:
        return min(max(1, self.seq_len // self.TOKENS_PER_PAIR), self.KEYS)

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        if seq_len < 2:
            raise ValueError(f"recall needs --seq-len >= 2 (a pair and its question), got {seq_len}")
        self.seq_len = seq_len
        self.splits = {
            split: self.generate(self.EVAL_EXAMPLES, torch.Generator().manual_seed(seed * 1000 + 11 + i))
            for i, split in enumerate(("valid", "test"))
        }

    def generate(self, count: int, generator: torch.Generator) -> Dict[str, Tensor]:
        n, k = self.seq_len, self.pairs()
        rows = torch.arange(count)[:, None]
        keys = torch.rand(count, self.KEYS, generator=generator).argsort(1)[:, :k] + 1  # (B, K), distinct
        values = torch.randint(self.VALUES, (count, k), generator=generator)  # (B, K)
        place = torch.rand(count, n, generator=generator).argsort(1)  # (B, n): 2K distinct places, pair first
        pair, question = place[:, :k].minimum(place[:, k : 2 * k]), place[:, :k].maximum(place[:, k : 2 * k])
        tokens = torch.randint(self.FILLERS, (count, n), generator=generator) + 1 + self.KEYS * (1 + self.VALUES)
        tokens[rows, pair], tokens[rows, question] = self.KEYS + 1 + (keys - 1) * self.VALUES + values, keys
        targets = torch.full((count, n), IGNORE, dtype=torch.long)
        targets[rows, question] = values
        return {"tokens": tokens, "targets": targets}

    def train_batch(self, batch_size, generator):
        return self.generate(batch_size, generator)

    def window_limit(self, n: int, w: int) -> float:
        """The Bayes limit of a window of w keys each side: a pair and its question lie at two distinct uniform
        places; within w of each other the value is read, else guessed."""
        reached = sum(2 * (n - d) for d in range(1, min(w, n - 1) + 1)) / (n * (n - 1))
        return reached + (1 - reached) / self.VALUES


class RecallFew(Recall):
    TOKENS_PER_PAIR = 16

    def __init__(self):
        super().__init__("recall-few")


class RecallMany(Recall):
    TOKENS_PER_PAIR = 4

    def __init__(self):
        super().__init__("recall-many")


class Chain(Recall):
    """Two-hop recall. K chains of three tokens at random places: a link (a, b) of a first key a and a second key
    b, a pair (b, v) of b and a value, and the question a after both; the target there is v. Reading a's link gives
    b, not v: a second read by content, from b, is needed, so one layer cannot answer however it looks (as for
    a pair's value, a token carries both of its keys: one hop is one read, as in ``recall``). Keys are drawn
    distinct within a sequence (first keys from one set, second keys from another). K = N / 16. Chance: 1/VALUES."""

    KEYS = 32  # first keys 1..32; second keys 33..64; links, pairs and filler follow (token ids in ``generate``)
    window_limit = None  # none known: a second layer reaches beyond a window, through the first
    TOKENS_PER_PAIR = 16

    def __init__(self):
        super().__init__("chain")
        self.vocab_size = 1 + 2 * self.KEYS + self.KEYS * self.KEYS + self.KEYS * self.VALUES + self.FILLERS

    def generate(self, count: int, generator: torch.Generator) -> Dict[str, Tensor]:
        n, k, keys = self.seq_len, self.pairs(), self.KEYS
        rows = torch.arange(count)[:, None]
        first = torch.rand(count, keys, generator=generator).argsort(1)[:, :k]  # (B, K) in 0..31, distinct
        second = torch.rand(count, keys, generator=generator).argsort(1)[:, :k]  # (B, K), distinct
        values = torch.randint(self.VALUES, (count, k), generator=generator)  # (B, K)
        place = torch.rand(count, n, generator=generator).argsort(1)[:, : 3 * k].view(count, 3, k)  # (B, 3, K)
        place = place.sort(1).values  # the question last; the two hops before it in either order
        swap = torch.rand(count, k, generator=generator) < 0.5  # (B, K)
        link, pair = torch.where(swap, place[:, 1], place[:, 0]), torch.where(swap, place[:, 0], place[:, 1])
        question = place[:, 2]
        links, pairs = 1 + 2 * keys, 1 + 2 * keys + keys * keys
        tokens = torch.randint(self.FILLERS, (count, n), generator=generator) + pairs + keys * self.VALUES
        tokens[rows, link] = links + first * keys + second
        tokens[rows, pair] = pairs + second * self.VALUES + values
        tokens[rows, question] = 1 + first
        targets = torch.full((count, n), IGNORE, dtype=torch.long)
        targets[rows, question] = values
        return {"tokens": tokens, "targets": targets}


class NGram(ExampleSetTask):
    """The positional control: tokens uniform over V symbols, the target at i is TABLE[x_{i−3}, x_i], a fixed random
    table (its own seed, the same for every run), IGNORE where i < 3. Only position tells where to look: full
    attention can learn it and a window of half-width ≥ 3 holds it exactly, so adaptivity has nothing to find.
    A window of half-width < 3 sees x_i but not x_{i−3}; its Bayes limit is ``window_limit``."""

    EVAL_EXAMPLES = 1024
    SYMBOLS, CLASSES, OFFSET, TABLE_SEED = 16, 16, 3, 20261128

    def __init__(self):
        cpu = dataclasses.replace(Recall().presets["cpu"], seq_len=128)
        super().__init__("ngram", "token", 1 + self.SYMBOLS, self.CLASSES, "accuracy", {"cpu": cpu, "paper": cpu})
        table_rng = torch.Generator().manual_seed(self.TABLE_SEED)
        self.table = torch.randint(self.CLASSES, (self.SYMBOLS, self.SYMBOLS), generator=table_rng)  # (V, V)

    def window_limit(self, n: int, w: int) -> float:
        """The Bayes limit of a window of w keys each side: exact from w ≥ OFFSET; below, the best accuracy from x_i
        alone (x_{i−3} unseen, uniform), the mean over x_i of its table column's most frequent class's share."""
        if w >= self.OFFSET:
            return 1.0
        counts = torch.zeros(self.SYMBOLS, self.CLASSES).scatter_add_(1, self.table.T, torch.ones(self.table.T.shape))
        return counts.max(1).values.mean().item() / self.SYMBOLS

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        if seq_len <= self.OFFSET:
            raise ValueError(f"ngram needs --seq-len > {self.OFFSET}, got {seq_len}")
        self.seq_len = seq_len
        self.splits = {
            split: self.generate(self.EVAL_EXAMPLES, torch.Generator().manual_seed(seed * 1000 + 13 + i))
            for i, split in enumerate(("valid", "test"))
        }

    def generate(self, count: int, generator: torch.Generator) -> Dict[str, Tensor]:
        symbols = torch.randint(self.SYMBOLS, (count, self.seq_len), generator=generator)  # (B, N)
        targets = torch.full((count, self.seq_len), IGNORE, dtype=torch.long)
        targets[:, self.OFFSET :] = self.table[symbols[:, : -self.OFFSET], symbols[:, self.OFFSET :]]
        return {"tokens": symbols + 1, "targets": targets}

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
    GENERATOR_VERSION = 1  # bump when the generator changes: old caches are then ignored

    def __init__(self):
        # CPU preset: LRA's rules at lengths 50-200 (max depth 5, LRA's 10 arguments); paper preset: 500-2000.
        # Both on the backbone of the paper's: bench.model.Backbone's defaults.
        cpu = Preset(
            seq_len=200,
            steps=1500,
            batch_size=32,
            lr=1e-3,
            weight_decay=0.01,
            warmup=150,
            eval_every=250,
            eval_batches=8,
            final_eval_batches=63,
        )
        # Paper preset: SBM paper Table 7 (LISTOPS column: 2 layers, 2 heads, width 64, FFN 128, head dim 32,
        # length 2048, dropout and attention dropout 0.1, batch 128, lr 5e-4, 5000 steps); warm-up as LRA's.
        paper = dataclasses.replace(
            cpu,
            seq_len=2048,
            attn_dropout=0.1,
            steps=5000,
            batch_size=128,
            lr=5e-4,
            weight_decay=0.0,
            warmup=1000,
            eval_every=500,
            eval_batches=16,
            final_eval_batches=16,
        )
        super().__init__(
            "listops",
            "cls",
            vocab_size=len(LISTOPS_VOCAB),
            num_classes=10,
            metric="accuracy",
            presets={"cpu": cpu, "paper": paper},
        )
        self.sizes = {"train": 20000, "valid": 2000, "test": 2000}

    def generator_params(self, seq_len: int):
        """(max_depth, max_args, min_len, max_len): LRA's at length ≥ 2000, scaled-down rules below."""
        if seq_len >= 2000:
            return 10, 10, 500, 2000
        return 5, 10, seq_len // 4, seq_len

    def setup(self, seq_len, seed, data_dir, eval_context=0):
        total = sum(self.sizes.values())  # at LRA's length, 24,000 trees take ~90 s on one core: cached there
        key = hashlib.sha256(repr((self.GENERATOR_VERSION, seq_len, sorted(self.sizes.items()), seed)).encode())
        arrays = (
            cached(
                data_dir,
                f"listops-{key.hexdigest()[:20]}",
                lambda: self.generate(seq_len, seed),
                lambda arrays: array_problem(arrays, {"ids": (total, seq_len), "targets": (total,)}),
            )
            if self.generator_params(seq_len)[0] == 10
            else self.generate(seq_len, seed)
        )
        tokens, targets = torch.from_numpy(arrays["ids"].astype(np.int64)), torch.from_numpy(arrays["targets"])
        self.splits, start = {}, 0
        for split, size in self.sizes.items():
            part = slice(start, start + size)
            self.splits[split] = {
                "tokens": tokens[part],
                "targets": targets[part],
                "key_padding_mask": tokens[part] == 0,
            }
            start += size

    def generate(self, seq_len: int, seed: int) -> Dict[str, np.ndarray]:
        """{"ids": (examples, seq_len) token ids, 0 padding; "targets": (examples,) values}, splits in order."""
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
        ids = np.zeros((total, seq_len), dtype=np.uint8)
        for row, (tokens, _) in enumerate(examples):
            ids[row, : len(tokens)] = [index[t] for t in tokens]
        return {"ids": ids, "targets": np.array([label for _, label in examples], dtype=np.int64)}
