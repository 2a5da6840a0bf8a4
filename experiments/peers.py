"""Our baselines beside the public implementations a user would otherwise pick: ours ÷ peer.

    pip install -r requirements-peers.txt      # optional: never a dependency of the repository
    python -m experiments.peers --lengths 1024,4096 --repeats 41 --threads 1

Pairs (ours · peer, same width, heads, head dim and budget; dropout 0; training mode; non-causal):
- full · torch.nn.MultiheadAttention (need_weights=False: the fused path);
- nystromformer (64 landmarks, 6 pseudo-inverse iterations, no conv skip) · nystrom-attention 0.0.14
  (num_landmarks=64, residual=False): the same mathematics, outputs equal to rounding;
- reformer (2 hashes, bucket_size 64) · reformer-pytorch 1.4.4 LSHSelfAttention (n_hashes=2,
  bucket_size=64); ours corrects duplicate pairs exactly (the peer's default does not) and draws one
  rotation per sample, head and round;
- performer (256 features, redraw_interval=0) · performer-pytorch SelfAttention (nb_features=256);
- linformer (rank 256, max_len n) · linformer LinformerSelfAttention (k=256, seq_len=n).
Both sides of each pair run forward+backward once a repetition, in reversed order every other one,
so that load falls on both alike; experiments.scaling's glibc setting belongs in the environment.
"""

import importlib.util
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Tuple

from tabulate import tabulate

from bench import cli
from experiments import scaling

if TYPE_CHECKING:  # torch is imported once the options parse: --help stays light
    import torch

PEER_PACKAGES = ("nystrom_attention", "reformer_pytorch", "performer_pytorch", "linformer")


def pairs(
    n: int, heads: int, head_dim: int
) -> Dict[str, Tuple["torch.nn.Module", Callable, "torch.nn.Module", Callable]]:
    """name → (ours, how to call ours, peer, how to call the peer); each call maps x to the output tensor."""
    import torch
    from baselines.full import FullAttention
    from baselines.linformer import LinformerAttention
    from baselines.nystromformer import NystromAttention
    from baselines.performer import PerformerAttention
    from baselines.reformer import ReformerAttention
    import linformer
    import nystrom_attention
    import performer_pytorch
    import reformer_pytorch

    dim = heads * head_dim
    ours_call = lambda m, x: m(x)[0]  # noqa: E731
    peer_call = lambda m, x: m(x)  # noqa: E731
    mha_call = lambda m, x: m(x, x, x, need_weights=False)[0]  # noqa: E731
    return {
        "full": (
            FullAttention(dim, heads, head_dim),
            ours_call,
            torch.nn.MultiheadAttention(dim, heads, batch_first=True),
            mha_call,
        ),
        "nystromformer": (
            NystromAttention(dim, heads, head_dim, landmarks=64),
            ours_call,
            nystrom_attention.NystromAttention(dim, dim_head=head_dim, heads=heads, num_landmarks=64, residual=False),
            peer_call,
        ),
        "reformer": (
            ReformerAttention(dim, heads, head_dim, n_hashes=2, bucket_size=64),
            ours_call,
            reformer_pytorch.LSHSelfAttention(dim, heads=heads, dim_head=head_dim, bucket_size=64, n_hashes=2),
            peer_call,
        ),
        "performer": (
            PerformerAttention(dim, heads, head_dim, features=256, redraw_interval=0),
            ours_call,
            performer_pytorch.SelfAttention(dim, heads=heads, dim_head=head_dim, nb_features=256),
            peer_call,
        ),
        "linformer": (
            LinformerAttention(dim, heads, head_dim, rank=256, max_len=n),
            ours_call,
            linformer.LinformerSelfAttention(dim, n, k=256, heads=heads, dim_head=head_dim),
            peer_call,
        ),
    }


def forward_backward(module: "torch.nn.Module", call: Callable, x: "torch.Tensor", grad: "torch.Tensor") -> None:
    """One forward+backward, from cleared gradients."""
    x.grad = None
    module.zero_grad(set_to_none=True)
    call(module.train(), x).backward(grad)


