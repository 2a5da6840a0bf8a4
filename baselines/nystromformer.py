"""Nyströmformer attention: softmax attention approximated through K landmarks by the Nyström method.

Xiong, Zeng, Chakraborty, Tan, Fung, Li, Singh, "Nyströmformer: A Nyström-Based Algorithm for
Approximating Self-Attention" (AAAI 2021, arXiv 2102.03902). With scores scaled by 1/√D as in Eq. 1 of Vaswani et al.:

    q̃_j = mean of q_i over segment j,  k̃_j likewise                 (segment-means landmarks, Eq. 13-14)
    F = softmax(Q K̃ᵀ/√D)  (N×K),  A = softmax(Q̃ K̃ᵀ/√D)  (K×K),  B = softmax(Q̃ Kᵀ/√D)  (K×M)
    softmax(Q Kᵀ/√D) V  ≈  F · A⁺ · (B · V)                           (Nyström approximation, Eq. 14-15)
    A⁺ ≈ Z_T:  Z_0 = Aᵀ / (‖A‖₁ ‖A‖∞),
               Z_{t+1} = ¼ Z_t (13I − A Z_t (15I − A Z_t (7I − A Z_t)))   (iterative pseudo-inverse, Eq. 16)

evaluated right to left so that nothing N×M is ever formed: O(N·K·D + K³) time, O(N·K) memory.
The paper uses T = 6 iterations (``pinv_iterations``). The official code adds a skip connection
y += DepthwiseConv(V) along the sequence (kernel 33, one filter per head shared over D); here it is
``conv_kernel`` (0 = off, the default, so that y is a pure approximation of softmax attention).

Deviations and choices the paper leaves open (the equation numbers above follow the paper's arXiv text):
- Norms in Z_0: ‖A‖₁ (max column sum) and ‖A‖∞ (max row sum) per sample and head, as the paper writes
  them; the official code takes one maximum over the whole batch and all heads.
- N not divisible by K: the paper assumes it is. We pad the sequence to N' = ⌈N/K⌉·K with tokens that
  are treated exactly like key padding (below), so segments have length N'/K and the trailing segments
  hold fewer valid tokens or none.
- Key padding (the paper does not discuss it): a landmark is the mean over the *valid* tokens of its
  segment; a segment with no valid token yields no landmark — its column of F is masked, and its row and
  column of A are replaced by those of the identity, so Z on the remaining landmarks evolves exactly as
  for the smaller matrix and the empty landmark contributes nothing (its column of F is zero). Padded keys
  are masked in B (mask fill), and V is zeroed at padded positions so the conv skip cannot read them.
  (The official code zeroes padded Q and K and divides segment sums by the full segment length.)
- A query with no landmark (all tokens of its sample padded) outputs zeros: a softmax row with nothing
  admissible is set to zero instead of uniform.
- Dropout (the official attention has none) is applied to F, the query-to-landmark weights, with the
  forward's generator.
- No causal form exists (a landmark averages over a whole segment, future tokens included): causal=True
  raises ValueError.
- Density (the repository's rule for implicit, kernel and low-rank methods, as linear/Performer/Linformer):
  the fraction of admissible (query, key) pairs that influence the output — every valid key reaches every
  query through the landmarks, so 1 (0 for a batch with no valid token). Its cost, O(N·K·D), shows in the
  FLOPs, not here.

Shape legend: B batch, H heads, N queries (= M keys, self-attention; N' after padding to a multiple of K),
D head dim, K landmarks, C segment length (N'/K).
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from baselines.common import check_padding_mask, generator_dropout


def masked_softmax(logits: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the last dim restricted to ``allowed`` (broadcastable); a row with nothing allowed is
    all zero rather than uniform over masked entries."""
    logits = logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)
    return logits.softmax(-1) * allowed.any(-1, keepdim=True)


