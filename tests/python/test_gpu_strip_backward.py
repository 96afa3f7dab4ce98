"""The strip backward kernels on the GPU (kernel/strip/fwd_strip.cuh with StripRole::dq and dkdv;
plan/bwd_strip.cu): the strip dQ kernel after the plain Hopper dK / dV kernel without its dQ
(tuning bwd_dq_strip) and the strip dK / dV kernel with it (tuning bwd_strip): where the plan takes
them, what it reports, the errors for what they cannot run, and the gradients against the float64
oracle. Runs on the device (tools/gpu/run.sh pytest); skipped without a GPU."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import seed_of  # noqa: E402
from test_torch import np64, oracle  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_dq_strip(dtype):
    """dQ by the strip dQ kernel after the plain Hopper dK / dV kernel without its dQ (tuning
    bwd_dq_strip; rank 2, head dims up to 128, no bias, additional keys or query region): the
    plan's default at head dims above 32 where dilation groups are at least a strip wide,
    reported as backward_dq with its head-dim columns, warp box and warps; 'off' keeps the atomics; deterministic mode keeps the dQ kernel; 'on' where it cannot run
    (rank 1, a bias, additional keys, head dim 256, the warp-specialized family) is an error
    naming the field. Both modes give the float64 oracle's gradients with 2x8 and 4x4 warp boxes
    at head dims 32, 64 and 128, dilation, stride, causal axes, GQA and D_v != D."""
    dt = str(dtype).split(".")[1]
    sd = "bf16" if dtype == torch.bfloat16 else "f16"  # as kernel names spell it
    on = {"bwd_dq_strip": "on", "bwd_strip": "off"}
    off = {"bwd_strip": "off"}  # dK / dV by the Hopper kernel
    if torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(NotImplementedError, match="bwd_dq_strip"):
            fna.fused_plan((2, 56, 56, 3, 32), (7, 7), dtype=dt, tuning=on)
        return
    nat = ((2, 56, 56, 3, 32), (7, 7))
    # Automatic: head dims above 32 and dilation groups at least a strip (16 columns) wide.
    wide = ((1, 64, 64, 4, 64), (7, 7))
    plan = fna.fused_plan(*wide, dtype=dt, tuning=off)
    assert plan["backward_dq"] == f"fna_dq_strip_{sd}_d64_b2x8_w8 (tma)", plan
    assert fna.fused_plan(*wide, dtype=dt, tuning={**off, "bwd_copy": "cp_async"})[
        "backward_dq"].endswith("(cp_async)")
    assert fna.fused_plan(*wide, dtype=dt, dilation=(1, 5), tuning=off)["backward_dq"] == "atomic"
    assert fna.fused_plan(*nat, dtype=dt, tuning=off)["backward_dq"] == "atomic"
    assert fna.fused_plan(*nat, dtype=dt, tuning=on)["backward_dq"].startswith(
        f"fna_dq_strip_{sd}_d32_b2x8_w12")
    assert fna.fused_plan(*wide, dtype=dt, tuning={**off, "bwd_dq_strip": "off"})[
        "backward_dq"] == "atomic"
    # Deterministic calls the strip dK / dV kernel cannot take (GQA) run the Hopper dQ kernel.
    assert fna.fused_plan(*nat, dtype=dt, deterministic=True, heads_kv=1)[
        "backward_dq"].startswith(f"fna_dq_sm90_{sd}_d64_")
    assert fna.fused_plan(*nat, dtype=dt, rpb=True)["backward_dq"] == "atomic"
    for shape, ks, kw in (((1, 300, 2, 64), (33,), {}), (nat[0], nat[1], dict(rpb=True)),
                          ((1, 40, 40, 2, 256), (7, 7), {}),
                          (nat[0], nat[1], dict(tuning={**on, "bwd_kernel": "sm90ws"}))):
        with pytest.raises(NotImplementedError, match="bwd_dq_strip"):
            fna.fused_plan(shape, ks, dtype=dt, **{"tuning": on, **kw})
    g = torch.Generator(device="cuda").manual_seed(seed_of("bwd-dq-strip", dt))
    rnd = lambda *s: torch.randn(s, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    # (spatial, kernel, stride, dilation, causal, D, D_v, the strip kernel's name part)
    cases = (((20, 24), (7, 7), (1, 1), (1, 1), (False, False), 32, 32, "d32_b2x8"),
             ((33, 29), (13, 13), (2, 3), (1, 1), (False, False), 64, 64, "d64_b4x4"),
             ((30, 40), (5, 9), (1, 1), (2, 1), (True, False), 48, 64, "d64_b"),
             ((18, 21), (3, 3), (1, 1), (1, 1), (False, False), 128, 128, "d128_b2x8"),
             ((17, 26), (7, 5), (1, 2), (1, 3), (False, True), 96, 80, "d128_b"))
    for spatial, ks, st, dil, causal, D, Dv, name in cases:
        q = rnd(2, *spatial, 4, D).requires_grad_()
        k = rnd(2, *spatial, 2, D).requires_grad_()
        v = rnd(2, *spatial, 2, Dv).requires_grad_()
        d_out = rnd(2, *spatial, 4, Dv)
        kw = dict(stride=st, dilation=dil, is_causal=causal)
        ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=list(st), dil=list(dil),
                          causal=list(causal), add_k=None, add_v=None), d_out=d_out)
        for mode in ("on", "off"):
            tuning = {"bwd_dq_strip": mode, **off}
            plan = fna.fused_plan((2, *spatial, 4, D), ks, heads_kv=2, dim_v=Dv, dtype=dt,
                                  tuning=tuning, **kw)
            assert plan["backward_family"] == "sm90", plan
            if mode == "on":
                assert plan["backward_dq"].startswith(f"fna_dq_strip_{sd}_{name}"), plan
            else:
                assert plan["backward_dq"] == "atomic", plan
            out = fna.na2d(q, k, v, ks, backend="cuda-fused", tuning=tuning, **kw)
            grads = torch.autograd.grad(out, [q, k, v], d_out)
            for got, key in zip(grads, ("dq", "dk", "dv")):
                mag = max(1.0, float(np.abs(ref[key]).max()))
                err = float(np.abs(np64(got) - ref[key]).max())
                assert err <= 3e-2 * mag, f"{spatial} {mode}: {key} error {err} ({mag})"


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_strip_dkdv(dtype):
    """dK / dV by the strip dK / dV kernel (tuning bwd_strip: boxes of 16 keys against the query
    rows of their inverse neighborhoods, then the strip dQ kernel; rank 2, head dims up to 128, no
    GQA, bias, additional keys or query region; by default at padded head dim 128 where dilation
    groups are at least a strip wide): reported as the 'strip' family with both
    kernels' names; 'on' where it cannot run (GQA, head dim 256, rank 1, bwd_dq_strip='off', a
    named kernel) is an error naming the field; deterministic calls take it wherever it applies
    (at every head dim: no atomics), with bitwise identical gradients run after run; the
    gradients match the
    float64 oracle with 2x8 and 4x4 key boxes at head dims 32, 64 and 128 (two warps per box),
    dilation, stride, causal axes and D_v != D, and the default plan's too."""
    dt = str(dtype).split(".")[1]
    sd = "bf16" if dtype == torch.bfloat16 else "f16"  # as kernel names spell it
    on = {"bwd_strip": "on"}
    nat = ((2, 56, 56, 3, 32), (7, 7))
    if torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(NotImplementedError, match="bwd_strip"):
            fna.fused_plan(*nat, dtype=dt, tuning=on)
        return
    # Automatic: padded head dim 128 where dilation groups are a strip wide (not at 32).
    k3 = ((1, 64, 64, 4, 128), (3, 3))
    assert fna.fused_plan(*k3, dtype=dt)["backward_family"] == "strip"
    assert fna.fused_plan(*k3, dtype=dt, dilation=(1, 5))["backward_family"] == "sm90"
    assert fna.fused_plan(*k3, dtype=dt, heads_kv=2)["backward_family"] == "sm90"
    assert fna.fused_plan(*nat, dtype=dt)["backward_family"] != "strip"
    # Deterministic calls take both strip kernels wherever they apply (no atomics), else the
    # plain Hopper dK / dV kernel with the Hopper dQ kernel (test_gpu_dq_sm90.py).
    det = fna.fused_plan(*nat, dtype=dt, deterministic=True)
    assert det["backward_family"] == "strip" and det["backward_deterministic"], det
    assert det["backward_dq"].startswith(f"fna_dq_strip_{sd}_d32"), det
    assert fna.fused_plan(*nat, dtype=dt, deterministic=True, heads_kv=1)[
        "backward_family"] == "sm90"
    plan = fna.fused_plan(*nat, dtype=dt, tuning=on)
    assert plan["backward_family"] == "strip", plan
    assert plan["backward_config"].startswith(f"fna_bwd_strip_{sd}_d32_b2x8_w8"), plan
    assert plan["backward_dq"].startswith(f"fna_dq_strip_{sd}_d32"), plan
    for shape, ks, kw in ((nat[0], nat[1], dict(heads_kv=1)), ((1, 40, 40, 2, 256), (7, 7), {}),
                          ((1, 300, 2, 32), (33,), {}),
                          (nat[0], nat[1], dict(tuning={**on, "bwd_dq_strip": "off"})),
                          (nat[0], nat[1], dict(tuning={**on, "bwd_walk": "01"})),
                          (nat[0], nat[1], dict(tuning={**on, "bwd_kernel": "sm90"}))):
        with pytest.raises(NotImplementedError, match="bwd_strip"):
            fna.fused_plan(shape, ks, dtype=dt, **{"tuning": on, **kw})
    g = torch.Generator(device="cuda").manual_seed(seed_of("bwd-strip-dkdv", dt))
    rnd = lambda *s: torch.randn(s, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    # (spatial, kernel, stride, dilation, causal, D, D_v, the key box)
    cases = (((20, 24), (7, 7), (1, 1), (1, 1), (False, False), 32, 32, "d32_b2x8"),
             ((23, 37), (3, 3), (1, 1), (1, 1), (False, False), 64, 64, "d64_b2x8"),
             ((30, 40), (5, 9), (1, 1), (2, 1), (True, False), 48, 64, "d64_b4x4"),
             ((19, 26), (7, 5), (2, 1), (1, 2), (False, True), 40, 24, "d64_b"),
             ((18, 21), (3, 3), (1, 1), (1, 1), (False, False), 128, 128, "d128_b2x8_w8"),
             ((20, 26), (7, 5), (1, 1), (1, 2), (False, True), 96, 80, "d128_b"))
    for spatial, ks, st, dil, causal, D, Dv, name in cases:
        q = rnd(2, *spatial, 3, D).requires_grad_()
        k = rnd(2, *spatial, 3, D).requires_grad_()
        v = rnd(2, *spatial, 3, Dv).requires_grad_()
        d_out = rnd(2, *spatial, 3, Dv)
        kw = dict(stride=st, dilation=dil, is_causal=causal)
        ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=list(st), dil=list(dil),
                          causal=list(causal), add_k=None, add_v=None), d_out=d_out)
        for tuning in (on, {**on, "bwd_copy": "cp_async"}, None):
            plan = fna.fused_plan((2, *spatial, 3, D), ks, dim_v=Dv, dtype=dt, tuning=tuning, **kw)
            if tuning and "bwd_copy" in tuning:  # the strip kernels' bands by cp.async
                assert plan["backward_copy"] == "cp_async", plan
                assert plan["backward_dq"].endswith("(cp_async)"), plan
            if tuning == on:
                # Deterministic: the same kernels, the same bits run after run.
                runs = [torch.autograd.grad(fna.na2d(q, k, v, ks, backend="cuda-fused",
                                                     tuning=tuning, deterministic=True, **kw),
                                            [q, k, v], d_out) for _ in range(2)]
                for a, b in zip(*runs):
                    assert torch.equal(a, b), spatial
            if tuning:
                assert plan["backward_config"].startswith(f"fna_bwd_strip_{sd}_{name}"), plan
            out = fna.na2d(q, k, v, ks, backend="cuda-fused", tuning=tuning, **kw)
            grads = torch.autograd.grad(out, [q, k, v], d_out)
            assert fna._C.last_fused_launch()["backward"] == plan["backward_config"]
            for got, key in zip(grads, ("dq", "dk", "dv")):
                mag = max(1.0, float(np.abs(ref[key]).max()))
                err = float(np.abs(np64(got) - ref[key]).max())
                assert err <= 3e-2 * mag, f"{spatial} {tuning}: {key} error {err} ({mag})"
