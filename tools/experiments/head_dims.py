"""Does time grow as the head dim shrinks, and does a head dim that is not a power of two cost more
than the next power of two (issue 26's monotonicity targets)? One problem (default: 2-D 128x128,
13x13 windows, batch 4, 8 heads, bf16), forward and forward+backward GPU time (bench/gpu_bench.py's
timer) at each head dim, with the plan's forward and backward configurations:

    python3 tools/experiments/head_dims.py [--dims 16,32,48,64,80,96,128,160,192,256]
        [--shape 128,128] [--kernel 13,13] [--batch 4] [--heads 8] [--reps 10]

Prints one line per head dim and then every violation: a smaller head dim slower than a larger one,
or a non-power-of-two one slower than the next power of two (beyond --tol, default 3%).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fna  # noqa: E402
from gpu_bench import timed  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--dims", default="16,32,48,64,80,96,128,160,192,256")
ap.add_argument("--shape", default="128,128")
ap.add_argument("--kernel", default="13,13")
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--heads", type=int, default=8)
ap.add_argument("--reps", type=int, default=10)
ap.add_argument("--tol", type=float, default=0.03)
args = ap.parse_args()
shape = tuple(int(x) for x in args.shape.split(","))
ks = tuple(int(x) for x in args.kernel.split(","))
na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
print(f"device: {torch.cuda.get_device_name()}; shape {shape}, kernel {ks}, batch {args.batch}, "
      f"heads {args.heads}, bf16", flush=True)
rows = []
for d in (int(x) for x in args.dims.split(",")):
    g = torch.Generator(device="cuda").manual_seed(d)
    q, k, v = (torch.randn((args.batch, *shape, args.heads, d), device="cuda",
                           dtype=torch.bfloat16, generator=g) for _ in range(3))
    fwd = timed(lambda: na(q, k, v, ks, backend="cuda-fused"), args.reps, 3)[0]
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    go = torch.randn_like(q)

    def step():
        qg.grad = kg.grad = vg.grad = None
        na(qg, kg, vg, ks, backend="cuda-fused").backward(go)

    fb = timed(step, args.reps, 3)[0]
    plan = fna.fused_plan(q.shape, ks, dtype="bfloat16")
    rows.append((d, fwd, fb))
    print(f"D {d:4d}: fwd {fwd:.3f} ms  f+b {fb:.3f} ms  [{plan['config']}; "
          f"{plan['backward_config']}]", flush=True)
bad = []
for i, (d, f, b) in enumerate(rows):
    for d2, f2, b2 in rows[i + 1:]:
        for what, t, t2 in (("fwd", f, f2), ("f+b", b, b2)):
            if t > t2 * (1 + args.tol):
                pow2 = d2 & (d2 - 1) == 0 and d & (d - 1) != 0 and d2 == 1 << (d - 1).bit_length()
                bad.append(f"{what}: D {d} ({t:.3f} ms) slower than D {d2} ({t2:.3f} ms)"
                           + (" [next power of two]" if pow2 else ""))
print("violations:" if bad else "violations: none")
for line in bad:
    print("  " + line)
