"""Neighborhood attention functions with NATTEN's signatures, for torch tensors and NumPy arrays.

Layout is heads-last: ``query [B, *spatial, H, D]``, ``key [B, *spatial, H_kv, D]``,
``value [B, *spatial, H_kv, D_v]``, output ``[B, *spatial, H, D_v]``; ``H % H_kv == 0``.
Any strides are accepted (a heads-first tensor passed as a ``permute`` view works).

torch tensors go through ``torch.ops.fna.*`` custom ops (autograd, ``torch.compile``), on the
tensors' device and current stream; in eager mode the fused forward calls the same
implementation without the op's dispatcher (``_torch_ops.na_forward_call``). NumPy arrays run on
the CPU backends; for their gradients use :func:`na_backward`, :func:`na_qk_backward` and
:func:`na_av_backward`.
"""

import functools

import numpy as np

from . import _args, _C, _compat  # torch and _torch_ops: _compat.torch / .torch_ops, loaded lazily

__all__ = [
    "na1d", "na2d", "na3d", "na1d_qk", "na2d_qk", "na3d_qk", "na1d_av", "na2d_av", "na3d_av",
    "na_backward", "na_qk_backward", "na_av_backward",
]


# ---- framework selection -------------------------------------------------------------------------

def _is_torch(x):
    return _compat.is_torch_tensor(x)  # loads fna's torch side the first time it is true


def _framework(fn, named):
    """'torch' or 'numpy' for the arrays in `named` (name -> array or None); mixing is an error."""
    kind, first = None, None
    for name, t in named:
        if t is None and (name.startswith("additional") or name == "d_lse"):  # optional arrays
            continue
        if _is_torch(t):
            k = "torch"
            _check_torch_tensor(fn, name, t)
        elif isinstance(t, np.ndarray):
            k = "numpy"
            if t.dtype.hasobject or not t.dtype.isnative:  # (other dtypes: the C++ checks)
                raise TypeError(f"{fn}: {name} has dtype {t.dtype.str} ({t.dtype}); fna supports "
                                "native-byte-order float32 and float16 arrays")
        else:
            raise TypeError(
                f"{fn}: {name} must be a torch.Tensor or a numpy.ndarray, got {type(t).__name__}"
            )
        if kind is None:
            kind, first = k, name
        elif k != kind:
            raise TypeError(f"{fn}: {name} is a {k} array but {first} is a {kind} array")
    return kind


def _check_torch_tensor(fn, name, t):
    """Before anything reads a torch tensor's shape: nested tensors (whose sizes torch refuses to
    give) and dtypes fna has no kernels for, named the way torch names them."""
    if t.is_nested:
        raise TypeError(f"{fn}: {name} is a nested tensor; fna does not support nested tensors "
                        "(pass a dense, padded tensor)")
    if str(t.layout) != "torch.strided":  # sparse, mkldnn: no strided storage to hand over
        raise TypeError(f"{fn}: {name} has layout {t.layout}; fna takes dense (strided) tensors "
                        "(e.g. .to_dense())")
    # float32, float16 and bfloat16 are the floating dtypes of 4 and 2 bytes. Asked of the dtype
    # itself, not of the torch module: a torch.compile trace that loads fna's torch side on its
    # first tensor sees that module as it was when the trace began (torch 2.4's dynamo).
    if not (t.dtype.is_floating_point and t.dtype.itemsize in (2, 4)):
        dt = str(t.dtype).replace("torch.", "")
        raise TypeError(f"{fn}: {name} has dtype {dt}; fna supports float32, float16 and "
                        f"bfloat16 ({dt} is unsupported)")


# A plain bool, so the checks below stay traceable (no call into the extension under dynamo).
_CUDA_BUILT = _C.backend_compiled("cuda-naive")


def _check_devices(fn, backend, named, shown=None):
    """torch: every tensor on one device (CPU or CUDA); CUDA backends need CUDA tensors; CUDA
    tensors need a build with CUDA. `shown`: the backend as the caller named it (a NATTEN name)."""
    shown = backend if shown is None else shown
    first_name, first = None, None
    for name, t in named:
        if t is None:
            continue
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{fn}: {name} is on {t.device}; fna runs on CPU and CUDA tensors")
        if first is None:
            first_name, first = name, t.device
        elif t.device != first:
            raise ValueError(
                f"{fn}: {name} is on {t.device} but {first_name} is on {first}; "
                "all tensors must be on one device"
            )
    if backend in _args.CUDA_BACKENDS and first.type != "cuda":
        raise ValueError(
            f"{fn}: backend={shown!r} needs CUDA tensors, but {first_name} is on {first}"
        )
    if first.type == "cuda" and not _CUDA_BUILT:
        raise RuntimeError(
            f"{fn}: {first_name} is on {first}, but this build of fna has no CUDA backends "
            "(it was built without a CUDA compiler)"
        )
    if backend in ("reference", "cpu") and first.type != "cpu":
        raise ValueError(
            f"{fn}: backend={backend!r} runs on the CPU, but {first_name} is on {first}"
        )


