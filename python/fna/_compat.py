"""torch is optional, and imported lazily: ``import fna`` does not import it (that takes seconds).

fna's torch side (torch itself and the ``torch.ops.fna.*`` custom ops of ``_torch_ops``) loads
at ``import fna`` when torch is imported already, or right after the program imports torch (a
``sys.meta_path`` entry waits for that import; fna never imports torch itself), so the ops are
registered before a ``torch.compile`` traces a call: torch 2.4's dynamo does not see module
state that a traced call changes. It also loads the first time fna sees a torch tensor, or when
something needs torch itself (``fna.NeighborhoodAttention2D``, a ``torch.device`` passed to
``resolve_backend``). Until then ``torch`` and ``torch_ops`` below are None. No torch tensor can
exist before torch is imported, so ``is_torch_tensor`` never needs to import it.

Without torch installed (or hidden: ``sys.modules["torch"] = None``), the NumPy path works.
"""

import importlib.util
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


class _LoadAfterTorchImport:
    """The ``sys.meta_path`` entry that loads fna's torch side once ``import torch`` has run
    torch's package (then removes itself). It finds nothing itself: it asks the other finders for
    torch's spec and wraps that spec's loader. A failure of fna's loading never fails the user's
    ``import torch``: the lazy paths above retry, and raise, at fna's first use of torch."""

    fna_hook = True
    _busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy = False
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_load(module):
            exec_module(module)
            _remove_hook()
            try:
                load()
            except Exception:  # noqa: BLE001 (see the class docstring)
                pass

        loader.exec_module = exec_then_load
        return spec


def _remove_hook():
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "fna_hook", False)]


if sys.modules.get("torch") is not None:
    load()
elif not any(getattr(f, "fna_hook", False) for f in sys.meta_path):
    sys.meta_path.insert(0, _LoadAfterTorchImport())
