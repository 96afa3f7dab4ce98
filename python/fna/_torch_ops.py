"""The torch path: ``torch.library.custom_op``s with fake (meta) implementations and autograd.

Each op allocates its outputs on the inputs' device and calls the extension on that device's
current CUDA stream (0 on the CPU). The fake implementations only compute shapes, so
``torch.compile(fullgraph=True)`` traces through the ops, forward and backward, without graph
breaks. Parameters travel as lists of ints / bools, a float scale and a backend name.

Ops (namespace ``fna``):
  na_forward(q, k, v, add_k?, add_v?, ...) -> (out, lse)
  na_backward(q, k, v, out, lse, d_out, d_lse?, add_k?, add_v?, ...)
      -> [dq, dk, dv(, d_add_k, d_add_v)]      (d_lse: the gradient into lse; None = zero)
  na_qk(q, k, add_k?, ...) -> attn                 na_qk_backward(...) -> [dq, dk(, d_add_k)]
  na_av(attn, v, add_v?, ...) -> out               na_av_backward(...) -> [d_attn, dv(, d_add_v)]
"""

import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack

from . import _C, _flops


# The tensors go to the extension as DLPack capsules from torch's public exporter,
# torch.utils.dlpack.to_dlpack (no torch-internal name is used for the data). Not
# Tensor.__dlpack__: it wraps the same export in Python-level checks (gradient, conjugate bit,
# layout, the current CUDA device) that cost more than the export itself and none of which
# applies here: the arrays are detached, the extension takes real dtypes only and reads the device
# from each capsule (setting it around the call). The raw current stream comes without a
# torch.cuda.Stream object where torch has the getter.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent without CUDA


def _export(t):
    t = t.detach()  # the op's inputs are never differentiated here
    # A tensor with torch's negative bit (e.g. the imaginary part of a conjugate) holds -values in
    # memory; DLPack hands over the memory, so the values are resolved first.
    return to_dlpack(t.resolve_neg() if t.is_neg() else t)


def _stream_of(device):
    if device.type != "cuda":
        return 0
    if _raw_stream is not None:
        return _raw_stream(device.index)  # a CUDA tensor's device always has its index
    return torch.cuda.current_stream(device).cuda_stream


def _call(fn, device, *arrays, sp, backend, scale=-1.0, opts=("", False, False, "", "", 0),
          **region):
    kernel_size, stride, dilation, is_causal = sp
    arrays = [None if a is None else _export(a) for a in arrays]
    config, deterministic, allow_tf32, backward_config, tuning, num_threads = opts
    fn(*arrays, kernel_size=kernel_size, stride=stride, dilation=dilation, is_causal=is_causal,
       backend=backend, scale=scale, stream=_stream_of(device), config=config,
       deterministic=deterministic, allow_tf32=allow_tf32, backward_config=backward_config,
       tuning=tuning, num_threads=num_threads, **region)


def _region(query_offset):
    """The extension's query_offset keyword (none for the whole grid)."""
    return {} if not query_offset else {"query_offset": list(query_offset)}


# ---- what fna's ops support of torch's autograd modes ----------------------------------------------
# Reverse-mode autograd (first order) and torch.func.vmap (through the ops' batching fallback) are
# supported. Higher-order or forward-mode derivatives have no formula here, so asking for one is an
# error at the call that asks, never a silently dropped term: double backward (create_graph=True),
# forward-mode AD (torch.autograd.forward_ad, torch.func.jvp) and the other torch.func transforms
# (grad, jacrev, ...: they need the same machinery).

def _no_double_backward(op):
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"fna: double backward through {op} (create_graph=True) is not supported: its "
            "backward has no derivative, so a second-order term would be silently dropped")


def _functorch_transform():
    """The innermost torch.func transform active (its name), or None."""
    from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter
    interp = retrieve_current_functorch_interpreter()
    return None if interp is None else interp.key().name


def check_autograd_mode(fn, tensors):
    """Raises for an autograd mode fna's ops do not support (see above); returns True under
    torch.func.vmap (the caller must go through the custom ops, which vmap batches). While
    torch.compile traces, the traced ops are checked by torch itself."""
    if torch.compiler.is_compiling():
        return False
    wrapped = False
    for t in tensors:
        if t is not None and torch._C._functorch.is_functorch_wrapped_tensor(t):
            wrapped = True
            break
    if wrapped:
        kind = _functorch_transform()
        if kind is not None and kind != "Vmap":
            raise RuntimeError(
                f"{fn}: torch.func.{kind.lower()} is not supported by fna's ops (no forward-mode or "
                "functorch derivative); use torch.autograd (and torch.func.vmap) instead")
    if torch.autograd.forward_ad._current_level >= 0:
        for t in tensors:
            if t is not None and torch.autograd.forward_ad.unpack_dual(t).tangent is not None:
                raise RuntimeError(f"{fn}: forward-mode AD (torch.autograd.forward_ad) is not "
                                   "supported by fna's ops; the tangent would be dropped")
    return wrapped


