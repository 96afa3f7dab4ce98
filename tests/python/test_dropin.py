"""NATTEN drop-in: the modules' NATTEN 0.15 / 0.17 / 0.21 keywords, state dicts, relative
positional bias and attention dropout (against plain float64 PyTorch compositions built from the
mask of helpers.py), NATTEN's backend names, torch's deterministic flag, and FLOP counting
(torch.utils.flop_counter and fna.flops against counts taken from the mask)."""

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from fna import _args  # noqa: E402
from helpers import check_close, full_mask, random_params, seed_of, window_slots  # noqa: E402
from test_numpy import random_problem  # noqa: E402

F = torch.nn.functional
MODULES = {r: getattr(fna, f"NeighborhoodAttention{r}D") for r in (1, 2, 3)}
NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}
QK = {1: fna.na1d_qk, 2: fna.na2d_qk, 3: fna.na3d_qk}
AV = {1: fna.na1d_av, 2: fna.na2d_av, 3: fna.na3d_av}


def np64(x):
    return x.detach().cpu().double().numpy()


def random_module_problem(rng, rank, odd=True, causal_ok=False):
    """A shape and module parameters (odd kernel sizes for rpb), random but valid."""
    shape, ks, st, dil, causal = [], [], [], [], []
    for _ in range(rank):
        L = int(rng.integers(4, 10))
        d = int(rng.integers(1, 3))
        kmax = L // d
        choices = [k for k in range(1, kmax + 1) if k % 2 == 1 or not odd]
        K = int(rng.choice(choices))
        shape.append(L)
        ks.append(K)
        st.append(int(rng.integers(1, K + 1)))
        dil.append(d)
        causal.append(bool(causal_ok and rng.random() < 0.4))
    return shape, ks, st, dil, causal


# ---- float64 references ------------------------------------------------------------------------

