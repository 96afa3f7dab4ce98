"""Relative positional bias on the GPU: cuda-fused with a bias (added in the tiled forward kernels'
scores, d rpb summed in the sm80 / Hopper dK / dV kernels) against the same call without
one, forward and forward + backward, on the standard and small-window problem sets (bench/problem_sets.py,
bfloat16), in one process with the variants in alternating rounds; and the unfused composition
(qk, gathered bias, softmax, av: what ran before) where its attention tensor fits.

    PYTHONPATH=python python3 bench/rpb_gpu.py [--rounds 5] [--problems nat-t,...] [--modes fwd]

Prints one row per (problem, mode): median GPU milliseconds (CUDA events) of each variant, the
ratio with / without the bias (the issue's target: at most 1.15; mode `det`, with
--deterministic: forward + backward with deterministic=True, both variants), the ratio of another way of
the same call ("other": for the forward where the plan stages the table in shared memory, the
table read in global memory, tuning fwd_rpb_stage='off'; where the plain Hopper forward copies
key-tile slices (rank 3), the staged table, tuning fwd_rpb_stage='on'; for forward + backward on the
warp-specialized Hopper backward, the plain one, tuning bwd_kernel='sm90'; where the plan sums
d rpb in a table per warp, one shared table, tuning bwd_rpb_sums='shared'), the plans'
families, the forward's table and where the backward sums d rpb, and the composition's time. A problem the fused backward does not take with a bias (its d rpb
table does not fit shared memory) shows the reason instead.
"""

import argparse
import math
import statistics
import sys

import torch

import fna
from fna import _rpb

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from problem_sets import PROBLEMS, SMALL  # noqa: E402


def problems():
    out = {}
    for name, (B, H, shape, D, ks) in PROBLEMS.items():
        out[name] = (B, H, shape, D, ks, (1,) * len(shape))
    out.update(SMALL)
    return out