def _sp(kernel_size, stride, dilation, is_causal):
    return (list(kernel_size), list(stride), list(dilation), list(is_causal))


def _out_shape(q, v):
    return tuple(q.shape[:-1]) + (v.shape[-1],)


# ---- fused forward / backward -------------------------------------------------------------------

@torch.library.custom_op("fna::na_forward", mutates_args=())
def na_forward(query: Tensor, key: Tensor, value: Tensor, additional_keys: Optional[Tensor],
               additional_values: Optional[Tensor], kernel_size: List[int], stride: List[int],
               dilation: List[int], is_causal: List[bool], scale: float, backend: str,
               config: str, deterministic: bool, allow_tf32: bool,
               backward_config: str, tuning: str, num_threads: int = 0,
               query_offset: Optional[List[int]] = None,
               rpb: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return _forward_impl(query, key, value, additional_keys, additional_values, kernel_size,
                         stride, dilation, is_causal, scale, backend, config, deterministic,
                         allow_tf32, backward_config, tuning, num_threads, query_offset, rpb)


def _bias(rpb):
    """The extension's rpb keyword: the table in float32 (the kernels add it in float32)."""
    return {} if rpb is None else {"rpb": _export(rpb.to(torch.float32).contiguous())}


def _forward_impl(query, key, value, additional_keys, additional_values, kernel_size, stride,
                  dilation, is_causal, scale, backend, config, deterministic, allow_tf32,
                  backward_config, tuning, num_threads=0, query_offset=None, rpb=None):
    out = query.new_empty(_out_shape(query, value))
    lse = query.new_empty(tuple(query.shape[:-1]), dtype=torch.float32)
    _call(_C.forward, query.device, query, key, value, out, lse, additional_keys,
          additional_values, sp=_sp(kernel_size, stride, dilation, is_causal), backend=backend,
          scale=scale, opts=(config, deterministic, allow_tf32, backward_config, tuning,
                             num_threads), **_region(query_offset), **_bias(rpb))
    return out, lse


@na_forward.register_fake
def _(query, key, value, additional_keys, additional_values, kernel_size, stride, dilation,
      is_causal, scale, backend, config, deterministic, allow_tf32, backward_config, tuning,
      num_threads=0, query_offset=None, rpb=None):
    out = query.new_empty(_out_shape(query, value))
    lse = query.new_empty(tuple(query.shape[:-1]), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("fna::na_backward", mutates_args=())
def na_backward(query: Tensor, key: Tensor, value: Tensor, output: Tensor, lse: Tensor,
                d_output: Tensor, d_lse: Optional[Tensor], additional_keys: Optional[Tensor],
                additional_values: Optional[Tensor], kernel_size: List[int], stride: List[int],
                dilation: List[int], is_causal: List[bool], scale: float, backend: str,
                config: str, deterministic: bool, allow_tf32: bool,
                backward_config: str, tuning: str, num_threads: int = 0,
                query_offset: Optional[List[int]] = None,
                rpb: Optional[Tensor] = None) -> List[Tensor]:
    return _backward_impl(query, key, value, output, lse, d_output, d_lse, additional_keys,
                          additional_values, kernel_size, stride, dilation, is_causal, scale,
                          backend, config, deterministic, allow_tf32, backward_config, tuning,
                          num_threads, query_offset, rpb)


def _backward_impl(query, key, value, output, lse, d_output, d_lse, additional_keys,
                   additional_values, kernel_size, stride, dilation, is_causal, scale, backend,
                   config, deterministic, allow_tf32, backward_config, tuning, num_threads=0,
                   query_offset=None, rpb=None):
    """dQ, dK, dV (then the additional keys' and values' gradients, then rpb's, where given)."""
    grads = [torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)]
    add = [] if additional_keys is None else [torch.empty_like(additional_keys),
                                              torch.empty_like(additional_values)]
    bias = _bias(rpb)
    if rpb is not None:
        d_rpb = torch.empty(rpb.shape, dtype=torch.float32, device=rpb.device)
        bias["d_rpb"] = _export(d_rpb)
    _call(_C.backward, query.device, query, key, value, output, d_output, lse, *grads,
          additional_keys, additional_values, *(add or [None, None]), d_lse,
          sp=_sp(kernel_size, stride, dilation, is_causal), backend=backend, scale=scale,
          opts=(config, deterministic, allow_tf32, backward_config, tuning, num_threads),
          **_region(query_offset), **bias)
    return grads + add + ([] if rpb is None else [d_rpb.to(rpb.dtype)])


@na_backward.register_fake
def _(query, key, value, output, lse, d_output, d_lse, additional_keys, additional_values,
      kernel_size, stride, dilation, is_causal, scale, backend, config, deterministic, allow_tf32,
      backward_config, tuning, num_threads=0, query_offset=None, rpb=None):
    grads = [torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)]
    if additional_keys is not None:
        grads += [torch.empty_like(additional_keys), torch.empty_like(additional_values)]
    if rpb is not None:  # (contiguous, as the real op's)
        grads.append(torch.empty(rpb.shape, dtype=rpb.dtype, device=rpb.device))
    return grads


