"""fna.distributed (context parallelism over axis 0): the halo / slab arithmetic against the
window definition (helpers.axis_window, which shares no code with the library), and, in 2 and 3
gloo processes on the CPU, forward, LSE and gradients against fna.na*d on the whole tensors, and
the argument errors."""

import datetime
import faulthandler
import gc
import os
import random

import pytest

from helpers import axis_window, seed_of

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import fna  # noqa: E402
import fna.distributed as fd  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)


# ---- the slab arithmetic, without processes ------------------------------------------------------

def window_rows(L, K, d, s, causal, x):
    """Global rows of the keys of query x on an axis of length L (the definition)."""
    g, start, end = axis_window(x, L, K, d, s, causal)
    return [j * d + g for j in range(start, end)]


def slab_mismatches(ax, q0, q1, a, b):
    """Queries of [q0, q1) whose window computed on the slab [a, b) (as its own grid) differs from
    their global window; an invalid slab (too short for the kernel) mismatches every query."""
    L, K, d, s, c = ax
    if b - a < K * d:
        return list(range(q0, q1))
    return [x for x in range(q0, q1)
            if [a + r for r in window_rows(b - a, K, d, s, c, x - a)]
            != window_rows(L, K, d, s, c, x)]


def random_axes(n, seed):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        K, d = rng.randint(1, 9), rng.choice([1, 1, 2, 3])
        L = rng.randint(K * d, K * d + 30)
        s = rng.randint(1, K)
        out.append(fd.Axis(L, K, d, s, rng.random() < 0.4))
    return out


def random_sizes(rng, L):
    n = rng.randint(1, min(L, 5))
    cuts = sorted(rng.sample(range(1, L), n - 1)) if n > 1 else []
    return [b - a for a, b in zip([0] + cuts, cuts + [L])]


@pytest.mark.parametrize("overlap", [False, True, "always"])
def test_plan_is_exact(overlap):
    """Every segment of every rank's plan computes its queries exactly on its slab, the segments
    tile the rank's rows, slabs start on a multiple of stride * dilation, interior slabs lie in
    the rank's own rows, and the exchange delivers exactly the halo rows."""
    rng = random.Random(seed_of("cp-plan", overlap))
    interiors = borders = 0
    for ax in random_axes(300, seed_of("cp-axes", overlap)):
        sizes = random_sizes(rng, ax.length)
        plans = fd.plan(ax, sizes, overlap=overlap)
        got = {t: set() for t in range(len(sizes))}
        for sender, receiver, r0, r1 in fd.transfers(plans):
            assert plans[sender].start <= r0 < r1 <= plans[sender].end
            got[receiver] |= set(range(r0, r1))
        for t, pl in enumerate(plans):
            assert got[t] == set(range(pl.ext_start, pl.start)) | set(range(pl.end, pl.ext_end))
            assert [(sg.q0, sg.q1) for sg in pl.segments][0][0] == pl.start
            assert all(x.q1 == y.q0 for x, y in zip(pl.segments, pl.segments[1:]))
            assert pl.segments[-1].q1 == pl.end
            for sg in pl.segments:
                assert sg.a % (ax.stride * ax.dilation) == 0, (ax, sizes, sg)
                assert pl.ext_start <= sg.a and sg.b <= pl.ext_end
                assert slab_mismatches(ax, sg.q0, sg.q1, sg.a, sg.b) == [], (ax, sizes, sg)
                if sg.interior:
                    assert pl.start <= sg.a and sg.b <= pl.end
                interiors += sg.interior
                borders += not sg.interior
        if not overlap:
            assert all(len(pl.segments) == 1 for pl in plans)
    if overlap == "always":
        assert interiors > 50 and borders > 50  # both kinds exercised