def _numpy_backend(fn, backend):
    if backend in _args.CUDA_BACKENDS:
        raise ValueError(
            f"{fn}: backend={backend!r} needs CUDA tensors; NumPy arrays live on the CPU"
        )


# ---- fused attention ---------------------------------------------------------------------------

def _hopper(kind, query):
    """Whether torch CUDA tensors live on a compute capability 9.0 device (None: not CUDA)."""
    if kind != "torch" or query.device.type != "cuda":
        return None
    return _compat.torch.cuda.get_device_capability(query.device) == (9, 0)


def _records_grad(kind, tensors):
    """A torch call whose result autograd records (so a backward may run)."""
    if kind != "torch" or not _compat.torch.is_grad_enabled():
        return False
    return any(t is not None and t.requires_grad for t in tensors)


def _natten_backend(fn, name, kind, named, query, value, sp, opts, forward=True):
    """(config, backward_config, tuning) for NATTEN's backend `name` (see
    _args.natten_backend_options): CUDA tensors only."""
    config, deterministic, allow_tf32, backward_config, tuning = opts
    if kind != "torch":
        raise ValueError(f"{fn}: backend={name!r} runs fna's cuda-fused backend, which needs CUDA "
                         "tensors; NumPy arrays live on the CPU")
    first_name, first = next((n, t) for n, t in named if t is not None)
    if first.device.type != "cuda":
        raise ValueError(f"{fn}: backend={name!r} runs fna's cuda-fused backend, which needs CUDA "
                         f"tensors, but {first_name} is on {first.device}")
    _check_devices(fn, "cuda-fused", named, shown=name)
    hopper = _hopper(kind, query)
    dtype_name = str(query.dtype).replace("torch.", "")
    dim = max(query.shape[-1], value.shape[-1])

    def has_hopper_config():
        return any(n.startswith(("fna_fwd_sm90_", "fna_fwd_sm90ws_"))
                   for n in _C.fused_configs(len(sp[0]), dtype_name, dim))

    config, backward_config, tuning = _args.natten_backend_options(
        fn, name, hopper, query.dtype, config or "", backward_config or "", tuning,
        has_hopper_config, forward=forward)
    return config or None, backward_config or None, tuning


