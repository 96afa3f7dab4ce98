"""torch is optional: without it, ``import fna`` works and the NumPy path is available."""

try:
    import torch
except ImportError:  # pragma: no cover - exercised by a subprocess test that hides torch
    torch = None

if torch is not None:
    # Registers the torch.ops.fna.* custom ops.
    from . import _torch_ops  # noqa: F401
