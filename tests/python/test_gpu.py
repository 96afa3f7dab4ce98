"""torch on the GPU: the CUDA backends through fna.na*d against the float64 oracle, the current
stream, torch.compile, the unfused ops, the modules, and device errors. Runs on the device
(tools/gpu/run.sh pytest); skipped where torch sees no GPU."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import check_close, seed_of  # noqa: E402
from test_numpy import random_problem  # noqa: E402
from test_torch import (AV, QK, TORCH_DTYPE, check_low_precision, np64, oracle,  # noqa: E402
                        run_na, to_torch)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA_BACKENDS = [None, "cuda-naive", "cuda-gemm"]


def cuda_problem(rng, rank, dtype=torch.float32):
    t = to_torch(random_problem(rng, rank), dtype)
    for n in ("q", "k", "v", "add_k", "add_v"):
        if t[n] is not None:
            t[n] = t[n].cuda().requires_grad_(True)
    return t


def to_cpu(t):
    tensors = ("q", "k", "v", "add_k", "add_v")
    return {n: x.detach().cpu() if n in tensors and x is not None else x for n, x in t.items()}


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_cuda_forward_backward(backend, rank):
    for case in range(3):
        rng = np.random.default_rng(seed_of("gpu", rank, case))
        t = cuda_problem(rng, rank)
        out, lse = run_na(t, backend, return_lse=True)
        assert out.is_cuda and lse.is_cuda
        d_out = torch.from_numpy(rng.standard_normal(out.shape).astype(np.float32)).cuda()
        out.backward(d_out)
        cpu = to_cpu(t)
        ref = oracle(cpu, d_out=d_out.cpu())
        check_close(np64(out.cpu()), ref["out"], what="output")
        check_close(np64(lse.cpu()), ref["lse"], what="lse")
        pairs = [("q", "dq"), ("k", "dk"), ("v", "dv")]
        if t["add_k"] is not None:
            pairs += [("add_k", "d_add_k"), ("add_v", "d_add_v")]
        for name, g in pairs:
            check_close(np64(t[name].grad.cpu()), ref[g], what=g)


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_low_precision(dtype, backend):
    """Random small problems (small head dims: `auto` falls back to cuda-naive where the fused
    tiles do not apply), forward and backward, SPEC section 4 criterion."""
    for rank in (1, 2, 3):
        rng = np.random.default_rng(seed_of("gpu-lowp", dtype, rank))
        t = cuda_problem(rng, rank, TORCH_DTYPE[dtype])
        check_low_precision(t, dtype, backend, rng, f"rank {rank}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_cuda_fused_sizes(dtype, rank):
    """Head dim 64 and grids of several tiles, where the fused tensor-core kernels apply: `auto`
    and, where it lists configurations, `cuda-fused` itself, forward and backward."""
    shape, ks = {1: ((200,), [17]), 2: ((20, 24), [7, 5]), 3: ((6, 8, 10), [3, 5, 3])}[rank]
    backends = [None]
    if fna.backend_compiled("cuda-fused") and fna.fused_configs(rank, dtype, 64):
        backends.append("cuda-fused")
    for i, backend in enumerate(backends):
        rng = np.random.default_rng(seed_of("gpu-fused", dtype, rank, i))
        p = dict(q=None, k=None, v=None, add_k=None, add_v=None, ks=ks, st=[1] * rank,
                 dil=[1] * rank, causal=[False] * rank)
        for n in ("q", "k", "v"):
            x = torch.from_numpy(rng.standard_normal((1, *shape, 2, 64)).astype(np.float32))
            p[n] = x.to(TORCH_DTYPE[dtype]).cuda().requires_grad_(True)
        check_low_precision(p, dtype, backend, rng, f"rank {rank} backend {backend}")


def test_current_stream():
    """The op runs on torch's current stream: work queued on a side stream right before it
    (filling the inputs) must be complete when it reads them."""
    rng = np.random.default_rng(seed_of("stream"))
    host = [torch.from_numpy(rng.standard_normal((2, 64, 64, 4, 32)).astype(np.float32))
            for _ in range(3)]
    ref = fna.na2d(*host, 7)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        dev = [torch.empty_like(x, device="cuda") for x in host]
        for d, h in zip(dev, host):
            d.copy_(h.pin_memory(), non_blocking=True)
        out = fna.na2d(*dev, 7)
    s.synchronize()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_cuda_unfused():
    rng = np.random.default_rng(seed_of("gpu-unfused"))
    t = cuda_problem(rng, 2)
    sp = dict(stride=t["st"], dilation=t["dil"], is_causal=t["causal"])
    attn = QK[2](t["q"], t["k"], t["ks"], additional_keys=t["add_k"], **sp)
    attn_cpu = QK[2](t["q"].detach().cpu(), t["k"].detach().cpu(), t["ks"],
                     additional_keys=None if t["add_k"] is None else t["add_k"].detach().cpu(),
                     backend="reference", **sp)
    check_close(np64(attn.cpu()), np64(attn_cpu), what="qk")
    out = AV[2](torch.softmax(attn * t["q"].shape[-1] ** -0.5, -1), t["v"], t["ks"],
                additional_values=t["add_v"], **sp)
    torch.testing.assert_close(out, run_na(t), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert all(torch.isfinite(t[n].grad).all() for n in ("q", "k", "v"))


def test_cuda_compile():
    torch._dynamo.reset()
    rng = np.random.default_rng(seed_of("gpu-compile"))
    leaves = [torch.from_numpy(rng.standard_normal((1, 12, 10, 2, 32)).astype(np.float32))
              .cuda().requires_grad_(True) for _ in range(3)]
    f = lambda q, k, v: fna.na2d(q, k, v, 5, dilation=2) * 2  # noqa: E731
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(*leaves)
    out.sum().backward()
    grads = [x.grad.clone() for x in leaves]
    for x in leaves:
        x.grad = None
    ref = f(*leaves)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    for g, x in zip(grads, leaves):
        torch.testing.assert_close(g, x.grad)


def test_cuda_module():
    m = fna.NeighborhoodAttention2D(64, 4, 7).cuda()
    x = torch.randn(2, 16, 16, 64, device="cuda", requires_grad=True)
    y = m(x)
    assert y.shape == x.shape and y.is_cuda
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    torch.testing.assert_close(m.cpu()(x.detach().cpu()), y.detach().cpu(), rtol=1e-4, atol=1e-4)


def test_cuda_module_natten_keywords():
    """NATTEN 0.17 keywords on CUDA: rpb (added by the fused kernels) and attention dropout in
    eval mode give the CPU module's output and gradients; under FlopCounterMode the fused op is
    counted as fna.flops says, with and without the bias."""
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(seed_of("cuda-module-rpb"))
    m = fna.NeighborhoodAttention2D(dim=32, num_heads=4, kernel_size=5, dilation=2,
                                    rel_pos_bias=True, attn_drop=0.2)
    with torch.no_grad():
        m.rpb.normal_()
    m.eval()  # dropout draws differ between the CPU and CUDA generators
    x = torch.randn(2, 13, 11, 32)
    y_cpu = m(x)
    y_cpu.square().sum().backward()
    g_cpu = m.rpb.grad.clone()
    m.rpb.grad = None
    mc = m.cuda()
    y = mc(x.cuda())
    y.square().sum().backward()
    torch.testing.assert_close(y.cpu(), y_cpu, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mc.rpb.grad.cpu(), g_cpu, rtol=1e-4, atol=1e-4)
    with FlopCounterMode(display=False) as mode:
        mc(x.cuda())
    counts = {str(k): v for k, v in mode.get_flop_counts()["Global"].items()}
    assert counts["fna.na_forward"] == fna.flops((2, 13, 11, 4, 8), 5, dilation=2)
    assert "fna.na_qk" not in counts and "fna.na_av" not in counts
    plain = fna.NeighborhoodAttention2D(dim=32, num_heads=4, kernel_size=5, dilation=2).cuda()
    with FlopCounterMode(display=False) as mode:
        plain(x.cuda())
    counts = {str(k): v for k, v in mode.get_flop_counts()["Global"].items()}
    assert counts["fna.na_forward"] == fna.flops((2, 13, 11, 4, 8), 5, dilation=2)


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_cuda_deterministic_flag():
    """torch.use_deterministic_algorithms(True) reaches the fused backward: it runs the plan's
    deterministic backward (fused_plan(deterministic=True): the sm80 kernels, or on a Hopper the
    strip or the plain Hopper kernels with a dQ kernel, no atomics) instead of the default one,
    whose dQ on a Hopper comes from atomics; gradients are bitwise reproducible."""
    hopper = torch.cuda.get_device_capability() == (9, 0)
    g = torch.Generator(device="cuda").manual_seed(seed_of("cuda-det-flag"))
    q, k, v = (torch.randn(1, 40, 36, 2, 64, device="cuda", dtype=torch.bfloat16, generator=g)
               .requires_grad_() for _ in range(3))
    prev = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        fna.na2d(q, k, v, (9, 7)).float().square().sum().backward()
        free = fna._C.last_fused_launch()["backward"]
        plan = fna.fused_plan(q.shape, (9, 7), dtype="bfloat16")
        assert plan["backward_config"] == free and plan["backward_dq"] != "kernel", (plan, free)
        det = fna.fused_plan(q.shape, (9, 7), dtype="bfloat16", deterministic=True)
        assert det["backward_deterministic"] and det["backward_dq"] != "atomic", det
        torch.use_deterministic_algorithms(True)
        grads = []
        for _ in range(2):
            grads.append(torch.autograd.grad(fna.na2d(q, k, v, (9, 7)).float().square().sum(),
                                             (q, k, v)))
            assert fna._C.last_fused_launch()["backward"] == det["backward_config"]
        for a, b in zip(*grads):
            assert torch.equal(a, b)
        if not hopper:
            assert det["backward_config"].startswith("fna_bwd_sm80_"), det
        with pytest.raises(RuntimeError, match="deterministic=False"):
            fna.na2d(q, k, v, (9, 7), deterministic=False)
    finally:
        torch.use_deterministic_algorithms(prev)


def test_cuda_errors():
    q = torch.randn(1, 8, 8, 2, 16, device="cuda")
    with pytest.raises(ValueError, match="key is on cpu but query is on cuda:0"):
        fna.na2d(q, q.cpu(), q, 3)
    with pytest.raises(ValueError, match=r"backend='cpu' runs on the CPU, but query is on cuda:0"):
        fna.na2d(q, q, q, 3, backend="cpu")
    with pytest.raises(ValueError, match=r"backend='reference' runs on the CPU"):
        fna.na2d_qk(q, q, 3, backend="reference")
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="key is on cuda:1 but query is on cuda:0"):
            fna.na2d(q, q.to("cuda:1"), q, 3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device():
    """Tensors on cuda:1 run there (the op sets the device), whatever the current device is."""
    q = torch.randn(1, 8, 8, 2, 16, device="cuda:1")
    out = fna.na2d(q, q, q, 3)
    assert out.device == q.device
    torch.testing.assert_close(out.cpu(), fna.na2d(q.cpu(), q.cpu(), q.cpu(), 3),
                               rtol=1e-5, atol=1e-5)


def test_cuda_opcheck():
    from test_torch import opcheck_all
    opcheck_all("cuda", "auto")


def _fused_2d_problem(rng, dtype, d=64, shape=(20, 24)):
    return [torch.from_numpy(rng.standard_normal((2, *shape, 2, d)).astype(np.float32))
            .to(dtype).cuda().requires_grad_(True) for _ in range(3)]


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_cuda_fused_explicit_config():
    """Every listed configuration, named explicitly, computes the same attention (vs the float64
    oracle); a name from another head dim / dtype is an error, not a silent fallback."""
    rng = np.random.default_rng(seed_of("gpu-config"))
    q, k, v = _fused_2d_problem(rng, torch.bfloat16)
    ref = oracle(dict(q=q, k=k, v=v, ks=[7, 5], st=[1, 1], dil=[1, 1], causal=[False, False],
                      add_k=None, add_v=None))
    names = fna.fused_configs(2, "bfloat16", 64)
    assert names
    hopper = torch.cuda.get_device_capability() == (9, 0)
    for name in names:
        if name.startswith(("fna_fwd_sm90_", "fna_fwd_sm90ws_")) and not hopper:
            # Hopper-only kernels: a clear error elsewhere, never a fallback.
            with pytest.raises(Exception, match="needs compute capability 9.0"):
                fna.na2d(q, k, v, (7, 5), config=name)
            continue
        out = fna.na2d(q, k, v, (7, 5), config=name)
        err = float(np.abs(np64(out) - ref["out"]).max())
        assert err < 3e-2, f"config {name}: max error {err}"
    f16_name = fna.fused_configs(2, "float16", 64)[0]
    with pytest.raises(ValueError, match="is not a cuda-fused forward configuration"):
        fna.na2d(q, k, v, (7, 5), config=f16_name)


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_cuda_fused_deterministic_backward():
    """deterministic=True: the fused backward gives bitwise identical gradients run after run
    (many query tiles write dK / dV / dQ of the same keys)."""
    rng = np.random.default_rng(seed_of("gpu-deterministic"))
    q, k, v = _fused_2d_problem(rng, torch.bfloat16, shape=(48, 64))
    d_out = torch.randn(q.shape[:-1] + (v.shape[-1],), device="cuda", dtype=q.dtype)
    grads = []
    for _ in range(3):
        out = fna.na2d(q, k, v, (13, 13), backend="cuda-fused", deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), d_out))
    for g in grads[1:]:
        for a, b in zip(grads[0], g):
            assert torch.equal(a, b)


@pytest.mark.parametrize("allow_tf32", [False, True, None])
def test_cuda_float32_precision(allow_tf32):
    """float32 on CUDA (auto): exact-class accuracy by default, TF32-class with allow_tf32=True;
    None follows torch.backends.cuda.matmul.allow_tf32."""
    rng = np.random.default_rng(seed_of("gpu-tf32"))
    q, k, v = _fused_2d_problem(rng, torch.float32, d=64, shape=(24, 32))
    t = dict(q=q, k=k, v=v, ks=[9, 7], st=[1, 1], dil=[1, 1], causal=[False, False],
             add_k=None, add_v=None)
    ref = oracle(t)
    flag = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        out = fna.na2d(q, k, v, (9, 7), allow_tf32=allow_tf32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = flag
    tf32 = allow_tf32 is not False
    err = np.abs(np64(out) - ref["out"]).max() / np.abs(ref["out"]).max()
    assert err < (2e-3 if tf32 else 2e-5), f"allow_tf32={allow_tf32}: relative error {err}"


def _grad_errors(q, k, v, ks, d_out, **kw):
    """Relative max errors of dQ, dK, dV of fna.na2d(..., **kw) against the float64 oracle."""
    t = dict(q=q, k=k, v=v, ks=list(ks), st=[1, 1], dil=[1, 1], causal=[False, False],
             add_k=None, add_v=None)
    ref = oracle(t, d_out=d_out)
    out = fna.na2d(q, k, v, ks, **kw)
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    return [float(np.abs(np64(g) - ref[n]).max() / np.abs(ref[n]).max())
            for g, n in zip(grads, ("dq", "dk", "dv"))]


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_cuda_fused_explicit_backward_config(dtype):
    """Every listed backward configuration, named explicitly, gives the oracle's gradients (both
    dQ modes); a name of another dtype is an error at the forward call, not a silent fallback."""
    rng = np.random.default_rng(seed_of("gpu-bwd-config", dtype))
    tdt = getattr(torch, dtype)
    q, k, v = _fused_2d_problem(rng, tdt, shape=(20, 40))
    d_out = torch.from_numpy(rng.standard_normal(q.shape).astype(np.float32)).to(tdt).cuda()
    names = fna.fused_backward_configs(2, dtype, 64)
    assert len(names) >= 2
    bound = 2e-2 if dtype == "bfloat16" else 2e-5
    hopper = torch.cuda.get_device_capability() == (9, 0)
    for i, name in enumerate(names):
        sm80 = name.startswith("fna_bwd_sm80_")
        if not sm80 and not hopper:
            with pytest.raises(NotImplementedError, match="compute capability 9.0"):
                _grad_errors(q, k, v, (7, 9), d_out, backend="cuda-fused", backward_config=name)
            continue
        # The Hopper families accumulate dQ by atomics only; deterministic=True with them is an
        # error naming the configuration.
        if not sm80:
            with pytest.raises(ValueError, match="deterministic"):
                _grad_errors(q, k, v, (7, 9), d_out, backend="cuda-fused", backward_config=name,
                             deterministic=True)
        errs = _grad_errors(q, k, v, (7, 9), d_out, backend="cuda-fused", backward_config=name,
                            deterministic=sm80 and i % 2 == 1, allow_tf32=False)
        assert max(errs) < bound, f"backward_config={name}: relative errors {errs}"
    other = fna.fused_backward_configs(2, "float16", 64)[0]
    with pytest.raises(ValueError, match="is not a cuda-fused backward configuration.*valid: "
                                         + names[0]):
        fna.na2d(q, k, v, (7, 9), backward_config=other)


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("d", [64, 160])
def test_cuda_fused_float32_backward_precision(d):
    """The float32 fused backward (head dims up to 256): split TF32 within 2e-5 relative by
    default; allow_tf32=True runs plain TF32, within 1e-2 and measurably (>1e-5) less exact, so
    neither mode silently runs the other."""
    rng = np.random.default_rng(seed_of("gpu-tf32-bwd", d))
    q, k, v = _fused_2d_problem(rng, torch.float32, d=d, shape=(16, 24))
    d_out = torch.from_numpy(rng.standard_normal(q.shape[:-1] + (d,)).astype(np.float32)).cuda()
    split = max(_grad_errors(q, k, v, (7, 5), d_out, backend="cuda-fused", allow_tf32=False))
    plain = max(_grad_errors(q, k, v, (7, 5), d_out, backend="cuda-fused", allow_tf32=True))
    assert split < 2e-5, f"split TF32 backward: relative error {split}"
    assert 1e-5 < plain < 1e-2 and plain > 10 * split, f"plain TF32 {plain}, split {split}"


def _tiles_of(name, rank):
    """Query / key tile extents per axis from a configuration name (..._q8x16_kv8x8_w4)."""
    parts = name.split("_")
    q = [int(x) for x in next(p for p in parts if p.startswith("q"))[1:].split("x")]
    kv = [int(x) for x in next(p for p in parts if p.startswith("kv"))[2:].split("x")]
    assert len(q) == len(kv) == rank
    return q, kv


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("case", [
    ((1, 30, 23, 2, 64), (7, 5), (1, 2), (False, True)),
    ((2, 9, 12, 10, 3, 128), (3, 5, 4), (2, 1, 2), (True, False, False)),
    ((1, 300, 4, 32), (33,), (3,), (False,)),
])
def test_fused_plan_tiling(case):
    """fna.fused_plan's tiling efficiency against a count from the SPEC window formulas
    (helpers.axis_window): per axis and dilation group, each query tile visits the key tiles
    laid from the start of its windows' union; a tile needs no mask when it lies inside every
    window of the query tile; needed pairs are the window sizes summed. tuning fwd_wg_skip off
    (where the plan runs the warp-specialized Hopper forward): its warpgroups then visit their
    tile's whole run, as counted here (their own runs, the default, are counted by tiling.cuh
    part_tiling_stats, checked in tests/cpp/fused_tiling_test.cpp)."""
    from helpers import axis_window
    shape, ks, dil, causal = case
    B, H, D = shape[0], shape[-2], shape[-1]
    spatial = shape[1:-2]
    rank = len(spatial)
    plan = fna.fused_plan(shape, ks, dilation=dil, is_causal=causal, dtype="bfloat16")
    if plan["family"] == "sm90ws":
        assert plan["wg_skip"]
        plan = fna.fused_plan(shape, ks, dilation=dil, is_causal=causal, dtype="bfloat16",
                              tuning={"fwd_wg_skip": False})
        assert plan["family"] == "sm90ws" and not plan["wg_skip"]
    assert plan["config"] in fna.fused_configs(rank, "bfloat16", D)
    qt, kt = _tiles_of(plan["config"], rank)
    visited = unmasked = needed = 1
    for ax in range(rank):
        L, K, d, c = spatial[ax], ks[ax], dil[ax], causal[ax]
        v = u = n = 0
        for g in range(d):
            xs = [x for x in range(L) if x % d == g]
            wins = [axis_window(x, L, K, d, 1, c)[1:] for x in xs]
            n += sum(e - s for s, e in wins)
            for i0 in range(0, len(xs), qt[ax]):
                tile = wins[i0:i0 + qt[ax]]
                ub, ue = min(s for s, _ in tile), max(e for _, e in tile)
                ib, ie = max(s for s, _ in tile), min(e for _, e in tile)
                nt = -(-(ue - ub) // kt[ax])
                v += nt
                u += sum(1 for t in range(nt) if ub + t * kt[ax] >= ib and ub + (t + 1) * kt[ax] <= ie)
        visited, unmasked, needed = visited * v, unmasked * u, needed * n
    assert plan["visited_tiles"] == visited * B * H
    assert plan["unmasked_fraction"] == pytest.approx(unmasked / visited)
    computed = visited * math.prod(qt) * math.prod(kt)
    assert plan["needed_fraction"] == pytest.approx(needed / computed)
    assert 0 < plan["needed_fraction"] <= 1
    # The backward's dK / dV kernel: each key tile visits the query tiles (laid from the start of
    # the group) covering the queries whose windows hold any of its keys.
    bkv, bq = plan["backward_kv_tile"], plan["backward_q_tile"]
    assert len(bkv) == len(bq) == rank
    # 16-bit, head dim <= 128: 128 keys x 64 queries (the plain Hopper kernel: 64 keys where
    # the plan's step count says so).
    assert math.prod(bq) == 64
    assert math.prod(bkv) in ((64, 128) if plan["backward_family"] == "sm90" else (128,))
    bvisited = 1
    for ax in range(rank):
        L, K, d, c = spatial[ax], ks[ax], dil[ax], causal[ax]
        v = 0
        for g in range(d):
            wins = [axis_window(x, L, K, d, 1, c)[1:] for x in range(L) if x % d == g]
            for j0 in range(0, len(wins), bkv[ax]):
                j1 = min(j0 + bkv[ax], len(wins))
                qs = [i for i, (s0, e0) in enumerate(wins) if s0 < j1 and e0 > j0]
                if qs:
                    v += -(-(max(qs) - min(qs) + 1) // bq[ax])
        bvisited *= v
    assert plan["backward_visited_tiles"] == bvisited * B * H
    assert plan["backward_needed_fraction"] == pytest.approx(
        needed / (bvisited * math.prod(bkv) * 64))
    assert 0 < plan["backward_needed_fraction"] <= 1
    # An explicit configuration is reported back; a wrong one is an error.
    other = fna.fused_configs(rank, "bfloat16", D)[-1]
    assert fna.fused_plan(shape, ks, dilation=dil, is_causal=causal, config=other)["config"] == other
    with pytest.raises(ValueError, match="is not a cuda-fused forward configuration"):
        fna.fused_plan(shape, ks, dilation=dil, is_causal=causal, dtype="float16", config=other)


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
def test_cuda_fused_backward_of_sum():
    """out.sum().backward() hands the op an expanded gradient (stride 0 on every dim): the fused
    backward must still run (not fail, not fall back) and match the gradient of a dense d_out."""
    rng = np.random.default_rng(seed_of("gpu-sum-backward"))
    q, k, v = _fused_2d_problem(rng, torch.bfloat16)
    out = fna.na2d(q, k, v, (7, 5), backend="cuda-fused")
    out.sum().backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    out = fna.na2d(q, k, v, (7, 5), backend="cuda-fused")
    ref = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    for a, b in zip(got, ref):
        assert torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("backend", [None, "cuda-naive", "cuda-gemm", "cuda-fused"])
def test_int_bounds_on_cuda(backend):
    """Sizes the CUDA kernels narrow to int are refused before any kernel runs (issue 28): an
    expanded head dim of 2^32 + 1 and 2^32 + 1 additional keys (zero-stride views: no memory) are
    ValueErrors naming them, on every CUDA backend; the same call with small sizes runs."""
    g = torch.Generator(device="cuda").manual_seed(seed_of("cuda-bounds", backend))
    big = 2 ** 32 + 1
    q1 = torch.randn(1, 8, 1, 1, device="cuda", generator=g)
    v = torch.randn(1, 8, 1, 8, device="cuda", generator=g)
    q = q1.expand(1, 8, 1, big)
    with pytest.raises(ValueError, match=r"dim=4294967297 must be in \[1, 2\^30\]"):
        fna.na1d(q, q, v, kernel_size=3, scale=0.5, backend=backend)
    k8 = torch.randn(1, 8, 1, 8, device="cuda", generator=g)
    ak = torch.randn(1, 1, 1, 8, device="cuda", generator=g).expand(1, big, 1, 8)
    with pytest.raises(ValueError, match=r"num_additional=4294967297 must be in \[0, 2\^30\]"):
        fna.na1d(k8, k8, v, kernel_size=3, additional_keys=ak, additional_values=ak,
                 backend=backend)
    out = fna.na1d(k8, k8, v, kernel_size=3, additional_keys=ak[:, :3].contiguous(),
                   additional_values=ak[:, :3].contiguous(), backend=backend)
    assert torch.isfinite(out).all()


# ---- gradients through the LSE (BackwardArgs::d_lse) on the CUDA backends ------------------------

@pytest.mark.parametrize("backend", [None, "cuda-naive", "cuda-gemm"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_cuda_lse_gradient(backend, rank):
    """A loss on the output and the LSE (return_lse=True), float32 on the GPU: gradients against
    the float64 torch reference from the neighborhood mask (test_lse_gradient.py); random
    problems and each feature (additional keys, causal, dilation, stride, GQA)."""
    from test_lse_gradient import check_against_reference, fixed_problems
    problems = {f"random {c}": random_problem(np.random.default_rng(seed_of("gpu-lse", rank, c)),
                                              rank) for c in range(3)}
    problems.update(fixed_problems(rank))
    for name, p in problems.items():
        rng = np.random.default_rng(seed_of("gpu-lse-w", backend, rank, name))
        check_against_reference(p, backend, rng, f"{backend} rank {rank} {name}", device="cuda")


def _fused_lse_problem(rng, rank, dtype):
    """Head dim 64 (the fused tiles' own), GQA 4 / 2, three additional keys, causal first axis."""
    shape, ks = {1: ((96,), [17]), 2: ((20, 24), [7, 5]), 3: ((6, 8, 10), [3, 5, 3])}[rank]
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    p = dict(q=f(2, *shape, 4, 64), k=f(2, *shape, 2, 64), v=f(2, *shape, 2, 64),
             add_k=f(2, 3, 2, 64), add_v=f(2, 3, 2, 64), ks=ks, st=[1] * rank,
             dil=[1] * rank, causal=[True] + [False] * (rank - 1))
    # The values the kernels see: rounded to the dtype (the oracle takes the same values).
    return {n: (torch.from_numpy(x).to(dtype).float().numpy() if isinstance(x, np.ndarray) else x)
            for n, x in p.items()}


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_cuda_fused_d_lse(rank, dtype, deterministic):
    """The fused backward (named explicitly) with d_lse, from the reference forward's O and LSE:
    against the float64 oracle's gradients of sum(d_out * out) + sum(d_lse * lse) (float32:
    split TF32, 2e-5 relative; bfloat16: 2e-2), where the d_lse term changes the gradients by at
    least ten times the bound; a heads-first (strided) d_lse gives the same gradients."""
    if not fna.fused_backward_configs(rank, dtype, 64):
        pytest.skip(f"no cuda-fused backward configuration for rank {rank} {dtype}")
    from helpers import dense_na
    rng = np.random.default_rng(seed_of("gpu-fused-lse", rank, dtype))
    p = _fused_lse_problem(rng, rank, TORCH_DTYPE[dtype])
    tdt = TORCH_DTYPE[dtype]
    dev = {n: torch.from_numpy(p[n]).to(tdt).cuda() for n in ("q", "k", "v", "add_k", "add_v")}
    kw = dict(stride=p["st"], dilation=p["dil"], is_causal=p["causal"])
    NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[rank]
    out, lse = NA(*(torch.from_numpy(p[n]).to(tdt) for n in ("q", "k", "v")), p["ks"],
                  additional_keys=torch.from_numpy(p["add_k"]).to(tdt),
                  additional_values=torch.from_numpy(p["add_v"]).to(tdt), backend="reference",
                  return_lse=True, **kw)
    d_out = rng.standard_normal(out.shape).astype(np.float32)
    d_out = torch.from_numpy(d_out).to(tdt)
    d_lse = torch.from_numpy(2.0 * rng.standard_normal(lse.shape).astype(np.float32))
    args = (p["q"], p["k"], p["v"], p["ks"], p["st"], p["dil"], p["causal"], None, p["add_k"],
            p["add_v"])
    ref = dense_na(*args, d_out=d_out.float().numpy(), d_lse=d_lse.numpy())
    without = dense_na(*args, d_out=d_out.float().numpy())
    bound = 2e-5 if dtype == "float32" else 2e-2
    names = ("dq", "dk", "dv", "d_add_k", "d_add_v")
    change = max(np.abs(ref[n] - without[n]).max() / np.abs(ref[n]).max() for n in names)
    assert change > 10 * bound, f"the d_lse term changes the gradients by only {change}"
    hf = d_lse.movedim(-1, 1).contiguous().cuda()  # heads-first buffer
    for d_lse_dev in (d_lse.cuda(), hf.movedim(1, -1)):
        grads = fna.na_backward(d_out.cuda(), dev["q"], dev["k"], dev["v"], out.cuda(),
                                lse.cuda(), p["ks"], additional_keys=dev["add_k"],
                                additional_values=dev["add_v"], backend="cuda-fused",
                                deterministic=deterministic, allow_tf32=False, d_lse=d_lse_dev,
                                **kw)
        for g, n in zip(grads, names):
            err = float(np.abs(np64(g) - ref[n]).max() / np.abs(ref[n]).max())
            assert err < bound, (f"{n}: relative error {err} (d_lse contiguous: "
                                 f"{d_lse_dev.is_contiguous()})")


@pytest.mark.parametrize("backend", ["cuda-naive", "cuda-fused"])
def test_cuda_merge_attentions(backend):
    """fna neighborhood attention on the GPU merged with plain attention over additional keys
    equals the joint softmax (float64 reference), forward and gradients through the merge."""
    if backend == "cuda-fused" and not fna.backend_compiled("cuda-fused"):
        pytest.skip("cuda-fused not compiled")
    from test_lse_gradient import NAMES, leaves_of, loss_of, torch_na
    rng = np.random.default_rng(seed_of("gpu-merge", backend))
    p = _fused_lse_problem(rng, 2, torch.float32)
    t = leaves_of(p, device="cuda")
    na_out, na_lse = fna.na2d(t["q"], t["k"], t["v"], p["ks"], is_causal=p["causal"],
                              backend=backend, return_lse=True)
    K = t["add_k"].repeat_interleave(2, 2).transpose(1, 2)       # [B, H, N_add, D]
    V = t["add_v"].repeat_interleave(2, 2).transpose(1, 2)
    Q = t["q"].reshape(2, -1, 4, 64).transpose(1, 2)
    S = Q @ K.transpose(-1, -2) * 64 ** -0.5
    add_out = (torch.softmax(S, -1) @ V).transpose(1, 2).reshape(na_out.shape)
    add_lse = torch.logsumexp(S, -1).transpose(1, 2).reshape(na_lse.shape)
    out, lse = fna.merge_attentions([na_out, add_out], [na_lse, add_lse])
    w_out = torch.from_numpy(rng.standard_normal(out.shape))
    w_lse = torch.from_numpy(rng.standard_normal(lse.shape))
    got = torch.autograd.grad(loss_of(out, lse, w_out, w_lse), [t[n] for n in NAMES])
    ref_t = {n: (t[n].detach().cpu().double().requires_grad_(True) if n in NAMES else t[n])
             for n in t}
    r_out, r_lse = torch_na(ref_t)
    check_close(np64(out.cpu()), np64(r_out), what="merged output")
    check_close(np64(lse.cpu()), np64(r_lse), what="merged lse")
    ref = torch.autograd.grad(loss_of(r_out, r_lse, w_out, w_lse), [ref_t[n] for n in NAMES])
    for g, r, n in zip(got, ref, NAMES):
        err = float((g.cpu().double() - r).abs().max() / r.abs().max())
        assert err < 2e-5, f"d{n}: relative error {err}"


FIRST_BACKWARD = """
import torch, fna
g = torch.Generator(device="cuda").manual_seed({seed})
q, k, v = (torch.randn(1, 700, 2, {d}, device="cuda", dtype=torch.bfloat16, generator=g)
           .requires_grad_() for _ in range(3))
d_out = torch.randn(1, 700, 2, {d}, device="cuda", dtype=torch.bfloat16, generator=g)
grads = []
for copy in ("tma", "cp_async"):  # TMA first: the first backward of the process
    tuning = {{"bwd_kernel": "sm90ws", "bwd_copy": copy}}
    out = fna.na1d(q, k, v, 63, backend="cuda-fused", tuning=tuning)
    grads.append(torch.autograd.grad(out, (q, k, v), d_out))
    assert fna._C.last_fused_launch()["backward"].startswith("fna_bwd_sm90ws")
err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(*grads))
mag = max(float(a.float().abs().max()) for a in grads[1])
print("max difference", err, "of", mag)
assert err <= 2e-2 * max(1.0, mag), (err, mag)
"""


@pytest.mark.skipif(not fna.backend_compiled("cuda-fused"), reason="cuda-fused not compiled")
@pytest.mark.parametrize("d", [128, 256])
def test_first_backward_of_a_process_by_tma(d):
    """The first backward of a fresh process with TMA copies: PyTorch runs it on its autograd
    thread, which no CUDA runtime call has bound a context to yet, and the tensor maps are encoded
    there (before the fix, cuTensorMapEncodeTiled failed with CUDA_ERROR_INVALID_CONTEXT and the
    call raised). Its gradients match those of the cp.async copies."""
    import os
    import subprocess
    import sys
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the TMA backward is Hopper's")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", FIRST_BACKWARD.format(seed=seed_of("first-bwd", d), d=d)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "max difference" in r.stdout
