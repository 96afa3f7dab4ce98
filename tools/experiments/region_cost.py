"""The cost of query regions on the fused forward / backward: a region call against the whole
call's share, with the plan each runs (3d-video sharded over 4 ranks by default).

    python3 tools/experiments/region_cost.py [--ranks 4]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--shape", default="30,48,80")
    ap.add_argument("--kernel", default="18,24,24")
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    ks = tuple(int(x) for x in args.kernel.split(","))
    H, D = 24, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((1, *shape, H, D), device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    rows = []

    def case(name, qq, kk, vv, off, tuning=None):
        kw = dict(query_offset=off) if off is not None else {}
        tf = timed(lambda: fna.na3d(qq, kk, vv, ks, tuning=tuning, **kw))
        grid = (1, *kk.shape[1:4], H, D)
        pl = fna.fused_plan((1, *qq.shape[1:4], H, D), ks, tuning=tuning,
                            **(dict(query_offset=off, grid_shape=kk.shape[1:4]) if off else {}))
        rows.append((name, tf, pl["config"], pl["copy"], pl["grid"]))

    case("whole", q, k, v, None)
    case("whole cp_async", q, k, v, None, {"fwd_copy": "cp_async"})
    ax = fd.Axis(shape[0], ks[0], 1, 1, False)
    sizes = [len(c) for c in torch.tensor_split(torch.arange(shape[0]), args.ranks)]
    for r, pl in enumerate(fd.plan(ax, sizes, overlap=False)):
        sg = pl.segments[0]
        case(f"rank {r} q[{sg.q0},{sg.q1}) slab[{sg.a},{sg.b})", q[:, sg.q0:sg.q1],
             k[:, sg.a:sg.b], v[:, sg.a:sg.b], (sg.q0 - sg.a, 0, 0))
    print(f"{'case':<48} {'fwd ms':>8} {'config':<36} {'copy':<9} {'grid':>7}")
    for name, tf, cfg, copy, grid in rows:
        print(f"{name:<48} {tf:>8.2f} {cfg:<36} {copy:<9} {grid:>7}")


if __name__ == "__main__":
    main()
