"""NAT and DiNAT image-classification backbones built on fna's ``NeighborhoodAttention2D``.

    import fna.models
    model = fna.models.nat_mini()                      # or fna.models.dinat_tiny(num_classes=10)
    model.load_state_dict(torch.load("nat_mini.pth"), strict=True)
    logits = model(images)                             # images: [B, 3, 224, 224]

Matched release: the ImageNet-1K classification models of SHI-Labs' "Neighborhood Attention
Transformer" (NAT, CVPR 2023) and "Dilated Neighborhood Attention Transformer" (DiNAT)
repository -- the NAT-Mini / Tiny / Small / Base and DiNAT-Mini / Tiny / Small / Base configs
(depths, embedding dims, heads, MLP ratios, layer scale, kernel 7, per-layer dilations) and the
module tree of that release's ``classification/nat.py`` / ``dinat.py`` (NATTEN 0.17-style
attention with ``rel_pos_bias=True``), so their published ``.pth`` state dicts (plain state dicts)
load with ``strict=True``. Keys, for example::

    patch_embed.proj.{0,1}.{weight,bias}   patch_embed.norm.{weight,bias}
    levels.{i}.blocks.{j}.norm1 / attn.qkv / attn.rpb / attn.proj / norm2 / mlp.fc1 / mlp.fc2
    levels.{i}.blocks.{j}.gamma1 / gamma2  (layer-scale configs: NAT-Small, NAT-Base, DiNAT-Base)
    levels.{i}.downsample.reduction.weight / downsample.norm   (levels 0..2)
    norm.{weight,bias}   head.{weight,bias}

The architecture: a convolutional tokenizer (two 3x3 stride-2 convolutions, then LayerNorm:
stride 4), four levels of pre-norm transformer layers (neighborhood attention with a relative
positional bias, then a GELU MLP, each residual, optionally scaled per channel by ``gamma1`` /
``gamma2``, with stochastic depth), a 3x3 stride-2 convolution (no bias) + LayerNorm that doubles
the channels between levels, a final LayerNorm, global average pooling and a linear head. Tokens
are channels-last ``[B, X, Y, C]`` throughout, as fna's modules take them.

The relative positional bias is added by the cpu backend's kernels; on CUDA attention with ``rpb``
runs the unfused operators (``na2d_qk``, softmax, ``na2d_av``), see docs/python.md "Modules".
Spatial sizes must fit
the windows (``kernel_size * dilation`` tokens per axis at every level, as NATTEN 0.17+ requires):
224x224 inputs, the published training size, fit every config here; NAT needs at least 193x193,
DiNAT 221x221.

torch is needed (``import fna`` alone does not import it; ``fna.models`` does).
"""

from . import _compat

if _compat.load() is None:
    raise ImportError("fna.models needs torch, which is not installed")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.init import trunc_normal_  # noqa: E402

from . import _args  # noqa: E402
from .modules import NeighborhoodAttention2D, _probability  # noqa: E402

__all__ = [
    "NAT", "DiNAT", "NATLayer", "NATBlock", "ConvTokenizer", "ConvDownsampler", "Mlp", "DropPath",
    "nat_mini", "nat_tiny", "nat_small", "nat_base",
    "dinat_mini", "dinat_tiny", "dinat_small", "dinat_base", "CONFIGS",
]


class DropPath(nn.Module):
    """Stochastic depth: in training, zeroes a whole sample's residual branch with probability
    ``p`` and scales the kept ones by ``1 / (1 - p)``; the identity in eval mode or at ``p=0``."""

    def __init__(self, p=0.0):
        super().__init__()
        p = float(p)
        if not 0.0 <= p < 1.0:
            raise ValueError(f"DropPath: p={p!r} must be in [0, 1)")
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self):
        return f"p={self.p}"


class ConvTokenizer(nn.Module):
    """``[B, in_chans, H, W]`` -> ``[B, H/4, W/4, embed_dim]`` (rounded up): two 3x3 stride-2
    convolutions (``proj.0`` to ``embed_dim // 2`` channels, ``proj.1`` to ``embed_dim``), then
    ``norm`` over the channels."""

    def __init__(self, in_chans=3, embed_dim=64, norm_layer=nn.LayerNorm):
        super().__init__()
        half = embed_dim // 2
        self.proj = nn.Sequential(
            nn.Conv2d(in_chans, half, kernel_size=3, stride=2, padding=1),
            nn.Conv2d(half, embed_dim, kernel_size=3, stride=2, padding=1),
        )
        self.norm = norm_layer(embed_dim) if norm_layer is not None else None

    def forward(self, x):
        x = self.proj(x).permute(0, 2, 3, 1)
        return x if self.norm is None else self.norm(x)


