"""Context-parallel neighborhood attention: fna.distributed (halo exchange) against an all-gather
of K and V and against Ulysses (all-to-all of heads around a single-GPU fna call).

GPU run (NCCL), one process per GPU; the 1-, 2- and 4-GPU points run on subgroups of the world:

    torchrun --nproc-per-node 4 bench/cp_bench.py                 # 3d-video, bf16
    torchrun --nproc-per-node 4 bench/cp_bench.py --weak-frames 30

On the CPU, ``--dry-run`` prints the plan (shards, slabs, bytes per rank) without timing:

    python bench/cp_bench.py --dry-run --gpus 1,2,4

Methods (each forward, and forward + backward; median of CUDA-event timings, the slowest rank):

* ``halo``: ``fna.distributed.na3d`` (``--overlap off`` for the plain path, ``always`` to split
  every shard into interior and border slabs).
* ``all-gather``: every rank all-gathers K and V (shards padded to one length), then computes its
  queries (a query region) on the same slab as ``halo`` (so the two differ only in what is sent
  and when); the backward
  reduce-scatters dK / dV (torch.distributed.nn's autograd collectives).
* ``compute``: halo's calls (each segment a query region of its slab) on local random K / V
  slabs, without any communication: the part of halo's time that is computation.
* ``ulysses``: all-to-all of Q, K, V from "my rows, all heads" to "all rows, my heads", fna on the
  whole grid with H / world heads, all-to-all of the output back (needs heads % world == 0).

Bytes are those one rank sends in the forward (the backward sends as much again: dK / dV for the
halo and all-gather, dQ / dK / dV and dO for Ulysses); ``halo`` and ``all-gather`` count K and V,
Ulysses counts Q, K, V and O. ``kv/own`` is the slab's rows over the rank's own rows: the key /
value rows a rank holds per query row it computes (its queries are a query region of the slab,
so it computes exactly its own rows).
"""

import argparse
import os
import statistics
import sys


DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _ints(text):
    return tuple(int(x) for x in text.split(","))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", type=_ints, default=(30, 48, 80), help="grid (frames first)")
    ap.add_argument("--kernel", type=_ints, default=(18, 24, 24))
    ap.add_argument("--stride", type=_ints, default=(1, 1, 1))
    ap.add_argument("--dilation", type=_ints, default=(1, 1, 1))
    ap.add_argument("--causal", type=int, default=0, help="1: causal along the frame axis")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16")
    ap.add_argument("--gpus", type=_ints, default=None,
                    help="GPU counts of the strong-scaling series (default 1,2,4 up to the world)")
    ap.add_argument("--weak-frames", type=int, default=30,
                    help="frames per GPU of the weak-scaling series (0: none)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--overlap", choices=("on", "always", "off"), default="on",
                    help="fna.distributed's overlap: on (True), always, off (False)")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--methods", default="halo,all-gather,ulysses,compute",
                    help="compute: halo's query regions on local slabs, no communication")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and bytes; no timing")
    args = ap.parse_args(argv)
    for name in ("kernel", "stride", "dilation"):
        if len(getattr(args, name)) != len(args.shape):
            ap.error(f"--{name} {getattr(args, name)} needs one entry per axis of --shape "
                     f"{args.shape}")
    if args.kernel[0] * args.dilation[0] > args.shape[0]:
        ap.error(f"--kernel {args.kernel[0]} * --dilation {args.dilation[0]} exceeds the "
                 f"{args.shape[0]} frames")
    return args


