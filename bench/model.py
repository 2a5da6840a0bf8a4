"""The one backbone: a pre-LayerNorm Transformer (Xiong et al. 2020) with a pluggable attention. Heads:
- ``cls``: mask-aware mean pooling over valid tokens, then Linear → GELU → Linear (LRA classification);
- ``token``: a Linear classifier per token (the SBM paper's synthetic duplicates task);
- ``lm``: causal next-token logits (enwik8 / byte LM); every attention is called with ``causal=True``;
- ``pair``: two sequences encoded by the same encoder, pooled, combined as [x0, x1, x0·x1, x0−x1] and
  classified (LRA retrieval's dual encoder).
Positional embeddings are learned and optional (``pos_emb=False`` for an LM whose attention carries ALiBi).

The attention comes from a factory ``make_attention(layer_index) -> nn.Module`` (INTERFACE.md), so a method may
differ per layer; ``stats["aux_loss"]`` sums the layers' auxiliary losses (a method's regulariser).

Shape legend: B batch, N tokens, C model width, L layers, H heads, V vocabulary / classes.
"""

from dataclasses import dataclass, fields
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from bench import measure

HEADS = ("cls", "token", "lm", "pair")


@dataclass(kw_only=True)
class Backbone:
    """The backbone's sizes: written once here; a task's preset (bench/tasks/) sets them beside its
    training recipe, and ModelConfig adds what the task decides."""

    dim: int = 64
    depth: int = 2
    heads: int = 2
    head_dim: int = 32
    mlp_dim: int = 128
    dropout: float = 0.1
    attn_dropout: float = 0.0
    pos_emb: bool = True


@dataclass(kw_only=True)
class ModelConfig(Backbone):
    vocab_size: int
    num_classes: int  # the LM head predicts vocab_size symbols and ignores this
    head: str  # one of HEADS
    max_len: int

    @classmethod
    def of(cls, sizes, **task) -> "ModelConfig":
        """The backbone fields of ``sizes`` (a preset or a run's config) with the task's ``vocab_size``,
        ``num_classes``, ``head`` and ``max_len``."""
        return cls(**{f.name: getattr(sizes, f.name) for f in fields(Backbone)}, **task)

    def __post_init__(self):
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        for name in ("vocab_size", "num_classes", "max_len", "dim", "depth", "heads", "head_dim", "mlp_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0 or not 0.0 <= self.attn_dropout < 1.0:
            raise ValueError("dropout rates must be in [0, 1)")


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, attn: nn.Module):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        self.attn = attn
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, cfg.mlp_dim), nn.GELU(), nn.Linear(cfg.mlp_dim, cfg.dim))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, x: Tensor, key_padding_mask: Optional[Tensor], causal: bool, generator: Optional[torch.Generator]
    ):
        attended, stats = self.attn(
            self.norm1(x), key_padding_mask=key_padding_mask, causal=causal, generator=generator
        )
        x = x + self.drop(attended)
        return x + self.drop(self.mlp(self.norm2(x))), stats


class Model(nn.Module):
    def __init__(self, cfg: ModelConfig, make_attention: Callable[[int], nn.Module]):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos = nn.Embedding(cfg.max_len, cfg.dim) if cfg.pos_emb else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, make_attention(i)) for i in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.dim)
        # Embeddings start at N(0, 0.02²) as in BERT/GPT-2 and the official SBM backbone: Adam's steps are
        # then large relative to them, so token identities are learned quickly (torch's default N(0, 1) left
        # full attention stuck at the base rate of the duplicates task for 2000 steps).
        for table in (self.embed, self.pos):
            if table is not None:
                nn.init.normal_(table.weight, std=0.02)
        if cfg.head == "lm":
            self.classifier = nn.Linear(cfg.dim, cfg.vocab_size)
        elif cfg.head == "token":
            self.classifier = nn.Linear(cfg.dim, cfg.num_classes)
        else:
            pooled_dim = 4 * cfg.dim if cfg.head == "pair" else cfg.dim
            self.classifier = nn.Sequential(
                nn.Linear(pooled_dim, cfg.dim), nn.GELU(), nn.Linear(cfg.dim, cfg.num_classes)
            )

    def encode(self, tokens: Tensor, key_padding_mask: Optional[Tensor], generator: Optional[torch.Generator]):
        """(B, N) tokens → (B, N, C) final hidden states, per-layer density and computed pairs (L, H) each
        (bench/measure.py), summed aux loss."""
        b, n = tokens.shape
        if n > self.cfg.max_len and self.pos is not None:
            raise ValueError(f"sequence length {n} exceeds max_len {self.cfg.max_len}")
        x = self.embed(tokens)  # (B, N, C)
        if self.pos is not None:
            x = x + self.pos(torch.arange(n, device=tokens.device))[None]
        x = self.drop(x)
        densities, pairs, aux = [], [], torch.zeros((), device=tokens.device)
        for block in self.blocks:
            x, stats = block(x, key_padding_mask, self.cfg.head == "lm", generator)
            densities.append(stats["density"])
            pairs.append(measure.computed_pairs(stats, key_padding_mask, self.cfg.head == "lm", n))
            if "aux_loss" in stats:
                aux = aux + stats["aux_loss"]
        return self.norm(x), {"density": torch.stack(densities), "computed_pairs": torch.stack(pairs)}, aux

    @staticmethod
    def mean_pool(h: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """(B, N, C) → (B, C): the mean over valid tokens only (padding does not dilute the average)."""
        if key_padding_mask is None:
            return h.mean(1)
        valid = (~key_padding_mask).unsqueeze(-1).to(h.dtype)  # (B, N, 1)
        return (h * valid).sum(1) / valid.sum(1).clamp_min(1.0)

    def forward(
        self,
        tokens: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        generator: Optional[torch.Generator] = None,
        tokens2: Optional[Tensor] = None,
        key_padding_mask2: Optional[Tensor] = None,
    ):
        """tokens (B, N) long; key_padding_mask (B, N) bool, True at padding. For the ``pair`` head, the
        second sequence comes as tokens2 / key_padding_mask2. Returns logits — (B, N, V) for ``lm`` and
        ``token``, (B, V) otherwise — and stats."""
        h, stats, aux = self.encode(tokens, key_padding_mask, generator)  # (B, N, C), {name: (L, H)}, ()
        if self.cfg.head in ("lm", "token"):
            return self.classifier(h), {**stats, "aux_loss": aux}
        pooled = self.mean_pool(h, key_padding_mask)  # (B, C)
        if self.cfg.head == "pair":
            if tokens2 is None:
                raise ValueError("the pair head needs tokens2")
            h2, stats2, aux2 = self.encode(tokens2, key_padding_mask2, generator)
            other = self.mean_pool(h2, key_padding_mask2)
            pooled = torch.cat([pooled, other, pooled * other, pooled - other], -1)  # (B, 4C)
            stats, aux = {name: (value + stats2[name]) / 2 for name, value in stats.items()}, aux + aux2
        return self.classifier(pooled), {**stats, "aux_loss": aux}
