"""torch modules: QKV projection, neighborhood attention, output projection (NATTEN's modules).

The constructors take the keywords of NATTEN 0.21 (``embed_dim``, ``stride``, ...), of 0.17
(``dim``, ``rel_pos_bias``, ``attn_drop``, ...) and 0.15's ``bias`` (its name for
``rel_pos_bias``); the submodules and parameters have NATTEN's names (``qkv``, ``proj``, ``rpb``,
``attn_drop``, ``proj_drop``), so NATTEN checkpoints load with ``strict=True``. See
docs/python.md "Modules".

The forward runs ``na*d`` (with ``rpb=`` where the module has a relative positional bias: fused
on the backends that add a bias themselves, reference and cpu, else the unfused composition of
fna._rpb). Dropout on the attention weights while training needs the weights, so it runs the
unfused operators (``na*d_qk``, bias, softmax, dropout, ``na*d_av``), as NATTEN's unfused path
does.
"""

import numbers

import torch
from torch import nn
from torch.nn.init import trunc_normal_

from . import _args, _rpb
from .functional import na1d, na1d_av, na1d_qk, na2d, na2d_av, na2d_qk, na3d, na3d_av, na3d_qk

_FUNCS = {1: na1d, 2: na2d, 3: na3d}
_QK = {1: na1d_qk, 2: na2d_qk, 3: na3d_qk}
_AV = {1: na1d_av, 2: na2d_av, 3: na3d_av}

# Backends that have no unfused operators (what attention dropout runs on; a bias runs on the
# CUDA operators `auto` picks there, see _rpb.unfused_backend).
_FUSED_ONLY = ("cuda-fused", *_args.NATTEN_BACKENDS)


def _probability(name, cls, p):
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{cls}: {name}={p!r} must be a probability in [0, 1]")
    return float(p)


def _flag(name, cls, v):
    if not _args._is_bool(v):
        raise TypeError(f"{cls}: {name}={v!r} must be a bool")
    return bool(v)