def _na(fn, rank, query, key, value, kernel_size, stride, dilation, is_causal, scale,
        additional_keys, additional_values, backend, return_lse, opts, natten_kwargs, rpb=None,
        query_offset=None):
    named = [("query", query), ("key", key), ("value", value),
             ("additional_keys", additional_keys), ("additional_values", additional_values)]
    kind = _framework(fn, named)
    _args.check_return_lse(fn, return_lse)
    for name, t in named[:3]:
        _args.check_rank(fn, rank, name, t)
    _args.check_output_dims(fn, query, value)
    _args.check_pair("additional_keys", additional_keys, "additional_values", additional_values)
    if additional_keys is not None:
        _args.check_additional("additional_keys", additional_keys, query.shape[0], rank)
        _args.check_additional("additional_values", additional_values, query.shape[0], rank)
    sp = _args.spatial(rank, kernel_size, stride, dilation, is_causal)
    query_offset = _args.query_offset(fn, query_offset, rank)
    if rpb is not None and not _native_rpb(fn, kind, backend, query, opts[1],
                                           lambda: _records_grad(kind, [t for _, t in named] + [rpb])):
        if query_offset is not None:
            raise ValueError(f"{fn}: query_offset with rpb: on this backend a call with a "
                             "relative positional bias runs the unfused operators, which compute "
                             "whole grids (backends reference and cpu take both)")
        return _na_rpb(fn, kind, named, rpb, sp, scale, backend, return_lse, opts, natten_kwargs)
    if rpb is not None:  # the backend adds the bias itself
        _check_rpb(fn, kind, rpb, query.shape[-2], sp[0], query)
    given = (backend, opts)  # (for the composition fallback below)
    natten_backend = _args.natten_backend(backend)
    backend = _args.backend_name(backend)
    scale = _args.resolve_scale(scale, query.shape[-1])
    config, deterministic, allow_tf32, backward_config, tuning, num_threads = opts
    if (tuning is None and kind == "torch" and query.device.type == "cuda"
            and natten_backend is None):
        tuning = _args.DEFAULT_TUNING  # a NATTEN backend name picks its kernels itself
    tuning = _args.tuning_text(tuning)
    deterministic = _args.resolve_deterministic(
        fn, deterministic, kind == "torch",
        lambda: _records_grad(kind, [t for _, t in named] + [rpb]))
    if natten_kwargs:
        hopper = _hopper(kind, query)
        if natten_backend == "cutlass-fna" and hopper:
            hopper = False  # tile shapes name mma.sync configurations
        config, backward_config, tuning = _args.natten_tuning(
            fn, rank, natten_kwargs, query.dtype, max(query.shape[-1], value.shape[-1]),
            hopper, deterministic, config, backward_config, tuning)
    if natten_backend is not None:
        config, backward_config, tuning = _natten_backend(
            fn, natten_backend, kind, named, query, value, sp,
            (config, deterministic, allow_tf32, backward_config, tuning))
    opts = (*_args.fused_options(config, deterministic, allow_tf32, kind == "torch",
                                 backward_config, tuning), _args.num_threads_value(num_threads))
    if (rpb is not None and kind == "torch" and opts[1] and query.device.type == "cuda"
            and backend in ("cuda-fused", "auto")
            and not _plan_takes_deterministic_rpb(
                tuple(query.shape), tuple(tuple(x) for x in sp),
                str(query.dtype).replace("torch.", ""), key.shape[-2], value.shape[-1],
                query.device.index or 0, None if query_offset is None else tuple(query_offset),
                None if query_offset is None else tuple(key.shape[1:-2]), opts[3], opts[4],
                bool(opts[2]))):
        # Deterministic with a bias where the fused backward cannot sum d rpb deterministically
        # (the plan says so): the composition, as for the other backends.
        return _na_rpb(fn, kind, named, rpb, sp, scale, given[0], return_lse, given[1],
                       natten_kwargs)
    if kind == "torch":
        _check_devices(fn, backend, named + ([] if rpb is None else [("rpb", rpb)]))
        inputs = (query, key, value, additional_keys, additional_values, *sp, scale, backend, *opts)
        if query_offset is not None or rpb is not None:
            inputs = inputs + (query_offset,)
        if rpb is not None:
            inputs = inputs + (rpb,)
        try:
            if _compat.torch_ops.check_autograd_mode(fn, inputs[:5] + inputs[18:]):  # vmap: the op
                out, lse = _compat.torch.ops.fna.na_forward(*inputs)
            else:
                out, lse = _compat.torch_ops.na_forward_call(*inputs)
        except NotImplementedError:
            # `auto` with a bias: where the fused kernels do not take the call (a layout or size
            # they do not cover), the unfused composition runs, as cuda-naive's `auto` fallback
            # does without a bias (not while torch.compile traces: the op is in the graph).
            if (rpb is None or backend != "auto" or query.device.type != "cuda"
                    or _compat.torch.compiler.is_compiling()):
                raise
            return _na_rpb(fn, kind, named, rpb, sp, scale, given[0], return_lse, given[1],
                           natten_kwargs)
    else:
        _numpy_backend(fn, backend)
        from . import _numpy
        out, lse = _numpy.forward(query, key, value, additional_keys, additional_values, sp,
                                  scale, backend, opts, query_offset, rpb)
    return (out, lse) if return_lse else out


# The backends that add a relative positional bias themselves (fna._C.takes_rpb), read once:
# extension calls cannot be traced by torch.compile.
_RPB_BACKENDS = frozenset(n for n in ("reference", "cpu", "cuda-naive", "cuda-fused")
                          if _C.takes_rpb(n))


def _native_rpb(fn, kind, backend, query, deterministic, records_grad):
    """Whether the backend that runs the call adds a relative positional bias itself (reference,
    cpu, cuda-fused); the others run the unfused composition, and so does a deterministic
    cuda-fused call while torch.compile traces (the plan, which says whether the deterministic
    fused backward takes the call, is asked once the call's options are resolved:
    _plan_takes_deterministic_rpb)."""
    try:
        name = _args.natten_backend(backend) and "cuda-fused" or _args.backend_name(backend)
    except ValueError:
        return False  # the composition's path reports the error
    if name == "auto":  # (what fna._C.resolve_backend answers for the device)
        name = "cuda-fused" if kind == "torch" and query.device.type == "cuda" else "cpu"
    if name == "cuda-fused" and kind == "torch":
        try:
            if _args.resolve_deterministic(fn, deterministic, True, records_grad):
                return not _compat.torch.compiler.is_compiling()
        except (TypeError, ValueError):
            return False  # the composition's path reports the error
    return name in _RPB_BACKENDS


@functools.lru_cache(maxsize=256)
def _plan_takes_deterministic_rpb(shape, sp, dtype, heads_kv, dim_v, device_index, query_offset,
                                  grid, backward_config, tuning, allow_tf32):
    """Whether cuda-fused's plan has a deterministic backward for a call with a bias (the
    call's resolved options): False where it does not take the call (NotImplementedError: a
    table whose per-warp copies do not fit); an invalid option raises."""
    from . import fused_plan
    try:
        plan = fused_plan(shape, sp[0], stride=sp[1], dilation=sp[2], is_causal=sp[3],
                          dtype=dtype, heads_kv=heads_kv, dim_v=dim_v, device_index=device_index,
                          backward_config=backward_config or None,
                          tuning=_args._tuning_pairs(tuning) if tuning else None,
                          allow_tf32=allow_tf32, deterministic=True, rpb=True,
                          query_offset=query_offset, grid_shape=grid)
    except NotImplementedError:
        return False
    return bool(plan.get("backward_deterministic")) and bool(plan.get("backward_rpb_sums"))


