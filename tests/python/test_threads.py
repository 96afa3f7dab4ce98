"""CPU threads: fna.set_num_threads / fna.get_num_threads, the num_threads= keyword, and the
persistent thread pool behind them (results across thread counts, concurrent Python threads,
fork, interpreter exit)."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import fna
from fna import _C
from helpers import check_close, seed_of

NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}


@pytest.fixture
def default_threads():
    """Every test starts and ends at the default process-wide count."""
    fna.set_num_threads(0)
    yield
    fna.set_num_threads(0)


def available_cores():
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def problem(seed, rank=2):
    """Seeded standard-normal inputs (never all zeros), long enough for several work items."""
    rng = np.random.default_rng(seed)
    shape = {1: (61,), 2: (13, 11), 3: (6, 5, 7)}[rank]
    B, H, H_kv, D = 2, 4, 2, 8
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return dict(q=f(B, *shape, H, D), k=f(B, *shape, H_kv, D), v=f(B, *shape, H_kv, D),
                ks={1: 7, 2: (5, 3), 3: 3}[rank], d_out=f(B, *shape, H, D))


def forward(p, **kw):
    rank = p["q"].ndim - 3
    return NA[rank](p["q"], p["k"], p["v"], p["ks"], backend="cpu", return_lse=True, **kw)


def backward(p, out, lse, **kw):
    return fna.na_backward(p["d_out"], p["q"], p["k"], p["v"], out, lse, p["ks"], backend="cpu",
                           **kw)


# ---- the process-wide count ------------------------------------------------------------------

def test_set_get_round_trip(default_threads):
    assert fna.get_num_threads() == min(available_cores(), _C.max_threads)
    for n in (1, 3, 7, 1, _C.max_threads):
        fna.set_num_threads(n)
        assert fna.get_num_threads() == n
    fna.set_num_threads(0)
    assert fna.get_num_threads() == min(available_cores(), _C.max_threads)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_default_follows_affinity(default_threads):
    """The default is the cores the process may run on, not the machine's."""
    old = os.sched_getaffinity(0)
    if len(old) < 2:
        pytest.skip("one CPU available: nothing to restrict")
    try:
        os.sched_setaffinity(0, {min(old)})
        restricted = fna.get_num_threads()
    finally:
        os.sched_setaffinity(0, old)
    assert restricted == 1
    assert fna.get_num_threads() == len(old)


def test_set_num_threads_errors(default_threads):
    fna.set_num_threads(2)
    for bad in (-1, -100, _C.max_threads + 1, 2 ** 40, 2 ** 70):
        with pytest.raises(ValueError, match=rf"num_threads={bad} must be in \[0, 1024\]"):
            fna.set_num_threads(bad)
    for bad in (1.5, "2", True, None):
        with pytest.raises(TypeError, match="num_threads=.* must be an int"):
            fna.set_num_threads(bad)
    # The extension's own check (a caller of fna._C directly).
    for bad in (-1, _C.max_threads + 1, 2 ** 40):
        with pytest.raises(ValueError, match=rf"num_threads={bad} must be in \[0, 1024\]"):
            _C.set_num_threads(bad)
    assert fna.get_num_threads() == 2, "a rejected value changes nothing"


def test_num_threads_keyword_errors():
    p = problem(seed_of("kw-errors"), 1)
    for bad in (-1, _C.max_threads + 1, 2 ** 70):
        with pytest.raises(ValueError, match=rf"num_threads={bad} must be in \[0, 1024\]"):
            forward(p, num_threads=bad)
        with pytest.raises(ValueError, match=rf"num_threads={bad} must be in \[0, 1024\]"):
            backward(p, p["q"], np.zeros(p["q"].shape[:-1], np.float32), num_threads=bad)
    for bad in (2.0, "3", True):
        with pytest.raises(TypeError, match="num_threads=.* must be an int or None"):
            forward(p, num_threads=bad)
    out = np.empty_like(p["q"])
    sp = dict(kernel_size=[7], stride=[1], dilation=[1], is_causal=[False], backend="cpu")
    for bad in (-3, _C.max_threads + 1, 2 ** 40):
        with pytest.raises(ValueError, match=rf"num_threads={bad} must be in \[0, 1024\]"):
            _C.forward(p["q"], p["k"], p["v"], out, num_threads=bad, **sp)


# ---- results across thread counts ------------------------------------------------------------

