"""The test oracle itself (helpers.dense_na): its analytic float64 gradients against central
finite differences in float64, and against torch autograd of a float64 transcription
(checked with torch.autograd.gradcheck). The library's gradients are compared with these
gradients elsewhere, so they must be right."""

import numpy as np
import pytest

from helpers import dense_na, full_mask, random_params, seed_of


def problem(rng, rank):
    shape, ks, st, dil, causal = random_params(rng, rank, {1: 10, 2: 5, 3: 4}[rank])
    H, H_kv, D, D_v, n_add = 2, 1, 3, 2, 2
    f = lambda *s: rng.standard_normal(s)  # noqa: E731
    return dict(q=f(1, *shape, H, D), k=f(1, *shape, H_kv, D), v=f(1, *shape, H_kv, D_v),
                add_k=f(1, n_add, H_kv, D), add_v=f(1, n_add, H_kv, D_v), ks=ks, st=st,
                dil=dil, causal=causal)


def loss(p, w, **moved):
    x = dict(p, **moved)
    out = dense_na(x["q"], x["k"], x["v"], x["ks"], x["st"], x["dil"], x["causal"], 0.7,
                   x["add_k"], x["add_v"])["out"]
    return float((out * w).sum())


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_oracle_gradients_finite_differences(rank):
    rng = np.random.default_rng(seed_of("oracle-fd", rank))
    p = problem(rng, rank)
    w = rng.standard_normal(p["q"].shape[:-1] + (p["v"].shape[-1],))
    ref = dense_na(p["q"], p["k"], p["v"], p["ks"], p["st"], p["dil"], p["causal"], 0.7,
                   p["add_k"], p["add_v"], d_out=w)
    h = 1e-6
    for name, g in (("q", "dq"), ("k", "dk"), ("v", "dv"), ("add_k", "d_add_k"),
                    ("add_v", "d_add_v")):
        x = p[name]
        fd = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += h
            xm[idx] -= h
            fd[idx] = (loss(p, w, **{name: xp}) - loss(p, w, **{name: xm})) / (2 * h)
        # float64 central differences: truncation ~h^2, rounding ~1e-16 * |loss| / h.
        np.testing.assert_allclose(ref[g], fd, rtol=1e-6, atol=1e-7, err_msg=g)


def test_oracle_matches_torch_gradcheck():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed_of("oracle-gradcheck"))
    p = problem(rng, 2)
    mask = torch.from_numpy(full_mask(p["q"].shape[1:3], p["ks"], p["st"], p["dil"], p["causal"]))
    mask = torch.cat([mask, torch.ones(mask.shape[0], 2, dtype=torch.bool)], 1)

    def attention(q, k, v, ak, av):  # [1, X, Y, H, D] float64, H_kv = 1
        Q = q.reshape(1, -1, 2, 3).transpose(1, 2)
        K = torch.cat([k.reshape(1, -1, 1, 3), ak], 1).transpose(1, 2)
        V = torch.cat([v.reshape(1, -1, 1, 2), av], 1).transpose(1, 2)
        S = (Q @ K.transpose(-1, -2) * 0.7).masked_fill(~mask, float("-inf"))
        return (torch.softmax(S, -1) @ V).transpose(1, 2).reshape(q.shape[:-1] + (2,))

    leaves = [torch.from_numpy(p[n]).requires_grad_(True) for n in ("q", "k", "v", "add_k",
                                                                     "add_v")]
    assert torch.autograd.gradcheck(attention, leaves, fast_mode=True)
    w = torch.from_numpy(rng.standard_normal(p["q"].shape[:-1] + (2,)))
    out = attention(*leaves)
    out.backward(w)
    ref = dense_na(p["q"], p["k"], p["v"], p["ks"], p["st"], p["dil"], p["causal"], 0.7,
                   p["add_k"], p["add_v"], d_out=w.numpy())
    np.testing.assert_allclose(ref["out"], out.detach().numpy(), rtol=1e-12, atol=1e-12)
    for leaf, g in zip(leaves, ("dq", "dk", "dv", "d_add_k", "d_add_v")):
        np.testing.assert_allclose(ref[g], leaf.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=g)


def loss_with_lse(p, w, g, **moved):
    x = dict(p, **moved)
    res = dense_na(x["q"], x["k"], x["v"], x["ks"], x["st"], x["dil"], x["causal"], 0.7,
                   x["add_k"], x["add_v"])
    return float((res["out"] * w).sum() + (res["lse"] * g).sum())


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_oracle_lse_gradients_finite_differences(rank):
    """The oracle's gradients of sum(w * out) + sum(g * lse) (its d_lse term) against float64
    central differences; the LSE term alone must change them (else this would test nothing)."""
    rng = np.random.default_rng(seed_of("oracle-fd-lse", rank))
    p = problem(rng, rank)
    w = rng.standard_normal(p["q"].shape[:-1] + (p["v"].shape[-1],))
    g = 3.0 * rng.standard_normal(p["q"].shape[:-1])
    args = (p["q"], p["k"], p["v"], p["ks"], p["st"], p["dil"], p["causal"], 0.7, p["add_k"],
            p["add_v"])
    ref = dense_na(*args, d_out=w, d_lse=g)
    without = dense_na(*args, d_out=w)
    assert np.abs(ref["dq"] - without["dq"]).max() > 1e-2
    h = 1e-6
    for name, gname in (("q", "dq"), ("k", "dk"), ("v", "dv"), ("add_k", "d_add_k"),
                        ("add_v", "d_add_v")):
        x = p[name]
        fd = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += h
            xm[idx] -= h
            fd[idx] = (loss_with_lse(p, w, g, **{name: xp}) -
                       loss_with_lse(p, w, g, **{name: xm})) / (2 * h)
        np.testing.assert_allclose(ref[gname], fd, rtol=1e-6, atol=1e-7, err_msg=gname)
