"""Query regions (``query_offset``): the queries are a box of the key grid, windows are the whole
grid's, and only the box's queries are computed. On every backend (reference, cpu; cuda-naive and
cuda-fused on a GPU, with every forward and backward kernel family that takes a region), forward,
LSE and gradients are checked against the float64 oracle of the whole grid: the box's rows of
its output / LSE / dQ, and dK / dV (and the additional keys' gradients) with the output gradient
zero outside the box. Also the errors at the boundary."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import seed_of  # noqa: E402
from test_torch import np64, oracle  # noqa: E402

NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}

# (grid shape, kernel, dilation, stride, causal, B, H, H_kv, D, D_v, additional keys,
#  region offset, region shape)
CASES = [
    ((40,), (7,), (2,), (1,), (False,), 2, 4, 2, 16, 24, 0, (9,), (17,)),
    ((37,), (9,), (1,), (3,), (True,), 1, 2, 1, 32, 32, 3, (0,), (20,)),
    ((64,), (5,), (3,), (2,), (False,), 1, 2, 2, 16, 16, 0, (41,), (23,)),
    ((18, 21), (5, 7), (2, 1), (1, 2), (False, True), 1, 3, 3, 16, 16, 0, (5, 3), (9, 11)),
    ((16, 16), (7, 7), (1, 2), (1, 1), (False, False), 2, 2, 1, 32, 16, 2, (0, 6), (16, 10)),
    ((13, 17), (3, 5), (1, 1), (3, 1), (True, False), 1, 2, 2, 16, 32, 0, (7, 0), (6, 17)),
    ((6, 9, 10), (3, 5, 3), (1, 1, 2), (1, 2, 1), (True, False, False), 1, 2, 1, 16, 16, 0,
     (2, 1, 3), (3, 7, 6)),
    ((8, 8, 8), (5, 3, 3), (1, 2, 1), (2, 1, 1), (False, False, True), 1, 2, 2, 32, 32, 1,
     (3, 0, 2), (5, 8, 4)),
]
IDS = [f"r{len(c[0])}-{i}" for i, c in enumerate(CASES)]


def _tensors(case, dtype, device, tag):
    shape, ks, dil, st, causal, B, H, Hkv, D, Dv, n_add, off, ext = case
    rng = np.random.default_rng(seed_of("region", tag, case, str(dtype)))

    def rand(*s):
        return torch.from_numpy(rng.standard_normal(s).astype(np.float32)).to(device, dtype)
    t = dict(q=rand(B, *shape, H, D), k=rand(B, *shape, Hkv, D), v=rand(B, *shape, Hkv, Dv),
             add_k=rand(B, n_add, Hkv, D) if n_add else None,
             add_v=rand(B, n_add, Hkv, Dv) if n_add else None,
             ks=list(ks), st=list(st), dil=list(dil), causal=list(causal))
    box = (slice(None),) + tuple(slice(o, o + e) for o, e in zip(off, ext))
    g = rand(B, *ext, H, Dv)  # the loss's gradient on the region's output
    gl = rand(B, *ext, H)     # ... and on its LSE
    return t, box, g, gl


def _expected(t, box, g, gl, ext):
    """The float64 oracle of the whole grid with the gradients zero outside the box: its box rows
    of output, LSE and dQ, and its dK, dV, dK_add, dV_add."""
    full_g = torch.zeros(t["q"].shape[:-1] + (t["v"].shape[-1],), dtype=torch.float64)
    full_g[box] = g.double().cpu()
    ref = oracle(t, d_out=full_g)
    # The LSE's gradient: d LSE_i / d s_ij = P_ij adds P_ij * gl_i to dS_ij; the oracle has no
    # d_lse input, so the LSE term is checked separately (test_lse_gradient.py covers it for
    # whole grids); here the loss uses the output alone.
    return ref


def _run(t, case, box, g, backend, **kw):
    shape, ks, dil, st, causal = case[:5]
    off = case[11]
    rank = len(shape)
    q = t["q"][box].detach().clone().requires_grad_(True)
    k = t["k"].detach().clone().requires_grad_(True)
    v = t["v"].detach().clone().requires_grad_(True)
    ak = None if t["add_k"] is None else t["add_k"].detach().clone().requires_grad_(True)
    av = None if t["add_v"] is None else t["add_v"].detach().clone().requires_grad_(True)
    out, lse = NA[rank](q, k, v, list(ks), stride=list(st), dilation=list(dil),
                        is_causal=list(causal), additional_keys=ak, additional_values=av,
                        backend=backend, return_lse=True, query_offset=list(off), **kw)
    assert tuple(out.shape) == tuple(q.shape[:-1]) + (v.shape[-1],)
    assert tuple(lse.shape) == tuple(q.shape[:-1])
    out.backward(g)
    grads = dict(dq=q.grad, dk=k.grad, dv=v.grad)
    if ak is not None:
        grads.update(d_add_k=ak.grad, d_add_v=av.grad)
    return out, lse, grads


def _check(out, lse, grads, ref, box, tol):
    def close(a, b, what, t):
        a = np64(a)
        mag = max(1.0, float(np.abs(b).max()))
        err = float(np.abs(a - b).max())
        assert np.isfinite(a).all(), f"{what}: non-finite entries"
        assert err <= t * mag, f"{what}: max error {err:.3g} > {t * mag:.3g}"
    close(out, ref["out"][box], "output", tol)
    close(lse, ref["lse"][box], "lse", min(tol, 1e-3))
    close(grads["dq"], ref["dq"][box], "dq", tol)
    for name in ("dk", "dv", "d_add_k", "d_add_v"):
        if name in grads:
            close(grads[name], ref[name], name, tol)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_region_cpu(backend, case):
    t, box, g, gl = _tensors(case, torch.float32, "cpu", backend)
    out, lse, grads = _run(t, case, box, g, backend)
    _check(out, lse, grads, _expected(t, box, g, gl, case[12]), box, 1e-5)


def test_region_is_the_whole_call_rows():
    """On the cpu backend the region's output and LSE are the whole call's rows (same kernels,
    same per-query arithmetic), and a region that is the whole grid is the plain call."""
    case = CASES[4]
    t, box, g, _ = _tensors(case, torch.float32, "cpu", "rows")
    shape, ks, dil, st, causal = case[:5]
    kw = dict(stride=st, dilation=dil, is_causal=causal, additional_keys=t["add_k"],
              additional_values=t["add_v"], backend="cpu", return_lse=True)
    full_o, full_l = fna.na2d(t["q"], t["k"], t["v"], ks, **kw)
    o, l = fna.na2d(t["q"][box].contiguous(), t["k"], t["v"], ks, query_offset=case[11], **kw)
    torch.testing.assert_close(o, full_o[box], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(l, full_l[box], rtol=1e-6, atol=1e-6)
    o0, l0 = fna.na2d(t["q"], t["k"], t["v"], ks, query_offset=(0, 0), **kw)
    assert torch.equal(o0, full_o) and torch.equal(l0, full_l)


def test_region_numpy():
    """The NumPy path takes query_offset too (forward and na_backward)."""
    case = CASES[0]
    t, box, g, _ = _tensors(case, torch.float32, "cpu", "numpy")
    shape, ks, dil, st, causal = case[:5]
    kw = dict(stride=st, dilation=dil, is_causal=causal, backend="cpu")
    q = t["q"][box].numpy().copy()
    k, v = t["k"].numpy(), t["v"].numpy()
    out, lse = fna.na1d(q, k, v, ks, return_lse=True, query_offset=case[11], **kw)
    ref = _expected(t, box, g, None, case[12])
    np.testing.assert_allclose(out, ref["out"][box], atol=1e-5)
    dq, dk, dv = fna.na_backward(g.numpy(), q, k, v, out, lse, ks, query_offset=case[11], **kw)
    np.testing.assert_allclose(dq, ref["dq"][box], atol=1e-5)
    np.testing.assert_allclose(dk, ref["dk"], atol=1e-5)
    np.testing.assert_allclose(dv, ref["dv"], atol=1e-5)


def test_region_errors():
    q = torch.randn(1, 8, 8, 2, 16)
    k = torch.randn(1, 12, 12, 2, 16)
    with pytest.raises(ValueError, match=r"query_offset\[0\]=12"):
        fna.na2d(q, k, k, 3, query_offset=(12, 0), backend="cpu")
    with pytest.raises(ValueError, match=r"query_shape\[1\]=8"):
        fna.na2d(q, k, k, 3, query_offset=(0, 5), backend="cpu")
    with pytest.raises(ValueError, match="query_offset"):
        fna.na2d(q, k, k, 3, query_offset=(1, 2, 3), backend="cpu")
    with pytest.raises(TypeError, match="query_offset"):
        fna.na2d(q, k, k, 3, query_offset="x", backend="cpu")
    with pytest.raises(ValueError, match="key has shape"):  # no region: shapes must agree
        fna.na2d(q, k, k, 3, backend="cpu")



@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_region_with_rpb(backend):
    """A relative positional bias with a query region (the CPU backends add both natively): the
    region's rows of the whole-grid call, forward and gradients (dK, dV, d_rpb: the whole call's
    with dO zero outside the region)."""
    g = torch.Generator().manual_seed(seed_of("region-rpb", backend))
    B, shape, H, D, ks = 2, (9, 11), 4, 8, (3, 5)
    kw = dict(dilation=(2, 1), is_causal=(False, True), backend=backend)
    x = {n: torch.randn(B, *shape, H, D, generator=g) for n in ("q", "k", "v")}
    x["rpb"] = torch.randn(H, 5, 9, generator=g)
    d_out = torch.randn(B, *shape, H, D, generator=g)
    off, ext = (2, 3), (5, 6)
    rows = (slice(None), slice(off[0], off[0] + ext[0]), slice(off[1], off[1] + ext[1]))
    whole = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    out = fna.na2d(whole["q"], whole["k"], whole["v"], ks, rpb=whole["rpb"], **kw)
    mask = torch.zeros_like(d_out)
    mask[rows] = 1
    (out * d_out * mask).sum().backward()
    part = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    q_region = part["q"][rows].detach().requires_grad_(True)
    out_r = fna.na2d(q_region, part["k"], part["v"], ks, rpb=part["rpb"], query_offset=off,
                     **kw)
    (out_r * d_out[rows]).sum().backward()
    torch.testing.assert_close(out_r, out[rows].detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q_region.grad, whole["q"].grad[rows], rtol=1e-5, atol=1e-5)
    for n in ("k", "v", "rpb"):
        torch.testing.assert_close(part[n].grad, whole[n].grad, rtol=1e-4, atol=1e-5)


# ---- GPU ------------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# Outputs and gradients of order one, relative to max(1, max |ref|): 16-bit rounding of the
# inputs' products dominates (bf16 8 bits of mantissa).
GPU_TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def _gpu_variants():
    """(name, keywords): the plan's own choice and each kernel family forced."""
    v = [("auto", {}), ("mma_sync", {"tuning": {"fwd_schedule": "mma_sync", "bwd_kernel": "sm80"}}),
         ("deterministic", {"deterministic": True})]
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        v += [("sm90_plain", {"tuning": {"fwd_schedule": "plain", "bwd_kernel": "sm90"}}),
              ("sm90_ws", {"tuning": {"fwd_schedule": "warp_specialized",
                                      "bwd_kernel": "sm90ws"}}),  # TMA where it applies
              ("sm90_ws_cp", {"tuning": {"fwd_schedule": "warp_specialized",
                                         "fwd_copy": "cp_async", "bwd_kernel": "sm90ws",
                                         "bwd_copy": "cp_async"}})]
    return v


