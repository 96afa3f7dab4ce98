"""Every CUDA kernel one cuda-fused call of a standard problem launches, with its device time
(torch.profiler), so that time outside the attention kernel shows up; then the call's wall time
(CUDA events, no profiler: --reps calls back to back, and the median of --reps calls each
synchronized after, as the benchmark times), so that gaps between the kernels show up too:

    python3 tools/experiments/kernel_times.py 2d-nat [--bwd] [--reps 10] [--tuning K=V,K=V]
        (or a small-window problem; --tuning: Options::tuning for the call, as fna-bench's)

With --bwd the call is the benchmark's forward+backward step (`out.backward(dO)`, random dO).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fna  # noqa: E402
from gpu_bench import PROBLEMS, SMALL, make_case  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("problem", choices=sorted(PROBLEMS) + sorted(SMALL))
ap.add_argument("--bwd", action="store_true")
ap.add_argument("--reps", type=int, default=10)
ap.add_argument("--tuning", default="")
args = ap.parse_args()
tuning = dict(kv.split("=", 1) for kv in args.tuning.split(",") if kv) or None
case = make_case(args.problem, "base")
B, H, shape, D, kernel = (case[k] for k in ("B", "H", "shape", "D", "kernel"))
dil = case["dilation"]
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
           .requires_grad_(args.bwd) for _ in range(3))
fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
d_out = torch.randn((B, *shape, H, D), device="cuda", dtype=torch.bfloat16, generator=g)


def call():
    out = fn(q, k, v, kernel, dilation=dil, backend="cuda-fused", tuning=tuning)
    if args.bwd:
        q.grad = k.grad = v.grad = None
        out.backward(d_out)


for _ in range(3):
    call()
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(args.reps):
        call()
    torch.cuda.synchronize()
rows = []
for e in prof.key_averages():
    t = getattr(e, "device_time_total", None)
    if t is None:
        t = e.cuda_time_total
    if t > 0:
        rows.append((t / args.reps, e.count / args.reps, e.key))
rows.sort(reverse=True)
total = sum(r[0] for r in rows)
print(f"{args.problem} ({'forward+backward' if args.bwd else 'forward'}), per call, "
      f"config {fna.fused_plan(list(q.shape), kernel, dilation=dil, dtype=torch.bfloat16)['config']}"
      f"{' tuning ' + args.tuning if args.tuning else ''}")
for t, n, name in rows:
    print(f"{t / 1000:9.3f} ms  {n:5.1f}x  {100 * t / total:5.1f}%  {name[:110]}")
print(f"{total / 1000:9.3f} ms  total device time")
start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for rnd in range(3):
    torch.cuda.synchronize()
    start.record()
    for _ in range(args.reps):
        call()
    stop.record()
    torch.cuda.synchronize()
    back_to_back = start.elapsed_time(stop) / args.reps
    each = []
    for _ in range(args.reps):  # as the benchmark times: synchronized after every call
        start.record()
        call()
        stop.record()
        stop.synchronize()
        each.append(start.elapsed_time(stop))
    each.sort()
    print(f"round {rnd + 1}: wall per call {back_to_back:.3f} ms back to back, "
          f"{each[len(each) // 2]:.3f} ms median synchronized after each call")
