"""Context parallelism: neighborhood attention over a grid sharded along its first spatial axis.

    import torch.distributed as dist, fna.distributed
    # each rank holds its contiguous shard of axis 0 (e.g. torch.tensor_split(x, world, dim=1)[r])
    out = fna.distributed.na3d(q_shard, k_shard, v_shard, kernel_size=(18, 24, 24), group=None)

Each rank gets the rows of the output that the single-process ``fna.na*d`` on the full tensors
would give for its shard, and autograd gives each rank the gradients of its shard.

How (docs/python.md "Context parallelism"): a rank runs ``fna.na*d`` with its queries as a
*query region* (``query_offset``) of a *slab* of rows ``[a, b)`` of axis 0 of K / V that holds
their whole windows: its own rows plus halo rows received from the ranks that own them. Only its
own queries are computed. The slab's own borders shift the windows of queries near them, so a
slab is exact for a query when

* the slab holds every key row of the query's window and the query's stride-group leader (the
  row its window is computed from; for a causal axis the last row of its stride group), and
* the slab starts on a multiple of ``stride * dilation`` (so the slab's dilation groups and
  stride groups are the global ones: both are anchored at global row 0), and
* the slab is at least ``kernel_size * dilation`` rows long (what fna requires of any grid).

:func:`slab_rows` computes the smallest such slab for a range of queries (`_need` uses the
monotonicity of window bounds in the query index, so it looks at one query per dilation group at
each end).

With ``overlap=True`` a rank first starts the halo exchange (``batch_isend_irecv``), computes its
*interior* queries -- those whose exact slab lies inside its own rows -- while the halos travel,
then waits and computes the two border ranges on their own slabs (where the slabs together hold
at most ``OVERLAP_MAX_EXTRA`` more rows than the one slab of the plain path: their key rows are
read once per slab).
The backward runs fna's backward on the same slabs, sends the halo rows' dK / dV back to their
owners (who add them to their own), and all-reduces the gradients of the replicated additional
keys / values.
"""

import struct
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import _args
from . import functional as _functional

__all__ = ["na1d", "na2d", "na3d", "slab_rows", "plan", "transfers", "Axis", "Segment",
           "RankPlan", "OVERLAP_MAX_EXTRA"]

# Keywords of fna.na*d that the distributed functions pass on; those also taken by fna.na_backward
# go to the backward too.
_FORWARD_KWARGS = ("config", "deterministic", "allow_tf32", "backward_config", "tuning",
                   "num_threads")
_BACKWARD_KWARGS = _FORWARD_KWARGS


from ._cp_plan import (OVERLAP_MAX_EXTRA, Axis, RankPlan, Segment, _need,  # noqa: F401
                       _overlap_mode, _rows_of_query, plan, slab_rows, transfers)


# ---- argument checks, agreed on by every rank ----------------------------------------------------

_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_META_FIELDS = ["error", "query.shape[1]", "key.shape[1]", "value.shape[1]",
                "query.shape[0] (batch)", "query.shape[2]", "query.shape[3]",
                "query.shape[-2] (heads)", "query.shape[-1] (head_dim)",
                "key.shape[-2] (heads_kv)", "value.shape[-1] (dim_v)", "dtype", "device type",
                "additional_keys given", "additional_keys.shape[1]", "kernel_size", "", "",
                "stride", "", "", "dilation", "", "", "is_causal", "", "", "scale", "overlap",
                "requires_grad of (query, key, value, additional_keys, additional_values)"]
_NAMED = {i: n for i, n in enumerate(_META_FIELDS)}
for _i, _n in enumerate(_META_FIELDS):
    if _n == "":
        _NAMED[_i] = _NAMED[_i - 1]


