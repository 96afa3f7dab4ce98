"""The torch path: forward, autograd, low precision, unfused ops, torch.compile, modules.

About gradient checking. ``torch.autograd.gradcheck`` needs float64 inputs, and the C++ API does
not take float64 (float32 / float16 / bfloat16 only), so it cannot be run on fna's op itself; running
it on float32 with loosened tolerances would prove little. What is done instead:
  * test_oracle.py checks the dense oracle's analytic gradients against float64 finite differences
    (and with ``torch.autograd.gradcheck`` on a float64 torch transcription of the oracle);
  * here, fna's autograd gradients (float32) are compared with the oracle's float64 gradients at
    the same inputs, with the float32 criterion of SPEC section 4 (1e-5 relative);
  * test_finite_differences_float32 checks a directional derivative of fna's own float32 forward
    with central differences, with a tolerance computed from float32's rounding and the step.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import EPS, check_close, dense_na, dense_qk, full_mask, seed_of  # noqa: E402
from test_numpy import random_problem  # noqa: E402

NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}
QK = {1: fna.na1d_qk, 2: fna.na2d_qk, 3: fna.na3d_qk}
AV = {1: fna.na1d_av, 2: fna.na2d_av, 3: fna.na3d_av}
TORCH_DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def to_torch(p, dtype=torch.float32, requires_grad=False):
    """The numpy problem as torch tensors (keeping non-contiguous strides)."""
    t = dict(p)
    for name in ("q", "k", "v", "add_k", "add_v"):
        if p[name] is not None:
            x = torch.from_numpy(np.asarray(p[name], np.float32)).to(dtype)
            t[name] = x.requires_grad_(requires_grad)
    return t


def run_na(t, backend=None, scale=None, return_lse=False):
    rank = t["q"].dim() - 3
    return NA[rank](t["q"], t["k"], t["v"], t["ks"], stride=t["st"], dilation=t["dil"],
                    is_causal=t["causal"], scale=scale, additional_keys=t["add_k"],
                    additional_values=t["add_v"], backend=backend, return_lse=return_lse)


def oracle(t, scale=None, d_out=None):
    f = lambda x: None if x is None else x.detach().cpu().double().numpy()  # noqa: E731
    return dense_na(f(t["q"]), f(t["k"]), f(t["v"]), t["ks"], t["st"], t["dil"], t["causal"],
                    scale, f(t["add_k"]), f(t["add_v"]), None if d_out is None else f(d_out))


def np64(x):
    return x.detach().cpu().double().numpy()


@pytest.mark.parametrize("backend", [None, "reference", "cpu"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_forward_and_autograd(backend, rank):
    """Forward, LSE and autograd gradients (incl. additional KV, GQA, D_v != D, strided views)
    against the float64 oracle."""
    for case in range(5):
        rng = np.random.default_rng(seed_of("torch", rank, case))
        t = to_torch(random_problem(rng, rank), requires_grad=True)
        out, lse = run_na(t, backend, return_lse=True)
        assert out.dtype == torch.float32 and lse.dtype == torch.float32
        assert lse.requires_grad  # differentiable (test_lse_gradient.py checks its gradient)
        d_out = torch.from_numpy(rng.standard_normal(out.shape).astype(np.float32))
        out.backward(d_out)
        ref = oracle(t, d_out=d_out)
        check_close(np64(out), ref["out"], what="output")
        check_close(np64(lse), ref["lse"], what="lse")
        pairs = [("q", "dq"), ("k", "dk"), ("v", "dv")]
        if t["add_k"] is not None:
            pairs += [("add_k", "d_add_k"), ("add_v", "d_add_v")]
        for name, g in pairs:
            assert t[name].grad is not None, f"no gradient for {name}"
            check_close(np64(t[name].grad), ref[g], what=g)


def naive_low_precision(t, dtype, scale=None):
    """Dense masked attention computed plainly in `dtype` (the SPEC's `out_naive`)."""
    q = t["q"].to(dtype)
    r = q.dim() - 3
    H, D = q.shape[-2], q.shape[-1]
    mask = torch.from_numpy(full_mask(q.shape[1:1 + r], t["ks"], t["st"], t["dil"], t["causal"]))

    def flat(x):
        x = x.to(dtype)
        return x.reshape(x.shape[0], -1, x.shape[-2], x.shape[-1]).transpose(1, 2)

    Q = flat(q)
    K = flat(t["k"]).repeat_interleave(H // t["k"].shape[-2], 1)
    V = flat(t["v"]).repeat_interleave(H // t["v"].shape[-2], 1)
    if t["add_k"] is not None:
        rep = H // t["add_k"].shape[2]
        K = torch.cat([K, t["add_k"].to(dtype).transpose(1, 2).repeat_interleave(rep, 1)], 2)
        V = torch.cat([V, t["add_v"].to(dtype).transpose(1, 2).repeat_interleave(rep, 1)], 2)
        mask = torch.cat([mask, torch.ones(mask.shape[0], t["add_k"].shape[1], dtype=torch.bool)], 1)
    S = (Q @ K.transpose(-1, -2)) * (D ** -0.5 if scale is None else scale)
    S = S.masked_fill(~mask, float("-inf"))
    P = torch.softmax(S, dim=-1)
    O = P @ V
    return O.transpose(1, 2).reshape(tuple(q.shape[:-1]) + (V.shape[-1],))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_low_precision(dtype, backend):
    """float16 / bfloat16 forward and backward against the oracle, SPEC section 4 criterion."""
    for rank in (1, 2, 3):
        rng = np.random.default_rng(seed_of("lowp", dtype, rank))
        t = to_torch(random_problem(rng, rank), TORCH_DTYPE[dtype], requires_grad=True)
        check_low_precision(t, dtype, backend, rng, f"rank {rank}")


def check_low_precision(t, dtype, backend, rng, what):
    """Forward and backward of the problem `t` (tensors on any device) in `dtype`: errors against
    the float64 oracle within 2x those of the same dense computation done plainly in `dtype`
    (on the CPU) plus 2 ulp."""
    out = run_na(t, backend)
    assert out.dtype == TORCH_DTYPE[dtype]
    ref = oracle(t)
    cpu = {n: (x.detach().cpu() if isinstance(x, torch.Tensor) else x) for n, x in t.items()}
    with torch.no_grad():
        naive = naive_low_precision(cpu, TORCH_DTYPE[dtype])
    check_close(np64(out), ref["out"], dtype, naive=np64(naive), what=f"{what} output")
    # Backward: the naive low-precision gradient is the same dense computation in `dtype`.
    d_out = torch.from_numpy(rng.standard_normal(out.shape).astype(np.float32)).to(out.dtype)
    out.backward(d_out.to(out.device))
    ref = oracle(t, d_out=d_out)
    leaves = {n: cpu[n].clone().requires_grad_(True)
              for n in ("q", "k", "v", "add_k", "add_v") if cpu[n] is not None}
    naive = naive_low_precision(dict(cpu, **leaves), TORCH_DTYPE[dtype])
    naive.backward(d_out)
    grads = [("q", "dq"), ("k", "dk"), ("v", "dv")]
    if t["add_k"] is not None:
        grads += [("add_k", "d_add_k"), ("add_v", "d_add_v")]
    for name, g in grads:
        check_close(np64(t[name].grad), ref[g], dtype, naive=np64(leaves[name].grad),
                    what=f"{what} {g}")


def test_finite_differences_float32():
    """Directional derivative of fna's float32 forward, by central differences, against autograd.

    With step h along a unit direction u, the central difference of f = sum(w * out) has error
    <= h^2/6 * |f'''| + eps_f / h, where eps_f bounds the float32 rounding of f (a few ulp of each
    of the N outputs: N * 4 * 2^-24 * max|w * out|). f''' is estimated from a second step size
    (the difference of the two estimates), so the bound is computed, not guessed."""
    rng = np.random.default_rng(seed_of("fd32"))
    p = random_problem(rng, 2, max_len=6)
    t = to_torch(p, requires_grad=True)
    out = run_na(t, "reference")
    w = torch.from_numpy(rng.standard_normal(out.shape).astype(np.float32))
    (out * w).sum().backward()
    leaves = [n for n in ("q", "k", "v", "add_k", "add_v") if t[n] is not None]
    dirs = {n: torch.from_numpy(rng.standard_normal(t[n].shape).astype(np.float32)) for n in leaves}
    norm = math.sqrt(sum(float((d.double() ** 2).sum()) for d in dirs.values()))
    dirs = {n: d / norm for n, d in dirs.items()}
    analytic = sum(float((t[n].grad.double() * dirs[n].double()).sum()) for n in leaves)

    def f(h):
        moved = dict(t, **{n: (t[n].detach() + h * dirs[n]) for n in leaves})
        with torch.no_grad():
            o = run_na(moved, "reference")
        return float((o.double() * w.double()).sum())

    def central(h):
        return (f(h) - f(-h)) / (2 * h)

    h = 1e-2
    est, est2 = central(h), central(2 * h)
    n_out = out.numel()
    eps_f = n_out * 4 * 2.0 ** -24 * float((out.detach().abs() * w.abs()).max())
    trunc = abs(est2 - est) / 3.0  # (4 - 1) h^2 f'''/6: the h^2 term measured from two steps
    bound = 2 * (trunc + 2 * eps_f / h)
    assert abs(est - analytic) <= bound, (est, analytic, bound)
    assert abs(analytic) > 10 * bound, "the derivative must be well above the error budget"


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_unfused_autograd(rank):
    """softmax(qk * scale) -> av equals na{r}d, and so do their autograd gradients;
    qk's values follow the documented neighbor order."""
    rng = np.random.default_rng(seed_of("unfused-torch", rank))
    p = random_problem(rng, rank)
    t1 = to_torch(p, requires_grad=True)
    t2 = to_torch(p, requires_grad=True)
    sp = dict(stride=p["st"], dilation=p["dil"], is_causal=p["causal"], backend="cpu")
    attn = QK[rank](t1["q"], t1["k"], p["ks"], additional_keys=t1["add_k"], **sp)
    check_close(np64(attn), dense_qk(p["q"], p["k"], p["ks"], p["st"], p["dil"], p["causal"],
                                     p["add_k"]), what="qk")
    scale = p["q"].shape[-1] ** -0.5
    out1 = AV[rank](torch.softmax(attn * scale, -1), t1["v"], p["ks"],
                    additional_values=t1["add_v"], **sp)
    out2 = run_na(t2, "cpu")
    check_close(np64(out1), np64(out2).astype(np.float64), what="qk -> av vs na")
    d_out = torch.from_numpy(rng.standard_normal(out1.shape).astype(np.float32))
    out1.backward(d_out)
    out2.backward(d_out)
    ref = oracle(t2, d_out=d_out)
    for name, g in (("q", "dq"), ("k", "dk"), ("v", "dv"), ("add_k", "d_add_k"),
                    ("add_v", "d_add_v")):
        if t1[name] is not None:
            check_close(np64(t1[name].grad), ref[g], what=f"unfused {g}")
            check_close(np64(t2[name].grad), ref[g], what=f"fused {g}")


def test_compile_fullgraph():
    """torch.compile(fullgraph=True) traces na2d (with additional KV and LSE) and its backward
    without graph breaks (fullgraph raises on one) and gives the eager results."""
    torch._dynamo.reset()
    rng = np.random.default_rng(seed_of("compile"))
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 5, 6, 2, 8)).astype(np.float32))
               for _ in range(3))
    ak, av = (torch.from_numpy(rng.standard_normal((1, 2, 2, 8)).astype(np.float32))
              for _ in range(2))

    def f(q, k, v, ak, av):
        out, lse = fna.na2d(q, k, v, (3, 4), stride=(1, 2), dilation=(1, 1), is_causal=(True, False),
                            additional_keys=ak, additional_values=av, return_lse=True)
        return out * 2.0, lse

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    leaves_c = [x.clone().requires_grad_(True) for x in (q, k, v, ak, av)]
    leaves_e = [x.clone().requires_grad_(True) for x in (q, k, v, ak, av)]
    out_c, lse_c = compiled(*leaves_c)
    out_e, lse_e = f(*leaves_e)
    assert torch.equal(out_c, out_e) and torch.equal(lse_c, lse_e)
    out_c.sum().backward()
    out_e.sum().backward()
    # The cpu backward sums dK / dV partials from threads in run-dependent order, so gradients
    # agree to float32 rounding, not bitwise.
    for a, b in zip(leaves_c, leaves_e):
        check_close(np64(a.grad), np64(b.grad), what="compiled vs eager gradient")

    # The unfused chain compiles too.
    def g(q, k, v):
        a = fna.na2d_qk(q, k, 3)
        return fna.na2d_av(torch.softmax(a * 8 ** -0.5, -1), v, 3)

    out_g = torch.compile(g, fullgraph=True, backend="aot_eager")(q, k, v)
    torch.testing.assert_close(out_g, fna.na2d(q, k, v, 3), rtol=1e-5, atol=1e-5)


