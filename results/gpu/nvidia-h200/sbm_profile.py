"""Where SBM attention's forward+backward spends its time on CUDA, fast path beside reference path, at the entry
point's ListOps size (batch 128, 2,048 tokens, 2 heads × 32) and the scaling stage's (batch 4, 4 × 64), at the
initial density. `PYTHONPATH=. python results/gpu/nvidia-h200/sbm_profile.py` → sbm_profile.txt."""

import time, torch, sys
from torch.profiler import profile, ProfilerActivity
from sbm_transformer import SBMAttention

dev = "cuda"


def step(m, x):
    out = m(x)
    out = out[0] if isinstance(out, tuple) else out
    out.float().pow(2).mean().backward()


for b, n, heads, hd in [(128, 2048, 2, 32), (4, 2048, 4, 64)]:
    for path in ("fast", "reference"):
        torch.manual_seed(0)
        m = SBMAttention(heads * hd, heads, hd, path=path).to(dev)
        x = torch.randn(b, n, heads * hd, device=dev, requires_grad=True)
        for _ in range(2):
            step(m, x)
        torch.cuda.synchronize()
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            step(m, x)
            torch.cuda.synchronize()
            ts.append(1e3 * (time.perf_counter() - t))
        print(f"== B{b} N{n} H{heads}x{hd} {path}: fwd+bwd ms {sorted(ts)}", flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step(m, x)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=45), flush=True)
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10, max_name_column_width=45), flush=True)
