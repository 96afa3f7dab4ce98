"""The fused backward at its edges, on the GPU: additional keys where every query's LSE is far
below zero (the rows past the last additional key must get P = 0 in every dK / dV family), and
the grid rows of the backward kernels (past 65535 they continue over blockIdx.z).
Skipped where torch sees no GPU."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import seed_of  # noqa: E402
from test_torch import TORCH_DTYPE, np64, oracle  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kernel,dim", [("sm80", 64), ("sm80", 256), ("sm90", 64), ("sm90", 128),
                                        ("sm90ws", 64), ("sm90ws", 128), ("sm90ws", 256)])
def test_additional_keys_with_lse_far_below_zero(kernel, dim, dtype):
    """Additional keys, with every score near -100 (so each query's LSE is too): the dK / dV
    kernels' additional-key tile has rows past the last additional key (zero K and V), whose P
    must be 0. Unmasked it was exp(-LSE), inf in a 16-bit dS (and past float32's range here), and
    inf times the zero K row made dQ NaN. Each backward family, named by tuning, against the float64
    oracle on the same rounded inputs. Every key here is near one vector (-1), so dQ = scale sum_j
    dS_j k_j cancels that component exactly (sum_j dS_j = 0) but not after dS is rounded to 16
    bits: dQ's error grows as eps * scale * sum_j |dS_j| |k_j|, and bfloat16 (8 bits of
    mantissa) gets a wider bound (3.1-3.7% of the largest gradient on an H200, 2026-11-27)."""
    if kernel != "sm80" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma backward families need compute capability 9.0")
    tdt = TORCH_DTYPE[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed_of("lse-below-zero", kernel, dim, dtype))

    def near(sign, *shape):  # sign * (1 + 0.1 u), u uniform in [-1, 1): random, never zero
        u = torch.rand(shape, device="cuda", generator=g) * 2 - 1
        return (sign * (1 + 0.1 * u)).to(tdt).requires_grad_()

    b, n, h, n_add, ks = 2, 150, 2, 3, 7
    q, k, ak = near(1.0, b, n, h, dim), near(-1.0, b, n, h, dim), near(-1.0, b, n_add, h, dim)
    v = torch.randn(b, n, h, dim, device="cuda", generator=g).to(tdt).requires_grad_()
    av = torch.randn(b, n_add, h, dim, device="cuda", generator=g).to(tdt).requires_grad_()
    scale = 100.0 / dim  # scores near -100
    tuning = {"bwd_kernel": kernel}
    out, lse = fna.na1d(q, k, v, ks, scale=scale, additional_keys=ak, additional_values=av,
                        backend="cuda-fused", tuning=tuning, return_lse=True)
    assert float(lse.max()) < -80.0, float(lse.max())
    d_out = torch.randn(out.shape, device="cuda", generator=g).to(tdt)
    grads = torch.autograd.grad(out, [q, k, v, ak, av], d_out)
    plan = fna.fused_plan(q.shape, (ks,), dtype=dtype, tuning=tuning)
    assert plan["backward_family"] == kernel, plan
    assert fna._C.last_fused_launch()["backward"] == plan["backward_config"]
    ref = oracle(dict(q=q, k=k, v=v, ks=[ks], st=[1], dil=[1], causal=[False], add_k=ak,
                      add_v=av), scale=scale, d_out=d_out)
    names = ("out", "lse", "dq", "dk", "dv", "d_add_k", "d_add_v")
    for got, key in zip((out, lse) + tuple(grads), names):
        assert bool(torch.isfinite(got).all()), f"{kernel} D={dim} {dtype}: {key} not finite"
        mag = max(1.0, float(np.abs(ref[key]).max()))
        err = float(np.abs(np64(got) - ref[key]).max())
        tol = 8e-2 if dtype == "bfloat16" and key == "dq" else 3e-2
        assert err <= tol * mag, f"{kernel} D={dim} {dtype}: {key} max error {err} ({mag})"


def test_backward_grid_rows_of_grouped_heads():
    """The dK / dV kernels' grid rows are (batch, kv head, dilation group), the deterministic dQ
    kernel's (batch, query head, group); past gridDim.y's 65535 they continue over gridDim.z.
    Batch 4096 x 16 heads (65536 rows) plans the fused backward, atomic and deterministic, with
    one kv head or sixteen."""
    shape = (4096, 8, 8, 16, 64)
    for kw in (dict(heads_kv=1), dict(heads_kv=1, deterministic=True), dict(),
               dict(deterministic=True)):
        plan = fna.fused_plan(shape, (3, 3), dtype="bfloat16", **kw)
        assert plan["backward_family"] in ("sm80", "sm90", "sm90ws"), (kw, plan)


@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_grid_rows_past_65535(deterministic):
    """Batch 8200 x 8 kv heads = 65600 dK / dV grid rows (the last 65 past gridDim.y's limit, on
    blockIdx.z): the gradients of the first and last 40 batch items equal those of the same
    call on those items alone (each item's attention is its own)."""
    g = torch.Generator(device="cuda").manual_seed(seed_of("grid-rows", deterministic))
    b, h, d = 8200, 8, 32
    q, k, v = (torch.randn(b, 4, 4, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    d_out = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    plan = fna.fused_plan(q.shape, (3, 3), dtype="bfloat16", deterministic=deterministic)
    assert plan["backward_family"] != "", plan
    assert plan["backward_grid"] >= b * h, plan

    def grads(sl):
        leaves = [t[sl].detach().clone().requires_grad_() for t in (q, k, v)]
        out = fna.na2d(*leaves, (3, 3), backend="cuda-fused", deterministic=deterministic)
        return torch.autograd.grad(out, leaves, d_out[sl])

    whole = grads(slice(None))
    for sl in (slice(0, 40), slice(b - 40, b)):
        part = grads(sl)
        for name, w, p_ in zip(("dq", "dk", "dv"), whole, part):
            assert bool(torch.isfinite(w[sl]).all()), name
            assert torch.allclose(w[sl].float(), p_.float(), atol=1e-2, rtol=1e-2), \
                f"{name}: max diff {(w[sl].float() - p_.float()).abs().max().item()}"