def test_compile_inductor():
    """The default (inductor) backend also compiles the ops and their backward (no pointwise ops
    around them, so no C++ code generation is needed and the test stays fast)."""
    torch._dynamo.reset()
    rng = np.random.default_rng(seed_of("inductor"))
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 6, 4, 2, 4)).astype(np.float32))
               .requires_grad_(True) for _ in range(3))
    f = torch.compile(lambda q, k, v: fna.na2d(q, k, v, 3), fullgraph=True)
    out = f(q, k, v)
    out.sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    ref = fna.na2d(q, k, v, 3)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    for g, x in zip(grads, (q, k, v)):
        torch.testing.assert_close(g, x.grad)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_modules(rank):
    """NeighborhoodAttention{r}D: shapes, gradients for every parameter, and the output equals
    qkv projection -> oracle attention -> output projection computed in float64."""
    torch.manual_seed(seed_of("module", rank))
    shape = {1: (11,), 2: (5, 7), 3: (4, 3, 5)}[rank]
    cls = getattr(fna, f"NeighborhoodAttention{rank}D")
    m = cls(dim=12, num_heads=3, kernel_size=3, dilation=1, is_causal=(rank == 1))
    x = torch.randn(2, *shape, 12, requires_grad=True)
    y = m(x)
    assert y.shape == x.shape
    y.square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, prm in m.named_parameters():
        assert prm.grad is not None and torch.isfinite(prm.grad).all(), name
    with torch.no_grad():
        qkv = (x.double() @ m.qkv.weight.double().T + m.qkv.bias.double())
        qkv = qkv.unflatten(-1, (3, 3, 4)).numpy()
        ref = dense_na(qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :], [3] * rank,
                       causal=[rank == 1] * rank, scale=4 ** -0.5)["out"]
        ref = torch.from_numpy(ref).flatten(-2) @ m.proj.weight.double().T + m.proj.bias.double()
    check_close(np64(y), ref.numpy(), what="module output")
    assert "kernel_size=(3" in repr(m)


