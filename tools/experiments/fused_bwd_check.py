"""Fused backward on the device: agreement with cuda-naive on problems large enough to have
interior (unmasked) tiles, then backward timings on the standard problems.

    PYTHONPATH=python python3 tools/experiments/fused_bwd_check.py [--skip-check] [--skip-time]

The GPU suite (fna-gpu-test) checks against the CPU reference on small shapes, where every tile is
a border tile; this covers the other half of the kernels. Effective TFLOP/s for the backward alone
count 2.5x the forward FLOPs (docs/semantics.md section 3).
"""

import argparse
import faulthandler
import math
import sys

import torch

import fna


def rand(shape, dtype, gen):
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def naf(rank):
    return {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]


def inputs(B, shape, H, Hkv, D, Dv, dtype, seed, n_add=0):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    q = rand((B, *shape, H, D), dtype, g)
    k = rand((B, *shape, Hkv, D), dtype, g)
    v = rand((B, *shape, Hkv, Dv), dtype, g)
    do = rand((B, *shape, H, Dv), dtype, g)
    ak = rand((B, n_add, Hkv, D), dtype, g) if n_add else None
    av = rand((B, n_add, Hkv, Dv), dtype, g) if n_add else None
    return q, k, v, do, ak, av


def forward(q, k, v, kw, ak, av, backends):
    rank = q.ndim - 3
    err = None
    for be in backends:
        try:
            return naf(rank)(q, k, v, additional_keys=ak, additional_values=av, backend=be,
                             return_lse=True, **kw), be
        except Exception as e:  # noqa: BLE001 - report and try the next backend
            err = e
    raise err


def check(case):
    name, B, shape, H, Hkv, D, Dv, kw, n_add, dtype = case
    q, k, v, do, ak, av = inputs(B, shape, H, Hkv, D, Dv, dtype, sum(map(ord, name)), n_add)
    print(f"  .. {name}", flush=True)
    (o, lse), fbe = forward(q, k, v, kw, ak, av, ("cuda-naive",))
    torch.cuda.synchronize()
    res = {}
    for be in ("cuda-naive", "cuda-fused"):
        print(f"  .. {name}: backward {be}", flush=True)
        res[be] = fna.na_backward(do, q, k, v, o, lse, additional_keys=ak, additional_values=av,
                                  backend=be, **kw)
    names = ["dq", "dk", "dv", "d_add_k", "d_add_v"]
    worst = 0.0
    parts = []
    for n, a, b in zip(names, res["cuda-fused"], res["cuda-naive"]):
        a, b = a.float(), b.float()
        if not torch.isfinite(a).all():
            parts.append(f"{n}: NON-FINITE")
            worst = float("inf")
            continue
        rel = ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()
        worst = max(worst, rel)
        parts.append(f"{n} {rel:.2e}")
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    ok = worst <= tol
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max rel err vs cuda-naive {worst:.2e} (tol {tol:.0e}) "
          f"[{', '.join(parts)}]", flush=True)
    return ok


CHECKS = [
    # name, B, shape, H, Hkv, D, Dv, params, n_add, dtype
    ("1d L=1000 k=255 d128", 1, (1000,), 2, 2, 128, 128, dict(kernel_size=255), 0, torch.bfloat16),
    ("1d L=777 k=129 causal dil2 GQA", 2, (777,), 4, 2, 64, 64,
     dict(kernel_size=129, dilation=2, is_causal=True), 0, torch.float16),
    ("2d 96x96 k31 d128", 1, (96, 96), 2, 1, 128, 128, dict(kernel_size=31), 0, torch.bfloat16),
    ("2d 70x90 k(33,45) stride(1,3) dil(1,2) Dv!=D", 1, (70, 90), 2, 2, 64, 32,
     dict(kernel_size=(33, 21), stride=(1, 3), dilation=(1, 2)), 0, torch.float16),
    ("2d 64x80 k(24,40) causal(1,0) add=5", 1, (64, 80), 2, 1, 96, 96,
     dict(kernel_size=(24, 40), is_causal=(True, False)), 5, torch.bfloat16),
    ("3d 16x24x32 k(9,13,17) d128", 1, (16, 24, 32), 2, 2, 128, 128,
     dict(kernel_size=(9, 13, 17)), 0, torch.bfloat16),
    ("3d 12x20x28 k(6,8,10) dil(1,2,1) causal(1,0,0) d40", 1, (12, 20, 28), 3, 1, 40, 40,
     dict(kernel_size=(6, 8, 10), dilation=(1, 2, 1), is_causal=(True, False, False)), 0,
     torch.float16),
    # Head dims above 128 (padded to 256, two dK/dV passes), D != D_v on either side.
    ("1d L=1000 k=255 d256", 1, (1000,), 2, 2, 256, 256, dict(kernel_size=255), 0, torch.bfloat16),
    ("2d 96x96 k31 d192 dv160 GQA", 1, (96, 96), 2, 1, 192, 160, dict(kernel_size=31), 0,
     torch.float16),
    ("3d 16x24x32 k(9,13,17) d256 dv64 add=3", 1, (16, 24, 32), 2, 2, 256, 64,
     dict(kernel_size=(9, 13, 17)), 3, torch.bfloat16),
    ("1d L=777 k=129 causal dil2 GQA d64 dv256", 2, (777,), 4, 2, 64, 256,
     dict(kernel_size=129, dilation=2, is_causal=True), 0, torch.float16),
]