def _check_rpb(fn, kind, rpb, heads, kernel_size, query):
    """rpb: its type, dtype, shape and device (fna._rpb.check for torch tensors, fna._rpb_np.check
    for NumPy arrays); returns the module that computes with it."""
    if kind != "torch":
        from . import _rpb_np
        _rpb_np.check(fn, rpb, heads, kernel_size)
        return _rpb_np
    from . import _rpb
    _rpb.check(fn, rpb, heads, kernel_size, query)
    return _rpb


def _na_rpb(fn, kind, named, rpb, sp, scale, backend, return_lse, opts, natten_kwargs):
    """na*d with a relative positional bias: the unfused composition of fna._rpb.attention on the
    backend's unfused operators (cuda-naive's for cuda-fused / NATTEN's fused names), until the
    fused kernels add the bias themselves. Options that only steer the fused kernels are errors
    (never silently ignored)."""
    query, value = named[0][1], named[2][1]
    _rpb = _check_rpb(fn, kind, rpb, query.shape[-2], sp[0], query)
    config, deterministic, allow_tf32, backward_config, tuning, num_threads = opts
    for name, v in (("config", config), ("backward_config", backward_config),
                    ("tuning", tuning), ("num_threads", num_threads)):
        if v is not None and not (name == "num_threads" and _args._is_int(v) and v == 0):
            raise ValueError(
                f"{fn}: {name}={v!r} with rpb: a call with a relative positional bias runs the "
                "unfused operators (qk, softmax, av), which take no "
                + ("thread count (they use fna.set_num_threads's)" if name == "num_threads"
                   else "fused-kernel choices") + f"; pass {name}=None")
    for k in natten_kwargs:
        if k not in _args.NATTEN_TUNING_KWARGS:
            raise TypeError(f"{fn}() got an unexpected keyword argument {k!r}")
    given = sorted(k for k, v in natten_kwargs.items()
                   if v is not None and v is not False and k != "try_fuse_additional_kv")
    if given:  # NATTEN's defaults (None / False) ask for nothing, as without rpb
        raise ValueError(f"{fn}: {', '.join(given)} with rpb: a call with a relative positional "
                         "bias runs the unfused operators (qk, softmax, av), not the fused "
                         "kernels these keywords tune")
    natten_backend = _args.natten_backend(backend)
    if natten_backend is not None and (kind != "torch" or query.device.type != "cuda"):
        where = query.device if kind == "torch" else "the CPU (NumPy arrays)"
        raise ValueError(f"{fn}: backend={natten_backend!r} runs fna's cuda-fused backend, which "
                         f"needs CUDA tensors, but query is on {where}")
    name = _args.backend_name(backend)
    scale = _args.resolve_scale(scale, query.shape[-1])
    if kind != "torch":  # NumPy: the composition's forward on the CPU backends (no gradients)
        _args.fused_options(None, _args.resolve_deterministic(fn, deterministic, False, False),
                            allow_tf32, False)
        _numpy_backend(fn, name)
        out, lse = _rpb.attention(query, named[1][1], value, rpb, sp, scale, named[3][1],
                                  named[4][1], name, return_lse=return_lse)
        return (out, lse) if return_lse else out
    tensors = [t for _, t in named] + [rpb]
    # The composition's unfused ops are deterministic (each output row is gathered by one
    # thread, no atomics), so `deterministic` asks nothing of them: only its type is checked.
    _args.fused_options(None, _args.resolve_deterministic(fn, deterministic, False, False),
                        allow_tf32, True)
    _check_devices(fn, name, named + [("rpb", rpb)], shown=natten_backend)
    _compat.torch_ops.check_autograd_mode(fn, tensors)
    out, lse = _rpb.attention(query, named[1][1], value, rpb, sp, scale, named[3][1], named[4][1],
                              _rpb.unfused_backend(name), return_lse=return_lse)
    return (out, lse) if return_lse else out


def na1d(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None,
         additional_keys=None, additional_values=None, backend=None, return_lse=False,
         config=None, deterministic=None, allow_tf32=None, backward_config=None, tuning=None,
         num_threads=None, rpb=None, query_offset=None, **natten_tuning):
    """1-D neighborhood attention. ``query [B, L, H, D]``, ``key [B, L, H_kv, D]``,
    ``value [B, L, H_kv, D_v]`` -> ``[B, L, H, D_v]`` (and ``lse [B, L, H]`` float32 when
    ``return_lse``). See :func:`na2d`."""
    return _na("na1d", 1, query, key, value, kernel_size, stride, dilation, is_causal, scale,
               additional_keys, additional_values, backend, return_lse,
               (config, deterministic, allow_tf32, backward_config, tuning, num_threads),
               natten_tuning, rpb, query_offset)


