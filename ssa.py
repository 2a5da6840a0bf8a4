"""Stochastically Subsampled self-Attention (SSA): train on a random sub-model of the attention graph.

Hussain, Zaki, Subramanian, "The Information Pathways Hypothesis: Transformers are Dynamic Self-Ensembles", KDD 2023,
arXiv 2306.01705 (no code was released). Attention carries one merged bias, A = softmax(QKᵀ/√D + B), B = M + R
(mask + relative position, Eq. 2). In training each target (query) attends to a subset P of the sources (keys and
values), one draw per layer and step shared by every head and the whole batch (§3.3), and the bias is re-indexed with
the sources, B̃ = B[:, P], so ALiBi, the causal mask and padding see ORIGINAL positions (Alg. 1 line 8, Alg. 2 line 7):
    unbiased (Alg. 1)        P = randperm(N)[:k], k = p·N: every target attends to the same k sources;
    locally biased (Alg. 2)  P = argsort(i + n_i), n_i ~ N(0, σ²) (Eq. 3); target window i of W (N/W targets each)
                             attends to slot i of P, P[iN/W:(i+1)N/W]: only W diagonal blocks are built, cost / W;
    causal (§3.3)            window i draws Eq. 3 over its prefix [0, (i+1)N/W) and keeps its slot, the last N/W ranks;
    2-D grid (§3.3, B.2)     Eq. 3 on the column index within each row, then on the row index within each column;
                             windows are bands of R/W consecutive rows.
Inference is dense with the same bias (§3.4); +FT trains densely for the last fraction of the steps (§4.1: 10 %).
Self-ensembling (§3.5) averages the predicted probabilities of n sampled sub-models. Per layer (App. B.1): SSA on
the last ℓ layers (S<ℓ>-L<w>), σ a fraction of the length ramped over them. U<x> names the percentage of sources
DROPPED (§4.3: "-U20" keeps 80 %); `--unbiased` takes the kept fraction p. The locally biased form is the paper's
for language modelling, where a byte's evidence is mostly near it, with a dense fine-tuning tail (+FT); a task that
needs far keys learns nothing with it (a copy task stayed at chance, unbiased=0.5 learned it): there take `unbiased`.

    python ssa.py --task enwik8                                  # S<depth>-L4, σ 0.1 → 0.225, CPU preset
    python ssa.py --task enwik8 --preset paper --depth 16 --ssa-layers 12 --finetune-fraction 0.1  # S12-L4+FT
    python ssa.py --task enwik8 --ensemble-samples 50            # + self-ensembled valid/test (Table 4)
    python ssa.py --task listops --unbiased 0.8                  # S<depth>-U20 (Alg. 1)
    python ssa.py --task listops --seq-len 256 --grid 16x16      # 2-D variant (any length R·C)
    python -m pytest tests/test_ssa.py -q                        # `python -m bench.train --method ssa` is the same

Shape legend: B batch, H heads, N queries, M keys, D head dim, W windows, K sources per window,
Nw = N/W queries per window, R×C grid rows × columns.
"""

import argparse
import contextlib
import math
import sys
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from alibi import alibi_bias, alibi_slopes

PATHS = ("fast", "reference")
SAMPLING = ("training", "never", "always")  # when a layer draws sub-models: SSA in training, dense, self-ensembling


def _grid(text: str) -> Tuple[int, int]:
    rows, sep, cols = text.lower().partition("x")
    if not (sep and rows.isdigit() and cols.isdigit()):
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS, e.g. 32x32, got {text!r}")
    return int(rows), int(cols)