def test_too_small_halo_is_wrong():
    """The slabs are minimal: one stride-dilation unit less on the left, or one row less on the
    right (where that row is a key row), and some query's window changes."""
    checked = 0
    for ax in random_axes(400, seed_of("cp-small")):
        L, K, d, s, c = ax
        for x0 in range(0, L, 3):
            x1 = min(L, x0 + 1 + (x0 % 5))
            a, b = fd.slab_rows(ax, x0, x1)
            lo, hi = fd._need(ax, x0, x1)
            unit = s * d
            if a == lo - lo % unit and a > 0:  # not widened for the length K * d
                assert slab_mismatches(ax, x0, x1, a + unit, b), (ax, x0, x1, a, b)
                checked += 1
            if b == hi and b < L and (not c or s == 1):  # the last row is a key row
                assert slab_mismatches(ax, x0, x1, a, b - 1), (ax, x0, x1, a, b)
                checked += 1
    assert checked > 500
    # causal with stride: the slab must hold the stride group's leader (the last row of the
    # group), past the last key; without it the window moves.
    ax = fd.Axis(20, 4, 1, 4, True)
    a, b = fd.slab_rows(ax, 8, 10)  # queries 8, 9 of the stride group 8..11
    assert (a, b) == (8, 12)
    assert slab_mismatches(ax, 8, 10, 8, 11) and not slab_mismatches(ax, 8, 10, 8, 12)
    # stride alignment: a slab starting inside a stride group computes the wrong groups
    ax = fd.Axis(20, 3, 1, 3, False)
    a, b = fd.slab_rows(ax, 9, 12)
    assert a % 3 == 0 and not slab_mismatches(ax, 9, 12, a, b)
    assert slab_mismatches(ax, 9, 12, a + 1, b) or slab_mismatches(ax, 9, 12, a - 1, b)


def test_too_small_halo_is_wrong_numerically():
    """fna itself on a slab one row short of the halo differs from the global result."""
    g = torch.Generator().manual_seed(seed_of("cp-numeric"))
    q, k, v = (torch.randn(1, 30, 2, 8, generator=g) for _ in range(3))
    ax = fd.Axis(30, 7, 2, 1, False)
    ref = fna.na1d(q, k, v, 7, dilation=2)
    a, b = fd.slab_rows(ax, 12, 18)
    ok = fna.na1d(q[:, a:b], k[:, a:b], v[:, a:b], 7, dilation=2)[:, 12 - a:18 - a]
    torch.testing.assert_close(ok, ref[:, 12:18], rtol=1e-6, atol=1e-6)
    for a2, b2 in ((a + 2, b), (a, b - 1)):
        bad = fna.na1d(q[:, a2:b2], k[:, a2:b2], v[:, a2:b2], 7, dilation=2)[:, 12 - a2:18 - a2]
        assert (bad - ref[:, 12:18]).abs().max() > 1e-3


def test_overlap_plan_has_interior():
    """A wide shard computes its interior on its own rows: the overlap path runs; overlap=True
    splits only where the extra computed rows are few."""
    plans = fd.plan(fd.Axis(64, 7, 1, 1, False), [20, 24, 20], overlap="always")
    assert [len(p.segments) for p in plans] == [2, 3, 2]
    assert [sg.interior for sg in plans[1].segments] == [False, True, False]
    assert plans[1].segments[1].q0 == 20 + 3 and plans[1].segments[1].q1 == 44 - 3
    causal = fd.plan(fd.Axis(64, 7, 1, 1, True), [20, 24, 20], overlap="always")
    assert [(p.ext_start, p.ext_end) for p in causal] == [(0, 20), (14, 44), (38, 64)]
    # the split adds ~4 reach of rows: too much on these shards, cheap on wide ones
    assert all(len(p.segments) == 1 for p in fd.plan(fd.Axis(64, 7, 1, 1, False), [20, 24, 20]))
    wide = fd.plan(fd.Axis(600, 3, 1, 1, False), [300, 300])
    assert [len(p.segments) for p in wide] == [2, 2]
    extra = sum(sg.b - sg.a for sg in wide[0].segments) / (wide[0].ext_end - wide[0].ext_start)
    assert 1 < extra <= 1 + fd.OVERLAP_MAX_EXTRA
    with pytest.raises(ValueError, match="overlap='sometimes' must be True"):
        fd.plan(fd.Axis(64, 7, 1, 1, False), [64], overlap="sometimes")