def na2d(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None,
         additional_keys=None, additional_values=None, backend=None, return_lse=False,
         config=None, deterministic=None, allow_tf32=None, backward_config=None, tuning=None,
         num_threads=None, rpb=None, query_offset=None, **natten_tuning):
    """2-D neighborhood attention, NATTEN's ``na2d``.

    query: ``[B, X, Y, H, D]``; key: ``[B, X, Y, H_kv, D]``; value: ``[B, X, Y, H_kv, D_v]``.
    kernel_size, stride, dilation: int (every axis) or a tuple with one entry per axis.
    is_causal: bool or a tuple of bools. scale: default ``D ** -0.5``.
    additional_keys / additional_values: ``[B, N_add, H_kv, D(_v)]`` tokens every query also
    attends to (one softmax with the neighborhood).
    backend: None / "auto", "reference", "cpu", "cuda-naive", "cuda-fused", "cuda-gemm" (the
    unfused composition on tensor-core GEMM kernels, the paper's section 3.2); or NATTEN's
    "cutlass-fna" (cuda-fused's mma.sync kernels) / "hopper-fna" (its Hopper wgmma kernels;
    compute capability 9.0, 16-bit); NATTEN's "blackwell-fna" and "flex-fna" raise ValueError
    saying what to use (docs/python.md).
    Returns ``[B, X, Y, H, D_v]``, or ``(output, lse)`` with ``lse [B, X, Y, H]`` float32 (natural
    log of the softmax denominator, scale applied) when ``return_lse``; with torch, both are
    differentiable (a loss may use the LSE, e.g. through :func:`fna.merge_attentions`).
    config: name of a ``cuda-fused`` forward tile configuration (see :func:`fna.fused_configs`)
    instead of the heuristic's choice; an error on any other backend (no silent fallback).
    deterministic: the backward accumulates in a fixed order (bitwise reproducible; on the CPU
    for one thread count). None (default): ``torch.are_deterministic_algorithms_enabled()`` at
    this call for torch tensors, False for NumPy; an explicit False under
    ``torch.use_deterministic_algorithms(True)`` where a backward will run is a RuntimeError
    (a warning with ``warn_only=True``), as torch's own non-deterministic ops.
    allow_tf32: float32 on ``cuda-fused`` with plain TF32 products (~1e-3 relative) instead of
    split-TF32 (float32-class), forward and backward; None follows
    ``torch.backends.cuda.matmul.allow_tf32``.
    backward_config: name of a ``cuda-fused`` backward tile configuration (see
    :func:`fna.fused_backward_configs`) instead of the heuristic's tiles; checked at the forward
    call, an error on any other backend (no silent fallback).
    tuning: a dict of kernel choices the plan would otherwise make (``fna.tuning_keys()``:
    e.g. ``{"fwd_schedule": "plain", "fwd_copy": "cp_async", "persistent": True,
    "bwd_kernel": "sm80", "fwd_walk": "01"}`` for ``cuda-fused``, ``cpu_isa`` / ``cpu_band`` /
    ... for ``cpu``, ``naive_workspace_bytes`` for ``cuda-naive`` / ``cuda-gemm``); validated,
    echoed by :func:`fna.fused_plan`; a key that concerns another backend than the one that runs is an
    error.
    num_threads: CPU threads for this call (forward, and the backward through autograd); None or
    0: the process-wide count (:func:`fna.set_num_threads`, default: the cores available to the
    process). Ignored on CUDA tensors.
    rpb: optional relative positional bias (a torch tensor, or a NumPy array for NumPy inputs),
    ``[H, 2 K_0 - 1, 2 K_1 - 1]``, NATTEN 0.17's layout: the logit of query q and key k of head h
    gets ``rpb[h, (k_0 - q_0) / dilation_0 + K_0 - 1, (k_1 - q_1) / dilation_1 + K_1 - 1]``, for odd
    and even kernels, stride and causal axes alike (docs/semantics.md section 1.3); additional keys
    get no bias. The call then computes ``softmax(scale * q.k + bias) @ v`` with the unfused
    operators (``na2d_qk``, softmax in float32, ``na2d_av``; on the CUDA operators ``auto``
    picks for ``cuda-fused`` and NATTEN's fused names), so the attention weights are
    materialized; the LSE (``return_lse``) is that of the biased logits, and autograd gives the gradient of ``rpb``.
    ``config``, ``backward_config``, ``tuning``, ``num_threads`` and NATTEN's tuning keywords,
    which steer the fused kernels, are a ValueError with ``rpb``.
    query_offset: None, or one int per axis: ``query`` holds only the queries of the box
    ``[query_offset_a, query_offset_a + query.shape[1 + a])`` of the grid that ``key`` / ``value``
    span (their spatial shape). Windows are those of that whole grid, so the result (and the LSE)
    equals those rows of the call with every query, and only the box's queries are computed;
    gradients of ``key`` / ``value`` get only these queries' terms. Used by
    :mod:`fna.distributed` (a rank's queries inside its slab with the halos) and for tiled
    inference of large grids (docs/python.md "Query regions").
    NATTEN's tuning keywords map onto these: ``q_tile_shape`` / ``kv_tile_shape`` pick the forward
    configuration with those tiles, ``backward_q_tile_shape`` / ``backward_kv_tile_shape`` the
    backward one (the dK / dV kernel's query and key tiles), ``kernel_schedule`` "non" / "coop"
    the plain / warp-specialized Hopper forward, ``run_persistent_kernel=True`` persistent CTAs;
    ``try_fuse_additional_kv`` is what fna always does. Values with no meaning here
    (``kernel_schedule="pp"``, ``backward_use_pt_reduction=True``, ``backward_kv_splits``,
    ``torch_compile=True``, ``attention_kwargs``) raise ValueError; any other keyword is a
    TypeError.
    """
    return _na("na2d", 2, query, key, value, kernel_size, stride, dilation, is_causal, scale,
               additional_keys, additional_values, backend, return_lse,
               (config, deterministic, allow_tf32, backward_config, tuning, num_threads),
               natten_tuning, rpb, query_offset)


