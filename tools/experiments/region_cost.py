"""The cost of query regions on the fused forward / backward: each rank's region call of a
context-parallel split (its queries on its slab) against the whole call's share, with the plan each
runs (3d-video sharded over 4 ranks by default), per forward configuration.

    python3 tools/experiments/region_cost.py [--ranks 4] [--configs plan|all|NAME,..] [--bwd]
                                             [--ws-tuning K=V,..]

--configs all times every Hopper configuration of the problem's rank and head dim next to the
plan's choice; --bwd adds forward + backward times. `share` is the whole call's time times the
rank's fraction of the queries: a region call at its share costs what its queries cost inside the
whole call.
"""
import argparse
import sys

import torch

sys.path.insert(0, "python")
import fna  # noqa: E402
import fna.distributed as fd  # noqa: E402


def timed(f, reps=10):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        a.record()
        f()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def parse_tuning(text):
    if not text:
        return None
    return dict(kv.split("=", 1) for kv in text.split(","))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--shape", default="30,48,80")
    ap.add_argument("--kernel", default="18,24,24")
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--configs", default="plan", help="plan, all, or configuration names")
    ap.add_argument("--tuning", default="", help="K=V,.. for every call")
    ap.add_argument("--bwd", action="store_true", help="also time forward + backward")
    ap.add_argument("--only-ranks", default="", help="comma list of ranks to time (default all)")
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    ks = tuple(int(x) for x in args.kernel.split(","))
    H, D, rank = args.heads, args.dim, len(shape)
    tuning = parse_tuning(args.tuning)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((1, *shape, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]
    if args.configs == "plan":
        configs = [None]
    elif args.configs == "all":
        configs = [None] + [c for c in fna.fused_configs(rank, "bfloat16", D) if "sm90" in c]
    else:
        configs = [None] + args.configs.split(",")
    nq_total = 1
    for n in shape:
        nq_total *= n
    cases = [("whole", slice(None), slice(None), None)]
    ax = fd.Axis(shape[0], ks[0], 1, 1, False)
    sizes = [len(c) for c in torch.tensor_split(torch.arange(shape[0]), args.ranks)]
    only = {int(r) for r in args.only_ranks.split(",")} if args.only_ranks else None
    for r, pl in enumerate(fd.plan(ax, sizes, overlap=False)):
        if only is not None and r not in only:
            continue
        sg = pl.segments[0]
        off = (sg.q0 - sg.a,) + (0,) * (rank - 1)
        cases.append((f"rank {r} q[{sg.q0},{sg.q1}) slab[{sg.a},{sg.b})",
                      slice(sg.q0, sg.q1), slice(sg.a, sg.b), off))
    print(f"{'case':<34} {'config':<40} {'fwd ms':>8} {'share':>7} {'f+b ms':>8} {'share':>7} "
          f"{'grid':>6} {'fraction':>8}", flush=True)
    whole = {}
    for cfg in configs:
        for name, qs, kvs, off in cases:
            qq = q[:, qs].contiguous()
            kk, vv = k[:, kvs].contiguous(), v[:, kvs].contiguous()
            kw = dict(query_offset=off) if off is not None else {}
            try:
                pl = fna.fused_plan((1, *qq.shape[1:rank + 1], H, D), ks, tuning=tuning,
                                    config=cfg,
                                    **(dict(query_offset=off, grid_shape=kk.shape[1:rank + 1])
                                       if off else {}))
                tf = timed(lambda: fn(qq, kk, vv, ks, config=cfg, tuning=tuning, **kw))
                tb = float("nan")
                if args.bwd:
                    qg, kg, vg = (t.detach().requires_grad_() for t in (qq, kk, vv))
                    do = torch.randn_like(qq)

                    def fb():
                        fn(qg, kg, vg, ks, config=cfg, tuning=tuning, **kw).backward(do)
                    tb = timed(fb, reps=5)
            except (NotImplementedError, ValueError, RuntimeError) as e:
                print(f"{name:<34} {str(cfg):<40} {type(e).__name__}: {str(e)[:80]}", flush=True)
                continue
            share = qq.numel() / q.numel()
            if name == "whole":
                whole[cfg] = (tf, tb)
            wf, wb = whole.get(cfg, (float("nan"), float("nan")))
            print(f"{name:<34} {pl['config']:<40} {tf:>8.2f} {tf / (wf * share):>7.3f} "
                  f"{tb:>8.2f} {tb / (wb * share):>7.3f} {pl['grid']:>6} "
                  f"{pl.get('needed_fraction', float('nan')):>8.3f}", flush=True)


if __name__ == "__main__":
    main()
