"""torch is optional, and imported lazily: ``import fna`` does not import it (that takes seconds).

fna's torch side (torch itself and the ``torch.ops.fna.*`` custom ops of ``_torch_ops``) loads
the first time fna sees a torch tensor, or at ``import fna`` when torch is imported already (so
the ops are registered before a ``torch.compile`` traces a call), or when something needs torch
itself (``fna.NeighborhoodAttention2D``, a ``torch.device`` passed to ``resolve_backend``). Until
then ``torch`` and ``torch_ops`` below are None. No torch tensor can exist before torch is
imported, so ``is_torch_tensor`` never needs to import it.

Without torch installed (or hidden: ``sys.modules["torch"] = None``), the NumPy path works.
"""

import sys

torch = None      # the torch module, once load() ran and torch is installed
torch_ops = None  # fna._torch_ops (registers torch.ops.fna.*), likewise


def load():
    """Imports torch and registers fna's custom ops (once). Returns torch, or None when torch is
    not installed."""
    global torch, torch_ops
    if torch is None:
        try:
            import torch as _torch
        except ImportError:
            return None
        from . import _torch_ops
        torch_ops = _torch_ops
        torch = _torch
    return torch


def is_torch_tensor(x):
    """Whether ``x`` is a torch.Tensor, loading fna's torch side the first time one is seen.
    Never imports torch for anything else."""
    if torch is not None:
        return isinstance(x, torch.Tensor)
    t = sys.modules.get("torch")
    if t is None or not isinstance(x, getattr(t, "Tensor", ())):
        return False
    load()
    return True


def torch_if_imported():
    """torch if this process imported it already (loading fna's torch side), else None; never
    imports it (e.g. to recognise a torch.device or dtype, which cannot exist without torch)."""
    if torch is None and sys.modules.get("torch") is not None:
        load()
    return torch


if sys.modules.get("torch") is not None:
    load()