def _meta(fn, rank, query, key, value, ak, av, sp, scale, overlap):
    """The local facts every rank must agree on (all but the lengths of axis 0), as int64s;
    meta[0] != 0 when this rank's arguments are invalid (it raises after the all_gather, so no
    rank is left waiting in a collective)."""
    m = [0] * len(_META_FIELDS)
    try:
        named = (("query", query), ("key", key), ("value", value))
        for name, t in named:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
            _args.check_rank(fn, rank, name, t)
            if t.dtype != query.dtype:
                raise TypeError(f"{fn}: {name} has dtype {t.dtype} but query has {query.dtype}")
            if t.device != query.device:
                raise ValueError(f"{fn}: {name} is on {t.device} but query is on {query.device}")
        if query.dtype not in _DTYPES:
            raise TypeError(f"{fn}: query has dtype {query.dtype}; fna supports float32, float16 "
                            "and bfloat16")
        for name, t in named[1:]:
            if t.shape[0] != query.shape[0] or t.shape[2:1 + rank] != query.shape[2:1 + rank]:
                raise ValueError(f"{fn}: {name} has shape {tuple(t.shape)} but query has "
                                 f"{tuple(query.shape)} (batch and spatial axes 1.. must match)")
        if key.shape[-2] != value.shape[-2] or key.shape[-2] < 1 \
                or query.shape[-2] % key.shape[-2]:
            raise ValueError(f"{fn}: heads: query.shape[-2]={query.shape[-2]} must be a multiple "
                             f"of key.shape[-2]={key.shape[-2]} == value.shape[-2]="
                             f"{value.shape[-2]}")
        if key.shape[-1] != query.shape[-1]:
            raise ValueError(f"{fn}: key.shape[-1]={key.shape[-1]} must equal query.shape[-1]="
                             f"{query.shape[-1]}")
        _args.check_pair("additional_keys", ak, "additional_values", av)
        if ak is not None:
            for name, t, dim in (("additional_keys", ak, key.shape[-1]),
                                 ("additional_values", av, value.shape[-1])):
                _args.check_additional(name, t, query.shape[0], rank)
                if (t.shape[1] != ak.shape[1] or t.shape[2] != key.shape[-2]
                        or t.shape[3] != dim):
                    raise ValueError(f"{fn}: {name} has shape {tuple(t.shape)}; expected "
                                     f"[{query.shape[0]}, {ak.shape[1]}, {key.shape[-2]}, {dim}]")
        pad = list(query.shape[2:1 + rank]) + [1] * (3 - rank)
        m[1:4] = [query.shape[1], key.shape[1], value.shape[1]]
        m[4], m[5], m[6] = query.shape[0], pad[0], pad[1]
        m[7], m[8], m[9], m[10] = query.shape[-2], query.shape[-1], key.shape[-2], value.shape[-1]
        m[11] = _DTYPES[query.dtype]
        m[12] = 1 if query.device.type == "cuda" else 0
        m[13] = int(ak is not None)
        m[14] = ak.shape[1] if ak is not None else 0
        z = [0] * (3 - rank)
        m[15:27] = (sp[0] + z + sp[1] + z + sp[2] + z + [int(c) for c in sp[3]] + z)
        m[27] = struct.unpack("<q", struct.pack("<d", float(scale)))[0]
        m[28] = {False: 0, True: 1, "always": 2}[overlap]
        m[29] = sum(1 << i for i, t in enumerate((query, key, value, ak, av))
                    if t is not None and t.requires_grad)
        m[0] = 0
        return m, None
    except (TypeError, ValueError) as e:
        m[0] = 1
        return m, e


