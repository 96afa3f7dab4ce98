"""TMA copies in the plain Hopper forward and the Hopper dQ kernel (kernel/sm90/fwd_sm90.cuh, tuning
fwd_copy / bwd_copy): what the plan reports, the errors, and that TMA and cp.async copies give
bitwise the same outputs, LSE and gradients, which match the float64 oracle, on ranks 1-3 with
every parameter TMA takes and with a query region. Runs on the device (tools/gpu/run.sh pytest);
skipped without a GPU."""

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
PLAIN = {"fwd_schedule": "plain"}
DQ = {"bwd_kernel": "sm90", "bwd_dq_sm90": "on"}

# (batch, spatial, kernel, stride, dilation, causal, heads, heads_kv, D, D_v)
CASES = (
    (2, (300,), (33,), (1,), (1,), (False,), 4, 2, 64, 64),
    (2, (257,), (16,), (3,), (2,), (True,), 2, 2, 32, 48),
    (3, (20, 24), (7, 7), (1, 1), (1, 1), (False, False), 3, 3, 32, 32),
    (1, (56, 56), (7, 7), (1, 1), (8, 8), (False, False), 2, 1, 32, 32),
    (2, (33, 29), (13, 13), (2, 3), (1, 2), (False, True), 2, 2, 64, 64),
    (1, (18, 21), (3, 3), (1, 1), (1, 1), (False, False), 2, 2, 128, 96),
    (1, (6, 12, 10), (3, 5, 5), (1, 1, 1), (1, 2, 1), (True, False, False), 2, 2, 64, 64),
    (1, (7, 9, 11), (3, 3, 7), (1, 2, 1), (1, 1, 1), (False, False, False), 2, 1, 128, 128),
)


def _plan(case, **kw):
    b, spatial, ks, st, dil, causal, h, hkv, d, dv = case
    return fna.fused_plan((b, *spatial, h, d), ks, stride=st, dilation=dil, is_causal=causal,
                          heads_kv=hkv, dim_v=dv, dtype="bfloat16", **kw)


def test_plain_tma_plan():
    """The plain Hopper forward loads by TMA by default on Hopper (plan "copy"), by cp.async with
    fwd_copy='cp_async' or any fwd_spread (spread copies are cp.async copies: with fwd_copy='tma'
    an error naming fwd_spread); additional keys keep cp.async, and fwd_copy='tma' then names
    why. The Hopper dQ kernel likewise under bwd_copy (backward_dq ends in its copy engine)."""
    if torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(ValueError, match="fwd_schedule"):
            _plan(CASES[0], tuning=PLAIN)
        return
    case = CASES[0]
    plan = _plan(case, tuning=PLAIN)
    assert plan["family"] == "sm90" and plan["copy"] == "tma" and not plan["spread"], plan
    cp = _plan(case, tuning={**PLAIN, "fwd_copy": "cp_async"})
    assert cp["config"] == plan["config"] and cp["copy"] == "cp_async" and cp["spread"], cp
    for spread in ("on", "off"):
        sp = _plan(case, tuning={**PLAIN, "fwd_spread": spread})
        assert sp["copy"] == "cp_async" and sp["spread"] == (spread == "on"), sp
    with pytest.raises(NotImplementedError, match="fwd_spread"):
        _plan(case, tuning={**PLAIN, "fwd_spread": "on", "fwd_copy": "tma"})
    # Additional keys (their own tensors, which the maps do not describe): cp.async.
    g = torch.Generator(device="cuda").manual_seed(seed_of("plain-tma-plan"))
    b, spatial, ks, _, _, _, h, hkv, d, dv = case
    q, k = (torch.randn((b, *spatial, n, d), device="cuda", dtype=torch.bfloat16, generator=g)
            for n in (h, hkv))
    v = torch.randn((b, *spatial, hkv, dv), device="cuda", dtype=torch.bfloat16, generator=g)
    ak = torch.randn((b, 5, hkv, d), device="cuda", dtype=torch.bfloat16, generator=g)
    av = torch.randn((b, 5, hkv, dv), device="cuda", dtype=torch.bfloat16, generator=g)
    add = dict(additional_keys=ak, additional_values=av, backend="cuda-fused")
    fna.na1d(q, k, v, ks, tuning=PLAIN, **add)
    assert fna._C.last_fused_launch()["forward"] == plan["config"]
    assert not fna._C.last_fused_launch()["forward_tma"]
    with pytest.raises(NotImplementedError, match="fwd_copy='tma'.*additional keys"):
        fna.na1d(q, k, v, ks, tuning={**PLAIN, "fwd_copy": "tma"}, **add)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    # (raised by the forward call, which plans the backward, or by the backward through autograd)
    with pytest.raises((NotImplementedError, RuntimeError), match="bwd_copy='tma'"):
        out = fna.na1d(qg, kg, vg, ks, tuning={**DQ, "bwd_copy": "tma"}, **add)
        out.sum().backward()
    # The dQ kernel: cp.async by default (TMA was not faster), TMA when asked.
    dq = _plan(case, tuning=DQ)
    assert dq["backward_dq"].startswith("fna_dq_sm90_"), dq
    assert dq["backward_dq"].endswith(" (cp_async)"), dq
    dq_tma = _plan(case, tuning={**DQ, "bwd_copy": "tma"})
    assert dq_tma["backward_dq"] == dq["backward_dq"].replace(" (cp_async)", " (tma)"), dq_tma


