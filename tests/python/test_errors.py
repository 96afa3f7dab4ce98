"""Every error path: the exception type and a message naming the argument and its value."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fna
from fna import _C
from helpers import check_close, dense_na, seed_of


def arrays(shape=(1, 8, 8, 2, 4), n=3, dtype=np.float32, seed="errors"):
    rng = np.random.default_rng(seed_of(seed, shape))
    return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]


# ---- argument normalization (Python side) --------------------------------------------------------

def test_per_axis_arity_message():
    q, k, v = arrays()
    with pytest.raises(ValueError, match=r"^kernel_size=\(3, 3, 3\) has 3 entries for a 2-D input$"):
        fna.na2d(q, k, v, kernel_size=(3, 3, 3))
    with pytest.raises(ValueError, match=r"stride=\(1,\) has 1 entries for a 2-D input"):
        fna.na2d(q, k, v, 3, stride=(1,))
    with pytest.raises(ValueError, match=r"dilation=\[1, 1, 1\]|dilation=\(1, 1, 1\)"):
        fna.na2d(q, k, v, 3, dilation=[1, 1, 1])
    with pytest.raises(ValueError, match=r"is_causal=\(True, False, True\) has 3 entries"):
        fna.na2d(q, k, v, 3, is_causal=(True, False, True))


def test_per_axis_types():
    q, k, v = arrays()
    with pytest.raises(TypeError, match="kernel_size=3.0"):
        fna.na2d(q, k, v, 3.0)
    with pytest.raises(TypeError, match="kernel_size=True"):
        fna.na2d(q, k, v, True)
    with pytest.raises(TypeError, match="is_causal=1"):
        fna.na2d(q, k, v, 3, is_causal=1)
    # numpy integers and bools are accepted
    fna.na2d(q, k, v, np.int64(3), is_causal=np.bool_(False), backend="reference")


def test_per_axis_spellings_agree():
    # Plain ints / bools take a shortcut; every spelling gives a fresh list of plain Python values.
    from fna import _args
    for rank in (1, 2, 3):
        spellings = [3, np.int64(3), [3] * rank, tuple([3] * rank), [np.int64(3)] * rank,
                     tuple(range(3, 3 + rank)), [3] * (rank - 1) + [np.int32(7)]]
        for v in spellings:
            got = _args.per_axis("kernel_size", v, rank)
            want = [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)] * rank
            assert got == want and all(type(x) is int for x in got), (v, got)
            assert got is not v
        for v in [True, np.bool_(True), [False] * rank, tuple([True] * rank)]:
            got = _args.per_axis("is_causal", v, rank, boolean=True)
            want = [bool(x) for x in v] if isinstance(v, (list, tuple)) else [bool(v)] * rank
            assert got == want and all(type(x) is bool for x in got), (v, got)
        with pytest.raises(TypeError, match="entries must be int"):
            _args.per_axis("kernel_size", [3] * (rank - 1) + [True], rank)


@pytest.mark.parametrize("fn,shape", [(fna.na1d, (1, 8, 8, 2, 4)), (fna.na2d, (1, 8, 2, 4)),
                                      (fna.na3d, (1, 8, 8, 2, 4))])
def test_wrong_rank(fn, shape):
    q, k, v = arrays(shape)
    with pytest.raises(ValueError, match=r"query has shape .* expected \d dims"):
        fn(q, k, v, 3)


def test_wrong_shapes():
    q, k, v = arrays()
    with pytest.raises(ValueError, match=r"key has shape \(1, 8, 7, 2, 4\), expected \(1, 8, 8, 2, 4\)"):
        fna.na2d(q, k[:, :, :7], v, 3)
    with pytest.raises(ValueError, match=r"value has shape \(1, 8, 7, 2, 4\)"):
        fna.na2d(q, k, v[:, :, :7], 3)
    with pytest.raises(ValueError, match=r"key has shape \(1, 8, 8, 2, 3\), expected \(1, 8, 8, 2, 4\)"):
        fna.na2d(q, k[..., :3], v, 3)
    with pytest.raises(ValueError, match="key has shape"):
        fna.na2d(q, k[:, :, :, :1], v, 3)  # key heads != value heads
    with pytest.raises(ValueError, match=r"value has shape \(2, 8, 8, 2, 4\)"):
        fna.na2d(q, k, np.concatenate([v, v]), 3)


@pytest.mark.parametrize("kwargs,message", [
    (dict(kernel_size=9), r"kernel_size\[0\]=9 \* dilation\[0\]=1 exceeds input length 8"),
    (dict(kernel_size=(3, 5), dilation=(1, 2)), r"kernel_size\[1\]=5 \* dilation\[1\]=2 exceeds input length 8"),
    (dict(kernel_size=(3, 0)), r"kernel_size\[1\]=0 must be >= 1"),
    (dict(kernel_size=3, stride=4), r"stride\[0\]=4 must be in \[1, kernel_size\[0\]=3\]"),
    (dict(kernel_size=3, stride=(1, 0)), r"stride\[1\]=0 must be in \[1, kernel_size\[1\]=3\]"),
    (dict(kernel_size=3, dilation=0), r"dilation\[0\]=0 must be >= 1"),
    (dict(kernel_size=3, dilation=(1, -2)), r"dilation\[1\]=-2 must be >= 1"),
])
def test_bad_parameters(kwargs, message):
    q, k, v = arrays()
    for backend in ("reference", "cpu", None):
        with pytest.raises(ValueError, match=message):
            fna.na2d(q, k, v, backend=backend, **kwargs)
    with pytest.raises(ValueError, match=message):
        fna.na2d_qk(q, k, **kwargs)


def test_natten_tuning_keywords():
    """NATTEN's tuning keywords at their defaults (None / False) and try_fuse_additional_kv ask for
    nothing and are accepted anywhere; one that asks for something tunes cuda-fused, so with CPU
    arrays it is an error naming it (never silently ignored); unknown keywords are a TypeError.
    (What they select on the GPU: tests/python/test_gpu.py.)"""
    q, k, v = arrays()
    out = fna.na2d(q, k, v, 3, backend="reference", q_tile_shape=None, kv_tile_shape=None,
                   backward_kv_splits=None, run_persistent_kernel=False, torch_compile=False,
                   backward_use_pt_reduction=False, kernel_schedule=None,
                   try_fuse_additional_kv=True)
    np.testing.assert_array_equal(out, fna.na2d(q, k, v, 3, backend="reference"))
    for kw in (dict(q_tile_shape=(8, 8)), dict(run_persistent_kernel=True),
               dict(kernel_schedule="coop"), dict(backward_kv_splits=(1, 1))):
        with pytest.raises(ValueError, match=f"{next(iter(kw))}.*needs CUDA tensors"):
            fna.na2d(q, k, v, 3, backend="reference", **kw)
    with pytest.raises(TypeError, match="na2d\\(\\) got an unexpected keyword argument 'kernel'"):
        fna.na2d(q, k, v, 3, kernel=3)


def test_tuning_keyword():
    """tuning= holds Options::tuning fields: each key of fna.tuning_keys() exists; a field of the
    backend that runs is honoured (every cpu_isa value matches the reference within the
    criterion), one of another backend, an unknown key or a bad value is an error naming it."""
    keys = fna.tuning_keys()
    assert {"fwd_schedule", "fwd_copy", "persistent", "bwd_kernel", "cpu_isa", "cpu_band",
            "naive_workspace_bytes"} <= set(keys)
    q, k, v = arrays()
    ref = fna.na2d(q, k, v, 3, backend="reference")
    out = fna.na2d(q, k, v, 3, backend="cpu", tuning={"cpu_isa": "generic", "cpu_band": 1,
                                                      "cpu_strips": False})
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="tuning cpu_isa='generic' concerns backend=cpu, but "
                                         "backend=reference"):
        fna.na2d(q, k, v, 3, backend="reference", tuning={"cpu_isa": "generic"})
    with pytest.raises(ValueError, match="tuning key 'fwd_scedule' is not one of"):
        fna.na2d(q, k, v, 3, backend="cpu", tuning={"fwd_scedule": "plain"})
    with pytest.raises(ValueError, match="tuning cpu_isa='sse' is not one of"):
        fna.na2d(q, k, v, 3, backend="cpu", tuning={"cpu_isa": "sse"})
    with pytest.raises(ValueError, match="fwd_copy='tma' concerns backend=cuda-fused"):
        fna.na2d(q, k, v, 3, backend="cpu", tuning={"fwd_copy": "tma"})
    with pytest.raises(ValueError, match="tuning='cpu_isa=generic' must be 'heuristic', 'auto', a dict"):
        fna.na2d(q, k, v, 3, tuning="cpu_isa=generic")
    with pytest.raises(TypeError, match="tuning=3 must be"):
        fna.na2d(q, k, v, 3, tuning=3)
    # a key holding ',' or '=' would pass as several settings (and duplicate keys unnoticed)
    for key in ("cpu_isa=generic,cpu_band", "cpu_band=3,cpu_band", "cpu_band,", ""):
        with pytest.raises(ValueError, match=f"tuning key {key!r} must be one key name"):
            fna.na2d(q, k, v, 3, backend="cpu", tuning={key: "3"})


def test_gqa_heads():
    q, = arrays((1, 8, 8, 3, 4), n=1)
    k, v = arrays((1, 8, 8, 2, 4), n=2)
    with pytest.raises(ValueError, match=r"heads=3 is not a multiple of heads_kv=2"):
        fna.na2d(q, k, v, 3)


def test_dtypes():
    q, k, v = arrays()
    with pytest.raises(TypeError, match="key has dtype float16 but the problem's dtype is float32"):
        fna.na2d(q, k.astype(np.float16), v, 3)
    with pytest.raises(TypeError, match="query has dtype float64; fna supports float32, float16 and bfloat16"):
        fna.na2d(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), 3)
    with pytest.raises(TypeError, match="query has dtype int32"):
        fna.na2d(q.astype(np.int32), k, v, 3)


def test_backend_names():
    q, k, v = arrays()
    with pytest.raises(ValueError, match=r"backend='flash' is not one of auto, reference, cpu"):
        fna.na2d(q, k, v, 3, backend="flash")
    with pytest.raises(TypeError, match="backend=3 must be a string"):
        fna.na2d(q, k, v, 3, backend=3)
    with pytest.raises(ValueError, match=r"backend='cuda-naive' needs CUDA tensors"):
        fna.na2d(q, k, v, 3, backend="cuda-naive")
    with pytest.raises(ValueError, match=r"backend='cuda-fused' needs CUDA tensors"):
        fna.na2d_qk(q, k, 3, backend="cuda-fused")
    with pytest.raises(ValueError, match="is not one of"):
        fna.backend_compiled("nope")
    assert fna.backend_compiled("reference") and fna.backend_compiled("cpu")
    assert fna.resolve_backend(None, "cpu") == "cpu"
    assert fna.resolve_backend("reference", "cpu") == "reference"
    with pytest.raises(ValueError, match="device='tpu' is not 'cpu' or 'cuda'"):
        fna.resolve_backend(None, "tpu")


def test_introspection():
    import re
    # One version string (CMakeLists.txt's project version; test_packaging.py checks the metadata).
    assert fna.version() == fna.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", fna.version()), fna.version()
    assert fna.BACKENDS == ("auto", "reference", "cpu", "cuda-naive", "cuda-fused",
                            "cuda-gemm")
    for dtype in ("float16", np.float16, "bfloat16"):
        configs = fna.fused_configs(2, dtype, 64)
        assert isinstance(configs, list) and all(isinstance(c, str) for c in configs)
        if not fna.backend_compiled("cuda-fused"):
            assert configs == []
    with pytest.raises(TypeError, match="dtype='float64' is not one of float32, float16, bfloat16"):
        fna.fused_configs(2, np.float64, 64)
    assert isinstance(fna.cuda_available(), bool)
    # Arguments of the introspection functions: named, at the boundary (they were int()-coerced,
    # or nanobind's "incompatible function arguments", or a config list for a string rank).
    bad = [
        (TypeError, r"fused_configs: rank='2' must be an int", lambda: fna.fused_configs("2", "float16", 64)),
        (ValueError, r"fused_configs: head_dim=-64 must be in \[1, ", lambda: fna.fused_configs(2, "float16", -64)),
        (TypeError, r"fused_backward_configs: head_dim=64.5 must be an int", lambda: fna.fused_backward_configs(2, "float16", 64.5)),
        (TypeError, r"fused_configs: dtype=5 must be a dtype name", lambda: fna.fused_configs(2, 5, 64)),
        (TypeError, r"backend_compiled: backend=None must be a backend name", lambda: fna.backend_compiled(None)),
        (TypeError, r"fused_plan: query_shape=None must be a list or tuple of ints", lambda: fna.fused_plan(None, 3)),
        (TypeError, r"fused_plan: query_shape=\(1, 16.7, 2, 32\) must be a list or tuple of ints", lambda: fna.fused_plan((1, 16.7, 2, 32), 3)),
        (ValueError, r"fused_plan: query_shape=\(1, 0, 2, 32\): 0 must be >= 1", lambda: fna.fused_plan((1, 0, 2, 32), 3)),
        (TypeError, r"fused_plan: dtype=None must be a dtype name", lambda: fna.fused_plan((1, 16, 2, 32), 3, dtype=None)),
        (TypeError, r"fused_plan: heads_kv='abc' must be an int or None", lambda: fna.fused_plan((1, 16, 2, 32), 3, heads_kv="abc")),
        (ValueError, r"fused_plan: heads_kv=-1 must be in \[1, ", lambda: fna.fused_plan((1, 16, 2, 32), 3, heads_kv=-1)),
        (ValueError, r"fused_plan: dim_v=-1 must be in \[1, ", lambda: fna.fused_plan((1, 16, 2, 32), 3, dim_v=-1)),
        (ValueError, r"fused_plan: device_index=1099511627776 must be in \[0, ", lambda: fna.fused_plan((1, 16, 2, 32), 3, device_index=2 ** 40)),
        (TypeError, r"fused_plan: device_index='a' must be an int", lambda: fna.fused_plan((1, 16, 2, 32), 3, device_index="a")),
        (TypeError, r"fused_plan: rpb='no' must be a bool", lambda: fna.fused_plan((1, 16, 2, 32), 3, rpb="no")),
    ]
    for exc, msg, call in bad:
        with pytest.raises(exc, match=msg):
            call()


def test_additional_kv_errors():
    q, k, v = arrays()
    ak, av = arrays((1, 3, 2, 4), n=2)
    with pytest.raises(ValueError, match="additional_keys and additional_values must be given together"):
        fna.na2d(q, k, v, 3, additional_keys=ak)
    with pytest.raises(ValueError, match=r"additional_keys has shape \(3, 2, 4\) \(3 dims\); expected 4 dims"):
        fna.na2d(q, k, v, 3, additional_keys=ak[0], additional_values=av)
    with pytest.raises(ValueError, match=r"additional_values has shape \(1, 2, 2, 4\), expected \(1, 3, 2, 4\)"):
        fna.na2d(q, k, v, 3, additional_keys=ak, additional_values=av[:, :2])
    with pytest.raises(ValueError, match=r"additional_keys has batch 2 but query has batch 1"):
        fna.na2d(q, k, v, 3, additional_keys=np.concatenate([ak, ak]), additional_values=av)
    with pytest.raises(ValueError, match=r"additional_keys has shape \(1, 3, 1, 4\), expected \(1, 3, 2, 4\)"):
        fna.na2d(q, k, v, 3, additional_keys=ak[:, :, :1], additional_values=av)


def test_scale_errors():
    q, k, v = arrays()
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale=.* must be a finite number > 0"):
            fna.na2d(q, k, v, 3, scale=bad)
    with pytest.raises(TypeError, match="scale='1'"):
        fna.na2d(q, k, v, 3, scale="1")
    # finite as a Python float, infinite in the kernels' float32 (all-NaN output before)
    with pytest.raises(ValueError, match=r"scale=1e\+39 must be at most .* float32"):
        fna.na2d(q, k, v, 3, scale=1e39)
    assert np.isfinite(fna.na2d(q, k, v, 3, scale=1e30)).all()


def test_framework_mixing_and_types():
    q, k, v = arrays()
    with pytest.raises(TypeError, match="query must be a torch.Tensor or a numpy.ndarray, got list"):
        fna.na2d(q.tolist(), k, v, 3)
    with pytest.raises(TypeError, match="na2d: value must be a torch.Tensor or a numpy.ndarray, got NoneType"):
        fna.na2d(q, k, None, 3)
    with pytest.raises(TypeError, match="na_backward: lse must be a torch.Tensor"):
        fna.na_backward(q, q, k, v, q, None, 3)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="key is a torch array but query is a numpy array"):
        fna.na2d(q, torch.from_numpy(k), v, 3)


def test_unfused_errors():
    q, k, v = arrays()
    attn = fna.na2d_qk(q, k, 3, backend="reference")
    with pytest.raises(ValueError, match=r"attn has 8 entries in its last dimension, expected 9"):
        fna.na2d_av(attn[..., :8], v, 3)
    with pytest.raises(ValueError, match=r"attn has 9 entries in its last dimension, expected 12 \(window 9 \+ additional 3\)"):
        fna.na2d_av(attn, v, 3, additional_values=arrays((1, 3, 2, 4), n=1)[0])
    with pytest.raises(ValueError, match=r"na2d_av: attn has shape .* expected 5 dims \[batch, X, Y, heads, window \+ n_additional\]"):
        fna.na2d_av(attn[0], v, 3)
    with pytest.raises(TypeError, match="value has dtype float16"):
        fna.na2d_av(attn, v.astype(np.float16), 3)


def test_backward_errors():
    q, k, v = arrays()
    out, lse = fna.na2d(q, k, v, 3, return_lse=True, backend="reference")
    with pytest.raises(TypeError, match="lse has dtype float16; it must be float32"):
        fna.na_backward(out, q, k, v, out, lse.astype(np.float16), 3)
    with pytest.raises(ValueError, match=r"lse has shape \(1, 8, 8\), expected \(1, 8, 8, 2\)"):
        fna.na_backward(out, q, k, v, out, lse[..., 0], 3)
    with pytest.raises(ValueError, match=r"d_output has shape"):
        fna.na_backward(out[:, :4], q, k, v, out, lse, 3)
    with pytest.raises(ValueError, match=r"kernel_size\[0\]=9"):
        fna.na_backward(out, q, k, v, out, lse, 9)
    # d_lse: float32 of lse's shape, checked like lse.
    with pytest.raises(TypeError, match="d_lse has dtype float16; it must be float32"):
        fna.na_backward(out, q, k, v, out, lse, 3, d_lse=lse.astype(np.float16))
    with pytest.raises(ValueError, match=r"d_lse has shape \(1, 8, 8\), expected \(1, 8, 8, 2\)"):
        fna.na_backward(out, q, k, v, out, lse, 3, d_lse=lse[..., 0])
    with pytest.raises(TypeError, match="na_backward: d_lse must be a torch.Tensor or a "
                                        "numpy.ndarray, got list"):
        fna.na_backward(out, q, k, v, out, lse, 3, d_lse=lse.tolist())
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="d_lse is a torch array but d_output is a numpy array"):
        fna.na_backward(out, q, k, v, out, lse, 3, d_lse=torch.from_numpy(lse))


# ---- the extension directly: shape safety, poisoned outputs, read-only memory ---------------------

SP2 = dict(kernel_size=[3, 3], stride=[1, 1], dilation=[1, 1], is_causal=[False, False],
           backend="reference")


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_extension_writes_every_output(backend):
    """Every output of every op, poisoned with NaN before the call, comes back finite and equal
    to the oracle (GQA, D_v != D, additional KV, a causal axis)."""
    rng = np.random.default_rng(seed_of("poison", backend))
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    q, k, v = f(2, 7, 6, 4, 5), f(2, 7, 6, 2, 5), f(2, 7, 6, 2, 3)
    ak, av = f(2, 2, 2, 5), f(2, 2, 2, 3)
    sp = dict(kernel_size=[3, 4], stride=[1, 2], dilation=[2, 1], is_causal=[True, False],
              backend=backend)
    ref = dense_na(q, k, v, [3, 4], [1, 2], [2, 1], [True, False], None, ak, av,
                   d_out=(d_out := f(2, 7, 6, 4, 3)))
    poison = lambda x: np.full_like(x, np.nan)  # noqa: E731
    out, lse = poison(ref["out"].astype(np.float32)), np.full((2, 7, 6, 4), np.nan, np.float32)
    _C.forward(q, k, v, out, lse, ak, av, **sp)
    check_close(out, ref["out"])
    check_close(lse, ref["lse"], what="lse")
    grads = [poison(x) for x in (q, k, v, ak, av)]
    _C.backward(q, k, v, out, d_out, lse, *grads[:3], ak, av, *grads[3:], **sp)
    for g, name in zip(grads, ("dq", "dk", "dv", "d_add_k", "d_add_v")):
        check_close(g, ref[name], what=name)

    # Unfused: qk, then av on softmax(qk * scale), and both backward ops.
    attn = np.full((2, 7, 6, 4, 12 + 2), np.nan, np.float32)
    _C.qk_forward(q, k, attn, ak, **sp)
    assert not np.isnan(attn).any()
    logits = attn.astype(np.float64) * 5 ** -0.5
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    out2 = poison(out)
    _C.av_forward(w, v, out2, av, **sp)
    check_close(out2, ref["out"], what="av(softmax(qk))")
    dq, dk, dak = poison(q), poison(k), poison(ak)
    _C.qk_backward(q, k, f(*attn.shape), dq, dk, ak, dak, **sp)
    d_attn, dv, dav = poison(w), poison(v), poison(av)
    _C.av_backward(w, v, d_out, d_attn, dv, av, dav, **sp)
    for name, x in (("qk d_query", dq), ("qk d_key", dk), ("qk d_additional_keys", dak),
                    ("av d_attn", d_attn), ("av d_value", dv), ("av d_additional_values", dav)):
        assert np.isfinite(x).all(), f"{name} has unwritten (NaN) elements"


def test_extension_checks_every_shape():
    """TensorRef carries no extents: the binding must refuse any array whose shape does not fit
    its role (else the kernels would read or write out of bounds)."""
    q, k, v = arrays()
    out = np.empty_like(q)
    with pytest.raises(ValueError, match=r"output has shape \(1, 8, 8, 2, 3\)"):
        _C.forward(q, k, v, out[..., :3], **SP2)
    with pytest.raises(ValueError, match=r"lse has shape \(1, 8, 8\)"):
        _C.forward(q, k, v, out, np.empty((1, 8, 8), np.float32), **SP2)
    with pytest.raises(ValueError, match="query has 3 dimensions; expected 4, 5 or 6"):
        _C.forward(q[0, 0], k, v, out, **SP2)
    with pytest.raises(ValueError, match="kernel_size has 3 entries for a 2-D input"):
        _C.forward(q, k, v, out, **dict(SP2, kernel_size=[3, 3, 3]))
    with pytest.raises(ValueError, match=r"attn has shape \(1, 8, 8, 2, 8\), expected \(1, 8, 8, 2, 9\)"):
        _C.qk_forward(q, k, np.empty((1, 8, 8, 2, 8), np.float32), **SP2)
    with pytest.raises(ValueError, match="backend='x' is not one of"):
        _C.forward(q, k, v, out, **dict(SP2, backend="x"))


def test_extension_refuses_readonly_output():
    q, k, v = arrays()
    out = np.empty_like(q)
    out.flags.writeable = False
    with pytest.raises(TypeError):
        _C.forward(q, k, v, out, **SP2)


# ---- torch-specific ---------------------------------------------------------------------------

def test_torch_errors():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x) for x in arrays())
    with pytest.raises(ValueError, match=r"backend='cuda-naive' needs CUDA tensors, but query is on cpu"):
        fna.na2d(q, k, v, 3, backend="cuda-naive")
    with pytest.raises(TypeError, match="key has dtype bfloat16 but the problem's dtype is float32"):
        fna.na2d(q, k.bfloat16(), v, 3)
    with pytest.raises(TypeError, match="query has dtype float64"):
        fna.na2d(q.double(), k.double(), v.double(), 3)
    with pytest.raises(ValueError, match=r"kernel_size\[0\]=9 \* dilation\[0\]=1 exceeds input length 8"):
        fna.na2d(q, k, v, 9)
    with pytest.raises(ValueError, match=r"stride\[1\]=5"):
        fna.na2d(q, k, v, 3, stride=(1, 5))
    # The unfused qk op sizes attn by the window: checked before that allocation (a negative
    # kernel was torch's "negative dimension" error, 2**28 a 16 GB allocation), as for NumPy.
    for x, y in ((q, k), (q.numpy(), k.numpy())):
        with pytest.raises(ValueError, match=r"na2d_qk: kernel_size\[0\]=-5 must be >= 1"):
            fna.na2d_qk(x, y, (-5, 3))
        with pytest.raises(ValueError, match=r"na2d_qk: kernel_size\[1\]=268435456 \* "
                                             r"dilation\[1\]=1 exceeds input length 8"):
            fna.na2d_qk(x, y, (3, 2 ** 28))
    with pytest.raises(ValueError, match="heads=2 is not a multiple of heads_kv=3"):
        kv = torch.randn(1, 8, 8, 3, 4)
        fna.na2d(q, kv, kv, 3)
    with pytest.raises(ValueError, match="na2d: query is on meta; fna runs on CPU and CUDA tensors"):
        fna.na2d(*(x.to("meta") for x in (q, k, v)), 3)
    if not fna.backend_compiled("cuda-naive"):
        # Fake CUDA tensors (no GPU needed): a build without CUDA says so before any work.
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            fq = torch.empty(1, 8, 8, 2, 4, device="cuda")
            with pytest.raises(RuntimeError, match="query is on cuda:0, but this build of fna "
                                                   "has no CUDA backends"):
                fna.na2d(fq, fq, fq, 3)
    if torch.cuda.is_available() and fna.cuda_available():
        with pytest.raises(ValueError, match="key is on cuda:0 but query is on cpu"):
            fna.na2d(q, k.cuda(), v, 3)


# ---- torch is optional ------------------------------------------------------------------------

def test_import_without_torch():
    """With torch hidden, `import fna` works, the NumPy path runs, and the modules say they need
    torch."""
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # makes `import torch` raise ImportError
        import numpy as np
        import fna
        q = np.random.default_rng(0).standard_normal((1, 6, 2, 4)).astype(np.float32)
        out = fna.na1d(q, q, q, 3, backend="reference")
        assert out.shape == q.shape and np.isfinite(out).all()
        try:
            fna.NeighborhoodAttention2D
        except ImportError as e:
            assert "needs torch" in str(e)
        else:
            raise AssertionError("modules must need torch")
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_fused_option_errors():
    """config / deterministic / allow_tf32: wrong types are TypeErrors naming the argument; a
    config on a backend other than cuda-fused is an error, never silently ignored."""
    q, k, v = arrays()
    with pytest.raises(TypeError, match=r"config=3 must be a non-empty string"):
        fna.na2d(q, k, v, 3, config=3)
    with pytest.raises(TypeError, match=r"config='' must be a non-empty string"):
        fna.na2d(q, k, v, 3, config="")
    with pytest.raises(TypeError, match=r"deterministic='yes' must be a bool"):
        fna.na2d(q, k, v, 3, deterministic="yes")
    with pytest.raises(TypeError, match=r"allow_tf32=1 must be a bool or None"):
        fna.na2d(q, k, v, 3, allow_tf32=1)
    name = "fna_fwd_sm80_bf16_d64_q8x16_kv8x8_w4"
    with pytest.raises(ValueError, match=r"config='fna_fwd_sm80_bf16_d64_q8x16_kv8x8_w4' names a "
                                         r"cuda-fused tile configuration, but backend=cpu"):
        fna.na2d(q, k, v, 3, config=name)
    out, lse = fna.na2d(q, k, v, 3, return_lse=True)
    with pytest.raises(ValueError, match=r"but backend=reference runs this call"):
        fna.na_backward(out, q, k, v, out, lse, 3, backend="reference", config=name)
    # Valid values are accepted where they do not apply (deterministic on the CPU, allow_tf32).
    out2 = fna.na2d(q, k, v, 3, deterministic=True, allow_tf32=True)
    np.testing.assert_array_equal(out, out2)


def test_backward_config_errors():
    """backward_config: a wrong type is a TypeError naming it; a name on a backend other than
    cuda-fused is a ValueError at the forward call already (numpy and torch), never ignored."""
    q, k, v = arrays()
    with pytest.raises(TypeError, match=r"backward_config=3 must be a non-empty string"):
        fna.na2d(q, k, v, 3, backward_config=3)
    with pytest.raises(TypeError, match=r"backward_config='' must be a non-empty string"):
        fna.na_backward(q, q, k, v, q, q[..., 0], 3, backward_config="")
    name = "fna_bwd_sm80_f32_d64_kv8x16_q8x8_dqq8x8_dqkv8x8"
    with pytest.raises(ValueError, match=rf"backward_config='{name}' names a cuda-fused backward "
                                         r"tile configuration, but backend=cpu runs this call"):
        fna.na2d(q, k, v, 3, backward_config=name)
    out, lse = fna.na2d(q, k, v, 3, return_lse=True)
    with pytest.raises(ValueError, match=r"but backend=reference runs this call"):
        fna.na_backward(out, q, k, v, out, lse, 3, backend="reference", backward_config=name)
    torch = pytest.importorskip("torch")
    t = [torch.from_numpy(x).requires_grad_(True) for x in (q, k, v)]
    with pytest.raises(ValueError, match=rf"backward_config='{name}' names a cuda-fused"):
        fna.na2d(*t, 3, backward_config=name)


def test_fused_backward_configs_listing():
    """The backward configuration table through Python: per (rank, dtype, head dim) the names of
    the padded head dim's kernels, one tile extent per axis; empty above 256 (and without
    cuda-fused)."""
    if not fna.backend_compiled("cuda-fused"):
        assert fna.fused_backward_configs(2, "bfloat16", 64) == []
        pytest.skip("cuda-fused not compiled")
    for rank in (1, 2, 3):
        for dtype, tok in (("float32", "f32"), ("float16", "f16"), ("bfloat16", "bf16")):
            for dim, pad in ((32, 64), (96, 128), (160, 256), (256, 256)):
                names = fna.fused_backward_configs(rank, dtype, dim)
                assert names and len(set(names)) == len(names), (rank, dtype, dim, names)
                # The dK / dV kernel family leads the name: sm80 everywhere, the Hopper ones only
                # for 16-bit head dims: sm90 up to 128, the warp-specialized sm90ws up to 256.
                families = ("sm80",) + (("sm90",) if tok != "f32" and pad <= 128 else ()) + \
                    (("sm90ws",) if tok != "f32" else ())
                for n in names:
                    assert any(n.startswith(f"fna_bwd_{f}_{tok}_d{pad}_kv") for f in families), n
                    shapes = [p.lstrip("dqkv") for p in n.split("_")[5:]]
                    assert len(shapes) == 4 and all(len(s.split("x")) == rank for s in shapes), n
    assert fna.fused_backward_configs(2, "bfloat16", 257) == []
    assert fna.fused_backward_configs(2, np.float32, 64) == fna.fused_backward_configs(2, "float32", 64)
