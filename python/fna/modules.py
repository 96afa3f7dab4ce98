"""torch modules: QKV projection, neighborhood attention, output projection (NATTEN's modules)."""

import torch
from torch import nn

from . import _args
from .functional import na1d, na2d, na3d

_FUNCS = {1: na1d, 2: na2d, 3: na3d}


class _NeighborhoodAttention(nn.Module):
    rank = 0

    def __init__(self, dim, num_heads, kernel_size, stride=1, dilation=1, is_causal=False,
                 qkv_bias=True, qk_scale=None, proj_drop=0.0, backend=None):
        super().__init__()
        name = type(self).__name__
        if dim < 1 or num_heads < 1 or dim % num_heads != 0:
            raise ValueError(f"{name}: dim={dim} must be a positive multiple of "
                             f"num_heads={num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        sp = _args.spatial(self.rank, kernel_size, stride, dilation, is_causal)
        # At construction, with the messages the first forward would give.
        _args.check_spatial(name, sp)
        self.kernel_size, self.stride, self.dilation, self.is_causal = (tuple(x) for x in sp)
        self.scale = _args.resolve_scale(qk_scale, self.head_dim)
        self.backend = _args.backend_name(backend)
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
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
        out = _FUNCS[self.rank](q, k, v, self.kernel_size, stride=self.stride,
                                dilation=self.dilation, is_causal=self.is_causal,
                                scale=self.scale, backend=self.backend)
        return self.proj_drop(self.proj(out.flatten(-2)))

    def extra_repr(self):
        return (f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"dilation={self.dilation}, is_causal={self.is_causal}, scale={self.scale}")


class NeighborhoodAttention1D(_NeighborhoodAttention):
    """Input ``[B, L, dim]`` -> ``[B, L, dim]``."""
    rank = 1


class NeighborhoodAttention2D(_NeighborhoodAttention):
    """Input ``[B, X, Y, dim]`` -> ``[B, X, Y, dim]``."""
    rank = 2


class NeighborhoodAttention3D(_NeighborhoodAttention):
    """Input ``[B, X, Y, Z, dim]`` -> ``[B, X, Y, Z, dim]``."""
    rank = 3