@pytest.mark.parametrize("index", range(len(CASES)))
def test_plain_tma_matches_cp_async(index):
    """Forward (output and LSE) and backward with the Hopper dQ kernel: TMA and cp.async copies
    bitwise equal, and both within tolerance of the float64 oracle."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the plain Hopper kernels run on compute capability 9.0")
    case = CASES[index]
    b, spatial, ks, st, dil, causal, h, hkv, d, dv = case
    g = torch.Generator(device="cuda").manual_seed(seed_of("plain-tma", index))
    rnd = lambda *s: torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q = rnd(b, *spatial, h, d).requires_grad_()
    k = rnd(b, *spatial, hkv, d).requires_grad_()
    v = rnd(b, *spatial, hkv, dv).requires_grad_()
    d_out = rnd(b, *spatial, h, dv)
    na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(spatial)]
    kw = dict(stride=st, dilation=dil, is_causal=causal, backend="cuda-fused")
    runs = {}
    for copy in ("tma", "cp_async"):
        tuning = {**PLAIN, **DQ, "fwd_copy": copy, "bwd_copy": copy}
        plan = _plan(case, tuning=tuning)
        assert plan["family"] == "sm90" and plan["copy"] == copy, plan
        assert plan["backward_dq"].endswith(f" ({copy})"), plan
        out, lse = na(q, k, v, ks, return_lse=True, tuning=tuning, **kw)
        assert fna._C.last_fused_launch()["forward"] == plan["config"]
        assert fna._C.last_fused_launch()["forward_tma"] == (copy == "tma")
        runs[copy] = (out, lse) + torch.autograd.grad(out, (q, k, v), d_out)
    names = ("out", "lse", "dq", "dk", "dv")
    for a, c, name in zip(runs["tma"], runs["cp_async"], names):
        assert torch.equal(a, c), f"case {index}: {name} differs between TMA and cp.async"
    ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=list(st), dil=list(dil),
                      causal=list(causal), add_k=None, add_v=None), d_out=d_out)
    got = dict(zip(names, runs["tma"]))
    for key in names:
        mag = max(1.0, float(np.abs(ref[key]).max()))
        err = float(np.abs(np64(got[key]) - ref[key]).max())
        assert err <= 3e-2 * mag, f"case {index}: {key} error {err} ({mag})"


def test_plain_tma_query_region():
    """A 2-D query region at an offset on both axes: the plain forward's Q map and the dQ
    kernel's Q / dO maps span the region; output and gradients match the whole call's rows, by
    TMA as by cp.async."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the plain Hopper kernels run on compute capability 9.0")
    grid, off, ext, ks = (40, 44), (5, 9), (21, 26), (9, 7)
    g = torch.Generator(device="cuda").manual_seed(seed_of("plain-tma-region"))
    q, k, v = (torch.randn((2, *grid, 2, 64), device="cuda", dtype=torch.bfloat16,
                           generator=g).requires_grad_() for _ in range(3))
    box = (slice(None),) + tuple(slice(o, o + e) for o, e in zip(off, ext))
    d_out = torch.randn((2, *ext, 2, 64), device="cuda", dtype=torch.bfloat16, generator=g)
    full = fna.na2d(q, k, v, ks)
    full_g = torch.zeros_like(full)
    full_g[box] = d_out
    want = (full[box],) + tuple(
        t[box] if i == 0 else t for i, t in enumerate(torch.autograd.grad(full, (q, k, v), full_g)))
    runs = {}
    for copy in ("tma", "cp_async"):
        tuning = {**PLAIN, **DQ, "fwd_copy": copy, "bwd_copy": copy}
        plan = fna.fused_plan((2, *ext, 2, 64), ks, query_offset=off, grid_shape=grid,
                              tuning=tuning)
        assert plan["copy"] == copy and plan["backward_dq"].endswith(f" ({copy})"), plan
        qr = q.detach()[box].clone().requires_grad_()
        out = fna.na2d(qr, k, v, ks, query_offset=off, tuning=tuning)
        runs[copy] = (out,) + torch.autograd.grad(out, (qr, k, v), d_out)
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        assert torch.equal(runs["tma"][i], runs["cp_async"][i]), name
        err = (runs["tma"][i].float() - want[i].float()).abs().max().item()
        assert err <= 3e-2 * max(1.0, want[i].float().abs().max().item()), (name, err)
