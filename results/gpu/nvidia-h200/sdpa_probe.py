"""Which SDPA backend lets gradient through masked keys under float16 on CUDA (tests/test_full.py's leak test)."""

import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from baselines.full import FullAttention

dev = torch.device("cuda")
print(torch.__version__, torch.cuda.get_device_name())
torch.manual_seed(0)
module = FullAttention(16, 2, 8, path="fast").to(dev)
for seed in range(2):
    g = torch.Generator().manual_seed(seed)
    pad = torch.zeros(2, 7, dtype=torch.bool, device=dev)
    pad[:, 5:] = True
    for causal, mask in ((True, None), (False, pad)):
        x = (1000.0 * torch.randn(2, 7, 16, generator=g)).to(dev).requires_grad_()
        for backend in (
            None,
            SDPBackend.MATH,
            SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.FLASH_ATTENTION,
            SDPBackend.CUDNN_ATTENTION,
        ):
            try:
                ctx = sdpa_kernel([backend]) if backend is not None else torch.autocast("cuda", enabled=True)
                with ctx, torch.autocast("cuda", dtype=torch.float16):
                    y, _ = module(x, mask, causal)
                seen, hidden = ((slice(None), slice(0, 3)), (slice(None), slice(3, None))) if causal else (~pad, pad)
                (grad,) = torch.autograd.grad(y[seen].float().sum(), x)
                print(
                    f"seed {seed} causal {causal} backend {backend}: leak {grad[hidden].abs().max().item():.3g} "
                    f"grad seen {grad[seen].abs().max().item():.3g} y finite {bool(torch.isfinite(y).all())}"
                )
            except Exception as exc:
                print(f"seed {seed} causal {causal} backend {backend}: {type(exc).__name__}: {str(exc)[:150]}")
