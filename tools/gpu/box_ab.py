"""Same-process A/B of the box and strip forwards (fwd_box.cuh, fwd_strip.cuh) against the
tiled kernels on rank-2 problems with small windows: for each problem, rounds alternate the
settings of one environment variable (default FNA_BOX_PAIRS_RATIO=0, i.e. tiled only, against
the default heuristic; `-` leaves the variable unset), printing each one's configuration, median
forward ms and the ratio to the first. Run on the device after `tools/gpu/run.sh build`:

    python3 tools/gpu/box_ab.py [--env FNA_FWD_STRIP=0,1] [--rounds 3] [--reps 10]
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fna  # noqa: E402
from fwd_configs import timed  # noqa: E402

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
    ap.add_argument("--env", default="FNA_BOX_PAIRS_RATIO=0,-",
                    help="NAME=v1,v2,... (`-`: unset)")
    args = ap.parse_args()
    var, values = args.env.split("=", 1)
    settings = [None if v == "-" else v for v in values.split(",")]
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, H, shape, D, kernel, dil in PROBLEMS:
        q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        res = {}
        for _ in range(args.rounds):
            for setting in settings:
                if setting is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = setting
                fn = lambda: fna.na2d(q, k, v, kernel, dilation=dil, backend="cuda-fused")  # noqa: E731
                name = fna.fused_plan(list(q.shape), kernel, dilation=dil)["config"]
                res.setdefault((setting, name), []).append(timed(fn, args.reps))
        os.environ.pop(var, None)
        base = None
        for (setting, name), ts in res.items():
            ms = statistics.median(ts)
            base = base or ms
            print(f"{B}x{H} {shape[0]}x{shape[1]} d{D} k{kernel[0]}x{kernel[1]} dil{dil[0]}  "
                  f"{var}={'(unset)' if setting is None else setting:8s} {name:42s} {ms:8.3f} ms  "
                  f"x{base / ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
