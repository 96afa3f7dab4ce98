"""GPU time per kernel of na*d(backend=...) forward + backward on a problem of
bench/unfused_gpu.py (torch profiler), to see which operator of a composition costs what:

    python3 tools/experiments/gemm_kernel_times.py nat-t [cuda-gemm]
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")
from unfused_gpu import NA, PROBLEMS  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "nat-t"
backend = sys.argv[2] if len(sys.argv) > 2 else "cuda-gemm"
B, H, shape, D, ks = PROBLEMS[name]
torch.manual_seed(0)
q, k, v = (torch.randn(B, *shape, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))


def step():
    out = NA[len(shape)](q, k, v, ks, backend=backend)
    out.backward(torch.ones_like(out))


step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
print(f"{name} {backend}: per-kernel GPU time over 3 forward + backward steps")
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=90))