def _na_setup(ctx, inputs, output):
    (query, key, value, add_k, add_v, kernel_size, stride, dilation, is_causal, scale, backend,
     config, deterministic, allow_tf32, backward_config, tuning, *rest) = inputs
    # (defaults the op's caller may leave out)
    num_threads = rest[0] if rest else 0
    query_offset = rest[1] if len(rest) > 1 else None
    rpb = rest[2] if len(rest) > 2 else None
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, add_k, add_v, rpb)
    ctx.params = (list(kernel_size), list(stride), list(dilation), list(is_causal), scale, backend,
                  config, deterministic, allow_tf32, backward_config, tuning, num_threads,
                  query_offset)
    ctx.num_inputs = len(inputs)
    # Both outputs are differentiable: a gradient into the LSE goes to the backward as d_lse.
    # Unused outputs arrive as None (not zeros), so a loss on the output alone passes no d_lse.
    ctx.set_materialize_grads(False)


def _na_grads(ctx, d_out, d_lse, backward):
    query, key, value, out, lse, add_k, add_v, rpb = ctx.saved_tensors
    if d_out is None:
        d_out = torch.zeros_like(out)
    elif d_out.stride(-1) != 1:
        # e.g. out.sum().backward() hands an expanded (all-zero-stride) gradient; the fused
        # backward reads rows with unit stride on the head dim, so materialize it once.
        d_out = d_out.contiguous()
    bias = () if rpb is None else (rpb,)
    grads = backward(query, key, value, out, lse, d_out, d_lse, add_k, add_v, *ctx.params, *bias)
    d_add = (grads[3], grads[4]) if add_k is not None else (None, None)
    rest = (None,) * (ctx.num_inputs - 5)
    if rpb is not None:  # rpb is the op's last input (index 18)
        rest = rest[:-1] + (grads[-1],)
    return (grads[0], grads[1], grads[2]) + d_add + rest


def _na_backward(ctx, d_out, d_lse):
    _no_double_backward("na*d")
    return _na_grads(ctx, d_out, d_lse, torch.ops.fna.na_backward)


na_forward.register_autograd(_na_backward, setup_context=_na_setup)


# ---- eager fast path ------------------------------------------------------------------------------

class _NaEager(torch.autograd.Function):
    """na_forward with its autograd, minus the custom op's dispatcher round trip (on the H100
    machine's host a tiny call took 99.5 us through torch.ops.fna.na_forward against 27.4 us for
    the extension call alone: tools/gpu/host_overhead.py). Used in eager mode only;
    torch.compile traces the custom op."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _forward_impl(*inputs)
        _na_setup(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, d_out, d_lse):
        _no_double_backward("na*d")
        return _na_grads(ctx, d_out, d_lse, _backward_impl)


def na_forward_call(*inputs):
    """torch.ops.fna.na_forward's result for `inputs` (its argument list), by the cheapest route:
    the custom op while torch.compile traces, else the implementation directly (through
    _NaEager when autograd records a graph)."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0:
        # Traced, or under a TorchDispatchMode (FlopCounterMode, FakeTensorMode, ...), which must
        # see the op and its backward op.
        return torch.ops.fna.na_forward(*inputs)
    tensors = inputs[:5] + inputs[18:19]  # (rpb, where given, is the op's last input)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return _NaEager.apply(*inputs)
    return _forward_impl(*inputs)


# ---- unfused qk -----------------------------------------------------------------------------------

def _attn_shape(query, kernel_size, additional):
    n_add = 0 if additional is None else additional.shape[1]
    return tuple(query.shape[:-1]) + (math.prod(kernel_size) + n_add,)


