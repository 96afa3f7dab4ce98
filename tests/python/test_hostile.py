"""Hostile inputs (issue 28): sizes whose products wrap int64, sizes the kernels narrow to 32-bit
int, and Python-level arguments that used to fail with an internal error. Each must raise a clear
exception naming the argument and its value; inputs are seeded random, non-zero."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fna
from helpers import check_close, dense_na, seed_of

torch = pytest.importorskip("torch")


def randn(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed_of("hostile", seed, shape))
    t = torch.randn(*shape, generator=g, dtype=torch.float32)
    assert t.abs().max() > 0
    return t.to(dtype)


# ---- sizes that overflow or narrow (checked by the C++ API, so for NumPy and torch alike) --------

def test_kernel_times_dilation_wrapping_to_zero_is_an_error_not_sigfpe():
    # Before the fix the process died with SIGFPE: run it in a child so a regression fails here.
    code = textwrap.dedent("""
        import torch, fna
        q = torch.randn(1, 8, 1, 4, generator=torch.Generator().manual_seed(28))
        for backend in ("reference", "cpu"):
            try:
                fna.na1d(q, q, q, kernel_size=2**32, dilation=2**32, backend=backend)
            except ValueError as e:
                print("ValueError:", e)
            else:
                print("no error")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2, r.stdout
    for line in lines:
        assert line.startswith("ValueError:"), line
        assert "kernel_size[0]=4294967296" in line and "dilation[0]=4294967296" in line, line


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_kernel_times_dilation_wrapping_to_small(backend):
    q, k, v = (randn(1, 8, 1, 4, seed=(i, backend)) for i in range(3))
    with pytest.raises(ValueError, match=r"kernel_size\[0\]=3 \* dilation\[0\]=6148914691236517206"):
        fna.na1d(q, k, v, kernel_size=3, dilation=6148914691236517206, backend=backend)
    # The boundary K * d == L still runs, and agrees with the dense oracle.
    out = fna.na1d(q, k, v, kernel_size=4, dilation=2, backend=backend)
    ref = dense_na(q.numpy(), k.numpy(), v.numpy(), (4,), (1,), (2,), (False,))["out"]
    check_close(out.numpy(), ref, "float32")


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_head_dim_beyond_int32_is_an_error(backend):
    # An expanded tensor (stride 0 on the head dim): no memory, but a head dim of 2^32 + 1 used to
    # be narrowed to 1 and return garbage.
    # (The value's head dim, which sizes the output, stays small.)
    big = 2**32 + 1
    q = randn(1, 8, 1, 1, seed=("hd", backend)).expand(1, 8, 1, big)
    v = randn(1, 8, 1, 4, seed=("hdv", backend))
    with pytest.raises(ValueError, match=r"dim=4294967297 must be in \[1, 2\^30\]"):
        fna.na1d(q, q, v, kernel_size=3, scale=0.5, backend=backend)
    qn = np.broadcast_to(q[..., :1].numpy(), (1, 8, 1, big))
    with pytest.raises(ValueError, match=r"dim=4294967297 must be in \[1, 2\^30\]"):
        fna.na1d(qn, qn, v.numpy(), kernel_size=3, scale=0.5, backend=backend)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_num_additional_beyond_int32_is_an_error(backend):
    q, k, v = (randn(1, 8, 1, 4, seed=("add", i, backend)) for i in range(3))
    big = 2**32 + 1
    ak = randn(1, 1, 1, 4, seed=("ak", backend)).expand(1, big, 1, 4)
    av = randn(1, 1, 1, 4, seed=("av", backend)).expand(1, big, 1, 4)
    with pytest.raises(ValueError, match=r"num_additional=4294967297 must be in \[0, 2\^30\]"):
        fna.na1d(q, k, v, kernel_size=3, additional_keys=ak, additional_values=av,
                 backend=backend)


def test_huge_stride_is_an_error():
    # (NumPy: torch refuses to make the view.) Batch stride 2^60 elements: the third batch lies
    # 2^63 bytes from the data pointer, which no int64 offset reaches.
    q, k, v = (randn(3, 8, 1, 4, seed=("st", i)).numpy() for i in range(3))
    bad = np.lib.stride_tricks.as_strided(k, (3, 8, 1, 4), (2**62, 16, 16, 4))  # never read
    with pytest.raises(ValueError, match=r"key extent 3 \* stride\[0\]=1152921504606846976"):
        fna.na1d(q, bad, v, kernel_size=3, backend="cpu")
    out = fna.na1d(q, k, v, kernel_size=3, backend="cpu")
    check_close(out, dense_na(q, k, v, (3,))["out"], "float32")


# ---- Python-level arguments --------------------------------------------------------------------

def test_head_dim_zero_is_a_value_error():
    q = torch.empty(1, 8, 1, 0)
    with pytest.raises(ValueError, match=r"dim=0"):
        fna.na1d(q, q, q, kernel_size=3)
    with pytest.raises(ValueError, match=r"dim=0"):
        fna.na1d(q, q, q, kernel_size=3, scale=0.5)
    with pytest.raises(ValueError, match=r"dim=0"):
        fna.na1d(q.numpy(), q.numpy(), q.numpy(), kernel_size=3)


