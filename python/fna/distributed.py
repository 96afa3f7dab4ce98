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
import zlib
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import _args, _torch_ops, _window
from . import functional as _functional

__all__ = ["na1d", "na2d", "na3d", "slab_rows", "plan", "transfers", "Axis", "Segment",
           "RankPlan", "OVERLAP_MAX_EXTRA"]

# Keywords of fna.na*d that the distributed functions pass on; those also taken by fna.na_backward
# go to the backward too.
_FORWARD_KWARGS = ("config", "deterministic", "allow_tf32", "backward_config", "tuning",
                   "num_threads")
_BACKWARD_KWARGS = _FORWARD_KWARGS


# ---- the rows of axis 0 a query needs (its window: docs/semantics.md 1.1, fna._window) -----------

class Axis(NamedTuple):
    """Axis 0 of the global problem."""
    length: int
    kernel: int
    dilation: int
    stride: int
    causal: bool


def _rows_of_query(ax, x):
    """Global rows [lo, hi) that query row x needs in a slab: its window's keys and its stride
    group's leader (the leader sets the window; for causal windows it lies past the keys)."""
    w = _window.axis_window(x, ax.length, ax.kernel, ax.dilation, ax.stride, ax.causal)
    d, g = ax.dilation, w.group
    return w.start * d + g, (max(w.end, w.leader + 1) - 1) * d + g + 1


def _need(ax, x0, x1):
    """Rows [lo, hi) needed by the queries [x0, x1). Window bounds and leaders are non-decreasing
    in the query index within a dilation group, so the first query of each group gives lo and
    the last one hi."""
    lo = min(_rows_of_query(ax, x)[0] for x in range(x0, min(x0 + ax.dilation, x1)))
    hi = max(_rows_of_query(ax, x)[1] for x in range(max(x1 - ax.dilation, x0), x1))
    return lo, hi