@dataclass
class SSAConfig:
    """The SSA settings of a model (App. B): which layers sample, how, and the training procedures. Each field is
    also an option of `python ssa.py` (its metadata: the flag where it differs from the name, and the help)."""

    layers: Optional[int] = field(
        default=None,
        metadata={
            "flag": "--ssa-layers",
            "metavar": "L",
            "help": "ℓ: SSA on the last ℓ layers (S<ℓ>), dense below (default: all layers)",
        },
    )
    windows: int = field(default=4, metadata={"help": "w: windows of locally biased SSA (L<w>); 1 = dense-equivalent"})
    sigma: Tuple[float, float] = field(
        default=(0.1, 0.225),
        metadata={
            "type": float,
            "nargs": "+",
            "metavar": "S",
            "help": "σ / length (grid: / each side) in the first and last sampled layer (enwik8); one value: both",
        },
    )
    unbiased: Optional[float] = field(
        default=None,
        metadata={
            "metavar": "P",
            "help": "unbiased SSA keeping a fraction P of the sources (the paper's U<100(1-P)>), "
            "replacing the local bias",
        },
    )
    grid: Optional[Tuple[int, int]] = field(
        default=None,
        metadata={
            "type": _grid,
            "metavar": "RxC",
            "help": "2-D variant: tokens form an R×C grid row by row; windows are bands of rows",
        },
    )
    alibi: bool = field(
        default=True,
        metadata={
            "help": "the ALiBi bias (without it only masks are re-indexed); with ALiBi a language model has no "
            "positional embeddings unless --pos-emb true (App. B.1)"
        },
    )
    path: str = field(
        default="fast",
        metadata={
            "choices": PATHS,
            "help": "the attention core: fast (SDPA) or reference (materialised scores; same results)",
        },
    )
    finetune_fraction: float = field(
        default=0.0,
        metadata={"metavar": "F", "help": "+FT: dense attention for the last fraction F of the steps (paper: 0.1)"},
    )
    ensemble_samples: int = field(
        default=0,
        metadata={
            "metavar": "K",
            "help": "also report self-ensembled valid/test metrics with K sub-models (paper: 50)",
        },
    )

    def __post_init__(self):
        if len(self.sigma) not in (1, 2):
            raise ValueError(f"sigma takes one value or two (first and last sampled layer), got {self.sigma}")
        self.sigma = (self.sigma[0], self.sigma[-1])
        if self.layers is not None and self.layers < 0:
            raise ValueError(f"layers must be >= 0, got {self.layers}")
        if self.windows < 1:
            raise ValueError(f"windows must be >= 1, got {self.windows}")
        if not all(math.isfinite(s) and s >= 0 for s in self.sigma):
            raise ValueError(f"sigma must be finite and >= 0, got {self.sigma}")
        if self.unbiased is not None and not 0.0 < self.unbiased <= 1.0:
            raise ValueError(f"unbiased keep fraction must be in (0, 1], got {self.unbiased}")
        if not 0.0 <= self.finetune_fraction <= 1.0:
            raise ValueError(f"finetune_fraction must be in [0, 1], got {self.finetune_fraction}")
        if self.ensemble_samples < 0:
            raise ValueError(f"ensemble_samples must be >= 0, got {self.ensemble_samples}")

    def sampled_layers(self, num_layers: int) -> int:
        """ℓ for a model of `num_layers` layers."""
        if self.layers is not None and self.layers > num_layers:
            raise ValueError(f"SSA on the last {self.layers} layers needs at least that many, got {num_layers}")
        return num_layers if self.layers is None else self.layers

    def name(self, num_layers: int) -> str:
        """The paper's setting name, e.g. S12-L4 or S6-U20 (Table 1, Table 3)."""
        layers = self.sampled_layers(num_layers)
        if layers == 0:
            return "S0"  # dense everywhere
        scheme = f"U{round(100 * (1 - self.unbiased))}" if self.unbiased is not None else f"L{self.windows}"
        return f"S{layers}-{scheme}"


def _randn(shape, generator: Optional[torch.Generator], device) -> Tensor:
    """Standard normal draws from `generator` (on its own device), moved to `device`."""
    source = generator.device if generator is not None else device
    return torch.randn(shape, generator=generator, device=source).to(device)


# ------------------------------------------------- reference path: the sources of each window (Alg. 1, Alg. 2, Eq. 3)


