"""A toy attention registered from outside the repository's registry (tests/test_run_all.py): the whole of
what adding a method with settings of its own takes is this file, whose last line is its registry entry."""
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from bench.methods import Method, register


@dataclass
class ToyConfig:
    """The toy's one setting, a flag of every entry point that runs it (``--temperature``)."""
    temperature: float = field(default=1.0, metadata={"help": "divides the attention scores"})

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"--temperature must be > 0, got {self.temperature}")


class ToyAttention(nn.Module):
    """Softmax attention over all admissible keys, on one shared projection (a test double, not a method)."""

    def __init__(self, dim: int, heads: int, head_dim: int, dropout: float = 0.0, temperature: float = 1.0):
        super().__init__()
        self.heads, self.head_dim, self.temperature = heads, head_dim, temperature
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)

    def forward(self, x, key_padding_mask=None, causal=False, generator=None):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 × (B, H, N, D)
        allowed = torch.ones(b, 1, n, n, dtype=torch.bool, device=x.device)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask[:, None, None, :]
        if causal:
            allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.head_dim ** -0.5 / self.temperature)
        y = y.nan_to_num(0.0)  # (B, H, N, D)
        y = y * allowed.any(-1, keepdim=True)  # a query with no admissible key outputs zeros
        return self.out(y.transpose(1, 2).reshape(b, n, -1)), {"density": torch.ones(self.heads)}


register(Method("toy", "toy_attention:ToyAttention", options="toy_attention:ToyConfig"))