def _agree(fn, group, metas, local_error, sizes_names=("query", "key", "value")):
    bad = [r for r, m in enumerate(metas) if m[0]]
    if bad:
        if local_error is not None:
            raise local_error
        raise ValueError(f"{fn}: rank {bad[0]} of the group passed invalid arguments (it raised "
                         "the error)")
    for f in range(4, len(_META_FIELDS)):
        vals = [m[f] for m in metas]
        if any(v != vals[0] for v in vals):
            name = _NAMED[f]
            if name.startswith("requires_grad"):
                vals = [tuple(bool(v >> i & 1) for i in range(5)) for v in vals]
            if name == "scale":
                vals = [struct.unpack("<d", struct.pack("<q", v))[0] for v in vals]
            raise ValueError(f"{fn}: {name} differs across the ranks of the group: "
                             f"{', '.join(f'rank {r}: {v}' for r, v in enumerate(vals))} (every "
                             "rank must pass the same problem, sharded along axis 0 only)")
    for r, m in enumerate(metas):
        lens = dict(zip(sizes_names, m[1:4]))
        if len(set(lens.values())) != 1:
            raise ValueError(f"{fn}: on rank {r} the shard lengths of axis 0 differ: "
                             + ", ".join(f"{n}.shape[1]={v}" for n, v in lens.items()))
        if m[1] < 1:
            raise ValueError(f"{fn}: rank {r} holds a shard of length {m[1]} of axis 0 "
                             "(query.shape[1]); every rank needs at least one row")


# ---- communication -------------------------------------------------------------------------------

def _peer(group, r):
    return r if group is None else dist.get_global_rank(group, r)


def _start(group, ops):
    """Posts the point-to-point ops; the works to wait for ([] if none)."""
    ops = [dist.P2POp(op, t, _peer(group, peer), group, tag) for op, t, peer, tag in ops]
    return dist.batch_isend_irecv(ops) if ops else []


def _wait(works):
    for w in works:
        w.wait()


def _rows(t, r0, r1):
    """Rows [r0, r1) of axis 1 (spatial axis 0) of t, as a view."""
    return t.narrow(1, r0, r1 - r0)


# ---- the autograd function -----------------------------------------------------------------------

class _Ctx(NamedTuple):
    fn: str
    rank: int        # spatial rank (1, 2, 3)
    me: int          # this process's rank in the group
    group: object
    plans: list
    sp: tuple
    scale: float
    backend: object
    fwd_kwargs: dict
    bwd_kwargs: dict
    chunks: tuple    # kv-head ranges the exchange and the computation are pipelined over


# overlap=True / "always" pipelines the ranks, where each one's queries form one segment (no
# interior to compute while the halos travel; 3d-video on 2-4 GPUs), over this many groups of KV
# heads: group
# c's halo rows travel while group c - 1 computes (forward), and group c's dK / dV halo rows go
# back while group c + 1's backward runs. On CUDA consecutive groups run on two side streams, so
# one group's last CTAs share the GPU with the next group's first.
PIPELINE_CHUNKS = 4


def _head_chunks(plans, heads_kv, overlap):
    """The kv-head ranges of the pipeline, the same on every rank (each posts its transfers per
    range): one range (no pipeline) without overlap, without halo rows anywhere, or where some
    rank has an interior segment (it overlaps that instead)."""
    halo = any(pl.ext_start < pl.start or pl.ext_end > pl.end for pl in plans)
    single = all(len(pl.segments) == 1 for pl in plans)
    if overlap is False or not halo or not single or heads_kv < 2:
        return ((0, heads_kv),)
    n = min(PIPELINE_CHUNKS, heads_kv)
    out, h = [], 0
    for i in range(n):
        w = heads_kv // n + (1 if i < heads_kv % n else 0)
        out.append((h, h + w))
        h += w
    return tuple(out)


_SIDE_STREAMS = {}


def _side_streams(device):
    """Two side streams of a CUDA device (created once), or None off CUDA."""
    if device.type != "cuda":
        return None
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE_STREAMS:
        _SIDE_STREAMS[idx] = (torch.cuda.Stream(idx), torch.cuda.Stream(idx))
    return _SIDE_STREAMS[idx]