def slab_rows(ax, x0, x1, bound=None):
    """The smallest slab [a, b) of global rows of axis 0 on which fna computes the queries
    [x0, x1) exactly (see the module docstring), inside ``bound`` = (lo, hi) (default: the whole
    axis); None when no slab inside ``bound`` works."""
    lo_b, hi_b = (0, ax.length) if bound is None else bound
    lo, hi = _need(ax, x0, x1)
    unit = ax.stride * ax.dilation
    a, b = lo - lo % unit, hi
    need = ax.kernel * ax.dilation  # fna's K * d <= L on the slab
    if b - a < need:
        b = min(hi_b, a + need)
        if b - a < need:
            a = min(a, ((b - need) // unit) * unit)
    if a < lo_b or b > hi_b or b - a < need:
        return None
    return a, b


class Segment(NamedTuple):
    """Queries [q0, q1) computed on the slab [a, b) (global rows of axis 0); ``interior``: the
    slab lies in the rank's own rows (computed before the halos arrive)."""
    q0: int
    q1: int
    a: int
    b: int
    interior: bool


class RankPlan(NamedTuple):
    start: int      # the rank's own rows [start, end)
    end: int
    ext_start: int  # rows it holds after the exchange [ext_start, ext_end) (halos included)
    ext_end: int
    segments: tuple


def _interior(ax, s0, e0):
    """The interior queries [p, q) of the shard [s0, e0) and their slab, or None."""
    d = ax.dilation
    unit = ax.stride * d

    def lo_ok(p):  # the slab of the queries from p on starts in the shard
        lo = min(_rows_of_query(ax, x)[0] for x in range(p, min(p + d, e0)))
        return lo - lo % unit >= s0

    def hi_ok(q):  # the slab of the queries before q ends in the shard
        return max(_rows_of_query(ax, x)[1] for x in range(max(q - d, s0), q)) <= e0

    lo, hi = s0, e0  # first p in [s0, e0) with lo_ok (monotone); e0 if none
    while lo < hi:
        mid = (lo + hi) // 2
        if lo_ok(mid):
            hi = mid
        else:
            lo = mid + 1
    p = lo
    if p >= e0:
        return None
    lo, hi = p + 1, e0  # last q in (p, e0] with hi_ok (monotone)
    if not hi_ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hi_ok(mid):
            lo = mid
        else:
            hi = mid - 1
    q = lo
    slab = slab_rows(ax, p, q, bound=(s0, e0))
    return None if slab is None else (p, q, slab)


# overlap=True splits a rank's queries into interior and border segments only when their slabs
# together hold at most this much more rows than the one slab of the plain path (each segment
# computes only its own queries, but each slab's key rows are read by its own call).
OVERLAP_MAX_EXTRA = 0.1


def _overlap_mode(overlap):
    if overlap is True or overlap is False or overlap == "always":
        return overlap
    raise ValueError(f"overlap={overlap!r} must be True (split when it costs at most "
                     f"{OVERLAP_MAX_EXTRA:.0%} more computed rows), 'always' or False")


def plan(ax, sizes, overlap=True):
    """Per rank (shard sizes ``sizes`` of axis 0, in rank order) the segments it computes and the
    rows it must hold. Every rank computes every rank's plan, so senders know what to send.
    ``overlap``: False: one segment per rank (its whole shard on one slab); "always": interior
    and border segments wherever an interior exists; True: the split where its slabs hold at
    most ``OVERLAP_MAX_EXTRA`` more rows than the single slab."""
    overlap = _overlap_mode(overlap)
    plans, s0 = [], 0
    for n in sizes:
        e0 = s0 + n
        a, b = slab_rows(ax, s0, e0)
        segs = [Segment(s0, e0, a, b, a >= s0 and b <= e0)]
        inner = _interior(ax, s0, e0) if overlap and not segs[0].interior else None
        if inner is not None:
            p, q, (a, b) = inner
            split = []
            if p > s0:
                split.append(Segment(s0, p, *slab_rows(ax, s0, p), False))
            split.append(Segment(p, q, a, b, True))
            if q < e0:
                split.append(Segment(q, e0, *slab_rows(ax, q, e0), False))
            rows = sum(sg.b - sg.a for sg in split)
            if overlap == "always" or rows <= (1 + OVERLAP_MAX_EXTRA) * (segs[0].b - segs[0].a):
                segs = split
        plans.append(RankPlan(s0, e0, min(sg.a for sg in segs), max(sg.b for sg in segs),
                              tuple(segs)))
        s0 = e0
    return plans


def transfers(plans):
    """(sender, receiver, row0, row1): the rows of the sender's shard the receiver holds as halo."""
    out = []
    for t, pt in enumerate(plans):
        for r, pr in enumerate(plans):
            if r == t:
                continue
            for lo, hi in ((pt.ext_start, pt.start), (pt.end, pt.ext_end)):
                r0, r1 = max(lo, pr.start), min(hi, pr.end)
                if r0 < r1:
                    out.append((r, t, r0, r1))
    return out


# ---- argument checks, agreed on by every rank ----------------------------------------------------

_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_META_FIELDS = ["error", "query.shape[1]", "key.shape[1]", "value.shape[1]",
                "query.shape[0] (batch)", "query.shape[2]", "query.shape[3]",
                "query.shape[-2] (heads)", "query.shape[-1] (head_dim)",
                "key.shape[-2] (heads_kv)", "value.shape[-1] (dim_v)", "dtype", "device type",
                "additional_keys given", "additional_keys.shape[1]", "kernel_size", "", "",
                "stride", "", "", "dilation", "", "", "is_causal", "", "", "scale", "overlap",
                "requires_grad of (query, key, value, additional_keys, additional_values)",
                "backend and options"]
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
        for name, t in (("additional_keys", ak), ("additional_values", av)):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != query.dtype or t.device != query.device:
                raise TypeError(f"{fn}: {name} is {t.dtype} on {t.device} but query is "
                                f"{query.dtype} on {query.device}")
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
    except Exception as e:  # any local error is raised after the all_gather, on every rank
        m[0] = 1
        return m, e


def _options_digest(backend, kwargs):
    """`backend` and the keyword options, as one int64 the ranks compare (a CRC of their repr)."""
    return zlib.crc32(repr((backend, sorted(kwargs.items()))).encode())


def _agree(fn, group, metas, local_error, sizes_names=("query", "key", "value"), options=""):
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
            if name == "backend and options":
                other = [r for r, v in enumerate(vals) if v != vals[0]]
                raise ValueError(f"{fn}: backend and keyword options ({', '.join(_FORWARD_KWARGS)})"
                                 f" differ across the ranks of the group: rank {other[0]}'s differ "
                                 f"from rank 0's; this rank passed {options} (every rank must "
                                 "pass the same ones)")
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


def _extended(pl, t):
    """The rank's rows [ext_start, ext_end) of K or V (or of their gradients): ``t`` itself when
    it holds no halo, else a new buffer with ``t`` copied into its own rows (the halo rows are
    received into it)."""
    if pl.ext_start == pl.start and pl.ext_end == pl.end:
        return t
    ext = t.new_empty((t.shape[0], pl.ext_end - pl.ext_start) + tuple(t.shape[2:]))
    _rows(ext, pl.start - pl.ext_start, pl.end - pl.ext_start).copy_(t)
    return ext


def _exchange_ops(ctx, tensors, backward=False, into=None):
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
            tag = i
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


class _ContextParallelNA(torch.autograd.Function):

    @staticmethod
    def forward(fctx, ctx, query, key, value, ak, av):
        pl = ctx.plans[ctx.me]
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
        fctx.ctx = ctx
        fctx.has_additional = ak is not None
        fctx.save_for_backward(query, k_ext, v_ext, ak, av, out, lse)
        fctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(fctx, d_out, d_lse):
        ctx = fctx.ctx
        # Before any collective (every rank asks for the same create_graph).
        _torch_ops._no_double_backward(ctx.fn)
        query, k_ext, v_ext, ak, av, out, lse = fctx.saved_tensors
        pl = ctx.plans[ctx.me]
        # No early return when neither output reached this rank's loss: the other ranks post
        # the halo exchange and the all_reduce below, so this rank joins them with zero
        # gradients.
        if d_out is None:
            d_out = torch.zeros_like(out)
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
        if dak is not None and (fctx.needs_input_grad[4] or fctx.needs_input_grad[5]):
            dist.all_reduce(dak, group=ctx.group)
            dist.all_reduce(dav, group=ctx.group)
            dak, dav = dak.to(ak.dtype), dav.to(av.dtype)
        return (None, dq, dk.to(k_ext.dtype), dv.to(v_ext.dtype), dak, dav)


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
    except Exception as e:  # raised after the all_gather below, on every rank
        err = e if fn in str(e) else type(e)(f"{fn}: {e}")
    if err is None:
        meta, err = _meta(fn, rank, query, key, value, additional_keys, additional_values, sp,
                          scale, overlap)
    else:
        meta = [1] + [0] * (len(_META_FIELDS) - 1)
    options = f"backend={backend!r}, {dict(sorted(kwargs.items()))}"
    meta[-1] = _options_digest(backend, kwargs)
    # A rank whose query is not a tensor still joins the all_gather, on the device the group's
    # backend takes (NCCL: this process's current CUDA device).
    if isinstance(query, torch.Tensor):
        device = query.device
    elif str(dist.get_backend(group)) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    me = dist.get_rank(group)
    if me < 0:
        raise ValueError(f"{fn}: group={group!r} does not contain this process (global rank "
                         f"{dist.get_rank()})")
    world = dist.get_world_size(group)
    mine = torch.tensor(meta, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    metas = [g.tolist() for g in gathered]
    _agree(fn, group, metas, err, options=options)
    sizes = [m[1] for m in metas]
    L = sum(sizes)
    K, s, d, c = sp[0][0], sp[1][0], sp[2][0], sp[3][0]
    if K > L // d:
        raise ValueError(f"{fn}: kernel_size[0]={K} * dilation[0]={d} exceeds the input length "
                         f"{L} of axis 0 (the shards' lengths {sizes} summed over the group)")
    if s > K:
        raise ValueError(f"{fn}: stride[0]={s} must be in [1, kernel_size[0]={K}]")
    ax = Axis(L, K, d, s, c)
    ctx = _Ctx(fn, rank, me, group, plan(ax, sizes, overlap), sp, scale, backend,
               dict(kwargs), {k: v for k, v in kwargs.items() if k in _BACKWARD_KWARGS})
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
