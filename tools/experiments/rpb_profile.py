"""One problem's cuda-fused forward without and with a relative positional bias, for a profiler
(ncu --kernel-name regex:fna_fwd ...): a warm-up call of each, then one call of each.

    PYTHONPATH=python python3 tools/experiments/rpb_profile.py [nat-late]
"""
import sys

import torch

import fna

sys.path.insert(0, "bench")
from problem_sets import SMALL  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "nat-late"
B, H, shape, D, ks, dil = SMALL[name]
na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, *shape, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
           for _ in range(3))
rpb = torch.randn(H, *(2 * x - 1 for x in ks), device="cuda", generator=g)
for _ in range(2):
    na(q, k, v, ks, dilation=dil)
    na(q, k, v, ks, dilation=dil, rpb=rpb)
torch.cuda.synchronize()
print(fna.fused_plan((B, *shape, H, D), ks, dilation=dil, rpb=True))
