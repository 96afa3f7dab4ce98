"""GPU benchmark: fna's CUDA backends against their peers, in the same run.

For each standard problem of docs/semantics.md section 3 (and its dilation / causal / fp16 / fp32 variants) it
times, forward and forward+backward: every fna CUDA backend, PyTorch SDPA (flash and cuDNN, dense
self attention), FlexAttention with a neighborhood mask_mod (compiled), NATTEN where installed, and
on 1-D problems FlashAttention 4's sliding window where importable (flash_attn.cute;
tools/peers/fa4_wheels.sh). FlexAttention's and NATTEN's outputs are checked against fna's on
every problem, so they compute the same function; FA4's on the rows where a sliding window is
NA's window (all rows of a causal axis, the rows away from the borders otherwise). Prints effective
TFLOP/s, speed relative to each peer and peak memory; writes results.json and results.md. First
it measures the device copy bandwidth and prints each problem's time for one pass over Q, K, V
and O at it (the yardstick of the memory-bound 2d-nat target).

Times are GPU time (docs/semantics.md section 3.2: CUDA events): before each timed call
the stream gets a short GPU spin (HEAD_START_MS), so the call's host work (Python, argument checks,
launches) is done while the GPU is still busy, and the start event marks when the call's first
kernel can begin. With --sync-timing the spin is left out: each call then starts on an idle GPU
and its host time up to the first launch counts too (what one isolated call costs end to end).

    python3 bench/gpu_bench.py [--quick] [--problems 2d-large,3d-video] [--variants base,dil2]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fna  # noqa: E402
from fna._profiler_torch import HEAD_START_MS, gpu_time  # noqa: E402,F401
from fna import _flops  # noqa: E402
from flex_na import na_mask_mod  # noqa: E402

try:  # a same-run peer where installed (after torch: NATTEN links torch's libraries)
    import natten
except ImportError:
    natten = None

from problem_sets import PROBLEMS, SMALL  # noqa: E402  (the standard and small-window sets)
SETS = {"standard": list(PROBLEMS), "small": list(SMALL), "all": list(PROBLEMS) + list(SMALL)}
VARIANTS = ["base", "dil2", "causal0", "fp16", "fp32"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def log(msg):
    print(msg, flush=True)


def make_case(name, variant):
    if name in SMALL:
        B, H, shape, D, kernel, dilation = SMALL[name]
        dilation = list(dilation)
    else:
        B, H, shape, D, kernel = PROBLEMS[name]
        dilation = [1] * len(shape)
    rank = len(shape)
    causal = [False] * rank
    dtype = "bf16"
    if variant == "dil2":
        # dilation 2 on every axis where the window still fits (3d-video's first axis does not)
        dilation = [2 * d if kernel[i] * 2 * d <= shape[i] else d for i, d in enumerate(dilation)]
    elif variant == "causal0":
        causal[0] = True
    elif variant in ("fp16", "fp32"):
        dtype = variant
    return dict(name=name, variant=variant, B=B, H=H, shape=tuple(shape), D=D,
                kernel=tuple(kernel), dilation=tuple(dilation), stride=(1,) * rank,
                causal=tuple(causal), dtype=dtype)


def attended_pairs(case):
    """Sum over queries of the neighborhood size (stride and causal axes included), as
    ``fna.flops`` counts it (fna._flops, from the window of docs/semantics.md section 1.1)."""
    return _flops.attended_pairs(case["shape"], case["kernel"], case["stride"],
                                 case["dilation"], case["causal"])


# GPU spin before each timed call (fna._profiler_torch.HEAD_START_MS, 3 ms): longer than any
# implementation's host time per call (Python, checks, launch: up to ~0.9 ms measured on 3d-video,
# whose calls follow a long wait).
SYNC_TIMING = False  # --sync-timing: no head start, host time before the first launch counts


def timed(fn, reps, warmup, budget_s=20.0, slow_s=2.0):
    """(median ms, timed calls) of `reps` calls after `warmup` calls, GPU time: fna's own timer
    (fna._profiler_torch.gpu_time: each call's start event recorded behind a GPU spin so its host
    work overlaps the spin; --sync-timing: no spin). Calls slower than `slow_s` get at most two
    timed reps; past `budget_s` timing stops after 3 reps."""
    return gpu_time(fn, reps, warmup, budget_s, slow_s, head_start=not SYNC_TIMING)


def peak_mb(fn, baseline):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    extra = 0
    if hasattr(fna, "_cuda_workspace_peak_bytes"):
        extra = fna._cuda_workspace_peak_bytes()
    return (torch.cuda.max_memory_allocated() - baseline + extra) / 2**20


def run_impl(label, fwd, case, flops, args, inputs):
    res = dict(impl=label)
    q, k, v = inputs

    def failed(exc):
        torch.cuda.empty_cache()
        return str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__

    try:
        base = torch.cuda.memory_allocated()
        ms, n = timed(lambda: fwd(q, k, v), args.reps, args.warmup)
        res.update(fwd_ms=ms, fwd_reps=n, fwd_tflops=flops / ms / 1e9)
        res["peak_mb_fwd"] = peak_mb(lambda: fwd(q, k, v), base)
    except Exception as exc:  # noqa: BLE001 - report the failure and carry on
        res["error"] = failed(exc)
        return res
    if args.no_bwd:
        return res
    if ms > args.max_call_s * 1e3:
        res["note"] = (f"f+b not timed: one forward takes {ms / 1e3:.1f} s "
                       f"(> --max-call-s {args.max_call_s:g})")
        return res
    try:
        qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
        out0 = fwd(qg, kg, vg)
        go = torch.randn_like(out0)

        def step():
            qg.grad = kg.grad = vg.grad = None
            fwd(qg, kg, vg).backward(go)

        ms2, n2 = timed(step, args.reps, args.warmup)
        res.update(fb_ms=ms2, fb_reps=n2, fb_tflops=3.5 * flops / ms2 / 1e9)
        res["peak_mb_fb"] = peak_mb(step, base)
        del out0, go
    except Exception as exc:  # noqa: BLE001 - the forward's numbers stand
        res["note"] = "f+b failed: " + failed(exc)
    return res


def fa4_import():
    """FlashAttention 4's attention function (flash_attn.cute.flash_attn_func; its window_size
    gives a sliding window), or None and why it does not import (dense_bench.py's peer too)."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # noqa: BLE001 (any import failure means: no such peer here)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
    return flash_attn_func, None


def fa4_window(case):
    """FA4's (left, right) window and causal flag for a 1-D problem, and the query rows on which
    its sliding window is NA's (docs/semantics.md 1.1): a causal window of K keys is cut short at
    the start of the axis in both; a centered one NA moves inward at the borders (keeping K keys)
    where a sliding window shrinks, so only rows [left, N - right) agree. None where FA4 has no
    counterpart (dilation, stride)."""
    if len(case["shape"]) != 1 or case["dilation"][0] != 1 or case["stride"][0] != 1:
        return None
    K, N = case["kernel"][0], case["shape"][0]
    if case["causal"][0]:
        return (K - 1, 0), True, slice(0, N)
    left = K // 2
    right = K - 1 - left
    return (left, right), False, slice(left, N - right)


def run_case(case, args, backends):
    dt = DTYPES[case["dtype"]]
    B, H, shape, D = case["B"], case["H"], case["shape"], case["D"]
    N = math.prod(shape)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, *shape, H, D, device="cuda", dtype=dt, generator=g) for _ in range(3))
    scale = D ** -0.5
    pairs = attended_pairs(case)
    flops = 4.0 * B * H * pairs * D
    dense_flops = 4.0 * B * H * N * N * D
    rank = len(shape)
    na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]
    kw = dict(kernel_size=case["kernel"], dilation=case["dilation"], stride=case["stride"],
              is_causal=case["causal"])
    results = []

    fna_out = None
    # float32: cuda-fused runs split TF32 (float32 accuracy, the default) and, as its own row,
    # plain TF32 (allow_tf32=True).
    runs = [(b, None) for b in backends]
    if dt == torch.float32 and "cuda-fused" in backends:
        runs.append(("cuda-fused", True))
    for b, tf32 in runs:
        def f(q_, k_, v_, b=b, tf32=tf32):
            return na(q_, k_, v_, backend=b, allow_tf32=bool(tf32), **kw)

        label = f"fna {b}" + (" tf32" if tf32 else "")

        # The naive kernels run near 1 TFLOP/s (the paper's baseline): a problem past
        # --naive-max-gflop would take minutes of the run, so it is skipped and says so.
        if b == "cuda-naive" and flops > args.naive_max_gflop * 1e9:
            results.append(dict(impl=label, error=f"skipped: {flops / 1e9:.0f} GFLOP forward "
                                f"> --naive-max-gflop {args.naive_max_gflop:g}"))
            continue
        r = run_impl(label, f, case, flops, args, (q, k, v))
        if b == "cuda-fused" and "error" not in r:
            # The tiling's efficiency next to the kernel's speed (issue 4): needed / computed
            # score pairs and the share of visited key tiles that need no mask.
            try:
                plan = fna.fused_plan((B, *shape, H, D), case["kernel"], stride=case["stride"],
                                      dilation=case["dilation"], is_causal=case["causal"],
                                      dtype=dt, allow_tf32=bool(tf32))
                walk = "".join(str(e) for e in plan.get("walk", []))
                r["tiling"] = (f"tiles: needed pairs {plan['needed_fraction']:.3f}, unmasked "
                               f"{plan['unmasked_fraction']:.3f} ({plan['config']}, walk {walk})")
                if plan["backward_kv_tile"] and not args.no_bwd:
                    shape_of = lambda t: "x".join(str(e) for e in t)  # noqa: E731
                    bwalk = "".join(str(e) for e in plan.get("backward_walk", []))
                    r["tiling"] += (f"; backward needed pairs "
                                    f"{plan['backward_needed_fraction']:.3f} (kv "
                                    f"{shape_of(plan['backward_kv_tile'])}, q "
                                    f"{shape_of(plan['backward_q_tile'])}, walk {bwalk})")
            except Exception as exc:  # noqa: BLE001 - the timing stands without it
                r["tiling"] = f"fused_plan failed: {exc}"
        results.append(r)
        if fna_out is None and "error" not in r and not tf32:
            with torch.no_grad():
                fna_out = f(q, k, v).float()

    # Peers take their preferred layout, [B, H, N, D] contiguous.
    qh, kh, vh = (t.reshape(B, N, H, D).transpose(1, 2).contiguous() for t in (q, k, v))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    if case["variant"] in ("base", "fp16") and dt != torch.float32 and not args.no_sdpa:
        for label, be in (("sdpa flash (dense)", SDPBackend.FLASH_ATTENTION),
                          ("sdpa cudnn (dense)", SDPBackend.CUDNN_ATTENTION)):
            def f(q_, k_, v_, be=be):
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(q_, k_, v_, scale=scale)
            results.append(run_impl(label, f, case, dense_flops, args, (qh, kh, vh)))

    # NATTEN, where it is installed (a benchmark peer, never a dependency): same layout and
    # arguments as fna, on the same tensors, its default configuration (what its users run).
    if natten is not None and not args.no_natten:
        nat = {1: natten.na1d, 2: natten.na2d, 3: natten.na3d}[rank]

        def f(q_, k_, v_):
            return nat(q_, k_, v_, kernel_size=case["kernel"], stride=case["stride"],
                       dilation=case["dilation"], is_causal=case["causal"])
        try:
            r = run_impl(f"natten {natten.__version__}", f, case, flops, args, (q, k, v))
            if fna_out is not None and "error" not in r:
                with torch.no_grad():
                    diff = (f(q, k, v).float() - fna_out).abs().max().item()
                tol = {"bf16": 3e-2, "fp16": 5e-3, "fp32": 1e-3}[case["dtype"]]
                r["check"] = f"{'match' if diff <= tol else 'MISMATCH'} (max diff {diff:.1e})"
        except Exception as exc:  # noqa: BLE001 - NATTEN's own limits (head dims, tiles)
            r = dict(impl=f"natten {natten.__version__}", error=str(exc).splitlines()[0][:160])
        results.append(r)

    # FlashAttention 4's sliding window (1-D), on fna's own [B, N, H, D] tensors, timed with NA's
    # FLOPs (its border rows compute fewer pairs).
    win = fa4_window(case)
    fa4 = getattr(args, "fa4", None)  # (main() sets it: the imported function, or None)
    if fa4 is not None and win is not None and dt != torch.float32:
        (left, right), causal, rows = win

        def f(q_, k_, v_):
            return fa4(q_, k_, v_, softmax_scale=scale, causal=causal,
                       window_size=(left, right))[0]
        r = run_impl("fa4 sliding window", f, case, flops, args, (q, k, v))
        if fna_out is not None and "error" not in r:
            with torch.no_grad():
                diff = (f(q, k, v).float()[:, rows] - fna_out[:, rows]).abs().max().item()
            tol = {"bf16": 3e-2, "fp16": 5e-3}[case["dtype"]]
            which = "all rows" if causal else f"rows {rows.start}..{rows.stop - 1}"
            r["check"] = (f"{'match' if diff <= tol else 'MISMATCH'} on {which} "
                          f"(max diff {diff:.1e})")
        results.append(r)

    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        # Each problem compiles afresh: past dynamo's recompile limit torch silently runs
        # flex_attention eagerly, which materializes the N x N scores (and runs out of memory).
        torch._dynamo.reset()
        flex = torch.compile(flex_attention, dynamic=False)
        mask = na_mask_mod(shape, case["kernel"], case["dilation"], case["stride"], case["causal"])
        try:
            # _compile=True builds the block mask tile by tile instead of materializing N x N.
            bm = create_block_mask(mask, None, None, N, N, device="cuda", _compile=True)

            def f(q_, k_, v_):
                return flex(q_, k_, v_, block_mask=bm, scale=scale)

            r = run_impl("flex NA", f, case, flops, args, (qh, kh, vh))
            if fna_out is not None and "error" not in r:
                with torch.no_grad():
                    fo = f(qh, kh, vh).transpose(1, 2).reshape(fna_out.shape).float()
                diff = (fo - fna_out).abs().max().item()
                tol = {"bf16": 3e-2, "fp16": 5e-3, "fp32": 1e-3}[case["dtype"]]
                r["check"] = f"{'match' if diff <= tol else 'MISMATCH'} (max diff {diff:.1e})"
            results.append(r)
        except Exception as exc:  # noqa: BLE001
            results.append(dict(impl="flex NA", error=str(exc).splitlines()[0][:160]))
    del q, k, v, qh, kh, vh
    torch.cuda.empty_cache()
    return dict(case=case, flops=flops, results=results)


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def copy_bandwidth(mib=2048, reps=10):
    """Device copy bandwidth in bytes/s (read + write counted): the median of `reps` copies of a
    `mib` MiB buffer into another, the yardstick of issue 4's memory-bound 2d-nat target."""
    a = torch.randn(mib * 2**20 // 2, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms, _ = timed(lambda: b.copy_(a), reps, 3)
    bw = 2.0 * a.numel() * a.element_size() / (ms * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return bw


def one_pass_lines(problems, bw):
    """Per problem, the time to read Q, K, V and write O once at bandwidth `bw` (bf16), and 2.5x
    that (issue 4's bound for 2d-nat)."""
    lines = []
    for p in problems:
        B, H, shape, D = (PROBLEMS[p] if p in PROBLEMS else SMALL[p])[:4]
        nbytes = 4 * B * H * math.prod(shape) * D * 2
        t = nbytes / bw * 1e3
        lines.append(f"- {p}: Q, K, V, O = {nbytes / 1e6:.0f} MB, one pass {t:.3f} ms, "
                     f"2.5x = {2.5 * t:.3f} ms")
    return lines


def table(all_runs):
    lines = ["| problem | variant | impl | fwd ms | fwd TFLOP/s | fwd+bwd ms | f+b TFLOP/s | "
             "fna speedup (fwd / f+b) | peak MB (f+b) | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in all_runs:
        c = run["case"]
        best = None
        for r in run["results"]:
            # Peers compare with fna at the same precision: not with the plain-TF32 row.
            if r["impl"].startswith("fna") and not r["impl"].endswith("tf32") and "fwd_ms" in r:
                if best is None or r["fwd_ms"] < best["fwd_ms"]:
                    best = r
        for r in run["results"]:
            sp = "-"
            if best is not None and not r["impl"].startswith("fna") and "fwd_ms" in r:
                f = r["fwd_ms"] / best["fwd_ms"]
                fb = (r["fb_ms"] / best["fb_ms"]) if "fb_ms" in r and "fb_ms" in best else None
                sp = f"{f:.2f}x / {fmt(fb, '.2f')}x"
            note = r.get("error") or "; ".join(
                x for x in (r.get("check"), r.get("tiling"), r.get("note")) if x)
            lines.append(
                f"| {c['name']} | {c['variant']} {c['dtype']} | {r['impl']} | {fmt(r.get('fwd_ms'), '.3f')} | "
                f"{fmt(r.get('fwd_tflops'))} | {fmt(r.get('fb_ms'), '.3f')} | {fmt(r.get('fb_tflops'))} | "
                f"{sp} | {fmt(r.get('peak_mb_fb', r.get('peak_mb_fwd')), '.0f')} | {note} |")
    return "\n".join(lines)


def roofline_ms(case, flops, bw, dense_fwd, dense_fb):
    """The problem's roofline (docs/benchmarks.md), forward and forward+backward, in ms:
    max(bytes / copy bandwidth, FLOPs / cuDNN's dense rate at the same head dim, same run). Bytes:
    one read of each input and one write of each output (forward: Q, K, V, O; forward+backward
    adds Q, K, V, O, dO read and dQ, dK, dV written). None without a dense rate."""
    elem = {"bf16": 2, "fp16": 2, "fp32": 4}[case["dtype"]]
    tensor = case["B"] * case["H"] * math.prod(case["shape"]) * case["D"] * elem
    out = []
    for passes, fl, rate in ((4, flops, dense_fwd), (12, 3.5 * flops, dense_fb)):
        if not rate:
            out.append(None)
            continue
        out.append(max(passes * tensor / bw, fl / (rate * 1e12)) * 1e3)
    return out


def roofline_table(all_runs, bw):
    """fna's best row per problem against its roofline, with the same run's peers (speedup =
    peer time / fna time). The dense rate of a variant without SDPA rows (dil2, causal0) is its
    base variant's (the same head dim and dtype)."""
    dense = {}
    for run in all_runs:
        c = run["case"]
        for r in run["results"]:
            if r["impl"] == "sdpa cudnn (dense)" and "fwd_tflops" in r:
                dense[(c["name"], c["dtype"])] = (r.get("fwd_tflops"), r.get("fb_tflops"))
    lines = ["| problem | variant | fna fwd ms | roofline fwd ms | fwd / roofline | fna f+b ms | "
             "roofline f+b ms | f+b / roofline | NATTEN fwd / f+b | Flex fwd / f+b | fna forward |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in all_runs:
        c = run["case"]
        fna_rows = [r for r in run["results"] if r["impl"].startswith("fna")
                    and not r["impl"].endswith("tf32") and "fwd_ms" in r]
        if not fna_rows:
            continue
        best = min(fna_rows, key=lambda r: r["fwd_ms"])
        dfwd, dfb = dense.get((c["name"], c["dtype"]), (None, None))
        rf, rfb = roofline_ms(c, run["flops"], bw, dfwd, dfb)

        def peer(prefix):
            r = next((r for r in run["results"] if r["impl"].startswith(prefix)), None)
            if r is None or "fwd_ms" not in r:
                return "-"
            fb = r["fb_ms"] / best["fb_ms"] if "fb_ms" in r and "fb_ms" in best else None
            return f"{r['fwd_ms'] / best['fwd_ms']:.2f}x / {fmt(fb, '.2f')}x"
        tiling = best.get("tiling") or ""
        kernel = tiling.split("(")[1].split(",")[0] if "(" in tiling else ""
        lines.append(
            f"| {c['name']} | {c['variant']} {c['dtype']} | {best['fwd_ms']:.3f} | {fmt(rf, '.3f')} | "
            f"{fmt(best['fwd_ms'] / rf if rf else None, '.2f')}x | {fmt(best.get('fb_ms'), '.3f')} | "
            f"{fmt(rfb, '.3f')} | "
            f"{fmt(best['fb_ms'] / rfb if rfb and 'fb_ms' in best else None, '.2f')}x | "
            f"{peer('natten')} | {peer('flex')} | {kernel} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="standard", choices=sorted(SETS),
                    help="problem set when --problems is not given (the small set: base variant)")
    ap.add_argument("--problems", default=None, help="comma list of problems of any set")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--backends", default=None, help="comma list of fna CUDA backends")
    ap.add_argument("--quick", action="store_true", help="base variants only, fewer repeats")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--no-natten", action="store_true", help="skip NATTEN even where installed")
    ap.add_argument("--no-fa4", action="store_true",
                    help="skip FlashAttention 4's sliding window even where importable")
    ap.add_argument("--naive-max-gflop", type=float, default=100.0,
                    help="skip cuda-naive on problems with more forward GFLOP than this")
    ap.add_argument("--max-call-s", type=float, default=4.0,
                    help="no forward+backward timing for an implementation whose forward call "
                         "takes longer than this (fp32 FlexAttention on the large problems)")
    ap.add_argument("--sync-timing", action="store_true",
                    help="time each call from an idle GPU (host time before the first launch "
                         "counts) instead of GPU time")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    global SYNC_TIMING
    SYNC_TIMING = args.sync_timing
    if not torch.cuda.is_available():
        sys.exit("gpu_bench: no CUDA device visible")
    if args.quick:
        args.variants = "base"
    backends = args.backends.split(",") if args.backends else [
        b for b in ("cuda-naive", "cuda-fused") if fna.backend_compiled(b)]
    problems = [p for p in args.problems.split(",") if p] if args.problems else SETS[args.set]
    variants = [v for v in args.variants.split(",") if v]
    for p in problems:
        if p not in PROBLEMS and p not in SMALL:
            sys.exit(f"gpu_bench: --problems entry {p!r} is not one of "
                     f"{', '.join(SETS['all'])}")
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"gpu_bench: --variants entry {v!r} is not one of {', '.join(VARIANTS)}")
    args.fa4, why = (None, "--no-fa4") if args.no_fa4 else fa4_import()
    if args.fa4 is None:
        log(f"FlashAttention 4 sliding window: not timed ({why})")
    dev = torch.cuda.get_device_name()
    log(f"device: {dev}, torch {torch.__version__}, fna backends: {', '.join(backends)}; "
        f"timing: {'each call from an idle GPU (--sync-timing)' if SYNC_TIMING else 'GPU time (head-start spin before each call)'}")
    bw = copy_bandwidth()
    passes = [f"device copy bandwidth (2 GiB buffer, read + write): {bw / 1e12:.3f} TB/s"]
    passes += one_pass_lines(problems, bw)
    for line in passes:
        log(line)
    runs = []
    t0 = time.time()
    # The small-window problems run their base variant only (their own dilation).
    pairs_pv = [(p, v) for p in problems for v in variants if p in PROBLEMS or v == "base"]
    total = len(pairs_pv)
    for i, (p, v) in enumerate(pairs_pv, 1):
        case = make_case(p, v)
        log(f"[{i}/{total}] {p} {v} ({time.time() - t0:.0f}s elapsed)")
        run = run_case(case, args, backends)
        runs.append(run)
        for r in run["results"]:
            note = r.get("error") or "  ".join(
                x for x in (r.get("check"), r.get("tiling"), r.get("note")) if x)
            log(f"    {r['impl']:<20} fwd {fmt(r.get('fwd_tflops'))} TF/s  f+b {fmt(r.get('fb_tflops'))}"
                f" TF/s  {note}")
        # Written after every problem, so a run cut short keeps what it measured.
        md = table(runs) + "\n\n" + roofline_table(runs, bw)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(device=dev, torch=torch.__version__,
                           timing="sync" if SYNC_TIMING else "gpu", runs=runs), f, indent=1, default=str)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(f"device: {dev}, torch {torch.__version__}, timing: "
                    f"{'sync' if SYNC_TIMING else 'gpu'}\n\n{md}\n\n" + "\n".join(passes)
                    + "\n")
    print()
    print(table(runs))
    print()
    print(roofline_table(runs, bw))
    print()
    print("\n".join(passes))


if __name__ == "__main__":
    main()
