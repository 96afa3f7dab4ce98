"""fna.merge_attentions: attention over disjoint key sets, merged by their LSEs, equals attention
over the union, forward and gradients (through the outputs and the LSEs); -inf LSEs; dtypes;
argument errors."""

import numpy as np
import pytest

from helpers import check_close, seed_of

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from test_lse_gradient import NAMES, fixed_problems, leaves_of, torch_na  # noqa: E402

NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}


def dense(q, k, v, scale=None):
    """Plain attention of q [B, *tokens, H, D] over all of k / v [B, M, H, D(_v)]:
    (out [B, *tokens, H, D_v], lse [B, *tokens, H])."""
    B, H, D = q.shape[0], q.shape[-2], q.shape[-1]
    Q = q.reshape(B, -1, H, D).transpose(1, 2)
    S = (Q @ k.transpose(1, 2).transpose(-1, -2)) * (D ** -0.5 if scale is None else scale)
    out = torch.softmax(S, -1) @ v.transpose(1, 2)
    lse = torch.logsumexp(S, -1)
    return (out.transpose(1, 2).reshape(tuple(q.shape[:-1]) + (v.shape[-1],)),
            lse.transpose(1, 2).reshape(tuple(q.shape[:-1])))


def gen(seed, *shape, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed_of("merge", seed))
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def loss_of(out, lse, w_out, w_lse):
    return ((out.double() * w_out).sum() + (lse.double() * w_lse).sum()
            + 0.25 * lse.double().square().sum())


