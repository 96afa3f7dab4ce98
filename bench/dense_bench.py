"""Whole-grid neighborhood attention against dense attention (issue 27's first target): with the
window as large as the grid, NA is self attention, so fna's rate there is its mainloop's rate with
no tiling waste. Times fna (cuda-fused, the plan's forward and backward) against PyTorch SDPA's
cuDNN and flash (FlashAttention-2) backends on the same tensors, forward and forward+backward, in
one process on one GPU (GPU time, gpu_bench.py's timer), and checks that the outputs agree.

    python3 bench/dense_bench.py [--dims 64,128,256] [--shapes 16384/128x128/16x32x32]
        [--batch 1] [--heads 16] [--dtype bf16] [--tuning fwd_schedule=mma_sync] [--no-backward]
        [--configs] [--out DIR]

FLOPs: 4 * B * H * N^2 * D forward, 3.5x that forward+backward (docs/semantics.md). "x cudnn" is
fna's TFLOP/s over cuDNN's (>= 1: fna as fast); "x flash" the same against the flash backend, and
"x fa4" against FlashAttention 4 (flash_attn.cute, timed where importable; tools/peers/fa4_wheels.sh
prepares its wheels for the GPU machine; it says why when it is not).
--tuning passes fna tuning keys (K=V,...): fwd_schedule=mma_sync measures the sm80-class kernels
(the same mma.sync instructions as FlashAttention-2) on a Hopper GPU. --configs also times the
forward of every tile configuration fna.fused_plan accepts (is the plan's pick the fastest?).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fna  # noqa: E402
from gpu_bench import fa4_import, timed  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse_tuning(text):
    out = {}
    for kv in filter(None, text.split(",")):
        k, _, v = kv.partition("=")
        out[k.strip()] = v.strip()
    return out


def sdpa_call(backend, q, k, v):
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel([backend]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def fa4_peer():
    """FlashAttention 4's forward (flash_attn.cute, tools/peers/fa4_wheels.sh installs it on the
    GPU machine) as a peer on [B, N, H, D] tensors, or None with the reason it is not importable."""
    fn, why = fa4_import()
    return ((lambda q, k, v: fn(q, k, v)[0]) if fn is not None else None), why


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--shapes", default="16384/128x128/16x32x32",
                    help="grids separated by '/', axes by 'x'")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--tuning", default="", help="fna tuning keys, K=V[,K=V..]")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--no-flash", action="store_true")
    ap.add_argument("--no-fa4", action="store_true", help="skip FlashAttention 4 where importable")
    ap.add_argument("--out", default=None, help="directory for results.json")
    ap.add_argument("--configs", action="store_true",
                    help="also time the forward of every configuration the plan accepts")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend
    dt = DTYPES[args.dtype]
    tuning = parse_tuning(args.tuning) or None
    dims = [int(x) for x in args.dims.split(",")]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split("/")]
    print(f"device: {torch.cuda.get_device_name()}; {args.dtype}, batch {args.batch}, heads "
          f"{args.heads}, fna tuning {tuning or '{}'}", flush=True)
    # (name, call, layout): SDPA takes (B, H, N, D) copies, FA4 fna's own [B, N, H, D] tensors.
    peers = [("cudnn", lambda q, k, v: sdpa_call(SDPBackend.CUDNN_ATTENTION, q, k, v), "bhnd")]
    if not args.no_flash:
        peers.append(("flash", lambda q, k, v: sdpa_call(SDPBackend.FLASH_ATTENTION, q, k, v),
                      "bhnd"))
    if not args.no_fa4:
        fa4, why = fa4_peer()
        if fa4 is None:
            print(f"FlashAttention 4: not timed ({why})", flush=True)
        else:
            peers.append(("fa4", fa4, "bnhd"))
    rows = []
    for shape in shapes:
        for d in dims:
            n = 1
            for s in shape:
                n *= s
            B, H = args.batch, args.heads
            flops = 4.0 * B * H * n * n * d
            g = torch.Generator(device="cuda").manual_seed(1000 * d + len(shape))
            q, k, v = (torch.randn((B, *shape, H, d), device="cuda", dtype=dt, generator=g)
                       for _ in range(3))
            go = torch.randn_like(q)
            na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
            plan = fna.fused_plan(list(q.shape), list(shape), dtype=str(dt).split(".")[-1],
                                  tuning=tuning)

            def fna_fwd():
                return na(q, k, v, list(shape), backend="cuda-fused", tuning=tuning)

            res = {"shape": "x".join(map(str, shape)), "dim": d, "tokens": n,
                   "fwd_config": plan["config"], "bwd_config": plan["backward_config"]}
            res["fna_fwd_ms"] = timed(fna_fwd, args.reps, args.warmup)[0]
            out = fna_fwd().float()
            if args.configs:
                dtn = str(dt).split(".")[-1]
                times = {}
                for name in fna.fused_configs(len(shape), dtn, d):
                    try:
                        fna.fused_plan(list(q.shape), list(shape), dtype=dtn, config=name)
                    except (ValueError, NotImplementedError):
                        continue
                    times[name] = timed(lambda name=name: na(q, k, v, list(shape),
                                                             backend="cuda-fused", config=name),
                                        args.reps, args.warmup)[0]
                res["configs_fwd"] = times
                for name in sorted(times, key=times.get)[:6]:
                    print(f"{res['shape']:>10s} D {d:3d}: {name:48s} {times[name]:8.3f} ms "
                          f"{flops / times[name] / 1e9:6.1f} TFLOP/s"
                          f"{'  (plan)' if name == plan['config'] else ''}", flush=True)
            # The peers' tensors, made outside the timing: (B, H, N, D) copies for SDPA, views
            # of fna's as [B, N, H, D] for FA4.
            lay = {"bhnd": tuple(t.reshape(B, n, H, d).transpose(1, 2).contiguous()
                                 for t in (q, k, v, go)),
                   "bnhd": tuple(t.reshape(B, n, H, d) for t in (q, k, v, go))}
            back = {"bhnd": lambda o: o.transpose(1, 2).reshape(out.shape),
                    "bnhd": lambda o: o.reshape(out.shape)}
            for name, call, layout in peers:
                pq, pk, pv, _ = lay[layout]
                try:
                    ref = call(pq, pk, pv)
                    res[name + "_fwd_ms"] = timed(lambda: call(pq, pk, pv), args.reps,
                                                  args.warmup)[0]
                    diff = (back[layout](ref).float() - out).abs().max()
                    res[name + "_maxdiff"] = diff.item()
                except Exception as e:  # noqa: BLE001 (a peer that does not take this problem)
                    res[name + "_error"] = str(e).split("\n")[0][:100]
            if not args.no_backward:
                qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

                def fna_step():
                    qg.grad = kg.grad = vg.grad = None
                    na(qg, kg, vg, list(shape), backend="cuda-fused", tuning=tuning).backward(go)

                res["fna_fb_ms"] = timed(fna_step, args.reps, args.warmup)[0]
                for name, call, layout in peers:
                    if name + "_error" in res:
                        continue
                    pq, pk, pv, pgo = lay[layout]
                    pq, pk, pv = (t.detach().requires_grad_(True) for t in (pq, pk, pv))

                    def peer_step(call=call, pq=pq, pk=pk, pv=pv, pgo=pgo):
                        pq.grad = pk.grad = pv.grad = None
                        call(pq, pk, pv).backward(pgo)

                    try:
                        res[name + "_fb_ms"] = timed(peer_step, args.reps, args.warmup)[0]
                    except Exception as e:  # noqa: BLE001
                        res[name + "_fb_error"] = str(e).split("\n")[0][:100]
            for key in [k_ for k_ in res if k_.endswith("_fwd_ms")]:
                res[key.replace("_ms", "_tflops")] = flops / res[key] / 1e9
            for key in [k_ for k_ in res if k_.endswith("_fb_ms")]:
                res[key.replace("_ms", "_tflops")] = 3.5 * flops / res[key] / 1e9
            rows.append(res)
            line = (f"{res['shape']:>10s} D {d:3d}: fna fwd {res['fna_fwd_ms']:8.3f} ms "
                    f"{res['fna_fwd_tflops']:6.1f} TFLOP/s")
            for name, _, _ in peers:
                if name + "_fwd_ms" in res:
                    line += (f" | {name} {res[name + '_fwd_tflops']:6.1f} (x{name} "
                             f"{res[name + '_fwd_ms'] / res['fna_fwd_ms']:.2f}, maxdiff "
                             f"{res[name + '_maxdiff']:.1e})")
                else:
                    line += f" | {name}: {res.get(name + '_error')}"
            print(line + f"  [{plan['config']}]", flush=True)
            if "fna_fb_ms" in res:
                line = (f"{'':>10s}        f+b {res['fna_fb_ms']:8.3f} ms "
                        f"{res['fna_fb_tflops']:6.1f} TFLOP/s")
                for name, _, _ in peers:
                    if name + "_fb_ms" in res:
                        line += (f" | {name} {res[name + '_fb_tflops']:6.1f} (x{name} "
                                 f"{res[name + '_fb_ms'] / res['fna_fb_ms']:.2f})")
                print(line + f"  [{plan['backward_config']}]", flush=True)
            del q, k, v, go, lay
            torch.cuda.empty_cache()
    # The short table last: fna's TFLOP/s and its ratio to each peer (>= 1: fna as fast).
    names = [name for name, _, _ in peers]

    def ratio(r, name, what):
        key = f"{name}_{what}_ms"
        return f"{r[key] / r[f'fna_{what}_ms']:.2f}" if key in r and f"fna_{what}_ms" in r else "-"

    cols = " | ".join(f"x {n}" for n in names)
    print(f"\n| grid | D | fwd TFLOP/s | {cols} | f+b TFLOP/s | {cols} | forward config |")
    print("| --- " * (4 + 2 * len(names)) + "| --- |")
    for r in rows:
        fb = f"{r['fna_fb_tflops']:.1f}" if "fna_fb_tflops" in r else "-"
        fw = " | ".join(ratio(r, n, "fwd") for n in names)
        bw = " | ".join(ratio(r, n, "fb") for n in names)
        print(f"| {r['shape']} | {r['dim']} | {r['fna_fwd_tflops']:.1f} | {fw} | {fb} | {bw} | "
              f"{r['fwd_config']} |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "dense.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "dtype": args.dtype,
                       "tuning": tuning, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
