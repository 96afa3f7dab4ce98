"""The Hopper dQ kernel on the GPU (kernel/sm90/fwd_sm90.cuh's dQ role, plan/bwd_dq_sm90.cu): dQ on
the plain Hopper forward's tiles after the plain Hopper dK / dV kernel without its dQ (tuning
bwd_dq_sm90; the deterministic calls' default where it applies): what the plan reports, the
errors for what it cannot run, and the gradients against the float64 oracle on ranks 1-3. Runs on
the device (tools/gpu/run.sh pytest); skipped without a GPU."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import seed_of  # noqa: E402
from test_torch import np64, oracle  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ON = {"bwd_dq_sm90": "on", "bwd_kernel": "sm90"}


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dq_sm90_plan(dtype):
    """Where the plan takes the Hopper dQ kernel and what it reports: backward_dq names it
    (fna_dq_sm90_<dtype>_d<head dim>_q<tile>_kv<tile>_w<warps>, the plain forward's tiles); by
    default at rank 1 after the plain Hopper dK / dV kernel (not with a bias);
    deterministic calls the strip kernels do not take (ranks 1 and 3, GQA) run the plain Hopper
    dK / dV kernel with it instead of the sm80 kernels; 'on' where it cannot run (a bias, head
    dim 256, float32, the warp-specialized family, with bwd_dq_strip='on') is an error naming the
    field; 'off' keeps deterministic calls on the sm80 kernels."""
    dt = str(dtype).split(".")[1]
    sd = "bf16" if dtype == torch.bfloat16 else "f16"  # as kernel names spell it
    one = ((2, 4096, 4, 64), (65,))
    if torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(NotImplementedError, match="bwd_dq_sm90"):
            fna.fused_plan(*one, dtype=dt, tuning={"bwd_dq_sm90": "on"})
        det = fna.fused_plan(*one, dtype=dt, deterministic=True)
        assert det["backward_family"] == "sm80" and det["backward_dq"] == "kernel", det
        return
    plan = fna.fused_plan(*one, dtype=dt, tuning=ON)
    assert plan["backward_family"] == "sm90", plan
    assert plan["backward_dq"] == f"fna_dq_sm90_{sd}_d64_q64_kv64_w4 (cp_async)", plan
    # Automatic: rank 1 (forward+backward 0.94x the atomics on 1d-small), not ranks 2 and 3.
    assert fna.fused_plan(*one, dtype=dt)["backward_dq"] == plan["backward_dq"]
    assert fna.fused_plan(*one, dtype=dt, tuning={"bwd_dq_sm90": "off"})["backward_dq"] == \
        "atomic"
    assert fna.fused_plan((1, 8, 16, 16, 2, 64), (3, 5, 5), dtype=dt)["backward_dq"] == "atomic"
    assert fna.fused_plan(*one, dtype=dt, rpb=True)["backward_dq"] == "atomic"
    for shape, ks, kw in (((1, 8, 16, 16, 2, 32), (3, 5, 5), dict(heads_kv=1)),
                          ((2, 56, 56, 3, 32), (7, 7), dict(heads_kv=1)),
                          (*one, {})):
        det = fna.fused_plan(shape, ks, dtype=dt, deterministic=True, **kw)
        assert det["backward_family"] == "sm90" and det["backward_deterministic"], det
        assert det["backward_dq"].startswith(f"fna_dq_sm90_{sd}_d64_"), det
        off = fna.fused_plan(shape, ks, dtype=dt, deterministic=True, tuning={"bwd_dq_sm90": "off"},
                             **kw)
        assert off["backward_family"] == "sm80" and off["backward_dq"] == "kernel", off
    # A bias keeps deterministic calls on the sm80 kernels (their d rpb sums).
    assert fna.fused_plan(*one, dtype=dt, deterministic=True, rpb=True)["backward_family"] == "sm80"
    alone = {"bwd_dq_sm90": "on"}
    for shape, ks, kw in ((one[0], one[1], dict(rpb=True, tuning=ON)),
                          ((1, 40, 40, 2, 256), (7, 7), dict(tuning=alone)),
                          (one[0], one[1], dict(tuning={**ON, "bwd_kernel": "sm90ws"})),
                          (one[0], one[1], dict(tuning={**ON, "bwd_dq_strip": "on"})),
                          (one[0], one[1], dict(tuning=alone, dtype="float32"))):
        with pytest.raises(NotImplementedError, match="bwd_dq_sm90"):
            fna.fused_plan(shape, ks, **{"dtype": dt, **kw})


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dq_sm90_gradients(dtype):
    """The gradients with the Hopper dQ kernel ('on', and deterministic calls with the strip dQ
    kernel off, bitwise the same run after run) against the float64 oracle: ranks 1-3, head dims 32, 64 and 128, D_v != D,
    GQA, dilation, stride, causal axes and additional keys."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper dQ kernel runs on compute capability 9.0")
    dt = str(dtype).split(".")[1]
    g = torch.Generator(device="cuda").manual_seed(seed_of("bwd-dq-sm90", dt))
    rnd = lambda *s: torch.randn(s, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    # (spatial, kernel, stride, dilation, causal, D, D_v, additional keys)
    cases = (((300,), (33,), (1,), (1,), (False,), 64, 64, 0),
             ((257,), (16,), (3,), (2,), (True,), 32, 48, 5),
             ((20, 24), (7, 7), (1, 1), (1, 1), (False, False), 32, 32, 0),
             ((33, 29), (13, 13), (2, 3), (1, 2), (False, True), 64, 64, 7),
             ((18, 21), (3, 3), (1, 1), (1, 1), (False, False), 128, 96, 0),
             ((6, 12, 10), (3, 5, 5), (1, 1, 1), (1, 2, 1), (True, False, False), 64, 64, 0),
             ((7, 9, 11), (3, 3, 7), (1, 2, 1), (1, 1, 1), (False, False, False), 128, 128, 3))
    fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}
    for spatial, ks, st, dil, causal, D, Dv, n_add in cases:
        q = rnd(2, *spatial, 4, D).requires_grad_()
        k = rnd(2, *spatial, 2, D).requires_grad_()
        v = rnd(2, *spatial, 2, Dv).requires_grad_()
        add_k = rnd(2, n_add, 2, D).requires_grad_() if n_add else None
        add_v = rnd(2, n_add, 2, Dv).requires_grad_() if n_add else None
        d_out = rnd(2, *spatial, 4, Dv)
        kw = dict(stride=st, dilation=dil, is_causal=causal)
        if n_add:
            kw.update(additional_keys=add_k, additional_values=add_v)
        ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=list(st), dil=list(dil),
                          causal=list(causal), add_k=add_k, add_v=add_v), d_out=d_out)
        leaves = [q, k, v] + ([add_k, add_v] if n_add else [])
        names = ["dq", "dk", "dv"] + (["d_add_k", "d_add_v"] if n_add else [])
        for mode in ("on", "deterministic"):
            # (deterministic: the strip dQ kernel off, which would take some rank-2 cases)
            call = dict(tuning=ON) if mode == "on" else dict(
                deterministic=True, tuning={"bwd_dq_strip": "off"})
            plan = fna.fused_plan((2, *spatial, 4, D), ks, heads_kv=2, dim_v=Dv, dtype=dt,
                                  stride=st, dilation=dil, is_causal=causal, **call)
            assert plan["backward_dq"].startswith("fna_dq_sm90_"), (spatial, mode, plan)
            runs = []
            for _ in range(2 if mode == "deterministic" else 1):
                out = fn[len(spatial)](q, k, v, ks, backend="cuda-fused", **kw, **call)
                runs.append(torch.autograd.grad(out, leaves, d_out))
            for got, key in zip(runs[0], names):
                mag = max(1.0, float(np.abs(ref[key]).max()))
                err = float(np.abs(np64(got) - ref[key]).max())
                assert err <= 3e-2 * mag, f"{spatial} {mode}: {key} error {err} ({mag})"
            if mode == "deterministic":
                for a, b, key in zip(runs[0], runs[1], names):
                    assert torch.equal(a, b), f"{spatial}: {key} differs between two runs"