def split_sizes(n, world):
    """torch.tensor_split's shard lengths."""
    return [n // world + (1 if r < n % world else 0) for r in range(world)]


def _overlap(args):
    return {"on": True, "always": "always", "off": False}[args.overlap]


def plan_rows(args, world, frames=None):
    """Per rank of a `world`-GPU run: shard and slab rows, bytes sent per method."""
    from fna import distributed as fd
    frames = args.shape[0] if frames is None else frames
    ax = fd.Axis(frames, args.kernel[0], args.dilation[0], args.stride[0], bool(args.causal))
    sizes = split_sizes(frames, world)
    plans = fd.plan(ax, sizes, overlap=_overlap(args))
    frame = args.batch
    for n in args.shape[1:]:
        frame *= n
    kv_row = 2 * frame * args.heads * args.dim * DTYPE_BYTES[args.dtype]  # K and V, one frame
    qkvo_row = 2 * kv_row
    sent = [0] * world
    received = [0] * world
    for s, r, r0, r1 in fd.transfers(plans):
        sent[s] += (r1 - r0) * kv_row
        received[r] += (r1 - r0) * kv_row
    pad = max(sizes)
    rows = []
    for r, pl in enumerate(plans):
        slab = sum(sg.b - sg.a for sg in pl.segments)
        rows.append(dict(
            rank=r, frames=frames, rows=sizes[r], ext=(pl.ext_start, pl.ext_end),
            segments=len(pl.segments), slab_rows=slab, kv_own=slab / sizes[r],
            halo_bytes=sent[r], halo_received=received[r],
            allgather_bytes=(world - 1) * pad * kv_row,
            ulysses_bytes=(sizes[r] * qkvo_row * (world - 1)) // world))
    return rows


def _gib(b):
    return f"{b / 2 ** 30:.3f}"


def print_plan(args, worlds, frames_of):
    print(f"grid {args.shape} (series below vary the frames), kernel {args.kernel}, stride "
          f"{args.stride}, dilation {args.dilation}, causal frames {bool(args.causal)}, B "
          f"{args.batch}, H {args.heads}, D {args.dim}, {args.dtype}; "
          f"overlap {_overlap(args)!r}")
    print("GiB sent per rank in the forward (max over ranks); kv/own = slab rows / own rows "
          "(max)")
    print(f"{'gpus':>4} {'frames':>6} {'shards':>16} {'halo':>8} {'all-gather':>10} "
          f"{'ulysses':>8} {'kv/own':>9}")
    for w in worlds:
        rows = plan_rows(args, w, frames_of(w))
        print(f"{w:>4} {rows[0]['frames']:>6} {','.join(str(r['rows']) for r in rows):>16} "
              f"{_gib(max(r['halo_bytes'] for r in rows)):>8} "
              f"{_gib(max(r['allgather_bytes'] for r in rows)):>10} "
              f"{_gib(max(r['ulysses_bytes'] for r in rows)):>8} "
              f"{max(r['kv_own'] for r in rows):>9.2f}")


# ---- timing (GPU) --------------------------------------------------------------------------------

def _time(fn, args, group):
    import torch
    import torch.distributed as dist
    for _ in range(args.warmup):
        fn()
    times = []
    for _ in range(args.iters):
        dist.barrier(group=group)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def _methods(args, group, world, me, frames, device="cuda"):
    """{name: f} for this rank, f() computing its output rows (`device`: "cpu" only to check the
    code paths with gloo, whose all_to_all needs shards of one length)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn
    import fna
    import fna.distributed as fd
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    sizes = split_sizes(frames, world)
    o, n = sum(sizes[:me]), sizes[me]
    shape = (args.batch, n, *args.shape[1:], args.heads, args.dim)
    g = torch.Generator(device=device).manual_seed(me)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=g).requires_grad_()
               for _ in range(3))
    kw = dict(kernel_size=args.kernel, stride=args.stride, dilation=args.dilation,
              is_causal=(bool(args.causal),) + (False,) * (len(args.shape) - 1))
    na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(args.shape)]
    dna = {1: fd.na1d, 2: fd.na2d, 3: fd.na3d}[len(args.shape)]
    out = {}

    def run(f):
        return f

    names = args.methods.split(",")
    if "compute" in names:
        # What halo computes, without communication: each of the rank's segments as a query
        # region of a slab of random K / V (the time halo would take with free transfers).
        ax = fd.Axis(frames, args.kernel[0], args.dilation[0], args.stride[0], bool(args.causal))
        segs = fd.plan(ax, sizes, overlap=_overlap(args))[me].segments
        slabs = [tuple(torch.randn((args.batch, sg.b - sg.a, *args.shape[1:], args.heads,
                                    args.dim), device=device, dtype=dtype, generator=g)
                       .requires_grad_() for _ in range(2)) for sg in segs]

        def compute():
            outs = [na(q[:, sg.q0 - o:sg.q1 - o], kk, vv,
                       query_offset=(sg.q0 - sg.a,) + (0,) * (len(args.shape) - 1), **kw)
                    for sg, (kk, vv) in zip(segs, slabs)]
            return outs[0] if len(outs) == 1 else torch.cat(outs, 1)
        out["compute"] = run(compute)
    if "halo" in names:
        out["halo"] = run(lambda: dna(q, k, v, group=group, overlap=_overlap(args), **kw))
    if "all-gather" in names:
        ax = fd.Axis(frames, args.kernel[0], args.dilation[0], args.stride[0], bool(args.causal))
        pl = fd.plan(ax, sizes, overlap=False)[me]
        a, b = pl.segments[0].a, pl.segments[0].b
        pad = max(sizes)

        def gather(t):
            tp = torch.nn.functional.pad(t, (0, 0) * (t.ndim - 2) + (0, pad - n))
            parts = dnn.all_gather(tp, group=group)
            return torch.cat([p[:, :s] for p, s in zip(parts, sizes)], 1)

        def allgather():
            kf, vf = gather(k), gather(v)
            offset = (o - a,) + (0,) * (len(args.shape) - 1)
            return na(q, kf[:, a:b], vf[:, a:b], query_offset=offset, **kw)
        out["all-gather"] = run(allgather)
    if "ulysses" in names and args.heads % world == 0:
        hw = args.heads // world

        def to_heads(t):  # [B, n, ..., H, D] -> [B, frames, ..., H / world, D]
            x = t.unflatten(-2, (world, hw)).movedim(-3, 0).contiguous()
            outs = [x.new_empty((args.batch, s, *args.shape[1:], hw, args.dim)) for s in sizes]
            outs = dnn.all_to_all(outs, list(x.unbind(0)), group=group)
            return torch.cat(outs, 1)

        def to_rows(t):  # [B, frames, ..., H / world, D] -> [B, n, ..., H, D]
            parts = [p.contiguous() for p in t.split(sizes, 1)]
            outs = [p.new_empty((args.batch, n, *args.shape[1:], hw, args.dim)) for p in parts]
            outs = dnn.all_to_all(outs, parts, group=group)
            return torch.stack(outs, -3).flatten(-3, -2)

        def ulysses():
            return to_rows(na(to_heads(q), to_heads(k), to_heads(v), **kw))
        out["ulysses"] = run(ulysses)
    dist.barrier(group=group)
    return out, (q, k, v)


def _timed(f, q):
    import torch

    def fwd():
        with torch.no_grad():
            f()

    def fwd_bwd():
        f().backward(torch.ones_like(q))
    return fwd, fwd_bwd


def print_results(args, results):
    """The table: per series, GPU count and method the times, the scaling against the same
    method's 1-GPU time (strong: speedup t1 / tw; weak: efficiency t1 / tw, ideal 1), bytes sent
    per rank and the slab's rows per own row."""
    base = {(k, n): (tf, tb) for k, w, _, n, tf, tb, _ in results if w == 1}
    print(f"{'series':>6} {'gpus':>4} {'frames':>6} {'method':>10} {'fwd ms':>8} "
          f"{'fwd+bwd ms':>10} {'scale fwd':>9} {'scale f+b':>9} {'GiB sent':>8} "
          f"{'kv/own':>9}")
    for kind, w, frames, name, tf, tb, sent in results:
        b = base.get((kind, name))
        sf = f"{b[0] / tf:.2f}" if b else "-"
        sb = f"{b[1] / tb:.2f}" if b and tb and b[1] else "-"
        rec = max(r["kv_own"] for r in plan_rows(args, w, frames)) if name != "ulysses" else 1
        # (compute: the same slabs as halo)
        print(f"{kind:>6} {w:>4} {frames:>6} {name:>10} {tf:>8.2f} "
              f"{'-' if tb is None else f'{tb:.2f}':>10} {sf:>9} {sb:>9} {_gib(sent):>8} "
              f"{rec:>9.2f}")


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        worlds = args.gpus or (1, 2, 4)
        print("strong scaling")
        print_plan(args, worlds, lambda w: args.shape[0])
        if args.weak_frames:
            print(f"weak scaling ({args.weak_frames} frames per GPU)")
            print_plan(args, worlds, lambda w: args.weak_frames * w)
        print("(--dry-run: nothing timed)")
        return 0
    import torch
    import torch.distributed as dist
    dist.init_process_group("nccl")
    me_world, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", me_world)))
    worlds = args.gpus or tuple(w for w in (1, 2, 4, 8) if w <= world)
    series = [("strong", w, args.shape[0]) for w in worlds]
    if args.weak_frames:
        series += [("weak", w, args.weak_frames * w) for w in worlds]
    results = []
    for kind, w, frames in series:
        group = dist.new_group(list(range(w)))  # every rank takes part in new_group
        if me_world < w:
            fns, (q, _, _) = _methods(args, group, w, me_world, frames)
            for name, f in fns.items():
                fwd, fwd_bwd = _timed(f, q)
                tf = _time(fwd, args, group)
                tb = None if args.no_backward else _time(fwd_bwd, args, group)
                rows = plan_rows(args, w, frames)
                key = {"halo": "halo_bytes", "all-gather": "allgather_bytes",
                       "ulysses": "ulysses_bytes"}.get(name)
                sent = max(r[key] for r in rows) if key else 0
                results.append((kind, w, frames, name, tf, tb, sent))
        dist.barrier()
    if me_world == 0:
        print_results(args, results)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
