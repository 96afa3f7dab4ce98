"""Test helpers: an independent dense masked-attention oracle in float64 NumPy, random problems,
and the SPEC section 4 comparison.

The oracle re-derives each axis's window from the formulas of docs/semantics.md section 1 (it shares no
code with the library, its reference backend or src/core/neighborhood.h), builds the full
[query, key] membership mask, and computes softmax attention and its analytic gradients densely.
"""

import math
import zlib

import numpy as np

EPS = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def seed_of(*parts):
    """A stable seed from a test's identity (name, case index), so a failure reproduces."""
    return zlib.crc32(repr(parts).encode())


# ---- the neighborhood, straight from docs/semantics.md section 1 --------------------------------

def axis_window(x, L, K, d, s, causal):
    """(group, start, end) of the window of coordinate x, in the group's local indices."""
    g, i = x % d, x // d
    Lg = (L - g + d - 1) // d
    left = K // 2
    right = K - 1 - left
    if causal:
        leader = min((i // s) * s + s - 1, Lg - 1)
        start = max(leader - K + 1, 0)
        end = min(i + 1, Lg)
    else:
        leader = min((i // s) * s + s // 2, Lg - 1)
        start = max(leader - left, 0) + (Lg - right - leader - 1 if leader + right >= Lg else 0)
        end = start + K
    return g, start, end


def axis_mask(L, K, d, s, causal):
    m = np.zeros((L, L), dtype=bool)
    for x in range(L):
        g, start, end = axis_window(x, L, K, d, s, causal)
        for y in range(L):
            m[x, y] = y % d == g and start <= y // d < end
    return m


def full_mask(shape, ks, st, dil, causal):
    """[N, N] membership over the flattened (row-major) grid."""
    mask = np.ones((1, 1), dtype=bool)
    for a, L in enumerate(shape):
        m = axis_mask(L, ks[a], dil[a], st[a], causal[a])
        mask = (mask[:, None, :, None] & m[None, :, None, :]).reshape(mask.shape[0] * L, -1)
    return mask


def window_slots(shape, ks, st, dil, causal):
    """[N, W] flattened key index of each slot of qk's neighbor order, -1 for a non-neighbor slot.

    Slot w enumerates the box [start_a, start_a + K_a) row-major (last axis fastest)."""
    r = len(shape)
    N = math.prod(shape)
    W = math.prod(ks)
    slots = np.full((N, W), -1, dtype=np.int64)
    for qi, qc in enumerate(np.ndindex(*shape)):
        wins = [axis_window(qc[a], shape[a], ks[a], dil[a], st[a], causal[a]) for a in range(r)]
        for w, off in enumerate(np.ndindex(*ks)):
            coord, ok = [], True
            for a in range(r):
                g, start, end = wins[a]
                j = start + off[a]
                ok &= j < end
                coord.append(j * dil[a] + g)
            if ok:
                slots[qi, w] = np.ravel_multi_index(coord, shape)
    return slots


# ---- dense attention in float64 ------------------------------------------------------------------

def _flat(x, r):
    """[B, *shape, H, D] -> [B, H, N, D] float64."""
    x = np.asarray(x, dtype=np.float64)
    B, H, D = x.shape[0], x.shape[r + 1], x.shape[r + 2]
    return np.moveaxis(x.reshape(B, -1, H, D), 2, 1)


def _unflat(x, shape):
    """[B, H, N, D] -> [B, *shape, H, D]."""
    B, H, N, D = x.shape
    return np.moveaxis(x, 1, 2).reshape((B,) + tuple(shape) + (H, D))


def _expand_kv(x, H):
    return np.repeat(x, H // x.shape[1], axis=1)


def _reduce_kv(g, H_kv):
    B, H, N, D = g.shape
    return g.reshape(B, H_kv, H // H_kv, N, D).sum(axis=2)


def dense_na(q, k, v, ks, st=None, dil=None, causal=None, scale=None, add_k=None, add_v=None,
             d_out=None, d_lse=None):
    """Dense masked attention in float64. Returns dict with out, lse, and (if d_out or d_lse)
    the grads dq, dk, dv, d_add_k, d_add_v of sum(d_out * out) + sum(d_lse * lse), all in the
    library's layouts. (d LSE_i / d S_ij = P_ij, so d_lse adds P_ij * d_lse_i to dS_ij.)"""
    q = np.asarray(q, np.float64)
    r = q.ndim - 3
    shape = q.shape[1:1 + r]
    st = st or [1] * r
    dil = dil or [1] * r
    causal = causal or [False] * r
    H, H_kv = q.shape[-2], np.shape(k)[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    Q, K, V = _flat(q, r), _expand_kv(_flat(k, r), H), _expand_kv(_flat(v, r), H)
    mask = full_mask(shape, ks, st, dil, causal)
    n_add = 0
    if add_k is not None:
        AK = _expand_kv(np.moveaxis(np.asarray(add_k, np.float64), 2, 1), H)
        AV = _expand_kv(np.moveaxis(np.asarray(add_v, np.float64), 2, 1), H)
        n_add = AK.shape[2]
        K = np.concatenate([K, AK], axis=2)
        V = np.concatenate([V, AV], axis=2)
        mask = np.concatenate([mask, np.ones((mask.shape[0], n_add), bool)], axis=1)
    S = scale * np.einsum("bhnd,bhmd->bhnm", Q, K)
    S = np.where(mask, S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    E = np.exp(S - m)
    den = E.sum(axis=-1, keepdims=True)
    P = E / den
    O = np.einsum("bhnm,bhmd->bhnd", P, V)
    res = {"out": _unflat(O, shape),
           "lse": np.moveaxis((m + np.log(den))[..., 0], 1, -1).reshape(q.shape[:-1])}
    if d_out is None and d_lse is None:
        return res
    dO = _flat(d_out, r) if d_out is not None else np.zeros_like(O)
    dV = np.einsum("bhnm,bhnd->bhmd", P, dO)
    dP = np.einsum("bhnd,bhmd->bhnm", dO, V)
    delta = (dO * O).sum(axis=-1, keepdims=True)
    if d_lse is not None:  # [B, *shape, H] -> [B, H, N, 1]
        delta = delta - _flat(np.asarray(d_lse)[..., None], r)
    dS = P * (dP - delta)
    dQ = scale * np.einsum("bhnm,bhmd->bhnd", dS, K)
    dK = scale * np.einsum("bhnm,bhnd->bhmd", dS, Q)
    N = Q.shape[2]
    res["dq"] = _unflat(dQ, shape)
    res["dk"] = _unflat(_reduce_kv(dK[:, :, :N], H_kv), shape)
    res["dv"] = _unflat(_reduce_kv(dV[:, :, :N], H_kv), shape)
    if n_add:
        res["d_add_k"] = np.moveaxis(_reduce_kv(dK[:, :, N:], H_kv), 1, 2)
        res["d_add_v"] = np.moveaxis(_reduce_kv(dV[:, :, N:], H_kv), 1, 2)
    return res


def dense_qk(q, k, ks, st=None, dil=None, causal=None, add_k=None):
    """qk's logits [B, *shape, H, W + N_add] in its documented neighbor order, -inf in empty slots."""
    q = np.asarray(q, np.float64)
    r = q.ndim - 3
    shape = q.shape[1:1 + r]
    st = st or [1] * r
    dil = dil or [1] * r
    causal = causal or [False] * r
    H = q.shape[-2]
    Q, K = _flat(q, r), _expand_kv(_flat(k, r), H)
    slots = window_slots(shape, ks, st, dil, causal)
    S = np.einsum("bhnd,bhmd->bhnm", Q, K)
    gathered = np.take_along_axis(S, np.maximum(slots, 0)[None, None], axis=-1)
    gathered = np.where(slots[None, None] >= 0, gathered, -np.inf)
    if add_k is not None:
        AK = _expand_kv(np.moveaxis(np.asarray(add_k, np.float64), 2, 1), H)
        gathered = np.concatenate([gathered, np.einsum("bhnd,bhmd->bhnm", Q, AK)], axis=-1)
    return np.moveaxis(gathered, 1, 2).reshape(q.shape[:-1] + (gathered.shape[-1],))


# ---- random problems -----------------------------------------------------------------------------

def random_params(rng, rank, max_len=9):
    """Random valid shape and per-axis parameters."""
    shape, ks, st, dil, causal = [], [], [], [], []
    for _ in range(rank):
        L = int(rng.integers(3, max_len + 1))
        d = int(rng.integers(1, 3)) if L >= 4 else 1
        K = int(rng.integers(1, L // d + 1))
        s = int(rng.integers(1, K + 1))
        shape.append(L)
        ks.append(K)
        st.append(s)
        dil.append(d)
        causal.append(bool(rng.random() < 0.3))
    return shape, ks, st, dil, causal


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ---- comparison (SPEC section 4) -----------------------------------------------------------------

def check_close(out, ref, dtype="float32", naive=None, what="output"):
    """float32: max error <= 1e-5 relative to max|ref| (the SPEC's float32 criterion).
    float16 / bfloat16: max error <= 2 * max|naive - ref| + atol, atol = 2 ulp of max|ref|, where
    `naive` is the same computation done plainly in that dtype. NaN never passes."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(out), finite), f"{what}: non-finite entries differ"
    assert np.array_equal(out[~finite], ref[~finite]), f"{what}: infinite entries differ"
    err = np.abs(out[finite] - ref[finite]).max(initial=0.0)
    mag = max(1.0, np.abs(ref[finite]).max(initial=0.0))
    if dtype == "float32":
        bound = 1e-5 * mag
    else:
        assert naive is not None, "low precision needs the naive low-precision result"
        naive = np.asarray(naive, dtype=np.float64)
        naive_err = np.abs(naive[finite] - ref[finite]).max(initial=0.0)
        bound = 2.0 * naive_err + 2.0 * EPS[dtype] * mag
    assert err <= bound, f"{what}: max error {err:.3g} > bound {bound:.3g} ({dtype})"
    return err