def measure(n: int, args) -> List[list]:
    import torch
    from bench.measure import interleaved

    torch.manual_seed(0)
    built = pairs(n, args.heads, args.head_dim)
    chosen = {name: built[name] for name in args.methods}
    x = torch.randn(args.batch_size, n, args.heads * args.head_dim, requires_grad=True)
    grad = torch.randn_like(x)
    variants = {
        f"{name} {side}": lambda _, m=module, c=call: forward_backward(m, c, x, grad)
        for name, (ours, ours_call, peer, peer_call) in chosen.items()
        for side, module, call in (("ours", ours, ours_call), ("peer", peer, peer_call))
    }
    total = args.warmup_iters + args.repeats
    timed = interleaved(
        variants,
        torch.device("cpu"),
        args.repeats,
        args.warmup_iters,
        alternate=True,
        after_round=lambda r: print(f"  n={n} repetition {r + 1}/{total}", file=sys.stderr, flush=True),
    )
    rows = []
    for name in chosen:
        ours, peer = timed[f"{name} ours"], timed[f"{name} peer"]
        ratios = sorted(a / b for a, b in zip(ours.ms, peer.ms))
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        rows.append(
            [
                name,
                PEERS[name],
                n,
                f"{ours.median:.1f}",
                f"{peer.median:.1f}",
                f"{ours.median / peer.median:.2f}",
                f"{q1:.2f}-{q3:.2f}",
            ]
        )
    return rows


PEERS = {
    "full": "torch.nn.MultiheadAttention",
    "nystromformer": "nystrom-attention",
    "reformer": "reformer-pytorch LSHSelfAttention",
    "performer": "performer-pytorch SelfAttention",
    "linformer": "linformer LinformerSelfAttention",
}


def main(argv=None) -> int:
    p = cli.parser("python -m experiments.peers", __doc__.splitlines()[0])
    p.add_argument("--lengths", default="4096", type=cli.positive_ints, help="multiples of 128")
    p.add_argument("--methods", default=",".join(PEERS), help="comma-separated, from " + ",".join(PEERS))
    scaling.add_benchmark_arguments(p, warmup_iters=2, repeats=21, out="runs/peers")
    args = p.parse_args(argv)
    args.methods = [v for v in args.methods.split(",") if v]
    if any(v < 128 or v % 128 for v in args.lengths):
        p.error("--lengths: each must be a positive multiple of 128 (reformer-pytorch needs 2 × bucket_size)")
    if not args.methods or set(args.methods) - set(PEERS):
        p.error(f"--methods: choose from {sorted(PEERS)}")
    missing = [m for m in PEER_PACKAGES if importlib.util.find_spec(m) is None]
    if missing:
        p.error(f"the peer packages {missing} are not installed: pip install -r requirements-peers.txt")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    where, _ = scaling.describe("cpu", "keep")
    allocator = {key: os.environ.get(key, "unset") for key in scaling.ALLOCATORS["keep"]}
    load, started = scaling.load_average(), time.time()
    rows = [row for n in args.lengths for row in measure(n, args)]
    end_load = scaling.load_average()
    text = (
        f"Ours ÷ public implementations — {where}, torch {torch.__version__}; "
        f"batch {args.batch_size}, {args.heads} heads, head dim {args.head_dim}, forward+backward, training "
        f"mode; median of {args.repeats} interleaved repetitions after {args.warmup_iters}; allocator "
        f"{allocator}; load average {load:.2f} at start, {end_load:.2f} at end; {time.time() - started:.0f} s.\n\n"
        + tabulate(
            rows,
            tablefmt="github",
            disable_numparse=True,
            headers=["ours", "peer", "n", "ours ms", "peer ms", "ours ÷ peer", "per-rep ratio IQR"],
        )
    )
    print(text)
    path = cli.out_file(args.out, "peers.md")
    path.write_text(text + "\n")
    print(f"wrote {path}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
