"""The GPU side of python -m fna.profiler (fna.profiler): the GPU-time timer (CUDA events behind a
short GPU spin, median; the method of bench/gpu_bench.py) and the runner that builds each
candidate's forward / backward call on torch tensors."""
from __future__ import annotations

import statistics
import time

# GPU spin before each timed call (also bench/gpu_bench.py's): longer than the host work
# of one call, so the start event marks when the call's first kernel can begin.
HEAD_START_MS = 3.0


def _reason(exc):
    from .profiler import _reason as reason
    return reason(exc)


def gpu_time(fn, reps=10, warmup=3, budget_s=20.0, slow_s=2.0, head_start=True):
    """(median ms, timed calls) of `fn`, GPU time: the median of `reps` calls after `warmup`
    calls; each call's start event is recorded behind a GPU spin of HEAD_START_MS (with
    `head_start`), so the call's host work overlaps the spin. A call slower than `slow_s` (the
    first warm-up) gets at most two warm-ups and two timed reps; past `budget_s` timing stops
    after 3 reps. The one timer of the profiler and of bench/gpu_bench.py."""
    import torch

    torch.cuda.synchronize()
    t = time.time()
    fn()
    torch.cuda.synchronize()
    if time.time() - t > slow_s:
        warmup, reps = min(warmup, 2), min(reps, 2)
    for _ in range(warmup - 1):
        fn()
    torch.cuda.synchronize()
    times = []
    t_end = time.time() + budget_s
    for i in range(reps):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        if head_start:
            # torch.cuda._sleep counts clock cycles: at 2 GHz (H100 / H200 boost ~1.98 GHz); a
            # lower clock only lengthens the spin.
            torch.cuda._sleep(int(2.0e9 * HEAD_START_MS * 1e-3))
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
        if time.time() > t_end and i >= min(2, reps - 1):
            break
    return statistics.median(times), len(times)


def gpu_timer(reps=10, warmup=3, budget_s=20.0, slow_s=2.0):
    """timer(fn) -> ms: :func:`gpu_time` with these settings (the profiler's timer)."""
    return lambda fn: gpu_time(fn, reps, warmup, budget_s, slow_s)[0]


class TorchRunner:
    """Makes the timed callables of a problem on a CUDA device (random inputs, allocated once):
    forward(name), backward_baseline(forward_name), backward(name, forward_name), autotuned().
    Each callable has run once (and checked that the launch ran the named configuration) when it
    is returned."""

    def __init__(self, problem):
        import torch
        import fna
        if not torch.cuda.is_available():
            raise RuntimeError("timing needs a CUDA device, but torch sees none")
        self.torch, self.fna, self.p = torch, fna, problem
        self.dev = torch.device("cuda", problem.device)
        torch.cuda.set_device(self.dev)
        dt = getattr(torch, problem.dtype)
        g = torch.Generator(device=self.dev).manual_seed(0)
        B, S, H, Hk = problem.batch, problem.shape, problem.heads, problem.heads_kv

        def rnd(*shape):
            return torch.randn(*shape, device=self.dev, dtype=dt, generator=g)

        self.q = rnd(B, *S, H, problem.dim)
        self.k = rnd(B, *S, Hk, problem.dim)
        self.v = rnd(B, *S, Hk, problem.dim_v)
        self.qg, self.kg, self.vg = (t.detach().clone().requires_grad_(True)
                                     for t in (self.q, self.k, self.v))
        self.go = rnd(B, *S, H, problem.dim_v)
        self.na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[problem.rank]
        self.kw = dict(kernel_size=problem.kernel, stride=problem.stride,
                       dilation=problem.dilation, is_causal=problem.causal,
                       backend="cuda-fused", allow_tf32=problem.allow_tf32,
                       # {} (not None): the plan's heuristic even where fna.set_default_tuning
                       # set a process-wide tuning, which a named configuration would conflict with.
                       tuning={})

    def _launched(self, key):
        return self.fna._C.last_fused_launch().get(key, "")

    def forward(self, name):
        torch = self.torch

        def fn():
            with torch.no_grad():
                return self.na(self.q, self.k, self.v, config=name, **self.kw)

        fn()
        ran = self._launched("forward")
        if ran != name:
            raise RuntimeError(f"asked for {name}, the launch ran {ran or 'nothing'}")
        return fn

    def backward_baseline(self, forward_name):
        """The forward of the backward step alone (inputs requiring grad: records the graph)."""
        def fn():
            return self.na(self.qg, self.kg, self.vg, config=forward_name, **self.kw)

        fn()
        return fn

    def backward(self, name, forward_name, own=False):
        torch = self.torch
        inputs = (self.qg, self.kg, self.vg)
        config = None if own else name  # the plan's own tiles: no backward_config

        def fn():
            out = self.na(*inputs, config=forward_name, backward_config=config, **self.kw)
            return torch.autograd.grad(out, inputs, self.go)

        fn()
        ran = self._launched("backward")
        if ran != name:
            raise RuntimeError(f"asked for {name}, the launch ran {ran or 'nothing'}")
        return fn

    def autotuned(self, backward=True):
        """The autotuner's picks: one call with tuning="auto" (its first call of a signature
        times the candidates and caches the fastest, in memory and in fna.autotune_cache_dir();
        a signature already cached is not timed again), forward and backward, then what the
        launches ran. Returns dict(forward=name or None, backward=name or None, note=why not)."""
        torch = self.torch
        inputs = (self.qg, self.kg, self.vg)
        try:
            out = self.na(*inputs, **dict(self.kw, tuning="auto"))
        except Exception as exc:  # noqa: BLE001 - no autotuner in this build: n/a
            return dict(forward=None, backward=None,
                        note=f"autotuner not available (tuning='auto': {_reason(exc)})")
        res = dict(forward=self._launched("forward") or None, backward=None, note="")
        if backward:
            try:
                torch.autograd.grad(out, inputs, self.go)
                res["backward"] = self._launched("backward") or None
            except Exception as exc:  # noqa: BLE001
                res["note"] = f"autotuned backward failed: {_reason(exc)}"
        torch.cuda.synchronize()
        return res