class _OnStream:
    """`with _OnStream(streams, c):` runs the block on side stream c % 2 (after everything the
    current stream has queued so far), or on the current stream off CUDA."""

    def __init__(self, streams, c):
        self.s = None if streams is None else streams[c % 2]

    def __enter__(self):
        if self.s is not None:
            self.main = torch.cuda.current_stream(self.s.device)
            self.s.wait_stream(self.main)
            self.cm = torch.cuda.stream(self.s)
            self.cm.__enter__()
        return self

    def keep(self, *tensors):
        """Marks tensors made on the side stream as used by the main stream too."""
        if self.s is not None:
            for t in tensors:
                if t is not None:
                    t.record_stream(self.main)

    def __exit__(self, *exc):
        if self.s is not None:
            self.cm.__exit__(*exc)
        return False


def _join(streams):
    """The current stream waits for both side streams."""
    if streams is not None:
        main = torch.cuda.current_stream(streams[0].device)
        for st in streams:
            main.wait_stream(st)


def _extended(pl, t):
    """The rank's rows [ext_start, ext_end) of K or V (or of their gradients): ``t`` itself when
    it holds no halo, else a new buffer with ``t`` copied into its own rows (the halo rows are
    received into it)."""
    if pl.ext_start == pl.start and pl.ext_end == pl.end:
        return t
    ext = t.new_empty((t.shape[0], pl.ext_end - pl.ext_start) + tuple(t.shape[2:]))
    _rows(ext, pl.start - pl.ext_start, pl.end - pl.ext_start).copy_(t)
    return ext


def _exchange_ops(ctx, tensors, backward=False, into=None, tag0=0):
    """The ops of the halo exchange of `tensors` (forward: owners send rows of their shards;
    backward: holders send the rows' gradients back from their extended buffers), and the
    receives: forward, into the rows of the extended buffers `into` (directly where those rows
    are contiguous, as with batch 1; else through a buffer copied in by _finish); backward, into
    new buffers, returned by (sender, index, first row) for the caller to add. Also the sent
    buffers (kept alive until the wait)."""
    ops, recv, keep = [], {}, []
    me, plans = ctx.me, ctx.plans
    pl = plans[me]
    for sender, receiver, r0, r1 in transfers(plans):
        if backward:
            sender, receiver = receiver, sender
        if me not in (sender, receiver):
            continue
        for i, t in enumerate(tensors):
            tag = tag0 + i
            if me == sender:
                first = pl.ext_start if backward else pl.start
                buf = _rows(t, r0 - first, r1 - first).contiguous()
                keep.append(buf)
                ops.append((dist.isend, buf, receiver, tag))
            else:
                dst = None if into is None else _rows(into[i], r0 - pl.ext_start,
                                                      r1 - pl.ext_start)
                if dst is not None and dst.is_contiguous():
                    buf = dst
                else:
                    buf = t.new_empty((t.shape[0], r1 - r0) + tuple(t.shape[2:]))
                recv[(sender, i, r0)] = (buf, dst)
                ops.append((dist.irecv, buf, sender, tag))
    return ops, recv, keep


def _finish(recv):
    """Copies the forward's halos received through buffers into their rows."""
    for buf, dst in recv.values():
        if dst is not None and buf is not dst:
            dst.copy_(buf)


def _offset(ctx, seg):
    """query_offset of the segment's queries [q0, q1) in its slab [a, b)."""
    return [seg.q0 - seg.a] + [0] * (ctx.rank - 1)


def _slab(pl, ext, seg):
    """The segment's slab [a, b) of an extended buffer."""
    return _rows(ext, seg.a - pl.ext_start, seg.b - pl.ext_start)


def _run_segment(ctx, seg, q, k_ext, v_ext, ak, av):
    """fna on the segment's slab: (out, lse) of its queries [q0, q1), computed alone (the
    slab's keys and values, the queries as a query region of it)."""
    pl = ctx.plans[ctx.me]
    return getattr(_functional, f"na{ctx.rank}d")(
        _rows(q, seg.q0 - pl.start, seg.q1 - pl.start), _slab(pl, k_ext, seg),
        _slab(pl, v_ext, seg), *ctx.sp, scale=ctx.scale, additional_keys=ak,
        additional_values=av, backend=ctx.backend, return_lse=True,
        query_offset=_offset(ctx, seg), **ctx.fwd_kwargs)