def test_module_options():
    m = fna.NeighborhoodAttention2D(8, 2, (3, 5), stride=(1, 2), dilation=(2, 1),
                                    qkv_bias=False, qk_scale=0.3, proj_drop=0.5)
    assert m.qkv.bias is None and m.scale == 0.3
    m.eval()
    x = torch.randn(1, 8, 9, 8)
    torch.testing.assert_close(m(x), m(x))  # dropout off in eval
    with pytest.raises(ValueError, match="multiple of num_heads"):
        fna.NeighborhoodAttention2D(10, 3, 3)
    with pytest.raises(ValueError, match="expected 4 dims"):
        m(torch.randn(1, 8, 8))


def test_heads_first_views():
    """Heads-first tensors passed as permuted views give the contiguous result."""
    rng = np.random.default_rng(seed_of("heads-first"))
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 3, 6, 5, 4)).astype(np.float32))
               for _ in range(3))  # [B, H, X, Y, D]
    views = [x.permute(0, 2, 3, 1, 4) for x in (q, k, v)]
    assert not views[0].is_contiguous()
    out = fna.na2d(*views, 3)
    ref = fna.na2d(*(x.contiguous() for x in views), 3)
    check_close(np64(out), np64(ref), what="heads-first view vs contiguous")


def test_negative_bit_tensors():
    """Tensors with torch's negative bit (the imaginary part of a conjugate: -values in memory)
    give the results of their values, in the fused op, its gradients and the unfused ops."""
    rng = np.random.default_rng(seed_of("neg-bit"))
    x = [torch.from_numpy(rng.standard_normal((1, 9, 2, 4)).astype(np.float32)) for _ in range(3)]

    def neg_bit(t):  # the same values, stored negated
        return torch.complex(torch.zeros_like(t), -t).conj().imag

    nb = [neg_bit(t) for t in x]
    assert all(t.is_neg() for t in nb) and torch.equal(nb[0], x[0])
    check_close(np64(fna.na1d(*nb, 3)), np64(fna.na1d(*x, 3)), what="negative-bit forward")
    check_close(np64(fna.na1d_qk(nb[0], nb[1], 3)), np64(fna.na1d_qk(x[0], x[1], 3)),
                what="negative-bit qk")
    a = [t.clone().requires_grad_() for t in x]
    b = [neg_bit(t).requires_grad_() for t in x]
    go = torch.from_numpy(rng.standard_normal((1, 9, 2, 4)).astype(np.float32))
    fna.na1d(*a, 3, is_causal=True).backward(go)
    fna.na1d(*b, 3, is_causal=True).backward(neg_bit(go))
    for ga, gb in zip(a, b):
        check_close(np64(gb.grad), np64(ga.grad), what="negative-bit gradients")