def test_not_initialized():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    q = torch.randn(1, 8, 2, 4)
    with pytest.raises(RuntimeError, match="not initialized"):
        fd.na1d(q, q, q, 3)


def test_dry_run_bench(capsys):
    """bench/cp_bench.py imports and plans on the CPU."""
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "cp_bench.py")
    spec = importlib.util.spec_from_file_location("cp_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--dry-run", "--gpus", "1,2,4"]) == 0
    text = capsys.readouterr().out
    assert "halo" in text and "all-gather" in text and "ulysses" in text.lower()
    rows = mod.plan_rows(mod.parse_args(["--dry-run"]), 4)
    # 30 frames over 4 GPUs with an 18-frame kernel: every rank receives more than half the
    # frames but less than an all-gather of K and V.
    assert all(0 < r["halo_bytes"] < r["allgather_bytes"] for r in rows)


# ---- in processes --------------------------------------------------------------------------------

NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}
DNA = {1: fd.na1d, 2: fd.na2d, 3: fd.na3d}

# (spatial shape, heads, heads_kv, D, D_v, shard sizes for 2 / 3 ranks, kwargs, n_additional)
CASES = [
    ((23,), 2, 2, 8, 8, ([9, 14], [5, 1, 17]), dict(kernel_size=7), 0),
    ((23,), 4, 2, 8, 6, ([3, 20], [2, 1, 20]), dict(kernel_size=6, dilation=2), 3),
    ((26,), 2, 1, 8, 8, ([13, 13], [4, 15, 7]), dict(kernel_size=8, stride=3, dilation=2), 0),
    ((21,), 2, 2, 4, 4, ([1, 20], [9, 1, 11]), dict(kernel_size=5, stride=2, is_causal=True), 2),
    ((12, 5), 2, 2, 8, 8, ([7, 5], [4, 4, 4]),
     dict(kernel_size=(4, 3), stride=(2, 1), is_causal=(True, False)), 0),
    ((13, 6), 4, 1, 8, 4, ([2, 11], [6, 2, 5]),
     dict(kernel_size=(5, 3), dilation=(2, 1), is_causal=(False, True)), 2),
    ((14, 6), 2, 2, 8, 8, ([10, 4], [3, 8, 3]),
     dict(kernel_size=(4, 4), stride=(4, 2), dilation=(1, 1)), 0),
    ((9, 4, 5), 2, 2, 8, 8, ([4, 5], [3, 3, 3]),
     dict(kernel_size=(3, 3, 2), is_causal=(True, False, True)), 1),
]


def _tensors(seed, shape, H, Hkv, D, Dv, n_add, dtype=torch.float32, batch=2):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    B = batch
    q, k, v = r(B, *shape, H, D), r(B, *shape, Hkv, D), r(B, *shape, Hkv, Dv)
    ak = r(B, n_add, Hkv, D) if n_add else None
    av = r(B, n_add, Hkv, Dv) if n_add else None
    return q, k, v, ak, av


def _close(name, got, want, tol):
    err = (got.double() - want.double()).abs().max().item()
    bound = tol * max(1.0, want.double().abs().max().item())
    assert err <= bound, f"{name}: max error {err:.3e} > {bound:.3e}"
    assert not torch.isnan(got).any(), name


