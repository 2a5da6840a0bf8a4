"""Two probes whose printed output explains records of the GPU job (results/gpu/DEVICE/):

    python -m experiments.gpu_probes sbm-profile > sbm_profile.txt   # where SBM's forward+backward spends its time
    python -m experiments.gpu_probes sdpa-masks > sdpa_probe.txt     # which SDPA kernel lets gradient past a mask

``sbm-profile``: SBM attention's fast path beside its reference path at the initial density, each size's three
timed forward+backward passes, then torch's profiler tables of one pass, at the entry point's ListOps size (batch
128, 2,048 tokens, 2 heads × 32) and the scaling stage's (batch 4, 4 heads × 64). ``sdpa-masks``: under float16
autocast, the largest gradient from the outputs a mask lets be seen to the inputs it hides, for every SDPA kernel
and both forms of a padding mask (boolean, and additive −inf, which full attention's fast path passes: on an H200
cuDNN attention let 0.65 through the boolean form). Both run on the CPU too (``--device cpu``), where CUDA's kernels
say that they are not available.
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from bench import cli
from sbm_transformer import SBMAttention

SIZES = "128x2048x2x32,4x2048x4x64"  # batch × tokens × heads × head dim


def forward_backward(module, x):
    out, _ = module(x)
    out.float().pow(2).mean().backward()


def sizes_option(text: str) -> list:
    """--sizes: comma-separated BATCHxTOKENSxHEADSxHEAD_DIM, each a positive integer."""
    try:
        sizes = [tuple(int(v) for v in size.split("x")) for size in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(len(size) != 4 or min(size) < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"must be comma-separated BATCHxTOKENSxHEADSxHEAD_DIM, got {text!r}")
    return sizes


def sbm_profile(device: torch.device, sizes: list) -> None:
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else lambda: None
    for b, n, heads, head_dim in sizes:
        for path in ("fast", "reference"):
            torch.manual_seed(0)
            module = SBMAttention(heads * head_dim, heads, head_dim, path=path).to(device)
            x = torch.randn(b, n, heads * head_dim, device=device, requires_grad=True)
            times = []
            for i in range(5):  # two passes of warm-up
                start = time.perf_counter()
                forward_backward(module, x)
                sync()
                times += [1e3 * (time.perf_counter() - start)] if i >= 2 else []
            print(f"== B{b} N{n} H{heads}x{head_dim} {path}: fwd+bwd ms {sorted(times)}", flush=True)
            with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
                forward_backward(module, x)
                sync()
            for key, rows in (("cuda_time_total", 18),) * cuda + (("cpu_time_total", 10),):
                print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=45), flush=True)


def sdpa_masks(device: torch.device) -> None:
    print(torch.__version__, torch.cuda.get_device_name() if device.type == "cuda" else "CPU")
    pad = torch.zeros(2, 7, dtype=torch.bool, device=device)
    pad[:, 5:] = True
    masks = {"boolean": ~pad[:, None, None, :], "additive": torch.zeros(2, 1, 1, 7, device=device)}
    masks["additive"].masked_fill_(pad[:, None, None, :], float("-inf"))
    kernels = [SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    for seed in range(2):
        x = (1000.0 * torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(seed))).to(device)
        for form, mask in masks.items():
            for kernel in [None, *kernels]:  # None: the kernel SDPA chooses
                qkv = x.requires_grad_().view(2, 7, 2, 8).transpose(1, 2)  # B H N D, queries = keys = values
                try:
                    with sdpa_kernel(kernels if kernel is None else [kernel]):
                        with torch.autocast(device.type, dtype=torch.float16):
                            y = F.scaled_dot_product_attention(qkv, qkv, qkv, attn_mask=mask).transpose(1, 2)
                    (grad,) = torch.autograd.grad(y[~pad].float().sum(), x)
                    said = f"leak {grad[pad].abs().max().item():.3g} grad seen {grad[~pad].abs().max().item():.3g}"
                except RuntimeError as exc:  # a kernel this device or mask cannot run: what the probe reports
                    said = f"{type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
                print(f"seed {seed} mask {form} kernel {kernel}: {said}", flush=True)


def main(argv=None) -> int:
    p = cli.parser("python -m experiments.gpu_probes", __doc__.splitlines()[0])
    p.add_argument("probe", choices=["sbm-profile", "sdpa-masks"])
    p.add_argument("--device", default="cuda", type=cli.device_option, help="auto, cpu, cuda or cuda:N")
    p.add_argument("--sizes", default=SIZES, type=sizes_option, help="sbm-profile: BATCHxTOKENSxHEADSxHEAD_DIM,...")
    args = p.parse_args(argv)
    from bench.config import resolve_device

    with cli.one_line_errors():
        try:
            device = resolve_device(args.device)
        except ValueError as exc:
            p.error(str(exc))
        if args.probe == "sbm-profile":
            sbm_profile(device, args.sizes)
        else:
            sdpa_masks(device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
