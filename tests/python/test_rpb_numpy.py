"""Relative positional bias with NumPy inputs (fna._rpb_np): ``na*d(..., rpb=)`` (output and LSE)
and ``na*d_qk(..., rpb=)`` against a dense float64 reference built from coordinates (the bias of
a pair indexed by the key's position minus the query's in units of the dilation, plus K - 1;
helpers.full_mask for the neighborhood), on the cpu and reference backends, every parameter;
the errors. Needs no torch."""
import math

import numpy as np
import pytest

import fna
from helpers import check_close, full_mask, seed_of

NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}
QK = {1: fna.na1d_qk, 2: fna.na2d_qk, 3: fna.na3d_qk}

# rank, shape, kernel, stride, dilation, causal, heads, kv heads, additional keys
CASES = [
    (1, [11], [4], [1], [1], [False], 2, 2, 0),
    (1, [13], [5], [2], [2], [True], 3, 1, 2),
    (2, [9, 9], [5, 5], [1, 1], [1, 1], [False, False], 2, 2, 0),
    (2, [7, 9], [3, 4], [1, 2], [2, 1], [False, True], 4, 2, 3),
    (3, [5, 6, 4], [3, 2, 4], [1, 2, 1], [1, 2, 1], [True, False, False], 2, 2, 1),
]