def test_lse_detached_and_summed_backward():
    """A detached LSE adds nothing to the gradient (that of the output alone); lse.sum() hands the
    op an expanded (all strides 0) LSE gradient, which gives the gradient of a dense one."""
    rng = np.random.default_rng(seed_of("lse-only"))
    x = torch.from_numpy(rng.standard_normal((1, 7, 2, 4)).astype(np.float32))
    q = x.clone().requires_grad_()
    out, lse = fna.na1d(q, q, q, 3, return_lse=True)
    (out.sum() + lse.detach().sum()).backward()
    q2 = x.clone().requires_grad_()
    fna.na1d(q2, q2, q2, 3).sum().backward()
    check_close(np64(q.grad), np64(q2.grad), what="detached LSE adds nothing")
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    fna.na1d(a, a, a, 3, return_lse=True)[1].sum().backward()
    lse_b = fna.na1d(b, b, b, 3, return_lse=True)[1]
    lse_b.backward(torch.ones_like(lse_b).contiguous())
    assert torch.isfinite(a.grad).all() and float(a.grad.abs().max()) > 0
    check_close(np64(a.grad), np64(b.grad), what="expanded vs dense LSE gradient")


def test_broadcast_gradient():
    """`out.sum().backward()` hands the op an expanded (all strides 0) gradient; it must give the
    same gradients as a dense tensor of ones."""
    rng = np.random.default_rng(seed_of("expanded-grad"))
    x = [torch.from_numpy(rng.standard_normal((2, 9, 2, 4)).astype(np.float32)) for _ in range(3)]
    a = [t.clone().requires_grad_(True) for t in x]
    b = [t.clone().requires_grad_(True) for t in x]
    fna.na1d(*a, 5, is_causal=True).sum().backward()
    out = fna.na1d(*b, 5, is_causal=True)
    out.backward(torch.ones_like(out).contiguous())
    for ga, gb in zip(a, b):
        check_close(np64(ga.grad), np64(gb.grad), what="expanded vs dense gradient")


