"""How good the plan's heuristic is: for each problem, the heuristic's time over the best time of
every configuration that runs it (the autotuner's search space), forward and forward+backward, on
the standard set (docs/semantics.md 3.3, base variant), the small-window set (3.4) and seeded random
problems; GPU time as gpu_bench.py (CUDA events, median).

    python3 bench/heuristic_quality.py [--random 50] [--reps 5] [--warmup 2] [--json out.json]
                                       [--only nat-t,...] [--variant base|dil2|causal0] [--dim D]
                                       [--backward-only | --forward-only]

Forward: every forward configuration fna.fused_plan accepts for the problem on this device.
Forward+backward: the heuristic's forward with every backward configuration (the plan's own tiles
and the listed ones). A ratio of 1.00 means the heuristic picked the fastest. --backward-only /
--forward-only time only the plan's configuration on the other side (its ratio reads 1.00).
"""
import argparse
import json
import math
import os
import random
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fna  # noqa: E402
from gpu_bench import PROBLEMS, SMALL, make_case, timed  # noqa: E402



def problems(n_random, seed):
    out = []
    for name, (B, H, shape, D, ks) in PROBLEMS.items():
        out.append(dict(name=name, B=B, H=H, shape=shape, D=D, ks=ks, dil=(1,) * len(shape),
                        causal=(False,) * len(shape), dtype=torch.bfloat16))
    for name, (B, H, shape, D, ks, dil) in SMALL.items():
        out.append(dict(name=name, B=B, H=H, shape=shape, D=D, ks=ks, dil=dil,
                        causal=(False,) * len(shape), dtype=torch.bfloat16))
    rng = random.Random(seed)
    for i in range(n_random):
        rank = rng.choice([1, 2, 2, 3])
        shape, ks, dil, causal = [], [], [], []
        for _ in range(rank):
            L = rng.choice({1: [1024, 2048, 4096, 8192], 2: [24, 40, 64, 96, 128],
                            3: [8, 12, 16, 24, 32]}[rank])
            k = rng.choice([3, 5, 7, 9, 13, 17, 33] if rank < 3 else [3, 5, 7, 9])
            k = min(k, L)
            d = rng.choice([1, 1, 1, 2, 3])
            d = max(1, min(d, L // k))
            shape.append(L)
            ks.append(k)
            dil.append(d)
            causal.append(rng.random() < 0.2)
        out.append(dict(name=f"random-{i}", B=rng.choice([1, 2, 4]), H=rng.choice([2, 4, 8]),
                        shape=tuple(shape), D=rng.choice([32, 64, 128]), ks=tuple(ks),
                        dil=tuple(dil), causal=tuple(causal),
                        dtype=rng.choice([torch.bfloat16, torch.float16])))
    return out


def run(p, args):
    dt = str(p["dtype"]).replace("torch.", "")
    rank = len(p["shape"])
    qshape = (p["B"], *p["shape"], p["H"], p["D"])
    kw = dict(kernel_size=p["ks"], dilation=p["dil"], is_causal=p["causal"])
    plan = fna.fused_plan(qshape, dtype=dt, **kw)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(qshape, device="cuda", dtype=p["dtype"], generator=g)
               for _ in range(3))
    na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]
    row = dict(name=p["name"], shape="x".join(map(str, p["shape"])), D=p["D"],
               kernel="x".join(map(str, p["ks"])), dil="x".join(map(str, p["dil"])),
               causal="".join("1" if c else "0" for c in p["causal"]), dtype=dt,
               heuristic=plan["config"], backward_heuristic=plan["backward_config"])
    fwd, plans = {}, {}
    for name in [] if args.backward_only else fna.fused_configs(rank, dt, p["D"]):
        try:
            plans[name] = fna.fused_plan(qshape, dtype=dt, config=name, **kw)
        except (ValueError, NotImplementedError):
            continue
        fwd[name] = timed(lambda: na(q, k, v, backend="cuda-fused", config=name, **kw),
                          args.reps, args.warmup)[0]
    if plan["config"] not in fwd:
        fwd[plan["config"]] = timed(lambda: na(q, k, v, backend="cuda-fused", **kw),
                                    args.reps, args.warmup)[0]
    best = min(fwd, key=fwd.get)
    row.update(fwd_ms=fwd[plan["config"]], fwd_best=best, fwd_best_ms=fwd[best],
               fwd_ratio=fwd[plan["config"]] / fwd[best], fwd_candidates=len(fwd))
    # Every candidate's time and plan (its tiles, grid and tiling statistics), for fitting the
    # plan's cost model offline.
    keep = ("family", "q_tile", "kv_tile", "warps", "grid", "smem", "visited_tiles",
            "unmasked_fraction", "needed_fraction", "persistent", "spread", "wg_skip", "copy")
    row.update(B=p["B"], H=p["H"], fwd_all=fwd,
               fwd_plans={n: {k: plans[n].get(k) for k in keep} for n in plans},
               heuristic_plan={k: plan.get(k) for k in keep})
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    go = torch.randn_like(q)

    def step(bc):
        qg.grad = kg.grad = vg.grad = None
        na(qg, kg, vg, backend="cuda-fused", backward_config=bc, **kw).backward(go)

    bwd = {"(plan)": timed(lambda: step(None), args.reps, args.warmup)[0]}
    for name in [] if args.forward_only else fna.fused_backward_configs(rank, dt, p["D"]):
        try:
            fna.fused_plan(qshape, dtype=dt, backward_config=name, **kw)
        except (ValueError, NotImplementedError):
            continue
        bwd[name] = timed(lambda: step(name), args.reps, args.warmup)[0]
    bbest = min(bwd, key=bwd.get)
    row.update(fb_ms=bwd["(plan)"], fb_best=bbest, fb_best_ms=bwd[bbest],
               fb_ratio=bwd["(plan)"] / bwd[bbest], fb_candidates=len(bwd))
    del q, k, v, qg, kg, vg, go
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--random", type=int, default=50)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", default="", help="comma list of problem names")
    ap.add_argument("--dim", type=int, default=0,
                    help="run every problem at this head dim instead of its own (e.g. 256)")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--backward-only", action="store_true",
                      help="time only the plan's forward (its ratio reads 1.000), every backward")
    only.add_argument("--forward-only", action="store_true",
                      help="time every forward, only the plan's backward (its ratio reads 1.000)")
    ap.add_argument("--json", default="")
    ap.add_argument("--variant", default="base", choices=("base", "dil2", "causal0"),
                    help="the named problems' variant (gpu_bench.make_case: dilation 2 where the "
                         "window fits, or a causal first axis)")
    args = ap.parse_args()
    probs = problems(args.random, args.seed)
    if args.only:
        probs = [p for p in probs if p["name"] in args.only.split(",")]
    if args.dim:
        for p in probs:
            p["D"] = args.dim
    if args.variant != "base":
        for p in probs:
            if p["name"] in PROBLEMS or p["name"] in SMALL:
                c = make_case(p["name"], args.variant)
                p["dil"], p["causal"] = c["dilation"], c["causal"]
    rows = []
    print(f"device: {torch.cuda.get_device_name()}, fna {fna.version()}, {len(probs)} problems",
          flush=True)
    print("| problem | shape | D | kernel | dil | causal | dtype | fwd heuristic / best | "
          "f+b heuristic / best | best forward (if not the heuristic's) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, p in enumerate(probs):
        r = run(p, args)
        rows.append(r)
        other = "" if r["fwd_best"] == r["heuristic"] else f"{r['fwd_best']} ({r['fwd_best_ms']:.3f} ms)"
        print(f"| {r['name']} | {r['shape']} | {r['D']} | {r['kernel']} | {r['dil']} | "
              f"{r['causal']} | {r['dtype']} | {r['fwd_ratio']:.3f} ({r['fwd_ms']:.3f} ms, "
              f"{r['fwd_candidates']} configs) | {r['fb_ratio']:.3f} ({r['fb_ms']:.3f} ms) | "
              f"{other} |", flush=True)
    for key in ("fwd_ratio", "fb_ratio"):
        vals = [r[key] for r in rows]
        within = sum(v <= 1.05 for v in vals)
        print(f"\n{key}: within 5% of the best on {within}/{len(vals)} "
              f"({100.0 * within / len(vals):.0f}%), median {statistics.median(vals):.3f}, "
              f"worst {max(vals):.3f}, geomean {math.exp(statistics.fmean(map(math.log, vals))):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