@pytest.mark.parametrize("rank", [1, 2, 3])
def test_results_agree_across_thread_counts(rank, default_threads):
    """The forward has the same bits on 1 .. 4 threads (each output row is one worker's), by
    keyword and by the process-wide count; the deterministic backward repeats its bits for one
    count and agrees across counts to float32 rounding."""
    p = problem(seed_of("threads-agree", rank), rank)
    out1, lse1 = forward(p, num_threads=1)
    assert np.abs(out1).max() > 0
    for n in (2, 3, 4):
        out, lse = forward(p, num_threads=n)
        assert np.array_equal(out, out1) and np.array_equal(lse, lse1), f"num_threads={n}"
        fna.set_num_threads(n)
        out, lse = forward(p)
        assert np.array_equal(out, out1), f"set_num_threads({n})"
        fna.set_num_threads(0)
    g1 = backward(p, out1, lse1, num_threads=1, deterministic=True)
    for n in (2, 3):
        g = backward(p, out1, lse1, num_threads=n, deterministic=True)
        for _ in range(2):
            again = backward(p, out1, lse1, num_threads=n, deterministic=True)
            assert all(np.array_equal(a, b) for a, b in zip(g, again)), f"num_threads={n} repeat"
        fna.set_num_threads(n)
        by_default = backward(p, out1, lse1, deterministic=True)
        fna.set_num_threads(0)
        assert all(np.array_equal(a, b) for a, b in zip(g, by_default)), f"set_num_threads({n})"
        for a, b, name in zip(g, g1, ("d_query", "d_key", "d_value")):
            check_close(a, b, what=f"{name} on {n} threads vs 1")


def test_torch_num_threads_reaches_the_backward():
    """num_threads= travels with the autograd graph: torch's deterministic gradients have the bits
    of fna.na_backward at the same count."""
    torch = pytest.importorskip("torch")
    p = problem(seed_of("torch-threads"), 2)
    q, k, v = (torch.from_numpy(p[n]).requires_grad_() for n in ("q", "k", "v"))
    for n in (1, 3):
        for t in (q, k, v):
            t.grad = None
        out = fna.na2d(q, k, v, p["ks"], backend="cpu", deterministic=True, num_threads=n)
        out.backward(torch.from_numpy(p["d_out"]))
        o_np, lse_np = forward(p, num_threads=n)
        assert np.array_equal(out.detach().numpy(), o_np)
        want = backward(p, o_np, lse_np, num_threads=n, deterministic=True)
        for t, w, name in zip((q, k, v), want, ("q", "k", "v")):
            assert np.array_equal(t.grad.numpy(), w), f"grad of {name} on {n} threads"


def test_concurrent_python_threads():
    """Calls from several Python threads at once (the GIL is released inside): each result has
    the bits of the same call made alone."""
    problems = [problem(seed_of("concurrent", i), 1 + i % 3) for i in range(4)]
    want = [forward(p, num_threads=2)[0] for p in problems]
    errors = []

    def run(i):
        try:
            for rep in range(20):
                out, _ = forward(problems[i], num_threads=2)
                if not np.array_equal(out, want[i]):
                    errors.append(f"problem {i} rep {rep}: other bits")
                    return
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"problem {i}: {e!r}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a call did not return (deadlock?)"
    assert not errors, errors


# ---- fork and exit ---------------------------------------------------------------------------

def _run(code, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, env=env, timeout=timeout)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout + res.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_computes():
    """A child forked after the parent used the pool computes with a pool of its own (the
    parent's workers do not exist there: a stale pool would hang, SIGALRM ends the child)."""
    _run("""
        import os, signal
        import numpy as np
        import fna
        rng = np.random.default_rng(7)
        q = rng.standard_normal((2, 40, 4, 8)).astype(np.float32)
        want = fna.na1d(q, q, q, 5, num_threads=2)
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)
            ok = all(np.array_equal(fna.na1d(q, q, q, 5, num_threads=n), want) for n in (2, 3, 2))
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert np.array_equal(fna.na1d(q, q, q, 5, num_threads=2), want)
        print("ok")
        """)


def test_interpreter_exits_after_threaded_use():
    """At exit the pool's workers are joined (a static destructor) without hanging, after calls
    from several Python threads and at several thread counts. (A daemon thread still inside an
    extension call when the interpreter finalizes is another matter: CPython ends it when it takes
    the GIL back, through nanobind's GIL guard, with or without the pool.)"""
    _run("""
        import threading
        import numpy as np
        import fna
        q = np.random.default_rng(8).standard_normal((2, 64, 4, 8)).astype(np.float32)
        def loop(n):
            for _ in range(50):
                fna.na1d(q, q, q, 5, num_threads=n)
        threads = [threading.Thread(target=loop, args=(n,)) for n in (2, 3, 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fna.set_num_threads(3)
        fna.na1d(q, q, q, 5)
        print("ok")
        """, timeout=60)