def na3d(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None,
         additional_keys=None, additional_values=None, backend=None, return_lse=False,
         config=None, deterministic=None, allow_tf32=None, backward_config=None, tuning=None,
         num_threads=None, rpb=None, query_offset=None, **natten_tuning):
    """3-D neighborhood attention. ``query [B, X, Y, Z, H, D]``; ``rpb``:
    ``[H, 2 K_0 - 1, 2 K_1 - 1, 2 K_2 - 1]``. See :func:`na2d`."""
    return _na("na3d", 3, query, key, value, kernel_size, stride, dilation, is_causal, scale,
               additional_keys, additional_values, backend, return_lse,
               (config, deterministic, allow_tf32, backward_config, tuning, num_threads),
               natten_tuning, rpb, query_offset)


def na_backward(d_output, query, key, value, output, lse, kernel_size, stride=1, dilation=1,
                is_causal=False, scale=None, additional_keys=None, additional_values=None,
                backend=None, config=None, deterministic=None, allow_tf32=None,
                backward_config=None, tuning=None, d_lse=None, num_threads=None,
                query_offset=None, rpb=None):
    """Gradients of ``na{1,2,3}d`` (the rank is ``query.ndim - 3``), without autograd.

    ``output`` and ``lse`` are what the forward returned with ``return_lse=True`` (same scale,
    parameters and additional keys/values). ``d_lse`` (optional, float32, the shape of ``lse``;
    None = zero) is the gradient of the loss with respect to ``lse``. Returns
    ``(d_query, d_key, d_value)``, plus ``(d_additional_keys, d_additional_values)`` when
    additional keys/values are given. Works for NumPy arrays and torch tensors. config /
    deterministic / allow_tf32 / backward_config / tuning / num_threads: see :func:`na2d`.
    query_offset: as in :func:`na2d` (``query``, ``output``, ``lse``, ``d_output`` and the
    returned ``d_query`` then hold the query region; ``key`` / ``value`` the whole grid).
    rpb: the forward's relative positional bias (backends reference and cpu; the CUDA backends
    add none in their kernels, see :func:`na2d`); its gradient ``d_rpb`` (in rpb's dtype) is
    returned last.
    """
    fn = "na_backward"
    named = [("d_output", d_output), ("query", query), ("key", key), ("value", value),
             ("output", output), ("lse", lse), ("additional_keys", additional_keys),
             ("additional_values", additional_values), ("d_lse", d_lse)]
    kind = _framework(fn, named)
    rank = query.ndim - 3
    if rank not in (1, 2, 3):
        raise ValueError(f"{fn}: query has {query.ndim} dims; expected 4, 5 or 6")
    _args.check_pair("additional_keys", additional_keys, "additional_values", additional_values)
    for name, t in named[:5]:  # the gradients are allocated in their shapes
        _args.check_dims(fn, name, t)
    sp = _args.spatial(rank, kernel_size, stride, dilation, is_causal)
    query_offset = _args.query_offset(fn, query_offset, rank)
    if rpb is not None:
        _check_rpb(fn, kind, rpb, query.shape[-2], sp[0], query)
    natten_backend = _args.natten_backend(backend)
    backend = _args.backend_name(backend)
    scale = _args.resolve_scale(scale, query.shape[-1])
    tuning = _args.tuning_text(tuning)
    deterministic = _args.resolve_deterministic(fn, deterministic, kind == "torch", True)
    if natten_backend is not None:
        config, backward_config, tuning = _natten_backend(
            fn, natten_backend, kind, named[1:], query, value, sp,
            (config, deterministic, allow_tf32, backward_config, tuning), forward=False)
    opts = (*_args.fused_options(config, deterministic, allow_tf32, kind == "torch",
                                 backward_config, tuning), _args.num_threads_value(num_threads))
    if kind == "torch":
        _check_devices(fn, backend, named + ([] if rpb is None else [("rpb", rpb)]))
        _compat.torch_ops.check_autograd_mode(fn, (query, key, value, output, lse, d_output,
                                                   d_lse, rpb))
        bias = () if rpb is None else (rpb,)
        grads = _compat.torch.ops.fna.na_backward(query, key, value, output, lse, d_output, d_lse,
                                                  additional_keys, additional_values, *sp, scale,
                                                  backend, *opts, query_offset, *bias)
    else:
        _numpy_backend(fn, backend)
        from . import _numpy
        grads = _numpy.backward(query, key, value, output, lse, d_output, additional_keys,
                                additional_values, sp, scale, backend, opts, d_lse, query_offset,
                                rpb)
    return tuple(grads)


