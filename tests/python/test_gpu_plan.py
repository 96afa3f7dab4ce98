"""The cuda-fused plan on the GPU: the plan fna.fused_plan reports is what runs, for every kernel
family, forward and backward; tuning= (every field the plan would otherwise choose, errors for
what it cannot honour), NATTEN's tuning keywords, tile walks, the strip forward's choices, and the
autotuner (tuning="auto"). Runs on the device (tools/gpu/run.sh pytest); skipped without a GPU."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import seed_of  # noqa: E402
from test_torch import np64, oracle  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_fused_plan_walk():
    """fna.fused_plan's tile walks: a permutation of the spatial axes, fastest first; 3d-video's
    windows (18x24x24 on 30x48x80) cover most of axes 0 and 1, so both kernels walk 0, 1, 2 on a
    GPU with H100-like SM counts, while 2d-large's square windows over square query tiles keep the
    default (last axis fastest); tuning fwd_walk / bwd_walk set the walks, and a walk that does not name each axis
    once is an error naming it."""
    import torch
    video = ((1, 30, 48, 80, 2, 128), (18, 24, 24))
    large = ((1, 256, 256, 2, 128), (63, 63))
    for shape, ks in (video, large, ((1, 300, 4, 32), (33,))):
        plan = fna.fused_plan(shape, ks, dtype="bfloat16")
        rank = len(ks)
        assert sorted(plan["walk"]) == list(range(rank))
        assert sorted(plan["backward_walk"]) == list(range(rank))
    # Square query tiles keep the default there (on Hopper the plan's own 24x8 tiles may walk
    # their long axis first).
    hopper = torch.cuda.get_device_capability() == (9, 0)
    square = "fna_fwd_sm90ws_bf16_d128_q8x16_kv8x8_w12" if hopper else None
    assert fna.fused_plan(*large, dtype="bfloat16", config=square)["walk"] == [1, 0]
    assert fna.fused_plan(*large, dtype="bfloat16")["backward_walk"] == [1, 0]
    plan = fna.fused_plan(*video, dtype="bfloat16", tuning={"fwd_walk": "102", "bwd_walk": "201"})
    assert plan["walk"] == [1, 0, 2] and plan["backward_walk"] == [2, 0, 1]
    assert plan["tuning"] == "fwd_walk=102,bwd_walk=201"
    for bad in ("110", "01", "0123"):
        with pytest.raises(ValueError, match=f"fwd_walk='{bad}'"):
            fna.fused_plan(*video, dtype="bfloat16", tuning={"fwd_walk": bad})
    if torch.cuda.get_device_properties(0).multi_processor_count < 100:
        pytest.skip("the 3d-video walk is checked on GPUs with >= 100 SMs (the run of resident "
                    "tiles the heuristic models)")
    plan = fna.fused_plan(*video, dtype="bfloat16")
    assert plan["walk"] == [0, 1, 2] and plan["backward_walk"] == [0, 1, 2]


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_fused_plan_strip():
    """2d-nat (13x13 windows at head dim 64, where the strip forward is the fastest configuration
    measured, bench/heuristic_quality.py) takes the strip forward, whose CTAs walk row segments,
    then strips (walk [0, 1]), as it does with dilation or causal when tuning asks for it; tuning
    fwd_strip off brings back the box forward or the tiled kernels (whichever the plan's cost
    model prefers: on Hopper 2d-nat's box forward and best tiled kernel are within 4%), and
    fwd_box off too the tiled kernels; 7x7 windows keep the tiled kernels unless fwd_strip is on;
    the strip and box forwards multiply the same pairs, so their outputs agree."""
    import torch
    plan = fna.fused_plan((8, 128, 128, 8, 64), (13, 13), dtype="bfloat16")
    assert plan["config"].startswith("fna_fwd_strip_bf16_d64_"), plan["config"]
    assert plan["family"] == "strip" and plan["walk"] == [0, 1]
    shape = (2, 128, 128, 2, 64)
    for dil, causal in (((1, 1), False), ((2, 2), False), ((1, 1), (True, False))):
        plan = fna.fused_plan(shape, (13, 13), dilation=dil, is_causal=causal, dtype="bfloat16",
                              tuning={"fwd_strip": "on"})
        assert plan["config"].startswith("fna_fwd_strip_bf16_d64_"), plan["config"]
        assert plan["family"] == "strip" and plan["walk"] == [0, 1]
    assert fna.fused_plan(shape, (7, 7), dtype="bfloat16")["family"] not in ("strip", "box")
    assert fna.fused_plan(shape, (7, 7), dtype="bfloat16",
                          tuning={"fwd_strip": "on"})["family"] == "strip"
    off = {"fwd_strip": "off"}
    assert fna.fused_plan(shape, (13, 13), dtype="bfloat16", tuning=off)["family"] != "strip"
    assert fna.fused_plan(shape, (13, 13), dtype="bfloat16",
                          tuning={"fwd_strip": "off", "fwd_box": "off"})["family"] != "box"
    assert fna.fused_plan(shape, (13, 13), dilation=(2, 2), dtype="bfloat16",
                          tuning=off)["family"] != "strip"
    g = torch.Generator(device="cuda").manual_seed(seed_of("fused_plan_strip"))
    q, k, v = (torch.randn((2, 70, 90, 2, 48), device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    strip = fna.na2d(q, k, v, (11, 13), config="fna_fwd_strip_bf16_d64_q8x16_b4x4_w8")
    box = fna.na2d(q, k, v, (11, 13), config="fna_fwd_box_bf16_d64_q16x16_b4x4_w16")
    ref = fna.na2d(q.float(), k.float(), v.float(), (11, 13), backend="cuda-fused")
    assert (strip.float() - box.float()).abs().max().item() <= 1e-2
    assert (strip.float() - ref).abs().max().item() <= 3e-2


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_fused_plan_strip_rows():
    """The strip forward's rows in flight on 2d-nat: the heuristic takes the most whose halo rows
    fit the ring with four bands to spare (12 warps where a block may opt in to 227 KB of shared
    memory, as on Hopper); each of the 8 / 12 / 16-row configurations named explicitly computes
    each 4x4 box exactly as the others (the same chunks in the same order), so their outputs are
    bitwise equal."""
    import torch
    shape = (2, 128, 128, 2, 64)
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    default = fna.fused_plan((8, 128, 128, 8, 64), (13, 13), dtype="bfloat16")["config"]
    if optin >= 227 * 1024:
        assert default == "fna_fwd_strip_bf16_d64_q12x16_b4x4_w12", default
    g = torch.Generator(device="cuda").manual_seed(seed_of("fused_plan_strip_rows"))
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    out = fna.na2d(q, k, v, (13, 13), backend="cuda-fused", tuning={"fwd_strip": "on"})
    ref = fna.na2d(q.float(), k.float(), v.float(), (13, 13), backend="cuda-fused")
    assert (out.float() - ref).abs().max().item() <= 3e-2
    ran = 0
    for rows in (8, 12, 16):
        name = f"fna_fwd_strip_bf16_d64_q{rows}x16_b4x4_w{rows}"
        try:
            forced = fna.na2d(q, k, v, (13, 13), config=name)
        except NotImplementedError:
            assert rows > 8 and optin < 227 * 1024  # its ring does not fit this device
            continue
        assert torch.equal(forced, out), rows
        ran += 1
    assert ran >= 1


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("dims", [(32, 32), (32, 16), (24, 8)])
def test_strip_head_dim_32_and_2x8_boxes(dims):
    """The strip forward at head dims up to 32 (its products skip the ring rows' columns past 32)
    computes each 4x4 box as the head-dim-64 strip does, so their outputs are bitwise equal; its
    2x8 warp boxes (7x7 windows: two 64-key chunks per box instead of three) give the float64
    oracle's output with dilation, causal and stride. NAT-Tiny's first stage (7x7 at head dim
    32) plans the head-dim-32 strip with 2x8 boxes and 12-row steps when the strip forward is
    asked for; its 14x14 third stage, 14-row steps (one step covers the grid)."""
    d, dv = dims
    ks = (7, 7)
    plan = fna.fused_plan((32, 56, 56, 3, 32), ks, dtype="bfloat16", tuning={"fwd_strip": "on"})
    assert plan["config"] == "fna_fwd_strip_bf16_d32_q12x16_b2x8_w12", plan["config"]
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    if optin >= 227 * 1024:  # (the 14-row ring fits)
        plan = fna.fused_plan((32, 14, 14, 12, 32), ks, dtype="bfloat16",
                              tuning={"fwd_strip": "on"})
        assert plan["config"] == "fna_fwd_strip_bf16_d32_q14x16_b2x8_w14", plan["config"]
    g = torch.Generator(device="cuda").manual_seed(seed_of("strip-d32", d, dv))
    shape = (2, 45, 50, 3)
    q, k = (torch.randn(shape + (d,), device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    v = torch.randn(shape + (dv,), device="cuda", dtype=torch.bfloat16, generator=g)
    names = [n for n in fna.fused_configs(2, "bfloat16", max(d, dv)) if "_strip_" in n]
    assert any("_d32_" in n and "_b2x8_" in n for n in names), names
    for st, dil, causal in (((1, 1), (1, 1), (False, False)), ((2, 1), (2, 3), (True, False)),
                            ((1, 3), (1, 2), (False, True))):
        ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=list(st), dil=list(dil),
                          causal=list(causal), add_k=None, add_v=None))["out"]
        outs = {}
        for name in names:
            try:
                outs[name] = fna.na2d(q, k, v, ks, stride=st, dilation=dil, is_causal=causal,
                                      config=name)
            except NotImplementedError:
                assert optin < 227 * 1024, name  # a ring that does not fit this device
                continue
            err = float(np.abs(np64(outs[name]) - ref).max())
            assert err < 2e-2, f"{name} stride {st} dilation {dil} causal {causal}: {err}"
        for name, out in outs.items():
            twin = name.replace("_d32_", "_d64_")
            if "_d32_" in name and twin in outs:
                assert torch.equal(out, outs[twin]), (name, st, dil, causal)
        assert any("_b2x8_" in n for n in outs) and any("_d32_" in n for n in outs), list(outs)


def _family_cases(hopper):
    """(name, query shape, kernel, dtype, tuning) problems whose plans take each forward family."""
    cases = [
        ("sm80", (1, 40, 36, 2, 32), (7, 5), torch.float32, None),
        ("strip", (2, 128, 128, 2, 64), (13, 13), torch.bfloat16, {"fwd_strip": "on"}),
        ("box", (2, 128, 128, 2, 64), (13, 13), torch.bfloat16,
         {"fwd_strip": "off", "fwd_box": "on"}),
        ("simt", (2, 56, 56, 3, 32), (7, 7), torch.bfloat16, {"fwd_simt": "on"}),
    ]
    if hopper:
        cases += [
            ("sm90ws", (1, 300, 2, 128), (33,), torch.bfloat16, None),
            ("sm90", (1, 300, 2, 64), (33,), torch.bfloat16, {"fwd_schedule": "plain"}),
            ("sm90ws", (1, 40, 36, 2, 128), (9, 7), torch.float16, None),
            ("sm90ws", (1, 6, 20, 18, 2, 128), (3, 5, 5), torch.bfloat16,
             {"persistent": True, "fwd_copy": "cp_async"}),
            ("sm90", (1, 40, 36, 2, 128), (9, 7), torch.bfloat16, {"fwd_schedule": "plain"}),
            ("sm90ws", (1, 300, 2, 64), (33,), torch.bfloat16, {"fwd_schedule": "warp_specialized"}),
            ("sm90ws", (1, 300, 2, 256), (33,), torch.bfloat16, None),
            ("sm90ws", (1, 6, 20, 18, 2, 192), (3, 5, 5), torch.float16, {"persistent": True}),
        ]
    return cases


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_plan_is_what_runs():
    """For every kernel family, forward and backward, the plan fna.fused_plan reports is the one
    the launch consumed (configuration, grid, shared memory, copy engine), and the result matches
    the float64 oracle."""
    import torch
    hopper = torch.cuda.get_device_capability() == (9, 0)
    seen = set()
    for i, (family, shape, ks, dtype, tuning) in enumerate(_family_cases(hopper)):
        plan = fna.fused_plan(shape, ks, dtype=str(dtype).replace("torch.", ""), tuning=tuning)
        assert plan["family"] == family, (family, plan["config"])
        g = torch.Generator(device="cuda").manual_seed(seed_of(f"plan-is-what-runs-{i}"))
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        for t in (q, k, v):
            t.requires_grad_(True)
        na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(ks)]
        out = na(q, k, v, ks, backend="cuda-fused", tuning=tuning, allow_tf32=False)
        ran = fna._C.last_fused_launch()
        assert ran["forward"] == plan["config"]
        assert ran["forward_grid"] == plan["grid"] and ran["forward_smem"] == plan["smem"]
        assert ran["forward_tma"] == (plan["copy"] == "tma")
        if tuning and tuning.get("persistent"):
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            assert plan["persistent"] and plan["grid"] <= sms
        # Against the float32 forward (split TF32: float32-class accuracy), itself checked
        # against the float64 oracle in the sm80 case.
        if dtype == torch.float32:
            ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=[1] * len(ks), dil=[1] * len(ks),
                              causal=[False] * len(ks), add_k=None, add_v=None))["out"]
            assert float(np.abs(np64(out) - ref).max()) < 1e-3, plan["config"]
        else:
            ref = na(q.detach().float(), k.detach().float(), v.detach().float(), ks,
                     backend="cuda-fused", allow_tf32=False)
            assert (out.float() - ref).abs().max().item() < 3e-2, plan["config"]
        seen.add(family)
        out.float().square().sum().backward()
        ran = fna._C.last_fused_launch()
        assert ran["backward"] == plan["backward_config"], (ran, plan["backward_config"])
        assert ran["backward_tma"] == (plan["backward_copy"] == "tma")
    assert seen >= ({"sm80", "strip", "box", "simt"} | ({"sm90", "sm90ws"} if hopper else set()))
    # Every backward family, named through tuning, and the deterministic mode (sm80, and the
    # plain Hopper kernel with a dQ kernel after it).
    shape, ks = (1, 24, 20, 2, 64), (5, 7)
    families = ["sm80"] + (["sm90", "sm90ws"] if hopper else [])
    g = torch.Generator(device="cuda").manual_seed(seed_of("plan-is-what-runs-bwd"))
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    grads = {}
    for fam in families:
        for det in ((False, True) if fam in ("sm80", "sm90") else (False,)):
            tuning = {"bwd_kernel": fam}
            plan = fna.fused_plan(shape, ks, dtype="bfloat16", tuning=tuning, deterministic=det)
            assert plan["backward_family"] == fam and plan["backward_deterministic"] == det
            out = fna.na2d(q, k, v, ks, backend="cuda-fused", tuning=tuning, deterministic=det)
            dq, dk, dv = torch.autograd.grad(out.float().square().sum(), (q, k, v))
            assert fna._C.last_fused_launch()["backward"] == plan["backward_config"]
            optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
            assert 0 < plan["backward_smem"] <= optin
            grads[(fam, det)] = (dq.float(), dk.float(), dv.float())
    base = grads[("sm80", True)]
    for key, gr in grads.items():
        for a, b in zip(gr, base):
            assert (a - b).abs().max().item() <= 5e-2 * max(1.0, b.abs().max().item()), key
    if hopper:
        with pytest.raises(ValueError, match="deterministic"):
            fna.fused_plan(shape, ks, dtype="bfloat16", tuning={"bwd_kernel": "sm90ws"},
                           deterministic=True)
    else:
        with pytest.raises(NotImplementedError, match="compute capability 9.0"):
            fna.fused_plan(shape, ks, dtype="bfloat16", tuning={"bwd_kernel": "sm90"})


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_tuning_errors_on_gpu():
    """Tuning the plan cannot honour is an error naming the field, never ignored: a variant of
    another family's kernel (unsupported), a config together with a choice among configs
    (invalid), TMA where TMA cannot load (additional keys)."""
    import torch
    hopper = torch.cuda.get_device_capability() == (9, 0)
    f32 = (1, 40, 36, 2, 32), (7, 5)
    with pytest.raises(NotImplementedError, match="persistent='on'"):
        fna.fused_plan(*f32, dtype="float32", tuning={"persistent": True})
    with pytest.raises(NotImplementedError, match="fwd_spread"):
        fna.fused_plan(*f32, dtype="float32", tuning={"fwd_spread": "on"})
    name = fna.fused_configs(2, "float32", 32)[0]
    with pytest.raises(ValueError, match="give one or the other"):
        fna.fused_plan(*f32, dtype="float32", config=name, tuning={"fwd_strip": "off"})
    with pytest.raises(NotImplementedError, match="bwd_copy"):
        fna.fused_plan(*f32, dtype="float32", tuning={"bwd_copy": "tma"})
    if hopper:
        g = torch.Generator(device="cuda").manual_seed(seed_of("tuning-errors"))
        q, k, v = (torch.randn((1, 40, 36, 2, 128), device="cuda", dtype=torch.bfloat16,
                               generator=g) for _ in range(3))
        ak, av = (torch.randn((1, 5, 2, 128), device="cuda", dtype=torch.bfloat16, generator=g)
                  for _ in range(2))
        with pytest.raises(NotImplementedError, match="fwd_copy='tma'"):
            fna.na2d(q, k, v, (9, 7), additional_keys=ak, additional_values=av,
                     backend="cuda-fused", tuning={"fwd_copy": "tma"})
    else:
        with pytest.raises(ValueError, match="fwd_schedule"):
            fna.fused_plan(*f32, dtype="bfloat16", tuning={"fwd_schedule": "plain"})


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_natten_tuning_keywords():
    """NATTEN's tuning keywords pick what they name: tile shapes the configuration with those
    tiles (forward and backward), kernel_schedule the Hopper schedule, run_persistent_kernel
    persistent CTAs; keywords without a meaning here raise."""
    import torch
    hopper = torch.cuda.get_device_capability() == (9, 0)
    g = torch.Generator(device="cuda").manual_seed(seed_of("natten-tuning"))
    q, k, v = (torch.randn((1, 40, 36, 2, 128), device="cuda", dtype=torch.bfloat16,
                           generator=g).requires_grad_() for _ in range(3))
    out = fna.na2d(q, k, v, (9, 7), q_tile_shape=(8, 16), kv_tile_shape=(8, 8))
    assert "_q8x16_kv8x8_" in fna._C.last_fused_launch()["forward"]
    assert fna._C.last_fused_launch()["forward"].startswith(
        "fna_fwd_sm90ws_" if hopper else "fna_fwd_sm80_")
    out = fna.na2d(q, k, v, (9, 7), backward_q_tile_shape=(8, 8), backward_kv_tile_shape=(8, 16))
    out.float().sum().backward()
    assert "_kv8x16_q8x8_" in fna._C.last_fused_launch()["backward"]
    if hopper:
        fna.na2d(q, k, v, (9, 7), kernel_schedule="non")
        assert fna._C.last_fused_launch()["forward"].startswith("fna_fwd_sm90_")
        fna.na2d(q, k, v, (9, 7), kernel_schedule="coop", run_persistent_kernel=True)
        assert fna._C.last_fused_launch()["forward"].startswith("fna_fwd_sm90ws_")
    with pytest.raises(ValueError, match="pp"):
        fna.na2d(q, k, v, (9, 7), kernel_schedule="pp")
    with pytest.raises(ValueError, match="backward_use_pt_reduction"):
        fna.na2d(q, k, v, (9, 7), backward_use_pt_reduction=True)
    with pytest.raises(ValueError, match="q_tile_shape"):
        fna.na2d(q, k, v, (9, 7), q_tile_shape=(3, 5))
    with pytest.raises(TypeError, match="unexpected keyword"):
        fna.na2d(q, k, v, (9, 7), q_tile=(8, 16))


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_natten_backend_names():
    """NATTEN's backend names run the kernels they name: cutlass-fna the mma.sync (sm80) forward
    and backward on every GPU (tuning fwd_schedule=mma_sync: the plan's choice among the sm80
    configurations, as on an sm_80 GPU); hopper-fna the wgmma forward on a Hopper and an error
    elsewhere. Results equal cuda-fused's within bfloat16 rounding."""
    hopper = torch.cuda.get_device_capability() == (9, 0)
    g = torch.Generator(device="cuda").manual_seed(seed_of("natten-backends"))
    shape, ks = (1, 40, 36, 2, 64), (9, 7)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
               .requires_grad_() for _ in range(3))
    ref = fna.na2d(q.detach(), k.detach(), v.detach(), ks, backend="cuda-fused")
    out = fna.na2d(q, k, v, ks, backend="cutlass-fna")
    out.float().square().sum().backward()
    ran = fna._C.last_fused_launch()
    assert ran["forward"].startswith("fna_fwd_sm80_"), ran
    assert ran["backward"].startswith("fna_bwd_sm80_"), ran
    assert (out.float() - ref.float()).abs().max().item() <= 2e-2
    if not hopper:  # the plan's own choice is already an sm80 configuration
        assert ran["forward"] == fna.fused_plan(shape, ks, dtype="bfloat16")["config"]
    # cutlass-fna is tuning fwd_schedule=mma_sync: the plan's choice among the sm80 tiles (at
    # head dim 32 those of its own bucket), which contradicts asking for the box forward.
    mma = {"fwd_schedule": "mma_sync"}
    assert ran["forward"] == fna.fused_plan(shape, ks, dtype="bfloat16", tuning=mma)["config"]
    assert fna.fused_plan((1, 40, 36, 2, 32), ks, dtype="bfloat16",
                          tuning=mma)["config"].startswith("fna_fwd_sm80_bf16_d32_")
    with pytest.raises(ValueError, match="fwd_box='on' contradicts fwd_schedule='mma_sync'"):
        fna.fused_plan(shape, ks, dtype="bfloat16", tuning=dict(mma, fwd_box="on"))
    if hopper:
        fna.na2d(q, k, v, ks, backend="hopper-fna")
        assert fna._C.last_fused_launch()["forward"].startswith(("fna_fwd_sm90_",
                                                                 "fna_fwd_sm90ws_"))
        with pytest.raises(ValueError, match="float16 / bfloat16"):
            fna.na2d(q.float(), k.float(), v.float(), ks, backend="hopper-fna")
    else:
        with pytest.raises(ValueError, match="compute capability 9.0"):
            fna.na2d(q, k, v, ks, backend="hopper-fna")
    with pytest.raises(ValueError, match="Blackwell"):
        fna.na2d(q, k, v, ks, backend="blackwell-fna")


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_autotune(tmp_path):
    """tuning="auto": the first call of a signature times the candidates and caches the fastest on
    disk (one file per direction); fna.fused_plan then reports what runs; a fresh process-level
    cache reads the disk without timing; results match the heuristic's; inside CUDA graph capture
    nothing is timed (no file appears) and the call still runs."""
    import os
    g = torch.Generator(device="cuda").manual_seed(seed_of("autotune"))
    shape, ks = (1, 24, 40, 2, 64), (7, 9)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
               .requires_grad_() for _ in range(3))
    tun = {"mode": "auto", "autotune_cache_dir": str(tmp_path / "c1")}
    fna._C.autotune_clear_memory_cache()
    out = fna.na2d(q, k, v, ks, backend="cuda-fused", tuning=tun)
    out.float().square().sum().backward()
    ran = fna._C.last_fused_launch()
    files = sorted(os.listdir(tmp_path / "c1"))
    assert len(files) == 2, files  # forward and backward signatures
    plan = fna.fused_plan(shape, ks, dtype="bfloat16", tuning=tun)
    assert plan["config"] == ran["forward"]
    assert plan["config"] in fna.fused_configs(2, "bfloat16", 64)
    grads = [t.grad.clone() for t in (q, k, v)]
    ref = fna.na2d(q.detach(), k.detach(), v.detach(), ks, backend="cuda-fused")
    assert (out.float() - ref.float()).abs().max().item() <= 2e-2
    # A new process-level cache: the disk entries are read, nothing is timed (files unchanged).
    stamps = [os.stat(tmp_path / "c1" / f).st_mtime_ns for f in files]
    fna._C.autotune_clear_memory_cache()
    for t in (q, k, v):
        t.grad = None
    out2 = fna.na2d(q, k, v, ks, backend="cuda-fused", tuning=tun)
    out2.float().square().sum().backward()
    assert fna._C.last_fused_launch() == ran
    assert [os.stat(tmp_path / "c1" / f).st_mtime_ns for f in files] == stamps
    assert torch.equal(out2, out)
    for a, b in zip(grads, (q.grad, k.grad, v.grad)):
        assert (a.float() - b.float()).abs().max().item() <= 5e-2 * max(1.0, a.abs().max().item())
    # Inside CUDA graph capture: never timed (no cache file), the plan's pick runs.
    tun2 = {"mode": "auto", "autotune_cache_dir": str(tmp_path / "c2")}
    qd, kd, vd = (t.detach() for t in (q, k, v))
    heur = fna.fused_plan(shape, ks, dtype="bfloat16")["config"]
    fna.na2d(qd, kd, vd, ks, backend="cuda-fused")  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out3 = fna.na2d(qd, kd, vd, ks, backend="cuda-fused", tuning=tun2)
    graph.replay()
    torch.cuda.synchronize()
    assert not (tmp_path / "c2").exists() or not os.listdir(tmp_path / "c2")
    assert fna._C.last_fused_launch()["forward"] == heur
    assert (out3.float() - ref.float()).abs().max().item() <= 2e-2


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("dim", [16, 32])
def test_small_head_dims_take_padded_kernels(dim):
    """Head dims whose own bucket has no wgmma kernel (16, 32) list the next bucket's
    configurations too; on compute capability 9.0 the plan chooses among both (never the
    mma.sync tiles there), and every listed configuration that runs the problem, padded or not,
    matches the float64 oracle."""
    hopper = torch.cuda.get_device_capability() == (9, 0)
    names = fna.fused_configs(2, "bfloat16", dim)
    assert any("_d64_" in n for n in names) and any("_d32_" in n for n in names), names
    shape, ks = (2, 30, 26, 3, dim), (7, 7)
    plan = fna.fused_plan(shape, ks, dtype="bfloat16")
    if hopper:
        assert plan["family"] != "sm80", plan["config"]
    g = torch.Generator(device="cuda").manual_seed(seed_of("small-head-dims", dim))
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=[1, 1], dil=[1, 1], causal=[False, False],
                      add_k=None, add_v=None))["out"]
    ran = 0
    for name in names:
        try:
            out = fna.na2d(q, k, v, ks, config=name)
        except NotImplementedError:  # a Hopper configuration elsewhere, or one that cannot fit
            continue
        err = float(np.abs(np64(out) - ref).max())
        assert err < 2e-2, f"{name}: max error {err}"
        ran += 1
    assert ran >= (len(names) // 2 if hopper else 1)


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("copy", ["tma", "cp_async"])
def test_head_dim_256_wgmma(rank, copy):
    """Head dims 129-256 (padded to 256) take the warp-specialized wgmma forward on compute
    capability 9.0 (its two-stage ring with K and V handed back apart), by TMA or cp.async
    copies, and match the float64 oracle: D = D_v = 256, D = 192 with D_v = 160 (padded columns),
    dilation, causal on an axis, GQA, and (cp.async only) additional keys."""
    hopper = torch.cuda.get_device_capability() == (9, 0)
    grids = {1: ((150,), (33,), (2,), (True,)), 2: ((27, 22), (9, 7), (2, 1), (False, True)),
             3: ((6, 11, 10), (3, 5, 5), (1, 2, 1), (True, False, False))}
    shape, ks, dil, causal = grids[rank]
    for i, (d, dv, heads, heads_kv, n_add) in enumerate(
            [(256, 256, 2, 2, 0), (192, 160, 4, 2, 0), (256, 200, 2, 1, 19)]):
        if n_add and copy == "tma":
            continue  # additional keys are loaded by cp.async
        g = torch.Generator(device="cuda").manual_seed(seed_of("d256-wgmma", rank, copy, i))
        mk = lambda *s: torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
        b = 2 if rank < 3 else 1  # (TMA maps hold four dims of length > 1 besides the head dim)
        q = mk(b, *shape, heads, d)
        k, v = mk(b, *shape, heads_kv, d), mk(b, *shape, heads_kv, dv)
        ak = mk(b, n_add, heads_kv, d) if n_add else None
        av = mk(b, n_add, heads_kv, dv) if n_add else None
        tuning = {"fwd_copy": copy}
        plan = fna.fused_plan(q.shape, ks, dilation=dil, is_causal=causal, dtype="bfloat16",
                              heads_kv=heads_kv, dim_v=dv, tuning=tuning)
        if hopper:
            assert plan["family"] == "sm90ws" and "_d256_" in plan["config"], plan["config"]
            assert plan["copy"] == copy
        na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]
        out = na(q, k, v, ks, dilation=dil, is_causal=causal, additional_keys=ak,
                 additional_values=av, backend="cuda-fused", tuning=tuning)
        assert fna._C.last_fused_launch()["forward"] == plan["config"]
        kr = k.repeat_interleave(heads // heads_kv, dim=-2)
        vr = v.repeat_interleave(heads // heads_kv, dim=-2)
        akr = ak.repeat_interleave(heads // heads_kv, dim=-2) if n_add else None
        avr = av.repeat_interleave(heads // heads_kv, dim=-2) if n_add else None
        ref = oracle(dict(q=q, k=kr, v=vr, ks=list(ks), st=[1] * rank, dil=list(dil),
                          causal=list(causal), add_k=akr, add_v=avr))["out"]
        err = float(np.abs(np64(out) - ref).max())
        assert err < 2e-2, f"{plan['config']} D={d} D_v={dv}: max error {err}"


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("dim", [16, 24, 32, 48, 128])
def test_backward_64_key_tiles(dim):
    """The plain Hopper dK / dV kernel's 64-key tiles (one warpgroup; at head dim 128 it takes
    both dQ column blocks): the plan takes them for 7x7 windows at head dims up to 64 (padded to
    64), not at 128, and up to head dim 32 its products cover 32 columns (backward_head_dim);
    every listed 64-key configuration gives the float64 oracle's gradients, with dilation, a
    causal axis, GQA and additional keys (their own 64-key tiles)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper backward needs compute capability 9.0")
    shape, ks = (1, 22, 19, 4, dim), (7, 7)
    # (At padded head dim 128 the plan's default is the strip dK / dV kernel: here it is off.)
    plan = fna.fused_plan(shape, ks, dtype="bfloat16", tuning={"bwd_strip": "off"})
    # The heuristic takes them at padded head dim 64 only (at 128 they ran slower).
    assert plan["backward_family"] == "sm90"
    assert int(np.prod(plan["backward_kv_tile"])) == (64 if dim <= 64 else 128), plan
    assert plan["backward_head_dim"] == (32 if dim <= 32 else 64 if dim <= 64 else 128), plan
    names = [n for n in fna.fused_backward_configs(2, "bfloat16", dim)
             if n.startswith("fna_bwd_sm90_") and ("_kv8x8_" in n or "_kv4x16_" in n)]
    assert names
    g = torch.Generator(device="cuda").manual_seed(seed_of("bwd-64-keys", dim))
    rnd = lambda *s: torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q = rnd(1, 22, 19, 4, dim).requires_grad_()
    k, v = (rnd(1, 22, 19, 2, dim).requires_grad_() for _ in range(2))
    ak, av = (rnd(1, 5, 2, dim).requires_grad_() for _ in range(2))
    kw = dict(dilation=(2, 1), is_causal=(False, True), additional_keys=ak, additional_values=av)
    d_out = rnd(1, 22, 19, 4, dim)
    ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=[1, 1], dil=[2, 1], causal=[False, True],
                      add_k=ak, add_v=av), d_out=d_out)
    for name in [None] + names:
        out = fna.na2d(q, k, v, ks, backend="cuda-fused", backward_config=name, **kw)
        grads = torch.autograd.grad(out, (q, k, v, ak, av), d_out)
        if name is not None:
            assert fna._C.last_fused_launch()["backward"] == name
        for got, key in zip(grads, ("dq", "dk", "dv", "d_add_k", "d_add_v")):
            mag = max(1.0, float(np.abs(ref[key]).max()))
            err = float(np.abs(np64(got) - ref[key]).max())
            assert err <= 3e-2 * mag, f"{name}: {key} max error {err} (max |ref| {mag})"


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("dims", [(32, 16), (16, 32), (8, 8), (32, 32)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_32_columns(dims, dtype):
    """Head dims up to 32 on the Hopper dK / dV kernel with 64-key tiles: its products cover 32
    columns of the head-dim-64 layout (backward_head_dim 32, also with D_v != D), and the gradients
    are the float64 oracle's, at the borders of a 2-D grid with a stride and over a 1-D causal one
    (the plan's own tiles and a named 64-key configuration)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper backward needs compute capability 9.0")
    D, Dv = dims
    g = torch.Generator(device="cuda").manual_seed(seed_of("bwd-32-cols", D, Dv, str(dtype)))
    rnd = lambda *s: torch.randn(s, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    na = {1: fna.na1d, 2: fna.na2d}
    for spatial, ks, st, causal in (((17, 30), (5, 7), (1, 2), (False, False)),
                                    ((300,), (9,), (1,), (True,))):
        rank = len(spatial)
        dt = str(dtype).split(".")[1]
        q, k = (rnd(2, *spatial, 3, D).requires_grad_() for _ in range(2))
        v = rnd(2, *spatial, 3, Dv).requires_grad_()
        d_out = rnd(2, *spatial, 3, Dv)
        ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=list(st), dil=[1] * rank,
                          causal=list(causal), add_k=None, add_v=None), d_out=d_out)
        named = [n for n in fna.fused_backward_configs(rank, dt, D)
                 if n.startswith("fna_bwd_sm90_") and ("_kv64_" if rank == 1 else "_kv8x8_") in n]
        assert len(named) == 1, named
        narrow = 0
        for name in (None, named[0]):
            plan = fna.fused_plan((2, *spatial, 3, D), ks, stride=st, is_causal=causal, dim_v=Dv,
                                  dtype=dt, backward_config=name)
            assert plan["backward_family"] == "sm90", plan
            keys = int(np.prod(plan["backward_kv_tile"]))
            assert plan["backward_head_dim"] == (32 if keys == 64 else 64), plan
            narrow += keys == 64
            out = na[rank](q, k, v, ks, stride=st, is_causal=causal, backend="cuda-fused",
                           backward_config=name)
            grads = torch.autograd.grad(out, (q, k, v), d_out)
            assert fna._C.last_fused_launch()["backward"] == plan["backward_config"]
            for got, key in zip(grads, ("dq", "dk", "dv")):
                mag = max(1.0, float(np.abs(ref[key]).max()))
                err = float(np.abs(np64(got) - ref[key]).max())
                assert err <= 3e-2 * mag, f"{spatial} {name}: {key} max error {err} (max |ref| {mag})"
        assert narrow >= 1


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_backward_q_pairs(dtype):
    """The Hopper dK / dV kernels' paired query tiles (two 64-query tiles per step, plain and
    warp-specialized; tuning bwd_q_pairs, head dim 64 with 128-key tiles): not by default (the
    whole-grid window runs the warp-specialized kernel unpaired), reported as backward_q_steps;
    'on' and 'off' give the float64 oracle's gradients over walks of odd and even length, with
    dilation, a causal axis, GQA, D_v != D and additional keys; 'on' where no kernel can pair
    (head dim 128, a bias) is an error naming the field."""
    dt = str(dtype).split(".")[1]
    if torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(NotImplementedError, match="bwd_q_pairs"):
            fna.fused_plan((1, 300, 2, 64), (33,), dtype=dt, tuning={"bwd_q_pairs": "on"})
        return
    # Whole-grid windows at head dim 64: the warp-specialized kernel, tiles unpaired unless asked.
    whole = fna.fused_plan((1, 4096, 2, 64), (4095,), dtype=dt)
    assert whole["backward_family"] == "sm90ws" and whole["backward_q_steps"] == 1, whole
    assert fna.fused_plan((1, 4096, 2, 64), (4095,), dtype=dt,
                          tuning={"bwd_q_pairs": "on"})["backward_q_steps"] == 2
    with pytest.raises(NotImplementedError, match="bwd_q_pairs"):
        fna.fused_plan((1, 300, 2, 128), (33,), dtype=dt, tuning={"bwd_q_pairs": "on"})
    with pytest.raises(NotImplementedError, match="bwd_q_pairs"):
        fna.fused_plan((1, 300, 2, 64), (33,), dtype=dt, rpb=True, tuning={"bwd_q_pairs": "on"})
    g = torch.Generator(device="cuda").manual_seed(seed_of("bwd-q-pairs", dt))
    rnd = lambda *s: torch.randn(s, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}
    # (spatial, kernel, dilation, causal, D, D_v, additional keys)
    cases = (((300,), (127,), (1,), (False,), 64, 64, 0),
             ((333,), (65,), (2,), (True,), 48, 64, 3),
             ((40, 36), (21, 13), (1, 2), (False, True), 64, 40, 0),
             ((6, 20, 18), (5, 9, 7), (1, 1, 2), (True, False, False), 64, 64, 5))
    for spatial, ks, dil, causal, D, Dv, n_add in cases:
        rank = len(spatial)
        q = rnd(2, *spatial, 4, D).requires_grad_()
        k = rnd(2, *spatial, 2, D).requires_grad_()
        v = rnd(2, *spatial, 2, Dv).requires_grad_()
        d_out = rnd(2, *spatial, 4, Dv)
        kw = dict(dilation=dil, is_causal=causal)
        leaves = [q, k, v]
        ak = av = None
        if n_add:
            ak, av = rnd(2, n_add, 2, D).requires_grad_(), rnd(2, n_add, 2, Dv).requires_grad_()
            kw.update(additional_keys=ak, additional_values=av)
            leaves += [ak, av]
        ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=[1] * rank, dil=list(dil),
                          causal=list(causal), add_k=ak, add_v=av), d_out=d_out)
        for fam, pairs in (("sm90", "on"), ("sm90", "off"), ("sm90ws", "on"), ("sm90ws", "off")):
            tuning = {"bwd_q_pairs": pairs, "bwd_kernel": fam}
            plan = fna.fused_plan((2, *spatial, 4, D), ks, dilation=dil, is_causal=causal,
                                  heads_kv=2, dim_v=Dv, dtype=dt, tuning=tuning)
            assert plan["backward_q_steps"] == (2 if pairs == "on" else 1), plan
            assert plan["backward_family"] == fam, plan
            out = na[rank](q, k, v, ks, backend="cuda-fused", tuning=tuning, **kw)
            grads = torch.autograd.grad(out, leaves, d_out)
            assert fna._C.last_fused_launch()["backward"] == plan["backward_config"]
            for got, key in zip(grads, ("dq", "dk", "dv", "d_add_k", "d_add_v")):
                mag = max(1.0, float(np.abs(ref[key]).max()))
                err = float(np.abs(np64(got) - ref[key]).max())
                assert err <= 3e-2 * mag, f"{spatial} {fam} {pairs}: {key} error {err} ({mag})"


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_head_dim_256_backward_wgmma(rank):
    """Head dims 129-256 on the warp-specialized wgmma dK / dV kernel (padded head dim 256: two
    warpgroups splitting the head dim over 64-key tiles), the plan's default there in float16 and
    bfloat16 (sm80 in deterministic mode and with a bias), by tuning bwd_kernel='sm90ws' too: the
    plan reports it with 64-key and 64-query tiles, and the gradients match the float64 oracle
    with D = D_v = 256, D = 192 with D_v = 160 (padded columns), dilation, a causal axis, GQA and
    additional keys, by TMA and by cp.async copies."""
    if torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(NotImplementedError):
            fna.fused_plan((1, 150, 2, 256), (33,), dtype="bfloat16",
                           tuning={"bwd_kernel": "sm90ws"})
        return
    for dtype in ("bfloat16", "float16"):
        default = fna.fused_plan((1, 150, 2, 256), (33,), dtype=dtype)
        assert default["backward_family"] == "sm90ws", default
        assert "_d256_" in default["backward_config"], default
    for kw in (dict(deterministic=True), dict(rpb=True)):
        other = fna.fused_plan((1, 150, 2, 256), (33,), dtype="bfloat16", **kw)
        assert other["backward_family"] == "sm80", (kw, other)
    grids = {1: ((150,), (33,), (2,), (True,)), 2: ((27, 22), (9, 7), (2, 1), (False, True)),
             3: ((6, 11, 10), (3, 5, 5), (1, 2, 1), (True, False, False))}
    shape, ks, dil, causal = grids[rank]
    for i, (d, dv, heads, heads_kv, n_add, copy) in enumerate(
            [(256, 256, 2, 2, 0, "tma"), (192, 160, 4, 2, 0, "cp_async"),
             (256, 200, 2, 1, 19, "tma")]):
        g = torch.Generator(device="cuda").manual_seed(seed_of("d256-bwd-wgmma", rank, i))
        mk = lambda *s: torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
        b = 2 if rank < 3 else 1
        q = mk(b, *shape, heads, d).requires_grad_()
        k, v = mk(b, *shape, heads_kv, d).requires_grad_(), mk(b, *shape, heads_kv, dv).requires_grad_()
        leaves = [q, k, v]
        ak = av = None
        if n_add:
            ak = mk(b, n_add, heads_kv, d).requires_grad_()
            av = mk(b, n_add, heads_kv, dv).requires_grad_()
            leaves += [ak, av]
        tuning = {"bwd_kernel": "sm90ws", "bwd_copy": copy}
        plan = fna.fused_plan(q.shape, ks, dilation=dil, is_causal=causal, dtype="bfloat16",
                              heads_kv=heads_kv, dim_v=dv, tuning=tuning)
        assert plan["backward_family"] == "sm90ws" and "_d256_" in plan["backward_config"], plan
        assert int(np.prod(plan["backward_kv_tile"])) == 64, plan
        assert int(np.prod(plan["backward_q_tile"])) == 64, plan
        na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]
        out = na(q, k, v, ks, dilation=dil, is_causal=causal, additional_keys=ak,
                 additional_values=av, backend="cuda-fused", tuning=tuning)
        d_out = mk(*out.shape)
        grads = torch.autograd.grad(out, leaves, d_out)
        assert fna._C.last_fused_launch()["backward"] == plan["backward_config"]
        ref = oracle(dict(q=q, k=k, v=v, ks=list(ks), st=[1] * rank, dil=list(dil),
                          causal=list(causal), add_k=ak, add_v=av), d_out=d_out)
        for got, key in zip(grads, ("dq", "dk", "dv", "d_add_k", "d_add_v")):
            mag = max(1.0, float(np.abs(ref[key]).max()))
            err = float(np.abs(np64(got) - ref[key]).max())
            assert err <= 3e-2 * mag, f"D={d} D_v={dv} {copy}: {key} max error {err} ({mag})"
