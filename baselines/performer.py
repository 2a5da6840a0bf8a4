"""Performer attention: FAVOR+, softmax attention estimated with positive orthogonal random features.

Choromanski et al., "Rethinking Attention with Performers" (ICLR 2021; arXiv 2009.14794, 2020). The softmax
kernel exp(qᵀk/√D) = exp(xᵀy) with x = q/D^¼, y = k/D^¼ is estimated without bias by positive random
features (Lemma 1):

    φ(x) = exp(−‖x‖²/2)/√m · (exp(ω_1ᵀx), …, exp(ω_mᵀx)),   E[φ(x)ᵀφ(y)] = exp(xᵀy),

and attention becomes the linear form D̂⁻¹(φ(Q)(φ(K)ᵀV)) with D̂ = diag(φ(Q)(φ(K)ᵀ1)) (the "generalized
kernelizable attention" of §2.2). The ω_i are orthogonal random features (§2.4): blocks of D exactly
orthogonal directions (QR of a Gaussian matrix, signs fixed so the block is Haar-distributed), each row
rescaled by an independent chi(D)-distributed norm (the norm of a D-dim Gaussian) so that every ω_i is
marginally N(0, I_D) and the estimator stays unbiased. Causal attention uses the prefix-sum mechanism of the
paper's unidirectional case: S_i = Σ_{j≤i} φ(K_j)V_jᵀ, z_i = Σ_{j≤i} φ(K_j).

Feature redraw: the paper redraws features during training. ``redraw_interval = r`` redraws every r-th
training forward (r = 1: every forward; r = 0: never, the features drawn at construction are kept). In eval
the features stay fixed, so an evaluation is deterministic; ``redraw_features(generator)`` draws new ones on
request. Draws use ``generator`` when one is given. One draw is shared by all heads and the batch (as the
official code); the features belong to the module, so layers never share them.

Numerical stabilisation (why subtracting maxima is exact). The output of query i is a ratio
Σ_j φ(q_i)ᵀφ(k_j) v_j / Σ_j φ(q_i)ᵀφ(k_j):
- multiplying φ(q_i) by any positive constant c_i cancels in that ratio, so we subtract the row max of query
  i's log-features (this also removes exp(−‖x‖²/2) and 1/√m, which are such constants);
- multiplying feature f of every key by a constant d_f and feature f of every query by 1/d_f leaves each
  φ(q_i)ᵀφ(k_j) unchanged. Non-causal: d_f = exp(−m_f), m_f = the max of feature f's log-features over the
  valid keys of this sample and head (padded keys are excluded so their content cannot move it, and samples
  do not share it), added to the queries' log-features before their row max is taken. Then every exponent
  is ≤ 0, and the feature where query i's shifted log-feature is 1 has a key sum ≥ 1, so the denominator is
  ≥ 1: it cannot underflow, and neither 1/den nor the gradients can overflow, whatever the input scale
  (one max over all features instead, as before, let it fall to denormals at input scale 100).
- Causal: per-feature shifts would make the within-chunk weights exp(m_jf − m_if) differ per feature, an
  O(N·C·m) tensor instead of the O(N·C) below, so the key shift is one constant over the features:
  c_i = the max over keys j ≤ i and features (a prefix max; a whole-sequence max would be exact too but lets
  a future key change, through rounding or underflow, what position i outputs). The scan carries its state
  in the scale of the last prefix max and rescales it by exp(c_old − c_new) ≤ 1 when the max grows (the
  online-softmax trick), so every exponent is ≤ 0. Limitation: where the keys' log-features spread over more
  than float32's exp range (about 87) across features, a query's denominator can underflow, and its gradient
  is then not finite (here from input scale ≈ 30 on random weights); compute in float64 there.
- The shifts are detached: their exact gradient is zero.

Causal computation (``chunk``): inside a chunk of C positions the quadratic form, masked to j ≤ i and
rescaled by exp(c_j − c_i); across chunks the states of earlier chunks, rescaled to the current chunk's
reference shift. Memory O(N·C + (N/C)·m·D) instead of the O(N·m·D) of a cumsum over outer products.

Padding (the paper has no key-padding mask): padded keys get φ(k_j) = 0 and v_j = 0 — they add nothing to the
sums, as if absent. A query with no admissible key (or whose features all underflow against the shift) has a
zero denominator and outputs 0; the official code adds a small ε to the features instead, which biases the
estimate.

Density (the repository's convention, INTERFACE.md): there is no pair-wise attention; every admissible
(query, key) pair influences the output implicitly, so we report admissible pairs / (valid queries × valid
keys) — 1 without a causal mask, about (N+1)/(2N) with one — the number full attention reports. It measures
which pairs interact, not cost.

Deviations: no ε in the features or denominator (see above); dropout has no attention matrix to act on, so it
is applied to the attention output before the output projection. Feature maps run in float32 even under
autocast.

Shape legend: B batch, H heads, N queries, M keys (M = N), D head dim, K random features (m),
T chunks, C chunk length.
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.common import attention_density, check_padding_mask, generator_dropout


def orthogonal_gaussian_features(m: int, d: int, generator: Optional[torch.Generator] = None, device=None) -> Tensor:
    """(K, D) float32 ω: ⌈m/d⌉ Haar-orthogonal blocks, rows rescaled by chi(d) norms (§2.4)."""
    device = generator.device if generator is not None else device
    gaussian = torch.randn(math.ceil(m / d), d, d, generator=generator, device=device)  # (⌈K/D⌉, D, D)
    q, r = torch.linalg.qr(gaussian)
    # QR of a Gaussian matrix is Haar-distributed only once the signs of diag(R) are moved into Q.
    blocks = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # (⌈K/D⌉, D, D), orthogonal
    directions = blocks.reshape(-1, d)[:m]  # (K, D): rows of each block are orthonormal
    norms = torch.randn(m, d, generator=generator, device=device).norm(dim=1)  # (K,) chi(d)
    return directions * norms[:, None]


def softmax_kernel_logits(x: Tensor, omega: Tensor) -> Tensor:
    """(B, H, N, K) log of the positive features of Lemma 1 without the constant 1/√m: ωᵀx − ‖x‖²/2."""
    return x @ omega.T - x.square().sum(-1, keepdim=True) / 2


def causal_scan(phi_q: Tensor, phi_k: Tensor, v: Tensor, shift: Tensor, chunk: int):
    """Prefix sums with a running shift. phi_k_j = exp(logit_j − c_j) for the prefix max c_j = ``shift``
    (B, H, N); query i must see Σ_{j≤i} exp(logit_j − c_i) = Σ_{j≤i} exp(c_j − c_i)·phi_k_j. Returns the
    numerator (B, H, N, D) and the denominator (B, H, N)."""
    b, h, n, _ = phi_q.shape
    t = -(-n // chunk)
    pad = t * chunk - n  # zero features at the tail add nothing; their rows are cut off below
    phi_q, phi_k, v = (F.pad(x, (0, 0, 0, pad)).view(b, h, t, chunk, x.shape[-1]) for x in (phi_q, phi_k, v))
    # (B, H, T, C, K|D)
    shift = F.pad(shift, (0, pad), mode="replicate").view(b, h, t, chunk)  # (B, H, T, C), non-decreasing
    end = shift[..., -1]  # (B, H, T): each chunk's state is kept in the scale of its last prefix max
    ref = torch.cat([shift[:, :, :1, 0], end[:, :, :-1]], dim=-1)  # (B, H, T): scale of the state entering τ
    # Within a chunk: weights exp(c_j − c_i) for j <= i (≤ 1), fully masked above the diagonal before exp.
    within = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()  # (C, C)
    decay = (shift.unsqueeze(-2) - shift.unsqueeze(-1)).masked_fill(~within, -math.inf).exp()  # (B, H, T, C, C)
    scores = (phi_q @ phi_k.transpose(-1, -2)) * decay  # (B, H, T, C, C)
    # Across chunks: chunk σ's own sums in scale end_σ, carried into chunk τ > σ with exp(end_σ − ref_τ) ≤ 1.
    to_end = (shift - end.unsqueeze(-1)).exp().unsqueeze(-1)  # (B, H, T, C, 1)
    local_kv = (phi_k * to_end).transpose(-1, -2) @ v  # (B, H, T, K, D)
    local_z = (phi_k * to_end).sum(3)  # (B, H, T, K)
    earlier = torch.ones(t, t, dtype=torch.bool, device=v.device).tril(-1)  # (T, T): σ < τ
    carry = (end.unsqueeze(-2) - ref.unsqueeze(-1)).masked_fill(~earlier, -math.inf).exp()  # (B, H, T, T)
    s = torch.einsum("bhts,bhskd->bhtkd", carry, local_kv)  # (B, H, T, K, D)
    z = torch.einsum("bhts,bhsk->bhtk", carry, local_z)  # (B, H, T, K)
    to_query = (ref.unsqueeze(-1) - shift).exp()  # (B, H, T, C): exp(ref_τ − c_i) ≤ 1
    num = scores @ v + to_query.unsqueeze(-1) * (phi_q @ s)  # (B, H, T, C, D)
    den = scores.sum(-1) + to_query * (phi_q @ z.unsqueeze(-1)).squeeze(-1)  # (B, H, T, C)
    return num.reshape(b, h, t * chunk, -1)[:, :, :n], den.reshape(b, h, t * chunk)[:, :, :n]


class PerformerAttention(nn.Module):
    """Multi-head FAVOR+ attention (INTERFACE.md). Budget: ``features`` (m random features per head);
    ``redraw_interval`` sets how often training redraws them; ``chunk`` is the causal scan's chunk length
    (memory/speed only)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dropout: float = 0.0,
        *,
        features: int = 256,
        redraw_interval: int = 1,
        chunk: int = 64,
    ):
        super().__init__()
        if min(dim, heads, head_dim, features, chunk) < 1:
            raise ValueError(
                f"dim, heads, head_dim, features and chunk must be positive, got {dim}, {heads}, "
                f"{head_dim}, {features}, {chunk}"
            )
        if redraw_interval < 0:
            raise ValueError(f"redraw_interval must be >= 0 (0: never redraw), got {redraw_interval}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.features, self.redraw_interval, self.chunk = features, redraw_interval, chunk
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)
        self.register_buffer("omega", orthogonal_gaussian_features(features, head_dim))  # (K, D)
        # counts towards the next redraw; a buffer, so a resumed run redraws exactly when an uninterrupted one does
        self.register_buffer("training_forwards", torch.zeros((), dtype=torch.long))

    def extra_repr(self) -> str:
        return (
            f"heads={self.heads}, head_dim={self.head_dim}, features={self.features}, "
            f"redraw_interval={self.redraw_interval}, chunk={self.chunk}"
        )

    @torch.no_grad()
    def redraw_features(self, generator: Optional[torch.Generator] = None) -> None:
        """Draw new ω. Rebinds the buffer instead of writing into it: a graph built with the old ω (e.g.
        gradient accumulation over several forwards) still needs it for the backward."""
        omega = orthogonal_gaussian_features(self.features, self.head_dim, generator, self.omega.device)
        self.omega = omega.to(self.omega.device, self.omega.dtype)

    def core(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor] = None, causal: bool = False
    ) -> Tensor:
        """FAVOR+ with the current ω on per-head (B, H, N, D) tensors; returns (B, H, N, D)."""
        compute = torch.promote_types(q.dtype, torch.float32)  # float32 at least, float64 kept for tests
        with torch.autocast(q.device.type, enabled=False):
            scale = q.shape[-1] ** -0.25  # x = q/D^¼, y = k/D^¼ so that xᵀy = qᵀk/√D
            omega = self.omega.to(compute)
            q_logits = softmax_kernel_logits(q.to(compute) * scale, omega)  # (B, H, N, K)
            k_logits = softmax_kernel_logits(k.to(compute) * scale, omega)  # (B, H, M, K)
            v = v.to(compute)
            floor = torch.finfo(compute).min
            if key_padding_mask is not None:
                padded = key_padding_mask[:, None, :, None]  # (B, 1, M, 1)
                k_logits, v = k_logits.masked_fill(padded, floor), v.masked_fill(padded, 0.0)
            if causal:
                shift = k_logits.amax(-1).cummax(-1).values.detach()  # (B, H, M): prefix max c_j
                phi_k = (k_logits - shift.unsqueeze(-1)).exp()  # (B, H, M, K), ≤ 1
            else:
                shift = k_logits.amax(-2, keepdim=True).detach()  # (B, H, 1, K): per-feature key max m_f
                phi_k = (k_logits - shift).exp()  # (B, H, M, K), ≤ 1, each feature's largest key = 1
                q_logits = q_logits + shift  # the queries carry exp(m_f), so φ(q)ᵀφ(k) is unchanged
            phi_q = (q_logits - q_logits.amax(-1, keepdim=True).detach()).exp()  # (B, H, N, K), row max = 1
            if key_padding_mask is not None:
                # A padded key's logit is `floor`, so exp underflows to 0 — except where every key so far is
                # padded (shift = floor too, exp(0) = 1): zero those explicitly.
                phi_k = phi_k.masked_fill(padded, 0.0)
            if causal:
                num, den = causal_scan(phi_q, phi_k, v, shift, self.chunk)  # (B, H, N, D), (B, H, N)
            else:
                num = phi_q @ (phi_k.transpose(-1, -2) @ v)  # (B, H, N, K) @ (B, H, K, D)
                den = (phi_q @ phi_k.sum(-2).unsqueeze(-1)).squeeze(-1)  # (B, H, N)
            return num / torch.where(den > 0, den, 1.0).unsqueeze(-1)  # den = 0: no admissible key → 0

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
    ):
        b, n, _ = x.shape
        check_padding_mask(key_padding_mask, b, n)
        if self.training and self.redraw_interval > 0:
            if self.training_forwards % self.redraw_interval == 0:
                self.redraw_features(generator)
            self.training_forwards += 1
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3×(B, H, N, D)
        y = self.core(q, k, v, key_padding_mask, causal).to(v.dtype)  # (B, H, N, D)
        y = generator_dropout(y, self.dropout if self.training else 0.0, generator)
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        return self.out(y), {"density": attention_density(key_padding_mask, causal, b, n, self.heads, x.device)}