def window_sources(
    rows: int,
    cols: int,
    windows: int,
    sigma_rows: float,
    sigma_cols: float,
    causal: bool,
    generator: Optional[torch.Generator] = None,
    device=None,
) -> Tensor:
    """(W, K) original positions of each target window's sources, K = R·C/W: the paper's
    localrandperm(N, w, σ) (Alg. 2 line 1, Eq. 3) cut into its w slots, for an R×C grid flattened row by
    row whose windows are bands of R/W rows (1-D: R = N, C = 1).

    σ are absolute (in rows / columns); σ_rows = ∞ is an unbiased shuffle. Non-causal: one draw whose
    slots partition the sources (Alg. 2). Causal: one draw per window over its prefix (§3.3), so sources may repeat
    across windows or be missed, never within one; no row is empty (the first row of window i has N/W − 1 future
    sources in its prefix but N/W distinct draws).
    2-D, our reading of §3.3 and App. B.2: "partition the grid vertically into w windows" = bands of R/W rows ("4
    windows of 8 rows" for 32×32), contiguous when flattened; "shuffling both horizontally and vertically" = Eq. 3 on
    the column index within each row, then on the row index within each column. A window takes its band of rows of
    every column, so its sources are not whole rows; causal: only the vertical shuffle is cut at the band's end."""
    assert rows % windows == 0, f"{rows} rows do not split into {windows} windows"
    band, draws = rows // windows, (windows if causal else 1)
    flat = torch.arange(rows * cols, device=device).view(1, rows, cols).expand(draws, rows, cols)  # (·, R, C)
    if cols > 1:  # horizontal: Eq. 3 on the column index, each row sorted on its own
        col_keys = torch.arange(cols, device=device) + sigma_cols * _randn((draws, rows, cols), generator, device)
        flat = flat.gather(2, col_keys.argsort(dim=2))  # (·, R, C)
    row = torch.arange(rows, device=device, dtype=torch.float32)[:, None]  # (R, 1)
    noise = _randn((draws, rows, cols), generator, device)
    row_keys = noise if math.isinf(sigma_rows) else row + sigma_rows * noise  # (·, R, C), Eq. 3 per column
    if causal:  # window i draws only from rows before its band's end: later rows sort last, past its slot
        end = band * torch.arange(1, windows + 1, device=device)[:, None, None]  # (W, 1, 1)
        row_keys = row_keys.masked_fill(row >= end, math.inf)
    order = row_keys.argsort(dim=1).view(draws, windows, band, cols)  # gather order of each column's rows
    window = torch.arange(windows, device=device)
    draw = window if causal else torch.zeros_like(window)
    picked = order[draw, window]  # (W, R/W, C): slot i of window i's draw
    return flat[draw].gather(1, picked).reshape(windows, band * cols)  # (W, K)


def unbiased_sources(n: int, keep: float, generator: Optional[torch.Generator] = None, device=None) -> Tensor:
    """(1, k) Alg. 1 lines 1–2: a random permutation truncated to k = round(p·N) ≥ 1 sources."""
    source = generator.device if generator is not None else device
    k = max(1, round(keep * n))
    return torch.randperm(n, generator=generator, device=source)[:k].to(device)[None]


# ---------------------------------------------------------------------- the attention on the drawn windows (Alg. 2)


