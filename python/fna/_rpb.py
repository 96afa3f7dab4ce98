"""Relative positional bias (``rpb``, NATTEN 0.17's layout) for torch tensors (NumPy arrays:
``fna._rpb_np``).

One place for what the fused functions (``na*d(..., rpb=)``), the unfused ``na*d_qk(..., rpb=)``
and the modules (``rel_pos_bias=True``) share: the check of ``rpb``, its gather into the unfused
logits' layout, and the composition that computes biased attention with the unfused operators.

The definition (docs/semantics.md section 1.3): ``rpb`` is ``[H, 2 K_0 - 1(, 2 K_1 - 1(, ...))]``
and the logit of query q and key k of head h gets ``rpb[h, i_0, .., i_{r-1}]`` with
``i_a = (k_a - q_a) / dilation_a + K_a - 1``, the same for odd and even kernels, any stride and
causal axes. The query is always inside its own window (section 1.1), so ``i_a`` lies in
``[0, 2 K_a - 2]`` (causal axes: ``[0, K_a - 1]``). Additional keys get no bias.

The fused kernels of the reference, cpu and cuda-fused backends and every backend's unfused
``na*d_qk`` add the bias themselves (its gradient through the unfused op: :func:`gather_grad`).
Where the fused path cannot take it (cuda-naive, deterministic CUDA calls whose table the fused
backward cannot hold), :func:`attention` runs ``na*d_qk`` (scale applied), adds the gathered bias,
takes the softmax in float32 and runs ``na*d_av``: the attention weights live in memory
(``[B, *spatial, H, prod(K) + N_add]``), on the CUDA unfused operators ``auto`` picks
(``cuda-gemm``'s, or ``cuda-naive``'s where those cannot run) for the fused-only backend names.
"""

import functools
import math

import torch

from . import _args, _rpb_np, _window


def unfused_backend(backend):
    """The backend whose unfused operators a biased call runs: ``backend`` itself, or ``auto``
    (on CUDA tensors: cuda-gemm, falling back to cuda-naive) for ``cuda-fused`` / NATTEN's fused
    names (they have no unfused operators)."""
    name = _args.backend_name(backend)
    return "auto" if name == "cuda-fused" else name


def check(fn, rpb, heads, kernel_size, query):
    """Type, dtype, shape and device of ``rpb`` for a call with `heads` query heads, on
    `query`'s device; errors name the argument and its value."""
    if not isinstance(rpb, torch.Tensor):
        raise TypeError(f"{fn}: rpb must be a torch.Tensor (or None), got {type(rpb).__name__}")
    if rpb.is_nested:
        raise TypeError(f"{fn}: rpb is a nested tensor; pass a dense tensor")
    if rpb.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        dt = str(rpb.dtype).replace("torch.", "")
        raise TypeError(f"{fn}: rpb has dtype {dt}; expected float32, float16 or bfloat16 (the "
                        "bias is added in float32)")
    _rpb_np.check_shape(fn, rpb.shape, heads, kernel_size)
    if rpb.device != query.device:
        raise ValueError(f"{fn}: rpb is on {rpb.device} but query is on {query.device}; all "
                         "tensors must be on one device")


def axis_index(L, K, d, s, causal, device):
    """:func:`_axis_index` (below), cached per axis in eager mode: a model's layers ask for the
    same few axes on every step. The cached tensors are shared, so callers never write into
    them. While torch.compile traces, it is computed afresh (traced tensors must not outlive
    their trace)."""
    # (A compiled graph's backward is traced under a fake mode that is_compiling() does not
    # report.)
    if torch.compiler.is_compiling() or torch._guards.detect_fake_mode() is not None:
        return _axis_index(L, K, d, s, causal, device)
    return _axis_index_cached(int(L), int(K), int(d), int(s), bool(causal), torch.device(device))


def _axis_index(L, K, d, s, causal, device):
    """Along one axis of length L: ([L, K] index into that axis of rpb, [L, K] bool `valid` or
    None) for each query coordinate and window slot ``j`` (the key at local index ``start + j``,
    the slot order of ``na*d_qk``). The index is the key's position relative to the query in
    units of the dilation plus ``K - 1``. ``valid`` (causal axes only) is False for the slots past
    a truncated window's end, which hold no key. The window is docs/semantics.md section 1.1's,
    in the query's dilation group (``fna._window``)."""
    w = _window.axis_windows(L, K, d, s, causal, device)
    start, i = w.start, w.index
    slot = torch.arange(K, device=device)
    index = (start - i + (K - 1))[:, None] + slot[None, :]
    valid = None
    if causal:
        valid = (start[:, None] + slot[None, :]) < w.end[:, None]
    return index, valid


