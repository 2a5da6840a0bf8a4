"""What a task is: every task gives batches as dicts of tensors,

    tokens (B, N) long · targets ((B,) or (B, N) long, -100 where not scored) · key_padding_mask (B, N) bool
    (True at padding) or None · for the ``pair`` head also tokens2 / key_padding_mask2,

through ``train_batch(batch_size, generator)`` (a fresh, reproducible draw for every step) and
``eval_batches(split, batch_size, limit)`` (a fixed, deterministic pass over the validation or test split).
A task's presets (bench.config.Preset) give its model sizes and training recipe at each scale.
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, Optional

import torch
from torch import Tensor

from bench.config import Preset

IGNORE = -100


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