@pytest.mark.parametrize("kwargs, name", [
    (dict(kernel_size=2**70), "kernel_size"),
    (dict(kernel_size=3, dilation=(2**64,)), "dilation"),
    (dict(kernel_size=3, stride=-2**63 - 1), "stride"),
])
def test_parameters_beyond_int64_are_value_errors(kwargs, name):
    q, k, v = (randn(1, 8, 1, 4, seed=("i64", i, name)) for i in range(3))
    value = str(kwargs[name] if not isinstance(kwargs[name], tuple) else kwargs[name][0])
    with pytest.raises(ValueError, match=rf"{name}=.*{value} does not fit in a 64-bit integer"):
        fna.na1d(q, k, v, **kwargs)


def test_return_lse_must_be_bool():
    q, k, v = (randn(1, 8, 1, 4, seed=("lse", i)) for i in range(3))
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match=r"return_lse=.* must be a bool"):
            fna.na1d(q, k, v, kernel_size=3, return_lse=bad)
    out, lse = fna.na1d(q, k, v, kernel_size=3, return_lse=True)
    assert lse.shape == (1, 8, 1) and torch.isfinite(lse).all()
    assert torch.equal(out, fna.na1d(q, k, v, kernel_size=3, return_lse=np.bool_(False)))


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_modules_validate_at_construction(rank):
    cls = getattr(fna, f"NeighborhoodAttention{rank}D")
    with pytest.raises(ValueError, match=r"kernel_size\[0\]=0 must be >= 1"):
        cls(dim=8, num_heads=2, kernel_size=0)
    with pytest.raises(ValueError, match=rf"stride\[{rank - 1}\]=4 must be in \[1, kernel_size\[{rank - 1}\]=3\]"):
        cls(dim=8, num_heads=2, kernel_size=3, stride=(1,) * (rank - 1) + (4,))
    with pytest.raises(ValueError, match=r"dilation\[0\]=0 must be >= 1"):
        cls(dim=8, num_heads=2, kernel_size=3, dilation=0)
    # a bias table is sized by the kernel (torch's "Storage size calculation overflowed" before)
    with pytest.raises(ValueError, match=r"kernel_size\[0\]=4611686018427387904 must be at most 2\^30"):
        cls(dim=8, num_heads=2, kernel_size=2**62, rel_pos_bias=True)
    # The same message the functional form gives at its call.
    q = randn(1, *([8] * rank), 2, 4, seed=("mod", rank))
    with pytest.raises(ValueError, match=r"kernel_size\[0\]=0 must be >= 1"):
        getattr(fna, f"na{rank}d")(q, q, q, kernel_size=0)
    # A valid module still runs on random input.
    torch.manual_seed(seed_of("module", rank))
    y = cls(dim=8, num_heads=2, kernel_size=3)(randn(1, *([6] * rank), 8, seed=("x", rank)))
    assert y.shape == (1, *([6] * rank), 8) and torch.isfinite(y).all() and y.abs().max() > 0


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_is_named_and_unsupported(dtype):
    dt = getattr(torch, dtype, None)
    if dt is None:
        pytest.skip(f"this torch has no {dtype}")
    q = randn(1, 8, 1, 4, seed=("f8", dtype), dtype=dt)
    with pytest.raises(TypeError, match=rf"query has dtype {dtype}; .*\({dtype} is unsupported\)"):
        fna.na1d(q, q, q, kernel_size=3)


def test_nested_tensors_are_rejected():
    parts = [randn(8, 1, 4, seed=("nt", i)) for i in range(2)]
    nt = torch.nested.nested_tensor(parts)
    with pytest.raises(TypeError, match=r"query is a nested tensor; fna does not support nested"):
        fna.na1d(nt, nt, nt, kernel_size=3)
    q = randn(2, 8, 1, 4, seed="dense")
    with pytest.raises(TypeError, match=r"key is a nested tensor"):
        fna.na1d_qk(q, nt, kernel_size=3)


def test_resolve_backend_devices():
    assert fna.resolve_backend(device=torch.device("cpu")) == "cpu"
    assert fna.resolve_backend("reference", torch.device("cpu")) == "reference"
    assert fna.resolve_backend(None, "cuda:0") == fna.resolve_backend(None, "cuda")
    assert fna.resolve_backend(None, torch.device("cuda", 1)) == fna.resolve_backend(None, "cuda")
    assert fna.resolve_backend(None, "cuda") in ("cuda-naive", "cuda-fused")
    with pytest.raises(ValueError, match=r"backend cpu cannot run on cuda tensors"):
        fna.resolve_backend("cpu", "cuda")
    with pytest.raises(ValueError, match=r"backend reference cannot run on cuda tensors"):
        fna.resolve_backend("reference", torch.device("cuda"))
    with pytest.raises(ValueError, match=r"backend cuda-naive cannot run on cpu tensors"):
        fna.resolve_backend("cuda-naive", "cpu")
    with pytest.raises(TypeError, match=r"device=3 must be a string"):
        fna.resolve_backend(None, 3)
    with pytest.raises(ValueError, match=r"device='cuda:x' is not 'cpu' or 'cuda'"):
        fna.resolve_backend(None, "cuda:x")
    with pytest.raises(ValueError, match=r"device=device\(type='meta'\) is not 'cpu' or 'cuda'"):
        fna.resolve_backend(None, torch.device("meta"))


