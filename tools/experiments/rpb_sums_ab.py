"""Where the fused backward sums d rpb, timed: forward + backward with a relative positional
bias under each tuning bwd_rpb_sums the plan takes (and the plan's own), over the same call
without a bias (bfloat16, median of 3 rounds of 3 calls, CUDA events), for bias tables too large
for per-warp copies:

    PYTHONPATH=python python3 tools/experiments/rpb_sums_ab.py
"""
import sys

import torch

import fna

sys.path.insert(0, "bench")
from rpb_gpu import gpu_ms  # noqa: E402

CASES = [  # (batch, grid, kernel, head dim, heads)
    (1, (32768,), (2048,), 128, 16),     # 1d-long
    (1, (256, 256), (31, 31), 128, 16),
    (2, (128, 128), (21, 21), 64, 8),
    (1, (16, 32, 32), (9, 11, 11), 64, 8),
]

for B, shape, ks, D, H in CASES:
    na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, *shape, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
               .requires_grad_(True) for _ in range(3))
    rpb = torch.randn(H, *(2 * x - 1 for x in ks), device="cuda", generator=g).requires_grad_(True)
    d = torch.randn_like(q)

    def timed(bias, tuning):
        def step():
            out = na(q, k, v, ks, rpb=bias, tuning=tuning)
            torch.autograd.grad(out, [q, k, v] + ([bias] if bias is not None else []), d)
        return sorted(gpu_ms(step, 3) for _ in range(3))[1]

    base = timed(None, None)
    row = {}
    for mode in (None, "warps", "shared", "global"):
        tuning = None if mode is None else {"bwd_rpb_sums": mode}
        try:
            plan = fna.fused_plan(tuple(q.shape), ks, rpb=True, tuning=tuning)
        except NotImplementedError:
            continue
        name = mode or "plan: " + plan["backward_rpb_sums"]
        row[name] = "%.3f ms (%.2fx)" % (t := timed(rpb, tuning), t / base)
    print(shape, ks, f"D {D}", "no bias %.3f ms" % base, row, flush=True)