def test_eager_fast_path_matches_custom_op():
    """Eager calls skip the custom op's dispatcher (fna._torch_ops.na_forward_call); outputs, LSE
    and gradients (deterministic backward) must be bitwise those of torch.ops.fna.na_forward with
    its registered autograd, with and without autograd recording, a loss on the LSE included;
    the backward is once-differentiable like the op's."""
    from fna import _torch_ops
    for case in range(4):
        rng = np.random.default_rng(seed_of("eager-fast-path", case))
        p = random_problem(rng, 1 + case % 3)
        a, b = to_torch(p, requires_grad=True), to_torch(p, requires_grad=True)
        rank = a["q"].dim() - 3
        out_a, lse_a = NA[rank](a["q"], a["k"], a["v"], a["ks"], stride=a["st"],
                                dilation=a["dil"], is_causal=a["causal"],
                                additional_keys=a["add_k"], additional_values=a["add_v"],
                                backend="cpu", return_lse=True, deterministic=True)
        assert type(out_a.grad_fn).__name__.startswith("_NaEager")
        sp = (list(p["ks"]), list(p["st"]), list(p["dil"]), list(p["causal"]))
        scale = p["q"].shape[-1] ** -0.5
        out_b, lse_b = torch.ops.fna.na_forward(b["q"], b["k"], b["v"], b["add_k"], b["add_v"],
                                                *sp, scale, "cpu", "", True, False, "", "")
        assert torch.equal(out_a, out_b) and torch.equal(lse_a, lse_b)
        assert lse_a.requires_grad and lse_b.requires_grad
        d_out = torch.from_numpy(rng.standard_normal(out_a.shape).astype(np.float32))
        d_lse = torch.from_numpy(rng.standard_normal(lse_a.shape).astype(np.float32))
        ((out_a * d_out).sum() + (lse_a * d_lse).sum()).backward()
        ((out_b * d_out).sum() + (lse_b * d_lse).sum()).backward()
        for name in ("q", "k", "v", "add_k", "add_v"):
            if a[name] is not None:
                assert torch.equal(a[name].grad, b[name].grad), name
        with torch.no_grad():
            out_c = run_na(a, "cpu")
        assert out_c.grad_fn is None and torch.equal(out_c, out_a.detach())
    # Double backward: an error at the call that asks for it, as with the custom op.
    x = torch.from_numpy(np.random.default_rng(seed_of("eager-2nd")).standard_normal(
        (1, 7, 1, 4)).astype(np.float32)).requires_grad_()
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(fna.na1d(x, x, x, 3).square().sum(), x, create_graph=True)
    assert _torch_ops.na_forward_call is not None