class ConvDownsampler(nn.Module):
    """``[B, X, Y, dim]`` -> ``[B, X/2, Y/2, 2 dim]`` (rounded up): a 3x3 stride-2 convolution
    without bias (``reduction``), then ``norm``."""

    def __init__(self, dim, norm_layer=nn.LayerNorm):
        super().__init__()
        self.reduction = nn.Conv2d(dim, 2 * dim, kernel_size=3, stride=2, padding=1, bias=False)
        self.norm = norm_layer(2 * dim)

    def forward(self, x):
        y = self.reduction(x.permute(0, 3, 1, 2))
        return self.norm(y.permute(0, 2, 3, 1))


class Mlp(nn.Module):
    """``fc1`` -> activation -> dropout -> ``fc2`` -> dropout."""

    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU,
                 drop=0.0):
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        x = self.drop(self.act(self.fc1(x)))
        return self.drop(self.fc2(x))


class NATLayer(nn.Module):
    """One pre-norm transformer layer on ``[B, X, Y, dim]``:
    ``x + drop_path(gamma1 * attn(norm1(x)))``, then ``x + drop_path(gamma2 * mlp(norm2(x)))``
    (no ``gamma`` without ``layer_scale``). ``attn`` is fna's ``NeighborhoodAttention2D`` with a
    relative positional bias (``attn.rpb``)."""

    def __init__(self, dim, num_heads, kernel_size=7, dilation=None, mlp_ratio=4.0, qkv_bias=True,
                 qk_scale=None, drop=0.0, attn_drop=0.0, drop_path=0.0, act_layer=nn.GELU,
                 norm_layer=nn.LayerNorm, layer_scale=None, backend=None):
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.mlp_ratio = mlp_ratio
        self.norm1 = norm_layer(dim)
        self.attn = NeighborhoodAttention2D(
            dim=dim, num_heads=num_heads, kernel_size=kernel_size,
            dilation=1 if dilation is None else dilation, rel_pos_bias=True, qkv_bias=qkv_bias,
            qk_scale=qk_scale, attn_drop=attn_drop, proj_drop=drop, backend=backend)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)
        # The release's test: a number turns layer scale on (None / anything else leaves it off).
        self.layer_scale = layer_scale is not None and type(layer_scale) in (int, float)
        if self.layer_scale:
            self.gamma1 = nn.Parameter(torch.full((dim,), float(layer_scale)))
            self.gamma2 = nn.Parameter(torch.full((dim,), float(layer_scale)))

    def forward(self, x):
        a = self.attn(self.norm1(x))
        if self.layer_scale:
            a = self.gamma1 * a
        x = x + self.drop_path(a)
        m = self.mlp(self.norm2(x))
        if self.layer_scale:
            m = self.gamma2 * m
        return x + self.drop_path(m)


class NATBlock(nn.Module):
    """One level: ``depth`` NATLayers (``blocks``), then a ConvDownsampler (``downsample``, None
    at the last level). ``dilations``: one per layer, or None (all 1); ``drop_path``: a number or
    one per layer."""

    def __init__(self, dim, depth, num_heads, kernel_size, dilations=None, downsample=True,
                 mlp_ratio=4.0, qkv_bias=True, qk_scale=None, drop=0.0, attn_drop=0.0,
                 drop_path=0.0, norm_layer=nn.LayerNorm, layer_scale=None, backend=None):
        super().__init__()
        self.dim = dim
        self.depth = depth
        if dilations is not None and len(dilations) != depth:
            raise ValueError(f"NATBlock: {len(dilations)} dilations for depth={depth}")
        if isinstance(drop_path, (list, tuple)):
            if len(drop_path) != depth:
                raise ValueError(f"NATBlock: {len(drop_path)} drop_path rates for depth={depth}")
            rates = list(drop_path)
        else:
            rates = [drop_path] * depth
        self.blocks = nn.ModuleList(
            NATLayer(dim=dim, num_heads=num_heads, kernel_size=kernel_size,
                     dilation=None if dilations is None else dilations[j], mlp_ratio=mlp_ratio,
                     qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop, attn_drop=attn_drop,
                     drop_path=rates[j], norm_layer=norm_layer, layer_scale=layer_scale,
                     backend=backend)
            for j in range(depth))
        self.downsample = ConvDownsampler(dim, norm_layer=norm_layer) if downsample else None

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x if self.downsample is None else self.downsample(x)


