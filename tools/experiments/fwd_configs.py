"""Times the cuda-fused forward of every listed tile configuration on the standard or small-window
problems (and the heuristic's pick), bf16 unless --dtype: the tuning table behind config.h.

    python3 tools/experiments/fwd_configs.py [--problems 1d-long,2d-large] [--variants base,causal0]
        [--dtype bf16] [--reps 10] [--custom "NAME=B,H,SHAPE,D,KERNEL;..."]

--custom times other problems too (each the base variant of its own shape: SHAPE and KERNEL as
AxBxC), e.g. --problems "" --custom "3d-video64=1,24,30x48x80,64,18x24x24;1d-whole=1,16,16384,64,16384".

Prints per problem: config, ms, effective TFLOP/s (docs/semantics.md section 3), needed-pair fraction, and
the max abs difference from the heuristic's output (every config computes the same function).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fna  # noqa: E402
from fna._profiler_torch import gpu_time  # noqa: E402
from gpu_bench import PROBLEMS, attended_pairs, make_case  # noqa: E402


def timed(fn, reps, warmup=2, sync=False):
    """Median ms of `reps` calls after `warmup`, GPU time as bench/gpu_bench.py takes it (fna's
    timer: each call's start event queued behind a GPU spin, so the call's host work is not
    timed); sync=True: each call from an idle GPU, its host time up to the first launch
    included."""
    return gpu_time(fn, reps, warmup, budget_s=1e9, slow_s=1e9, head_start=not sync)[0]


def custom_cases(text):
    """--custom's problems: "NAME=B,H,SHAPE,D,KERNEL" separated by ';' -> make_case-style dicts."""
    out = []
    for spec in filter(None, (x.strip() for x in text.split(";"))):
        name, _, body = spec.partition("=")
        parts = body.split(",")
        if not name or len(parts) != 5:
            raise SystemExit(f"--custom {spec!r}: expected NAME=B,H,SHAPE,D,KERNEL")
        B, H, D = int(parts[0]), int(parts[1]), int(parts[3])
        shape = tuple(int(x) for x in parts[2].split("x"))
        kernel = tuple(int(x) for x in parts[4].split("x"))
        if len(kernel) != len(shape):
            raise SystemExit(f"--custom {spec!r}: SHAPE and KERNEL need the same rank")
        rank = len(shape)
        out.append(dict(name=name, variant="base", B=B, H=H, shape=shape, D=D, kernel=kernel,
                        dilation=(1,) * rank, stride=(1,) * rank, causal=(False,) * rank))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--custom", default="", help="NAME=B,H,SHAPE,D,KERNEL[;...] (see above)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--variants", default="base", help="gpu_bench variants: base, dil2, causal0")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    cases = [make_case(name, variant) for name in filter(None, args.problems.split(","))
             for variant in args.variants.split(",")]
    for case in cases + custom_cases(args.custom):
        name, variant = case["name"], case["variant"]
        B, H, shape, D, kernel = (case[k] for k in ("B", "H", "shape", "D", "kernel"))
        rank = len(shape)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=dt, generator=g)
                   for _ in range(3))
        fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]
        kw = dict(dilation=case["dilation"], is_causal=case["causal"])
        flops = 4.0 * B * H * attended_pairs(case) * D
        ref = fn(q, k, v, kernel, backend="cuda-fused", **kw)
        plan = fna.fused_plan(list(q.shape), kernel, dtype=dt, **kw)
        rows = [("(heuristic) " + plan["config"], None)]
        rows += [(c, c) for c in fna.fused_configs(rank, dt, D)]
        for label, cfg in rows:
            try:
                out = fn(q, k, v, kernel, backend="cuda-fused", config=cfg, **kw)
                diff = (out.float() - ref.float()).abs().max().item()
                ms = timed(lambda: fn(q, k, v, kernel, backend="cuda-fused", config=cfg, **kw),
                           args.reps)
                need = fna.fused_plan(list(q.shape), kernel, dtype=dt, config=cfg,
                                      **kw)["needed_fraction"]
                print(f"{name:9s} {variant:8s} {label:55s} {ms:9.3f} ms "
                      f"{flops / ms / 1e9:7.1f} TFLOP/s needed {need:.3f} maxdiff {diff:.1e}",
                      flush=True)
            except Exception as e:  # a config that does not fit this device
                print(f"{name:9s} {variant:8s} {label:55s} error: {str(e)[:120]}", flush=True)
        del q, k, v, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