def grads(loss, leaves):
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("splits", [[5, 7], [1, 4, 7], [3, 3, 3, 3]])
def test_dense_parts_merge_to_the_joint_attention(splits):
    """Keys split into disjoint parts, each attended with plain torch (float64): the merge equals
    attention over all keys, forward and the gradients of a loss on the merged output and LSE."""
    M = sum(splits)
    q = gen("q", 2, 6, 3, 4).requires_grad_()
    k = gen("k", 2, M, 3, 4).requires_grad_()
    v = gen("v", 2, M, 3, 5).requires_grad_()
    w_out, w_lse = gen("wo", 2, 6, 3, 5), gen("wl", 2, 6, 3)
    bounds = np.cumsum([0] + splits)
    parts = [dense(q, k[:, a:b], v[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    out, lse = fna.merge_attentions([o for o, _ in parts], [x for _, x in parts])
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    j_out, j_lse = dense(q, k, v)
    torch.testing.assert_close(out, j_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, j_lse, rtol=1e-12, atol=1e-12)
    got = grads(loss_of(out, lse, w_out, w_lse), (q, k, v))
    ref = grads(loss_of(j_out, j_lse, w_out, w_lse), (q, k, v))
    for g, r, n in zip(got, ref, "qkv"):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12, msg=f"d{n}")


def test_gradcheck_in_outputs_and_lses():
    """The merge's own derivative in every output and LSE, against finite differences."""
    outs = [gen(f"o{i}", 1, 3, 2, 2).requires_grad_() for i in range(3)]
    lses = [(2.0 * gen(f"l{i}", 1, 3, 2)).requires_grad_() for i in range(3)]

    def f(*xs):
        return fna.merge_attentions(list(xs[:3]), list(xs[3:]))

    assert torch.autograd.gradcheck(f, outs + lses)


def test_matches_logsumexp_and_softmax_weights():
    """The definition, written independently: lse = logsumexp_i(lse_i), out = sum_i
    softmax_i(lse) out_i; with large LSEs (1e4, no overflow)."""
    outs = [gen(f"a{i}", 2, 4, 3, 6) for i in range(3)]
    lses = [1e4 + 3.0 * gen(f"b{i}", 2, 4, 3) for i in range(3)]
    out, lse = fna.merge_attentions(outs, lses)
    L = torch.stack(lses)
    torch.testing.assert_close(lse, torch.logsumexp(L, 0), rtol=1e-14, atol=0)
    w = torch.softmax(L, 0).unsqueeze(-1)
    torch.testing.assert_close(out, (w * torch.stack(outs)).sum(0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_neighborhood_and_additional_keys_merged(backend, rank):
    """fna neighborhood attention (no additional keys) merged with plain torch attention over the
    additional keys equals fna with the additional keys in its softmax: forward, and the
    gradients of Q, K, V and the additional keys / values through the merged output and LSE
    (fna's LSE gradient reaches its backward)."""
    p = fixed_problems(rank)["gqa"]  # GQA, 2 additional keys, batch 2
    t = leaves_of(p)
    H = p["q"].shape[-2]
    rep = H // p["k"].shape[-2]
    na_out, na_lse = NA[rank](t["q"], t["k"], t["v"], p["ks"], backend=backend, return_lse=True)
    add_out, add_lse = dense(t["q"], t["add_k"].repeat_interleave(rep, 2),
                             t["add_v"].repeat_interleave(rep, 2))
    out, lse = fna.merge_attentions([na_out, add_out], [na_lse, add_lse])
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    rng = np.random.default_rng(seed_of("merge-nbr-add", backend, rank))
    w_out = torch.from_numpy(rng.standard_normal(out.shape))
    w_lse = torch.from_numpy(2.0 * rng.standard_normal(lse.shape))
    got = grads(loss_of(out, lse, w_out, w_lse), [t[n] for n in NAMES])
    ref_t = {n: (t[n].detach().double().requires_grad_(True) if n in NAMES else t[n]) for n in t}
    r_out, r_lse = torch_na(ref_t)  # the joint softmax, float64
    check_close(out.detach().numpy(), r_out.detach().numpy(), what="merged output")
    check_close(lse.detach().numpy(), r_lse.detach().numpy(), what="merged lse")
    ref = grads(loss_of(r_out, r_lse, w_out, w_lse), [ref_t[n] for n in NAMES])
    for g, r, n in zip(got, ref, NAMES):
        check_close(g.numpy(), r.numpy(), what=f"{backend} rank {rank} d{n}")
    # The joint fna call agrees too.
    j_out, j_lse = NA[rank](t["q"], t["k"], t["v"], p["ks"], additional_keys=t["add_k"],
                            additional_values=t["add_v"], backend=backend, return_lse=True)
    check_close(out.detach().numpy(), j_out.detach().numpy(), what="merged vs joint output")
    check_close(lse.detach().numpy(), j_lse.detach().numpy(), what="merged vs joint lse")


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("shape", [(9,), (4, 5)])
def test_two_fna_calls_merged(backend, shape):
    """Two fna calls with full windows (kernel_size = shape) over two disjoint key / value sets:
    merged, they are dense attention over both sets; gradients flow through both calls' LSEs."""
    rank = len(shape)
    q = gen("fq", 1, *shape, 2, 4, dtype=torch.float32).requires_grad_()
    ka, kb = (gen(f"fk{i}", 1, *shape, 2, 4, dtype=torch.float32).requires_grad_() for i in (0, 1))
    va, vb = (gen(f"fv{i}", 1, *shape, 2, 3, dtype=torch.float32).requires_grad_() for i in (0, 1))
    a = NA[rank](q, ka, va, list(shape), backend=backend, return_lse=True)
    b = NA[rank](q, kb, vb, list(shape), backend=backend, return_lse=True)
    out, lse = fna.merge_attentions([a[0], b[0]], [a[1], b[1]])
    w_out, w_lse = gen("fwo", *out.shape), gen("fwl", *lse.shape)
    leaves = (q, ka, kb, va, vb)
    got = grads(loss_of(out, lse, w_out, w_lse), leaves)
    r = [x.detach().double().requires_grad_() for x in leaves]
    flat = lambda x: x.reshape(1, -1, 2, x.shape[-1])  # noqa: E731
    r_out, r_lse = dense(r[0], torch.cat([flat(r[1]), flat(r[2])], 1),
                         torch.cat([flat(r[3]), flat(r[4])], 1))
    check_close(out.detach().numpy(), r_out.detach().numpy(), what="merged output")
    check_close(lse.detach().numpy(), r_lse.detach().numpy(), what="merged lse")
    ref = grads(loss_of(r_out, r_lse, w_out, w_lse), r)
    for g, rg, n in zip(got, ref, ("q", "k_a", "k_b", "v_a", "v_b")):
        check_close(g.numpy(), rg.numpy(), what=f"d{n}")


def test_negative_infinite_lse():
    """A part with LSE = -inf (no keys) has weight 0 whatever its output holds (NaN here); rows
    where every part is empty give output 0 and LSE -inf. Nothing is NaN, gradients included."""
    o1 = gen("n1", 1, 4, 2, 3).requires_grad_()
    o2 = gen("n2", 1, 4, 2, 3).requires_grad_()
    l1 = gen("m1", 1, 4, 2)
    l2 = gen("m2", 1, 4, 2)
    with torch.no_grad():
        l1[0, 1, 0] = float("-inf")            # part 1 empty: the merge is part 2
        o1.data[0, 1, 0] = float("nan")
        l1[0, 2, 1] = l2[0, 2, 1] = float("-inf")  # both empty
        o2.data[0, 2, 1] = float("nan")
    l1.requires_grad_()
    l2.requires_grad_()
    out, lse = fna.merge_attentions([o1, o2], [l1, l2])
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 1, 0], o2[0, 1, 0].detach(), rtol=1e-14, atol=0)
    assert float(lse[0, 1, 0].detach()) == float(l2[0, 1, 0].detach())
    assert torch.equal(out[0, 2, 1], torch.zeros(3, dtype=torch.float64))
    assert float(lse[0, 2, 1].detach()) == float("-inf")
    finite = torch.isfinite(lse)
    (out.sum() + lse[finite].sum()).backward()
    for x in (o1, o2, l1, l2):
        assert torch.isfinite(x.grad).all()
    assert float(o1.grad[0, 1, 0].abs().max()) == 0.0 and float(l1.grad[0, 1, 0]) == 0.0
    assert float(o2.grad[0, 1, 0].abs().min()) == 1.0  # all the weight on part 2


def test_nan_and_positive_infinite_lse():
    """A NaN or +inf LSE is not an empty part: the merged LSE is NaN / +inf in its row (as
    torch.logsumexp; it said -inf, no keys, before) and the output row NaN; other rows are
    untouched."""
    o = [gen(f"p{i}", 1, 3, 2, 4) for i in range(2)]
    lse = [gen(f"q{i}", 1, 3, 2) for i in range(2)]
    lse[0][0, 0, 1] = float("nan")
    lse[1][0, 2, 0] = float("inf")
    out, merged = fna.merge_attentions(o, lse)
    ref = torch.logsumexp(torch.stack(lse), dim=0)
    assert bool(merged[0, 0, 1].isnan()) and bool(ref[0, 0, 1].isnan())
    assert float(merged[0, 2, 0]) == float("inf") == float(ref[0, 2, 0])
    assert bool(out[0, 0, 1].isnan().all()) and bool(out[0, 2, 0].isnan().all())
    ok = torch.ones(1, 3, 2, dtype=torch.bool)
    ok[0, 0, 1] = ok[0, 2, 0] = False
    torch.testing.assert_close(merged[ok], ref[ok], rtol=1e-14, atol=1e-14)
    assert torch.isfinite(out[ok]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_output_dtypes(dtype):
    """Outputs keep their dtype (merged in float32), the LSE stays float32."""
    outs = [gen(f"d{i}", 1, 5, 2, 8, dtype=dtype) for i in range(2)]
    lses = [gen(f"e{i}", 1, 5, 2, dtype=torch.float32) for i in range(2)]
    out, lse = fna.merge_attentions(outs, lses)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref_out, ref_lse = fna.merge_attentions([o.double() for o in outs],
                                            [x.double() for x in lses])
    torch.testing.assert_close(out.double(), ref_out, rtol=0, atol=2 * 2.0 ** -8 * 4)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)


def test_flags_and_layouts():
    """use_autograd_fix either way gives the same result; torch_compile=True the same values;
    non-contiguous views and NATTEN's [B, seq, H, D] layout are accepted."""
    base = [gen(f"h{i}", 2, 3, 7, 4) for i in range(2)]  # heads-first [B, H, seq, D]
    outs = [x.transpose(1, 2) for x in base]               # [B, seq, H, D], not contiguous
    lses = [gen(f"i{i}", 2, 3, 7).transpose(1, 2) for i in range(2)]
    assert not outs[0].is_contiguous()
    ref = fna.merge_attentions([o.contiguous() for o in outs], [x.contiguous() for x in lses])
    for fix in (True, False):
        got = fna.merge_attentions(outs, lses, use_autograd_fix=fix)
        for a, b in zip(got, ref):
            assert torch.equal(a, b)
    torch._dynamo.reset()
    got = fna.merge_attentions(tuple(outs), tuple(lses), torch_compile=True)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_errors():
    o = [gen(f"x{i}", 1, 4, 2, 3, dtype=torch.float32) for i in range(2)]
    x = [gen(f"y{i}", 1, 4, 2, dtype=torch.float32) for i in range(2)]
    m = fna.merge_attentions
    with pytest.raises(TypeError, match="merge_attentions: outputs must be a list or tuple of "
                                        "torch tensors, got Tensor"):
        m(o[0], x)
    with pytest.raises(TypeError, match="lse_tensors must be a list or tuple .* got dict"):
        m(o, {})
    with pytest.raises(ValueError, match=r"outputs has 1 tensor\(s\); merging needs at least 2"):
        m(o[:1], x[:1])
    with pytest.raises(ValueError, match="outputs has 2 tensors but lse_tensors has 3"):
        m(o, x + x[:1])
    with pytest.raises(TypeError, match=r"outputs\[1\] must be a torch.Tensor, got ndarray"):
        m([o[0], o[1].numpy()], x)
    with pytest.raises(TypeError, match=r"lse_tensors\[0\] must be a torch.Tensor, got NoneType"):
        m(o, [None, x[1]])
    with pytest.raises(TypeError, match="torch_compile='yes' must be a bool"):
        m(o, x, torch_compile="yes")
    with pytest.raises(TypeError, match="use_autograd_fix=1 must be a bool"):
        m(o, x, use_autograd_fix=1)
    with pytest.raises(ValueError, match=r"outputs\[0\] has shape \(4, 3\); expected \[batch, "
                                         r"\*tokens, heads, head_dim\]"):
        m([o[0][0, :, 0], o[1][0, :, 0]], [x[0][0, :, 0], x[1][0, :, 0]])
    with pytest.raises(ValueError, match=r"outputs\[1\] has shape \(1, 4, 2, 2\) but outputs\[0\] "
                                         r"has shape \(1, 4, 2, 3\)"):
        m([o[0], o[1][..., :2]], x)
    with pytest.raises(ValueError, match=r"lse_tensors\[1\] has shape \(1, 4\); expected "
                                         r"\(1, 4, 2\)"):
        m(o, [x[0], x[1][..., 0]])
    with pytest.raises(TypeError, match="outputs\\[0\\] has dtype int64; expected float16"):
        m([t.long() for t in o], x)
    with pytest.raises(TypeError, match=r"outputs\[1\] has dtype float16 but outputs\[0\] has "
                                        "float32"):
        m([o[0], o[1].half()], x)
    with pytest.raises(TypeError, match=r"lse_tensors\[0\] has dtype bfloat16; expected float32"):
        m(o, [t.bfloat16() for t in x])
    with pytest.raises(TypeError, match=r"lse_tensors\[1\] has dtype float64 but lse_tensors\[0\] "
                                        "has float32"):
        m(o, [x[0], x[1].double()])
    with pytest.raises(ValueError, match=r"lse_tensors\[1\] is on meta but outputs\[0\] is on cpu"):
        m(o, [x[0], x[1].to("meta")])