@gpu
@pytest.mark.parametrize("variant", _gpu_variants(), ids=lambda v: v[0])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_region_cuda_fused(case, dtype, variant):
    name, kw = variant
    if dtype == torch.float32 and name.startswith("sm90"):
        pytest.skip("the wgmma kernels take 16-bit tensors")
    t, box, g, gl = _tensors(case, dtype, "cuda", "fused")
    out, lse, grads = _run(t, case, box, g, "cuda-fused", **kw)
    _check(out, lse, grads, _expected(t, box, g, gl, case[12]), box, GPU_TOL[dtype])


@gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_region_cuda_naive(case):
    t, box, g, gl = _tensors(case, torch.float32, "cuda", "naive")
    out, lse, grads = _run(t, case, box, g, "cuda-naive")
    _check(out, lse, grads, _expected(t, box, g, gl, case[12]), box, 1e-4)


@gpu
def test_region_plan_excludes_whole_grid_kernels():
    """With a query region the plan runs a tiled kernel (the strip, box and SIMT forwards compute
    whole grids), also where tuning asks for them, and the result is still the whole call's
    rows."""
    g = torch.Generator(device="cuda").manual_seed(seed_of("region-plan"))
    q = torch.randn(2, 56, 56, 3, 32, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(2, 56, 56, 3, 32, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(2, 56, 56, 3, 32, device="cuda", dtype=torch.bfloat16, generator=g)
    full = fna.na2d(q, k, v, 7)
    box = (slice(None), slice(20, 40), slice(0, 56))
    # "on" asks for those forwards wherever they apply; with a region they apply nowhere.
    for tuning in (None, {"fwd_strip": "on"}, {"fwd_simt": "on"}, {"fwd_box": "on"}):
        out = fna.na2d(q[box], k, v, 7, query_offset=(20, 0), tuning=tuning)
        assert (out.float() - full[box].float()).abs().max().item() <= 2e-2
        plan = fna.fused_plan((2, 20, 56, 3, 32), 7, query_offset=(20, 0), grid_shape=(56, 56),
                              tuning=tuning)
        assert plan["family"] in ("sm80", "sm90", "sm90ws"), plan


@gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs compute capability 9.0")
def test_region_tma():
    """The warp-specialized Hopper kernels load a region's Q (and dO) by TMA, their maps spanning
    the region: a 3-D region at an offset on every axis, against the whole call's rows, forward
    and backward, with TMA asked for (an error where it cannot load the tiles)."""
    tuning = {"fwd_schedule": "warp_specialized", "fwd_copy": "tma", "bwd_kernel": "sm90ws",
              "bwd_copy": "tma"}
    grid, off, ext, ks = (12, 16, 24), (3, 5, 8), (6, 9, 13), (5, 7, 9)
    plan = fna.fused_plan((1, *ext, 4, 64), ks, query_offset=off, grid_shape=grid, tuning=tuning)
    assert plan["copy"] == "tma" and plan["backward_copy"] == "tma", plan
    g = torch.Generator(device="cuda").manual_seed(seed_of("region-tma"))
    q, k, v = (torch.randn((1, *grid, 4, 64), device="cuda", dtype=torch.bfloat16,
                           generator=g).requires_grad_() for _ in range(3))
    box = (slice(None),) + tuple(slice(o, o + e) for o, e in zip(off, ext))
    d_out = torch.randn((1, *ext, 4, 64), device="cuda", dtype=torch.bfloat16, generator=g)
    full = fna.na3d(q, k, v, ks)
    full_g = torch.zeros_like(full)
    full_g[box] = d_out
    dq_f, dk_f, dv_f = torch.autograd.grad(full, (q, k, v), full_g)
    qr = q.detach()[box].clone().requires_grad_()
    out = fna.na3d(qr, k, v, ks, query_offset=off, tuning=tuning)
    dq, dk, dv = torch.autograd.grad(out, (qr, k, v), d_out)
    for a, b, name in ((out, full[box], "out"), (dq, dq_f[box], "dq"), (dk, dk_f, "dk"),
                       (dv, dv_f, "dv")):
        err = (a.float() - b.float()).abs().max().item()
        assert err <= 3e-2 * max(1.0, b.float().abs().max().item()), (name, err)


def test_region_under_torch_compile():
    """torch.compile(fullgraph=True) traces a region call and its backward (the custom ops' fake
    kernels give the region's shapes) and matches eager."""
    case = CASES[3]
    t, box, g, _ = _tensors(case, torch.float32, "cpu", "compile")
    shape, ks, dil, st, causal = case[:5]
    off = case[11]

    def f(q, k, v):
        out, lse = fna.na2d(q, k, v, ks, stride=st, dilation=dil, is_causal=causal,
                            return_lse=True, query_offset=off, backend="cpu")
        return out * 2.0, lse

    q = t["q"][box].clone().requires_grad_()
    k, v = t["k"].clone().requires_grad_(), t["v"].clone().requires_grad_()
    out_e, lse_e = f(q, k, v)
    grads_e = torch.autograd.grad(out_e, (q, k, v), g)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out_c, lse_c = compiled(q, k, v)
    grads_c = torch.autograd.grad(out_c, (q, k, v), g)
    assert out_c.shape == q.shape[:-1] + (v.shape[-1],)
    torch.testing.assert_close(out_c, out_e)
    torch.testing.assert_close(lse_c, lse_e)
    for a, b in zip(grads_c, grads_e):
        torch.testing.assert_close(a, b)
