"""Approximation error of the linear-cost baselines against exact softmax attention, by budget.

    python -m experiments.approx_error [--seq-len 1024] [--head-dim 32] [--heads 4] [--draws 4] [--seed 0]

One table, also written to OUT/approx_error.md: ‖approx − exact‖_F / ‖exact‖_F, mean ± std over
draws, for each method and budget at two temperatures. Inputs: per head, q and k entries N(0, σ²), v
entries N(0, 1), so the exact scores qᵀk/√D have standard deviation σ²; σ = 0.58 (flat attention)
and σ = 1 (peaked). Uniform attention (every query outputs the mean of V) is the reference row: a
method is informative only below it.

Only the attention approximation is measured: every method runs through its ordinary forward on the
same per-head (Q, K, V), with its query/key/value and output projections set to the identity
(``identity_projections``), and its own randomness drawn fresh for every draw from one seeded
generator:
- performer: FAVOR+ with new orthogonal random features (``PerformerAttention.redraw_features``);
- linformer: E, F are *learned* in a model. Untrained, we use random Gaussian E, F with i.i.d. N(0,
  1/k) entries (the Johnson-Lindenstrauss construction behind the paper's Theorem 2, without its δ
  scalings), so this row shows what a random length projection gives, not what a trained Linformer
  reaches. Its output is a mix of rows of F·V, not of V, with norms √(N/k) times those of V, so its
  error stays far above 1. A second row uses the mean-pooling projection the paper lists among its
  "general projections" (§4; row r of E = F averages the r-th of k equal segments): attention over
  segment means, an untrained counterpart whose output does stay a mix of values;
- nystromformer: segment-means landmarks, its default iterative pseudo-inverse, no conv skip;
- reformer: LSH attention uses shared QK (keys are the normalised queries, a token does not attend
  to itself while it has other keys), so its exact reference is that shared-QK attention with all
  keys, not the Q/K rows' reference. Its queries get entries N(0, σ⁴·D) so that the exact scores
  again have standard deviation σ²; it has its own uniform-attention row;
- linear attention (elu + 1) is not an approximation of softmax but a different kernel; its row says
  how far that kernel is from softmax on these inputs.
"""
import math
import sys
import time

import torch
import torch.nn.functional as F
from tabulate import tabulate

from baselines.full import FullAttention
from baselines.linear import LinearAttention
from baselines.linformer import LinformerAttention
from baselines.nystromformer import NystromAttention
from baselines.performer import PerformerAttention
from baselines.reformer import ReformerAttention
from bench import cli

SIGMAS = (0.58, 1.0)
BUDGETS = (16, 32, 64, 128, 256, 512)
HASH_ROUNDS = (1, 2, 4, 8)
BUCKET_SIZE = 64


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return ((approx - exact).norm() / exact.norm()).item()