def bias_index(shape, ks, dil):
    """Per axis, [N, N] index into rpb for every (query, key) pair of the flattened grid: the key's
    offset from the query in units of the dilation, plus K - 1 (meaningful for neighbors)."""
    coords = np.array(list(np.ndindex(*shape)), dtype=np.int64).reshape(-1, len(shape))
    out = []
    for a, (K, d) in enumerate(zip(ks, dil)):
        rel = coords[None, :, a] - coords[:, None, a]  # key - query
        out.append(np.clip(rel // d + K - 1, 0, 2 * K - 2))
    return out


def reference(x, params, cfg):
    """The module's forward as plain float64 PyTorch: QKV projection, dense attention masked by
    helpers.full_mask with the relative positional bias gathered by relative position, output
    projection. `params`: float64 tensors (qkv_w, qkv_b, rpb, proj_w, proj_b; None when absent)."""
    r, H, scale = cfg["rank"], cfg["heads"], cfg["scale"]
    B, shape, C = x.shape[0], list(x.shape[1:1 + r]), x.shape[-1]
    N, Dh = math.prod(shape), C // H
    qkv = x.reshape(B, N, C) @ params["qkv_w"].T
    if params["qkv_b"] is not None:
        qkv = qkv + params["qkv_b"]
    q, k, v = qkv.reshape(B, N, 3, H, Dh).permute(2, 0, 3, 1, 4)  # [B, H, N, Dh] each
    s = scale * q @ k.transpose(-1, -2)
    mask = torch.from_numpy(full_mask(shape, cfg["ks"], cfg["st"], cfg["dil"], cfg["causal"]))
    if params["rpb"] is not None:
        idx = [torch.from_numpy(i) for i in bias_index(shape, cfg["ks"], cfg["dil"])]
        s = s + params["rpb"][(slice(None), *idx)]  # [H, N, N]
    p = torch.softmax(s.masked_fill(~mask, -math.inf), dim=-1)
    if cfg.get("keep") is not None:  # dropout on the weights: [N, N] per (b, h) from slot masks
        p = p * cfg["keep"]
    o = (p @ v).permute(0, 2, 1, 3).reshape(B, *shape, C)
    return o @ params["proj_w"].T + params["proj_b"]


def params64(m):
    f = lambda t: None if t is None else t.detach().double().requires_grad_(True)  # noqa: E731
    return {"qkv_w": f(m.qkv.weight), "qkv_b": f(m.qkv.bias), "rpb": f(m.rpb),
            "proj_w": f(m.proj.weight), "proj_b": f(m.proj.bias)}


def cfg_of(m, **extra):
    return dict(rank=m.rank, heads=m.num_heads, scale=m.scale, ks=list(m.kernel_size),
                st=list(m.stride), dil=list(m.dilation), causal=list(m.is_causal), **extra)


# ---- construction ------------------------------------------------------------------------------

@pytest.mark.parametrize("rank", [1, 2, 3])
def test_natten_017_keywords(rank):
    """NATTEN 0.17's constructor: dim, num_heads, kernel_size, dilation, is_causal, rel_pos_bias,
    qkv_bias, qk_scale, attn_drop, proj_drop (and 0.17.5's use_experimental_ops); 0.15's bias."""
    cls = MODULES[rank]
    ks = (3, 5, 7)[:rank]
    m = cls(dim=24, num_heads=4, kernel_size=ks, dilation=2, is_causal=False, rel_pos_bias=True,
            qkv_bias=False, qk_scale=0.25, attn_drop=0.1, proj_drop=0.2,
            use_experimental_ops=True)
    assert m.kernel_size == ks and m.dilation == (2,) * rank and m.is_causal == (False,) * rank
    assert m.scale == 0.25 and m.head_dim == 6 and m.num_heads == 4
    assert m.qkv.bias is None and tuple(m.qkv.weight.shape) == (72, 24)
    assert tuple(m.rpb.shape) == (4, *(2 * k - 1 for k in ks))
    assert m.rpb.abs().max() > 0 and m.rpb.abs().max() <= 2.0  # truncated normal, std 0.02
    assert isinstance(m.attn_drop, torch.nn.Dropout) and m.attn_drop.p == 0.1
    assert m.attn_drop_rate == 0.1 and m.proj_drop.p == 0.2
    assert "rel_pos_bias=True" in repr(m)
    # Defaults: no bias, qkv bias, scale head_dim ** -0.5; qk_scale=0 is the default (NATTEN's
    # `qk_scale or ...`).
    m = cls(24, 4, 3)
    assert m.rpb is None and m.qkv.bias is not None and m.scale == 6 ** -0.5
    assert cls(24, 4, 3, qk_scale=0).scale == 6 ** -0.5
    # NATTEN 0.15's `bias` is rel_pos_bias.
    assert cls(24, 4, 3, bias=True).rpb is not None
    assert cls(24, 4, 3, bias=False).rpb is None
    assert cls(24, 4, 3, bias=True, rel_pos_bias=True).rpb is not None


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_natten_021_keywords(rank):
    """NATTEN 0.21's constructor: embed_dim, num_heads, kernel_size, stride, dilation, is_causal,
    qkv_bias, qk_scale, proj_drop; its state dict keys."""
    cls = MODULES[rank]
    m = cls(embed_dim=32, num_heads=2, kernel_size=5, stride=2, dilation=(1,) * (rank - 1) + (2,),
            is_causal=(True,) + (False,) * (rank - 1), qkv_bias=True, qk_scale=0.5, proj_drop=0.3)
    assert m.embed_dim == m.dim == 32 and m.head_dim == 16 and m.scale == 0.5
    assert m.kernel_size == (5,) * rank and m.stride == (2,) * rank
    assert m.dilation[-1] == 2 and m.is_causal[0] and m.proj_drop.p == 0.3
    assert m.rpb is None
    assert sorted(m.state_dict()) == ["proj.bias", "proj.weight", "qkv.bias", "qkv.weight"]
    x = torch.randn(2, *([10] * rank), 32, generator=torch.Generator().manual_seed(rank))
    assert m.eval()(x).shape == x.shape


def test_constructor_errors():
    cls = fna.NeighborhoodAttention2D
    with pytest.raises(TypeError, match=r"positional argument\(s\) after kernel_size \(2\).*by "
                                        r"keyword"):
        cls(16, 2, 3, 2)
    with pytest.raises(ValueError, match=r"dim=16 and embed_dim=32 both give"):
        cls(dim=16, embed_dim=32, num_heads=2, kernel_size=3)
    assert cls(dim=16, embed_dim=16, num_heads=2, kernel_size=3).dim == 16
    with pytest.raises(TypeError, match=r"missing required argument: dim \(or embed_dim\)"):
        cls(num_heads=2, kernel_size=3)
    with pytest.raises(TypeError, match=r"missing required argument: kernel_size"):
        cls(16, 2)
    # A bias is defined for causal axes and even kernels too (docs/semantics.md 1.3).
    assert cls(16, 2, 3, is_causal=(True, False), rel_pos_bias=True).rpb.shape == (2, 5, 5)
    assert cls(16, 2, (3, 4), rel_pos_bias=True).rpb.shape == (2, 5, 7)
    with pytest.raises(ValueError, match=r"rel_pos_bias=True and bias=False"):
        cls(16, 2, 3, rel_pos_bias=True, bias=False)
    with pytest.raises(TypeError, match=r"rel_pos_bias='yes' must be a bool"):
        cls(16, 2, 3, rel_pos_bias="yes")
    with pytest.raises(ValueError, match=r"attn_drop=1.5 must be a probability"):
        cls(16, 2, 3, attn_drop=1.5)
    with pytest.raises(ValueError, match=r"proj_drop=-0.1 must be a probability"):
        cls(16, 2, 3, proj_drop=-0.1)
    # A bias on a fused-only backend runs the unfused operators of cuda-naive (as na2d(rpb=)).
    assert cls(16, 2, 3, rel_pos_bias=True, backend="cuda-fused").rpb is not None
    assert cls(16, 2, 3, rel_pos_bias=True, backend="cutlass-fna").rpb is not None
    with pytest.raises(ValueError, match=r"backend='blackwell-fna' names NATTEN's Blackwell"):
        cls(16, 2, 3, backend="blackwell-fna")
    with pytest.raises(ValueError, match=r"qk_scale|scale=-1"):
        cls(16, 2, 3, qk_scale=-1.0)


def test_state_dict_natten_keys_load_strictly():
    """A state dict with NATTEN's keys and shapes (random values) loads with strict=True and sets
    every parameter; a key the module lacks (rpb without rel_pos_bias) is an error."""
    g = torch.Generator().manual_seed(seed_of("state-dict"))
    for rank, rpb, qkv_bias in [(1, True, True), (2, True, False), (3, False, True),
                                (2, False, False)]:
        C, H, ks = 12, 3, (3, 5, 3)[:rank]
        sd = {"qkv.weight": torch.randn(3 * C, C, generator=g),
              "proj.weight": torch.randn(C, C, generator=g),
              "proj.bias": torch.randn(C, generator=g)}
        if qkv_bias:
            sd["qkv.bias"] = torch.randn(3 * C, generator=g)
        if rpb:
            sd["rpb"] = torch.randn(H, *(2 * k - 1 for k in ks), generator=g)
        m = MODULES[rank](dim=C, num_heads=H, kernel_size=ks, rel_pos_bias=rpb, qkv_bias=qkv_bias)
        assert set(m.state_dict()) == set(sd)
        m.load_state_dict(sd, strict=True)
        for name, t in m.state_dict().items():
            assert torch.equal(t, sd[name]), name
        if rpb:
            bare = MODULES[rank](dim=C, num_heads=H, kernel_size=ks, qkv_bias=qkv_bias)
            with pytest.raises(RuntimeError, match="Unexpected key.*rpb"):
                bare.load_state_dict(sd, strict=True)


# ---- forward against float64 compositions ---------------------------------------------------

@pytest.mark.parametrize("rank", [1, 2, 3])
def test_module_matches_float64_reference(rank):
    """Outputs and gradients (input, QKV / projection weights and biases, rpb) of the module with
    random rpb, qk_scale, biases, dilation and stride against the float64 composition."""
    for case in range(4):
        rng = np.random.default_rng(seed_of("dropin-module", rank, case))
        torch.manual_seed(seed_of("dropin-module-init", rank, case))
        # Cases 2 and 3: even kernels allowed; case 3 with causal axes (a bias is defined there
        # too, docs/semantics.md 1.3). Case 1 without a bias.
        shape, ks, st, dil, causal = random_module_problem(rng, rank, odd=case < 2,
                                                           causal_ok=(case == 3))
        rpb = case != 1
        m = MODULES[rank](dim=12, num_heads=3, kernel_size=ks, stride=st, dilation=dil,
                          is_causal=causal, rel_pos_bias=rpb, qkv_bias=case != 1,
                          qk_scale=[None, 0.3, 0.7, None][case])
        if rpb:
            with torch.no_grad():
                m.rpb.copy_(torch.from_numpy(rng.standard_normal(m.rpb.shape)))
        x = torch.from_numpy(rng.standard_normal((2, *shape, 12)).astype(np.float32))
        x.requires_grad_(True)
        y = m(x)
        g = torch.from_numpy(rng.standard_normal(y.shape).astype(np.float32))
        y.backward(g)
        x64 = x.detach().double().requires_grad_(True)
        p64 = params64(m)
        ref = reference(x64, p64, cfg_of(m))
        ref.backward(g.double())
        what = f"rank {rank} case {case} shape {shape} ks {ks} st {st} dil {dil}"
        check_close(np64(y), np64(ref), what=f"output, {what}")
        check_close(np64(x.grad), np64(x64.grad), what=f"d x, {what}")
        pairs = [("qkv.weight", "qkv_w"), ("proj.weight", "proj_w"), ("proj.bias", "proj_b")]
        pairs += [("qkv.bias", "qkv_b")] if case != 1 else []
        pairs += [("rpb", "rpb")] if rpb else []
        prm = dict(m.named_parameters())
        for name, key in pairs:
            check_close(np64(prm[name].grad), np64(p64[key].grad), what=f"d {name}, {what}")


def natten_bias_start(x, L, K, d):
    """NATTEN 0.17's rule for the first rpb index of a query's window on one axis (odd K,
    non-causal): K // 2 in the interior; K - 1 - x // d where the window is pushed right at the
    start (x - (K // 2) * d < 0); (L - 1 - x) // d where it is pushed left at the end
    (x + (K // 2) * d >= L)."""
    nb = K // 2
    if x - nb * d < 0:
        return K - 1 - x // d
    if x + nb * d >= L:
        return (L - 1 - x) // d
    return nb


def test_rpb_border_convention():
    """The bias index of the first slot of every query's window equals NATTEN's rule, at both
    borders, with and without dilation; slot w adds w."""
    from fna._rpb import axis_index
    for L in range(1, 14):
        for d in range(1, L + 1):
            for K in range(1, L // d + 1, 2):
                idx, valid = axis_index(L, K, d, 1, False, "cpu")
                assert valid is None
                for x in range(L):
                    assert idx[x, 0] == natten_bias_start(x, L, K, d), (L, K, d, x)
                    assert torch.equal(idx[x], idx[x, 0] + torch.arange(K))
                assert idx.min() >= 0 and idx.max() <= 2 * K - 2


def test_rpb_grad_flows_and_default_init_runs():
    """A freshly built NAT-style module (truncated-normal rpb) trains: rpb gets a gradient that
    differs between heads and is not all zero."""
    torch.manual_seed(seed_of("rpb-grad"))
    m = fna.NeighborhoodAttention2D(dim=16, num_heads=2, kernel_size=3, dilation=2,
                                    rel_pos_bias=True)
    x = torch.randn(2, 9, 8, 16)
    m(x).square().sum().backward()
    assert m.rpb.grad is not None and m.rpb.grad.abs().min() > 0
    assert not torch.equal(m.rpb.grad[0], m.rpb.grad[1])


# ---- attention dropout -------------------------------------------------------------------------

def test_attn_drop_eval_is_identity():
    """In eval mode attn_drop does nothing: the output is that of the same weights without it
    (the fused path); in training it differs."""
    torch.manual_seed(seed_of("attn-drop-eval"))
    a = fna.NeighborhoodAttention2D(dim=16, num_heads=2, kernel_size=3, attn_drop=0.5)
    b = fna.NeighborhoodAttention2D(dim=16, num_heads=2, kernel_size=3)
    b.load_state_dict(a.state_dict(), strict=True)
    x = torch.randn(2, 6, 7, 16)
    a.eval()
    b.eval()
    assert torch.equal(a(x), b(x))
    a.train()
    torch.manual_seed(1)
    assert not torch.allclose(a(x), b(x), atol=1e-3)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_attn_drop_training_matches_reference(rank):
    """Training with attn_drop: reproducible under a seed, different under another, and equal to
    the float64 composition with the same dropout mask applied to the softmaxed weights (the mask
    drawn as nn.Dropout draws it on a tensor of the weights' shape), with rpb."""
    rng = np.random.default_rng(seed_of("attn-drop", rank))
    torch.manual_seed(seed_of("attn-drop-init", rank))
    shape, ks, st, dil, causal = random_module_problem(rng, rank)
    p = 0.3
    m = MODULES[rank](dim=8, num_heads=2, kernel_size=ks, stride=st, dilation=dil,
                      rel_pos_bias=True, attn_drop=p)
    x = torch.from_numpy(rng.standard_normal((2, *shape, 8)).astype(np.float32))
    torch.manual_seed(123)
    y1 = m(x)
    torch.manual_seed(123)
    y2 = m(x)
    torch.manual_seed(124)
    y3 = m(x)
    assert torch.equal(y1, y2) and not torch.equal(y1, y3)
    # The same mask, on the weights [B, *shape, H, W] in the unfused ops' slot order.
    W, N = math.prod(ks), math.prod(shape)
    torch.manual_seed(123)
    keep = F.dropout(torch.ones(2, *shape, 2, W), p, training=True).double()
    slots = window_slots(shape, ks, st, dil, causal)  # [N, W] key of each slot
    dense = torch.zeros(2, 2, N, N, dtype=torch.float64)  # [B, H, query, key]
    keep = keep.reshape(2, N, 2, W).permute(0, 2, 1, 3)
    for qi in range(N):
        for w in range(W):
            if slots[qi, w] >= 0:
                dense[:, :, qi, slots[qi, w]] = keep[:, :, qi, w]
    ref = reference(x.double(), params64(m), cfg_of(m, keep=dense))
    check_close(np64(y1), np64(ref), what=f"dropout output rank {rank}")


def test_attn_drop_needs_unfused_backend():
    m = fna.NeighborhoodAttention1D(dim=8, num_heads=2, kernel_size=3, attn_drop=0.2,
                                    backend="cuda-fused")
    with pytest.raises(ValueError, match=r"attn_drop=0.2 in training mode.*backend='cuda-fused'"):
        m(torch.randn(1, 6, 8))


# ---- backend names -------------------------------------------------------------------------------

def test_natten_backend_names_errors():
    g = torch.Generator().manual_seed(seed_of("backend-names"))
    q = torch.randn(1, 6, 6, 2, 8, generator=g)
    with pytest.raises(ValueError, match=r"na2d: backend='cutlass-fna' runs fna's cuda-fused "
                                         r"backend, which needs CUDA tensors, but query is on cpu"):
        fna.na2d(q, q, q, 3, backend="cutlass-fna")
    with pytest.raises(ValueError, match=r"backend='hopper-fna' runs fna's cuda-fused backend, "
                                         r"which needs CUDA tensors; NumPy"):
        fna.na2d(q.numpy(), q.numpy(), q.numpy(), 3, backend="hopper-fna")
    with pytest.raises(ValueError, match=r"backend='blackwell-fna' names NATTEN's Blackwell.*"
                                         r"backend='cuda-fused'"):
        fna.na2d(q, q, q, 3, backend="blackwell-fna")
    with pytest.raises(ValueError, match=r"backend='flex-fna' names NATTEN's FlexAttention"):
        fna.na2d(q, q, q, 3, backend="flex-fna")
    with pytest.raises(ValueError, match=r"backend='hopper-fna' names a fused backend.*no "
                                         r"unfused"):
        fna.na2d_qk(q, q, 3, backend="hopper-fna")
    with pytest.raises(ValueError, match=r"backend='cutlass-fmha' is not one of auto, reference, "
                                         r"cpu, cuda-naive, cuda-fused, cuda-gemm \(or NATTEN's "
                                         r"cutlass-fna, hopper-fna\)"):
        fna.na2d(q, q, q, 3, backend="cutlass-fmha")
    out, lse = fna.na2d(q, q, q, 3, return_lse=True)
    with pytest.raises(ValueError, match=r"na_backward: backend='cutlass-fna' runs fna's "
                                         r"cuda-fused backend, which needs CUDA tensors"):
        fna.na_backward(out, q, q, q, out, lse, 3, backend="cutlass-fna")
    # The fna backend a NATTEN name stands for (resolve_backend maps it the same way).
    assert _args.backend_name("cutlass-fna") == _args.backend_name("hopper-fna") == "cuda-fused"
    assert _args.natten_backend("cutlass-fna") == "cutlass-fna"
    assert _args.natten_backend("cuda-fused") is None and _args.natten_backend(None) is None


def _tuning(text):
    return dict(kv.split("=", 1) for kv in text.split(",") if kv)


def test_natten_backend_options():
    """What cutlass-fna / hopper-fna ask of cuda-fused, and their contradictions."""
    opts = _args.natten_backend_options
    yes, no = (lambda: True), (lambda: False)
    cutlass = {"fwd_schedule": "mma_sync", "fwd_box": "off", "fwd_strip": "off",
               "fwd_simt": "off", "bwd_kernel": "sm80"}
    # cutlass-fna, on any device: the plan's tiled sm80 forward (fwd_schedule=mma_sync: chosen
    # as on a device without wgmma, box / strip / SIMT off) and the sm80 backward.
    for hopper in (False, True):
        c, b, t = opts("na2d", "cutlass-fna", hopper, torch.bfloat16, "", "", "", yes)
        assert (c, b) == ("", "") and _tuning(t) == cutlass
    c, b, t = opts("na2d", "cutlass-fna", True, torch.bfloat16, "", "", "persistent=off", yes)
    assert (c, b) == ("", "") and _tuning(t) == dict(cutlass, persistent="off")
    c, b, t = opts("na2d", "cutlass-fna", True, torch.bfloat16, "", "", "fwd_schedule=mma_sync",
                   yes)
    assert _tuning(t) == cutlass
    # The caller's own sm80 names stay; the backward then needs no tuning.
    c, b, t = opts("na2d", "cutlass-fna", True, torch.float32, "fna_fwd_sm80_x", "fna_bwd_sm80_y",
                   "", yes)
    assert (c, b, t) == ("fna_fwd_sm80_x", "fna_bwd_sm80_y", "")
    for kwargs, msg in [(dict(config="fna_fwd_sm90ws_x"), r"config='fna_fwd_sm90ws_x' is not an "
                                                          r"mma.sync"),
                        (dict(backward_config="fna_bwd_sm90_x"), r"backward_config="),
                        (dict(tuning="fwd_schedule=plain"), r"fwd_schedule='plain' names a "
                                                            r"Hopper"),
                        (dict(tuning="bwd_kernel=sm90ws"), r"tuning bwd_kernel='sm90ws' "
                                                           r"contradicts backend='cutlass-fna'"),
                        (dict(tuning="fwd_box=on"), r"tuning fwd_box='on' contradicts"),
                        (dict(tuning="mode=auto"), r"tuning mode 'auto'")]:
        a = dict(config="", backward_config="", tuning="")
        a.update(kwargs)
        with pytest.raises(ValueError, match=msg):
            opts("na2d", "cutlass-fna", False, torch.float16, a["config"], a["backward_config"],
                 a["tuning"], yes)
    # hopper-fna: compute capability 9.0, 16-bit, a Hopper configuration for the head dim.
    c, b, t = opts("na2d", "hopper-fna", True, torch.float16, "", "", "", yes)
    assert (c, b) == ("", "") and _tuning(t) == {"fwd_box": "off", "fwd_strip": "off",
                                                 "fwd_simt": "off"}
    c, b, t = opts("na2d", "hopper-fna", True, torch.float16, "fna_fwd_sm90_x", "", "", yes)
    assert (c, t) == ("fna_fwd_sm90_x", "")
    with pytest.raises(ValueError, match=r"hopper-fna.*compute capability 9.0"):
        opts("na2d", "hopper-fna", False, torch.float16, "", "", "", yes)
    with pytest.raises(ValueError, match=r"hopper-fna.*float16 / bfloat16; the tensors are "
                                         r"float32"):
        opts("na2d", "hopper-fna", True, torch.float32, "", "", "", yes)
    with pytest.raises(ValueError, match=r"config='fna_fwd_sm80_x' is not a Hopper"):
        opts("na2d", "hopper-fna", True, torch.float16, "fna_fwd_sm80_x", "", "", yes)
    with pytest.raises(ValueError, match=r"no Hopper \(wgmma\) forward configuration"):
        opts("na2d", "hopper-fna", True, torch.float16, "", "", "", no)
    # The backward alone (na_backward): no forward tuning.
    c, b, t = opts("na_backward", "cutlass-fna", True, torch.float16, "", "", "", yes,
                   forward=False)
    assert (c, b, _tuning(t)) == ("", "", {"bwd_kernel": "sm80"})


# ---- deterministic -------------------------------------------------------------------------------

@pytest.fixture
def restore_determinism():
    prev = torch.are_deterministic_algorithms_enabled()
    warn = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(prev, warn_only=warn)


@pytest.fixture
def seen_options(monkeypatch):
    """(extension function, deterministic) of every fused call fna's torch ops make."""
    from fna import _torch_ops
    seen = []
    call = _torch_ops._call

    def spy(fn, device, *arrays, sp, backend, scale=-1.0, opts=("", False, False, "", "")):
        seen.append((fn.__name__, opts[1]))
        return call(fn, device, *arrays, sp=sp, backend=backend, scale=scale, opts=opts)

    monkeypatch.setattr(_torch_ops, "_call", spy)
    return seen


def _qkv(tag, grad=True):
    g = torch.Generator().manual_seed(seed_of("det", tag))
    return [torch.randn(1, 7, 6, 2, 4, generator=g).requires_grad_(grad) for _ in range(3)]


def test_deterministic_follows_torch(restore_determinism, seen_options):
    q, k, v = _qkv("follow")
    torch.use_deterministic_algorithms(False)
    fna.na2d(q, k, v, 3).sum().backward()
    assert seen_options == [("forward", False), ("backward", False)]
    seen_options.clear()
    torch.use_deterministic_algorithms(True)
    out = fna.na2d(q, k, v, 3)
    out.sum().backward()
    assert seen_options == [("forward", True), ("backward", True)]
    seen_options.clear()
    # The flag is read at the forward call, as the backward's options are bound there.
    out = fna.na2d(q, k, v, 3)
    torch.use_deterministic_algorithms(False)
    out.sum().backward()
    assert seen_options == [("forward", True), ("backward", True)]
    seen_options.clear()
    fna.na2d(q, k, v, 3, deterministic=True).sum().backward()  # explicit True, flag off
    assert seen_options == [("forward", True), ("backward", True)]
    seen_options.clear()
    # The explicit backward and the modules follow it too.
    torch.use_deterministic_algorithms(True)
    with torch.no_grad():
        out, lse = fna.na2d(q, k, v, 3, return_lse=True)
    fna.na_backward(torch.ones_like(out), q, k, v, out, lse, 3)
    m = fna.NeighborhoodAttention2D(dim=8, num_heads=2, kernel_size=3)
    m(torch.randn(1, 6, 6, 8)).sum().backward()
    assert seen_options == [("forward", True), ("backward", True), ("forward", True),
                            ("backward", True)]
    # NumPy arrays do not follow torch's flag (no torch op runs).
    a = q.detach().numpy()
    assert fna.na2d(a, a, a, 3).shape == a.shape


def test_deterministic_false_with_torch_flag(restore_determinism, seen_options):
    """Explicit deterministic=False under torch.use_deterministic_algorithms(True): an error where
    a backward will run (as torch's own non-deterministic ops), a warning with warn_only (and
    False as asked); nothing where no backward can run."""
    q, k, v = _qkv("explicit-false")
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match=r"na2d: deterministic=False .* "
                                           r"torch.use_deterministic_algorithms\(True\)"):
        fna.na2d(q, k, v, 3, deterministic=False)
    with torch.no_grad():
        out, lse = fna.na2d(q, k, v, 3, deterministic=False, return_lse=True)
    assert seen_options == [("forward", False)]
    with pytest.raises(RuntimeError, match=r"na_backward: deterministic=False"):
        fna.na_backward(torch.ones_like(out), q, k, v, out, lse, 3, deterministic=False)
    seen_options.clear()
    torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.warns(UserWarning, match=r"deterministic=False"):
        out = fna.na2d(q, k, v, 3, deterministic=False)
    out.sum().backward()
    assert seen_options == [("forward", False), ("backward", False)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fna.na2d(q, k, v, 3)  # None follows the flag: no warning
    with pytest.raises(TypeError, match=r"deterministic='no' must be a bool or None"):
        fna.na2d(q, k, v, 3, deterministic="no")


def test_deterministic_gradients_bitwise(restore_determinism):
    """With torch's flag on, the CPU backward's gradients are bitwise reproducible (the
    deterministic task order); the same as deterministic=True."""
    g = torch.Generator().manual_seed(seed_of("det-bitwise"))
    q, k, v = (torch.randn(2, 40, 36, 4, 32, generator=g).requires_grad_() for _ in range(3))
    d = torch.randn(2, 40, 36, 4, 32, generator=g)
    torch.use_deterministic_algorithms(True)
    grads = []
    for _ in range(3):
        grads.append(torch.autograd.grad(fna.na2d(q, k, v, 7, backend="cpu"), (q, k, v), d))
    torch.use_deterministic_algorithms(False)
    grads.append(torch.autograd.grad(fna.na2d(q, k, v, 7, backend="cpu", deterministic=True),
                                     (q, k, v), d))
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            assert torch.equal(a, b)


# ---- FLOPs -------------------------------------------------------------------------------------

def mask_pairs(shape, ks, st, dil, causal, n_add=0):
    """Attended pairs of one (batch, head), counted on helpers.full_mask."""
    return int(full_mask(shape, ks, st, dil, causal).sum()) + math.prod(shape) * n_add


def counts_of(fn):
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as mode:
        fn()
    return {str(op): n for op, n in mode.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_flops_against_mask(rank):
    """fna.flops: 2 * B * H * P * (D + D_v) forward, 2.5x that backward, P counted on the mask
    (causal windows truncated, additional keys included)."""
    for case in range(6):
        rng = np.random.default_rng(seed_of("flops-mask", rank, case))
        shape, ks, st, dil, causal = random_params(rng, rank)
        B, H, D, Dv = (int(rng.integers(1, 4)) for _ in range(4))
        n_add = int(rng.integers(0, 3))
        P = mask_pairs(shape, ks, st, dil, causal, n_add)
        kw = dict(stride=st, dilation=dil, is_causal=causal, dim_v=Dv, num_additional=n_add)
        assert fna.flops((B, *shape, H, D), ks, **kw) == 2 * B * H * P * (D + Dv)
        assert fna.flops((B, *shape, H, D), ks, backward=True, **kw) == 5 * B * H * P * (D + Dv)
    # Non-causal: exactly N * prod(K) pairs; dim_v defaults to D.
    assert fna.flops((2, 32, 32, 4, 64), 7) == 4 * 2 * 4 * 1024 * 49 * 64
    assert fna.flops([1, 32768, 16, 128], 2048) == 4 * 16 * 32768 * 2048 * 128


def test_flops_errors():
    with pytest.raises(ValueError, match=r"kernel_size\[1\]=9 \* dilation\[1\]=1 exceeds input "
                                         r"length 8"):
        fna.flops((1, 8, 8, 2, 4), (3, 9))
    with pytest.raises(ValueError, match=r"query_shape=\(1, 8, 4\) must be \[B, \*spatial, H, D\]"):
        fna.flops((1, 8, 4), 3)
    with pytest.raises(ValueError, match=r"dim_v=0 must be an int >= 1"):
        fna.flops((1, 8, 2, 4), 3, dim_v=0)
    with pytest.raises(ValueError, match=r"stride\[0\]=4 must be in \[1, kernel_size\[0\]=3\]"):
        fna.flops((1, 8, 2, 4), 3, stride=4)
    with pytest.raises(TypeError, match=r"backward=1 must be a bool"):
        fna.flops((1, 8, 2, 4), 3, backward=1)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_flop_counter_counts_fna_ops(rank):
    """torch.utils.flop_counter.FlopCounterMode counts fna.flops for the fused forward and
    backward (eager calls, which otherwise skip the op's dispatcher), and 2 * B * H * P * D (qk) /
    D_v (av), twice that backward, for the unfused ops, P from the mask."""
    for case in range(3):
        rng = np.random.default_rng(seed_of("flop-counter", rank, case))
        p = random_problem(rng, rank)
        t = {n: (None if p[n] is None else
                 torch.from_numpy(np.asarray(p[n], np.float32)).requires_grad_(True))
             for n in ("q", "k", "v", "add_k", "add_v")}
        q, k, v = t["q"], t["k"], t["v"]
        B, H, D, Dv = q.shape[0], q.shape[-2], q.shape[-1], v.shape[-1]
        n_add = 0 if t["add_k"] is None else t["add_k"].shape[1]
        sp = dict(stride=p["st"], dilation=p["dil"], is_causal=p["causal"])
        fwd = fna.flops(tuple(q.shape), p["ks"], dim_v=Dv, num_additional=n_add, **sp)
        bwd = fna.flops(tuple(q.shape), p["ks"], dim_v=Dv, num_additional=n_add, backward=True,
                        **sp)
        P = mask_pairs(q.shape[1:-2], p["ks"], p["st"], p["dil"], p["causal"], n_add)
        assert fwd == 2 * B * H * P * (D + Dv)
        call = lambda: NA[rank](q, k, v, p["ks"], additional_keys=t["add_k"],  # noqa: E731
                                additional_values=t["add_v"], **sp)
        with torch.no_grad():
            assert counts_of(call) == {"fna.na_forward": fwd}
        out = []
        counts = counts_of(lambda: out.append(call()))
        assert counts == {"fna.na_forward": fwd}
        d = torch.from_numpy(rng.standard_normal(out[0].shape).astype(np.float32))
        assert counts_of(lambda: out[0].backward(d)) == {"fna.na_backward": bwd}
        # The counted call computes what the uncounted one does.
        torch.testing.assert_close(out[0], call(), rtol=0, atol=0)
        # Unfused.
        attn = []
        counts = counts_of(lambda: attn.append(QK[rank](q, k, p["ks"],
                                                        additional_keys=t["add_k"], **sp)))
        assert counts == {"fna.na_qk": 2 * B * H * P * D}
        w = torch.softmax(attn[0].detach(), -1).requires_grad_(True)
        o = []
        counts = counts_of(lambda: o.append(AV[rank](w, v, p["ks"],
                                                     additional_values=t["add_v"], **sp)))
        assert counts == {"fna.na_av": 2 * B * H * P * Dv}
        assert counts_of(lambda: o[0].sum().backward()) == {"fna.na_av_backward":
                                                            4 * B * H * P * Dv}
        assert counts_of(lambda: attn[0].sum().backward()) == {"fna.na_qk_backward":
                                                               4 * B * H * P * D}


def test_flop_counter_modules():
    """A module's attention is counted: the fused op, with or without rpb (on the CPU the cpu
    backend adds the bias itself); with attention dropout in training, the unfused ops."""
    torch.manual_seed(seed_of("flop-module"))
    x = torch.randn(2, 9, 8, 16)
    P = mask_pairs([9, 8], [3, 5], [1, 1], [2, 1], [False, False])
    for rpb, drop in ((False, 0.0), (True, 0.0), (True, 0.5)):
        m = fna.NeighborhoodAttention2D(dim=16, num_heads=4, kernel_size=(3, 5), dilation=(2, 1),
                                        rel_pos_bias=rpb, attn_drop=drop)
        counts = counts_of(lambda: m(x).sum().backward())
        assert counts["aten.addmm"] > 0 or counts.get("aten.mm", 0) > 0
        fna_counts = {op: n for op, n in counts.items() if op.startswith("fna.")}
        if drop:
            assert fna_counts == {"fna.na_qk": 2 * 2 * 4 * P * 4, "fna.na_av": 2 * 2 * 4 * P * 4,
                                  "fna.na_qk_backward": 4 * 2 * 4 * P * 4,
                                  "fna.na_av_backward": 4 * 2 * 4 * P * 4}
        else:
            q_shape = (2, 9, 8, 4, 4)
            assert fna_counts == {
                "fna.na_forward": fna.flops(q_shape, (3, 5), dilation=(2, 1)),
                "fna.na_backward": fna.flops(q_shape, (3, 5), dilation=(2, 1), backward=True)}