def _heads(t, h0, h1, per=1):
    """Heads [h0 * per, h1 * per) of t ([B, ..., H, D]) as a view."""
    return t.narrow(-2, h0 * per, (h1 - h0) * per)


def _forward_pipelined(ctx, query, key, value, ak, av):
    """The forward over ctx.chunks (one segment): each kv-head group's halos are received into
    its own extended buffers while the previous group computes. Returns (out, lse, k_exts,
    v_exts)."""
    pl = ctx.plans[ctx.me]
    seg = pl.segments[0]
    per = query.shape[-2] // key.shape[-2]  # query heads per kv head
    streams = _side_streams(query.device)
    k_exts, v_exts, posted = [], [], []
    for c, (h0, h1) in enumerate(ctx.chunks):
        kc, vc = _heads(key, h0, h1), _heads(value, h0, h1)
        k_ext, v_ext = _extended(pl, kc), _extended(pl, vc)
        ops, recv, keep = _exchange_ops(ctx, (kc, vc), into=(k_ext, v_ext), tag0=2 * c)
        posted.append((_start(ctx.group, ops), recv, keep))
        k_exts.append(k_ext)
        v_exts.append(v_ext)
    outs, lses = [], []
    for c, (h0, h1) in enumerate(ctx.chunks):
        works, recv, keep = posted[c]
        with _OnStream(streams, c) as on:
            _wait(works)
            _finish(recv)
            add = (None, None) if ak is None else (_heads(ak, h0, h1), _heads(av, h0, h1))
            o, lse = _run_segment(ctx, seg, _heads(query, h0, h1, per), k_exts[c], v_exts[c],
                                  *add)
            on.keep(o, lse)
        outs.append(o)
        lses.append(lse)
        del keep
    _join(streams)
    return torch.cat(outs, -2), torch.cat(lses, -1), k_exts, v_exts


def _backward_pipelined(ctx, query, k_exts, v_exts, ak, av, out, lse, d_out, d_lse):
    """The backward over ctx.chunks: each kv-head group's dK / dV halo rows go back to their
    owners while the next group's backward runs. Returns (dq, dk, dv, dak, dav) of this rank's
    rows (dak / dav summed over the group's ranks: None without additional keys)."""
    pl = ctx.plans[ctx.me]
    seg = pl.segments[0]
    per = query.shape[-2] // ctx.chunks[-1][1]  # query heads per kv head
    streams = _side_streams(query.device)
    grads, posted = [], []
    for c, (h0, h1) in enumerate(ctx.chunks):
        with _OnStream(streams, c) as on:
            qs = (lambda t: _heads(t, h0, h1, per))  # noqa: E731
            lse_c = lse.narrow(-1, h0 * per, (h1 - h0) * per)
            d_lse_c = None if d_lse is None else d_lse.narrow(-1, h0 * per, (h1 - h0) * per)
            add = (None, None) if ak is None else (_heads(ak, h0, h1), _heads(av, h0, h1))
            g = _segment_backward(ctx, seg, qs(query), k_exts[c], v_exts[c], *add, qs(out),
                                  lse_c, qs(d_out), d_lse_c)
            # posted from the side stream: the transfers wait for this group's gradients
            ops, recv, keep = _exchange_ops(ctx, (g[1], g[2]), backward=True, tag0=2 * c)
            posted.append((_start(ctx.group, ops), recv, keep))
            on.keep(*g)
        grads.append(g)
    _join(streams)
    off, n = pl.start - pl.ext_start, pl.end - pl.start
    dks, dvs = [], []
    for g, (works, recv, keep) in zip(grads, posted):
        _wait(works)
        dk, dv = _rows(g[1], off, off + n), _rows(g[2], off, off + n)
        for (sender, i, r0), (buf, _) in recv.items():
            _rows(dk if i == 0 else dv, r0 - pl.start, r0 - pl.start + buf.shape[1]).add_(buf)
        dks.append(dk)
        dvs.append(dv)
        del keep
    dq = torch.cat([g[0] for g in grads], -2)
    dak = dav = None
    if ak is not None:
        dak = torch.cat([g[3] for g in grads], -2).float()
        dav = torch.cat([g[4] for g in grads], -2).float()
    return dq, torch.cat(dks, -2), torch.cat(dvs, -2), dak, dav