@torch.library.custom_op("fna::na_qk", mutates_args=())
def na_qk(query: Tensor, key: Tensor, additional_keys: Optional[Tensor], kernel_size: List[int],
          stride: List[int], dilation: List[int], is_causal: List[bool], scale: float,
          backend: str, rpb: Optional[Tensor] = None) -> Tensor:
    attn = query.new_empty(_attn_shape(query, kernel_size, additional_keys))
    bias = {} if rpb is None else {"rpb": _export(rpb.to(torch.float32))}
    _call(_C.qk_forward, query.device, query, key, attn, additional_keys,
          sp=_sp(kernel_size, stride, dilation, is_causal), backend=backend, scale=scale, **bias)
    return attn


@na_qk.register_fake
def _(query, key, additional_keys, kernel_size, stride, dilation, is_causal, scale, backend,
      rpb=None):
    return query.new_empty(_attn_shape(query, kernel_size, additional_keys))


@torch.library.custom_op("fna::na_qk_backward", mutates_args=())
def na_qk_backward(query: Tensor, key: Tensor, additional_keys: Optional[Tensor], d_attn: Tensor,
                   kernel_size: List[int], stride: List[int], dilation: List[int],
                   is_causal: List[bool], scale: float, backend: str) -> List[Tensor]:
    grads = [torch.empty_like(query), torch.empty_like(key)]
    add = [] if additional_keys is None else [torch.empty_like(additional_keys)]
    _call(_C.qk_backward, query.device, query, key, d_attn, *grads, additional_keys,
          add[0] if add else None, sp=_sp(kernel_size, stride, dilation, is_causal),
          backend=backend, scale=scale)
    return grads + add


@na_qk_backward.register_fake
def _(query, key, additional_keys, d_attn, kernel_size, stride, dilation, is_causal, scale,
      backend):
    grads = [torch.empty_like(query), torch.empty_like(key)]
    if additional_keys is not None:
        grads.append(torch.empty_like(additional_keys))
    return grads


def _qk_setup(ctx, inputs, output):
    query, key, add_k, kernel_size, stride, dilation, is_causal, scale, backend = inputs[:9]
    rpb = inputs[9] if len(inputs) > 9 else None
    ctx.save_for_backward(query, key, add_k, rpb)
    ctx.params = (list(kernel_size), list(stride), list(dilation), list(is_causal), scale, backend)


def _qk_backward(ctx, d_attn):
    _no_double_backward("na*d_qk")
    query, key, add_k, rpb = ctx.saved_tensors
    grads = torch.ops.fna.na_qk_backward(query, key, add_k, d_attn, *ctx.params)
    d_add_k = grads[2] if add_k is not None else None
    # The bias is added, so its entries take the sum of their slots' gradients (_rpb.gather_grad).
    d_rpb = None
    if rpb is not None and ctx.needs_input_grad[9]:
        from . import _rpb
        d_rpb = _rpb.gather_grad(d_attn, rpb, ctx.params[:4])
    return (grads[0], grads[1], d_add_k) + (None,) * 6 + (d_rpb,)


na_qk.register_autograd(_qk_backward, setup_context=_qk_setup)


# ---- unfused av -----------------------------------------------------------------------------------

@torch.library.custom_op("fna::na_av", mutates_args=())
def na_av(attn: Tensor, value: Tensor, additional_values: Optional[Tensor],
          kernel_size: List[int], stride: List[int], dilation: List[int], is_causal: List[bool],
          backend: str) -> Tensor:
    out = attn.new_empty(_out_shape(attn, value))
    _call(_C.av_forward, attn.device, attn, value, out, additional_values,
          sp=_sp(kernel_size, stride, dilation, is_causal), backend=backend)
    return out


@na_av.register_fake
def _(attn, value, additional_values, kernel_size, stride, dilation, is_causal, backend):
    return attn.new_empty(_out_shape(attn, value))


@torch.library.custom_op("fna::na_av_backward", mutates_args=())
def na_av_backward(attn: Tensor, value: Tensor, additional_values: Optional[Tensor],
                   d_output: Tensor, kernel_size: List[int], stride: List[int],
                   dilation: List[int], is_causal: List[bool], backend: str) -> List[Tensor]:
    grads = [torch.empty_like(attn), torch.empty_like(value)]
    add = [] if additional_values is None else [torch.empty_like(additional_values)]
    _call(_C.av_backward, attn.device, attn, value, d_output, *grads, additional_values,
          add[0] if add else None, sp=_sp(kernel_size, stride, dilation, is_causal),
          backend=backend)
    return grads + add


