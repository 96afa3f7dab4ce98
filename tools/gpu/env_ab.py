"""Same-process A/B of cuda-fused kernel variants chosen by environment variables (e.g.
FNA_SM90_WS=0 / 1): for each standard problem and variant, the forward (and with --bwd the
forward+backward) time, rounds alternating between the settings, and the max difference of each
setting's output from the first's.

    python3 tools/gpu/env_ab.py --env FNA_SM90_WS=0,1 [--problems 1d-long,2d-large]
        [--variants base,dil2,causal0] [--rounds 3] [--reps 10] [--bwd]

Prints one line per (problem, variant, setting): median ms over the rounds' medians, effective
TFLOP/s (docs/semantics.md section 3), the ratio to the first setting, and the output difference.
The library must read the variable at every call (a value cached in a `static` on the first call
would time the first setting under every name).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fna  # noqa: E402
from fwd_configs import timed  # noqa: E402
from gpu_bench import PROBLEMS, attended_pairs, make_case  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", required=True, help="NAME=v1,v2,... (values tried in turn)")
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--variants", default="base")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--bwd", action="store_true", help="also time forward+backward")
    args = ap.parse_args()
    name_env, values = args.env.split("=", 1)
    values = values.split(",")
    print(f"device: {torch.cuda.get_device_name()}; A/B of {name_env} in {values}", flush=True)
    for prob in args.problems.split(","):
        for variant in args.variants.split(","):
            case = make_case(prob, variant)
            B, H, shape, D, kernel = PROBLEMS[prob]
            dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case["dtype"]]
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=dt, generator=g)
                       for _ in range(3))
            fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
            kw = dict(dilation=case["dilation"], is_causal=case["causal"], backend="cuda-fused")
            flops = 4.0 * B * H * attended_pairs(case) * D

            def fwd():
                return fn(q, k, v, kernel, **kw)

            qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
            do = torch.randn_like(q)

            def fwd_bwd():
                # Fresh gradients each call (as bench/gpu_bench.py), so no accumulation kernels
                # run after the backward.
                qg.grad = kg.grad = vg.grad = None
                out = fn(qg, kg, vg, kernel, **kw)
                out.backward(do)
                return out

            outs, times, tbw = {}, {val: [] for val in values}, {val: [] for val in values}
            for r in range(args.rounds):
                for val in values:
                    os.environ[name_env] = val
                    if r == 0:
                        outs[val] = fwd().float()
                    times[val].append(timed(fwd, args.reps))
                    if args.bwd:
                        tbw[val].append(timed(fwd_bwd, max(3, args.reps // 2)))
            os.environ.pop(name_env, None)
            base = None
            for val in values:
                ms = sorted(times[val])[len(times[val]) // 2]
                base = base or ms
                diff = (outs[val] - outs[values[0]]).abs().max().item()
                line = (f"{prob:9s} {variant:8s} {name_env}={val:4s} fwd {ms:8.3f} ms "
                        f"{flops / ms / 1e9:7.1f} TFLOP/s x{base / ms:5.3f} maxdiff {diff:.1e}")
                if args.bwd:
                    mb = sorted(tbw[val])[len(tbw[val]) // 2]
                    line += f" | f+b {mb:8.3f} ms {3.5 * flops / mb / 1e9:7.1f} TFLOP/s"
                print(line, flush=True)
            del q, k, v, qg, kg, vg, do, outs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
