"""Gradients through the LSE: ``return_lse=True`` outputs are differentiable, and a loss on the LSE
reaches Q, K, V and the additional keys / values (the backward's ``d_lse``).

fna's autograd gradients of ``loss = f(out) + g(lse)`` are compared with torch autograd through a
plain float64 PyTorch neighborhood attention built from the boolean neighborhood mask
(helpers.full_mask, derived from docs/semantics.md independently of the library); the NumPy path
(``fna.na_backward(..., d_lse=...)``) with the float64 oracle (helpers.dense_na, whose d_lse
term test_oracle.py checks by finite differences). Every comparison also checks that the LSE term
changes the gradients by far more than the tolerance, so a backend that ignored it would fail.
"""

import numpy as np
import pytest

from helpers import check_close, dense_na, full_mask, randn, seed_of
from test_numpy import random_problem

torch = pytest.importorskip("torch")

import fna  # noqa: E402

NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}
TORCH_DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
NAMES = ("q", "k", "v", "add_k", "add_v")


def torch_na(t, dtype=torch.float64, scale=None):
    """Plain torch neighborhood attention in `dtype` from the [N, N] membership mask (plus
    additional keys, which every query sees): (out [B, *shape, H, D_v], lse [B, *shape, H])."""
    q = t["q"].to(dtype)
    r = q.dim() - 3
    B, H, D = q.shape[0], q.shape[-2], q.shape[-1]
    mask = torch.from_numpy(full_mask(q.shape[1:1 + r], t["ks"], t["st"], t["dil"], t["causal"]))

    def flat(x):  # [B, *shape, h, d] -> [B, h, N, d]
        x = x.to(dtype)
        return x.reshape(B, -1, x.shape[-2], x.shape[-1]).transpose(1, 2)

    K = flat(t["k"]).repeat_interleave(H // t["k"].shape[-2], 1)
    V = flat(t["v"]).repeat_interleave(H // t["v"].shape[-2], 1)
    if t["add_k"] is not None:
        rep = H // t["add_k"].shape[2]
        K = torch.cat([K, t["add_k"].to(dtype).transpose(1, 2).repeat_interleave(rep, 1)], 2)
        V = torch.cat([V, t["add_v"].to(dtype).transpose(1, 2).repeat_interleave(rep, 1)], 2)
        mask = torch.cat([mask, torch.ones(mask.shape[0], t["add_k"].shape[1], dtype=torch.bool)],
                         1)
    S = (flat(q) @ K.transpose(-1, -2)) * (D ** -0.5 if scale is None else scale)
    S = S.masked_fill(~mask.to(S.device), float("-inf"))
    out = torch.softmax(S, dim=-1) @ V
    lse = torch.logsumexp(S, dim=-1)
    return (out.transpose(1, 2).reshape(tuple(q.shape[:-1]) + (V.shape[-1],)),
            lse.transpose(1, 2).reshape(tuple(q.shape[:-1])))


def leaves_of(p, dtype=torch.float32, device="cpu"):
    """The numpy problem's tensors as torch leaves (strides kept), and its parameters."""
    t = dict(p)
    for n in NAMES:
        if p[n] is not None:
            t[n] = (torch.from_numpy(np.asarray(p[n], np.float32)).to(dtype).to(device)
                    .requires_grad_(True))
    return t


def run_fna(t, backend, **kw):
    r = t["q"].dim() - 3
    return NA[r](t["q"], t["k"], t["v"], t["ks"], stride=t["st"], dilation=t["dil"],
                 is_causal=t["causal"], additional_keys=t["add_k"],
                 additional_values=t["add_v"], backend=backend, return_lse=True, **kw)


def loss_of(out, lse, w_out, w_lse):
    """A loss that uses the output and (nonlinearly) the LSE (weights moved to their device)."""
    return ((out.double() * w_out.to(out.device)).sum() + (lse.double() * w_lse.to(lse.device)).sum()
            + 0.25 * lse.double().square().sum())


def grads_of(t, loss):
    names = [n for n in NAMES if t[n] is not None]
    return dict(zip(names, torch.autograd.grad(loss, [t[n] for n in names], allow_unused=True,
                                               materialize_grads=True)))


def loss_weights(rng, out_shape, lse_shape, w_lse_scale=2.0):
    w_out = torch.from_numpy(rng.standard_normal(out_shape))
    w_lse = torch.from_numpy(w_lse_scale * rng.standard_normal(lse_shape))
    return w_out, w_lse


def np_cpu(x):
    return x.detach().cpu().double().numpy()


def check_against_reference(p, backend, rng, what, device="cpu", **kw):
    """fna's gradients of loss(out, lse) (float32 tensors on `device`) vs the float64 torch
    reference's on the CPU, float32 criterion; the LSE term must matter (the reference's
    gradients with and without it differ by > 1e-3 of their size)."""
    t = leaves_of(p, device=device)
    out, lse = run_fna(t, backend, **kw)
    assert lse.requires_grad and lse.dtype == torch.float32
    w_out, w_lse = loss_weights(rng, out.shape, lse.shape)
    got = grads_of(t, loss_of(out, lse, w_out, w_lse))
    ref_t = {n: (t[n].detach().cpu().double().requires_grad_(True)
                 if n in NAMES and t[n] is not None else t[n]) for n in t}
    r_out, r_lse = torch_na(ref_t)
    check_close(np_cpu(out), np_cpu(r_out), what=f"{what} output")
    check_close(np_cpu(lse), np_cpu(r_lse), what=f"{what} lse")
    ref = grads_of(ref_t, loss_of(r_out, r_lse, w_out, w_lse))
    r_out, r_lse = torch_na(ref_t)
    ref_no_lse = grads_of(ref_t, (r_out * w_out).sum())
    mag = max(float(g.abs().max()) for g in ref.values())
    change = max(float((ref[n] - ref_no_lse[n]).abs().max()) for n in ref)
    assert change > 1e-3 * mag, f"{what}: the LSE term does not change the gradients"
    for n, g in got.items():
        check_close(np_cpu(g), ref[n].numpy(), what=f"{what} d{n}")


# Problems that cover each feature on purpose (random_problem covers them at random).
def fixed_problems(rank):
    rng = np.random.default_rng(seed_of("lse-fixed", rank))
    shape = {1: (11,), 2: (7, 6), 3: (5, 4, 5)}[rank]
    base = dict(ks=[3] * rank, st=[1] * rank, dil=[1] * rank, causal=[False] * rank,
                add_k=None, add_v=None)

    def make(B=1, H=2, H_kv=2, D=5, D_v=4, n_add=0, **over):
        p = dict(base, **over)
        p.update(q=randn(rng, (B, *shape, H, D)), k=randn(rng, (B, *shape, H_kv, D)),
                 v=randn(rng, (B, *shape, H_kv, D_v)))
        if n_add:
            p["add_k"] = randn(rng, (B, n_add, H_kv, D))
            p["add_v"] = randn(rng, (B, n_add, H_kv, D_v))
        return p

    return {
        "plain": make(),
        "additional": make(n_add=3),
        "causal": make(causal=[True] * rank, n_add=1),
        "dilation": make(dil=[2] + [1] * (rank - 1), ks=[2] + [3] * (rank - 1)),
        "stride": make(st=[2] * rank),
        "gqa": make(H=4, H_kv=1, n_add=2, B=2),
    }


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_lse_gradient_features(backend, rank):
    for name, p in fixed_problems(rank).items():
        rng = np.random.default_rng(seed_of("lse-features", backend, rank, name))
        check_against_reference(p, backend, rng, f"{backend} rank {rank} {name}")


@pytest.mark.parametrize("backend", [None, "reference", "cpu"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_lse_gradient_random(backend, rank):
    """Random problems: GQA, D_v != D, additional keys, causal, dilation, stride, heads-first
    (non-contiguous) views."""
    for case in range(4):
        rng = np.random.default_rng(seed_of("lse-random", rank, case))
        p = random_problem(rng, rank)
        check_against_reference(p, backend, rng, f"{backend} rank {rank} case {case}")


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_deterministic_and_threads(backend):
    """deterministic=True (the cpu backend's fixed task order) carries the LSE gradient too."""
    rng = np.random.default_rng(seed_of("lse-deterministic", backend))
    p = fixed_problems(2)["gqa"]
    check_against_reference(p, backend, rng, f"{backend} deterministic", deterministic=True)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_loss_on_lse_alone(backend):
    """The output unused: the backward gets no output gradient, only the LSE's."""
    for rank in (1, 2, 3):
        p = fixed_problems(rank)["additional"]
        t = leaves_of(p)
        _, lse = run_fna(t, backend)
        rng = np.random.default_rng(seed_of("lse-alone", backend, rank))
        w = torch.from_numpy(rng.standard_normal(lse.shape))
        got = grads_of(t, (lse.double() * w).sum())
        ref_t = {n: (t[n].detach().double().requires_grad_(True) if n in NAMES and t[n] is not None
                     else t[n]) for n in t}
        ref = grads_of(ref_t, (torch_na(ref_t)[1] * w).sum())
        for n, g in got.items():
            # detach: torch 2.4 materializes unused gradients as zeros that require grad
            check_close(g.detach().numpy(), ref[n].detach().numpy(),
                        what=f"{backend} rank {rank} d{n}")
        # The LSE does not depend on V: its gradient is exactly zero.
        assert float(got["v"].abs().max()) == 0.0 and float(got["add_v"].abs().max()) == 0.0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_lse_gradient_low_precision(dtype, backend):
    """float16 / bfloat16: errors against the float64 reference within 2x those of the same
    plain torch graph (out and logsumexp) run in the dtype, plus 2 ulp."""
    for rank in (1, 2, 3):
        rng = np.random.default_rng(seed_of("lse-lowp", dtype, backend, rank))
        p = random_problem(rng, rank)
        t = leaves_of(p, TORCH_DTYPE[dtype])
        out, lse = run_fna(t, backend)
        w_out, w_lse = loss_weights(rng, out.shape, lse.shape)
        got = grads_of(t, loss_of(out, lse, w_out, w_lse))
        ref_t = {n: (t[n].detach().double().requires_grad_(True) if n in NAMES and t[n] is not None
                     else t[n]) for n in t}
        ref = grads_of(ref_t, loss_of(*torch_na(ref_t), w_out, w_lse))
        low_t = {n: (t[n].detach().clone().requires_grad_(True) if n in NAMES and t[n] is not None
                     else t[n]) for n in t}
        naive = grads_of(low_t, loss_of(*torch_na(low_t, TORCH_DTYPE[dtype]), w_out, w_lse))
        for n, g in got.items():
            check_close(g.double().numpy(), ref[n].numpy(), dtype,
                        naive=naive[n].double().numpy(), what=f"{backend} rank {rank} d{n}")


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_numpy_na_backward_d_lse(backend, rank):
    """fna.na_backward(..., d_lse=) on NumPy arrays against the oracle's gradients of
    sum(d_out * out) + sum(d_lse * lse); d_lse=None is the oracle without the term."""
    for case in range(3):
        rng = np.random.default_rng(seed_of("lse-numpy", backend, rank, case))
        p = random_problem(rng, rank)
        out, lse = NA[rank](p["q"], p["k"], p["v"], p["ks"], stride=p["st"], dilation=p["dil"],
                            is_causal=p["causal"], additional_keys=p["add_k"],
                            additional_values=p["add_v"], backend=backend, return_lse=True)
        d_out = randn(rng, out.shape)
        d_lse = 2.0 * randn(rng, lse.shape)
        kw = dict(stride=p["st"], dilation=p["dil"], is_causal=p["causal"],
                  additional_keys=p["add_k"], additional_values=p["add_v"], backend=backend)
        args = (p["q"], p["k"], p["v"], p["ks"], p["st"], p["dil"], p["causal"], None,
                p["add_k"], p["add_v"])
        names = ["dq", "dk", "dv"] + (["d_add_k", "d_add_v"] if p["add_k"] is not None else [])
        for dl in (d_lse, None):
            grads = fna.na_backward(d_out, p["q"], p["k"], p["v"], out, lse, p["ks"], d_lse=dl,
                                    **kw)
            ref = dense_na(*args, d_out=d_out, d_lse=dl)
            for g, name in zip(grads, names):
                check_close(g, ref[name], what=f"{name} d_lse={'given' if dl is not None else None}")
        with_term, without = dense_na(*args, d_out=d_out, d_lse=d_lse), dense_na(*args, d_out=d_out)
        assert np.abs(with_term["dq"] - without["dq"]).max() > 1e-3 * np.abs(with_term["dq"]).max()


def test_torch_na_backward_d_lse_matches_autograd():
    """fna.na_backward on torch tensors with d_lse (a strided view, too) gives autograd's
    gradients of sum(d_out * out) + sum(d_lse * lse)."""
    rng = np.random.default_rng(seed_of("lse-torch-direct"))
    p = fixed_problems(2)["gqa"]
    t = leaves_of(p)
    out, lse = run_fna(t, "cpu")
    d_out = torch.from_numpy(randn(rng, out.shape))
    d_lse_hf = torch.from_numpy(randn(rng, (lse.shape[0], lse.shape[-1]) + tuple(lse.shape[1:-1])))
    d_lse = d_lse_hf.permute(0, 2, 3, 1)  # heads-first buffer seen heads-last: not contiguous
    assert not d_lse.is_contiguous()
    auto = grads_of(t, (out * d_out).sum() + (lse * d_lse).sum())
    for backend in ("reference", "cpu"):
        grads = fna.na_backward(d_out, t["q"].detach(), t["k"].detach(), t["v"].detach(),
                                out.detach(), lse.detach(), p["ks"], additional_keys=t["add_k"].detach(),
                                additional_values=t["add_v"].detach(), backend=backend,
                                d_lse=d_lse)
        for g, n in zip(grads, NAMES):
            check_close(g.numpy(), auto[n].numpy(), what=f"{backend} d{n}")


def test_compile_traces_the_lse_gradient():
    """torch.compile(fullgraph=True) traces the op with a loss on the LSE (the fake kernels and
    the backward op's d_lse argument); gradients match eager."""
    torch._dynamo.reset()
    rng = np.random.default_rng(seed_of("lse-compile"))
    p = fixed_problems(2)["causal"]
    te, tc = leaves_of(p), leaves_of(p)
    w_out, w_lse = (torch.from_numpy(x.astype(np.float32)) for x in (
        rng.standard_normal(p["q"].shape[:-1] + (p["v"].shape[-1],)),
        rng.standard_normal(p["q"].shape[:-1])))

    def f(q, k, v, ak, av):
        out, lse = fna.na2d(q, k, v, p["ks"], is_causal=p["causal"], additional_keys=ak,
                            additional_values=av, backend="cpu", return_lse=True)
        return (out * w_out).sum() + (lse * w_lse).sum() + lse.square().sum()

    le = f(*(te[n] for n in NAMES))
    lc = torch.compile(f, fullgraph=True, backend="aot_eager")(*(tc[n] for n in NAMES))
    ge = torch.autograd.grad(le, [te[n] for n in NAMES])
    gc = torch.autograd.grad(lc, [tc[n] for n in NAMES])
    for n, a, b in zip(NAMES, gc, ge):
        check_close(a.numpy(), b.numpy(), what=f"compiled d{n}")