@na_av_backward.register_fake
def _(attn, value, additional_values, d_output, kernel_size, stride, dilation, is_causal, backend):
    grads = [torch.empty_like(attn), torch.empty_like(value)]
    if additional_values is not None:
        grads.append(torch.empty_like(additional_values))
    return grads


def _av_setup(ctx, inputs, output):
    attn, value, add_v, kernel_size, stride, dilation, is_causal, backend = inputs
    ctx.save_for_backward(attn, value, add_v)
    ctx.params = (list(kernel_size), list(stride), list(dilation), list(is_causal), backend)


def _av_backward(ctx, d_out):
    _no_double_backward("na*d_av")
    attn, value, add_v = ctx.saved_tensors
    grads = torch.ops.fna.na_av_backward(attn, value, add_v, d_out, *ctx.params)
    d_add_v = grads[2] if add_v is not None else None
    return (grads[0], grads[1], d_add_v) + (None,) * 5


na_av.register_autograd(_av_backward, setup_context=_av_setup)


# ---- FLOP counting -------------------------------------------------------------------------------
# torch.utils.flop_counter formulas (docs/semantics.md 3.1), so that FlopCounterMode counts fna's
# ops: the fused forward 2 * B * H * P * (D + D_v) and its backward 2.5x that (fna.flops); the
# unfused qk / av 2 * B * H * P * D / D_v and their backwards twice that (dQ and dK; d_attn and dV).
# P: the attended (query, key) pairs of one batch and head, additional keys included.

def _pairs(shape, spatial_rank, kernel_size, stride, dilation, is_causal, additional_shape):
    n_add = 0 if additional_shape is None else additional_shape[1]
    return _flops.attended_pairs(shape[1:1 + spatial_rank], kernel_size, stride, dilation,
                                 is_causal, n_add)


def _register_flop_formulas():
    from torch.utils.flop_counter import flop_registry, register_flop_formula

    def register(op):
        def wrap(formula):
            # The module may be imported again (reload): register once.
            if op not in flop_registry and op.default not in flop_registry:
                register_flop_formula(op)(formula)
            # FlopCounterMode looks formulas up by the op's packet; torch before 2.5 registers a
            # custom op's formula under its overloads only.
            if op not in flop_registry:
                flop_registry[op] = flop_registry[op.default]
            return formula
        return wrap

    @register(torch.ops.fna.na_forward)
    def _(q, k, v, add_k, add_v, kernel_size, stride, dilation, is_causal, *args, **kwargs):
        pairs = _pairs(q, len(q) - 3, kernel_size, stride, dilation, is_causal, add_k)
        return _flops.fused_forward(q[0], q[-2], pairs, q[-1], v[-1])

    @register(torch.ops.fna.na_backward)
    def _(q, k, v, out, lse, d_out, d_lse, add_k, add_v, kernel_size, stride, dilation,
          is_causal, *args, **kwargs):
        pairs = _pairs(q, len(q) - 3, kernel_size, stride, dilation, is_causal, add_k)
        return _flops.fused_backward(q[0], q[-2], pairs, q[-1], v[-1])

    @register(torch.ops.fna.na_qk)
    def _(q, k, add_k, kernel_size, stride, dilation, is_causal, *args, **kwargs):
        pairs = _pairs(q, len(q) - 3, kernel_size, stride, dilation, is_causal, add_k)
        return 2 * q[0] * q[-2] * pairs * q[-1]

    @register(torch.ops.fna.na_qk_backward)
    def _(q, k, add_k, d_attn, kernel_size, stride, dilation, is_causal, *args, **kwargs):
        pairs = _pairs(q, len(q) - 3, kernel_size, stride, dilation, is_causal, add_k)
        return 4 * q[0] * q[-2] * pairs * q[-1]

    @register(torch.ops.fna.na_av)
    def _(attn, v, add_v, kernel_size, stride, dilation, is_causal, *args, **kwargs):
        pairs = _pairs(attn, len(attn) - 3, kernel_size, stride, dilation, is_causal, add_v)
        return 2 * attn[0] * attn[-2] * pairs * v[-1]

    @register(torch.ops.fna.na_av_backward)
    def _(attn, v, add_v, d_out, kernel_size, stride, dilation, is_causal, *args, **kwargs):
        pairs = _pairs(attn, len(attn) - 3, kernel_size, stride, dilation, is_causal, add_v)
        return 4 * attn[0] * attn[-2] * pairs * v[-1]


_register_flop_formulas()
