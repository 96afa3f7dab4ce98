"""Argument normalization shared by the NumPy and torch paths.

Everything here is plain Python on shapes and dtypes (no calls into the extension), so the torch
path stays traceable by ``torch.compile(fullgraph=True)``. Value checks that need the problem
(kernel too large, stride out of range, H % H_kv, ...) are left to the C++ API, which names the
argument and its value; the extension turns its status into ValueError / TypeError /
NotImplementedError / RuntimeError.
"""

import math
import numbers

import numpy as np

BACKENDS = ("auto", "reference", "cpu", "cuda-naive", "cuda-fused")
CUDA_BACKENDS = ("cuda-naive", "cuda-fused")

_AXES = {1: "L", 2: "X, Y", 3: "X, Y, Z"}


def layout(rank, last="head_dim"):
    return f"[batch, {_AXES[rank]}, heads, {last}]"


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_bool(v):
    # numpy.bool_ is not a subclass of bool.
    return isinstance(v, (bool, np.bool_))


def per_axis(name, value, rank, boolean=False):
    """An int (bool for is_causal) applies to every axis; a tuple/list gives one per axis."""
    # The common spellings (plain ints / bools) without the numbers.Integral checks below.
    plain = bool if boolean else int
    if type(value) is plain:
        return [value] * rank
    if type(value) in (tuple, list) and len(value) == rank and all(type(v) is plain for v in value):
        return list(value)
    if isinstance(value, (tuple, list)):
        items = tuple(value)
        if len(items) != rank:
            raise ValueError(f"{name}={items} has {len(items)} entries for a {rank}-D input")
    else:
        items = (value,) * rank
    for v in items:
        if boolean and not _is_bool(v):
            raise TypeError(f"{name}={value!r}: entries must be bool")
        if not boolean and not _is_int(v):
            raise TypeError(f"{name}={value!r}: entries must be int")
    if boolean:
        return [bool(v) for v in items]
    return [int(v) for v in items]


def spatial(rank, kernel_size, stride, dilation, is_causal):
    return (
        per_axis("kernel_size", kernel_size, rank),
        per_axis("stride", stride, rank),
        per_axis("dilation", dilation, rank),
        per_axis("is_causal", is_causal, rank, boolean=True),
    )


def backend_name(backend):
    if backend is None:
        return "auto"
    if not isinstance(backend, str):
        raise TypeError(f"backend={backend!r} must be a string or None")
    if backend == "automatic":
        return "auto"
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    return backend


def fused_options(config, deterministic, allow_tf32, torch_tensors, backward_config=None):
    """(config, deterministic, allow_tf32, backward_config) as the extension takes them.

    config: None or a cuda-fused configuration name (``fna.fused_configs``). backward_config: None
    or a cuda-fused backward configuration name (``fna.fused_backward_configs``). deterministic: bool.
    allow_tf32: None follows ``torch.backends.cuda.matmul.allow_tf32`` for torch tensors (so
    ``torch.set_float32_matmul_precision("high")`` enables TF32 here too) and is False otherwise.
    """
    if config is None:
        config = ""
    elif not isinstance(config, str) or not config:
        raise TypeError(f"config={config!r} must be a non-empty string (a configuration name) or None")
    if backward_config is None:
        backward_config = ""
    elif not isinstance(backward_config, str) or not backward_config:
        raise TypeError(f"backward_config={backward_config!r} must be a non-empty string "
                        "(a backward configuration name) or None")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic={deterministic!r} must be a bool")
    if allow_tf32 is None:
        allow_tf32 = False
        if torch_tensors:
            import torch
            allow_tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
    elif not isinstance(allow_tf32, bool):
        raise TypeError(f"allow_tf32={allow_tf32!r} must be a bool or None")
    return config, deterministic, allow_tf32, backward_config


def resolve_scale(scale, head_dim):
    if scale is None:
        return float(head_dim) ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale={scale!r} must be a float or None")
    s = float(scale)
    if not (math.isfinite(s) and s > 0.0):
        raise ValueError(f"scale={scale!r} must be a finite number > 0")
    return s


def check_rank(fn, rank, name, t, last="head_dim"):
    if t.ndim != rank + 3:
        raise ValueError(
            f"{fn}: {name} has shape {tuple(t.shape)} ({t.ndim} dims); expected {rank + 3} dims "
            f"{layout(rank, last)}"
        )


def check_additional(name, t, batch, rank):
    if t.ndim != 4:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)} ({t.ndim} dims); expected 4 dims "
            "[batch, n_additional, heads_kv, dim]"
        )
    if t.shape[0] != batch:
        raise ValueError(f"{name} has batch {t.shape[0]} but query has batch {batch}")


def check_pair(name_a, a, name_b, b):
    if (a is None) != (b is None):
        raise ValueError(f"{name_a} and {name_b} must be given together (got only one)")
