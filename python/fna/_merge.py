"""fna.merge_attentions: combine attention outputs over disjoint key sets by their LSEs.

Attention of one query over the union of disjoint key sets K_1 .. K_n is a convex combination of
the attentions over each set: with LSE_i = log sum_{j in K_i} exp(s_j),

    LSE = log sum_i exp(LSE_i),    out = sum_i exp(LSE_i - LSE) * out_i.

Written in plain differentiable torch ops (float32 or float64 arithmetic), so autograd carries
gradients into every ``out_i`` and ``LSE_i``; fna's own ``return_lse=True`` outputs pass the
LSE's gradient on to the attention's backward (``d_lse``), so the gradients of a merge of fna
calls are those of the joint attention. torch is imported only when this is called.
"""

from . import _compat

_FN = "merge_attentions"
_compiled = None  # torch.compile(_merge, fullgraph=True), built on first use


def _merge(outputs, lse_tensors):
    torch = _compat.torch
    out_dtype, lse_dtype = outputs[0].dtype, lse_tensors[0].dtype
    acc = torch.float64 if torch.float64 in (out_dtype, lse_dtype) else torch.float32
    lse = torch.stack([x.to(acc) for x in lse_tensors])                  # [n, B, ..., H]
    # Shift by the largest LSE (a constant for the gradient: the result does not depend on it);
    # rows where every LSE is -inf (no keys anywhere) take shift 0, so nothing becomes NaN.
    shift = lse.detach().amax(dim=0)
    shift = shift.masked_fill(shift == float("-inf"), 0.0)
    w = torch.exp(lse - shift)                                            # 0 where LSE_i = -inf
    total = w.sum(dim=0)
    some = total > 0
    safe = torch.where(some, total, torch.ones_like(total))
    merged_lse = torch.where(some, shift + torch.log(safe),
                             torch.full_like(total, float("-inf")))
    # A NaN or +inf LSE is not a part without keys: the merged LSE is NaN / +inf there, as
    # torch.logsumexp gives it (the output is NaN there: w is).
    lse_d = lse.detach()
    merged_lse = torch.where((lse_d == float("inf")).any(dim=0),
                             torch.full_like(total, float("inf")), merged_lse)
    merged_lse = torch.where(lse_d.isnan().any(dim=0), torch.full_like(total, float("nan")),
                             merged_lse)
    # A part with LSE = -inf attended to no key: its weight is 0 whatever its output holds (even
    # NaN, as some kernels leave there), and it gets no gradient.
    parts = torch.stack([torch.where(x.unsqueeze(-1) == float("-inf"), 0.0, o.to(acc))
                         for o, x in zip(outputs, lse_tensors)])         # [n, B, ..., H, D]
    out = ((w / safe).unsqueeze(-1) * parts).sum(dim=0)
    return out.to(out_dtype), merged_lse.to(lse_dtype)


