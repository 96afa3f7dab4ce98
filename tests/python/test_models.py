"""fna.models: NAT / DiNAT backbones against the published architecture.

* The expected state-dict table (keys and shapes) is generated here from the published configs
  (written out below: depths, embedding dim, heads, MLP ratio, layer scale, kernel, dilations),
  independently of fna.models; every variant's state dict must equal it, and a random state dict
  with exactly those keys must load with strict=True (a missing or extra key must not).
* The forward is checked against a plain-PyTorch float64 composition of the same layers with the
  same weights: convolutions, LayerNorms, GELU MLPs, and attention computed densely over all
  tokens from an explicit neighborhood mask (tests/helpers.full_mask, derived from
  docs/semantics.md) plus the relative positional bias gathered by each key's offset from its
  query. The reference is also shown to be sensitive to what it checks (a transposed rpb, no
  dilation, no layer scale give errors far above the tolerance).

The Mini variants run a full 224x224 forward (the published input size; the windows fit it), as
do reduced configurations (layer scale, dilations) at 96x96. Tiny / Small / Base forwards take
longer and run with FNA_SLOW_TESTS=1.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fna  # noqa: E402
import fna.models as models  # noqa: E402
from helpers import full_mask, seed_of  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLOW = pytest.mark.skipif(os.environ.get("FNA_SLOW_TESTS") != "1",
                          reason="slow (full 224x224 forward of a large variant): FNA_SLOW_TESTS=1")

# The published configurations (SHI-Labs NAT / DiNAT ImageNet-1K classification models), with
# their parameter counts in millions as reported (rounded) and training drop-path rates.
_DIL_MINI = [[1, 8, 1], [1, 4, 1, 4], [1, 2, 1, 2, 1, 2], [1, 1, 1, 1, 1]]
_DIL = [[1, 8, 1], [1, 4, 1, 4],
        [1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2], [1, 1, 1, 1, 1]]
PUBLISHED = {
    "nat_mini": dict(depths=[3, 4, 6, 5], dim=64, heads=[2, 4, 8, 16], mlp=3, ls=None,
                     dil=None, params=20, dpr=0.2),
    "nat_tiny": dict(depths=[3, 4, 18, 5], dim=64, heads=[2, 4, 8, 16], mlp=3, ls=None,
                     dil=None, params=28, dpr=0.2),
    "nat_small": dict(depths=[3, 4, 18, 5], dim=96, heads=[3, 6, 12, 24], mlp=2, ls=1e-5,
                      dil=None, params=51, dpr=0.3),
    "nat_base": dict(depths=[3, 4, 18, 5], dim=128, heads=[4, 8, 16, 32], mlp=2, ls=1e-5,
                     dil=None, params=90, dpr=0.5),
    "dinat_mini": dict(depths=[3, 4, 6, 5], dim=64, heads=[2, 4, 8, 16], mlp=3, ls=None,
                       dil=_DIL_MINI, params=20, dpr=0.2),
    "dinat_tiny": dict(depths=[3, 4, 18, 5], dim=64, heads=[2, 4, 8, 16], mlp=3, ls=None,
                       dil=_DIL, params=28, dpr=0.2),
    "dinat_small": dict(depths=[3, 4, 18, 5], dim=96, heads=[3, 6, 12, 24], mlp=2, ls=None,
                        dil=_DIL, params=51, dpr=0.3),
    "dinat_base": dict(depths=[3, 4, 18, 5], dim=128, heads=[4, 8, 16, 32], mlp=2, ls=1e-5,
                       dil=_DIL, params=90, dpr=0.5),
}
for _c in PUBLISHED.values():
    _c.setdefault("kernel", 7)
VARIANTS = list(PUBLISHED)


def expected_table(cfg, num_classes=1000, in_chans=3):
    """{key: shape} of the published module tree for a config."""
    E, K = cfg["dim"], cfg["kernel"]
    t = {
        "patch_embed.proj.0.weight": (E // 2, in_chans, 3, 3),
        "patch_embed.proj.0.bias": (E // 2,),
        "patch_embed.proj.1.weight": (E, E // 2, 3, 3),
        "patch_embed.proj.1.bias": (E,),
        "patch_embed.norm.weight": (E,),
        "patch_embed.norm.bias": (E,),
    }
    n = len(cfg["depths"])
    for i, depth in enumerate(cfg["depths"]):
        C, H, hidden = E * 2 ** i, cfg["heads"][i], int(E * 2 ** i * cfg["mlp"])
        for j in range(depth):
            p = f"levels.{i}.blocks.{j}."
            t.update({
                p + "norm1.weight": (C,), p + "norm1.bias": (C,),
                p + "attn.qkv.weight": (3 * C, C), p + "attn.qkv.bias": (3 * C,),
                p + "attn.rpb": (H, 2 * K - 1, 2 * K - 1),
                p + "attn.proj.weight": (C, C), p + "attn.proj.bias": (C,),
                p + "norm2.weight": (C,), p + "norm2.bias": (C,),
                p + "mlp.fc1.weight": (hidden, C), p + "mlp.fc1.bias": (hidden,),
                p + "mlp.fc2.weight": (C, hidden), p + "mlp.fc2.bias": (C,),
            })
            if cfg["ls"] is not None:
                t[p + "gamma1"] = (C,)
                t[p + "gamma2"] = (C,)
        if i < n - 1:
            p = f"levels.{i}.downsample."
            t.update({p + "reduction.weight": (2 * C, C, 3, 3),
                      p + "norm.weight": (2 * C,), p + "norm.bias": (2 * C,)})
    F_ = E * 2 ** (n - 1)
    t.update({"norm.weight": (F_,), "norm.bias": (F_,),
              "head.weight": (num_classes, F_), "head.bias": (num_classes,)})
    return t


def random_state_dict(table, seed):
    """Seeded random weights with sensible scales (so every part of the network shapes the
    output): fan-in-scaled weights, LayerNorm gains near 1, an rpb of order 1, layer-scale gains
    of order 1 (not the 1e-5 they start at, which would hide the residual branches)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, shape in table.items():
        if k.endswith("rpb"):
            v = torch.randn(shape, generator=g)
        elif k.endswith(("gamma1", "gamma2")):
            v = 0.5 + torch.rand(shape, generator=g)
        elif "norm" in k.rsplit(".", 2)[-2] and k.endswith("weight"):
            v = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif k.endswith("bias"):
            v = 0.1 * torch.randn(shape, generator=g)
        else:  # linear / conv weight
            fan_in = int(np.prod(shape[1:]))
            v = torch.randn(shape, generator=g) / fan_in ** 0.5
        sd[k] = v
    return sd


