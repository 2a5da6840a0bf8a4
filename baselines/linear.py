"""Linear attention: softmax replaced by a positive feature map, computed in O(N·D²) instead of O(N²·D).

Katharopoulos, Vyas, Pappas, Fleuret, "Transformers are RNNs: Fast Autoregressive Transformers with Linear
Attention" (ICML 2020, arXiv 2006.16236). With a similarity sim(q, k) = φ(q)ᵀφ(k) (§3.2, Eq. 2-3) attention becomes

    V'_i = φ(Q_i)ᵀ (Σ_j φ(K_j) V_jᵀ) / φ(Q_i)ᵀ (Σ_j φ(K_j))          (Eq. 4)

and by associativity (φ(Q)φ(K)ᵀ)V = φ(Q)(φ(K)ᵀV) (Eq. 5) the (N, M) matrix is never formed. The feature
map is φ(x) = elu(x) + 1 (§3.2.1, Eq. 7), applied to the raw per-head queries and keys (no 1/√D scale: the
paper's kernel is not the softmax kernel). Causal attention uses the prefix sums (§3.3, Eq. 10-12)

    S_i = Σ_{j≤i} φ(K_j) V_jᵀ,   Z_i = Σ_{j≤i} φ(K_j),   V'_i = φ(Q_i)ᵀ S_i / φ(Q_i)ᵀ Z_i.

Causal computation (``chunk``): a naive ``cumsum`` of the outer products φ(K_j)V_jᵀ keeps a (B, H, N, D, D)
tensor, O(N·D²) memory (tolerable at D = 32, not beyond). We run the prefix sums over chunks of ``chunk``
positions instead: S and Z are carried across chunk boundaries (an exclusive cumsum over N/chunk chunk
states), and inside a chunk the causal part is the explicit (chunk × chunk) form φ(Q)φ(K)ᵀ masked to j ≤ i.
Memory O(N·chunk + (N/chunk)·D²), same result up to rounding (tests/test_linear.py checks both against the
quadratic form).

Padding (the paper has no key-padding mask): padded keys get φ(K_j) = 0 and V_j = 0, so they add nothing to
S and Z — exactly as if they were absent. A query with no admissible key has a zero denominator; its output is
set to 0 (the official code adds ε = 1e-6 to the denominator instead, which biases every output slightly; we
guard only the empty case).

Density (the repository's convention, INTERFACE.md): there is no pair-wise attention; every admissible
(query, key) pair influences the output through S and Z, so we report admissible pairs / (valid queries ×
valid keys) — 1 without a causal mask, about (N+1)/(2N) with one — the same number full attention reports.
It measures which pairs interact, not cost; the cost difference shows in FLOPs.

Deviations: dropout has no attention matrix to act on, so (as in common implementations) it is applied to
the attention output before the output projection. The feature map and the prefix sums run in float32 even
under autocast.

Shape legend: B batch, H heads, N queries, M keys (M = N), D head dim, K features (K = D here),
T chunks, C chunk length.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.common import attention_density, check_padding_mask, generator_dropout


def elu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 (Eq. 7): positive, so every similarity φ(q)ᵀφ(k) is > 0."""
    return F.elu(x) + 1.0


def causal_prefix_sums(phi_q: Tensor, phi_k: Tensor, v: Tensor, chunk: int):
    """Numerator φ(Q_i)ᵀS_i (B, H, N, D) and denominator φ(Q_i)ᵀZ_i (B, H, N) of Eq. 10-12, by chunks."""
    b, h, n, _ = phi_q.shape
    t = -(-n // chunk)
    pad = t * chunk - n  # zero features at the tail add nothing to S, Z; their rows are cut off below
    phi_q, phi_k, v = (F.pad(x, (0, 0, 0, pad)).view(b, h, t, chunk, x.shape[-1]) for x in (phi_q, phi_k, v))
    # (B, H, T, C, K|D)
    # S and Z entering chunk τ sum the keys of all chunks before it: an exclusive cumsum of chunk states.
    kv = phi_k.transpose(-1, -2) @ v  # (B, H, T, K, D)
    s = F.pad(kv.cumsum(2)[:, :, :-1], (0, 0, 0, 0, 1, 0))  # (B, H, T, K, D)
    z = F.pad(phi_k.sum(3).cumsum(2)[:, :, :-1], (0, 0, 1, 0))  # (B, H, T, K)
    # Inside a chunk, the same sums in their quadratic form φ(Q)φ(K)ᵀ, masked to j <= i.
    within = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()  # (C, C)
    scores = (phi_q @ phi_k.transpose(-1, -2)).masked_fill(~within, 0.0)  # (B, H, T, C, C)
    num = scores @ v + phi_q @ s  # (B, H, T, C, D)
    den = scores.sum(-1) + (phi_q @ z.unsqueeze(-1)).squeeze(-1)  # (B, H, T, C)
    return num.reshape(b, h, t * chunk, -1)[:, :, :n], den.reshape(b, h, t * chunk)[:, :, :n]


class LinearAttention(nn.Module):
    """Multi-head linear attention with φ = elu + 1 (INTERFACE.md). Budget: none (K = head_dim features);
    ``chunk`` is the causal scan's chunk length (memory/speed only, not the result)."""

    def __init__(self, dim: int, heads: int, head_dim: int, dropout: float = 0.0, *, chunk: int = 64):
        super().__init__()
        if min(dim, heads, head_dim, chunk) < 1:
            raise ValueError(
                f"dim, heads, head_dim and chunk must be positive, got {dim}, {heads}, {head_dim}, {chunk}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.heads, self.head_dim, self.dropout, self.chunk = heads, head_dim, dropout, chunk
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, head_dim={self.head_dim}, features={self.head_dim} (elu+1), chunk={self.chunk}"

    def core(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor] = None, causal: bool = False
    ) -> Tensor:
        """Eq. 4 (or Eq. 10-12 when causal) on per-head (B, H, N, D) tensors; returns (B, H, N, D)."""
        compute = torch.promote_types(q.dtype, torch.float32)  # float32 at least, float64 kept for tests
        with torch.autocast(q.device.type, enabled=False):
            phi_q, phi_k, v = elu_feature_map(q.to(compute)), elu_feature_map(k.to(compute)), v.to(compute)
            if key_padding_mask is not None:
                padded = key_padding_mask[:, None, :, None]  # (B, 1, M, 1)
                phi_k, v = phi_k.masked_fill(padded, 0.0), v.masked_fill(padded, 0.0)
            if causal:
                num, den = causal_prefix_sums(phi_q, phi_k, v, self.chunk)  # (B, H, N, D), (B, H, N)
            else:
                num = phi_q @ (phi_k.transpose(-1, -2) @ v)  # Eq. 5: (B, H, N, K) @ (B, H, K, D)
                den = (phi_q @ phi_k.sum(-2).unsqueeze(-1)).squeeze(-1)  # (B, H, N)
            # Features are > 0 (barring underflow), so den = 0 means no admissible key: output 0, not 0/0.
            return num / torch.where(den > 0, den, 1.0).unsqueeze(-1)

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
    ):
        b, n, _ = x.shape
        check_padding_mask(key_padding_mask, b, n)
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3×(B, H, N, D)
        y = self.core(q, k, v, key_padding_mask, causal).to(v.dtype)  # (B, H, N, D)
        y = generator_dropout(y, self.dropout if self.training else 0.0, generator)
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        return self.out(y), {"density": attention_density(key_padding_mask, causal, b, n, self.heads, x.device)}