def _check(outputs, lse_tensors, torch_compile, use_autograd_fix):
    for name, seq in (("outputs", outputs), ("lse_tensors", lse_tensors)):
        if not isinstance(seq, (list, tuple)):
            raise TypeError(f"{_FN}: {name} must be a list or tuple of torch tensors, got "
                            f"{type(seq).__name__}")
    for name, flag in (("torch_compile", torch_compile), ("use_autograd_fix", use_autograd_fix)):
        if not isinstance(flag, bool):
            raise TypeError(f"{_FN}: {name}={flag!r} must be a bool")
    if len(outputs) < 2:
        raise ValueError(f"{_FN}: outputs has {len(outputs)} tensor(s); merging needs at least 2")
    if len(lse_tensors) != len(outputs):
        raise ValueError(f"{_FN}: outputs has {len(outputs)} tensors but lse_tensors has "
                         f"{len(lse_tensors)}; each output needs its LSE")
    for name, seq in (("outputs", outputs), ("lse_tensors", lse_tensors)):
        for i, t in enumerate(seq):
            if not _compat.is_torch_tensor(t):
                raise TypeError(f"{_FN}: {name}[{i}] must be a torch.Tensor, got "
                                f"{type(t).__name__}")
            if t.is_nested:
                raise TypeError(f"{_FN}: {name}[{i}] is a nested tensor; pass dense tensors")
    torch = _compat.torch
    out0, lse0 = outputs[0], lse_tensors[0]
    if out0.dim() < 3:
        raise ValueError(f"{_FN}: outputs[0] has shape {tuple(out0.shape)}; expected "
                         "[batch, *tokens, heads, head_dim] (at least 3 dims)")
    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    if out0.dtype not in floats:
        raise TypeError(f"{_FN}: outputs[0] has dtype {str(out0.dtype)[6:]}; expected float16, "
                        "bfloat16, float32 or float64")
    if lse0.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{_FN}: lse_tensors[0] has dtype {str(lse0.dtype)[6:]}; expected "
                        "float32 (as fna returns it) or float64")
    lse_shape = tuple(out0.shape[:-1])
    for i, (o, x) in enumerate(zip(outputs, lse_tensors)):
        if tuple(o.shape) != tuple(out0.shape):
            raise ValueError(f"{_FN}: outputs[{i}] has shape {tuple(o.shape)} but outputs[0] has "
                             f"shape {tuple(out0.shape)}; all outputs must have one shape")
        if tuple(x.shape) != lse_shape:
            raise ValueError(f"{_FN}: lse_tensors[{i}] has shape {tuple(x.shape)}; expected "
                             f"{lse_shape} (the outputs' shape without the head dim)")
        if o.dtype != out0.dtype:
            raise TypeError(f"{_FN}: outputs[{i}] has dtype {str(o.dtype)[6:]} but outputs[0] "
                            f"has {str(out0.dtype)[6:]}; all outputs must share one dtype")
        if x.dtype != lse0.dtype:
            raise TypeError(f"{_FN}: lse_tensors[{i}] has dtype {str(x.dtype)[6:]} but "
                            f"lse_tensors[0] has {str(lse0.dtype)[6:]}; all LSEs must share one "
                            "dtype")
        for name, t in ((f"outputs[{i}]", o), (f"lse_tensors[{i}]", x)):
            if t.device != out0.device:
                raise ValueError(f"{_FN}: {name} is on {t.device} but outputs[0] is on "
                                 f"{out0.device}; all tensors must be on one device")


def merge_attentions(outputs, lse_tensors, torch_compile=False, use_autograd_fix=True):
    """Merges attention outputs of the same queries over disjoint key sets, as if the key sets
    had been concatenated (NATTEN's ``merge_attentions``). Returns ``(output, lse)``.

    outputs: a list (or tuple) of n >= 2 torch tensors ``[B, *tokens, H, D]`` of one shape, dtype
    (float16, bfloat16, float32, float64) and device (fna's ``[B, *spatial, H, D_v]`` outputs, or
    NATTEN's ``[B, seq, H, D]``); any strides. lse_tensors: their log-sum-exps
    ``[B, *tokens, H]``, float32 (as ``return_lse=True`` gives them) or float64, one dtype.

    The merged LSE is ``log(sum_i exp(lse_i))`` and the output ``sum_i exp(lse_i - lse) *
    out_i``, computed stably (shifted by the largest LSE) in float32 (float64 when an input is
    float64); the output comes back in the outputs' dtype, the LSE in the LSEs'. A part whose LSE
    is ``-inf`` (it attended to no key) has weight 0 whatever its output holds; a row where every
    LSE is ``-inf`` gives output 0 and LSE ``-inf``, never NaN. A NaN or ``+inf`` LSE gives a NaN
    output row and a NaN / ``+inf`` merged LSE there (as ``torch.logsumexp``).

    Differentiable in every output and LSE (plain torch ops): with fna's attention outputs the
    gradients are exactly those of the joint attention, since fna's LSE carries its gradient
    into the attention's backward.

    torch_compile: run the merge through ``torch.compile(fullgraph=True)``, which fuses its
    elementwise operations (the first call per shape compiles). use_autograd_fix: accepted for
    NATTEN compatibility (NATTEN's workaround for attention kernels whose LSE has no gradient);
    fna needs no workaround, and both values give the same, exact gradients.
    """
    _check(outputs, lse_tensors, torch_compile, use_autograd_fix)
    outputs, lse_tensors = list(outputs), list(lse_tensors)
    if torch_compile:
        global _compiled
        if _compiled is None:
            _compiled = _compat.torch.compile(_merge, fullgraph=True)
        return _compiled(outputs, lse_tensors)
    return _merge(outputs, lse_tensors)
