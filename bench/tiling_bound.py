"""The tiling bound of the fused forward: for each problem, the best needed-pairs fraction that a
query / key tile shape could reach, beside the fraction of given tiles (issue 27's "bound").

The needed-pairs fraction of tiles (q, kv) is the score pairs the problem needs (each query times
its window) over the pairs the tiled kernels compute: every query tile of every dilation group
(q rows in full, also past a group's end) times the key tiles of the union of its windows, per
axis from the union's first key (the fused kernels' KvSpan). Tile counts are separable per axis,
so both totals are products over the axes of per-axis sums (as tiling.cuh's tiling_stats). Whole
query tiles are counted: the warp-specialized forward with wg_skip visits key tiles per 64-row
part of a tile, so fused_plan's needed fraction for it is higher than this one for the same
tiles (3d-video's q3x8x8 / kv2x4x8: 0.667 there, 0.648 here).

Tile shapes searched: query tiles of 64, 128 or 192 rows, key tiles of 64 or 128 rows (the sizes
the Hopper kernels are instantiated for), each axis's extent a power of two (query tiles: also
three times one), none above the axis's largest dilation group rounded up to a power of two.
Pure NumPy, no device:

    python3 bench/tiling_bound.py                      # the standard and small-window sets
    python3 bench/tiling_bound.py --tiles 2d-large=q8x16/kv8x8 --tiles 1d-long=q128/kv64
"""

import argparse
import itertools
import math
import os
import sys

import numpy as np

import importlib.util

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from problem_sets import PROBLEMS, SMALL  # noqa: E402


def _load_window():
    """fna's window arithmetic (python/fna/_window.py, pure Python) from this checkout, loaded
    by path: no built extension needed, and nothing added to sys.path (which processes spawned
    later would inherit)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "fna",
                        "_window.py")
    spec = importlib.util.spec_from_file_location("fna_window_for_tiling_bound", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_window = _load_window()

Q_ROWS = (64, 128, 192)
KV_ROWS = (64, 128)


def axis_sums(L, K, d, s, causal, qe, ke):
    """(needed, computed) on one axis: the sum over its queries of their window sizes, and the
    sum over its query tiles (every dilation group, tiles of qe) of qe times the keys of the key
    tiles (of ke) covering the union of the tile's windows."""
    w = _window.axis_windows_np(L, K, d, s, causal)
    needed = int((w.end - w.start).sum())
    computed = 0
    for g in range(min(d, L)):
        sel = w.group == g
        start, end = w.start[sel], w.end[sel]  # in local index order
        lg = len(start)
        for i0 in range(0, lg, qe):
            u0, u1 = int(start[i0:i0 + qe].min()), int(end[i0:i0 + qe].max())
            computed += qe * math.ceil((u1 - u0) / ke) * ke
    return needed, computed


def fraction(axes, q, kv):
    """Needed pairs over computed pairs for per-axis (L, K, d, s, causal) and tile extents."""
    n = c = 1
    for (L, K, d, s, causal), qe, ke in zip(axes, q, kv):
        a, b = axis_sums(L, K, d, s, causal, qe, ke)
        n, c = n * a, c * b
    return n / c


def _extents(rows, caps, threes):
    """Per-axis extents with product `rows`: powers of two (and 3 * a power of two when
    `threes`), each at most its cap."""
    opts = []
    for cap in caps:
        o = [1 << e for e in range(0, 9) if (1 << e) <= cap]
        if threes:
            o += [3 << e for e in range(0, 7) if (3 << e) <= cap]
        opts.append(sorted(set(o)))
    return [t for t in itertools.product(*opts) if math.prod(t) == rows]


def bound(axes):
    """(fraction, q tile, kv tile) of the best tile shape searched (see the module docstring)."""
    caps = [1 << max(0, math.ceil(math.log2(math.ceil(L / d)))) for L, K, d, s, c in axes]
    best = (0.0, None, None)
    cache = {}

    def sums(a, qe, ke):
        key = (a, qe, ke)
        if key not in cache:
            cache[key] = axis_sums(*axes[a], qe, ke)
        return cache[key]
    for qr in Q_ROWS:
        for q in _extents(qr, caps, threes=True):
            for kr in KV_ROWS:
                for kv in _extents(kr, caps, threes=False):
                    n = c = 1
                    for a in range(len(axes)):
                        x, y = sums(a, q[a], kv[a])
                        n, c = n * x, c * y
                    if n / c > best[0]:
                        best = (n / c, q, kv)
    return best


def problem_axes(name):
    if name in SMALL:
        B, H, shape, D, kernel, dilation = SMALL[name]
    else:
        B, H, shape, D, kernel = PROBLEMS[name]
        dilation = (1,) * len(shape)
    return [(L, K, d, 1, False) for L, K, d in zip(shape, kernel, dilation)]


def parse_tiles(text):
    """'name=q8x16/kv8x8' -> (name, (8, 16), (8, 8))."""
    name, spec = text.split("=")
    q, kv = spec.split("/")
    ext = lambda t: tuple(int(x) for x in t.lstrip("qkv").split("x"))  # noqa: E731
    return name, ext(q), ext(kv)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default=",".join(list(PROBLEMS) + list(SMALL)))
    ap.add_argument("--tiles", action="append", default=[],
                    help="name=qAxB/kvCxD: also report the fraction of these tiles")
    args = ap.parse_args(argv)
    given = {}
    for t in args.tiles:
        name, q, kv = parse_tiles(t)
        given[name] = (q, kv)
    print(f"{'problem':<10} {'bound':>6}  {'q tile':<10} {'kv tile':<10} {'given':>6}  given tiles")
    for name in args.problems.split(","):
        axes = problem_axes(name)
        f, q, kv = bound(axes)
        g = ""
        if name in given:
            gq, gkv = given[name]
            g = f"{fraction(axes, gq, gkv):>6.3f}  q{'x'.join(map(str, gq))} kv{'x'.join(map(str, gkv))}"
        print(f"{name:<10} {f:>6.3f}  {'x'.join(map(str, q)):<10} {'x'.join(map(str, kv)):<10} {g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
