"""The box, strip, SIMT and Hopper forwards with a relative positional bias under
compute-sanitizer: one small rank-2 call per configuration (and rank-1 / rank-3 calls for SIMT,
sm90 and sm90ws), the bias table staged in shared memory after the K / V rows (box, strip), read
per key (SIMT) or copied per key tile into slice buffers (sm90ws: by the loader warpgroup,
behind mbarriers, which racecheck checks; sm90 at rank 3, behind its per-tile barrier). Run on the device after `tools/gpu/run.sh build`:

    compute-sanitizer --tool memcheck python3 tools/experiments/rpb_sanitize.py [--families strip]
    compute-sanitizer --tool racecheck python3 tools/experiments/rpb_sanitize.py --families strip
    compute-sanitizer --tool racecheck python3 tools/experiments/rpb_sanitize.py --families sm90ws \
        --tuning fwd_copy=cp_async

Prints one line per call and the number of calls; the sanitizer's summary follows."""
import argparse

import torch

import fna


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="strip,box,simt")
    ap.add_argument("--tuning", default="", help="K=V[,K=V]: Options tuning for every call "
                    "(e.g. fwd_copy=cp_async: sm90ws's loader threads fill the slices)")
    args = ap.parse_args()
    tuning = dict(kv.split("=", 1) for kv in args.tuning.split(",") if kv)
    fams = args.families.split(",")
    g = torch.Generator(device="cuda").manual_seed(7)
    problems = [((1, 30, 37, 2, 32), (7, 7), (1, 2), (2, 1), (False, True)),
                ((1, 30, 40, 2, 64), (13, 5), (2, 1), (1, 3), (True, False))]
    if "simt" in fams or "sm90ws" in fams or "sm90" in fams:
        problems += [((1, 200, 2, 32), (9,), (2,), (3,), (True,)),
                     ((1, 6, 9, 10, 2, 32), (3, 5, 3), (2, 1, 1), (1, 2, 1), (False, False, True))]
    n = 0
    for shape, ks, dil, st, causal in problems:
        rank = len(ks)
        na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        rpb = torch.randn(shape[-2], *(2 * x - 1 for x in ks), device="cuda", generator=g)
        for name in fna.fused_configs(rank, "bfloat16", shape[-1]):
            if not any(f"_{f}_" in name for f in fams):  # (sm90: the plain Hopper forward)
                continue
            try:
                out = na(q, k, v, ks, dilation=dil, stride=st, is_causal=causal, rpb=rpb,
                         config=name, tuning=tuning or None)
            except NotImplementedError as e:
                print(f"skip {name}: {str(e)[:80]}")
                continue
            torch.cuda.synchronize()
            assert torch.isfinite(out.float()).all(), name
            print(f"ok {name} {shape} {ks}")
            n += 1
    print(f"{n} calls")


if __name__ == "__main__":
    main()
