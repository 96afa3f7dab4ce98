"""Times the cuda-fused forward+backward of the standard problems for the backward's heuristic
and every listed backward tile configuration (bf16): the measurement behind the backward table.

    python3 tools/experiments/bwd_configs.py [--problems 2d-large,3d-video] [--reps 5]

Prints per problem: backward config, forward+backward ms, effective TFLOP/s (3.5x the forward's
FLOPs, docs/semantics.md section 3) and the largest dQ / dK / dV difference from the heuristic's gradients.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fna  # noqa: E402
from gpu_bench import PROBLEMS, attended_pairs, make_case  # noqa: E402
from fwd_configs import timed  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    for name in args.problems.split(","):
        case = make_case(name, "base")
        B, H, shape, D, kernel = PROBLEMS[name]
        rank = len(shape)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=torch.bfloat16,
                               generator=g).requires_grad_(True) for _ in range(3))
        d_out = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
        fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]
        flops = 3.5 * 4.0 * B * H * attended_pairs(case) * D

        def run(cfg):
            out = fn(q, k, v, kernel, backend="cuda-fused", backward_config=cfg)
            return torch.autograd.grad(out, (q, k, v), d_out)

        ref = run(None)
        for cfg in [None] + fna.fused_backward_configs(rank, torch.bfloat16, D):
            try:
                grads = run(cfg)
                diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(grads, ref))
                ms = timed(lambda: run(cfg), args.reps, warmup=1)
                print(f"{name:9s} {cfg or '(heuristic)':60s} {ms:9.3f} ms "
                      f"{flops / ms / 1e9:7.1f} TFLOP/s maxdiff {diff:.1e}", flush=True)
            except Exception as e:
                print(f"{name:9s} {cfg or '(heuristic)':60s} error: {str(e)[:120]}", flush=True)
        del q, k, v, d_out, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