class NAT(nn.Module):
    """Neighborhood Attention Transformer: ``[B, in_chans, H, W]`` -> ``[B, num_classes]``.

    Level ``i`` has ``embed_dim * 2**i`` channels, ``depths[i]`` layers and ``num_heads[i]``
    heads; ``dilations`` (DiNAT) is one list per level of one dilation per layer. Stochastic depth
    rises linearly from 0 to ``drop_path_rate`` over all layers. ``num_classes=0`` makes ``head``
    the identity (the model returns the pooled features). ``backend`` is passed to every attention
    module (None: fna's "auto"). ``forward_features`` returns the pooled, normalized features.
    """

    def __init__(self, embed_dim, mlp_ratio, depths, num_heads, drop_path_rate=0.2, in_chans=3,
                 kernel_size=7, dilations=None, num_classes=1000, qkv_bias=True, qk_scale=None,
                 drop_rate=0.0, attn_drop_rate=0.0, norm_layer=nn.LayerNorm, layer_scale=None,
                 backend=None):
        super().__init__()
        cls = type(self).__name__
        for name, v, lo in (("num_classes", num_classes, 0), ("in_chans", in_chans, 1)):
            if not _args._is_int(v) or v < lo:
                raise ValueError(f"{cls}: {name}={v!r} must be an int >= {lo}")
        drop_path_rate = _probability("drop_path_rate", cls, drop_path_rate)
        drop_rate = _probability("drop_rate", cls, drop_rate)
        attn_drop_rate = _probability("attn_drop_rate", cls, attn_drop_rate)
        depths, num_heads = list(depths), list(num_heads)
        if len(num_heads) != len(depths):
            raise ValueError(f"{type(self).__name__}: depths={depths} and num_heads={num_heads} "
                             "must have one entry per level")
        if dilations is not None and len(dilations) != len(depths):
            raise ValueError(f"{type(self).__name__}: dilations has {len(dilations)} levels, "
                             f"depths {len(depths)}")
        self.num_classes = num_classes
        self.num_levels = len(depths)
        self.embed_dim = embed_dim
        self.num_features = int(embed_dim * 2 ** (self.num_levels - 1))
        self.mlp_ratio = mlp_ratio
        self.depths = depths
        self.kernel_size = kernel_size

        self.patch_embed = ConvTokenizer(in_chans, embed_dim, norm_layer=norm_layer)
        self.pos_drop = nn.Dropout(drop_rate)
        total = sum(depths)
        rates = [drop_path_rate * t / (total - 1) if total > 1 else 0.0 for t in range(total)]
        self.levels = nn.ModuleList()
        first = 0
        for i, depth in enumerate(depths):
            self.levels.append(NATBlock(
                dim=int(embed_dim * 2 ** i), depth=depth, num_heads=num_heads[i],
                kernel_size=kernel_size, dilations=None if dilations is None else dilations[i],
                downsample=i < self.num_levels - 1, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                qk_scale=qk_scale, drop=drop_rate, attn_drop=attn_drop_rate,
                drop_path=rates[first:first + depth], norm_layer=norm_layer,
                layer_scale=layer_scale, backend=backend))
            first += depth
        self.norm = norm_layer(self.num_features)
        self.avgpool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def no_weight_decay_keywords(self):
        """Parameter-name substrings to exempt from weight decay (timm's convention)."""
        return {"rpb"}

    def forward_features(self, x):
        x = self.pos_drop(self.patch_embed(x))
        for level in self.levels:
            x = level(x)
        x = self.norm(x).flatten(1, 2)                     # [B, tokens, C]
        return self.avgpool(x.transpose(1, 2)).flatten(1)  # [B, C]

    def forward(self, x):
        return self.head(self.forward_features(x))


class DiNAT(NAT):
    """Dilated Neighborhood Attention Transformer: NAT with per-layer ``dilations``."""