def test_huge_value_head_dim_is_an_error_before_allocating():
    """The value head dim sizes the output fna allocates: an expanded (zero-stride) value with a
    head dim past the limit is a ValueError naming dim_v, not an allocation failure."""
    big = 2**32 + 1
    q = randn(1, 8, 1, 4, seed=("hdv-alloc", 0))
    v = randn(1, 8, 1, 1, seed=("hdv-alloc", 1)).expand(1, 8, 1, big)
    with pytest.raises(ValueError, match=r"dim_v=4294967297 must be in \[1, 2\^30\]"):
        fna.na1d(q, q, v, kernel_size=3, backend="cpu")


def test_huge_sizes_are_errors_before_allocating():
    """Every op sizes its outputs from its inputs: an expanded (zero-stride) input with a spatial
    axis or batch past 2^30 is a ValueError naming it, in the fused forward, the unfused ops and
    na_backward (each was an allocation failure before the C++ checks)."""
    big = 2**31
    x = randn(1, 1, 2, 4, seed=("alloc", 0)).expand(1, big, 2, 4)
    with pytest.raises(ValueError, match=r"na1d: query.shape\[1\]=2147483648 must be in \[1, 2\^30\]"):
        fna.na1d(x, x, x, 3)
    with pytest.raises(ValueError, match=r"na1d_qk: query.shape\[1\]=2147483648 must be"):
        fna.na1d_qk(x, x, 3)
    a = randn(1, 1, 2, 3, seed=("alloc", 1)).expand(1, big, 2, 3)
    with pytest.raises(ValueError, match=r"na1d_av: attn.shape\[1\]=2147483648 must be"):
        fna.na1d_av(a, x, 3)
    b = randn(1, 8, 2, 4, seed=("alloc", 2)).expand(big, 8, 2, 4)
    lse = randn(1, 8, 2, seed=("alloc", 3)).expand(big, 8, 2)
    with pytest.raises(ValueError, match=r"na_backward: d_output.shape\[0\]=2147483648 must be"):
        fna.na_backward(b, b, b, b, b, lse, 3)


def test_query_offset_types():
    """query_offset takes NumPy ints as kernel_size does, and one past int64 is a ValueError
    naming it (it was nanobind's "incompatible function arguments")."""
    q = randn(1, 8, 2, 4, seed=("offset", 0))
    k = randn(1, 10, 2, 4, seed=("offset", 1))
    ref = fna.na1d(q, k, k, 3, query_offset=2)
    check_close(fna.na1d(q, k, k, 3, query_offset=np.int64(2)).numpy(), ref.numpy(),
                what="query_offset as a NumPy int")
    with pytest.raises(ValueError, match=r"query_offset=.*does not fit in a 64-bit integer"):
        fna.na1d(q, k, k, 3, query_offset=2**64)


def test_layouts_and_numpy_dtypes_named():
    """Sparse and mkldnn tensors, and big-endian or object NumPy arrays, are TypeErrors naming
    the argument (torch's "Cannot access data pointer" and nanobind's "incompatible function
    arguments" before)."""
    q = randn(1, 8, 2, 4, seed=("layout", 0))
    bad = [q.to_sparse()] + ([q.to_mkldnn()] if torch.backends.mkldnn.is_available() else [])
    for t in bad:
        with pytest.raises(TypeError, match=f"na1d: query has layout {t.layout}; fna takes dense"):
            fna.na1d(t, q, q, 3)
    a = q.numpy()
    for x, shown in ((a.astype(">f4"), ">f4"), (a.astype(object), "|O")):
        with pytest.raises(TypeError, match=f"na1d: key has dtype \\{shown} "):
            fna.na1d(a, x, a, 3)


def test_model_arguments_named():
    """The NAT / DiNAT constructors name a bad num_classes, in_chans or rate (a TypeError deep in
    torch, or silently accepted, before)."""
    from fna import models
    for kw, msg in ((dict(num_classes=-1), r"num_classes=-1 must be an int >= 0"),
                    (dict(in_chans=0), r"in_chans=0 must be an int >= 1"),
                    (dict(drop_path_rate="x"), r"drop_path_rate='x' must be a probability"),
                    (dict(attn_drop_rate=1.5), r"attn_drop_rate=1.5 must be a probability")):
        with pytest.raises(ValueError, match=msg):
            models.nat_mini(**kw)