def iterative_pinv(a: Tensor, iterations: int) -> Tensor:
    """(..., K, K) → approximate Moore-Penrose pseudo-inverse by the paper's iteration (Eq. 16).

    Z_0 = Aᵀ/(‖A‖₁‖A‖∞) puts every eigenvalue of A·Z_0 in (0, 1]; each step then moves an eigenvalue e to
    ¼e(13 − e(15 − e(7 − e))), which grows a small e about 3.25× per step and converges fast near 1.
    """
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norm_1 = a.abs().sum(-2).amax(-1)  # (...,) max column sum
    norm_inf = a.abs().sum(-1).amax(-1)  # (...,) max row sum
    z = a.transpose(-1, -2) / (norm_1 * norm_inf)[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


class NystromAttention(nn.Module):
    """Nyström-approximated multi-head softmax attention (INTERFACE.md).

    Budget: ``landmarks`` K; ``pinv_iterations`` of the pseudo-inverse (paper: 6); ``conv_kernel`` of the
    depthwise-conv skip on V (odd, 0 = off; official code: 33).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dropout: float = 0.0,
        *,
        landmarks: int = 64,
        pinv_iterations: int = 6,
        conv_kernel: int = 0,
    ):
        super().__init__()
        if min(dim, heads, head_dim, landmarks) < 1:
            raise ValueError(
                f"dim, heads, head_dim and landmarks must be positive, got {dim}, {heads}, {head_dim}, {landmarks}"
            )
        if pinv_iterations < 0:
            raise ValueError(f"pinv_iterations must be >= 0, got {pinv_iterations}")
        if conv_kernel < 0 or (conv_kernel > 0 and conv_kernel % 2 == 0):
            raise ValueError(f"conv_kernel must be 0 (off) or odd (same-length output), got {conv_kernel}")
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.landmarks, self.pinv_iterations, self.conv_kernel = landmarks, pinv_iterations, conv_kernel
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)
        # One (conv_kernel × 1) filter per head, sliding along the sequence and shared over D (official code).
        self.conv = (
            nn.Conv2d(heads, heads, (conv_kernel, 1), padding=(conv_kernel // 2, 0), groups=heads, bias=False)
            if conv_kernel
            else None
        )

    def extra_repr(self) -> str:
        return (
            f"heads={self.heads}, head_dim={self.head_dim}, landmarks={self.landmarks}, "
            f"pinv_iterations={self.pinv_iterations}, conv_kernel={self.conv_kernel}"
        )

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
    ):
        if causal:
            raise ValueError(
                "NystromAttention has no causal form: each landmark averages a whole segment, "
                "future tokens included, so causal=True cannot be honoured"
            )
        b, n, _ = x.shape
        check_padding_mask(key_padding_mask, b, n)
        valid = (
            torch.ones(b, n, dtype=torch.bool, device=x.device) if key_padding_mask is None else ~key_padding_mask
        )  # (B, N)
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3×(B, H, N, D)
        # Softmax, pseudo-inverse and products in float32 at least (float64 kept), even under autocast.
        with torch.autocast(device_type=x.device.type, enabled=False):
            compute = torch.promote_types(q.dtype, torch.float32)
            y, density = self.attend(q.to(compute), k.to(compute), v.to(compute), valid, generator)
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        return self.out(y), {"density": density}

    def attend(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, generator: Optional[torch.Generator]):
        """(B, H, N, D) ×3, (B, N) valid → y (B, H, N, D), density (H,)."""
        b, h, n, d = q.shape
        n_land = self.landmarks
        seg = -(-n // n_land)  # C = ⌈N/K⌉
        pad = seg * n_land - n  # pad to N' = K·C; the padding is masked like key padding
        q = q / math.sqrt(d)  # the 1/√D of every score, folded into Q (and so into Q̃)
        if pad == 0 and bool(valid.all()):
            # Nothing to mask: every segment is full, so a landmark is a plain segment mean and every softmax
            # row has all its entries admissible (the masked path below gives the same values, at 3 more
            # passes over each N×K matrix).
            q_land = q.view(b, h, n_land, seg, d).mean(3)  # (B, H, K, D)
            k_land = k.view(b, h, n_land, seg, d).mean(3)  # (B, H, K, D)
            f = (q @ k_land.transpose(-1, -2)).softmax(-1)  # (B, H, N, K)
            a = (q_land @ k_land.transpose(-1, -2)).softmax(-1)  # (B, H, K, K)
            bk = (q_land @ k.transpose(-1, -2)).softmax(-1)  # (B, H, K, N)
        else:
            q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))  # (B, H, N', D)
            valid = F.pad(valid, (0, pad), value=False)  # (B, N')
            w = valid.to(q.dtype)[:, None, :, None]  # (B, 1, N', 1)
            v = v * w  # padded values are never read, not even by the conv skip

            # Segment means over valid tokens only (Eq. 13-14); an all-padding segment gives no landmark.
            count = w.view(b, 1, n_land, seg, 1).sum(3)  # (B, 1, K, 1)
            q_land = (q * w).view(b, h, n_land, seg, d).sum(3) / count.clamp_min(1)  # (B, H, K, D)
            k_land = (k * w).view(b, h, n_land, seg, d).sum(3) / count.clamp_min(1)  # (B, H, K, D)
            has_land = count[..., 0] > 0  # (B, 1, K)

            f = masked_softmax(q @ k_land.transpose(-1, -2), has_land[:, :, None, :])  # (B, H, N', K)
            a = masked_softmax(q_land @ k_land.transpose(-1, -2), has_land[..., :, None] & has_land[..., None, :])
            a = a + torch.diag_embed((~has_land).to(a.dtype))  # (B, H, K, K): identity block on empty landmarks
            bk = masked_softmax(q_land @ k.transpose(-1, -2), has_land[..., :, None] & valid[:, None, None, :])
            # bk: (B, H, K, N'), padded keys never weighted
        if self.training:
            f = generator_dropout(f, self.dropout, generator)
        y = f @ (iterative_pinv(a, self.pinv_iterations) @ (bk @ v))  # (B, H, N', D), right to left
        if self.conv is not None:
            y = y + self.conv(v)  # (B, H, N', D): depthwise over the sequence, per head
        y = y[:, :, :n]  # (B, H, N, D)

        density = valid.any().float().expand(h).clone()  # (H,): see "Density" in the module docstring
        return y, density
