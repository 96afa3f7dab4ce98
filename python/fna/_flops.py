"""FLOP counts (docs/semantics.md section 3.1): ``fna.flops`` and the formulas registered with
``torch.utils.flop_counter`` for fna's custom ops (``_torch_ops``).

Plain Python on shapes and per-axis parameters (no torch, no extension call): the attended pairs
are counted from the window of docs/semantics.md section 1.1 (``fna._window``), axis by axis,
since a neighborhood is a product over axes. ``fna.profiler`` and bench/gpu_bench.py count their
pairs here too.
"""

import math

from . import _args, _window


def axis_pairs(length, kernel, dilation, stride, causal):
    """Sum over the queries of one axis of the number of keys in their window on that axis."""
    if not causal:
        return length * kernel  # a non-causal window always holds K keys (pushed inside at borders)
    return sum(w.end - w.start for w in
               (_window.axis_window(x, length, kernel, dilation, stride, True)
                for x in range(length)))


def attended_pairs(shape, kernel_size, stride, dilation, is_causal, num_additional=0):
    """Attended (query, key) pairs of one (batch, head): the neighborhood pairs plus N * N_add."""
    pairs = 1
    for L, K, d, s, c in zip(shape, kernel_size, dilation, stride, is_causal):
        pairs *= axis_pairs(L, K, d, s, c)
    return pairs + math.prod(shape) * num_additional


def fused_forward(batch, heads, pairs, dim, dim_v):
    """Fused forward: S = Q K^T and O = P V over the attended pairs, 2 FLOPs per multiply-add."""
    return 2 * batch * heads * pairs * (dim + dim_v)


def fused_backward(batch, heads, pairs, dim, dim_v):
    """Fused backward: 2.5x the forward (docs/semantics.md 3.1; torch's SDPA count when
    dim_v == dim)."""
    return 5 * batch * heads * pairs * (dim + dim_v)


def _problem(fn, query_shape, kernel_size, stride, dilation, is_causal):
    if not isinstance(query_shape, (tuple, list)) or not all(_args._is_int(x) for x in query_shape):
        raise TypeError(f"{fn}: query_shape={query_shape!r} must be a tuple of ints "
                        "[B, *spatial, H, D]")
    rank = len(query_shape) - 3
    if rank not in (1, 2, 3):
        raise ValueError(f"{fn}: query_shape={tuple(query_shape)!r} must be [B, *spatial, H, D] "
                         "with 1 to 3 spatial axes")
    shape = [int(x) for x in query_shape]
    for name, v in (("batch", shape[0]), ("heads", shape[-2]), ("dim", shape[-1])):
        if v < 1:
            raise ValueError(f"{fn}: {name}={v} (query_shape={tuple(shape)!r}) must be >= 1")
    sp = _args.spatial(rank, kernel_size, stride, dilation, is_causal)
    _args.check_spatial(fn, sp)
    spatial = shape[1:1 + rank]
    for i, (L, K, d) in enumerate(zip(spatial, sp[0], sp[2])):
        if L < 1:
            raise ValueError(f"{fn}: query_shape[{i + 1}]={L} (a spatial length) must be >= 1")
        if K * d > L:
            raise ValueError(f"{fn}: kernel_size[{i}]={K} * dilation[{i}]={d} exceeds input "
                             f"length {L}")
    return shape, spatial, sp


def flops(query_shape, kernel_size, stride=1, dilation=1, is_causal=False, dim_v=None,
          num_additional=0, backward=False):
    fn = "fna.flops"
    shape, spatial, (ks, st, dil, causal) = _problem(fn, query_shape, kernel_size, stride,
                                                     dilation, is_causal)
    dim = shape[-1]
    if dim_v is None:
        dim_v = dim
    if not _args._is_int(dim_v) or dim_v < 1:
        raise ValueError(f"{fn}: dim_v={dim_v!r} must be an int >= 1 (or None: the query's dim)")
    if not _args._is_int(num_additional) or num_additional < 0:
        raise ValueError(f"{fn}: num_additional={num_additional!r} must be an int >= 0")
    if not _args._is_bool(backward):
        raise TypeError(f"{fn}: backward={backward!r} must be a bool")
    pairs = attended_pairs(spatial, ks, st, dil, causal, int(num_additional))
    count = fused_backward if backward else fused_forward
    return count(shape[0], shape[-2], pairs, dim, int(dim_v))


flops.__doc__ = """FLOPs of a neighborhood attention call, counted as in docs/semantics.md 3.1.

    query_shape: ``[B, *spatial, H, D]`` (1 to 3 spatial axes); kernel_size, stride, dilation,
    is_causal: as for :func:`fna.na2d` (an int / bool for every axis, or one per axis); dim_v: the
    value head dim (default D); num_additional: the number of additional keys / values.

    Returns an int: the forward's ``2 * B * H * P * (D + D_v)``, ``P`` the attended (query, key)
    pairs of one batch and head (causal windows counted as truncated, plus ``N * num_additional``);
    with ``backward=True`` the backward's, 2.5x that. These are the counts that
    ``torch.utils.flop_counter.FlopCounterMode`` gives ``torch.ops.fna.na_forward`` /
    ``na_backward``.
    """
