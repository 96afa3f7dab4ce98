"""Relative positional bias in the cuda-fused kernels (the forward's tiled families: mma.sync,
plain and warp-specialized wgmma; the sm80, plain and warp-specialized Hopper dK / dV kernels'
bias and d rpb), against the float64 dense reference of test_rpb.py (the bias gathered there from
coordinates, no fna code): output, LSE and the gradients of q, k, v, rpb and the additional keys /
values, on ranks 1-3, odd and even kernels, dilation, stride, causal axes, grouped heads,
additional keys, head dims 8 to 256 and query regions; the strip, box and SIMT forwards'
configurations; the plan (the bias keeps the backward family up to padded head dim 128); the
deterministic backward (fused; the unfused composition for tables too large) and the errors.
Needs a CUDA GPU."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import random_params, seed_of  # noqa: E402
from test_rpb import CASES, MASK_FILLS, NA, make, mask_bias, reference  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# max |fna - float64 reference| relative to max(1, max |ref|), per dtype (16-bit rounding of the
# inputs and of P dominates; float32 runs split TF32).
TOL = {torch.bfloat16: 3e-2, torch.float16: 6e-3, torch.float32: 1e-4}


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _variants():
    v = [("auto", {}), ("mma_sync", {"tuning": {"fwd_schedule": "mma_sync", "bwd_kernel": "sm80"}}),
         ("mma_sync_global", {"tuning": {"fwd_schedule": "mma_sync", "fwd_rpb_stage": "off"}})]
    if _hopper():
        v += [("sm90_plain", {"tuning": {"fwd_schedule": "plain", "bwd_kernel": "sm90"}}),
              ("sm90_plain_global", {"tuning": {"fwd_schedule": "plain", "fwd_rpb_stage": "off"}}),
              ("sm90_ws", {"tuning": {"fwd_schedule": "warp_specialized",
                                      "bwd_kernel": "sm90ws"}}),
              ("sm90_ws_cp", {"tuning": {"fwd_schedule": "warp_specialized",
                                         "fwd_copy": "cp_async", "bwd_kernel": "sm90ws",
                                         "bwd_copy": "cp_async"}}),
              # persistent CTAs: the bias slices' buffers carry on from one query tile to the next
              ("sm90_ws_persistent", {"tuning": {"fwd_schedule": "warp_specialized",
                                                 "persistent": "on"}}),
              # ... and the loader's own threads filling them after their cp.async copies
              ("sm90_ws_persistent_cp", {"tuning": {"fwd_schedule": "warp_specialized",
                                                    "persistent": "on", "fwd_copy": "cp_async"}})]
    return v


def _make(case, seed, dtype, D, Dv, B=2):
    """test_rpb.make on the GPU: the reference takes the values the GPU sees (rounded to dtype);
    rpb stays float32."""
    return make(case, seed, dtype, D, Dv, B, device="cuda", rpb_dtype=torch.float32)


def _close(a, b, tol, what):
    a = a.detach().cpu().double()
    b = b.detach().cpu().double()
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    fin = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), fin), f"{what}: non-finite entries differ"
    err = (a[fin] - b[fin]).abs().max().item() if fin.any() else 0.0
    mag = max(1.0, b[fin].abs().max().item() if fin.any() else 0.0)
    assert err <= tol * mag, f"{what}: max error {err:.3g} > {tol * mag:.3g}"


def _run(case, dtype, seed, what, D=16, Dv=16, query_offset=None, rpb_edit=None, **kw):
    rank, shape, ks, st, dil, causal = case[:6]
    low, ref = _make(case, seed, dtype, D, Dv)
    if rpb_edit is not None:  # applied to both bias tables
        rpb_edit(low["rpb"])
        rpb_edit(ref["rpb"])
    scale = 0.3
    args = dict(stride=st, dilation=dil, is_causal=causal, scale=scale)
    q = low["q"]
    box = None
    if query_offset is not None:
        box = (slice(None),) + tuple(slice(o, L) for o, L in zip(query_offset, shape))
        q = low["q"].detach()[box].clone().requires_grad_(True)
    out, lse = NA[rank](q, low["k"], low["v"], ks, **args, additional_keys=low["add_k"],
                        additional_values=low["add_v"], backend="cuda-fused", return_lse=True,
                        rpb=low["rpb"], query_offset=query_offset, **kw)
    r_out, r_lse = reference(ref["q"], ref["k"], ref["v"], ref["rpb"], ks, st, dil, causal,
                             scale, ref["add_k"], ref["add_v"])
    if box is not None:
        r_out, r_lse = r_out[box], r_lse[box]
    tol = TOL[dtype]
    _close(out, r_out, tol, f"output, {what}")
    _close(lse, r_lse, tol, f"lse, {what}")
    g = torch.Generator().manual_seed(seed + 1)
    g_out = torch.randn(r_out.shape, generator=g, dtype=torch.float64)
    g_lse = torch.randn(r_lse.shape, generator=g, dtype=torch.float64)
    names = [n for n in low if low[n] is not None]
    mine = [q if n == "q" else low[n] for n in names]
    grads = torch.autograd.grad((out.float() * g_out.cuda().float()).sum() +
                                (lse * g_lse.cuda().float()).sum(), mine)
    r_grads = torch.autograd.grad((r_out * g_out).sum() + (r_lse * g_lse).sum(),
                                  [ref[n] for n in names])
    for n, a, b in zip(names, grads, r_grads):
        if n == "q" and box is not None:
            b = b[box]
        # d rpb sums dS over every pair of a table entry: bounded by its mean magnitude.
        _close(a, b, tol * (4 if n == "rpb" and dtype != torch.float32 else 1), f"d {n}, {what}")
    return out


@pytest.mark.parametrize("variant", _variants(), ids=lambda v: v[0])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("i", range(len(CASES)))
def test_fused_matches_reference(i, dtype, variant):
    name, kw = variant
    if dtype == torch.float32 and name.startswith("sm90"):
        pytest.skip("the wgmma kernels take 16-bit tensors")
    _run(CASES[i], dtype, seed_of("rpb-cuda", i, str(dtype)), f"case {i} {name} {dtype}", **kw)


@pytest.mark.parametrize("D", [32, 64, 128, 256])
def test_head_dims(D):
    """Head dims across the kernels' buckets (256: the backward's two passes)."""
    case = (2, [12, 10], [5, 3], [1, 1], [1, 2], [False, False], 4, 2, 2)
    for dtype in (torch.bfloat16, torch.float32):
        _run(case, dtype, seed_of("rpb-cuda-d", D, str(dtype)), f"D={D} {dtype}", D=D, Dv=D)


def test_nat_like_tiles_inside():
    """A grid large enough that most key tiles lie inside every window (the unmasked path)."""
    case = (2, [40, 36], [7, 7], [1, 1], [1, 1], [False, False], 2, 2, 0)
    for name, kw in _variants():
        _run(case, torch.bfloat16, seed_of("rpb-cuda-nat", name), f"nat-like {name}", D=32,
             Dv=32, **kw)


def test_query_region():
    case = (2, [20, 18], [5, 7], [1, 2], [2, 1], [False, True], 2, 1, 0)
    _run(case, torch.bfloat16, seed_of("rpb-cuda-region"), "region", query_offset=(6, 3))


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_random_problems(rank):
    for c in range(4):
        rng = np.random.default_rng(seed_of("rpb-cuda-random", rank, c))
        shape, ks, st, dil, causal = random_params(rng, rank, max_len=[40, 14, 8][rank - 1])
        case = (rank, shape, ks, st, dil, causal, 2, 1 + c % 2, c % 2)
        _run(case, torch.bfloat16, seed_of("rpb-cuda-random-data", rank, c), f"random {case}")


@pytest.mark.parametrize("fill", MASK_FILLS, ids=["-inf", "float32-lowest"])
def test_bias_as_a_mask(fill):
    """A bias of -inf (or float32's lowest, which overflows to -inf once divided by the scale)
    beyond a distance of 40 on a 128-long axis with a whole-axis window: every key tile is on the
    unmasked path, and for the last rows the first tiles hold only -inf scores. The online softmax
    must give those rows p = 0, not NaN (inf - inf), in every forward variant; output, LSE and
    gradients match the float64 reference."""
    case = (1, [128], [128], [1], [1], [False], 2, 1, 0)
    for name, kw in _variants():
        _run(case, torch.bfloat16, seed_of("rpb-cuda-mask", name), f"mask {fill} {name}",
             rpb_edit=mask_bias(fill, 40), **kw)


def test_bias_matters():
    """Without the bias the output differs well beyond the tolerance (the test can fail)."""
    case = CASES[3]
    low, _ = _make(case, seed_of("rpb-cuda-matters"), torch.bfloat16, 16, 16)
    ks = case[2]
    with_b = fna.na2d(low["q"], low["k"], low["v"], ks, rpb=low["rpb"], backend="cuda-fused")
    without = fna.na2d(low["q"], low["k"], low["v"], ks, backend="cuda-fused")
    assert (with_b.float() - without.float()).abs().max().item() > 0.1


def test_plan_with_rpb():
    """NAT-like problems: with a bias the plan runs the strip forward (which stages the table) or
    a tiled kernel, and the sm80 / plain Hopper backward; fused_plan(rpb=True) reports exactly
    that."""
    for shape, ks, D in (((56, 56), 7, 32), ((64, 64), 13, 64), ((28, 28), 7, 32)):
        q = (2, *shape, 4, D)
        plain = fna.fused_plan(q, ks)
        plan = fna.fused_plan(q, ks, rpb=True)
        assert plan["family"] in ("sm80", "sm90", "sm90ws", "strip", "box", "simt"), (shape, plan)
        if plain["family"] == "strip":  # the strip forward adds the bias
            assert plan["config"] == plain["config"], (plan, plain)
        # (the bias changes no backward kernel up to padded head dim 128)
        assert plan["backward_family"] == plain["backward_family"], (shape, plan)
        assert plan["backward_family"] in (("sm90", "sm90ws") if _hopper() else ("sm80",)), plan
        assert plan["rpb_table"] == {"sm90ws": "tiles", "simt": "global"}.get(plan["family"],
                                                                            "shared"), plan
        assert plain["rpb_table"] == ""
        assert fna.fused_plan(q, ks, rpb=True, tuning={"fwd_schedule": "mma_sync"})[
            "rpb_table"] == "shared"
        assert plain["family"] != "" and plan["config"] != ""
        g = torch.Generator(device="cuda").manual_seed(seed_of("rpb-plan", *shape))
        t = [torch.randn(q, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)]
        rpb = torch.randn(4, 2 * ks - 1, 2 * ks - 1, device="cuda", generator=g)
        fna.na2d(*t, ks, rpb=rpb)
        assert fna._C.last_fused_launch()["forward"] == plan["config"]


_BOX_CASES = [CASES[3], CASES[5],
              (2, [40, 36], [7, 7], [1, 1], [1, 1], [False, False], 2, 2, 0),
              (2, [30, 33], [13, 5], [2, 1], [1, 2], [True, False], 4, 2, 0)]
_SIMT_CASES = _BOX_CASES + [CASES[0], CASES[2], CASES[7],
                            (3, [6, 9, 10], [3, 5, 3], [1, 2, 1], [2, 1, 3], [False, False, True],
                             2, 1, 0)]


@pytest.mark.parametrize("family,D", [("strip", 16), ("strip", 64), ("strip", 128), ("box", 16),
                                      ("box", 64), ("simt", 16), ("simt", 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16],
                         ids=lambda d: str(d).replace("torch.", ""))
def test_box_strip_simt_bias(family, D, dtype):
    """Every strip (4x4 and 2x8 warp boxes, head dims 32, 64 and 128, 8-16 warps), box (the table
    staged after the halo) and SIMT (the table read per key along the window walk) configuration
    adds the bias: output, LSE and gradients against the reference, with stride, dilation, causal
    and grouped heads, ranks 1-3 for SIMT; the launch is the named configuration."""
    dt = str(dtype).replace("torch.", "")
    ran, listed = 0, 0
    for i, case in enumerate(_SIMT_CASES if family == "simt" else _BOX_CASES):
        names = [n for n in fna.fused_configs(case[0], dt, D) if f"_{family}_" in n]
        listed += len(names)
        for name in names:
            try:
                _run(case, dtype, seed_of("rpb-staged", i, name), f"case {i} {name}", D=D, Dv=D,
                     config=name)
            except NotImplementedError:
                continue  # a problem outside the configuration's limits, or a ring too large
            assert fna._C.last_fused_launch()["forward"] == name
            ran += 1
    assert listed > 0 and ran >= listed // 3, (ran, listed)


def test_backward_large_table():
    """A bias table whose per-warp copies do not fit beside the dK / dV kernel (a 3-D window of
    9x17x17: 18,513 entries) has the warps' d rpb sums added straight to global memory
    (backward_rpb_sums "global", no table in the kernel's shared memory), at head dim 128 where
    one table would not fit either and at head dim 16 where it would (tuning bwd_rpb_sums
    'shared' runs that); all give the reference's gradients."""
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    case = (3, [9, 17, 17], [9, 17, 17], [1, 1, 1], [1, 1, 1], [False, True, False], 2, 2, 0)
    table = 4 * math.prod(2 * k - 1 for k in case[2])
    modes = {}
    for D in (128, 16):
        plan = fna.fused_plan((2, *case[1], case[6], D), case[2], is_causal=case[5], rpb=True,
                              dtype="bfloat16")
        assert plan["backward_family"] in ("sm80", "sm90", "sm90ws"), plan
        modes[D] = plan["backward_rpb_sums"]
        assert plan["backward_smem"] <= optin, plan
        if D == 128:
            assert plan["backward_smem"] + table > optin, plan
        assert fna.fused_plan((2, *case[1], case[6], D), case[2],
                              dtype="bfloat16")["backward_rpb_sums"] == ""
        _run(case, torch.bfloat16, seed_of("rpb-large-table", D), f"large table D={D}", D=D,
             Dv=D)
    assert modes == {128: "global", 16: "global"}, modes
    shared = fna.fused_plan((2, *case[1], case[6], 16), case[2], is_causal=case[5], rpb=True,
                            dtype="bfloat16", tuning={"bwd_rpb_sums": "shared"})
    assert shared["backward_rpb_sums"] == "shared" and shared["backward_smem"] >= table, shared
    _run(case, torch.bfloat16, seed_of("rpb-large-table-shared"), "large table D=16 shared",
         D=16, Dv=16, tuning={"bwd_rpb_sums": "shared"})


@pytest.mark.parametrize("kernel", ["sm80", "sm90", "sm90ws"])
def test_backward_rpb_sums_modes(kernel):
    """tuning bwd_rpb_sums: the dK / dV kernel sums d rpb in a shared-memory table per warp
    (plain adds), in one shared table (atomics) or straight into d rpb (global atomics); every
    mode gives the reference's gradients, on every test case and a grid whose key tiles visit
    many query tiles, and the plan reports the mode that runs. Small tables get the per-warp
    copies by default; the tuning key needs a bias."""
    if kernel != "sm80" and not _hopper():
        pytest.skip(f"the {kernel} dK / dV kernel needs compute capability 9.0")
    cases = list(CASES) + [(2, [40, 36], [7, 7], [1, 1], [1, 1], [False, False], 2, 2, 0)]
    for i, case in enumerate(cases):
        rank, shape, ks = case[:3]
        for mode in ("warps", "shared", "global"):
            tuning = {"bwd_kernel": kernel, "bwd_rpb_sums": mode}
            plan = fna.fused_plan((2, *shape, case[6], 16), ks, stride=case[3], dilation=case[4],
                                  is_causal=case[5], heads_kv=case[7], rpb=True,
                                  dtype="bfloat16", tuning=tuning)
            assert plan["backward_rpb_sums"] == mode, (case, plan)
            assert plan["backward_family"] == kernel, plan
            _run(case, torch.bfloat16, seed_of("rpb-sums", i, mode, kernel),
                 f"case {i} {kernel} {mode}", tuning=tuning)
        auto = fna.fused_plan((2, *shape, case[6], 16), ks, stride=case[3], dilation=case[4],
                              is_causal=case[5], heads_kv=case[7], rpb=True, dtype="bfloat16",
                              tuning={"bwd_kernel": kernel})
        assert auto["backward_rpb_sums"] == "warps", auto
    with pytest.raises(NotImplementedError, match="bwd_rpb_sums needs a relative positional"):
        fna.fused_plan((2, 16, 16, 2, 16), 5, tuning={"bwd_rpb_sums": "warps"})


def test_warp_specialized_backward():
    """Where key tiles visit many query tiles (windows of 39 x 37 on 48 x 40) the plan runs the
    warp-specialized Hopper backward with a bias as without one; its bias instance gives the
    reference's gradients at head dims 64 and 128, with d rpb by global atomics (the plan's
    choice for a table of 5,621 entries) and in one shared table, over a query region and with
    additional keys (whose launch takes no bias), by TMA and by cp.async."""
    if not _hopper():
        pytest.skip("the sm90ws dK / dV kernel needs compute capability 9.0")
    case = (2, [48, 40], [39, 37], [1, 1], [1, 1], [False, False], 4, 2, 3)
    for D in (64, 128):
        q = (2, *case[1], case[6], D)
        kw = dict(is_causal=case[5], heads_kv=case[7], dtype="bfloat16")
        plain = fna.fused_plan(q, case[2], **kw)
        plan = fna.fused_plan(q, case[2], rpb=True, **kw)
        assert plain["backward_family"] == plan["backward_family"] == "sm90ws", (plain, plan)
        assert plan["backward_rpb_sums"] == "global", plan
        _run(case, torch.bfloat16, seed_of("rpb-ws", D), f"sm90ws D={D}", D=D, Dv=D)
        assert fna._C.last_fused_launch()["backward"] == plan["backward_config"]
        _run(case, torch.bfloat16, seed_of("rpb-ws-region", D), f"sm90ws region D={D}", D=D,
             Dv=D, query_offset=(9, 4))
        _run(case, torch.float16, seed_of("rpb-ws-cp", D), f"sm90ws cp.async D={D}", D=D, Dv=D,
             tuning={"bwd_copy": "cp_async"})
    shared = {"bwd_rpb_sums": "shared"}
    plan = fna.fused_plan((2, *case[1], case[6], 64), case[2], rpb=True, is_causal=case[5],
                          heads_kv=case[7], dtype="bfloat16", tuning=shared)
    assert plan["backward_rpb_sums"] == "shared" and plan["backward_family"] == "sm90ws", plan
    _run(case, torch.bfloat16, seed_of("rpb-ws-shared"), "sm90ws shared table", D=64, Dv=64,
         tuning=shared)


def test_deterministic_fused():
    """deterministic=True (or torch's flag) with a bias runs the fused deterministic backward:
    the sm80 dK / dV kernel sums d rpb in per-warp tables into each CTA's own slots, added up in
    a fixed order, and the dQ kernel adds the bias. It matches the reference, and two runs give
    bitwise equal gradients. A table whose per-warp copies do not fit (a 9x17x17 window at head
    dim 128) has no deterministic fused backward: the call runs the unfused composition, also
    deterministic."""
    cases = list(CASES) + [(2, [40, 36], [7, 7], [1, 1], [1, 1], [False, False], 2, 2, 0)]
    off_diagonal = 0  # plans whose tiles' last extents are not multiples of 8 (lane-by-lane adds)
    for i, case in enumerate(cases):
        rank, shape, ks, st, dil, causal = case[:6]
        for dtype in (torch.bfloat16, torch.float32):
            dn = str(dtype).replace("torch.", "")
            plan = fna.fused_plan((2, *shape, case[6], 16), ks, stride=st, dilation=dil,
                                  is_causal=causal, heads_kv=case[7], rpb=True, dtype=dn,
                                  deterministic=True)
            assert plan["backward_deterministic"] and plan["backward_rpb_sums"] == "warps", plan
            off_diagonal += (plan["backward_kv_tile"][-1] % 8 != 0 or
                             plan["backward_q_tile"][-1] % 8 != 0)
            _run(case, dtype, seed_of("rpb-det", i, dn), f"case {i} deterministic {dn}",
                 deterministic=True)
            assert fna._C.last_fused_launch()["backward"] == plan["backward_config"]
            low, _ = _make(case, seed_of("rpb-det-rep", i, dn), dtype, 16, 16)
            leaves = [low[n] for n in low if low[n] is not None]
            grads = []
            for _ in range(2):
                out = NA[rank](low["q"], low["k"], low["v"], ks, stride=st, dilation=dil,
                               is_causal=causal, additional_keys=low["add_k"],
                               additional_values=low["add_v"], rpb=low["rpb"],
                               deterministic=True)
                g = torch.randn(out.shape, generator=torch.Generator().manual_seed(i))
                grads.append(torch.autograd.grad(out, leaves, g.to(out))
                             )
            for a, b in zip(*grads):
                assert torch.equal(a, b), f"case {i} {dn}: gradients differ between runs"
    assert off_diagonal > 0, "no case ran the lane-by-lane d rpb adds"
    with pytest.raises(ValueError, match="bwd_rpb_sums='shared' with deterministic=true"):
        fna.fused_plan((2, 16, 16, 2, 16), 5, rpb=True, deterministic=True,
                       tuning={"bwd_rpb_sums": "shared"})
    # Too large for the per-warp tables: the composition (no fused backward in the plan).
    case = (3, [9, 17, 17], [9, 17, 17], [1, 1, 1], [1, 1, 1], [False, True, False], 2, 2, 0)
    plan = fna.fused_plan((2, *case[1], 2, 128), case[2], is_causal=case[5], rpb=True,
                          dtype="bfloat16", deterministic=True)
    assert plan["backward_rpb_sums"] == "", plan
    _run(case, torch.bfloat16, seed_of("rpb-det-large"), "large table deterministic", D=128,
         Dv=128, deterministic=True)


def test_errors():
    case = CASES[3]
    low, _ = _make(case, seed_of("rpb-cuda-err"), torch.bfloat16, 16, 16)
    ks = case[2]
    q, k, v, rpb = (low[n].detach() for n in ("q", "k", "v", "rpb"))
    out, lse = fna.na2d(q, k, v, ks, rpb=rpb, return_lse=True, backend="cuda-fused")
    d_out = torch.randn_like(out)
    with pytest.raises(Exception, match="bwd_rpb_sums='global' with deterministic"):
        fna.na_backward(d_out, q, k, v, out, lse, ks, rpb=rpb, backend="cuda-fused",
                        deterministic=True, tuning={"bwd_rpb_sums": "global"})
    if _hopper():
        # Padded head dim 256: the warp-specialized backward has no bias there.
        big, _ = _make(case, seed_of("rpb-cuda-err-256"), torch.bfloat16, 256, 256)
        qb, kb, vb = (big[n].detach() for n in ("q", "k", "v"))
        ob, lb = fna.na2d(qb, kb, vb, ks, rpb=rpb, return_lse=True, backend="cuda-fused")
        with pytest.raises(Exception, match="sm90ws backward at padded head dim 256 adds no bias"):
            fna.na_backward(torch.randn_like(ob), qb, kb, vb, ob, lb, ks, rpb=rpb,
                            backend="cuda-fused", tuning={"bwd_kernel": "sm90ws"})
    # The explicit backward returns d rpb last, equal to autograd's.
    grads = fna.na_backward(d_out, q, k, v, out, lse, ks, rpb=rpb, backend="cuda-fused")
    x = {n: low[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v", "rpb")}
    o2 = fna.na2d(x["q"], x["k"], x["v"], ks, rpb=x["rpb"], backend="cuda-fused")
    auto = torch.autograd.grad(o2, [x["q"], x["k"], x["v"], x["rpb"]], d_out)
    for a, b in zip(grads, auto):
        assert torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1e-2)
    assert grads[-1].shape == rpb.shape and math.isfinite(grads[-1].abs().sum().item())


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_every_backward_config(rank):
    """Every backward tile configuration that takes a bias (sm80, plain and warp-specialized
    Hopper):
    query and key tiles whose last extent is a multiple of 8 sum d rpb along diagonals first,
    the others (3-D cubes of 4) add each value by itself; both against the reference."""
    case = {1: (1, [70], [9], [1], [2], [False], 2, 1, 0),
            2: (2, [18, 20], [5, 7], [1, 1], [1, 2], [False, True], 2, 2, 0),
            3: (3, [9, 10, 12], [3, 5, 5], [1, 1, 1], [1, 1, 2], [False, False, True], 2, 1, 0)}[rank]
    names = [n for n in fna.fused_backward_configs(rank, torch.bfloat16, 16)
             if _hopper() or "_sm90" not in n]
    assert names
    for name in names:
        _run(case, torch.bfloat16, seed_of("rpb-cuda-cfg", name), name, backward_config=name)


def test_large_table_reads_global_memory():
    """Tables the staged layout does not take (over 20 KiB: a 1-D window of 2600 has 5199
    entries; a 2-D window over 16 on the last axis) are read in global memory by the kernels
    that otherwise stage them (the warp-specialized forward copies each key tile's slice);
    fused_plan says which."""
    for case, q in (((1, [2700], [2600], [1], [1], [False], 2, 1, 0), (2, 2700, 2, 16)),
                    ((2, [12, 40], [3, 19], [1, 1], [1, 2], [False, False], 2, 1, 0),
                     (2, 12, 40, 2, 16))):
        for name, kw in _variants():
            if name == "auto" or name.endswith("_global"):
                continue
            plan = fna.fused_plan(q, case[2], dilation=case[4], rpb=True, **kw)
            assert plan["rpb_table"] == ("tiles" if plan["family"] == "sm90ws" else "global"), plan
            _run(case, torch.bfloat16, seed_of("rpb-cuda-large", name, case[0]),
                 f"large table {name} {case}", **kw)
    plan = fna.fused_plan((2, 2200, 2, 16), 200, rpb=True, tuning={"fwd_schedule": "mma_sync"})
    assert plan["rpb_table"] == "shared", plan
    plan = fna.fused_plan((2, 8, 12, 12, 2, 16), (3, 5, 7), rpb=True,
                          tuning={"fwd_schedule": "mma_sync"})
    assert plan["rpb_table"] == "shared", plan


def test_rank3_plain_tiles_and_staged():
    """The plain Hopper forward at rank 3 adds the bias from key-tile slices of the table
    (fused_plan: "tiles"); tuning fwd_rpb_stage 'on' keeps the staged table (a test per score)
    and 'off' the global one: each against the reference."""
    if not _hopper():
        pytest.skip("the plain Hopper forward needs compute capability 9.0")
    plain = {"fwd_schedule": "plain"}
    q = (2, 8, 12, 12, 2, 64)
    assert fna.fused_plan(q, (3, 5, 7), rpb=True, tuning=plain)["rpb_table"] == "tiles"
    assert fna.fused_plan(q, (3, 5, 7), rpb=True, tuning={**plain, "fwd_rpb_stage": "on"})[
        "rpb_table"] == "shared"
    assert fna.fused_plan(q, (3, 5, 7), rpb=True, tuning={**plain, "fwd_rpb_stage": "off"})[
        "rpb_table"] == "global"
    for i, case in enumerate(CASES):
        if case[0] != 3:
            continue
        for stage in ("on", "off"):
            _run(case, torch.bfloat16, seed_of("rpb-cuda-rank3", i, stage),
                 f"case {i} fwd_rpb_stage={stage}", D=64, Dv=64,
                 tuning={**plain, "fwd_rpb_stage": stage})


def test_stage_tuning():
    """tuning fwd_rpb_stage: 'off' reads the table in global memory, 'on' where it cannot be
    staged and without a bias are errors naming the key."""
    q = (2, 24, 24, 2, 32)
    assert fna.fused_plan(q, 5, rpb=True, tuning={"fwd_schedule": "mma_sync",
                                                  "fwd_rpb_stage": "off"})["rpb_table"] == "global"
    with pytest.raises(NotImplementedError, match="fwd_rpb_stage needs a relative positional"):
        fna.fused_plan(q, 5, tuning={"fwd_rpb_stage": "on"})
    with pytest.raises(NotImplementedError, match="fwd_rpb_stage='on'"):
        fna.fused_plan((2, 2700, 2, 16), 2600, rpb=True,
                       tuning={"fwd_schedule": "mma_sync", "fwd_rpb_stage": "on"})
    if _hopper():
        with pytest.raises(NotImplementedError, match="fwd_rpb_stage needs the sm80 or plain"):
            fna.fused_plan(q, 5, rpb=True, tuning={"fwd_schedule": "warp_specialized",
                                                   "fwd_rpb_stage": "on"})
