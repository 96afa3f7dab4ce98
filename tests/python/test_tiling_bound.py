"""bench/tiling_bound.py: its per-axis needed / computed sums against a brute-force count built
on the test oracle's own window (helpers.axis_window, independent of fna._window), the product
over axes against a brute-force count of a 2-D problem's pairs, and the bound against every
shape it searches."""

import importlib.util
import math
import os

import numpy as np
import pytest

from helpers import axis_window, seed_of

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "tiling_bound.py")
_spec = importlib.util.spec_from_file_location("tiling_bound", _PATH)
tb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tb)


def brute_axis(L, K, d, s, causal, qe, ke):
    needed = computed = 0
    for x in range(L):
        g, start, end = axis_window(x, L, K, d, s, causal)
        needed += end - start
    for g in range(min(d, L)):
        xs = list(range(g, L, d))
        for t in range(0, len(xs), qe):
            wins = [axis_window(x, L, K, d, s, causal) for x in xs[t:t + qe]]
            u0, u1 = min(w[1] for w in wins), max(w[2] for w in wins)
            computed += qe * ke * -(-(u1 - u0) // ke)
    return needed, computed


@pytest.mark.parametrize("case", range(40))
def test_axis_sums_match_brute_force(case):
    rng = np.random.default_rng(seed_of("tiling-bound", case))
    L = int(rng.integers(4, 60))
    d = int(rng.integers(1, 4))
    K = int(rng.integers(1, max(2, L // d + 1)))
    s = int(rng.integers(1, K + 1))
    causal = bool(rng.integers(0, 2))
    qe, ke = int(rng.choice([1, 2, 3, 4, 8])), int(rng.choice([1, 2, 4, 8]))
    assert tb.axis_sums(L, K, d, s, causal, qe, ke) == brute_axis(L, K, d, s, causal, qe, ke)


def test_fraction_of_a_2d_problem_counts_pairs():
    """Needed / computed pairs of a 2-D problem counted pair by pair: needed from the window
    box of every query, computed from every query tile's key-tile box."""
    axes = [(11, 5, 2, 1, False), (9, 3, 1, 2, True)]
    q, kv = (2, 4), (4, 2)
    needed = computed = 0
    wins = [[axis_window(x, *a) for x in range(a[0])] for a in axes]
    for x0 in range(axes[0][0]):
        for x1 in range(axes[1][0]):
            needed += (wins[0][x0][2] - wins[0][x0][1]) * (wins[1][x1][2] - wins[1][x1][1])
    per_axis = []
    for a, (L, K, d, s, c) in enumerate(axes):
        tiles = []
        for g in range(d):
            xs = list(range(g, L, d))
            for t in range(0, len(xs), q[a]):
                ws = [wins[a][x] for x in xs[t:t + q[a]]]
                u = max(w[2] for w in ws) - min(w[1] for w in ws)
                tiles.append(-(-u // kv[a]) * kv[a])
        per_axis.append(tiles)
    for k0 in per_axis[0]:
        for k1 in per_axis[1]:
            computed += q[0] * q[1] * k0 * k1
    assert tb.fraction(axes, q, kv) == pytest.approx(needed / computed, rel=1e-12)


def test_bound_is_the_best_shape_searched():
    axes = tb.problem_axes("nat-late")
    f, q, kv = tb.bound(axes)
    assert math.prod(q) in tb.Q_ROWS and math.prod(kv) in tb.KV_ROWS
    assert tb.fraction(axes, q, kv) == pytest.approx(f)
    for qe in [(8, 8), (4, 16), (16, 8)]:
        for ke in [(8, 8), (4, 16), (16, 4)]:
            assert tb.fraction(axes, qe, ke) <= f + 1e-12


def test_cli_prints_every_problem(capsys):
    assert tb.main(["--problems", "nat-late,1d-small", "--tiles", "1d-small=q128/kv64"]) == 0
    out = capsys.readouterr().out
    assert "nat-late" in out and "1d-small" in out and "q128 kv64" in out