# ---- unfused operators ---------------------------------------------------------------------------

def _qk(fn, rank, query, key, kernel_size, stride, dilation, is_causal, additional_keys, backend,
        rpb=None):
    named = [("query", query), ("key", key), ("additional_keys", additional_keys)]
    kind = _framework(fn, named)
    _args.check_rank(fn, rank, "query", query)
    _args.check_rank(fn, rank, "key", key)
    _args.check_dims(fn, "query", query, range(query.ndim - 1))  # attn's shape but the window
    if additional_keys is not None:
        _args.check_additional("additional_keys", additional_keys, query.shape[0], rank)
    sp = _args.spatial(rank, kernel_size, stride, dilation, is_causal)
    # Before attn [..., prod(kernel_size)] is allocated from the window
    _args.check_window_fits(fn, sp, tuple(query.shape[1:1 + rank]))
    backend = _args.backend_name(backend, unfused=True)
    if rpb is not None:
        _check_rpb(fn, kind, rpb, query.shape[-2], sp[0], query)
        named = named + [("rpb", rpb)]
    if kind == "torch":
        _check_devices(fn, backend, named)
        _compat.torch_ops.check_autograd_mode(fn, (query, key, additional_keys, rpb))
        # with a bias, every backend adds it in float32 before the one rounding to attn's dtype
        return _compat.torch.ops.fna.na_qk(query, key, additional_keys, *sp, -1.0, backend, rpb)
    _numpy_backend(fn, backend)
    from . import _numpy
    return _numpy.qk(query, key, additional_keys, sp, backend, rpb=rpb)


def _av(fn, rank, attn, value, kernel_size, stride, dilation, is_causal, additional_values,
        backend):
    named = [("attn", attn), ("value", value), ("additional_values", additional_values)]
    kind = _framework(fn, named)
    _args.check_rank(fn, rank, "attn", attn, last="window + n_additional")
    _args.check_rank(fn, rank, "value", value)
    _args.check_dims(fn, "attn", attn, range(attn.ndim - 1))  # the output's shape: attn's
    _args.check_dims(fn, "value", value)                      # but the window, value's dim
    if additional_values is not None:
        _args.check_additional("additional_values", additional_values, attn.shape[0], rank)
    sp = _args.spatial(rank, kernel_size, stride, dilation, is_causal)
    backend = _args.backend_name(backend, unfused=True)
    if kind == "torch":
        _check_devices(fn, backend, named)
        _compat.torch_ops.check_autograd_mode(fn, (attn, value, additional_values))
        return _compat.torch.ops.fna.na_av(attn, value, additional_values, *sp, backend)
    _numpy_backend(fn, backend)
    from . import _numpy
    return _numpy.av(attn, value, additional_values, sp, backend)


_QK_DOC = """{r}-D attention logits over the neighborhood (NATTEN's ``na{r}d_qk``).

    query ``[B, {axes}, H, D]``, key ``[B, {axes}, H_kv, D]`` -> attn ``[B, {axes}, H, W + N_add]``
    with ``W = prod(kernel_size)``. ``attn[..., w]`` for ``w < W`` is ``<q, k>`` for the w-th
    neighbor, neighbors numbered row-major over the window box (last axis fastest);
    ``attn[..., W + n]`` is the logit of additional key n. Slots that hold no neighbor (causal
    windows near the start of an axis) are ``-inf``. No scale is applied: softmax(attn * scale)
    followed by ``na{r}d_av`` equals ``na{r}d``.
    rpb: optional relative positional bias (a torch tensor, or a NumPy array for NumPy inputs),
    ``[H, {rpb_shape}]`` as NATTEN 0.17's:
    neighbor slot w of query q gets ``rpb[h, *((key - q) / dilation + kernel_size - 1)]`` added
    (docs/semantics.md section 1.3; empty slots stay ``-inf``, additional keys get no bias), and
    it gets its gradient through autograd. With a bias, softmax(na{r}d_qk(query * scale, key,
    rpb=rpb)) followed by ``na{r}d_av`` equals ``na{r}d(..., scale=scale, rpb=rpb)``.
    """

