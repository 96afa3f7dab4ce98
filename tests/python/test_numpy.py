"""The NumPy path against the dense float64 oracle of helpers.py and the `reference` backend."""

import math

import numpy as np
import pytest

import fna
from helpers import (check_close, dense_na, dense_qk, randn, random_params, seed_of,
                     window_slots)

BACKENDS = ["reference", "cpu"]
NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}
QK = {1: fna.na1d_qk, 2: fna.na2d_qk, 3: fna.na3d_qk}
AV = {1: fna.na1d_av, 2: fna.na2d_av, 3: fna.na3d_av}


def random_problem(rng, rank, dtype=np.float32, max_len=None):
    """Random shape, parameters, GQA, D_v != D, optional additional KV, and sometimes a
    heads-first (non-contiguous) view."""
    max_len = max_len or {1: 24, 2: 9, 3: 5}[rank]
    shape, ks, st, dil, causal = random_params(rng, rank, max_len)
    B = int(rng.integers(1, 3))
    H_kv = int(rng.choice([1, 2]))
    H = H_kv * int(rng.choice([1, 2]))
    D = int(rng.integers(1, 9))
    D_v = int(rng.choice([D, int(rng.integers(1, 9))]))
    n_add = int(rng.choice([0, 0, 1, 3]))

    def make(heads, dim):
        if rng.random() < 0.3:  # a heads-first buffer viewed heads-last: non-contiguous strides
            t = randn(rng, (B, heads, *shape, dim), dtype)
            return np.moveaxis(t, 1, -2)
        return randn(rng, (B, *shape, heads, dim), dtype)

    p = dict(q=make(H, D), k=make(H_kv, D), v=make(H_kv, D_v), ks=ks, st=st, dil=dil,
             causal=causal, add_k=None, add_v=None)
    if n_add:
        p["add_k"] = randn(rng, (B, n_add, H_kv, D), dtype)
        p["add_v"] = randn(rng, (B, n_add, H_kv, D_v), dtype)
    return p


def run_na(p, backend, scale=None, return_lse=True):
    rank = p["q"].ndim - 3
    return NA[rank](p["q"], p["k"], p["v"], p["ks"], stride=p["st"], dilation=p["dil"],
                    is_causal=p["causal"], scale=scale, additional_keys=p["add_k"],
                    additional_values=p["add_v"], backend=backend, return_lse=return_lse)


