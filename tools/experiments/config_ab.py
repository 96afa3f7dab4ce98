"""Same-process A/B of cuda-fused forward configurations (and the heuristic's choice) on one
standard problem and variant, in alternating rounds:

    python3 tools/experiments/config_ab.py 3d-video causal0 heuristic fna_fwd_sm90_bf16_d128_q2x8x8_kv2x4x8_w8 \
        [--rounds 4] [--reps 5]

Prints per round each configuration's median ms, then the median over rounds.
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fna  # noqa: E402
from fwd_configs import timed  # noqa: E402
from gpu_bench import PROBLEMS, attended_pairs, make_case  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("problem", choices=sorted(PROBLEMS))
ap.add_argument("variant")
ap.add_argument("configs", nargs="+", help="configuration names; 'heuristic' for the default")
ap.add_argument("--rounds", type=int, default=4)
ap.add_argument("--reps", type=int, default=5)
args = ap.parse_args()
case = make_case(args.problem, args.variant)
B, H, shape, D, kernel = PROBLEMS[args.problem]
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
           for _ in range(3))
fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
kw = dict(dilation=case["dilation"], is_causal=case["causal"])
flops = 4.0 * B * H * attended_pairs(case) * D
cfgs = [None if c == "heuristic" else c for c in args.configs]
print("heuristic:", fna.fused_plan(list(q.shape), kernel, dtype=torch.bfloat16, **kw)["config"])
times = {c: [] for c in args.configs}
for r in range(args.rounds):
    order = list(zip(args.configs, cfgs))
    if r % 2:
        order.reverse()
    for name, cfg in order:
        ms = timed(lambda: fn(q, k, v, kernel, backend="cuda-fused", config=cfg, **kw), args.reps)
        times[name].append(ms)
        print(f"round {r} {name:50s} {ms:9.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)
for name in args.configs:
    ms = statistics.median(times[name])
    print(f"median {name:50s} {ms:9.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")