def build(name, **kw):
    return getattr(models, name)(**kw)


def loaded(name_or_cls, table, seed, **kw):
    """A model (built without initializing real weights) with a seeded random state dict
    loaded strictly; returns (model, state_dict)."""
    sd = random_state_dict(table, seed)
    with torch.device("meta"):
        m = build(name_or_cls, **kw) if isinstance(name_or_cls, str) else name_or_cls(**kw)
    m.load_state_dict(sd, strict=True, assign=True)
    return m.eval(), sd


# ---- structure ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", VARIANTS)
def test_state_dict_matches_published_table(name):
    cfg = PUBLISHED[name]
    with torch.device("meta"):
        m = build(name)
    got = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    want = expected_table(cfg)
    assert set(got) == set(want), (sorted(set(got) - set(want))[:5],
                                   sorted(set(want) - set(got))[:5])
    assert got == want, [(k, got[k], want[k]) for k in want if got[k] != want[k]][:5]
    # The parameter count the papers report (millions, rounded).
    assert round(sum(v.numel() for v in m.parameters()) / 1e6) == cfg["params"]
    # The module tree has no buffers (a checkpoint holds exactly the parameters).
    assert not list(m.buffers())
    assert m.num_features == cfg["dim"] * 8 and m.head.out_features == 1000


