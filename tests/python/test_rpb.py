"""Relative positional bias (``rpb=`` of na*d and na*d_qk, the modules' ``rel_pos_bias``) against
plain float64 PyTorch built from helpers.py's neighborhood mask, with the bias gathered here from
each (query, key) pair's coordinates (no fna code): docs/semantics.md section 1.3.

Covers ranks 1-3, odd and even kernels, dilation, stride, causal axes, grouped heads, additional
keys (which get no bias), return_lse (the LSE of the biased logits), the gradients of q, k, v,
rpb and the additional keys / values, the qk operator (empty slots stay -inf and give rpb no
gradient), the modules on even / causal windows, the errors, and mutations of the bias index
that the comparisons must catch."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from fna import _rpb  # noqa: E402  (only to mutate it)
from helpers import (axis_mask, check_close, dense_qk, full_mask, random_params,  # noqa: E402
                     seed_of, window_slots)

NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}
QK = {1: fna.na1d_qk, 2: fna.na2d_qk, 3: fna.na3d_qk}
AV = {1: fna.na1d_av, 2: fna.na2d_av, 3: fna.na3d_av}
MODULES = {r: getattr(fna, f"NeighborhoodAttention{r}D") for r in (1, 2, 3)}


def np64(x):
    return x.detach().cpu().double().numpy()


# ---- the bias, from coordinates ----------------------------------------------------------------

def pair_index(shape, ks, dil):
    """Per axis, [N, N] index into rpb of every (query, key) pair of the flattened grid: the key's
    coordinate minus the query's, in units of the dilation, plus K - 1. Clipped into range (only
    neighbor pairs are used, and those are in range: test_index_in_range_for_every_window)."""
    coords = np.array(list(np.ndindex(*shape)), dtype=np.int64).reshape(-1, len(shape))
    out = []
    for a, (K, d) in enumerate(zip(ks, dil)):
        rel = coords[None, :, a] - coords[:, None, a]  # [query, key]
        out.append(np.clip(rel // d + K - 1, 0, 2 * K - 2))
    return [torch.from_numpy(i) for i in out]


def reference(q, k, v, rpb, ks, st, dil, causal, scale, add_k=None, add_v=None):
    """softmax(scale * q.k + rpb[pair] masked to the neighborhood (+ unbiased additional keys))
    @ v, dense, in the dtype of the inputs (float64 for the reference). Returns (out, lse)."""
    r = q.ndim - 3
    B, shape, H, D = q.shape[0], list(q.shape[1:1 + r]), q.shape[-2], q.shape[-1]
    N, Hkv = math.prod(shape), k.shape[-2]
    Q = q.reshape(B, N, H, D).transpose(1, 2)
    K = k.reshape(B, N, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    V = v.reshape(B, N, Hkv, -1).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    s = scale * Q @ K.transpose(-1, -2)  # [B, H, N, N]
    s = s + rpb[(slice(None), *pair_index(shape, ks, dil))].to(s.dtype)
    mask = torch.from_numpy(full_mask(shape, ks, st, dil, causal))
    s = s.masked_fill(~mask, -math.inf)
    if add_k is not None:
        AK = add_k.transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        AV = add_v.transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        s = torch.cat([s, scale * Q @ AK.transpose(-1, -2)], dim=-1)
        V = torch.cat([V, AV], dim=2)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.softmax(s, dim=-1) @ V
    return (out.transpose(1, 2).reshape(B, *shape, H, -1),
            lse.transpose(1, 2).reshape(B, *shape, H))


# ---- problems ----------------------------------------------------------------------------------

# rank, shape, kernel, stride, dilation, causal, heads, kv heads, additional keys
CASES = [
    (1, [11], [4], [1], [1], [False], 2, 2, 0),                       # even
    (1, [13], [5], [2], [2], [True], 3, 1, 2),                        # odd, causal, MQA
    (1, [10], [6], [3], [1], [True], 2, 2, 0),                        # even, causal, stride
    (2, [9, 9], [5, 5], [1, 1], [1, 1], [False, False], 2, 2, 0),     # NAT-like
    (2, [7, 9], [3, 4], [1, 2], [2, 1], [False, True], 4, 2, 3),      # mixed, GQA, additional
    (2, [8, 6], [4, 2], [4, 1], [1, 2], [False, False], 2, 1, 0),     # blocks, even
    (3, [5, 6, 4], [3, 2, 4], [1, 2, 1], [1, 2, 1], [True, False, False], 2, 2, 1),
    (3, [4, 5, 6], [2, 3, 3], [2, 3, 1], [2, 1, 2], [False, True, True], 2, 1, 0),
]


def make(case, seed, dtype=torch.float32, D=8, Dv=6, B=2, device="cpu", rpb_dtype=None):
    """Random leaves of `case` in `dtype` on `device` (rpb in `rpb_dtype` when given) and their
    float64 CPU copies for the reference: the values the backend sees."""
    rank, shape, ks, st, dil, causal, H, Hkv, n_add = case
    g = torch.Generator().manual_seed(seed)
    t = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x = {"q": t(B, *shape, H, D), "k": t(B, *shape, Hkv, D), "v": t(B, *shape, Hkv, Dv),
         "rpb": t(H, *(2 * k - 1 for k in ks)),
         "add_k": t(B, n_add, Hkv, D) if n_add else None,
         "add_v": t(B, n_add, Hkv, Dv) if n_add else None}
    dt = {n: rpb_dtype if n == "rpb" and rpb_dtype is not None else dtype for n in x}
    low = {n: None if a is None else a.to(dt[n]).to(device).requires_grad_(True)
           for n, a in x.items()}
    ref = {n: None if a is None else low[n].detach().cpu().double().requires_grad_(True)
           for n, a in x.items()}
    return low, ref


def mask_bias(fill, limit):
    """An edit of a 1-D bias table [H, 2K - 1]: `fill` at relative offsets beyond `limit` (a bias
    used as a distance mask; fill -inf, or float32's lowest, the usual mask value)."""
    def edit(rpb):
        with torch.no_grad():
            off = torch.arange(rpb.shape[-1]) - (rpb.shape[-1] - 1) // 2
            rpb[:, (off.abs() > limit).to(rpb.device)] = fill
    return edit


MASK_FILLS = [-math.inf, float(np.finfo(np.float32).min)]


def run_case(case, backend, seed, what, rpb_edit=None):
    """Forward (output, LSE) and the gradients of q, k, v, rpb (and additional keys / values)
    of a loss on both, fna in float32 against the float64 reference. Raises AssertionError.
    rpb_edit: applied to both bias tables first."""
    rank, shape, ks, st, dil, causal = case[:6]
    low, ref = make(case, seed)
    if rpb_edit is not None:
        rpb_edit(low["rpb"])
        rpb_edit(ref["rpb"])
    scale = 0.45
    kw = dict(stride=st, dilation=dil, is_causal=causal, scale=scale)
    if backend == "composition":  # what the CUDA backends run: qk, gathered bias, softmax, av
        sp = (list(ks), list(st), list(dil), list(causal))
        out, lse = _rpb.attention(low["q"], low["k"], low["v"], low["rpb"], sp, scale,
                                  low["add_k"], low["add_v"], "cpu", return_lse=True)
    else:  # the backend adds the bias in its kernels
        out, lse = NA[rank](low["q"], low["k"], low["v"], ks, **kw, additional_keys=low["add_k"],
                            additional_values=low["add_v"], backend=backend, return_lse=True,
                            rpb=low["rpb"])
    r_out, r_lse = reference(ref["q"], ref["k"], ref["v"], ref["rpb"], ks, st, dil, causal,
                             scale, ref["add_k"], ref["add_v"])
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    check_close(np64(out), np64(r_out), what=f"output, {what}")
    check_close(np64(lse), np64(r_lse), what=f"lse, {what}")
    g = torch.Generator().manual_seed(seed + 1)
    g_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    g_lse = torch.randn(lse.shape, generator=g, dtype=torch.float64)
    names = [n for n in low if low[n] is not None]
    grads = torch.autograd.grad((out * g_out.float()).sum() + (lse * g_lse.float()).sum(),
                                [low[n] for n in names])
    r_grads = torch.autograd.grad((r_out * g_out).sum() + (r_lse * g_lse).sum(),
                                  [ref[n] for n in names])
    for n, a, b in zip(names, grads, r_grads):
        check_close(np64(a), np64(b), what=f"d {n}, {what}")
    return out


@pytest.mark.parametrize("backend", ["cpu", "reference", "composition"])
@pytest.mark.parametrize("i", range(len(CASES)))
def test_matches_float64_reference(i, backend):
    case = CASES[i]
    out = run_case(case, backend, seed_of("rpb", i), f"case {i} {case} {backend}")
    # The bias matters here: without it the output differs well beyond the tolerance.
    low, _ = make(case, seed_of("rpb", i))
    rank, shape, ks, st, dil, causal = case[:6]
    plain = NA[rank](low["q"], low["k"], low["v"], ks, stride=st, dilation=dil,
                     is_causal=causal, scale=0.45, additional_keys=low["add_k"],
                     additional_values=low["add_v"],
                     backend="cpu" if backend == "composition" else backend)
    assert (out - plain).abs().max() > 0.05


@pytest.mark.parametrize("fill", MASK_FILLS, ids=["-inf", "float32-lowest"])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_bias_as_a_mask(fill, backend):
    """A bias of -inf (or float32's lowest) beyond a distance of 9 on a 40-long axis with a
    whole-axis window: every row keeps 10-19 keys; output, LSE and gradients finite and equal to
    the float64 reference (d rpb is 0 at the masked entries)."""
    case = (1, [40], [40], [1], [1], [False], 2, 1, 0)
    run_case(case, backend, seed_of("rpb-mask", backend), f"mask {fill} {backend}",
             rpb_edit=mask_bias(fill, 9))


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_random_problems(rank):
    """Random shapes, kernels (odd and even), strides, dilations and causal axes."""
    for c in range(4):
        rng = np.random.default_rng(seed_of("rpb-random", rank, c))
        shape, ks, st, dil, causal = random_params(rng, rank, max_len=[12, 7, 5][rank - 1])
        case = (rank, shape, ks, st, dil, causal, 2, 1 + c % 2, c % 2)
        for backend in ("auto", "composition"):
            run_case(case, backend, seed_of("rpb-random-data", rank, c),
                     f"random {case} {backend}")


def test_index_in_range_for_every_window():
    """The definition's claim, checked on the window formulas of docs/semantics.md 1.1 (helpers):
    every neighbor lies in the query's dilation group, (key - query) / d + K - 1 is in
    [0, 2 K - 2], in [0, K - 1] on causal axes, and every value occurs."""
    for L in range(1, 13):
        for d in range(1, L + 1):
            for K in range(1, L // d + 1):
                for s in range(1, K + 1):
                    for causal in (False, True):
                        m = axis_mask(L, K, d, s, causal)
                        qx, kx = np.nonzero(m)
                        rel = kx - qx
                        assert (rel % d == 0).all()
                        idx = rel // d + K - 1
                        hi = K - 1 if causal else 2 * K - 2
                        assert idx.min() >= 0 and idx.max() <= hi, (L, d, K, s, causal)
                        if L == K * d and s == 1:  # every offset is used somewhere
                            assert len(np.unique(idx)) == hi + 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    """16-bit inputs (rpb in float32 and in the inputs' dtype): output and LSE by the criterion of
    docs/semantics.md section 4, the naive result being the dense reference run in that dtype."""
    case = CASES[4]
    rank, shape, ks, st, dil, causal = case[:6]
    name = str(dtype).replace("torch.", "")
    for rpb_dtype in (torch.float32, dtype):
        low, ref = make(case, seed_of("rpb-low", name), dtype=dtype)
        rpb = low["rpb"].detach().to(rpb_dtype)
        out, lse = NA[rank](low["q"], low["k"], low["v"], ks, stride=st, dilation=dil,
                            is_causal=causal, additional_keys=low["add_k"],
                            additional_values=low["add_v"], return_lse=True, rpb=rpb)
        assert out.dtype == dtype and lse.dtype == torch.float32
        args = (ks, st, dil, causal, 8 ** -0.5)
        r_out, r_lse = reference(ref["q"], ref["k"], ref["v"], rpb.double(), *args,
                                 ref["add_k"], ref["add_v"])
        with torch.no_grad():
            n_out, n_lse = reference(*(low[n] for n in ("q", "k", "v")), rpb.to(dtype), *args,
                                     low["add_k"], low["add_v"])
        what = f"{name}, rpb {rpb_dtype}"
        check_close(np64(out), np64(r_out), name, naive=np64(n_out), what=f"output, {what}")
        check_close(np64(lse), np64(r_lse), name, naive=np64(n_lse), what=f"lse, {what}")


# ---- the qk operator ---------------------------------------------------------------------------

@pytest.mark.parametrize("i", [0, 1, 2, 4, 6, 7])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_qk_op(i, backend):
    """na*d_qk(rpb=): the logits plus the bias of each neighbor slot (slots of the qk neighbor
    order, from helpers.window_slots); empty slots stay -inf and give rpb no gradient; additional
    keys get no bias. d_query / d_key are those of the op without a bias."""
    case = CASES[i]
    rank, shape, ks, st, dil, causal, H = case[:7]
    low, ref = make(case, seed_of("rpb-qk", i))
    kw = dict(stride=st, dilation=dil, is_causal=causal, additional_keys=low["add_k"],
              backend=backend)
    attn = QK[rank](low["q"], low["k"], ks, **kw, rpb=low["rpb"])
    W, N = math.prod(ks), math.prod(shape)
    slots = window_slots(shape, ks, st, dil, causal)  # [N, W] key of each slot, -1: empty
    valid = torch.from_numpy(slots >= 0)
    keys = torch.from_numpy(np.maximum(slots, 0))
    rows = torch.arange(N)[:, None].expand(N, W)
    idx = [pi[rows, keys] for pi in pair_index(shape, ks, dil)]  # [N, W] per axis
    bias = ref["rpb"][(slice(None), *idx)].masked_fill(~valid, 0)  # [H, N, W]
    bias = bias.permute(1, 0, 2).reshape(*shape, H, W)
    expect = torch.from_numpy(dense_qk(np64(low["q"]), np64(low["k"]), ks, st, dil, causal,
                                       None if low["add_k"] is None else np64(low["add_k"])))
    expect[..., :W] += bias
    assert torch.isinf(attn).any() == bool((~valid).any())
    check_close(np64(attn), np64(expect), what=f"qk attn, case {i}")
    # Gradients, with a nonzero gradient on the empty slots too (they must not reach rpb).
    g = torch.randn(attn.shape, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
    d_rpb, d_q = torch.autograd.grad(attn, [low["rpb"], low["q"]], g.float())
    r_d_rpb, = torch.autograd.grad((bias * g[..., :W]).sum(), [ref["rpb"]])
    check_close(np64(d_rpb), np64(r_d_rpb), what=f"qk d rpb, case {i}")
    plain = QK[rank](low["q"], low["k"], ks, **kw)
    assert torch.equal(torch.autograd.grad(plain, [low["q"]], g.float())[0], d_q)


@pytest.mark.parametrize("i", [1, 4])
def test_qk_av_composition_equals_fused_call(i):
    """softmax(na*d_qk(q * scale, k, rpb=rpb)) then na*d_av is na*d(..., scale, rpb=rpb)."""
    case = CASES[i]
    rank, shape, ks, st, dil, causal = case[:6]
    low, _ = make(case, seed_of("rpb-compose", i))
    sp = dict(stride=st, dilation=dil, is_causal=causal)
    attn = QK[rank](low["q"] * 0.3, low["k"], ks, **sp, additional_keys=low["add_k"],
                    rpb=low["rpb"])
    out = AV[rank](attn.softmax(-1), low["v"], ks, **sp, additional_values=low["add_v"])
    fused = NA[rank](low["q"], low["k"], low["v"], ks, **sp, scale=0.3,
                     additional_keys=low["add_k"], additional_values=low["add_v"],
                     rpb=low["rpb"])
    torch.testing.assert_close(out, fused, rtol=1e-5, atol=1e-6)


def test_compile_fullgraph():
    """torch.compile(fullgraph=True) traces na2d(rpb=) and na2d_qk(rpb=), forward and backward,
    with the eager values and gradients."""
    low, _ = make(CASES[4], seed_of("rpb-compile"))

    def f(q, k, v, rpb, ak, av):
        out, lse = fna.na2d(q, k, v, (3, 4), stride=(1, 2), dilation=(2, 1),
                            is_causal=(False, True), additional_keys=ak, additional_values=av,
                            return_lse=True, rpb=rpb)
        attn = fna.na2d_qk(q, k, (3, 4), is_causal=(False, True), rpb=rpb)
        return out.square().sum() + lse.sum() + attn.masked_fill(attn.isinf(), 0).sum()

    leaves = [low[n] for n in ("q", "k", "v", "rpb", "add_k", "add_v")]
    eager = f(*leaves)
    g_eager = torch.autograd.grad(eager, leaves)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*leaves)
    g_compiled = torch.autograd.grad(compiled, leaves)
    torch.testing.assert_close(compiled, eager)
    for a, b in zip(g_compiled, g_eager):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("i", [2, 4, 6])
def test_explicit_backward(i):
    """fna.na_backward(..., rpb=) on torch tensors and NumPy arrays: autograd's gradients of a
    loss on the output and the LSE, d_rpb last."""
    case = CASES[i]
    rank, shape, ks, st, dil, causal = case[:6]
    low, _ = make(case, seed_of("rpb-explicit", i))
    kw = dict(stride=st, dilation=dil, is_causal=causal, scale=0.45)
    out, lse = NA[rank](low["q"], low["k"], low["v"], ks, **kw, additional_keys=low["add_k"],
                        additional_values=low["add_v"], return_lse=True, rpb=low["rpb"])
    g = torch.Generator().manual_seed(seed_of("rpb-explicit-grad", i))
    d_out, d_lse = torch.randn(out.shape, generator=g), torch.randn(lse.shape, generator=g)
    names = [n for n in ("q", "k", "v", "add_k", "add_v", "rpb") if low[n] is not None]
    want = torch.autograd.grad((out * d_out).sum() + (lse * d_lse).sum(), [low[n] for n in names])
    x = {n: None if t is None else t.detach() for n, t in low.items()}
    args = (out.detach(), lse.detach(), ks)
    for kind in ("torch", "numpy"):
        conv = (lambda t: t) if kind == "torch" else (lambda t: None if t is None else t.numpy())
        got = fna.na_backward(conv(d_out), conv(x["q"]), conv(x["k"]), conv(x["v"]),
                              *map(conv, args[:2]), ks, **kw, additional_keys=conv(x["add_k"]),
                              additional_values=conv(x["add_v"]), d_lse=conv(d_lse),
                              rpb=conv(x["rpb"]))
        assert len(got) == len(names)
        for n, a, b in zip(names, got, want):
            check_close(np.asarray(a, dtype=np.float64), np64(b), what=f"{kind} d {n}")


def test_only_rpb_trainable_follows_deterministic_algorithms():
    """A call where only rpb records a gradient (bias-only fine-tuning) still asks for a
    backward: deterministic=False under torch.use_deterministic_algorithms(True) is an error, as
    with a trainable query."""
    q = torch.randn(1, 8, 8, 2, 8)
    rpb = torch.randn(2, 5, 5, requires_grad=True)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="deterministic=False asks for a backward"):
            fna.na2d(q, q, q, 3, rpb=rpb, deterministic=False)
        fna.na2d(q, q, q, 3, rpb=rpb.detach(), deterministic=False)  # no graph: allowed
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_rpb_gets_its_gradient_in_its_dtype(dtype):
    """A float16 / bfloat16 table's gradient comes back in its dtype: the float32 gradient of the
    same (rounded) table, rounded once."""
    case = CASES[3]
    rank, shape, ks, st, dil, causal = case[:6]
    low, _ = make(case, seed_of("rpb-lowp-grad", str(dtype)))
    table = low["rpb"].detach().to(dtype)
    grads = {}
    for dt in (torch.float32, dtype):
        rpb = table.to(dt).requires_grad_(True)
        out = NA[rank](low["q"].detach(), low["k"].detach(), low["v"].detach(), ks, stride=st,
                       dilation=dil, is_causal=causal, rpb=rpb)
        (g,) = torch.autograd.grad(out.square().sum(), [rpb])
        assert g.dtype == dt
        grads[dt] = g
    assert torch.equal(grads[dtype], grads[torch.float32].to(dtype))


def test_fake_backward_matches_the_real_strides():
    """The fake na_backward's d_rpb has the real op's (contiguous) layout for a permuted rpb
    (torch.compile checks a custom op's output strides against its fake)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    q = torch.randn(1, 7, 7, 2, 8)
    rpb = torch.randn(5, 5, 2).permute(2, 0, 1)
    out, lse = fna.na2d(q, q, q, 3, rpb=rpb, return_lse=True)
    args = (q, q, q, out, lse, out, None, None, None, [3, 3], [1, 1], [1, 1], [False, False],
            8 ** -0.5, "cpu", "", False, False, "", "", 0, None)
    real = torch.ops.fna.na_backward(*args, rpb)[-1]
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = torch.ops.fna.na_backward(*(mode.from_tensor(a) if isinstance(a, torch.Tensor)
                                           else a for a in args), mode.from_tensor(rpb))[-1]
    assert fake.shape == real.shape and fake.stride() == real.stride() == (25, 5, 1)


# ---- modules -----------------------------------------------------------------------------------

@pytest.mark.parametrize("rank", [1, 2, 3])
def test_module_even_and_causal(rank):
    """rel_pos_bias=True on even kernels and causal axes: the module is its projections around
    the float64 reference above (rpb of the module), forward and the gradients of x and rpb."""
    ks = [[6], [4, 3], [2, 3, 4]][rank - 1]
    shape = [[13], [7, 8], [5, 6, 5]][rank - 1]
    causal = [[True], [False, True], [True, False, True]][rank - 1]
    dil = [[2], [1, 2], [1, 1, 1]][rank - 1]
    st = [[3], [2, 1], [1, 3, 2]][rank - 1]
    torch.manual_seed(seed_of("rpb-module", rank))
    m = MODULES[rank](dim=12, num_heads=3, kernel_size=ks, stride=st, dilation=dil,
                      is_causal=causal, rel_pos_bias=True)
    assert m.rpb.shape == (3, *(2 * k - 1 for k in ks))
    with torch.no_grad():
        m.rpb.normal_()
    x = torch.randn(2, *shape, 12, requires_grad=True)
    y = m(x)
    g = torch.randn(y.shape)
    y.backward(g)
    x64 = x.detach().double().requires_grad_(True)
    rpb64 = m.rpb.detach().double().requires_grad_(True)
    qkv = torch.nn.functional.linear(x64, m.qkv.weight.double(), m.qkv.bias.double())
    q, k, v = qkv.unflatten(-1, (3, 3, 4)).unbind(-3)
    o, _ = reference(q, k, v, rpb64, ks, st, dil, causal, m.scale)
    ref = torch.nn.functional.linear(o.flatten(-2), m.proj.weight.double(), m.proj.bias.double())
    ref.backward(g.double())
    check_close(np64(y), np64(ref), what=f"module output rank {rank}")
    check_close(np64(x.grad), np64(x64.grad), what=f"module d x rank {rank}")
    check_close(np64(m.rpb.grad), np64(rpb64.grad), what=f"module d rpb rank {rank}")


# ---- errors ------------------------------------------------------------------------------------

def test_errors():
    q = torch.randn(1, 9, 9, 4, 8)
    rpb = torch.randn(4, 13, 13)
    good = dict(kernel_size=(7, 7))
    with pytest.raises(ValueError, match=r"^na2d: rpb has shape \(4, 13, 12\); expected "
                                         r"\(4, 13, 13\) for heads=4, kernel_size=\(7, 7\)"):
        fna.na2d(q, q, q, **good, rpb=torch.randn(4, 13, 12))
    with pytest.raises(ValueError, match=r"rpb has shape \(2, 13, 13\); expected \(4, 13, 13\)"):
        fna.na2d(q, q, q, **good, rpb=torch.randn(2, 13, 13))
    with pytest.raises(ValueError, match=r"na1d: rpb has shape \(4, 6\); expected \(4, 5\) for "
                                         r"heads=4, kernel_size=3"):
        fna.na1d(q[:, 0], q[:, 0], q[:, 0], 3, rpb=torch.randn(4, 6))
    with pytest.raises(ValueError, match=r"na2d_qk: rpb has shape \(4, 13\); expected"):
        fna.na2d_qk(q, q, **good, rpb=torch.randn(4, 13))
    with pytest.raises(TypeError, match=r"na2d: rpb has dtype float64; expected float32"):
        fna.na2d(q, q, q, **good, rpb=rpb.double())
    with pytest.raises(TypeError, match=r"na2d_qk: rpb has dtype int64"):
        fna.na2d_qk(q, q, **good, rpb=rpb.long())
    with pytest.raises(TypeError, match=r"na2d: rpb must be a torch.Tensor .*ndarray"):
        fna.na2d(q, q, q, **good, rpb=rpb.numpy())
    with pytest.raises(ValueError, match=r"na2d: rpb is on meta but query is on cpu"):
        fna.na2d(q, q, q, **good, rpb=torch.empty(4, 13, 13, device="meta"))
    qn = q.numpy()  # NumPy calls take a NumPy rpb (test_rpb_numpy.py), not a tensor
    with pytest.raises(TypeError, match=r"na2d: rpb must be a numpy.ndarray .* got Tensor"):
        fna.na2d(qn, qn, qn, **good, rpb=rpb)
    assert isinstance(fna.na2d_qk(qn, qn, **good, rpb=rpb.numpy()), np.ndarray)
    # On the CPU the backend adds the bias itself: the options are those of a call without it.
    for kw in ({"config": "fna_fwd_x"}, {"backward_config": "b"}):
        name = next(iter(kw))
        with pytest.raises(ValueError, match=rf"{name}=.*but backend=cpu runs this call"):
            fna.na2d(q, q, q, **good, rpb=rpb, **kw)
    fna.na2d(q, q, q, **good, rpb=rpb, num_threads=2, tuning={"cpu_isa": "generic"})
    fna.na2d(q, q, q, **good, rpb=rpb, num_threads=0, deterministic=True, allow_tf32=False)
    with pytest.raises(ValueError, match=r"q_tile_shape tune the cuda-fused backend"):
        fna.na2d(q, q, q, **good, rpb=rpb, q_tile_shape=(8, 8))
    fna.na2d(q, q, q, **good, rpb=rpb, q_tile_shape=None, try_fuse_additional_kv=True)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bogus'"):
        fna.na2d(q, q, q, **good, rpb=rpb, bogus=1)
    for backend in ("cuda-fused", "cutlass-fna", "cuda-naive"):
        with pytest.raises(ValueError, match=rf"backend='{backend}'.*needs CUDA tensors"):
            fna.na2d(q, q, q, **good, rpb=rpb, backend=backend)
    with pytest.raises(TypeError, match=r"deterministic='x'"):
        fna.na2d(q, q, q, **good, rpb=rpb, deterministic="x")


# ---- mutations ---------------------------------------------------------------------------------

def _mutated(monkeypatch, how):
    orig = _rpb.axis_index

    def axis_index(L, K, d, s, causal, device):
        idx, valid = orig(L, K, d, s, causal, device)
        if how == "offset+1":
            idx = (idx + 1).clamp(max=2 * K - 2)
        elif how == "offset-1":
            idx = (idx - 1).clamp(min=0)
        elif how == "mirrored":  # query - key instead of key - query
            idx = 2 * K - 2 - idx
        elif how == "centered":  # the window's centre as origin (ignores the border shift)
            idx = (K - 1 - K // 2 + torch.arange(K, device=device)).expand(L, K)
        elif how == "no_valid":
            valid = None
        return idx, valid

    monkeypatch.setattr(_rpb, "axis_index", axis_index)


@pytest.mark.parametrize("how", ["offset+1", "offset-1", "mirrored", "centered"])
def test_mutations_of_the_index_are_caught(monkeypatch, how):
    """Each mutation of the bias index makes the reference comparison fail on some case (and the
    unmutated code passes the same cases: test_matches_float64_reference)."""
    _mutated(monkeypatch, how)
    failed = 0
    for i in (0, 3, 4):
        try:
            run_case(CASES[i], "composition", seed_of("rpb", i), f"mutated {how} case {i}")
        except AssertionError:
            failed += 1
    assert failed == 3


def test_mutation_of_the_empty_slots_is_caught(monkeypatch):
    """Without zeroing the empty slots' bias, rpb would get the gradient of slots that hold no
    key: test_qk_op catches it on a causal case."""
    _mutated(monkeypatch, "no_valid")
    with pytest.raises(AssertionError, match="qk d rpb"):
        test_qk_op(2, "cpu")


# ---- CUDA (skipped without a GPU) --------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", [None, "cuda-naive", "cuda-fused", "cutlass-fna"])
def test_cuda_backends(backend):
    """On CUDA tensors (float32) every backend name gives the CPU's outputs, LSE and gradients:
    cuda-naive runs the composition of its unfused operators, cuda-fused, NATTEN's cutlass-fna
    and auto the fused kernels with the bias (test_rpb_cuda.py covers those in depth). A value
    head dim of 6 (rows the fused kernels do not store) is NotImplementedError on the fused
    names and the composition under auto."""
    if backend in ("cuda-fused", "cutlass-fna") and not fna.backend_compiled("cuda-fused"):
        pytest.skip("cuda-fused not compiled")
    for Dv in (8, 6):
        _cuda_backend_case(backend, Dv)


def _cuda_backend_case(backend, Dv):
    case = CASES[4]
    rank, shape, ks, st, dil, causal = case[:6]
    low, _ = make(case, seed_of("rpb-cuda", Dv), Dv=Dv)
    names = [n for n in low if low[n] is not None]
    if Dv == 6 and backend in ("cuda-fused", "cutlass-fna"):
        x = {n: None if low[n] is None else low[n].detach().cuda() for n in low}
        with pytest.raises(NotImplementedError, match="output stride"):
            NA[rank](x["q"], x["k"], x["v"], ks, stride=st, dilation=dil, is_causal=causal,
                     additional_keys=x["add_k"], additional_values=x["add_v"], rpb=x["rpb"],
                     backend=backend)
        return
    results = []
    for dev, b in (("cpu", "cpu"), ("cuda", backend)):
        x = {n: None if low[n] is None else low[n].detach().to(dev).requires_grad_(True)
             for n in low}
        out, lse = NA[rank](x["q"], x["k"], x["v"], ks, stride=st, dilation=dil,
                            is_causal=causal, additional_keys=x["add_k"],
                            additional_values=x["add_v"], return_lse=True, rpb=x["rpb"],
                            backend=b)
        grads = torch.autograd.grad(out.square().sum() + lse.sum(), [x[n] for n in names])
        results.append([t.cpu() for t in (out, lse, *grads)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_deterministic_bias_plan_query_takes_the_tuning_text():
    """A deterministic call with a bias on CUDA asks the plan whether its backward sums d rpb
    deterministically, passing the call's tuning as the extension's text ("key=value,..."):
    fused_plan took only a dict there, so any tuning made a valid call a ValueError. Here the
    query reaches the plan (a bool on a GPU, the no-device error without one)."""
    import fna.functional as F
    args = ((1, 16, 2, 32), ((3,), (1,), (1,), (False,)), "bfloat16", 2, 32, 0, None, None, "",
            "bwd_kernel=sm80,fwd_walk=0", False)
    try:
        assert isinstance(F._plan_takes_deterministic_rpb(*args), bool)
    except RuntimeError as e:
        assert "needs a CUDA device" in str(e), e
