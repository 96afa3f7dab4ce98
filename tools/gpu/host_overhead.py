"""Host (CPU) cost of one cuda-fused forward call, layer by layer, on a problem so small that the
GPU work is negligible, plus a cProfile of the public call; and a standard problem's forward timed
two ways: each call synchronized (the benchmark's way: host time before the launch counts) and
calls queued back to back (GPU time only).

    python3 tools/gpu/host_overhead.py [--problem 2d-nat] [--calls 2000]
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fna  # noqa: E402
from fna import _C  # noqa: E402
from gpu_bench import PROBLEMS  # noqa: E402


def synced_ms(fn, reps, warmup):
    """Median ms of `reps` calls, each from an idle GPU (its host time up to the first launch
    included: the benchmark's way for a synchronized call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def per_call_us(fn, calls):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default="2d-nat", choices=sorted(PROBLEMS))
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((1, 8, 8, 1, 64), device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    sp = ([3, 3], [1, 1], [1, 1], [False, False])
    layers = [
        ("fna.na2d", lambda: fna.na2d(q, k, v, 3, backend="cuda-fused")),
        ("torch.ops.fna.na_forward", lambda: torch.ops.fna.na_forward(
            q, k, v, None, None, *sp, 0.125, "cuda-fused", "", False, False, "", "")),
        ("_C.forward (outputs given)", lambda: _C.forward(
            q, k, v, out, lse, None, None, kernel_size=sp[0], stride=sp[1], dilation=sp[2],
            is_causal=sp[3], backend="cuda-fused", scale=0.125, stream=stream, config="",
            deterministic=False, allow_tf32=False, backward_config="", tuning="")),
        ("torch.empty_like x2 (baseline)", lambda: (torch.empty_like(q), torch.empty_like(lse))),
    ]
    print(f"host cost per call, 1x8x8x1x64 bf16, {args.calls} calls each:")
    for name, fn in layers:
        print(f"  {per_call_us(fn, args.calls):8.1f} us  {name}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        fna.na2d(q, k, v, 3, backend="cuda-fused")
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)

    B, H, shape, D, kernel = PROBLEMS[args.problem]
    q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
    call = lambda: fn(q, k, v, kernel, backend="cuda-fused")  # noqa: E731
    synced = synced_ms(call, 30, warmup=5)  # the benchmark's way: each call synchronized
    n = 30
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        call()
    b.record()
    b.synchronize()
    print(f"{args.problem} forward: {synced:.3f} ms per call synchronized "
          f"(median of 30), {a.elapsed_time(b) / n:.3f} ms per call back to back ({n} calls)")

    # Host time of one call of the problem itself with the GPU idle (the launch is asynchronous,
    # so this is what the call costs the CPU before the kernel can start): the default choice,
    # and the same configuration named explicitly (no heuristic).
    cfg = fna.fused_plan([B, *shape, H, D], kernel, dtype="bfloat16")["config"] \
        if hasattr(fna, "fused_plan") else None

    def host_us(fn, n=50):
        ts = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e6)
        torch.cuda.synchronize()
        ts.sort()
        return ts[len(ts) // 2]
    print(f"{args.problem} forward, host time of one call with the GPU idle (median of 50): "
          f"default {host_us(call):.1f} us", end="")
    out2, lse2 = torch.empty_like(q), torch.empty(q.shape[:-1], device="cuda", dtype=torch.float32)
    ks = list(kernel) if isinstance(kernel, (tuple, list)) else [kernel] * len(shape)
    c_call = lambda cf="": _C.forward(  # noqa: E731
        q, k, v, out2, lse2, None, None, kernel_size=ks, stride=[1] * len(shape),
        dilation=[1] * len(shape), is_causal=[False] * len(shape), backend="cuda-fused",
        scale=D ** -0.5, stream=torch.cuda.current_stream().cuda_stream, config=cf,
        deterministic=False, allow_tf32=False, backward_config="", tuning="")
    print(f", _C.forward (outputs given) {host_us(c_call):.1f} us", end="")
    if cfg:
        print(f", _C.forward config given {host_us(lambda: c_call(cfg)):.1f} us", end="")
        print(f", config={cfg} given {host_us(lambda: fn(q, k, v, kernel, backend='cuda-fused', config=cfg)):.1f} us")
    else:
        print()


if __name__ == "__main__":
    main()