_axis_index_cached = functools.lru_cache(maxsize=256)(_axis_index)


def _indices(spatial, kernel_size, stride, dilation, is_causal, device):
    """Per axis the index into that axis of rpb of each (query, window slot), shaped to broadcast
    over ``[*spatial, *kernel_size]``, and their common `valid` mask (None without causal axes)."""
    r = len(spatial)
    index, valid = [], None
    for a in range(r):
        idx, ok = axis_index(spatial[a], kernel_size[a], dilation[a], stride[a], is_causal[a],
                             device)
        shape = [1] * (2 * r)
        shape[a], shape[r + a] = spatial[a], kernel_size[a]
        index.append(idx.reshape(shape))
        if ok is not None:
            ok = ok.reshape(shape)
            valid = ok if valid is None else valid & ok
    return index, valid


def gather(rpb, spatial, kernel_size, stride, dilation, is_causal):
    """``rpb`` gathered into the unfused logits' layout, ``[*spatial, H, prod(kernel_size)]``, in
    rpb's dtype; 0 in the slots that hold no key (so those get no gradient)."""
    r = len(spatial)
    index, valid = _indices(spatial, kernel_size, stride, dilation, is_causal, rpb.device)
    bias = rpb[(slice(None), *index)]  # [H, *spatial, *kernel_size]
    if valid is not None:
        bias = bias.masked_fill(~valid, 0)
    return bias.flatten(r + 1).movedim(0, r)


def gather_grad(d_logits, rpb, sp):
    """The gradient of ``rpb`` when its gathered entries were added to the neighbor slots of
    logits ``[B, *spatial, H, W + N_add]`` whose gradient is ``d_logits``: each entry sums the
    slots that hold it (over the batch too), in float32, returned in rpb's dtype. Slots that hold
    no key add nothing."""
    kernel_size, stride, dilation, is_causal = sp
    r = len(kernel_size)
    spatial = tuple(d_logits.shape[1:1 + r])
    H, W = d_logits.shape[-2], math.prod(kernel_size)
    index, valid = _indices(spatial, kernel_size, stride, dilation, is_causal, d_logits.device)
    flat = index[0]
    for a in range(1, r):  # the entry's place in one head's table, row-major
        flat = flat * (2 * kernel_size[a] - 1) + index[a]
    g = d_logits[..., :W].float().sum(0)  # [*spatial, H, W]
    g = g.movedim(r, 0).reshape((H,) + spatial + tuple(kernel_size))
    if valid is not None:
        g = g.masked_fill(~valid, 0)
    flat = flat.expand(spatial + tuple(kernel_size)).reshape(-1)
    entries = math.prod(2 * k - 1 for k in kernel_size)
    d = g.new_zeros((H, entries)).index_add_(1, flat, g.reshape(H, -1))
    return d.reshape(rpb.shape).to(rpb.dtype)


def add_to_logits(attn, rpb, sp):
    """``attn`` (``na*d_qk``'s output, ``[B, *spatial, H, W + N_add]``) plus the gathered bias on
    the W neighbor slots, in float32 (additional keys get none; empty slots stay ``-inf``)."""
    kernel_size, stride, dilation, is_causal = sp
    r = len(kernel_size)
    W = math.prod(kernel_size)
    bias = gather(rpb, attn.shape[1:1 + r], kernel_size, stride, dilation, is_causal).float()
    n_add = attn.shape[-1] - W
    if n_add:
        bias = torch.nn.functional.pad(bias, (0, n_add))
    return attn.float() + bias


def attention(query, key, value, rpb, sp, scale, additional_keys, additional_values, backend,
              return_lse=False, dropout=None):
    """``softmax(scale * q.k + bias) @ v`` through the unfused operators (``backend``: one that
    has them, see :func:`unfused_backend`). Returns ``(output, lse or None)``; the LSE
    (``[B, *spatial, H]``, float32) is of the biased logits. ``dropout``: applied to the weights
    (the modules' ``attn_drop``)."""
    ops = torch.ops.fna
    attn = ops.na_qk(query, key, additional_keys, *map(list, sp), float(scale), backend)
    logits = add_to_logits(attn, rpb, sp)
    weights = logits.softmax(dim=-1)
    lse = torch.logsumexp(logits, dim=-1) if return_lse else None
    if dropout is not None:
        weights = dropout(weights)
    out = ops.na_av(weights.to(value.dtype), value, additional_values, *map(list, sp), backend)
    return out, lse