def _check_case(me, world, case, overlap, group=None, sizes=None, dtype=torch.float32,
                device=None, batch=2):
    """`batch` 1: the halos are received straight into the rows of the rank's K / V buffer (its
    rows are contiguous); 2: through buffers copied in."""
    shape, H, Hkv, D, Dv, sz, kw, n_add = case
    rank = len(shape)
    sizes = sizes or sz[world - 2]
    seed = seed_of("cp-case", shape, kw, batch)
    q, k, v, ak, av = _tensors(seed, shape, H, Hkv, D, Dv, n_add, dtype, batch)
    if device is not None:
        q, k, v, ak, av = (None if t is None else t.to(device) for t in (q, k, v, ak, av))
    full = [t.clone().requires_grad_() if t is not None else None for t in (q, k, v, ak, av)]
    out, lse = NA[rank](full[0], full[1], full[2], additional_keys=full[3],
                        additional_values=full[4], return_lse=True, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    w_out = torch.randn(out.shape, generator=g, dtype=torch.float64).to(dtype).to(out.device)
    w_lse = torch.randn(lse.shape, generator=g, dtype=torch.float64).to(lse.device)
    ((out * w_out).sum() + (lse * w_lse).sum()).backward()
    o, n = sum(sizes[:me]), sizes[me]
    loc = [t[:, o:o + n].clone().requires_grad_() for t in (q, k, v)]
    add = [t.clone().requires_grad_() if t is not None else None for t in (ak, av)]
    dout, dlse = DNA[rank](*loc, additional_keys=add[0], additional_values=add[1],
                           return_lse=True, overlap=overlap, group=group, **kw)
    ((dout * w_out[:, o:o + n]).sum() + (dlse * w_lse[:, o:o + n]).sum()).backward()
    # float32 on a GPU: the fused kernels' float32 path and atomically summed gradients differ
    # from the whole-tensor call in summation order only (a wrong window errs by O(1)).
    tol = (2e-5 if device is None else 1e-4) if dtype == torch.float32 else 2e-2
    what = f"rank {me}/{world} case {shape} {kw} sizes {sizes} overlap {overlap} batch {batch}"
    _close(f"{what}: output", dout, out[:, o:o + n], tol)
    _close(f"{what}: lse", dlse, lse[:, o:o + n], tol)
    for name, a, b in zip(("d_query", "d_key", "d_value"), loc, full):
        _close(f"{what}: {name}", a.grad, b.grad[:, o:o + n], tol)
    if ak is not None:
        _close(f"{what}: d_additional_keys", add[0].grad, full[3].grad, tol)
        _close(f"{what}: d_additional_values", add[1].grad, full[4].grad, tol)
    # without return_lse: the output alone, and a backward through it only
    plain = DNA[rank](*(t.detach() for t in loc), additional_keys=ak, additional_values=av,
                      overlap=overlap, group=group, **kw)
    assert isinstance(plain, torch.Tensor)
    _close(f"{what}: output (no lse)", plain, out[:, o:o + n], tol)


def _errors(me, world):
    q = torch.randn(1, 4, 5, 2, 4)
    # other dims differ across ranks: found by the all_gather, raised on every rank
    qq = torch.randn(1, 4, 5 + (me == 1), 2, 4)
    with pytest.raises(ValueError, match=r"query.shape\[2\] differs across the ranks of the "
                                         r"group: rank 0: 5, rank 1: 6"):
        fd.na2d(qq, qq, qq, 3)
    with pytest.raises(ValueError, match="kernel_size differs across the ranks.*rank 0: 3, "
                                         "rank 1: 5"):
        fd.na2d(q, q, q, 3 + 2 * (me == 1))
    # a shard of length 0
    qe = torch.randn(1, 0 if me == world - 1 else 4, 5, 2, 4)
    with pytest.raises(ValueError, match=f"rank {world - 1} holds a shard of length 0"):
        fd.na2d(qe, qe, qe, 3)
    # shard lengths of query / key disagree on one rank
    kk = torch.randn(1, 4 + (me == 0), 5, 2, 4)
    with pytest.raises(ValueError, match=r"on rank 0 the shard lengths of axis 0 differ: "
                                         r"query.shape\[1\]=4, key.shape\[1\]=5"):
        fd.na2d(q, kk, q, 3)
    # the kernel does not fit the global length (the shards summed)
    big = 4 * world + 1
    with pytest.raises(ValueError, match=rf"kernel_size\[0\]={big} \* dilation\[0\]=1 exceeds "
                                         rf"the input length {4 * world} of axis 0 \(the "
                                         rf"shards' lengths \[4(, 4)+\]"):
        fd.na2d(q, q, q, (big, 3))
    # a local error on one rank: every rank raises (none is left in a collective)
    bad = q if me != 1 else torch.randn(1, 4, 2, 4)
    with pytest.raises(ValueError, match="has shape|rank 1 of the group passed invalid"):
        fd.na2d(bad, bad, bad, 3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        fd.na2d(q, q, q, 3, bogus=1)
    with pytest.raises(ValueError, match="overlap=1 must be True"):
        fd.na2d(q, q, q, 3, overlap=1)
    # keyword errors on one rank only: that rank raises its own error, the others that it
    # passed invalid arguments (a hang here would time the test out)
    with pytest.raises((TypeError, ValueError),
                       match="unexpected keyword argument 'bogus'|rank 1 of the group passed"):
        fd.na2d(q, q, q, 3, **({"bogus": 1} if me == 1 else {}))
    with pytest.raises((TypeError, ValueError), match="return_lse|rank 1 of the group passed"):
        fd.na2d(q, q, q, 3, return_lse="yes" if me == 1 else False)
    # any local error on one rank, not only a TypeError / ValueError of the checks (a list as
    # additional keys): every rank raises
    ak = torch.randn(1, 2, 2, 4)
    with pytest.raises((TypeError, ValueError),
                       match="additional_keys must be a torch.Tensor|rank 1 of the group passed"):
        fd.na2d(q, q, q, 3, additional_keys=[1.0] if me == 1 else ak, additional_values=ak)
    with pytest.raises((TypeError, ValueError),
                       match="additional_keys is torch.float16|rank 1 of the group passed"):
        fd.na2d(q, q, q, 3, additional_keys=ak.half() if me == 1 else ak, additional_values=ak)
    # a query that is not a tensor on one rank: that rank still joins the all_gather
    with pytest.raises((TypeError, ValueError),
                       match="query must be a torch.Tensor|rank 1 of the group passed"):
        fd.na2d([1.0] if me == 1 else q, q, q, 3)
    # the backend and the keyword options are agreed on too (a rank that ran another kernel
    # or failed inside the call would leave the others waiting in the halo exchange)
    with pytest.raises(ValueError, match=r"backend and keyword options \(.*\) differ across the "
                                         r"ranks of the group: rank 1's differ from rank 0's"):
        fd.na2d(q, q, q, 3, backend="reference" if me == 1 else "cpu")
    with pytest.raises(ValueError, match="backend and keyword options .* differ"):
        fd.na2d(q, q, q, 3, **({"num_threads": 1} if me == 0 else {}))
    # double backward: the single-process error, on every rank, before any collective
    qg = q.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="double backward through fna.distributed.na2d"):
        torch.autograd.grad(fd.na2d(qg, qg, qg, 3).sum(), qg, create_graph=True)
    # the group is still usable after the errors
    out = fd.na2d(q, q, q, 3)
    assert out.shape == q.shape


def _worker(me, world, init):
    # A crash in a worker (an abort in a communication thread) prints every thread's Python
    # stack into the test's captured output instead of only a signal name.
    faulthandler.enable()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    fna.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=me, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    groups = []  # the subgroups, released before the teardown
    try:
        for i, case in enumerate(CASES):
            for overlap in (False, "always"):
                if overlap and i % 2 and world == 2:
                    continue
                _check_case(me, world, case, overlap)
        for case in (CASES[1], CASES[5], CASES[7]):  # batch 1: halos received in place
            for overlap in (False, "always"):
                _check_case(me, world, case, overlap, batch=1)
        if world == 3:
            # bf16, uneven shards, through a subgroup of the world (ranks 0 and 2)
            groups.append(dist.new_group([0, 2]))
            if me != 1:
                _check_case([0, 2].index(me), 2, CASES[1], "always", group=groups[-1],
                            dtype=torch.bfloat16)
        # groups of one rank: each rank alone is the whole problem
        singles = [dist.new_group([r]) for r in range(world)]
        groups += singles
        _check_case(0, 1, CASES[0], True, group=singles[me], sizes=[23])
        del singles
        # overlap=True, which splits here (wide shards, small kernel)
        _check_case(me, world, ((60, 3),) + CASES[0][1:5] + (([30, 30], [20, 25, 15]),
                                                             dict(kernel_size=3), 1), True)
        _errors(me, world)
        dist.barrier()  # no rank tears down while another still talks to it
    finally:
        # Free every object that holds a process group (autograd contexts in reference cycles
        # included) while the interpreter is fully alive: a gloo group destroyed during
        # interpreter shutdown can abort the process.
        groups.clear()
        gc.collect()
        dist.destroy_process_group()
        gc.collect()


def _spawn(world, tmp_path):
    import torch.multiprocessing as mp
    init = f"file://{tmp_path}/store"
    mp.start_processes(_worker, args=(world, init), nprocs=world, join=True,
                       start_method="spawn")


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_matches_single_process(world, tmp_path):
    _spawn(world, tmp_path)


# ---- NCCL, one process per GPU ------------------------------------------------------------------
# The same check with CUDA tensors (the default CUDA backend) over NCCL, 2 and 4 GPUs of one host;
# shards as torch.tensor_split gives them. Skipped (and reported so) without enough GPUs.
GPU_CASES = [
    ((40,), 4, 2, 32, 32, dict(kernel_size=9, dilation=2), 2),
    ((24, 20), 4, 4, 32, 16, dict(kernel_size=(5, 7), stride=(2, 1), is_causal=(True, False)), 0),
    ((12, 10, 12), 2, 1, 64, 64, dict(kernel_size=(3, 5, 5), dilation=(2, 1, 1)), 1),
    ((30, 8), 2, 2, 32, 32, dict(kernel_size=(7, 3), is_causal=(True, False)), 0),
]


def _worker_nccl(me, world, init):
    torch.cuda.set_device(me)
    dist.init_process_group("nccl", init_method=init, rank=me, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        # A query that is not a tensor on one rank: that rank joins the all_gather on the
        # group's device (NCCL takes no CPU tensor) and every rank raises; none hangs.
        q = torch.randn(1, 8, 5, 2, 32, device=f"cuda:{me}")
        with pytest.raises((TypeError, ValueError),
                           match="query must be a torch.Tensor|rank 1 of the group passed"):
            fd.na2d([1.0] if me == 1 else q, q, q, 3)
        assert fd.na2d(q, q, q, 3).shape == q.shape
        for shape, H, Hkv, D, Dv, kw, n_add in GPU_CASES:
            sizes = [len(t) for t in torch.tensor_split(torch.arange(shape[0]), world)]
            case = (shape, H, Hkv, D, Dv, None, kw, n_add)
            for dtype in (torch.bfloat16, torch.float32):
                for overlap in (False, True, "always"):
                    for batch in (1, 2):
                        _check_case(me, world, case, overlap, sizes=sizes, dtype=dtype,
                                    device=f"cuda:{me}", batch=batch)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_distributed_nccl_matches_single_gpu(world, tmp_path):
    if not torch.cuda.is_available() or torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA devices")
    if not dist.is_nccl_available():
        pytest.skip("torch.distributed has no NCCL")
    import torch.multiprocessing as mp
    mp.start_processes(_worker_nccl, args=(world, f"file://{tmp_path}/store"), nprocs=world,
                       join=True, start_method="spawn")


def test_case_sizes_consistent():
    for shape, _, _, _, _, sizes, kw, _ in CASES:
        for s in sizes:
            assert sum(s) == shape[0]
    # the cases include thin shards whose halo spans several ranks
    thin = 0
    for shape, _, _, _, _, sizes, kw, _ in CASES:
        rank = len(shape)
        sp = fna._args.spatial(rank, kw["kernel_size"], kw.get("stride", 1),
                               kw.get("dilation", 1), kw.get("is_causal", False))
        ax = fd.Axis(shape[0], sp[0][0], sp[2][0], sp[1][0], sp[3][0])
        for s in sizes:
            for sender, receiver, _, _ in fd.transfers(fd.plan(ax, s)):
                thin += abs(sender - receiver) > 1
    assert thin > 0

