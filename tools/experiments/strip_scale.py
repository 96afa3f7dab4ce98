"""How the strip forward's time scales with the rows each CTA walks: the same number of queries
(and pairs, up to borders) as 2d-nat cut into strips of 64, 128 and 256 rows, forced onto the
strip forward (Options::tuning fwd_strip=on). A CTA's fixed costs (its ring's first fill, its
tail) show as a time per query that falls with the rows per strip. Run on the device after
`tools/gpu/run.sh build`:

    python3 tools/experiments/strip_scale.py [--tuning fwd_strip=on,fwd_copy=cp_async] [--rounds 5] [--reps 20]

--tuning: one K=V[,K=V..] setting (keys: fna.tuning_keys()); default fwd_strip=on.
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

SHAPES = [(32, 8, (64, 64)), (8, 8, (128, 128)), (4, 8, (256, 256)), (1, 8, (512, 512))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--kernel", type=int, default=13)
    ap.add_argument("--tuning", default="fwd_strip=on", help="K=V[,K=V..] (one setting)")
    args = ap.parse_args()
    label, tuning = parse_tunings(args.tuning)[0]
    print(f"device: {torch.cuda.get_device_name()}; tuning {label}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = []
    for B, H, shape in SHAPES:
        q, k, v = (torch.randn((B, *shape, H, 64), device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        kern = (args.kernel, args.kernel)
        plan = fna.fused_plan(list(q.shape), kern, tuning=tuning)
        cases.append(((B, H, shape), plan["config"],
                      lambda q=q, k=k, v=v, kern=kern: fna.na2d(q, k, v, kern, backend="cuda-fused",
                                                                tuning=tuning),
                      B * H * shape[0] * shape[1]))
    res = {}
    for _ in range(args.rounds):
        for key, _, fn, _ in cases:
            res.setdefault(key, []).append(timed(fn, args.reps))
    for key, name, _, nq in cases:
        ms = statistics.median(res[key])
        B, H, shape = key
        print(f"{B:3d}x{H} {shape[0]:4d}x{shape[1]:<4d} {name:42s} {ms:8.3f} ms "
              f"{1e6 * ms / nq:8.3f} ns/query", flush=True)


if __name__ == "__main__":
    main()
