"""The NumPy path: allocate outputs with NumPy and call the extension (CPU backends only)."""

import math

import numpy as np

from . import _C


def _kw(sp, backend, scale=-1.0, opts=("", False, False, "", "", 0)):
    kernel_size, stride, dilation, is_causal = sp
    config, deterministic, allow_tf32, backward_config, tuning, num_threads = opts
    return dict(kernel_size=kernel_size, stride=stride, dilation=dilation, is_causal=is_causal,
                backend=backend, scale=scale, stream=0, config=config,
                deterministic=deterministic, allow_tf32=allow_tf32,
                backward_config=backward_config, tuning=tuning, num_threads=num_threads)


def _empty(shape, dtype):
    return np.empty(tuple(int(s) for s in shape), dtype=dtype)


def _region(query_offset):
    return {} if not query_offset else {"query_offset": list(query_offset)}


def forward(q, k, v, add_k, add_v, sp, scale, backend, opts, query_offset=None, rpb=None):
    out = _empty(q.shape[:-1] + (v.shape[-1],), q.dtype)
    lse = _empty(q.shape[:-1], np.float32)
    bias = {} if rpb is None else {"rpb": np.asarray(rpb, dtype=np.float32)}
    _C.forward(q, k, v, out, lse, add_k, add_v, **_kw(sp, backend, scale, opts),
               **_region(query_offset), **bias)
    return out, lse


def backward(q, k, v, o, lse, d_o, add_k, add_v, sp, scale, backend, opts, d_lse=None,
             query_offset=None, rpb=None):
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    d_add_k = None if add_k is None else np.empty_like(add_k)
    d_add_v = None if add_v is None else np.empty_like(add_v)
    bias = {}
    if rpb is not None:
        d_rpb = np.empty(rpb.shape, dtype=np.float32)
        bias = {"rpb": np.asarray(rpb, dtype=np.float32), "d_rpb": d_rpb}
    _C.backward(q, k, v, o, d_o, lse, dq, dk, dv, add_k, add_v, d_add_k, d_add_v, d_lse,
                **_kw(sp, backend, scale, opts), **_region(query_offset), **bias)
    return ([dq, dk, dv] + ([] if add_k is None else [d_add_k, d_add_v])
            + ([] if rpb is None else [d_rpb.astype(rpb.dtype, copy=False)]))


def qk(q, k, add_k, sp, backend, scale=-1.0, rpb=None):
    n_add = 0 if add_k is None else add_k.shape[1]
    attn = _empty(q.shape[:-1] + (math.prod(sp[0]) + n_add,), q.dtype)
    bias = {} if rpb is None else {"rpb": np.ascontiguousarray(rpb, dtype=np.float32)}
    _C.qk_forward(q, k, attn, add_k, **_kw(sp, backend, scale), **bias)
    return attn


def qk_backward(q, k, add_k, d_attn, sp, backend, scale=-1.0):
    dq, dk = np.empty_like(q), np.empty_like(k)
    d_add_k = None if add_k is None else np.empty_like(add_k)
    _C.qk_backward(q, k, d_attn, dq, dk, add_k, d_add_k, **_kw(sp, backend, scale))
    return [dq, dk] + ([] if add_k is None else [d_add_k])


def av(attn, v, add_v, sp, backend):
    out = _empty(attn.shape[:-1] + (v.shape[-1],), attn.dtype)
    _C.av_forward(attn, v, out, add_v, **_kw(sp, backend))
    return out


def av_backward(attn, v, add_v, d_o, sp, backend):
    d_attn, dv = np.empty_like(attn), np.empty_like(v)
    d_add_v = None if add_v is None else np.empty_like(add_v)
    _C.av_backward(attn, v, d_o, d_attn, dv, add_v, d_add_v, **_kw(sp, backend))
    return [d_attn, dv] + ([] if add_v is None else [d_add_v])