class _ContextParallelNA(torch.autograd.Function):

    @staticmethod
    def forward(fctx, ctx, query, key, value, ak, av):
        pl = ctx.plans[ctx.me]
        fctx.ctx = ctx
        fctx.has_additional = ak is not None
        fctx.set_materialize_grads(False)
        if len(ctx.chunks) > 1:
            out, lse, k_exts, v_exts = _forward_pipelined(ctx, query, key, value, ak, av)
            fctx.save_for_backward(query, ak, av, out, lse, *k_exts, *v_exts)
            return out, lse
        # K and V rows [ext_start, ext_end): the own rows copied in, the halos received into
        # their rows; kept for the backward.
        k_ext, v_ext = _extended(pl, key), _extended(pl, value)
        ops, recv, keep = _exchange_ops(ctx, (key, value), into=(k_ext, v_ext))
        works = _start(ctx.group, ops)
        results = {}
        for seg in pl.segments:  # interior queries (own rows only) while the halos travel
            if seg.interior:
                results[seg] = _run_segment(ctx, seg, query, k_ext, v_ext, ak, av)
        _wait(works)
        del keep
        _finish(recv)
        for seg in pl.segments:
            if not seg.interior:
                results[seg] = _run_segment(ctx, seg, query, k_ext, v_ext, ak, av)
        outs = [results[seg] for seg in pl.segments]
        out = outs[0][0] if len(outs) == 1 else torch.cat([o for o, _ in outs], 1)
        lse = outs[0][1] if len(outs) == 1 else torch.cat([s for _, s in outs], 1)
        out, lse = out.contiguous(), lse.contiguous()
        fctx.save_for_backward(query, ak, av, out, lse, k_ext, v_ext)
        return out, lse

    @staticmethod
    def backward(fctx, d_out, d_lse):
        ctx = fctx.ctx
        query, ak, av, out, lse, *exts = fctx.saved_tensors
        pl = ctx.plans[ctx.me]
        # No early return when neither output reached this rank's loss: the other ranks post
        # the halo exchange and the all_reduce below, so this rank joins them with zero
        # gradients.
        if d_out is None:
            d_out = torch.zeros_like(out)
        if len(ctx.chunks) > 1:
            c = len(ctx.chunks)
            dq, dk, dv, dak, dav = _backward_pipelined(ctx, query, exts[:c], exts[c:], ak, av,
                                                       out, lse, d_out, d_lse)
            return (None, dq, dk) + _reduced(fctx, ctx, dv, dak, dav, ak, av)
        k_ext, v_ext = exts
        dak = dav = None
        seg_backward = lambda seg: _segment_backward(  # noqa: E731
            ctx, seg, query, k_ext, v_ext, ak, av, out, lse, d_out, d_lse)
        if len(pl.segments) == 1:
            # One slab, the rank's rows [ext_start, ext_end): its gradients are the extended
            # gradients, in the inputs' dtype (as what is sent and received).
            grads = seg_backward(pl.segments[0])
            dq, dk_ext, dv_ext = grads[0], grads[1], grads[2]
            if len(grads) > 3:
                dak, dav = grads[3].float(), grads[4].float()
            ops, recv, keep = _exchange_ops(ctx, (dk_ext, dv_ext), backward=True)
            works = _start(ctx.group, ops)
        else:
            acc = torch.float32 if k_ext.dtype != torch.float64 else k_ext.dtype
            dk_ext = torch.zeros_like(k_ext, dtype=acc)
            dv_ext = torch.zeros_like(v_ext, dtype=acc)
            dq = torch.empty_like(query)

            def add(seg, grads):
                nonlocal dak, dav
                o = seg.q0 - pl.start
                _rows(dq, o, o + seg.q1 - seg.q0).copy_(grads[0])
                _slab(pl, dk_ext, seg).add_(grads[1])
                _slab(pl, dv_ext, seg).add_(grads[2])
                if len(grads) > 3:
                    dak = grads[3].float() if dak is None else dak.add_(grads[3])
                    dav = grads[4].float() if dav is None else dav.add_(grads[4])

            # Border segments first: their halo rows' gradients go back to the owners while
            # the interior's backward runs.
            for seg in pl.segments:
                if not seg.interior:
                    add(seg, seg_backward(seg))
            send_k = dk_ext.to(k_ext.dtype) if acc != k_ext.dtype else dk_ext
            send_v = dv_ext.to(v_ext.dtype) if acc != v_ext.dtype else dv_ext
            ops, recv, keep = _exchange_ops(ctx, (send_k, send_v), backward=True)
            works = _start(ctx.group, ops)
            for seg in pl.segments:
                if seg.interior:
                    add(seg, seg_backward(seg))
        _wait(works)
        del keep
        off = pl.start - pl.ext_start
        dk = _rows(dk_ext, off, off + pl.end - pl.start)
        dv = _rows(dv_ext, off, off + pl.end - pl.start)
        for (sender, i, r0), (buf, _) in recv.items():
            tgt = dk if i == 0 else dv
            _rows(tgt, r0 - pl.start, r0 - pl.start + buf.shape[1]).add_(buf)
        return (None, dq, dk.to(k_ext.dtype)) + _reduced(fctx, ctx, dv.to(v_ext.dtype), dak, dav,
                                                         ak, av)


