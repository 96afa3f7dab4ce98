"""cuda-fused forward (and with --bwd, forward+backward) calls of a standard problem (bf16), for
Nsight Compute:

    ncu -k regex:fna_fwd --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats python3 tools/gpu/profile_fwd.py 2d-large
    ncu -k regex:dkdv --launch-skip 1 --launch-count 1 ... python3 tools/gpu/profile_fwd.py 2d-large --bwd

FNA_PROFILE_CONFIG=NAME runs the forward with that configuration instead of the heuristic's.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fna  # noqa: E402
from gpu_bench import PROBLEMS  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "2d-large"
B, H, shape, D, kernel = PROBLEMS[name]
g = torch.Generator(device="cuda").manual_seed(0)
bwd = "--bwd" in sys.argv
q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
           .requires_grad_(bwd) for _ in range(3))
fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
config = os.environ.get("FNA_PROFILE_CONFIG") or None
for _ in range(3):
    out = fn(q, k, v, kernel, backend="cuda-fused", config=config)
    if bwd:
        out.sum().backward()
torch.cuda.synchronize()
print(name, fna.fused_plan(list(q.shape), kernel, dtype=torch.bfloat16, config=config)["config"])
