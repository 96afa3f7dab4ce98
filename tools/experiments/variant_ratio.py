"""Effective-throughput ratio of a standard problem's variants (causal0 or dil2) to its base
variant, timed in alternating rounds in one process so that clock and thermal drift between
separate runs does not enter the ratio: the measurement behind issue 4's "causal on one axis >= 90%
of the non-causal TFLOP/s" and "dilation 2 within 15% of the undilated time".

    python3 tools/experiments/variant_ratio.py [--problems 2d-large,3d-video] [--variants causal0,dil2]
        [--rounds 5] [--reps 10] [--bwd]

Prints per problem and variant: the median over rounds of each round's median ms, effective
TFLOP/s (docs/semantics.md section 3: the variant's real attended pairs), the TFLOP/s ratio to base and
the time ratio to base; with --bwd the same for forward+backward.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--variants", default="causal0,dil2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--bwd", action="store_true", help="also forward+backward")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    for name in args.problems.split(","):
        B, H, shape, D, kernel = PROBLEMS[name]
        fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=torch.bfloat16,
                               generator=g).requires_grad_(args.bwd) for _ in range(3))
        d_out = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
        variants = ["base"] + [x for x in args.variants.split(",") if x != "base"]
        cases = {x: make_case(name, x) for x in variants}

        def fwd(x):
            kw = dict(dilation=cases[x]["dilation"], is_causal=cases[x]["causal"])
            return lambda: fn(q, k, v, kernel, backend="cuda-fused", **kw)

        def fb(x):
            f = fwd(x)

            def step():
                q.grad = k.grad = v.grad = None
                f().backward(d_out)
            return step

        times = {(x, w): [] for x in variants for w in ("fwd", "fb")}
        for _ in range(args.rounds):
            for x in variants:
                with torch.no_grad():
                    times[(x, "fwd")].append(timed(fwd(x), args.reps))
                if args.bwd:
                    times[(x, "fb")].append(timed(fb(x), args.reps))
        for w, mult in (("fwd", 1.0), ("fb", 3.5)):
            if w == "fb" and not args.bwd:
                continue
            base_ms = statistics.median(times[("base", w)])
            base_tf = mult * 4.0 * B * H * attended_pairs(cases["base"]) * D / base_ms / 1e9
            for x in variants:
                ms = statistics.median(times[(x, w)])
                tf = mult * 4.0 * B * H * attended_pairs(cases[x]) * D / ms / 1e9
                print(f"{name:9s} {x:8s} {w:3s} {ms:9.3f} ms {tf:7.1f} TFLOP/s  "
                      f"TFLOP/s / base {tf / base_tf:6.3f}  ms / base {ms / base_ms:6.3f}",
                      flush=True)
        del q, k, v, d_out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
