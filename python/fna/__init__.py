"""fna: neighborhood attention with NATTEN's Python API.

    import fna
    out = fna.na2d(q, k, v, kernel_size=7)          # q, k, v: [B, X, Y, H, D], torch or NumPy

torch is optional: without it the NumPy path works; with it, the functions are autograd-enabled
custom ops (``torch.ops.fna.*``) that ``torch.compile(fullgraph=True)`` traces, and the modules
``NeighborhoodAttention1D/2D/3D`` are available. See docs/python.md.
"""

from . import _C
from ._compat import torch as _torch
from .functional import (
    na1d, na2d, na3d, na1d_qk, na2d_qk, na3d_qk, na1d_av, na2d_av, na3d_av,
    na_backward, na_qk_backward, na_av_backward,
)

__version__ = _C.version()

BACKENDS = _C.backends

_MODULES = ("NeighborhoodAttention1D", "NeighborhoodAttention2D", "NeighborhoodAttention3D")


def backend_compiled(backend):
    """Is ``backend`` ("reference", "cpu", "cuda-naive", "cuda-fused") in this build?"""
    return _C.backend_compiled(backend)


def cuda_available():
    """fna was built with CUDA and a CUDA device is visible."""
    return _C.cuda_available()


def resolve_backend(backend=None, device="cpu"):
    """The backend a call with ``backend`` (None = "auto") runs on ``device`` ("cpu"/"cuda")."""
    return _C.resolve_backend("auto" if backend is None else backend, device)


def fused_configs(rank, dtype, head_dim):
    """Tile configurations of cuda-fused for (rank, dtype, head dim); empty without it.
    `dtype` is a name ("bfloat16"), a torch dtype or a NumPy dtype."""
    if not isinstance(dtype, str):
        name = str(dtype)
        if name.startswith("torch."):
            dtype = name[len("torch."):]
        else:
            import numpy as np
            dtype = np.dtype(dtype).name
    return list(_C.fused_configs(rank, dtype, head_dim))


def version():
    return _C.version()


def __getattr__(name):
    # The modules need torch; import them on first use so `import fna` works without it.
    if name in _MODULES:
        if _torch is None:
            raise ImportError(f"fna.{name} needs torch, which is not installed")
        from . import modules
        return getattr(modules, name)
    raise AttributeError(f"module 'fna' has no attribute {name!r}")


__all__ = [
    "na1d", "na2d", "na3d", "na1d_qk", "na2d_qk", "na3d_qk", "na1d_av", "na2d_av", "na3d_av",
    "na_backward", "na_qk_backward", "na_av_backward", "backend_compiled", "cuda_available",
    "resolve_backend", "fused_configs", "version", "BACKENDS", *_MODULES,
]