class _NeighborhoodAttention(nn.Module):
    rank = 0

    def __init__(self, dim=None, num_heads=None, kernel_size=None, *positional, embed_dim=None,
                 stride=1, dilation=1, is_causal=False, rel_pos_bias=False, bias=None,
                 qkv_bias=True, qk_scale=None, attn_drop=0.0, proj_drop=0.0,
                 use_experimental_ops=False, backend=None):
        super().__init__()
        name = type(self).__name__
        if positional:
            raise TypeError(
                f"{name}: {len(positional)} positional argument(s) after kernel_size "
                f"({', '.join(repr(a) for a in positional)}): NATTEN 0.17 takes dilation, "
                "is_causal, rel_pos_bias, ... there and NATTEN 0.21 stride, dilation, ...; pass "
                "them by keyword")
        if dim is not None and embed_dim is not None and dim != embed_dim:
            raise ValueError(f"{name}: dim={dim!r} and embed_dim={embed_dim!r} both give the "
                             "embedding dimension; give one")
        dim = embed_dim if dim is None else dim
        for arg, v in (("dim (or embed_dim)", dim), ("num_heads", num_heads),
                       ("kernel_size", kernel_size)):
            if v is None:
                raise TypeError(f"{name}() missing required argument: {arg}")
        if not _args._is_int(dim) or not _args._is_int(num_heads):
            raise TypeError(f"{name}: dim={dim!r} and num_heads={num_heads!r} must be ints")
        if dim < 1 or num_heads < 1 or dim % num_heads != 0:
            raise ValueError(f"{name}: dim={dim} must be a positive multiple of "
                             f"num_heads={num_heads}")
        rel_pos_bias = _flag("rel_pos_bias", name, rel_pos_bias)
        if bias is not None:  # NATTEN <= 0.15's name for rel_pos_bias
            bias = _flag("bias", name, bias)
            if rel_pos_bias and not bias:
                raise ValueError(f"{name}: rel_pos_bias=True and bias=False (NATTEN 0.15's name "
                                 "for it) contradict each other; give one")
            rel_pos_bias = bias
        qkv_bias = _flag("qkv_bias", name, qkv_bias)
        _flag("use_experimental_ops", name, use_experimental_ops)  # fna's ops are always those
        self.dim = self.embed_dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        sp = _args.spatial(self.rank, kernel_size, stride, dilation, is_causal)
        # At construction, with the messages the first forward would give.
        _args.check_spatial(name, sp)
        self.kernel_size, self.stride, self.dilation, self.is_causal = (tuple(x) for x in sp)
        # NATTEN: `qk_scale or head_dim ** -0.5`, so 0 means the default too.
        self.scale = _args.resolve_scale(qk_scale if qk_scale else None, self.head_dim)
        self.backend = backend
        _args.backend_name(backend)  # the name is checked at construction
        self.attn_drop_rate = _probability("attn_drop", name, attn_drop)
        proj_drop = _probability("proj_drop", name, proj_drop)

        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        if rel_pos_bias:
            self.rpb = nn.Parameter(torch.zeros(num_heads, *(2 * k - 1 for k in self.kernel_size)))
            trunc_normal_(self.rpb, std=0.02, mean=0.0, a=-2.0, b=2.0)
        else:
            self.register_parameter("rpb", None)
        self.attn_drop = nn.Dropout(self.attn_drop_rate)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != self.rank + 2 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{type(self).__name__}: input has shape {tuple(x.shape)}; expected "
                f"{self.rank + 2} dims [batch, {_args._AXES[self.rank]}, dim={self.dim}]"
            )
        qkv = self.qkv(x).unflatten(-1, (3, self.num_heads, self.head_dim))
        q, k, v = qkv.unbind(dim=-3)
        if self.training and self.attn_drop_rate > 0:
            out = self._unfused(q, k, v)
        else:  # (a bias: na*d(..., rpb=), fused where the backend adds it, else the composition)
            out = _FUNCS[self.rank](q, k, v, self.kernel_size, stride=self.stride,
                                    dilation=self.dilation, is_causal=self.is_causal,
                                    scale=self.scale, backend=self.backend, rpb=self.rpb)
        return self.proj_drop(self.proj(out.flatten(-2)))

    def _unfused(self, q, k, v):
        """NATTEN's unfused path: logits of the scaled queries, plus the positional bias, softmax,
        dropout on the weights, weighted sum of the values."""
        dropping = self.training and self.attn_drop_rate > 0
        if dropping and _args._backend_text(self.backend) in _FUSED_ONLY:
            raise ValueError(
                f"{type(self).__name__}: attn_drop={self.attn_drop_rate} in training mode drops "
                "attention weights, which only the unfused operators (qk / av) have and "
                f"backend={self.backend!r} does not; use backend=None, 'cuda-gemm', 'cuda-naive' "
                "or 'cpu' (or attn_drop=0, or eval mode)")
        if self.rpb is not None:  # the composition na*d(..., rpb=) runs (one shared helper)
            _rpb.check(type(self).__name__, self.rpb, self.num_heads, self.kernel_size, q)
            sp = (self.kernel_size, self.stride, self.dilation, self.is_causal)
            out, _ = _rpb.attention(q, k, v, self.rpb, sp, self.scale, None, None,
                                    _rpb.unfused_backend(self.backend),
                                    dropout=self.attn_drop if dropping else None)
            return out
        sp = dict(stride=self.stride, dilation=self.dilation, is_causal=self.is_causal,
                  backend=self.backend)
        attn = _QK[self.rank](q * self.scale, k, self.kernel_size, **sp)
        attn = self.attn_drop(attn.softmax(dim=-1))
        return _AV[self.rank](attn, v, self.kernel_size, **sp)

    def extra_repr(self):
        return (f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"dilation={self.dilation}, is_causal={self.is_causal}, scale={self.scale}, "
                f"rel_pos_bias={self.rpb is not None}, attn_drop={self.attn_drop_rate}")


class NeighborhoodAttention1D(_NeighborhoodAttention):
    """Input ``[B, L, dim]`` -> ``[B, L, dim]``. Arguments: docs/python.md "Modules"."""
    rank = 1


class NeighborhoodAttention2D(_NeighborhoodAttention):
    """Input ``[B, X, Y, dim]`` -> ``[B, X, Y, dim]``. Arguments: docs/python.md "Modules"."""
    rank = 2


class NeighborhoodAttention3D(_NeighborhoodAttention):
    """Input ``[B, X, Y, Z, dim]`` -> ``[B, X, Y, Z, dim]``. Arguments: docs/python.md
    "Modules"."""
    rank = 3
