"""Property-based tests (Hypothesis): arguments drawn across their whole domain, valid and invalid.

- A valid call (rank 1-3, any lengths, kernel / dilation / stride / causal per axis, GQA, head dims,
  additional keys, scale, strided and zero-stride views) on the cpu backend matches the float64
  dense oracle (helpers.dense_na, which shares no code with the library) within the float32
  criterion, forward and backward.
- An invalid call (sizes zero, negative, past the limits or astronomically large, mismatched
  shapes, heads not divisible, unsupported dtypes, bad scales and flags) raises ValueError or
  TypeError whose message names the argument; nothing crashes and nothing is returned.

Hypothesis runs derandomized (the same examples every run, so a failure reproduces) with a fixed
example budget, so `make test` stays fast.
"""

import math

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fna  # noqa: E402
from helpers import check_close, dense_na  # noqa: E402

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}


@st.composite
def valid_problems(draw):
    rank = draw(st.integers(1, 3))
    shape, ks, dil, stride, causal = [], [], [], [], []
    for _ in range(rank):
        L = draw(st.integers(1, 9 if rank == 3 else 14))
        d = draw(st.integers(1, L))
        k = draw(st.integers(1, L // d))
        shape.append(L)
        dil.append(d)
        ks.append(k)
        stride.append(draw(st.integers(1, k)))
        causal.append(draw(st.booleans()))
    heads_kv = draw(st.integers(1, 2))
    heads = heads_kv * draw(st.integers(1, 2))
    dim = draw(st.integers(1, 9))
    dim_v = draw(st.one_of(st.just(dim), st.integers(1, 9)))
    batch = draw(st.integers(1, 2))
    n_add = draw(st.sampled_from([0, 0, 1, 3]))
    scale = draw(st.one_of(st.none(), st.floats(0.05, 2.0)))
    layout = draw(st.sampled_from(["dense", "strided", "broadcast"]))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    return dict(rank=rank, shape=shape, ks=ks, dil=dil, stride=stride, causal=causal,
                heads=heads, heads_kv=heads_kv, dim=dim, dim_v=dim_v, batch=batch, n_add=n_add,
                scale=scale, layout=layout, seed=seed)


def _arrays(p):
    rng = np.random.default_rng(p["seed"])
    B, S = p["batch"], tuple(p["shape"])

    def make(heads, dim):
        a = rng.standard_normal((B, *S, heads, dim)).astype(np.float32)
        if p["layout"] == "strided":  # every other element of a larger array: non-unit strides
            big = np.zeros((B, *S, heads, 2 * dim), np.float32)
            big[..., ::2] = a
            return big[..., ::2]
        if p["layout"] == "broadcast" and B == 1:  # a zero stride on the batch axis
            return np.broadcast_to(a, a.shape)
        return a

    q = make(p["heads"], p["dim"])
    k = make(p["heads_kv"], p["dim"])
    v = make(p["heads_kv"], p["dim_v"])
    add_k = add_v = None
    if p["n_add"]:
        add_k = rng.standard_normal((B, p["n_add"], p["heads_kv"], p["dim"])).astype(np.float32)
        add_v = rng.standard_normal((B, p["n_add"], p["heads_kv"], p["dim_v"])).astype(np.float32)
    return q, k, v, add_k, add_v


@SETTINGS
@given(valid_problems())
def test_valid_calls_match_the_oracle(p):
    q, k, v, add_k, add_v = _arrays(p)
    kw = dict(kernel_size=tuple(p["ks"]), stride=tuple(p["stride"]), dilation=tuple(p["dil"]),
              is_causal=tuple(p["causal"]), scale=p["scale"], additional_keys=add_k,
              additional_values=add_v)
    out, lse = NA[p["rank"]](q, k, v, backend="cpu", return_lse=True, **kw)
    d_out = np.random.default_rng(p["seed"] + 1).standard_normal(out.shape).astype(np.float32)
    ref = dense_na(q, k, v, p["ks"], p["stride"], p["dil"], p["causal"], p["scale"], add_k, add_v,
                   d_out=d_out)
    check_close(out, ref["out"])
    check_close(lse, ref["lse"], what="lse")
    grads = fna.na_backward(d_out, q, k, v, out, lse, backend="cpu", **kw)
    for name, g in zip(("dq", "dk", "dv", "d_add_k", "d_add_v"), grads):
        check_close(g, ref[name], what=name)


# ---- invalid calls ---------------------------------------------------------------------------------

BIG = [0, -1, -(2 ** 31), 2 ** 31, 2 ** 32, 2 ** 62, 2 ** 63 - 1, 2 ** 64, 2 ** 70]


@st.composite
def invalid_calls(draw):
    """(the argument that is wrong, kwargs of an na*d call on small valid arrays but for it)."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(2, 6)) for _ in range(rank))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 31 - 1)))
    q = rng.standard_normal((1, *shape, 2, 4)).astype(np.float32)
    call = dict(query=q, key=q.copy(), value=q.copy(), kernel_size=2, stride=1, dilation=1,
                is_causal=False, backend="cpu")
    which = draw(st.sampled_from(["kernel_size", "dilation", "stride", "is_causal", "scale",
                                  "key", "value", "query", "backend", "return_lse",
                                  "additional_keys"]))
    if which in ("kernel_size", "dilation", "stride"):
        bad = draw(st.one_of(st.sampled_from(BIG), st.just(1.5), st.just("3"),
                             st.just(tuple([2] * (rank + 1)))))
        if which == "kernel_size" and bad == 2:
            bad = 0
        if which == "stride":  # also: past the kernel size
            bad = draw(st.sampled_from([bad, 3]))
        call[which] = bad
    elif which == "is_causal":
        call[which] = draw(st.sampled_from([2, "yes", 1.0, tuple([True] * (rank + 2))]))
    elif which == "scale":
        call[which] = draw(st.sampled_from([0.0, -1.0, float("nan"), float("inf"), True, "1"]))
    elif which == "key":
        call[which] = q[..., :3] if draw(st.booleans()) else q.astype(np.float64)
    elif which == "value":
        call[which] = np.zeros((1, *shape, 3, 4), np.float32) + 1.0  # heads_kv 3 vs heads 2
    elif which == "query":
        call[which] = draw(st.sampled_from([q[0], q.astype(np.int32), q[..., :0]]))
    elif which == "backend":
        call[which] = draw(st.sampled_from(["gpu", "", 3, "cuda-fused"]))
    elif which == "return_lse":
        call[which] = draw(st.sampled_from(["yes", 2.5]))
    else:
        call["additional_keys"] = np.ones((1, 2, 2, 4), np.float32)  # without additional_values
    return rank, which, call


NAMES = {"query": ("query", "dim", "head"), "key": ("key",), "value": ("value", "heads"),
         "additional_keys": ("additional",)}


@SETTINGS
@given(invalid_calls())
def test_invalid_calls_raise_naming_the_argument(case):
    rank, which, call = case
    with pytest.raises((ValueError, TypeError, NotImplementedError)) as err:
        NA[rank](**call)
    msg = str(err.value)
    names = NAMES.get(which, (which,))
    assert any(n in msg for n in names), f"{which}: {msg!r}"


@SETTINGS
@given(st.integers(1, 3), st.sampled_from(BIG[1:]), st.sampled_from(BIG[1:]))
def test_huge_kernel_times_dilation_is_refused(rank, kernel, dilation):
    """kernel_size * dilation overflowing 64 bits must still be refused (never a crash, never a
    wrapped product that passes)."""
    q = np.random.default_rng(rank).standard_normal((1,) + (8,) * rank + (1, 4)).astype(np.float32)
    for backend in ("cpu", "reference"):
        with pytest.raises((ValueError, TypeError)) as err:
            NA[rank](q, q, q, kernel_size=kernel, dilation=dilation, backend=backend)
        assert "kernel_size" in str(err.value) or "dilation" in str(err.value), str(err.value)


def test_oracle_is_float64():
    """The helper the properties compare against is a float64 computation (sanity check of the
    test itself: a perturbation at float32 resolution shows in it)."""
    q = np.full((1, 3, 1, 2), 1.0, np.float32)
    v = np.arange(6, dtype=np.float32).reshape(1, 3, 1, 2)
    out = dense_na(q, q, v, [3])["out"]
    assert out.dtype == np.float64 and math.isclose(out[0, 0, 0, 0], 2.0)
