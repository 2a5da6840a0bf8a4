"""What a task is: batches as dicts of tensors — tokens (B, N) long, targets ((B,) or (B, N) long, -100 where
not scored), key_padding_mask (B, N) bool (True at padding) or None, and tokens2 / key_padding_mask2 for the
``pair`` head — through ``train_batch(batch_size, generator)`` (a fresh, reproducible draw each step) and
``eval_batches(split, batch_size, limit)`` (a fixed pass over the validation or test split). Its presets
(bench.config.Preset) give its sizes and recipe. ``model_inputs`` makes a batch the model's arguments,
``task_loss`` scores it, ``base_rate`` is what its targets give a model that sees no input.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F
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
    data_file = None  # --data-file: what a task that reads files reads instead of its own
    download_allowed = True  # --no-download sets it False

    def setup(self, seq_len: int, seed: int, data_dir: Path, eval_context: int = 0) -> None:
        raise NotImplementedError

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Dict[str, Tensor]:
        raise NotImplementedError

    def eval_batches(self, split: str, batch_size: int, limit: Optional[int]) -> Iterator[Dict[str, Tensor]]:
        raise NotImplementedError


class ExampleSetTask(Task):
    """A task whose splits are fixed examples held in memory, a batch built from their indices by ``batch``: by
    default the splits are dicts of example tensors (tokens, targets, padding)."""

    splits: Dict[str, Dict[str, Tensor]]

    def split_size(self, split: str) -> int:
        return len(self.splits[split]["tokens"])

    def batch(self, split: str, idx: np.ndarray) -> Dict[str, Tensor]:
        return {key: value[idx] for key, value in self.splits[split].items()}

    def train_batch(self, batch_size, generator):
        idx = torch.randint(self.split_size("train"), (batch_size,), generator=generator).numpy()
        return self.batch("train", idx)

    def eval_batches(self, split, batch_size, limit):
        total = self.split_size(split)
        stop = total if limit is None else min(total, limit * batch_size)
        for start in range(0, stop, batch_size):
            yield self.batch(split, np.arange(start, min(stop, start + batch_size)))


def model_inputs(batch: dict, device: torch.device) -> dict:
    """A task's batch as the model's keyword arguments, on the device."""
    inputs = {
        "tokens": batch["tokens"].to(device),
        "key_padding_mask": batch["key_padding_mask"].to(device) if "key_padding_mask" in batch else None,
    }
    if "tokens2" in batch:
        inputs["tokens2"] = batch["tokens2"].to(device)
        inputs["key_padding_mask2"] = batch["key_padding_mask2"].to(device)
    return inputs


def task_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in float32 over scored positions (targets ≠ IGNORE)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def base_rate(counts: torch.Tensor, metric: str) -> float:
    """What a model with no input scores: the majority class's accuracy, or the unigram entropy in bits."""
    p = counts / counts.sum()
    if metric == "bpb":
        return -(p[p > 0] * p[p > 0].log2()).sum().item()
    return p.max().item()