_AV_DOC = """{r}-D weighted sum of values over the neighborhood (NATTEN's ``na{r}d_av``).

    attn ``[B, {axes}, H, W + N_add]`` (in :func:`na{r}d_qk`'s neighbor order; non-neighbor slots
    are ignored), value ``[B, {axes}, H_kv, D_v]``, additional_values ``[B, N_add, H_kv, D_v]``
    -> ``[B, {axes}, H, D_v]``.
    """


def na1d_qk(query, key, kernel_size, stride=1, dilation=1, is_causal=False,
            additional_keys=None, backend=None, rpb=None):
    return _qk("na1d_qk", 1, query, key, kernel_size, stride, dilation, is_causal,
               additional_keys, backend, rpb)


def na2d_qk(query, key, kernel_size, stride=1, dilation=1, is_causal=False,
            additional_keys=None, backend=None, rpb=None):
    return _qk("na2d_qk", 2, query, key, kernel_size, stride, dilation, is_causal,
               additional_keys, backend, rpb)


def na3d_qk(query, key, kernel_size, stride=1, dilation=1, is_causal=False,
            additional_keys=None, backend=None, rpb=None):
    return _qk("na3d_qk", 3, query, key, kernel_size, stride, dilation, is_causal,
               additional_keys, backend, rpb)


def na1d_av(attn, value, kernel_size, stride=1, dilation=1, is_causal=False,
            additional_values=None, backend=None):
    return _av("na1d_av", 1, attn, value, kernel_size, stride, dilation, is_causal,
               additional_values, backend)


def na2d_av(attn, value, kernel_size, stride=1, dilation=1, is_causal=False,
            additional_values=None, backend=None):
    return _av("na2d_av", 2, attn, value, kernel_size, stride, dilation, is_causal,
               additional_values, backend)


def na3d_av(attn, value, kernel_size, stride=1, dilation=1, is_causal=False,
            additional_values=None, backend=None):
    return _av("na3d_av", 3, attn, value, kernel_size, stride, dilation, is_causal,
               additional_values, backend)


for _r, _axes in ((1, "L"), (2, "X, Y"), (3, "X, Y, Z")):
    globals()[f"na{_r}d_qk"].__doc__ = _QK_DOC.format(
        r=_r, axes=_axes, rpb_shape=", ".join(f"2 K_{a} - 1" for a in range(_r)))
    globals()[f"na{_r}d_av"].__doc__ = _AV_DOC.format(r=_r, axes=_axes)


def na_qk_backward(d_attn, query, key, kernel_size, stride=1, dilation=1, is_causal=False,
                   additional_keys=None, backend=None):
    """Gradients of ``na{r}d_qk`` without autograd: ``(d_query, d_key[, d_additional_keys])``."""
    fn = "na_qk_backward"
    named = [("d_attn", d_attn), ("query", query), ("key", key),
             ("additional_keys", additional_keys)]
    kind = _framework(fn, named)
    sp = _args.spatial(query.ndim - 3, kernel_size, stride, dilation, is_causal)
    backend = _args.backend_name(backend, unfused=True)
    if kind == "torch":
        _check_devices(fn, backend, named)
        return tuple(_compat.torch.ops.fna.na_qk_backward(query, key, additional_keys, d_attn,
                                                          *sp, -1.0, backend))
    _numpy_backend(fn, backend)
    from . import _numpy
    return tuple(_numpy.qk_backward(query, key, additional_keys, d_attn, sp, backend))


def na_av_backward(d_output, attn, value, kernel_size, stride=1, dilation=1, is_causal=False,
                   additional_values=None, backend=None):
    """Gradients of ``na{r}d_av`` without autograd: ``(d_attn, d_value[, d_additional_values])``.
    ``d_attn`` is 0 in slots that hold no neighbor."""
    fn = "na_av_backward"
    named = [("d_output", d_output), ("attn", attn), ("value", value),
             ("additional_values", additional_values)]
    kind = _framework(fn, named)
    sp = _args.spatial(attn.ndim - 3, kernel_size, stride, dilation, is_causal)
    backend = _args.backend_name(backend, unfused=True)
    if kind == "torch":
        _check_devices(fn, backend, named)
        return tuple(_compat.torch.ops.fna.na_av_backward(attn, value, additional_values, d_output,
                                                          *sp, backend))
    _numpy_backend(fn, backend)
    from . import _numpy
    return tuple(_numpy.av_backward(attn, value, additional_values, d_output, sp, backend))
