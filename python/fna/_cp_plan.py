"""The plan of fna.distributed: which rows of axis 0 each rank's queries need (their slab), how
a rank's queries split into interior and border segments, and which halo rows go from whom to
whom. Pure arithmetic on the window definition (fna._window), shared by every rank; see
fna.distributed's docstring."""

from typing import NamedTuple

from . import _window

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
