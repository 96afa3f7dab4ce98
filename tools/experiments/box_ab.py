"""Same-process A/B of the box and strip forwards (fwd_box.cuh, fwd_strip.cuh) against the
tiled kernels on rank-2 problems with small windows (2d-nat and NAT / DiNAT-like stages): for
each problem, rounds alternate the Options::tuning settings given (default "fwd_box=off;-": the
tiled kernels only, against the default plan), printing each one's configuration, median forward
ms and the ratio to the first. Run on the device after `tools/gpu/run.sh build`:

    python3 tools/experiments/box_ab.py [--tuning "fwd_strip=off;fwd_strip=on"] [--rounds 3] [--reps 10]

--tuning: settings separated by `;`, each K=V[,K=V..] (keys: fna.tuning_keys()) or `-` (defaults).
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fna  # noqa: E402
from fwd_configs import timed  # noqa: E402
from tuning_ab import parse_tunings  # noqa: E402

# (B, H, (L0, L1), D, (K0, K1), dilation): 2d-nat and neighbors (NAT / DiNAT-like stages).
PROBLEMS = [
    (8, 8, (128, 128), 64, (13, 13), (1, 1)),
    (8, 8, (128, 128), 64, (13, 13), (2, 2)),
    (16, 4, (56, 56), 64, (7, 7), (1, 1)),
    (16, 8, (28, 28), 64, (7, 7), (1, 1)),
    (8, 8, (64, 64), 64, (9, 9), (1, 1)),
    (4, 8, (96, 96), 48, (11, 11), (1, 1)),
    (8, 8, (128, 128), 64, (5, 5), (1, 1)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--tuning", default="fwd_box=off;-",
                    help="settings separated by ';', each K=V[,K=V..] or '-' (defaults)")
    args = ap.parse_args()
    settings = parse_tunings(args.tuning)
    width = max(len(label) for label, _ in settings)
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, H, shape, D, kernel, dil in PROBLEMS:
        q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        res = {}
        for _ in range(args.rounds):
            for label, tuning in settings:
                fn = lambda: fna.na2d(q, k, v, kernel, dilation=dil, backend="cuda-fused",  # noqa: E731
                                      tuning=tuning)
                name = fna.fused_plan(list(q.shape), kernel, dilation=dil, tuning=tuning)["config"]
                res.setdefault((label, name), []).append(timed(fn, args.reps))
        base = None
        for (label, name), ts in res.items():
            ms = statistics.median(ts)
            base = base or ms
            print(f"{B}x{H} {shape[0]}x{shape[1]} d{D} k{kernel[0]}x{kernel[1]} dil{dil[0]}  "
                  f"{label:{width}s} {name:42s} {ms:8.3f} ms  x{base / ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