def shared_qk_attention(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exact shared-QK attention as Reformer defines it: keys q_j/‖q_j‖, self excluded (other keys exist)."""
    scores = q @ F.normalize(q, dim=-1).transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, N, N)
    self_pair = torch.eye(q.shape[-2], dtype=torch.bool)
    return scores.masked_fill(self_pair, torch.finfo(scores.dtype).min).softmax(-1) @ v


def identity_projections(module: torch.nn.Module, heads: int, d: int) -> torch.nn.Module:
    """Make ``module.forward`` attend on given per-head tensors: its input projections become slices of the
    identity (x = [Q | K | V] for a ``qkv`` projection, x = [Q | V] for Reformer's shared ``qk`` and ``v``), its
    output projection [I; 0], so forward(x) returns the attention output in its first H·D channels."""
    names = ("qkv",) if hasattr(module, "qkv") else ("qk", "v")
    width = heads * d
    with torch.no_grad():
        offset = 0
        for name in names:
            layer = getattr(module, name)
            layer.weight.zero_()
            layer.bias.zero_()
            for block in range(layer.out_features // width):  # q, k, v blocks of one qkv projection
                layer.weight[block * width:(block + 1) * width, offset:offset + width] = torch.eye(width)
                offset += width
        assert offset == module.out.out_features, "the module's dim must be the width of [Q | K | V]"
        module.out.weight.zero_()
        module.out.bias.zero_()
        module.out.weight[:width] = torch.eye(width)
    return module.eval()


def drive(module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, generator) -> torch.Tensor:
    """forward of a module prepared by ``identity_projections`` on (B, H, N, D) tensors → (B, H, N, D)."""
    b, h, n, d = q.shape
    tokens = [t.transpose(1, 2).reshape(b, n, h * d) for t in ((q, v) if hasattr(module, "qk") else (q, k, v))]
    y, _ = module(torch.cat(tokens, dim=-1), generator=generator)  # (B, N, dim)
    return y[..., :h * d].view(b, n, h, d).transpose(1, 2)


def build_cases(heads: int, d: int, n: int):
    """[(method, budget label, reference, fn(q, k, v, generator) -> (B, H, N, D))], reference 'qk' or 'shared'."""
    dim, shared_dim = 3 * heads * d, 2 * heads * d  # widths of [Q | K | V] and [Q | V]
    cases = [("uniform (mean of V)", "—", "qk", lambda q, k, v, g: v.mean(-2, keepdim=True).expand_as(v))]
    linear = identity_projections(LinearAttention(dim, heads, d), heads, d)
    cases.append(("linear attention (elu+1)", "—", "qk", lambda q, k, v, g: drive(linear, q, k, v, g)))
    for m in BUDGETS:
        performer = identity_projections(PerformerAttention(dim, heads, d, features=m), heads, d)

        def run_performer(q, k, v, g, performer=performer):
            performer.redraw_features(g)  # eval mode keeps features fixed; a fresh draw per (Q, K, V) draw
            return drive(performer, q, k, v, g)
        cases.append(("performer (FAVOR+)", f"features={m}", "qk", run_performer))
    for rank in BUDGETS:
        linformer = identity_projections(LinformerAttention(dim, heads, d, rank=rank, max_len=n), heads, d)

        def run_linformer(q, k, v, g, linformer=linformer, rank=rank):
            linformer.E.copy_(torch.randn(rank, n, generator=g) / math.sqrt(rank))  # i.i.d. N(0, 1/k)
            linformer.F.copy_(torch.randn(rank, n, generator=g) / math.sqrt(rank))
            return drive(linformer, q, k, v, g)
        cases.append(("linformer (random E, F)", f"rank={rank}", "qk", run_linformer))
    for rank in BUDGETS:
        pooled = identity_projections(LinformerAttention(dim, heads, d, rank=rank, max_len=n), heads, d)
        with torch.no_grad():  # row r averages the positions of segment r (§4's "general projections")
            segment = F.one_hot(torch.arange(n) * rank // n, rank).T.float()  # (K, N)
            pooled.E.copy_(segment / segment.sum(1, keepdim=True).clamp_min(1))
            pooled.F.copy_(pooled.E)
        cases.append(("linformer (mean-pooling E, F)", f"rank={rank}", "qk",
                      lambda q, k, v, g, pooled=pooled: drive(pooled, q, k, v, g)))
    for landmarks in BUDGETS:
        nystrom = NystromAttention(dim, heads, d, landmarks=landmarks)
        nystrom = identity_projections(nystrom, heads, d)
        cases.append(("nystromformer", f"landmarks={landmarks}", "qk",
                      lambda q, k, v, g, nystrom=nystrom: drive(nystrom, q, k, v, g)))
    cases.append(("uniform, shared-QK reference", "—", "shared",
                  lambda q, k, v, g: v.mean(-2, keepdim=True).expand_as(v)))
    for rounds in HASH_ROUNDS:
        reformer = ReformerAttention(shared_dim, heads, d, n_hashes=rounds, bucket_size=BUCKET_SIZE)
        reformer = identity_projections(reformer, heads, d)
        budget = f"n_hashes={rounds}, bucket_size={BUCKET_SIZE}"
        cases.append(("reformer (LSH, shared QK)", budget, "shared",
                      lambda q, k, v, g, reformer=reformer: drive(reformer, q, k, v, g)))
    return cases


def main(argv=None) -> int:
    parser = cli.parser("python -m experiments.approx_error", "Relative error of the approximating baselines to exact "
                                                        "softmax attention, by budget, at two temperatures.")
    parser.add_argument("--seq-len", type=cli.length, default=1024, help="sequence length")
    parser.add_argument("--head-dim", type=cli.width, default=32, help="size of each head")
    parser.add_argument("--heads", type=cli.layers, default=4, help="independent heads per draw")
    parser.add_argument("--draws", type=cli.positive_int, default=4,
                        help="draws of (Q, K, V) and of each method's randomness")
    parser.add_argument("--seed", type=cli.seed, default=0, help="seed of the one generator every draw uses")
    parser.add_argument("--out", metavar="DIR", default="runs/approx_error",
                        help="folder for the table (approx_error.md)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    g = torch.Generator().manual_seed(args.seed)
    cases = build_cases(args.heads, args.head_dim, args.seq_len)
    errors = {(i, sigma): [] for i in range(len(cases)) for sigma in SIGMAS}  # case, σ → one error per draw
    shape = (1, args.heads, args.seq_len, args.head_dim)  # (B, H, N, D)
    with torch.no_grad():
        for sigma in SIGMAS:
            for _ in range(args.draws):
                q, k, v = sigma * torch.randn(shape, generator=g), sigma * torch.randn(shape, generator=g), \
                    torch.randn(shape, generator=g)
                shared_q = sigma ** 2 * math.sqrt(args.head_dim) * torch.randn(shape, generator=g)
                exact = {"qk": FullAttention.reference_core(q, k, v, None, None, 0.0),
                         "shared": shared_qk_attention(shared_q, v)}
                for i, (_, _, reference, fn) in enumerate(cases):
                    approx = fn(shared_q, shared_q, v, g) if reference == "shared" else fn(q, k, v, g)
                    errors[i, sigma].append(relative_error(approx, exact[reference]))

    def cell(values):
        values = torch.tensor(values)
        return f"{values.mean():.3f} ± {values.std():.3f}" if len(values) > 1 else f"{values.mean():.3f}"

    rows = [[method, budget] + [cell(errors[i, sigma]) for sigma in SIGMAS]
            for i, (method, budget, _, _) in enumerate(cases)]
    text = (f"‖approx − exact‖/‖exact‖, n={args.seq_len}, d={args.head_dim}, {args.heads} heads × {args.draws} "
            f"draws, seed {args.seed}, {time.perf_counter() - started:.0f} s, torch {torch.__version__}\n"
            + tabulate(rows, headers=["method", "budget"] + [f"σ = {sigma}" for sigma in SIGMAS], tablefmt="github"))
    print(text)
    path = cli.out_file(args.out, "approx_error.md")
    path.write_text(text + "\n")
    print(f"wrote {path}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