class SSAttention(nn.Module):
    """Multi-head attention with SSA (INTERFACE.md). Budget: `windows` (w), `sigma` (σ / length),
    `unbiased` (keep fraction p, replaces local bias: the form for a model of your own, see the module docstring),
    `grid` (R, C), `alibi`.

    `sampling`: "training" = SSA while training, dense in eval (§3.4, the default); "never" = always dense (+FT,
    layers outside the last ℓ); "always" = SSA in eval too (§3.5). `sampled_layer` records whether the
    layer was built to sample; self_ensemble() samples those layers only."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dropout: float = 0.0,
        *,
        windows: int = SSAConfig.windows,
        sigma: float = 0.1,
        unbiased: Optional[float] = None,
        grid: Optional[Tuple[int, int]] = None,
        alibi: bool = SSAConfig.alibi,
        path: str = SSAConfig.path,
        sampling: str = "training",
    ):
        super().__init__()
        if min(dim, heads, head_dim, windows) < 1:
            raise ValueError(f"dim, heads, head_dim, windows must be positive, got {dim, heads, head_dim, windows}")
        if not (math.isfinite(sigma) and sigma >= 0) or (unbiased is not None and not 0.0 < unbiased <= 1.0):
            raise ValueError(f"need a finite sigma >= 0 and unbiased in (0, 1], got {sigma}, {unbiased}")
        if grid is not None and (len(grid) != 2 or grid[0] % windows != 0):
            raise ValueError(f"grid (rows, cols) needs rows divisible by windows={windows}, got {grid}")
        if path not in PATHS or sampling not in SAMPLING:
            raise ValueError(f"path must be one of {PATHS} and sampling one of {SAMPLING}, got {path!r}, {sampling!r}")
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        self.windows, self.sigma, self.unbiased, self.grid = windows, sigma, unbiased, grid
        self.alibi, self.path, self.sampling = alibi, path, sampling
        self.sampled_layer = sampling != "never"
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)
        self.register_buffer("slopes", alibi_slopes(heads), persistent=False)

    def extra_repr(self) -> str:
        scheme = (
            f"unbiased={self.unbiased}"
            if self.unbiased is not None
            else f"windows={self.windows}, sigma={self.sigma:.4g}, grid={self.grid}"
        )
        return f"heads={self.heads}, head_dim={self.head_dim}, {scheme}, alibi={self.alibi}, path={self.path}, sampling={self.sampling}"

    def subsampling(self) -> bool:
        """Whether this forward subsamples (SSA) rather than attending densely."""
        return self.sampling == "always" or (self.sampling == "training" and self.training)

    def num_windows(self, causal: bool) -> int:
        """W, the number of target windows of one SSA draw."""
        if self.unbiased is None:
            return self.windows
        if not causal:
            return 1
        # Causal unbiased SSA is not specified (App. D trains it "using 2 or 4 window attention for 50% or 25%"):
        # ours is causal local SSA with σ = ∞ and W = 1/p windows, a uniform draw from each window's prefix.
        windows = round(1 / self.unbiased)
        if abs(windows * self.unbiased - 1) > 1e-6:
            raise ValueError(f"causal unbiased SSA runs 1/p windows; p={self.unbiased} is not 1/integer")
        return windows

    def draw_sources(self, n: int, causal: bool, generator: Optional[torch.Generator] = None, device=None) -> Tensor:
        """(W, K) original positions of each window's sources for a length-N input (N divisible by W)."""
        if self.unbiased is not None and not causal:
            return unbiased_sources(n, self.unbiased, generator, device)
        windows = self.num_windows(causal)
        rows, cols = self.grid if self.grid is not None and self.unbiased is None else (n, 1)
        if rows * cols != n:
            raise ValueError(f"grid {self.grid} does not match sequence length {n}")
        sigma_rows = math.inf if self.unbiased is not None else self.sigma * rows
        return window_sources(rows, cols, windows, sigma_rows, self.sigma * cols, causal, generator, device)

    def block_bias(self, query_pos: Tensor, source_pos: Tensor) -> Tensor:
        """(H, W, Nw, K) ALiBi −m_h·|i − j| at the ORIGINAL positions: B[:, P] on the diagonal blocks
        (Alg. 2 lines 7, 11) built directly from the two index tensors, never the N×N matrix."""
        # Ours: ALiBi on the flattened index for every task, symmetric for encoders (as baselines/full.py), where the
        # paper learned a 2-D relative bias for images (App. B.2); encoders keep learned positions (left from right).
        return alibi_bias(self.slopes, query_pos[:, :, None], source_pos[:, None, :])

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        causal: bool = False,
        generator: Optional[torch.Generator] = None,
    ):
        b, n, _ = x.shape
        if key_padding_mask is not None and (key_padding_mask.shape != (b, n) or key_padding_mask.dtype != torch.bool):
            raise ValueError(
                f"key_padding_mask must be a bool tensor of shape {(b, n)}, True at padding; got "
                f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
        sample = self.subsampling()
        windows = self.num_windows(causal) if sample else 1
        padded = -(-n // windows) * windows  # ours: N pads to a multiple of W; the pad is key padding
        valid = (
            torch.ones(1, n, dtype=torch.bool, device=x.device) if key_padding_mask is None else ~key_padding_mask
        )  # (B|1, N)
        if padded != n:
            x = F.pad(x, (0, 0, 0, padded - n))
            valid = F.pad(valid, (0, padded - n), value=False)
        q, k, v = self.qkv(x).view(b, padded, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3×(B,H,N,D)
        with torch.no_grad():
            if sample:
                source_pos = self.draw_sources(padded, causal, generator, x.device)  # (W, K)
            else:  # dense: one window holding every source, the same code path and bias
                source_pos = torch.arange(padded, device=x.device)[None]  # (1, M)
            query_pos = torch.arange(padded, device=x.device).view(windows, -1)  # (W, Nw)
            allowed, empty = None, None  # None: every computed pair is admissible (nothing to mask)
            density = torch.tensor(source_pos.shape[1] / padded, device=x.device)
            if causal or key_padding_mask is not None or padded != n:
                allowed = valid[:, source_pos][:, :, None, :]  # (B|1, W, 1, K): padded sources get no weight
                if causal:  # the mask follows the sources: source j is admissible for query i iff j ≤ i
                    allowed = allowed & (source_pos[:, None, :] <= query_pos[:, :, None])  # (B|1, W, Nw, K)
                allowed = allowed.expand(-1, -1, query_pos.shape[1], -1)  # (B|1, W, Nw, K)
                density = self.density(allowed, valid[:, query_pos], valid, b)
                empty = ~allowed.any(-1, keepdim=True)  # (B|1, W, Nw, 1): rows with no admissible source
                allowed = allowed | empty  # every source a dummy for such a row: no row all −inf; zeroed below
        qw = q.reshape(b, self.heads, windows, -1, self.head_dim)  # (B, H, W, Nw, D)
        if sample:  # Alg. 2 lines 3, 9–10: the sources of every window, in their drawn order. Alg. 1/2 gather X,
            # then project; we project, then gather: the same result with one fused QKV
            kw, vw = k[:, :, source_pos], v[:, :, source_pos]  # (B, H, W, K, D)
        else:  # dense: the identity gather, as a view
            kw, vw = k[:, :, None], v[:, :, None]  # (B, H, 1, M, D)
        bias = self.block_bias(query_pos, source_pos) if self.alibi else None  # (H, W, Nw, K)
        p_drop = self.dropout if self.training else 0.0
        if self.path == "fast" and p_drop == 0.0:  # SDPA's dropout would not use `generator`: reference path then
            y = self.fast_core(qw, kw, vw, allowed, bias)
        else:
            y = self.reference_core(qw, kw, vw, allowed, bias, p_drop, generator)
        if empty is not None:  # ours (the paper leaves padding out): a query with no admissible source outputs zeros,
            y = y.masked_fill(empty[:, None], 0.0)  # also a window that drew only padded sources (one draw per batch)
        y = y.reshape(b, self.heads, padded, self.head_dim)[:, :, :n]  # (B, H, N, D): Alg. 2 line 13
        y = y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)  # (B, N, H·D)
        return self.out(y), {"density": density.expand(self.heads).clone()}

    @staticmethod
    def density(allowed: Tensor, valid_query: Tensor, valid: Tensor, batch: int) -> Tensor:
        """() admissible computed pairs of valid queries / (valid queries × valid keys), batch-summed (INTERFACE.md;
        as baselines/full.py: causal dense ≈ (N+1)/(2N)). allowed (B|1, W, Nw, K), valid_query (B|1, W, Nw),
        valid (B|1, N)."""
        repeat = batch // allowed.shape[0]  # an unpadded batch carries one shared (1, …) mask
        pairs = (allowed.sum(-1, dtype=torch.float64) * valid_query).sum() * repeat
        total = (valid.sum(-1, dtype=torch.float64) ** 2).sum() * (batch // valid.shape[0])
        return (pairs / total.clamp_min(1)).to(torch.float32)

    @staticmethod
    def reference_core(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        allowed: Optional[Tensor],
        bias: Optional[Tensor],
        p_drop: float,
        generator: Optional[torch.Generator],
    ) -> Tensor:
        """The reference core: softmax(Q_w K_wᵀ/√D + B̃_w) V_w (Alg. 2 line 12) with the (B, H, W, Nw, K) scores
        materialised, softmax in float32 (autocast off: it would run the score product, and so the softmax, in its
        lower precision); the dropout mask comes from `generator`."""
        compute = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            scores = (q.to(compute) @ k.to(compute).transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B,H,W,Nw,K)
            if bias is not None:
                scores = scores + bias
            if allowed is not None:
                scores = scores.masked_fill(~allowed[:, None], torch.finfo(compute).min)
            probs = scores.softmax(-1)
            if p_drop > 0.0:
                source = generator.device if generator is not None else probs.device  # drawn where the generator is
                keep = torch.rand(probs.shape, generator=generator, device=source).to(probs.device) >= p_drop
                probs = probs * keep / (1.0 - p_drop)
        return probs.to(v.dtype) @ v  # (B, H, W, Nw, D)

    # ------------------------------------------------------------------------ fast path: the same core through SDPA
    @staticmethod
    def fast_core(q: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
        """The same through SDPA, the windows folded into the head axis (CPU SDPA's fast kernels are 4-D)."""
        b, h, w, nw, d = q.shape
        mask = None if bias is None else bias.to(q.dtype)[None]  # (1, H, W, Nw, K)
        if allowed is not None:  # −inf, not finfo.min: a float16 score can pass finfo(float16).min = −65504 in
            # size and let a masked source through; every row keeps a source (a dummy one for an empty row)
            mask = allowed[:, None] if mask is None else mask.masked_fill(~allowed[:, None], -math.inf)
        if mask is not None:
            mask = mask.expand(-1, h, -1, -1, -1).reshape(mask.shape[0], h * w, nw, -1)  # (B|1, H·W, Nw, K)
        y = F.scaled_dot_product_attention(
            q.reshape(b, h * w, nw, d), k.reshape(b, h * w, -1, d), v.reshape(b, h * w, -1, d), attn_mask=mask
        )  # (B, H·W, Nw, D)
        return y.view(b, h, w, nw, d)


# ------------------------------------------------------------------------------------------- model pieces


def layer_sigma(cfg: SSAConfig, layer_index: int, num_layers: int) -> float:
    """σ / length of a layer: linear from cfg.sigma[0] at the first sampled layer to cfg.sigma[1] at the
    deepest (App. B.1)."""
    # Ours: the ramp spans the sampled layers only (App. B.1 does not say which layers S12 of 16 ramps over).
    layers = cfg.sampled_layers(num_layers)
    first = num_layers - layers
    t = (layer_index - first) / (layers - 1) if layers > 1 else 0.0
    return cfg.sigma[0] + (cfg.sigma[1] - cfg.sigma[0]) * min(max(t, 0.0), 1.0)


def make_attention_factory(
    cfg: SSAConfig, dim: int, heads: int, head_dim: int, dropout: float, num_layers: int
) -> Callable[[int], SSAttention]:
    """The backbone's `make_attention(layer_index)`: SSA on the last ℓ layers (S<ℓ>), the same module in
    "never" sampling below them, so S0 is the dense model with the same bias."""
    layers = cfg.sampled_layers(num_layers)

    def make_attention(layer_index: int) -> SSAttention:
        assert 0 <= layer_index < num_layers, f"layer {layer_index} outside 0..{num_layers - 1}"
        sampled = layer_index >= num_layers - layers
        return SSAttention(
            dim,
            heads,
            head_dim,
            dropout,
            windows=cfg.windows,
            sigma=layer_sigma(cfg, layer_index, num_layers),
            unbiased=cfg.unbiased,
            grid=cfg.grid,
            alibi=cfg.alibi,
            path=cfg.path,
            sampling="training" if sampled else "never",
        )

    return make_attention


def ssa_modules(model: nn.Module):
    return [m for m in model.modules() if isinstance(m, SSAttention)]


# -------------------------------------------------------------------------------------- method procedures


def fine_tune_start(total_steps: int, fraction: float) -> int:
    """The first step (0-based) of the +FT dense tail: the last round(fraction·total_steps) steps."""
    return total_steps - round(fraction * total_steps)


@torch.no_grad()
@contextlib.contextmanager
def sampling_in_eval(model: nn.Module):
    """Eval mode with the layers built as SSA layers sampling; the others stay dense. Modes restored on exit."""
    # Ours: self-ensembling re-enables sampling also after +FT (Table 4 ensembles +FT models), in eval mode, so
    # dropout is off (the paper does not say).
    modules = [m for m in ssa_modules(model) if m.sampled_layer]
    saved, was_training = [m.sampling for m in modules], model.training
    model.eval()
    for m in modules:
        m.sampling = "always"
    try:
        yield model
    finally:
        for m, sampling in zip(modules, saved):
            m.sampling = sampling
        model.train(was_training)


def ensemble_forward(model: nn.Module, inputs: dict, n_samples: int = 50, generator: Optional[torch.Generator] = None):
    """§3.5: (log of the mean predicted probabilities of `n_samples` SSA sub-models, stats with the density
    averaged over them), sub-models drawn as sampling_in_eval does. `model(**inputs, generator=...)`
    returns (logits, stats); the result has the logits' shape."""
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    total, density = None, 0.0
    with sampling_in_eval(model):
        for _ in range(n_samples):
            logits, stats = model(**inputs, generator=generator)
            log_probs = logits.float().log_softmax(-1)
            total = log_probs if total is None else torch.logaddexp(total, log_probs)  # log Σ p, stably
            density = density + stats["density"] / n_samples
    return total - math.log(n_samples), {"density": density}


def ensemble_sizes(n_samples: int) -> List[int]:
    """The ensemble sizes of a Fig. 7 curve up to n_samples: 1, 2, 4, ... and n_samples itself."""
    return sorted({2**i for i in range(n_samples.bit_length()) if 2**i < n_samples} | {n_samples})


def self_ensemble(
    model: nn.Module,
    tokens: Tensor,
    key_padding_mask: Optional[Tensor] = None,
    n_samples: int = 50,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Log of the mean probabilities of `n_samples` SSA sub-models for `model(tokens, key_padding_mask,
    generator)` (§3.5); see ensemble_forward."""
    inputs = {"tokens": tokens, "key_padding_mask": key_padding_mask}
    return ensemble_forward(model, inputs, n_samples, generator)[0]


# ------------------------------------------------------------------------------------------------- main
def main(argv=None, prog: str = "python ssa.py") -> int:
    """The paper's procedure on the shared training loop (bench/): train on sampled sub-models (§3.3), dense
    attention for the last fraction of the steps (+FT, §3.4), then dense (§3.4) and self-ensembled (§3.5)
    evaluation. It needs the repository's bench/; SSAttention above does not."""
    import importlib.util

    if importlib.util.find_spec("bench") is None:  # this file alone, away from its repository
        sys.exit(
            f"{prog}: training needs the repository's bench/ beside this file (SSAttention needs only torch and alibi.py)"
        )
    from bench import cli, loop, measure
    from bench.tasks import get_task

    cfg, ssa = cli.parse(argv, "ssa", prog, "Train and evaluate SSA (Hussain et al., KDD 2023) on one task.", SSAConfig)
    with cli.one_line_errors():
        task = get_task(cfg.task)
        if ssa.alibi and task.head == "lm":  # App. B.1: the ALiBi decoder has no positional embeddings
            cfg = cfg.with_defaults(pos_emb=False)
        tail = fine_tune_start(cfg.steps, ssa.finetune_fraction)
        run = loop.setup(
            cfg, task, lambda m: make_attention_factory(ssa, m.dim, m.heads, m.head_dim, m.attn_dropout, m.depth)
        )
        loop.train(run, until=tail)  # each step trains one sampled sub-model
        if tail < cfg.steps:  # +FT: the last steps train the dense model
            for module in ssa_modules(run.model):
                module.sampling = "never"
            loop.train(run)
        record = loop.final_record(run)  # evaluated dense: attention-based renormalisation (§3.4)
        if record is not None:
            depth, first = cfg.depth, cfg.depth - ssa.sampled_layers(cfg.depth)
            flops = {}  # Table 1's training compute: one sub-model as a training step draws it

            def sampled(model, inputs):
                with sampling_in_eval(model):
                    return measure.counted_forward(model, inputs, flops)

            result = run.evaluate("valid", 1, forward=sampled)
            record["ssa"] = {
                "setting": ssa.name(depth) + ("+FT" if ssa.finetune_fraction > 0 else ""),
                "finetune_fraction": ssa.finetune_fraction,
                "sigma_per_layer": [layer_sigma(ssa, i, depth) if i >= first else None for i in range(depth)],
                "sampled_flops_per_example": flops,
                "sampled_density": result["density"],
            }
            if ssa.ensemble_samples:  # §3.5, Fig. 7: the metric against the number of sub-models averaged

                def ensemble(n):
                    return run.evaluate(
                        "valid",
                        cfg.final_eval_batches,
                        forward=lambda model, inputs: ensemble_forward(model, inputs, n),
                    )["metric"]

                curve = {n: ensemble(n) for n in ensemble_sizes(ssa.ensemble_samples)}
                test = run.evaluate(
                    "test",
                    cfg.final_eval_batches,
                    forward=lambda model, inputs: ensemble_forward(model, inputs, ssa.ensemble_samples),
                )
                record["ssa"].update(
                    ensemble_curve=curve,
                    ensemble_valid=curve[ssa.ensemble_samples],
                    ensemble_test=test["metric"],
                    ensemble_samples=ssa.ensemble_samples,
                )
        loop.finish(run, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