def _dilations(depth3):
    # DiNAT's 224x224 schedule: alternate plain (1) and dilated layers in levels 0-2, with the
    # dilation that makes the 7-wide window span the level (56 / 7, 28 / 7, 14 / 7), none at
    # level 3 (7x7 tokens).
    return [[1, 8, 1], [1, 4, 1, 4], [1, 2] * (depth3 // 2), [1] * 5]


# The published configurations (the release named in the module docstring). drop_path_rate is
# the value each was trained with; every factory's keyword overrides its entry.
CONFIGS = {
    "nat_mini": dict(depths=[3, 4, 6, 5], num_heads=[2, 4, 8, 16], embed_dim=64, mlp_ratio=3,
                     drop_path_rate=0.2, kernel_size=7),
    "nat_tiny": dict(depths=[3, 4, 18, 5], num_heads=[2, 4, 8, 16], embed_dim=64, mlp_ratio=3,
                     drop_path_rate=0.2, kernel_size=7),
    "nat_small": dict(depths=[3, 4, 18, 5], num_heads=[3, 6, 12, 24], embed_dim=96, mlp_ratio=2,
                      drop_path_rate=0.3, layer_scale=1e-5, kernel_size=7),
    "nat_base": dict(depths=[3, 4, 18, 5], num_heads=[4, 8, 16, 32], embed_dim=128, mlp_ratio=2,
                     drop_path_rate=0.5, layer_scale=1e-5, kernel_size=7),
    "dinat_mini": dict(depths=[3, 4, 6, 5], num_heads=[2, 4, 8, 16], embed_dim=64, mlp_ratio=3,
                       drop_path_rate=0.2, kernel_size=7, dilations=_dilations(6)),
    "dinat_tiny": dict(depths=[3, 4, 18, 5], num_heads=[2, 4, 8, 16], embed_dim=64, mlp_ratio=3,
                       drop_path_rate=0.2, kernel_size=7, dilations=_dilations(18)),
    # DiNAT-Small has no layer scale in the release (unlike NAT-Small); DiNAT-Base has.
    "dinat_small": dict(depths=[3, 4, 18, 5], num_heads=[3, 6, 12, 24], embed_dim=96, mlp_ratio=2,
                        drop_path_rate=0.3, kernel_size=7, dilations=_dilations(18)),
    "dinat_base": dict(depths=[3, 4, 18, 5], num_heads=[4, 8, 16, 32], embed_dim=128, mlp_ratio=2,
                       drop_path_rate=0.5, layer_scale=1e-5, kernel_size=7,
                       dilations=_dilations(18)),
}


def _build(name, cls, kwargs):
    cfg = {k: (list(map(list, v)) if k == "dilations" else v) for k, v in CONFIGS[name].items()}
    cfg.update(kwargs)
    return cls(**cfg)


def nat_mini(**kwargs):
    """NAT-Mini (20M parameters at 1000 classes). Keywords: NAT's (num_classes=1000,
    drop_path_rate, backend, ...)."""
    return _build("nat_mini", NAT, kwargs)


def nat_tiny(**kwargs):
    """NAT-Tiny (28M parameters). Keywords: NAT's."""
    return _build("nat_tiny", NAT, kwargs)


def nat_small(**kwargs):
    """NAT-Small (51M parameters, layer scale). Keywords: NAT's."""
    return _build("nat_small", NAT, kwargs)


def nat_base(**kwargs):
    """NAT-Base (90M parameters, layer scale). Keywords: NAT's."""
    return _build("nat_base", NAT, kwargs)


def dinat_mini(**kwargs):
    """DiNAT-Mini (NAT-Mini with dilations). Keywords: NAT's."""
    return _build("dinat_mini", DiNAT, kwargs)


def dinat_tiny(**kwargs):
    """DiNAT-Tiny (NAT-Tiny with dilations). Keywords: NAT's."""
    return _build("dinat_tiny", DiNAT, kwargs)


def dinat_small(**kwargs):
    """DiNAT-Small (NAT-Small's shape with dilations, no layer scale). Keywords: NAT's."""
    return _build("dinat_small", DiNAT, kwargs)


def dinat_base(**kwargs):
    """DiNAT-Base (NAT-Base with dilations, layer scale). Keywords: NAT's."""
    return _build("dinat_base", DiNAT, kwargs)