def oracle(p, scale=None, d_out=None):
    return dense_na(p["q"], p["k"], p["v"], p["ks"], p["st"], p["dil"], p["causal"], scale,
                    p["add_k"], p["add_v"], d_out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("case", range(10))
def test_forward_random(backend, rank, case):
    rng = np.random.default_rng(seed_of("fwd", rank, case))
    p = random_problem(rng, rank)
    scale = None if case % 2 else float(rng.uniform(0.1, 1.0))
    out, lse = run_na(p, backend, scale)
    ref = oracle(p, scale)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    check_close(out, ref["out"], what=f"output {p['ks']=} {p['st']=} {p['dil']=} {p['causal']=}")
    check_close(lse, ref["lse"], what="lse")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", range(6))
def test_forward_float16(backend, case):
    """float16 (NumPy has no bfloat16; the torch tests cover it) against the SPEC criterion."""
    rng = np.random.default_rng(seed_of("fwd16", case))
    rank = 1 + case % 3
    p = random_problem(rng, rank, np.float16)
    out = run_na(p, backend, return_lse=False)
    assert out.dtype == np.float16
    ref = oracle(p)
    naive = naive_float16(p)
    check_close(out, ref["out"], "float16", naive=naive)


def naive_float16(p):
    """The same dense attention done plainly in float16 (scores, softmax and sum in float16)."""
    q = p["q"]
    r = q.ndim - 3
    H = q.shape[-2]
    sh = q.shape[1:1 + r]
    from helpers import full_mask
    mask = full_mask(sh, p["ks"], p["st"], p["dil"], p["causal"])
    f16 = np.float16

    def flat(x):
        x = np.asarray(x, f16)
        return np.moveaxis(x.reshape(x.shape[0], -1, x.shape[-2], x.shape[-1]), 2, 1)

    Q = flat(q)
    K = np.repeat(flat(p["k"]), H // p["k"].shape[-2], axis=1)
    V = np.repeat(flat(p["v"]), H // p["v"].shape[-2], axis=1)
    if p["add_k"] is not None:
        rep = H // p["add_k"].shape[2]
        K = np.concatenate([K, np.repeat(np.moveaxis(p["add_k"], 2, 1), rep, axis=1)], axis=2)
        V = np.concatenate([V, np.repeat(np.moveaxis(p["add_v"], 2, 1), rep, axis=1)], axis=2)
        mask = np.concatenate([mask, np.ones((mask.shape[0], p["add_k"].shape[1]), bool)], 1)
    S = (Q @ np.swapaxes(K, -1, -2)) * f16(q.shape[-1] ** -0.5)
    S = np.where(mask, S, f16(-np.inf))
    E = np.exp(S - S.max(-1, keepdims=True))
    P = E / E.sum(-1, keepdims=True, dtype=f16)
    O = (P @ V).astype(f16)
    return np.moveaxis(O, 1, 2).reshape(q.shape[:-1] + (V.shape[-1],))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("case", range(8))
def test_backward_random(backend, rank, case):
    """na_backward's gradients against the oracle's analytic float64 gradients (which
    test_oracle.py checks against finite differences)."""
    rng = np.random.default_rng(seed_of("bwd", rank, case))
    p = random_problem(rng, rank)
    d_out = randn(rng, p["q"].shape[:-1] + (p["v"].shape[-1],))
    out, lse = run_na(p, backend)
    grads = fna.na_backward(d_out, p["q"], p["k"], p["v"], out, lse, p["ks"], stride=p["st"],
                            dilation=p["dil"], is_causal=p["causal"],
                            additional_keys=p["add_k"], additional_values=p["add_v"],
                            backend=backend)
    ref = oracle(p, d_out=d_out)
    names = ["dq", "dk", "dv"] + (["d_add_k", "d_add_v"] if p["add_k"] is not None else [])
    assert len(grads) == len(names)
    for g, name in zip(grads, names):
        check_close(g, ref[name], what=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_agree_with_reference(backend):
    """The numpy path through `backend` against the `reference` backend on the same inputs."""
    rng = np.random.default_rng(seed_of("agree", backend))
    for rank in (1, 2, 3):
        p = random_problem(rng, rank)
        out, lse = run_na(p, backend)
        ref_out, ref_lse = run_na(p, "reference")
        check_close(out, ref_out, what=f"rank {rank} output")
        check_close(lse, ref_lse, what=f"rank {rank} lse")


def test_special_cases():
    """SPEC section 1: full window = self attention; K = 1 gives V."""
    rng = np.random.default_rng(seed_of("special"))
    q, k, v = (randn(rng, (1, 5, 6, 2, 4)) for _ in range(3))
    out = fna.na2d(q, k, v, (5, 6), backend="reference")
    Q, K, V = (np.moveaxis(x.reshape(1, 30, 2, 4), 2, 1).astype(np.float64) for x in (q, k, v))
    S = Q @ np.swapaxes(K, -1, -2) / 2.0
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    check_close(out, np.moveaxis(P @ V, 1, 2).reshape(1, 5, 6, 2, 4), what="self attention")
    for backend in BACKENDS:
        check_close(fna.na2d(q, k, v, 1, backend=backend), v, what=f"K=1 ({backend})")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_unfused(backend, rank):
    """qk against the oracle's logits in the documented neighbor order (-inf in empty slots);
    softmax(qk * scale) -> av equals na{r}d; the unfused backward functions against the oracle."""
    rng = np.random.default_rng(seed_of("unfused", rank))
    p = random_problem(rng, rank)
    if rank == 1:
        p["causal"] = [True]  # make sure empty (-inf) slots occur
    sp = dict(stride=p["st"], dilation=p["dil"], is_causal=p["causal"], backend=backend)
    attn = QK[rank](p["q"], p["k"], p["ks"], additional_keys=p["add_k"], **sp)
    ref = dense_qk(p["q"], p["k"], p["ks"], p["st"], p["dil"], p["causal"], p["add_k"])
    check_close(attn, ref, what="qk")
    if rank == 1:
        assert np.isinf(attn).any(), "a causal 1-D window must leave empty slots"
    scale = p["q"].shape[-1] ** -0.5
    logits = attn.astype(np.float64) * scale
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    out = AV[rank](w, p["v"], p["ks"], additional_values=p["add_v"], **sp)
    check_close(out, oracle(p)["out"], what="softmax(qk) -> av vs na")

    # Backward of qk and av through the chain rule of the oracle's dense computation.
    d_attn = randn(rng, attn.shape)
    grads = fna.na_qk_backward(d_attn, p["q"], p["k"], p["ks"], additional_keys=p["add_k"], **sp)
    slots = window_slots(p["q"].shape[1:1 + rank], p["ks"], p["st"], p["dil"], p["causal"])
    dq_ref, dk_ref, dak_ref = qk_backward_oracle(p, d_attn, slots)
    check_close(grads[0], dq_ref, what="qk d_query")
    check_close(grads[1], dk_ref, what="qk d_key")
    if p["add_k"] is not None:
        check_close(grads[2], dak_ref, what="qk d_additional_keys")

    d_out = randn(rng, out.shape)
    grads = fna.na_av_backward(d_out, w, p["v"], p["ks"], additional_values=p["add_v"], **sp)
    da_ref, dv_ref, dav_ref = av_backward_oracle(p, w, d_out, slots)
    check_close(grads[0], da_ref, what="av d_attn")
    check_close(grads[1], dv_ref, what="av d_value")
    if p["add_v"] is not None:
        check_close(grads[2], dav_ref, what="av d_additional_values")


def _flat(x):
    x = np.asarray(x, np.float64)
    return x.reshape(x.shape[0], -1, x.shape[-2], x.shape[-1])  # [B, N, H, D]


def qk_backward_oracle(p, d_attn, slots):
    """Scatter of d_attn over (query, key) pairs: dQ = sum_w dA[w] K[slot w], dK likewise."""
    q, k = _flat(p["q"]), _flat(p["k"])
    B, N, H, D = q.shape
    rep = H // k.shape[2]
    W = slots.shape[1]
    dA = _flat(d_attn)  # [B, N, H, W + n_add]
    dq = np.zeros_like(q)
    dk = np.zeros_like(k)
    for n in range(N):
        for w in range(W):
            j = slots[n, w]
            if j < 0:
                continue
            for h in range(H):
                dq[:, n, h] += dA[:, n, h, w, None] * k[:, j, h // rep]
                dk[:, j, h // rep] += dA[:, n, h, w, None] * q[:, n, h]
    dak = None
    if p["add_k"] is not None:
        ak = np.asarray(p["add_k"], np.float64)
        akx = np.repeat(ak, rep, axis=2)  # [B, n_add, H, D]
        dAa = dA[..., W:]  # [B, N, H, n_add]
        dq += np.einsum("bnha,bahd->bnhd", dAa, akx)
        dakx = np.einsum("bnha,bnhd->bahd", dAa, q)
        dak = dakx.reshape(B, ak.shape[1], ak.shape[2], rep, D).sum(3)
    return dq.reshape(p["q"].shape), dk.reshape(p["k"].shape), dak


def av_backward_oracle(p, w, d_out, slots):
    v = _flat(p["v"])
    a = _flat(w)
    dO = _flat(d_out)
    B, N, H, W_all = a.shape
    rep = H // v.shape[2]
    W = slots.shape[1]
    d_attn = np.zeros_like(a)
    dv = np.zeros_like(v)
    for n in range(N):
        for s in range(W):
            j = slots[n, s]
            if j < 0:
                continue
            for h in range(H):
                d_attn[:, n, h, s] = (dO[:, n, h] * v[:, j, h // rep]).sum(-1)
                dv[:, j, h // rep] += a[:, n, h, s, None] * dO[:, n, h]
    dav = None
    if p["add_v"] is not None:
        av = np.asarray(p["add_v"], np.float64)
        avx = np.repeat(av, rep, axis=2)
        d_attn[..., W:] = np.einsum("bnhd,bahd->bnha", dO, avx)
        davx = np.einsum("bnha,bnhd->bahd", a[..., W:], dO)
        dav = davx.reshape(B, av.shape[1], av.shape[2], rep, -1).sum(3)
    return d_attn.reshape(w.shape), dv.reshape(p["v"].shape), dav


def test_readonly_and_negative_strides():
    """Read-only inputs are accepted (nothing writes them); negative-stride views give the
    same result as their contiguous copies."""
    rng = np.random.default_rng(seed_of("ro"))
    q, k, v = (randn(rng, (2, 7, 3, 4)) for _ in range(3))
    for x in (q, k, v):
        x.flags.writeable = False
    out = fna.na1d(q, k, v, 3, backend="reference")
    check_close(out, dense_na(q, k, v, [3])["out"])
    qr, kr, vr = (x[:, ::-1] for x in (q, k, v))
    out_r = fna.na1d(qr, kr, vr, 3, backend="reference")
    check_close(out_r, fna.na1d(*(np.ascontiguousarray(x) for x in (qr, kr, vr)), 3,
                                backend="reference"), what="negative strides")


def test_window_helpers_are_consistent():
    """The test oracle's slot table and mask agree (guards the oracle itself)."""
    from helpers import full_mask
    rng = np.random.default_rng(seed_of("oracle-consistency"))
    for _ in range(20):
        rank = int(rng.integers(1, 4))
        shape, ks, st, dil, causal = random_params(rng, rank, 7)
        slots = window_slots(shape, ks, st, dil, causal)
        mask = full_mask(shape, ks, st, dil, causal)
        from_slots = np.zeros_like(mask)
        for n in range(mask.shape[0]):
            keys = slots[n][slots[n] >= 0]
            assert len(set(keys.tolist())) == len(keys)
            from_slots[n, keys] = True
        assert np.array_equal(from_slots, mask)
        if not any(causal):
            assert (mask.sum(1) == math.prod(ks)).all()
