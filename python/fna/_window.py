"""The window of neighborhood attention on one axis (docs/semantics.md section 1.1): the one
definition in the Python package, as src/core/neighborhood.h is in C++.

Every Python user of the window goes through here: ``fna._rpb`` / ``fna._rpb_np`` (the bias index
of each window slot, torch / NumPy), ``fna.distributed`` (the rows a query's window needs) and
``fna._flops`` (the attended pairs, which ``fna.profiler`` and bench/gpu_bench.py count with
too). The test suite keeps an
independent copy (tests/python/helpers.py ``axis_window``) as the oracle this one is checked
against (tests/python/test_window.py).

The arithmetic is written once, in :func:`_window`, on values that support ``%``, ``//``, ``+``,
``-``, ``*`` and the ``minimum`` / ``maximum`` it is given: Python ints (:func:`axis_window`,
with the builtins ``min`` / ``max``) or integer torch tensors / NumPy arrays of all the queries of
the axis at once (:func:`axis_windows`, :func:`axis_windows_np`). torch is imported only inside
:func:`axis_windows`, so ``import fna`` does not import it.
"""

from typing import Any, NamedTuple


class Window(NamedTuple):
    """The window of a query on one axis, in the local indices of its dilation group (ints, or
    ``[L]`` tensors from :func:`axis_windows`). The window's keys are the group's local indices
    ``[start, end)``, i.e. the global coordinates ``j * dilation + group`` for those ``j``."""
    group: Any   # g = x % d: the query's dilation group
    index: Any   # i = x // d: the query's local index in its group
    length: Any  # L_g = ceil((L - g) / d): the number of tokens of the group
    leader: Any  # the representative of the query's stride group (it sets the window)
    start: Any   # first key (local index)
    end: Any     # one past the last key (local index); end - start = K unless causal


def _window(x, L, K, d, s, causal, minimum, maximum):
    """docs/semantics.md section 1.1 for the query at coordinate ``x`` on an axis of length
    ``L`` (kernel K, dilation d, stride s, ``causal`` a Python bool); ``x`` an int or an integer
    tensor, ``minimum`` / ``maximum`` the elementwise min / max of its kind (the second argument
    may be an int)."""
    g, i = x % d, x // d                     # 1. dilation group and local index
    lg = (L - g + d - 1) // d                # tokens of group g
    if causal:                               # 4. causal: cut short at the beginning
        leader = minimum((i // s) * s + (s - 1), lg - 1)
        start = maximum(leader - (K - 1), 0)
        end = minimum(i + 1, lg)
    else:                                    # 3. non-causal: pushed back inside at the borders
        left = K // 2                        # 2. radii (even K: one more key before the centre)
        right = K - 1 - left
        leader = minimum((i // s) * s + s // 2, lg - 1)
        # max(leader - left, 0) + (leader + right >= lg ? lg - right - leader - 1 : 0): the shift
        # is negative exactly when leader + right >= lg, and 0 otherwise, so it is a min with 0.
        start = maximum(leader - left, 0) + minimum(lg - 1 - right - leader, 0)
        end = start + K
    return Window(g, i, lg, leader, start, end)


def axis_window(x, L, K, d, s, causal):
    """The :class:`Window` (ints) of the query at coordinate ``x`` (an int in ``[0, L)``) on an
    axis of length ``L`` with kernel ``K``, dilation ``d``, stride ``s``, ``causal``."""
    return _window(int(x), int(L), int(K), int(d), int(s), bool(causal), min, max)


def axis_windows(L, K, d, s, causal, device=None):
    """The :class:`Window` of every query of the axis at once: fields are int64 tensors of shape
    ``[L]`` on ``device``, entry ``x`` equal to ``axis_window(x, L, K, d, s, causal)``'s."""
    import torch

    def minimum(a, b):
        return torch.minimum(a, torch.as_tensor(b, dtype=a.dtype, device=a.device))

    def maximum(a, b):
        return torch.maximum(a, torch.as_tensor(b, dtype=a.dtype, device=a.device))

    x = torch.arange(int(L), device=device)
    return _window(x, int(L), int(K), int(d), int(s), bool(causal), minimum, maximum)



def axis_windows_np(L, K, d, s, causal):
    """:func:`axis_windows` with NumPy int64 arrays (the NumPy callers: ``fna._rpb_np``)."""
    import numpy as np

    x = np.arange(int(L), dtype=np.int64)
    return _window(x, int(L), int(K), int(d), int(s), bool(causal), np.minimum, np.maximum)