def opcheck_all(device, backend):
    """torch.library.opcheck on each custom op: schema, autograd registration, fake (meta)
    implementation against the real one, and AOT dispatch with dynamic shapes."""
    gen = torch.Generator().manual_seed(seed_of("opcheck", device))
    r = lambda *s, g=True: (torch.randn(*s, generator=gen).to(device)  # noqa: E731
                            .requires_grad_(g))
    q, k, v = r(1, 6, 5, 2, 4), r(1, 6, 5, 1, 4), r(1, 6, 5, 1, 3)
    ak, av = r(1, 2, 1, 4), r(1, 2, 1, 3)
    sp = ([3, 3], [1, 2], [1, 1], [True, False])
    ops = torch.ops.fna
    # config, deterministic, allow_tf32, backward_config, tuning, num_threads
    fo = ("", False, False, "", "", 2)
    out, lse = ops.na_forward(q, k, v, ak, av, *sp, 0.5, backend, *fo)
    attn = ops.na_qk(q, k, ak, *sp, -1.0, backend)
    w = torch.softmax(attn.detach(), -1).requires_grad_(True)
    d = lambda x: x.detach()  # noqa: E731
    cases = [
        (ops.na_forward, (q, k, v, ak, av, *sp, 0.5, backend, *fo)),
        (ops.na_backward, (d(q), d(k), d(v), d(out), d(lse), r(*out.shape, g=False), None, d(ak),
                           d(av), *sp, 0.5, backend, *fo)),
        (ops.na_backward, (d(q), d(k), d(v), d(out), d(lse), r(*out.shape, g=False),
                           r(*lse.shape, g=False), d(ak), d(av), *sp, 0.5, backend, *fo)),
        (ops.na_qk, (q, k, ak, *sp, -1.0, backend)),
        (ops.na_qk_backward, (d(q), d(k), d(ak), r(*attn.shape, g=False), *sp, -1.0, backend)),
        (ops.na_av, (w, v, av, *sp, backend)),
        (ops.na_av_backward, (d(w), d(v), d(av), r(*out.shape, g=False), *sp, backend)),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op.default, args)
        assert all(v == "SUCCESS" for v in result.values()), (op, result)


def test_opcheck():
    opcheck_all("cpu", "cpu")


def test_module_compile():
    """A module traces with fullgraph=True (qkv linear, NA custom op, projection) and matches
    eager, forward and input gradient."""
    torch._dynamo.reset()
    torch.manual_seed(seed_of("module-compile"))
    m = fna.NeighborhoodAttention2D(16, 2, (3, 5), dilation=(1, 2), is_causal=(False, True))
    x = torch.randn(1, 6, 10, 16)
    xc, xe = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yc = torch.compile(m, fullgraph=True, backend="aot_eager")(xc)
    ye = m(xe)
    check_close(np64(yc), np64(ye), what="compiled module output")
    yc.square().sum().backward()
    ye.square().sum().backward()
    check_close(np64(xc.grad), np64(xe.grad), what="compiled module input gradient")
