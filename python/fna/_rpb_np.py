"""Relative positional bias (``rpb``) for NumPy inputs: the forward of ``fna._rpb``'s composition
(``na*d_qk``, the gathered bias, the softmax in float32, ``na*d_av``) on NumPy arrays, with the
same layout, index and checks (docs/semantics.md section 1.3; NumPy calls have no gradients).
It imports no torch.
"""

import math

import numpy as np

from . import _numpy, _window

DTYPES = (np.float32, np.float16)


def check(fn, rpb, heads, kernel_size):
    """Type, dtype and shape of ``rpb`` for a NumPy call with `heads` query heads; errors name the
    argument and its value."""
    if not isinstance(rpb, np.ndarray):
        raise TypeError(f"{fn}: rpb must be a numpy.ndarray (or None) when the inputs are NumPy "
                        f"arrays, got {type(rpb).__name__}")
    if rpb.dtype not in DTYPES:
        raise TypeError(f"{fn}: rpb has dtype {rpb.dtype}; expected float32 or float16 (the bias "
                        "is added in float32)")
    check_shape(fn, rpb.shape, heads, kernel_size)


def check_shape(fn, shape, heads, kernel_size):
    """``rpb``'s shape must be ``[heads, 2 K_0 - 1, ...]`` (NumPy and torch calls alike)."""
    expected = (heads, *(2 * k - 1 for k in kernel_size))
    if tuple(shape) != expected:
        ks = tuple(kernel_size)
        raise ValueError(f"{fn}: rpb has shape {tuple(shape)}; expected {expected} for "
                         f"heads={heads}, kernel_size={ks[0] if len(ks) == 1 else ks} "
                         "([heads, 2 K_0 - 1, ...])")


def _axis_index(L, K, d, s, causal):
    """As fna._rpb._axis_index: ([L, K] index into this axis of rpb, [L, K] `valid` or None)."""
    w = _window.axis_windows_np(L, K, d, s, causal)
    slot = np.arange(K, dtype=np.int64)
    index = (w.start - w.index + (K - 1))[:, None] + slot[None, :]
    valid = (w.start[:, None] + slot[None, :]) < w.end[:, None] if causal else None
    return index, valid


def gather(rpb, spatial, kernel_size, stride, dilation, is_causal):
    """``rpb`` in the unfused logits' layout, ``[*spatial, H, prod(kernel_size)]``, float32; 0 in
    the slots that hold no key."""
    r = len(spatial)
    index, valid = [], None
    for a in range(r):
        idx, ok = _axis_index(spatial[a], kernel_size[a], dilation[a], stride[a], is_causal[a])
        shape = [1] * (2 * r)
        shape[a], shape[r + a] = spatial[a], kernel_size[a]
        index.append(idx.reshape(shape))
        if ok is not None:
            ok = ok.reshape(shape)
            valid = ok if valid is None else valid & ok
    bias = rpb.astype(np.float32)[(slice(None), *index)]  # [H, *spatial, *kernel_size]
    if valid is not None:
        bias = np.where(valid, bias, np.float32(0))
    bias = bias.reshape(bias.shape[:r + 1] + (-1,))
    return np.moveaxis(bias, 0, r)


def add_to_logits(attn, rpb, sp):
    """``attn`` (``na*d_qk``'s ``[B, *spatial, H, W + N_add]``) plus the bias on the W neighbor
    slots, in float32 (additional keys get none)."""
    kernel_size, stride, dilation, is_causal = sp
    r = len(kernel_size)
    W = math.prod(kernel_size)
    bias = gather(rpb, attn.shape[1:1 + r], kernel_size, stride, dilation, is_causal)
    logits = attn.astype(np.float32)
    logits[..., :W] += bias
    return logits


def attention(query, key, value, rpb, sp, scale, additional_keys, additional_values, backend,
              return_lse=False):
    """``softmax(scale * q.k + bias) @ v`` through the backend's unfused operators. Returns
    ``(output, lse or None)``; the LSE (``[B, *spatial, H]``, float32) is of the biased logits."""
    attn = _numpy.qk(query, key, additional_keys, sp, backend, scale=float(scale))
    logits = add_to_logits(attn, rpb, sp)
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    total = e.sum(axis=-1, keepdims=True)
    weights = e / total
    lse = (m + np.log(total))[..., 0] if return_lse else None
    out = _numpy.av(np.ascontiguousarray(weights.astype(value.dtype)), value, additional_values,
                    sp, backend)
    return out, lse