@pytest.mark.parametrize("name", VARIANTS)
def test_published_hyperparameters(name):
    """Dilation per layer (read from the attention modules), kernel, heads, scale, layer scale
    init and the stochastic-depth schedule (0 to the published rate, linearly)."""
    cfg = PUBLISHED[name]
    with torch.device("meta"):
        m = build(name)
    assert isinstance(m, models.DiNAT if cfg["dil"] else models.NAT)
    dil = [[blk.attn.dilation for blk in level.blocks] for level in m.levels]
    want = cfg["dil"] or [[1] * d for d in cfg["depths"]]
    assert dil == [[(d, d) for d in row] for row in want]
    layers = [blk for level in m.levels for blk in level.blocks]
    total = len(layers)
    for t, blk in enumerate(layers):
        i = next(i for i, lv in enumerate(m.levels) if any(b is blk for b in lv.blocks))
        a = blk.attn
        assert a.kernel_size == (7, 7) and a.stride == (1, 1) and a.is_causal == (False, False)
        assert a.num_heads == cfg["heads"][i] and a.rpb is not None
        assert a.scale == pytest.approx((cfg["dim"] * 2 ** i // cfg["heads"][i]) ** -0.5)
        rate = cfg["dpr"] * t / (total - 1)
        if t == 0:
            assert isinstance(blk.drop_path, torch.nn.Identity)
        else:
            assert blk.drop_path.p == pytest.approx(rate)
        assert blk.layer_scale == (cfg["ls"] is not None)
    # Layer-scale gains start at the published value (checked on a real, CPU-built layer).
    if cfg["ls"] is not None:
        layer = models.NATLayer(16, 2, layer_scale=cfg["ls"])
        assert torch.equal(layer.gamma1.detach(), torch.full((16,), cfg["ls"]))
    # Overrides reach the model.
    with torch.device("meta"):
        m2 = build(name, num_classes=10, drop_path_rate=0.0)
    assert m2.head.out_features == 10
    assert all(isinstance(b.drop_path, torch.nn.Identity) for lv in m2.levels for b in lv.blocks)


@pytest.mark.parametrize("name", VARIANTS)
def test_random_state_dict_loads_strictly(name):
    table = expected_table(PUBLISHED[name])
    m, sd = loaded(name, table, seed_of("load", name))
    got = m.state_dict()
    assert set(got) == set(sd)
    for k, v in sd.items():
        assert got[k].device.type == "cpu" and torch.equal(got[k], v), k
    # Strictness does bite: a missing key, an unexpected key, a wrong shape.
    with torch.device("meta"):
        m2 = build(name)
    missing = dict(sd)
    del missing["levels.2.blocks.1.attn.rpb"]
    with pytest.raises(RuntimeError, match="Missing key"):
        m2.load_state_dict(missing, strict=True, assign=True)
    extra = dict(sd, **{"levels.3.downsample.norm.weight": torch.ones(1)})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        m2.load_state_dict(extra, strict=True, assign=True)
    bad = dict(sd, **{"levels.0.blocks.0.attn.rpb": torch.zeros(PUBLISHED[name]["heads"][0], 7, 7)})
    with pytest.raises(RuntimeError, match="size mismatch"):
        m2.load_state_dict(bad, strict=True)


# ---- the float64 plain-PyTorch reference ---------------------------------------------------------

_NEIGHBORS = {}


def neighborhood(X, Y, K, d):
    """(keys [N, K*K], rpb row index [N, K*K], rpb column index [N, K*K]) for an X x Y grid,
    kernel K, dilation d: each query's keys are the True entries of its row of the explicit
    [N, N] membership mask of helpers.full_mask (in ascending order; every row has K*K of them);
    a (query, key) pair's bias index is the key's offset from the query in units of the dilation,
    plus K - 1."""
    key = (X, Y, K, d)
    if key not in _NEIGHBORS:
        mask = torch.from_numpy(full_mask((X, Y), (K, K), (1, 1), (d, d), (False, False)))
        N = X * Y
        assert mask.sum(dim=1).eq(K * K).all()
        keys = mask.nonzero()[:, 1].reshape(N, K * K)   # row-major: grouped by query
        q = torch.arange(N)[:, None]
        dx = keys // Y - q // Y
        dy = keys % Y - q % Y
        assert bool(((dx % d) == 0).all() and ((dy % d) == 0).all())
        ix, iy = dx // d + K - 1, dy // d + K - 1
        assert bool(((ix >= 0) & (ix < 2 * K - 1) & (iy >= 0) & (iy < 2 * K - 1)).all())
        _NEIGHBORS[key] = (keys, ix, iy)
    return _NEIGHBORS[key]


def ref_attention(x, p, heads, K, d, transpose_rpb=False):
    """Softmax attention of each query over exactly its neighborhood's keys (the mask's), logits
    (q k) / sqrt(head_dim) + rpb, in float64."""
    B, X, Y, C = x.shape
    hd = C // heads
    N = X * Y
    keys, ix, iy = neighborhood(X, Y, K, d)
    qkv = F.linear(x.reshape(B, N, C), p["qkv.weight"], p["qkv.bias"]).reshape(B, N, 3, heads, hd)
    q, k, v = qkv.unbind(2)                                   # [B, N, heads, hd]
    kn, vn = k[:, keys], v[:, keys]                           # [B, N, K*K, heads, hd]
    logits = torch.einsum("bnhd,bnwhd->bnhw", q * hd ** -0.5, kn)
    rpb = p["rpb"].transpose(1, 2) if transpose_rpb else p["rpb"]
    logits = logits + rpb[:, ix, iy].permute(1, 0, 2)[None]   # [1, N, heads, K*K]
    out = torch.einsum("bnhw,bnwhd->bnhd", logits.softmax(-1), vn)
    return F.linear(out.reshape(B, N, C), p["proj.weight"], p["proj.bias"]).reshape(B, X, Y, C)


def ref_forward(sd, cfg, img, dilations=None, transpose_rpb=False, layer_scale=True):
    """The network composed from torch.nn.functional in float64, from the state dict alone."""
    p = {k: v.double() for k, v in sd.items()}

    def ln(x, name):
        return F.layer_norm(x, x.shape[-1:], p[name + ".weight"], p[name + ".bias"], eps=1e-5)

    x = img.double()
    x = F.conv2d(x, p["patch_embed.proj.0.weight"], p["patch_embed.proj.0.bias"], stride=2,
                 padding=1)
    x = F.conv2d(x, p["patch_embed.proj.1.weight"], p["patch_embed.proj.1.bias"], stride=2,
                 padding=1)
    x = ln(x.permute(0, 2, 3, 1), "patch_embed.norm")
    dil = cfg["dil"] if dilations is None else dilations
    for i, depth in enumerate(cfg["depths"]):
        for j in range(depth):
            pre = f"levels.{i}.blocks.{j}."
            sub = {k[len(pre + "attn."):]: v for k, v in p.items() if k.startswith(pre + "attn.")}
            a = ref_attention(ln(x, pre + "norm1"), sub, cfg["heads"][i], cfg["kernel"],
                              1 if dil is None else dil[i][j], transpose_rpb)
            if cfg["ls"] is not None and layer_scale:
                a = p[pre + "gamma1"] * a
            x = x + a
            h = ln(x, pre + "norm2")
            h = F.linear(F.gelu(F.linear(h, p[pre + "mlp.fc1.weight"], p[pre + "mlp.fc1.bias"])),
                         p[pre + "mlp.fc2.weight"], p[pre + "mlp.fc2.bias"])
            if cfg["ls"] is not None and layer_scale:
                h = p[pre + "gamma2"] * h
            x = x + h
        if i < len(cfg["depths"]) - 1:
            pre = f"levels.{i}.downsample."
            x = F.conv2d(x.permute(0, 3, 1, 2), p[pre + "reduction.weight"], stride=2, padding=1)
            x = ln(x.permute(0, 2, 3, 1), pre + "norm")
    x = ln(x, "norm").mean(dim=(1, 2))
    return F.linear(x, p["head.weight"], p["head.bias"])


def rel_err(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


TOL = 1e-5  # float32 through up to 30 residual layers vs float64, relative to the largest logit
# (measured: ~3e-7)


def check_forward(m, sd, cfg, size, seed, batch=1):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(batch, 3, size, size, generator=g)
    with torch.no_grad():
        out = m(img)
    ref = ref_forward(sd, cfg, img)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    err = rel_err(out, ref)
    assert err < TOL, err
    # The reference discriminates: each of these changes moves it far beyond the tolerance.
    assert rel_err(ref_forward(sd, cfg, img, transpose_rpb=True), ref) > 100 * TOL
    if cfg["dil"] is not None:
        plain = [[1] * len(row) for row in cfg["dil"]]
        assert rel_err(ref_forward(sd, cfg, img, dilations=plain), ref) > 100 * TOL
    if cfg["ls"] is not None:
        assert rel_err(ref_forward(sd, cfg, img, layer_scale=False), ref) > 100 * TOL
    return err


FAST = ["nat_mini", "dinat_mini"]


@pytest.mark.parametrize("name", FAST + [pytest.param(n, marks=SLOW)
                                         for n in VARIANTS if n not in FAST])
def test_forward_224_matches_reference(name):
    cfg = PUBLISHED[name]
    m, sd = loaded(name, expected_table(cfg), seed_of("forward", name))
    check_forward(m, sd, cfg, 224, seed_of("img", name))


# Reduced configurations through the same classes, at 96x96 (24, 12, 6, 3 tokens per side): layer
# scale, dilations (window 3 x dilation fits each level), odd channel splits, batch 2.
REDUCED = {
    "nat_ls": dict(depths=[1, 2, 2, 1], dim=24, heads=[1, 2, 3, 6], mlp=2, ls=1e-5, dil=None,
                   kernel=3),
    "dinat_ls": dict(depths=[2, 2, 3, 1], dim=16, heads=[2, 2, 4, 4], mlp=3, ls=0.5,
                     dil=[[1, 8], [4, 1], [1, 2, 2], [1]], kernel=3),
    "dinat": dict(depths=[2, 1, 2, 2], dim=16, heads=[1, 2, 4, 8], mlp=1.5, ls=None,
                  dil=[[3, 1], [2], [1, 2], [1, 1]], kernel=5),
}


def _reduced_kwargs(cfg, num_classes):
    return dict(embed_dim=cfg["dim"], depths=cfg["depths"], num_heads=cfg["heads"],
                mlp_ratio=cfg["mlp"], layer_scale=cfg["ls"], dilations=cfg["dil"],
                kernel_size=cfg["kernel"], num_classes=num_classes, drop_path_rate=0.1)


@pytest.mark.parametrize("name", list(REDUCED))
def test_forward_reduced_matches_reference(name):
    cfg = REDUCED[name]
    size = 96 if cfg["kernel"] == 3 else 160   # kernel 5 needs 5 tokens at the last level
    table = expected_table(cfg, num_classes=10)
    cls = models.DiNAT if cfg["dil"] else models.NAT
    m, sd = loaded(cls, table, seed_of("reduced", name), **_reduced_kwargs(cfg, 10))
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == table
    check_forward(m, sd, cfg, size, seed_of("img", name), batch=2)


def test_train_mode_stochastic_depth_and_gradients():
    """In training, DropPath drops whole samples' branches (seeded, reproducible) and scales the
    kept ones; every parameter, rpb included, gets a finite gradient."""
    cfg = REDUCED["nat_ls"]
    torch.manual_seed(0)
    m = models.NAT(**dict(_reduced_kwargs(cfg, 5), drop_path_rate=0.5)).train()
    img = torch.randn(4, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(7)
    a = m(img)
    torch.manual_seed(7)
    b = m(img)
    assert torch.equal(a, b)
    m.eval()
    with torch.no_grad():
        e = m(img)
    assert not torch.allclose(a, e)  # drop path changed the training forward
    m.train()
    F.cross_entropy(m(img), torch.tensor([0, 1, 2, 3])).backward()
    for k, prm in m.named_parameters():
        assert prm.grad is not None and torch.isfinite(prm.grad).all(), k
    assert float(m.levels[0].blocks[0].attn.rpb.grad.abs().sum()) > 0

    dp = models.DropPath(0.25).train()
    x = torch.randn(4000, 3, generator=torch.Generator().manual_seed(2)) + 3.0
    torch.manual_seed(3)
    y = dp(x)
    kept = (y != 0).all(dim=1)
    assert torch.equal((y == 0).any(dim=1), ~kept)  # whole samples
    assert torch.allclose(y[kept], x[kept] / 0.75)
    assert 0.70 < float(kept.double().mean()) < 0.80
    assert torch.equal(dp.eval()(x), x)


def test_too_small_input_is_an_error():
    m = models.NAT(embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], mlp_ratio=1,
                   kernel_size=3, num_classes=2).eval()
    with torch.no_grad():
        m(torch.randn(1, 3, 96, 96))   # 3x3 tokens at the last level: fits
        with pytest.raises(ValueError, match="exceeds input length 2"):
            m(torch.randn(1, 3, 64, 64))   # 2x2 < kernel 3


def test_lazy_attribute_and_no_head():
    assert fna.models is models
    with torch.device("meta"):
        m = models.nat_mini(num_classes=0)
    assert isinstance(m.head, torch.nn.Identity)
    assert not any(k.startswith("head.") for k in m.state_dict())


# ---- the example ----------------------------------------------------------------------------------

def test_train_example_smoke_cpu():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    res = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "train_nat.py"), "--device", "cpu",
         "--model", "nat_toy", "--img-size", "96", "--kernel-size", "3", "--batch-size", "4",
         "--steps", "2", "--warmup", "1"],
        capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert sum(line.startswith("step ") for line in lines) == 2, res.stdout
    assert any("images/s" in line for line in lines), res.stdout