def _reduced(fctx, ctx, dv, dak, dav, ak, av):
    """(dv, dak, dav) with the additional keys' gradients summed over the group's ranks."""
    if dak is not None and (fctx.needs_input_grad[4] or fctx.needs_input_grad[5]):
        dist.all_reduce(dak, group=ctx.group)
        dist.all_reduce(dav, group=ctx.group)
        dak, dav = dak.to(ak.dtype), dav.to(av.dtype)
    return dv, dak, dav


def _segment_backward(ctx, seg, query, k_ext, v_ext, ak, av, out, lse, d_out, d_lse):
    """fna's backward of the segment's queries (a query region of its slab): d_query of the
    queries, d_key / d_value of the slab's rows, and the additional keys' gradients."""
    pl = ctx.plans[ctx.me]

    def sl(t):
        return _rows(t, seg.q0 - pl.start, seg.q1 - pl.start)
    return _functional.na_backward(
        sl(d_out), sl(query), _slab(pl, k_ext, seg), _slab(pl, v_ext, seg), sl(out), sl(lse),
        *ctx.sp, scale=ctx.scale, additional_keys=ak, additional_values=av,
        backend=ctx.backend, d_lse=None if d_lse is None else sl(d_lse),
        query_offset=_offset(ctx, seg), **ctx.bwd_kwargs)


# ---- the public functions ------------------------------------------------------------------------