def bias_of_pairs(rpb, shape, ks, dil):
    """[H, N, N] bias of every (query, key) pair of the flattened grid, from coordinates (clipped
    into range: only neighbor pairs are used)."""
    coords = np.array(list(np.ndindex(*shape)), dtype=np.int64).reshape(-1, len(shape))
    idx = []
    for a, (K, d) in enumerate(zip(ks, dil)):
        rel = coords[None, :, a] - coords[:, None, a]
        idx.append(np.clip(rel // d + K - 1, 0, 2 * K - 2))
    return rpb[(slice(None), *idx)]


def reference(q, k, v, rpb, ks, st, dil, causal, scale, add_k, add_v):
    """Dense float64 softmax(scale q.k + bias masked to the neighborhood (+ unbiased additional
    keys)) @ v; returns (out, lse, logits over the neighborhood [B, N, H, N])."""
    r = q.ndim - 3
    B, shape, H, D = q.shape[0], list(q.shape[1:1 + r]), q.shape[-2], q.shape[-1]
    N, Hkv = math.prod(shape), k.shape[-2]
    Q = q.reshape(B, N, H, D).transpose(0, 2, 1, 3)
    K = np.repeat(k.reshape(B, N, Hkv, D).transpose(0, 2, 1, 3), H // Hkv, axis=1)
    V = np.repeat(v.reshape(B, N, Hkv, -1).transpose(0, 2, 1, 3), H // Hkv, axis=1)
    s = scale * Q @ K.transpose(0, 1, 3, 2) + bias_of_pairs(rpb, shape, ks, dil)[None]
    s = np.where(full_mask(shape, ks, st, dil, causal)[None, None], s, -np.inf)
    if add_k is not None:
        AK = np.repeat(add_k.transpose(0, 2, 1, 3), H // Hkv, axis=1)
        AV = np.repeat(add_v.transpose(0, 2, 1, 3), H // Hkv, axis=1)
        s = np.concatenate([s, scale * Q @ AK.transpose(0, 1, 3, 2)], axis=-1)
        V = np.concatenate([V, AV], axis=2)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    lse = (m + np.log(e.sum(axis=-1, keepdims=True)))[..., 0]
    out = (e / e.sum(axis=-1, keepdims=True)) @ V
    return (out.transpose(0, 2, 1, 3).reshape(B, *shape, H, -1),
            lse.transpose(0, 2, 1).reshape(B, *shape, H), s)


def make(case, seed, D=8, Dv=6, B=2):
    rank, shape, ks, st, dil, causal, H, Hkv, n_add = case
    rng = np.random.default_rng(seed)
    t = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return dict(q=t(B, *shape, H, D), k=t(B, *shape, Hkv, D), v=t(B, *shape, Hkv, Dv),
                rpb=t(H, *(2 * k - 1 for k in ks)), add_k=t(B, n_add, Hkv, D) if n_add else None,
                add_v=t(B, n_add, Hkv, Dv) if n_add else None)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("i", range(len(CASES)))
def test_forward_matches_float64_reference(i, backend):
    case = CASES[i]
    rank, shape, ks, st, dil, causal = case[:6]
    x = make(case, seed_of("rpb-numpy", i, backend))
    scale = 0.3
    out, lse = NA[rank](x["q"], x["k"], x["v"], ks, stride=st, dilation=dil, is_causal=causal,
                        scale=scale, additional_keys=x["add_k"], additional_values=x["add_v"],
                        backend=backend, return_lse=True, rpb=x["rpb"])
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and lse.dtype == np.float32
    f64 = {n: None if a is None else a.astype(np.float64) for n, a in x.items()}
    ref_out, ref_lse, _ = reference(f64["q"], f64["k"], f64["v"], f64["rpb"], ks, st, dil, causal,
                                    scale, f64["add_k"], f64["add_v"])
    check_close(out, ref_out, what="output")
    check_close(lse, ref_lse, what="lse")
    # The same call without the bias differs (the bias is used at all).
    plain = NA[rank](x["q"], x["k"], x["v"], ks, stride=st, dilation=dil, is_causal=causal,
                     scale=scale, additional_keys=x["add_k"], additional_values=x["add_v"],
                     backend=backend)
    assert np.abs(plain - out).max() > 1e-3


@pytest.mark.parametrize("i", [0, 2, 4])
def test_qk_adds_the_bias_to_the_neighbor_slots(i):
    """na*d_qk(rpb=) is na*d_qk plus the bias of each slot's (query, key) pair; additional keys'
    columns and the empty slots of truncated causal windows are unchanged."""
    case = CASES[i]
    rank, shape, ks, st, dil, causal = case[:6]
    x = make(case, seed_of("rpb-numpy-qk", i))
    kw = dict(stride=st, dilation=dil, is_causal=causal, additional_keys=x["add_k"],
              backend="cpu")
    plain = QK[rank](x["q"], x["k"], ks, **kw)
    biased = QK[rank](x["q"], x["k"], ks, rpb=x["rpb"], **kw)
    W = math.prod(ks)
    np.testing.assert_array_equal(biased[..., W:], plain[..., W:])
    # The bias added per slot, from the spec's slot order (helpers.window_slots).
    from helpers import window_slots
    slots = window_slots(shape, ks, st, dil, causal)  # [N, W] key index or -1
    pair_bias = bias_of_pairs(x["rpb"].astype(np.float64), shape, ks, dil)  # [H, N, N]
    N = math.prod(shape)
    H = x["q"].shape[-2]
    expect = np.zeros((N, H, W))
    for n in range(N):
        for w in range(W):
            if slots[n, w] >= 0:
                expect[n, :, w] = pair_bias[:, n, slots[n, w]]
    finite = np.isfinite(plain[..., :W]).reshape(-1, N, H, W)
    with np.errstate(invalid="ignore"):  # -inf - -inf in the empty slots, masked below
        got = (biased[..., :W].astype(np.float64) - plain[..., :W]).reshape(-1, N, H, W)
    assert np.abs(np.where(finite, got - expect[None], 0)).max() < 1e-5
    assert np.array_equal(np.isfinite(biased[..., :W]), np.isfinite(plain[..., :W]))


def test_errors():
    x = make(CASES[2], 0)
    q, k, v, rpb = x["q"], x["k"], x["v"], x["rpb"]
    with pytest.raises(ValueError, match=r"rpb has shape \(2, 9, 9\); expected \(2, 9, 7\)"):
        fna.na2d(q, k, v, (5, 4), rpb=rpb)
    with pytest.raises(TypeError, match="rpb has dtype int64"):
        fna.na2d(q, k, v, (5, 5), rpb=rpb.astype(np.int64))
    with pytest.raises(TypeError, match="rpb must be a numpy.ndarray"):
        fna.na2d(q, k, v, (5, 5), rpb=rpb.tolist())
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        fna.na2d(q, k, v, (5, 5), rpb=rpb, backend="cuda-naive")
    with pytest.raises(ValueError, match="config='x' names a cuda-fused tile configuration, "
                                         "but backend=cpu runs this call"):
        fna.na2d(q, k, v, (5, 5), rpb=rpb, config="x")


def test_numpy_rpb_imports_no_torch():
    """A NumPy call with rpb works where torch cannot be imported."""
    import os
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, fna\n"
            "q = np.random.default_rng(0).standard_normal((1, 9, 9, 2, 8)).astype(np.float32)\n"
            "rpb = np.ones((2, 5, 5), np.float32)\n"
            "o, l = fna.na2d(q, q, q, 3, rpb=rpb, return_lse=True)\n"
            "a = fna.na2d_qk(q, q, 3, rpb=rpb)\n"
            "assert o.shape == q.shape and l.shape == q.shape[:-1] and a.shape[-1] == 9\n")
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
