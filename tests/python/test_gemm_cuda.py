"""cuda-gemm (the unfused operators as tensor-core GEMMs over tiles) on the GPU: qk, av and both
backwards against the CPU reference backend on random and fixed problems (ranks 1-3, dilation,
stride, causal, GQA, D_v != D, additional keys, heads-first strides, head dims 1-256 and column
slices; the kernels' full-tile and direct variants, one and two chunk buffers), float32 (split
TF32: the float32 criterion) and float16 / bfloat16 (within 2x of
cuda-naive's error plus 2 ulp); that `auto` runs these kernels; and the limits. The composed
attention (na*d(backend="cuda-gemm")) is checked in test_gpu.py with the other CUDA backends."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import check_close, seed_of  # noqa: E402
from test_numpy import random_problem  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

QK = {1: fna.na1d_qk, 2: fna.na2d_qk, 3: fna.na3d_qk}
AV = {1: fna.na1d_av, 2: fna.na2d_av, 3: fna.na3d_av}
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def fixed(rng, shape, ks, dil, st, causal, D, Dv, H, Hkv, n_add, heads_first=False):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731

    def make(h, d):
        if heads_first:
            return np.moveaxis(f(2, h, *shape, d), 1, -2)
        return f(2, *shape, h, d)

    p = dict(q=make(H, D), k=make(Hkv, D), v=make(Hkv, Dv), ks=list(ks), st=list(st),
             dil=list(dil), causal=list(causal), add_k=None, add_v=None)
    if n_add:
        p["add_k"], p["add_v"] = f(2, n_add, Hkv, D), f(2, n_add, Hkv, Dv)
    return p


# name -> (shape, kernel, dilation, stride, causal, D, D_v, H, H_kv, N_add, heads-first)
FIXED = {
    "1d-gqa-dil": ((300,), (17,), (2,), (1,), (False,), 64, 64, 2, 1, 3, False),
    # a 65-key window: halos of several chunks, additional keys straddling a chunk's end
    "1d-causal-long-window": ((200,), (65,), (1,), (1,), (True,), 32, 24, 1, 1, 70, False),
    "2d-mixed": ((20, 24), (7, 5), (2, 1), (1, 2), (True, False), 40, 72, 4, 2, 5, False),
    "2d-13x13-d128": ((17, 19), (13, 13), (1, 1), (1, 1), (False, False), 128, 128, 2, 2, 0,
                      False),
    "3d-slices": ((6, 8, 10), (3, 5, 3), (2, 1, 1), (1, 1, 2), (False, True, False), 64, 160, 2,
                  1, 2, False),
    "2d-d256-heads-first": ((12, 12), (5, 5), (1, 2), (2, 1), (False, True), 256, 256, 1, 1, 1,
                            True),
    "2d-odd-dims": ((9, 11), (3, 7), (3, 1), (3, 1), (False, False), 3, 5, 3, 1, 0, True),
    # 400-key halos at head dim 64: NN's one-buffer full tiles (16-bit), PN's direct stores
    "2d-13x13-d64-causal": ((24, 24), (13, 13), (1, 1), (1, 1), (False, True), 64, 64, 2, 1, 3,
                            False),
}


def problems(dtype):
    out = {}
    for rank in (1, 2, 3):
        for case in range(4):
            rng = np.random.default_rng(seed_of("gemm-random", dtype, rank, case))
            out[f"random r{rank} #{case}"] = random_problem(rng, rank)
    for name, spec in FIXED.items():
        out[name] = fixed(np.random.default_rng(seed_of("gemm-fixed", dtype, name)), *spec)
    return out


def run_ops(p, backend, dtype, device, rng_seed, compute=None):
    """qk, av, and both backwards on one backend; returns float64 NumPy results. Every input
    (the problem's tensors, the random weights and output gradients) is rounded to `dtype`, then
    computed in `compute` (default: `dtype`; the reference takes float32 copies)."""
    rank = p["q"].ndim - 3
    compute = compute or DT[dtype]

    def tensor(x):
        return torch.from_numpy(x).to(DT[dtype]).to(compute).to(device)

    t = {n: tensor(p[n]) if p[n] is not None else None for n in ("q", "k", "v", "add_k", "add_v")}
    sp = dict(stride=p["st"], dilation=p["dil"], is_causal=p["causal"], backend=backend)
    attn = QK[rank](t["q"], t["k"], p["ks"], additional_keys=t["add_k"], **sp)
    # Inputs of av and of the backwards: the same random values on every backend.
    g = np.random.default_rng(rng_seed)
    weights = tensor(g.random(attn.shape).astype(np.float32))
    d_attn = tensor(g.standard_normal(attn.shape).astype(np.float32))
    out = AV[rank](weights, t["v"], p["ks"], additional_values=t["add_v"], **sp)
    d_out = tensor(g.standard_normal(out.shape).astype(np.float32))
    qk_grads = fna.na_qk_backward(d_attn, t["q"], t["k"], p["ks"], additional_keys=t["add_k"],
                                  **sp)
    av_grads = fna.na_av_backward(d_out, weights, t["v"], p["ks"],
                                  additional_values=t["add_v"], **sp)
    res = {"attn": attn, "out": out, "dq": qk_grads[0], "dk": qk_grads[1],
           "d_attn": av_grads[0], "dv": av_grads[1]}
    if p["add_k"] is not None:
        res["d_add_k"], res["d_add_v"] = qk_grads[2], av_grads[2]
    return {n: x.detach().cpu().double().numpy() for n, x in res.items()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_gemm_ops_against_reference(dtype):
    """Every operator and gradient of cuda-gemm against the reference backend (float32 inputs
    rounded to `dtype`); float16 / bfloat16 also against cuda-naive in the same dtype (the bound
    is 2x cuda-naive's error plus 2 ulp of the largest value)."""
    for name, p in problems(dtype).items():
        seed = seed_of("gemm-inputs", dtype, name)
        got = run_ops(p, "cuda-gemm", dtype, "cuda", seed)
        # The reference sees the same rounded inputs, in float32.
        ref = run_ops(p, "reference", dtype, "cpu", seed, compute=torch.float32)
        if dtype != "float32":
            naive = run_ops(p, "cuda-naive", dtype, "cuda", seed)
        for n in got:
            if dtype == "float32":
                check_close(got[n], ref[n], what=f"{name} {n}")
            else:
                check_close(got[n], ref[n], dtype, naive=naive[n], what=f"{name} {n}")


def qk_bias(p, backend, dtype, device, seed, heads_last, compute=None):
    """na*d_qk(rpb=) and the table's gradient (through a random d_attn) on one backend, float64
    NumPy; the same rounded inputs and table on every backend (the table float32, its layout
    heads-last in memory with `heads_last`)."""
    rank = p["q"].ndim - 3
    compute = compute or DT[dtype]
    g = np.random.default_rng(seed)
    H = p["q"].shape[-2]
    ext = [2 * k - 1 for k in p["ks"]]
    table = torch.from_numpy(2 * g.standard_normal([H] + ext).astype(np.float32))
    if heads_last:
        table = table.movedim(0, -1).contiguous().movedim(-1, 0)
    rpb = table.to(device).requires_grad_()

    def tensor(x):
        return torch.from_numpy(x).to(DT[dtype]).to(compute).to(device)

    q, k = tensor(p["q"]), tensor(p["k"])
    add_k = tensor(p["add_k"]) if p["add_k"] is not None else None
    attn = QK[rank](q, k, p["ks"], stride=p["st"], dilation=p["dil"], is_causal=p["causal"],
                    additional_keys=add_k, backend=backend, rpb=rpb)
    d_attn = tensor(g.standard_normal(attn.shape).astype(np.float32))
    d_rpb, = torch.autograd.grad(attn, [rpb], d_attn)
    return {"attn+rpb": attn.detach().cpu().double().numpy(),
            "d_rpb": d_rpb.cpu().double().numpy()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemm_qk_bias_against_reference(dtype):
    """na*d_qk(rpb=) on cuda-gemm (the bias added in the QK kernel's epilogue, full-tile and
    direct-store variants) and cuda-naive (in its PN kernel) against the reference backend: the
    logits and d rpb, the table in both layouts."""
    for i, (name, p) in enumerate(problems(dtype).items()):
        seed = seed_of("gemm-bias", dtype, name)
        ref = qk_bias(p, "reference", dtype, "cpu", seed, i % 2 == 1, compute=torch.float32)
        naive = qk_bias(p, "cuda-naive", dtype, "cuda", seed, i % 2 == 1)
        got = qk_bias(p, "cuda-gemm", dtype, "cuda", seed, i % 2 == 1)
        for n in got:
            if dtype == "float32":
                check_close(got[n], ref[n], what=f"{name} {n} cuda-gemm")
                check_close(naive[n], ref[n], what=f"{name} {n} cuda-naive")
            else:
                check_close(got[n], ref[n], dtype, naive=naive[n], what=f"{name} {n}")
        # the bias is there: without it the logits differ
        plain = run_ops(p, "cuda-gemm", dtype, "cuda", seed)["attn"]
        finite = np.isfinite(plain)
        assert np.abs(got["attn+rpb"][finite] - plain[finite]).max() > 0.1, name


def test_gemm_bound_is_tight():
    """The float32 bound can fail: the same qk with one key perturbed by 1e-3 breaks it."""
    p = fixed(np.random.default_rng(seed_of("gemm-tight")), *FIXED["2d-mixed"])
    seed = seed_of("gemm-tight-inputs")
    ref = run_ops(p, "reference", "float32", "cpu", seed)
    p["k"] = p["k"].copy()
    p["k"][0, 3, 4, 0, 0] += 1e-3
    got = run_ops(p, "cuda-gemm", "float32", "cuda", seed)
    with pytest.raises(AssertionError, match="max error"):
        check_close(got["attn"], ref["attn"], what="perturbed qk")


def test_auto_runs_gemm_kernels():
    """`auto` for the unfused operators on CUDA runs cuda-gemm's kernels (names from the torch
    profiler), and cuda-naive's where cuda-gemm cannot (head dim above 256)."""
    from torch.profiler import ProfilerActivity, profile
    g = torch.Generator(device="cuda").manual_seed(seed_of("gemm-auto"))

    def kernels(D):
        q = torch.randn(1, 16, 16, 2, D, device="cuda", generator=g, dtype=torch.bfloat16)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fna.na2d_qk(q, q, 5)
            torch.cuda.synchronize()
        return " ".join(e.key for e in prof.key_averages())

    names = kernels(64)
    assert "fna::gemm::pn" in names, names  # pn_kernel or pn_full_kernel
    names = kernels(320)
    assert "fna::gemm::" not in names and "fna::naive::pn_kernel" in names, names


def test_gemm_limits():
    """A head dim above 256 named on cuda-gemm is NotImplementedError saying what to use; `auto`
    then runs cuda-naive, with the reference's result."""
    g = torch.Generator(device="cuda").manual_seed(seed_of("gemm-limits"))
    q = torch.randn(1, 10, 2, 300, device="cuda", generator=g)
    with pytest.raises(NotImplementedError, match=r"dim=300.*cuda-gemm takes head dims up to 256"
                                                  r".*cuda-naive"):
        fna.na1d_qk(q, q, 3, backend="cuda-gemm")
    got = fna.na1d_qk(q, q, 3)
    ref = fna.na1d_qk(q.cpu(), q.cpu(), 3, backend="reference")
    check_close(got.cpu().double().numpy(), ref.double().numpy(), what="auto D=300")
    k = q[..., :64].contiguous()
    with pytest.raises(NotImplementedError, match="query_offset / query_shape: backend=cuda-gemm"):
        fna.na1d(k[:, 2:6], k, k, 3, backend="cuda-gemm", query_offset=(2,))