def _na(fn, rank, query, key, value, kernel_size, stride, dilation, is_causal, scale,
        additional_keys, additional_values, backend, return_lse, group, overlap, kwargs):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{fn}: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first (or use fna.na"
                           f"{rank}d on one process)")
    err = None
    sp = None
    # Every local check raises only after the all_gather below (through `err`), so a rank with a
    # bad argument never leaves the others waiting in a collective.
    try:
        for k in kwargs:
            if k not in _FORWARD_KWARGS:
                raise TypeError(f"{fn}: unexpected keyword argument {k!r} (fna.distributed "
                                f"passes on {', '.join(_FORWARD_KWARGS)})")
        _args.check_return_lse(fn, return_lse)
        sp = _args.spatial(rank, kernel_size, stride, dilation, is_causal)
        _args.check_spatial(fn, sp)
        overlap = _overlap_mode(overlap)
        d = query.shape[-1] if isinstance(query, torch.Tensor) else 1
        scale = _args.resolve_scale(scale, d)
    except (TypeError, ValueError) as e:
        err = e if fn in str(e) else type(e)(f"{fn}: {e}")
    if err is None:
        meta, err = _meta(fn, rank, query, key, value, additional_keys, additional_values, sp,
                          scale, overlap)
    else:
        meta = [1] + [0] * (len(_META_FIELDS) - 1)
    device = query.device if isinstance(query, torch.Tensor) else torch.device("cpu")
    me = dist.get_rank(group)
    if me < 0:
        raise ValueError(f"{fn}: group={group!r} does not contain this process (global rank "
                         f"{dist.get_rank()})")
    world = dist.get_world_size(group)
    mine = torch.tensor(meta, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    metas = [g.tolist() for g in gathered]
    _agree(fn, group, metas, err)
    sizes = [m[1] for m in metas]
    L = sum(sizes)
    K, s, d, c = sp[0][0], sp[1][0], sp[2][0], sp[3][0]
    if K > L // d:
        raise ValueError(f"{fn}: kernel_size[0]={K} * dilation[0]={d} exceeds the input length "
                         f"{L} of axis 0 (the shards' lengths {sizes} summed over the group)")
    if s > K:
        raise ValueError(f"{fn}: stride[0]={s} must be in [1, kernel_size[0]={K}]")
    ax = Axis(L, K, d, s, c)
    plans = plan(ax, sizes, overlap)
    ctx = _Ctx(fn, rank, me, group, plans, sp, scale, backend, dict(kwargs),
               {k: v for k, v in kwargs.items() if k in _BACKWARD_KWARGS},
               _head_chunks(plans, key.shape[-2], overlap))
    out, lse = _ContextParallelNA.apply(ctx, query, key, value, additional_keys,
                                        additional_values)
    return (out, lse) if return_lse else out


_DOC = """{r}-D neighborhood attention with context parallelism over ``group``.

    Each rank passes its contiguous shard of axis 0 of ``query``, ``key`` and ``value``
    (``[B, L_r, ..., H, D]``; the shards' lengths may differ by rank, none may be empty) and gets
    the same rows of the output of ``fna.na{r}d`` on the whole tensors (and of the LSE with
    ``return_lse``). Every argument is that of :func:`fna.na{r}d` and must be the same on every
    rank; ``additional_keys`` / ``additional_values`` are replicated (each rank passes all of
    them; their gradients are summed over the group). ``group``: a torch.distributed process
    group (default: the world). ``overlap``: compute the queries that need no halo rows while the
    halos travel: True splits where that costs at most 10% more computed rows, "always"
    wherever possible, False never. A collective: every rank of the group must call it, and run
    the backward. See docs/python.md "Context parallelism".
    """


def na1d(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None,
         additional_keys=None, additional_values=None, backend=None, return_lse=False,
         group=None, overlap=True, **kwargs):
    return _na("fna.distributed.na1d", 1, query, key, value, kernel_size, stride, dilation,
               is_causal, scale, additional_keys, additional_values, backend, return_lse, group,
               overlap, kwargs)


def na2d(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None,
         additional_keys=None, additional_values=None, backend=None, return_lse=False,
         group=None, overlap=True, **kwargs):
    return _na("fna.distributed.na2d", 2, query, key, value, kernel_size, stride, dilation,
               is_causal, scale, additional_keys, additional_values, backend, return_lse, group,
               overlap, kwargs)


def na3d(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None,
         additional_keys=None, additional_values=None, backend=None, return_lse=False,
         group=None, overlap=True, **kwargs):
    return _na("fna.distributed.na3d", 3, query, key, value, kernel_size, stride, dilation,
               is_causal, scale, additional_keys, additional_values, backend, return_lse, group,
               overlap, kwargs)


for _r in (1, 2, 3):
    globals()[f"na{_r}d"].__doc__ = _DOC.format(r=_r)