def gpu_ms(fn, reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--problems", default="")
    ap.add_argument("--deterministic", action="store_true",
                    help="also time forward + backward with deterministic=True (mode 'det')")
    ap.add_argument("--modes", default="fwd,fwd+bwd",
                    help="which of fwd, fwd+bwd (and det) to time; e.g. --modes fwd")
    ap.add_argument("--composition-gib", type=float, default=6.0,
                    help="run the composition only where its attention tensor is below this")
    args = ap.parse_args()
    wanted = set(args.modes.split(",")) | ({"det"} if args.deterministic else set())
    if not wanted <= {"fwd", "fwd+bwd", "det"}:
        ap.error(f"--modes: unknown {sorted(wanted - {'fwd', 'fwd+bwd', 'det'})}")
    probs = problems()
    if args.problems:
        probs = {k: probs[k] for k in args.problems.split(",")}
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}, fna {fna.version()}, bfloat16, {args.rounds} rounds", flush=True)
    rows = []
    for name, (B, H, shape, D, ks, dil) in probs.items():
        rank = len(shape)
        na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]
        g = torch.Generator(device="cuda").manual_seed(7)
        q, k, v = (torch.randn(B, *shape, H, D, device="cuda", dtype=torch.bfloat16,
                               generator=g) for _ in range(3))
        rpb = torch.randn(H, *(2 * x - 1 for x in ks), device="cuda", generator=g)
        d_out = torch.randn_like(q)
        kw = dict(dilation=dil)
        tokens = math.prod(shape)
        pairs = B * H * tokens * math.prod(ks)
        reps = max(1, min(50, int(2e9 / max(pairs * D, 1))))
        plain_plan = fna.fused_plan((B, *shape, H, D), ks, dilation=dil)
        bias_plan = fna.fused_plan((B, *shape, H, D), ks, dilation=dil, rpb=True)

        staged = bias_plan["rpb_table"] == "shared"

        def fwd(b, tuning=None):
            return lambda: na(q, k, v, ks, rpb=b, tuning=tuning, **kw)

        def fb(b, tuning=None, det=False):
            qq, kk, vv = (x.detach().requires_grad_(True) for x in (q, k, v))
            bb = None if b is None else b.detach().requires_grad_(True)

            def step():
                out = na(qq, kk, vv, ks, rpb=bb, tuning=tuning, deterministic=det, **kw)
                torch.autograd.grad(out, [qq, kk, vv] + ([] if bb is None else [bb]), d_out)
            return step

        modes = [("fwd", fwd), ("fwd+bwd", fb),
                 ("det", lambda b, tuning=None: fb(b, tuning, det=True))]
        modes = [m for m in modes if m[0] in wanted]
        for mode, make in modes:
            times = {"plain": [], "rpb": [], "other": []}
            err = ""
            variants = [("plain", None, None), ("rpb", rpb, None)]
            other = None
            if mode == "fwd" and staged:  # the same call reading the table in global memory
                other = {"fwd_rpb_stage": "off"}
            if mode == "fwd" and bias_plan["rpb_table"] == "tiles" and bias_plan["family"] == "sm90":
                other = {"fwd_rpb_stage": "on"}  # the staged table (a test per score at rank 3)
            if mode == "fwd+bwd" and bias_plan["backward_family"] == "sm90ws":
                other = {"bwd_kernel": "sm90"}  # the plain Hopper backward
            elif mode == "fwd+bwd" and bias_plan["backward_rpb_sums"] == "warps":
                other = {"bwd_rpb_sums": "shared"}  # d rpb summed in one table, atomics
            if other is not None:
                try:  # (a variant the plan cannot run is left out of the row)
                    make(rpb, other)()
                    variants.append(("other", rpb, other))
                except Exception:  # noqa: BLE001
                    other = None
            try:
                for _ in range(args.rounds):
                    for label, b, tuning in variants:
                        times[label].append(gpu_ms(make(b, tuning), reps))
            except Exception as e:  # noqa: BLE001  (reported in the table)
                err = str(e).splitlines()[0][:120]
            if mode == "det":
                det_plan = fna.fused_plan((B, *shape, H, D), ks, dilation=dil, rpb=True,
                                          deterministic=True)
            comp = ""
            att_gib = pairs * 4 / 2**30
            if not err and att_gib < args.composition_gib and mode == "fwd":
                sp = (list(ks), [1] * rank, list(dil), [False] * rank)
                try:
                    comp = "%.3f" % gpu_ms(lambda: _rpb.attention(q, k, v, rpb, sp, D ** -0.5, None,
                                                                   None, "cuda-naive"), 1)
                except Exception as e:  # noqa: BLE001
                    comp = "error: " + str(e).splitlines()[0][:60]
            if err:
                rows.append((name, mode, "-", "-", "-", "-", plain_plan["family"],
                             bias_plan["family"] + "/" + bias_plan["rpb_table"] + "/" +
                             bias_plan["backward_rpb_sums"], err))
            else:
                p = statistics.median(times["plain"])
                r = statistics.median(times["rpb"])
                gl = "%.3f" % (statistics.median(times["other"]) / p) if other else "-"
                fam = (bias_plan["family"] + "/" + bias_plan["rpb_table"] if mode == "fwd" else
                       bias_plan["backward_family"] + "/" + bias_plan["backward_rpb_sums"]
                       if mode == "fwd+bwd" else "sm80 deterministic/" +
                       (det_plan["backward_rpb_sums"] or "composition"))
                rows.append((name, mode, "%.3f" % p, "%.3f" % r, "%.3f" % (r / p), gl,
                             plain_plan["family"] if mode == "fwd" else
                             plain_plan["backward_family"], fam, comp))
            print("  ".join(str(x) for x in rows[-1]), flush=True)
        del q, k, v, d_out
        torch.cuda.empty_cache()
    print()
    print("| problem | mode | no bias (ms) | rpb (ms) | rpb / no bias | other / no bias | plan | "
          "plan with rpb (fwd: family / table; fwd+bwd: backward family / d rpb sums) | "
          "composition fwd (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")


if __name__ == "__main__":
    main()