PROBLEMS = [
    # name, B, shape, H, D, kernel
    ("2d-large", 1, (256, 256), 16, 128, (63, 63)),
    ("3d-video", 1, (30, 48, 80), 24, 128, (18, 24, 24)),
    ("2d-nat", 8, (128, 128), 8, 64, (13, 13)),
    ("1d-long", 1, (32768,), 16, 128, (2048,)),
]


def time_ms(fn, reps=10, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def bench(prob, dtype=torch.bfloat16):
    name, B, shape, H, D, kernel = prob
    q, k, v, do, _, _ = inputs(B, shape, H, H, D, D, dtype, 7)
    kw = dict(kernel_size=kernel)
    N = math.prod(shape)
    W = math.prod(kernel)
    try:
        small = B * H * N * W <= 8e9  # the naive forward stores the attention matrix
        (o, lse), fbe = forward(q, k, v, kw, None, None,
                                ("cuda-fused", "cuda-naive") if small else ("cuda-fused",))
    except Exception as e:  # noqa: BLE001
        # No forward available: randn inputs give scaled logits ~ N(0, 1), so LSE ~ log(W) + 1/2;
        # the backward does the same work on these values.
        print(f"  {name}: forward unavailable ({str(e)[:80]}); timing on O = dO, "
              f"LSE = log(W) + 0.5", flush=True)
        o = do.clone()
        lse = torch.full((B, *shape, H), math.log(W) + 0.5, device="cuda")
        fbe = "none"
    fwd_flops = 4.0 * B * H * N * W * D
    f = lambda: fna.na_backward(do, q, k, v, o, lse, backend="cuda-fused", **kw)  # noqa: E731
    ms = time_ms(f)
    tf = 2.5 * fwd_flops / (ms * 1e-3) / 1e12
    line = f"  {name}: backward {ms:.3f} ms = {tf:.1f} eff. TFLOP/s (2.5x fwd FLOPs)"
    if fbe == "cuda-fused":
        g = lambda: naf(len(shape))(q, k, v, backend="cuda-fused", **kw)  # noqa: E731
        fms = time_ms(g)
        tot = 3.5 * fwd_flops / ((ms + fms) * 1e-3) / 1e12
        line += f"; fused forward {fms:.3f} ms; fwd+bwd {tot:.1f} eff. TFLOP/s"
    print(line, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-time", action="store_true")
    ap.add_argument("--problems", default="")
    args = ap.parse_args()
    faulthandler.enable()
    print(torch.cuda.get_device_name(), flush=True)
    ok = True
    if not args.skip_check:
        for c in CHECKS:
            try:
                ok = check(c) and ok
            except Exception as e:  # noqa: BLE001
                print(f"FAIL {c[0]}: {type(e).__name__}: {e}", flush=True)
                ok = False
    if not args.skip_time:
        for p in PROBLEMS:
            if args.problems and p[0] not in args.problems.split(","):
                continue
            try:
                bench(p)
            except Exception as e:  # noqa: BLE001
                print(f"  {p[0]}: {type(e).__name__}: {e}", flush=True)
            torch.cuda.empty_cache()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
