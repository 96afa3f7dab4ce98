"""cuda-fused forward (and with --bwd, forward+backward) calls of a standard problem (bf16), for
Nsight Compute (tools/experiments/ncu_pipes.sh, ncu_mem.sh and ncu_hot.py run it):

    ncu -k regex:fna_fwd --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats python3 tools/experiments/profile_fwd.py 2d-large
    ncu -k regex:dkdv --launch-skip 1 --launch-count 1 ... \
        python3 tools/experiments/profile_fwd.py 2d-large --bwd

--rpb adds a relative positional bias (and its gradient). --config NAME runs the forward with that configuration instead of the heuristic's (and
--backward-config NAME the backward); --tuning K=V[,K=V..] passes Options::tuning (keys:
fna.tuning_keys(), e.g. fwd_schedule=plain or bwd_kernel=sm90,bwd_copy=cp_async).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fna  # noqa: E402
from gpu_bench import PROBLEMS, SMALL, make_case  # noqa: E402
from tuning_ab import parse_tunings  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("problem", nargs="?", default="2d-large",
                help="a standard or small-window problem, or dense-SHAPE-D (a window as large "
                     "as the grid SHAPE, e.g. dense-16384-64 or dense-128x128-128; batch 1, "
                     "16 heads, as bench/dense_bench.py)")
ap.add_argument("--bwd", action="store_true")
ap.add_argument("--config", default=None)
ap.add_argument("--backward-config", default=None)
ap.add_argument("--rpb", action="store_true",
                help="with a relative positional bias (random, its gradient too with --bwd)")
ap.add_argument("--tuning", default="-", help="K=V[,K=V..] (one setting; '-': defaults)")
args = ap.parse_args()
_, tuning = parse_tunings(args.tuning)[0]
if args.problem.startswith("dense-"):
    _, spatial, dim = args.problem.split("-")
    spatial = tuple(int(x) for x in spatial.split("x"))
    case = dict(B=1, H=16, shape=spatial, D=int(dim), kernel=spatial, dilation=(1,) * len(spatial))
elif args.problem in PROBLEMS or args.problem in SMALL:
    case = make_case(args.problem, "base")
else:
    ap.error(f"problem {args.problem!r}: not one of {sorted(PROBLEMS) + sorted(SMALL)} "
             "nor dense-SHAPE-D")
B, H, shape, D, kernel = (case[k] for k in ("B", "H", "shape", "D", "kernel"))
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
           .requires_grad_(args.bwd) for _ in range(3))
rpb = (torch.randn((H, *(2 * x - 1 for x in kernel)), device="cuda", generator=g)
       .requires_grad_(args.bwd) if args.rpb else None)
fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
kw = dict(config=args.config, backward_config=args.backward_config, tuning=tuning,
          dilation=case["dilation"])
for _ in range(3):
    out = fn(q, k, v, kernel, backend="cuda-fused", rpb=rpb, **kw)
    if args.bwd:
        out.sum().backward()
torch.cuda.synchronize()
plan = fna.fused_plan(list(q.shape), kernel, dtype=torch.bfloat16, rpb=args.rpb, **kw)
print(args.problem, plan["config"], "backward", plan["backward_config"] or "-")
