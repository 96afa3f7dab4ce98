"""The SIMT forward (fna_fwd_simt_*: the CUDA cores, one query per thread, exactly the needed
pairs) on the GPU: every parameter it takes (ranks 1-3, dilation, stride, causal, GQA, D_v != D,
head dims below the bucket, LSE, float16 / bfloat16) against the float64 oracle with tuning
fwd_simt=on, the plan reporting it, gradients through its LSE, bitwise agreement of its tile
shapes, and what it does not take. Runs on the device (tools/gpu/run.sh pytest); skipped
without a GPU."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import seed_of  # noqa: E402
from test_torch import np64, oracle  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled"),
]

ON = {"fwd_simt": "on"}
# Absolute bounds for outputs of order one: the output's rounding to the dtype dominates (the
# oracle runs on the same rounded inputs); the LSE is float32.
OUT_TOL = {torch.bfloat16: 2e-2, torch.float16: 3e-3}
LSE_TOL = 1e-3

# (spatial shape, kernel, dilation, stride, causal, B, H, H_kv, D, D_v)
CASES = [
    ((300,), (33,), (2,), (1,), (True,), 2, 4, 2, 32, 32),
    ((129,), (7,), (1,), (3,), (False,), 1, 2, 1, 16, 24),
    ((30, 23), (7, 5), (1, 2), (2, 1), (False, True), 2, 3, 3, 24, 40),
    ((56, 56), (7, 7), (8, 8), (1, 1), (False, False), 1, 3, 3, 32, 32),
    ((19, 21), (3, 9), (1, 1), (1, 3), (True, False), 1, 4, 2, 64, 64),
    ((6, 10, 12), (3, 5, 3), (1, 2, 1), (1, 1, 2), (True, False, False), 1, 2, 1, 64, 48),
    ((5, 9, 8), (5, 3, 3), (1, 1, 2), (2, 1, 1), (False, False, True), 2, 2, 2, 8, 8),
]


def _problem(case, dtype, tag):
    shape, ks, dil, st, causal, B, H, Hkv, D, Dv = case
    g = torch.Generator(device="cuda").manual_seed(seed_of("simt", tag, case, str(dtype)))
    q = torch.randn((B, *shape, H, D), device="cuda", dtype=dtype, generator=g)
    k = torch.randn((B, *shape, Hkv, D), device="cuda", dtype=dtype, generator=g)
    v = torch.randn((B, *shape, Hkv, Dv), device="cuda", dtype=dtype, generator=g)
    return q, k, v


def _na(rank):
    return {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]


def _ref(q, k, v, case, d_out=None):
    shape, ks, dil, st, causal = case[:5]
    return oracle(dict(q=q, k=k, v=v, ks=list(ks), st=list(st), dil=list(dil),
                       causal=list(causal), add_k=None, add_v=None), d_out=d_out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=[f"r{len(c[0])}-{i}" for i, c in enumerate(CASES)])
def test_simt_forward(case, dtype):
    """Output and LSE against the float64 oracle; fna.fused_plan says the SIMT forward runs."""
    shape, ks, dil, st, causal, B, H, Hkv, D, Dv = case
    q, k, v = _problem(case, dtype, "fwd")
    plan = fna.fused_plan(q.shape, ks, stride=st, dilation=dil, is_causal=causal, dtype=dtype,
                          heads_kv=Hkv, dim_v=Dv, tuning=ON)
    assert plan["family"] == "simt" and plan["config"].startswith("fna_fwd_simt_"), plan["config"]
    assert plan["needed_fraction"] == 1.0
    out, lse = _na(len(shape))(q, k, v, ks, stride=st, dilation=dil, is_causal=causal,
                               backend="cuda-fused", tuning=ON, return_lse=True)
    ref = _ref(q, k, v, case)
    err = float(np.abs(np64(out) - ref["out"]).max())
    assert err <= OUT_TOL[dtype], f"output: max error {err}"
    lerr = float(np.abs(np64(lse) - ref["lse"]).max())
    assert lerr <= LSE_TOL, f"lse: max error {lerr}"


def test_simt_backward_through_its_lse():
    """Gradients of a call whose forward is the SIMT kernel (the fused backward reads its O and
    LSE) against the oracle's."""
    case = CASES[2]
    shape, ks, dil, st, causal = case[:5]
    q, k, v = (t.requires_grad_(True) for t in _problem(case, torch.bfloat16, "bwd"))
    out = fna.na2d(q, k, v, ks, stride=st, dilation=dil, is_causal=causal,
                   backend="cuda-fused", tuning=ON)
    g = torch.Generator(device="cuda").manual_seed(seed_of("simt-bwd-dout"))
    d_out = torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=g)
    out.backward(d_out)
    ref = _ref(q, k, v, case, d_out=d_out)
    for t, name in ((q, "dq"), (k, "dk"), (v, "dv")):
        mag = max(1.0, float(np.abs(ref[name]).max()))
        err = float(np.abs(np64(t.grad) - ref[name]).max())
        assert err <= 3e-2 * mag, f"{name}: max error {err} (max |ref| {mag})"


def test_simt_tiles_agree_bitwise():
    """Each thread walks its own window in the same order whatever the CTA tile, so every SIMT
    configuration of a problem gives the same bits."""
    q, k, v = _problem(CASES[3], torch.bfloat16, "tiles")
    names = [n for n in fna.fused_configs(2, "bfloat16", 32) if n.startswith("fna_fwd_simt_")]
    assert len(names) >= 3, names
    outs = [fna.na2d(q, k, v, (7, 7), dilation=(8, 8), config=n) for n in names]
    for n, o in zip(names[1:], outs[1:]):
        assert torch.equal(o, outs[0]), n


def test_simt_limits():
    """What the SIMT forward does not take: additional keys (the plan falls back to a tensor-core
    kernel, or names the reason when the configuration is named), float32 (no configuration);
    tuning fwd_simt=off keeps it out of a plan, and with a named configuration it is an error."""
    q, k, v = _problem(CASES[3], torch.bfloat16, "limits")
    add_k = torch.randn((1, 5, 3, 32), device="cuda", dtype=torch.bfloat16)
    add_v = torch.randn((1, 5, 3, 32), device="cuda", dtype=torch.bfloat16)
    out = fna.na2d(q, k, v, (7, 7), dilation=(8, 8), additional_keys=add_k,
                   additional_values=add_v, backend="cuda-fused", tuning=ON)
    assert not fna._C.last_fused_launch()["forward"].startswith("fna_fwd_simt_")
    name = next(n for n in fna.fused_configs(2, "bfloat16", 32) if n.startswith("fna_fwd_simt_"))
    with pytest.raises(NotImplementedError, match="takes no additional keys"):
        fna.na2d(q, k, v, (7, 7), dilation=(8, 8), additional_keys=add_k,
                 additional_values=add_v, config=name)
    assert out.shape == q.shape
    assert not any(n.startswith("fna_fwd_simt_") for n in fna.fused_configs(2, "float32", 32))
    plan = fna.fused_plan(q.shape, (7, 7), dilation=(8, 8), tuning={"fwd_simt": "off"})
    assert plan["family"] != "simt"
    with pytest.raises(ValueError, match="fwd_simt"):
        fna.na2d(q, k, v, (7, 7), config=name, tuning=ON)
