"""What fna's torch ops support of torch's autograd modes, on the CPU: first-order reverse mode and
torch.func.vmap work (vmap matches a loop over the batch); double backward, forward-mode AD and
the other torch.func transforms are errors at the call that asks for them, never a silently
dropped derivative (a gradient penalty must not train on a missing term)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fna  # noqa: E402
from helpers import seed_of  # noqa: E402


def rand(*shape, seed):
    g = torch.Generator().manual_seed(seed_of("autograd-modes", seed))
    return torch.randn(*shape, generator=g)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_double_backward_is_an_error(backend):
    q, k, v = (rand(1, 9, 2, 4, seed=i).requires_grad_() for i in range(3))
    out = fna.na1d(q, k, v, 3, backend=backend)
    loss = out.square().sum()
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, (q, k, v), create_graph=True)
    # The unfused operators likewise.
    attn = fna.na1d_qk(q, k, 3, backend=backend)
    with pytest.raises(RuntimeError, match="double backward through na\\*d_qk"):
        torch.autograd.grad(attn.square().sum(), q, create_graph=True)
    w = torch.softmax(attn.detach(), -1).requires_grad_()
    o2 = fna.na1d_av(w, v, 3, backend=backend)
    with pytest.raises(RuntimeError, match="double backward through na\\*d_av"):
        torch.autograd.grad(o2.square().sum(), w, create_graph=True)
    # First order still works after the refused call.
    dq, = torch.autograd.grad(fna.na1d(q, k, v, 3, backend=backend).square().sum(), q)
    assert torch.isfinite(dq).all() and dq.abs().sum() > 0


def test_forward_mode_ad_is_an_error():
    import torch.autograd.forward_ad as fwAD
    q, k, v = (rand(1, 9, 2, 4, seed=10 + i) for i in range(3))
    with fwAD.dual_level():
        dq = fwAD.make_dual(q, torch.ones_like(q))
        with pytest.raises(RuntimeError, match="forward-mode AD"):
            fna.na1d(dq, k, v, 3)
        with pytest.raises(RuntimeError, match="forward-mode AD"):
            fna.na1d_qk(dq, k, 3)
    with pytest.raises(RuntimeError, match="torch.func.jvp is not supported"):
        torch.func.jvp(lambda x: fna.na1d(x, k, v, 3), (q,), (torch.ones_like(q),))
    with pytest.raises(RuntimeError, match="torch.func.grad is not supported"):
        torch.func.grad(lambda x: fna.na1d(x, k, v, 3).sum())(q)


@pytest.mark.filterwarnings("ignore:.*batching rule.*")
@pytest.mark.parametrize("rank", [1, 2])
def test_vmap_matches_a_loop(rank):
    shape = (3, 1) + ((10,) if rank == 1 else (6, 7)) + (2, 4)
    q, k, v = (rand(*shape, seed=20 + rank * 3 + i) for i in range(3))
    na = fna.na1d if rank == 1 else fna.na2d
    ks = 3
    got = torch.func.vmap(lambda a, b, c: na(a, b, c, ks))(q, k, v)
    want = torch.stack([na(q[i], k[i], v[i], ks) for i in range(q.shape[0])])
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    # The unfused operators too.
    got_qk = torch.func.vmap(lambda a, b: fna.na1d_qk(a, b, 3) if rank == 1 else
                             fna.na2d_qk(a, b, 3))(q, k)
    want_qk = torch.stack([(fna.na1d_qk if rank == 1 else fna.na2d_qk)(q[i], k[i], 3)
                           for i in range(q.shape[0])])
    np.testing.assert_allclose(got_qk.numpy(), want_qk.numpy(), rtol=1e-6, atol=1e-6)
