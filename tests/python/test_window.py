"""fna._window, the package's one definition of the window on an axis (docs/semantics.md section
1.1), against the independent oracle helpers.axis_window (shares no code with the library): the
scalar form, the vectorised torch form and the per-axis pair count of fna._flops built on it,
exhaustively on every valid (L, K, d, s, causal) of small axes and on random seeded larger ones."""

import numpy as np
import pytest

from fna import _flops, _window
from helpers import axis_window, seed_of

MAX_L = 12  # exhaustive up to here: even and odd K, every stride 1..K, every dilation


def _all_params(max_len):
    for L in range(1, max_len + 1):
        for d in range(1, L + 1):
            for K in range(1, L // d + 1):
                for s in range(1, K + 1):
                    for causal in (False, True):
                        yield L, K, d, s, causal


def _random_params(seed, n, max_len=64):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        L = int(rng.integers(1, max_len + 1))
        d = int(rng.integers(1, min(L, 8) + 1))
        K = int(rng.integers(1, L // d + 1))
        s = int(rng.integers(1, K + 1))
        yield L, K, d, s, bool(rng.random() < 0.5)


def _check_scalar(L, K, d, s, causal):
    for x in range(L):
        w = _window.axis_window(x, L, K, d, s, causal)
        case = (x, L, K, d, s, causal)
        assert (w.group, w.start, w.end) == axis_window(x, L, K, d, s, causal), case
        assert (w.index, w.length) == (x // d, len(range(x % d, L, d))), case
        # The leader is a token of the group, and the query lies in its own window
        # (docs/semantics.md section 1.3).
        assert 0 <= w.leader < w.length and w.start <= w.index < w.end, case


def _check_pairs(L, K, d, s, causal):
    expected = 0
    for x in range(L):
        _, start, end = axis_window(x, L, K, d, s, causal)
        expected += end - start
    assert _flops.axis_pairs(L, K, d, s, causal) == expected, (L, K, d, s, causal)


def test_scalar_window_exhaustive():
    n = 0
    for p in _all_params(MAX_L):
        _check_scalar(*p)
        n += 1
    assert n > 1000  # the loops really ran (every valid parameter set of L <= MAX_L)


def test_scalar_window_random():
    for p in _random_params(seed_of("test_scalar_window_random"), 300):
        _check_scalar(*p)


def test_even_kernel_and_stride_cases():
    """Hand-picked cases (the semantics page's examples): an even K puts r keys before an
    interior query and r - 1 after it; with s = K the windows are blocks; causal windows are cut
    short at the start."""
    w = _window.axis_window(5, 10, 4, 1, 1, False)
    assert (w.start, w.end) == (3, 7)
    blocks = [_window.axis_window(x, 8, 4, 1, 4, False).start for x in range(8)]
    assert blocks == [0] * 4 + [4] * 4
    assert [_window.axis_window(x, 6, 3, 1, 1, True)[4:] for x in range(4)] == [
        (0, 1), (0, 2), (0, 3), (1, 4)]


def test_pair_count():
    for p in _all_params(MAX_L):
        _check_pairs(*p)
    for p in _random_params(seed_of("test_pair_count"), 100):
        _check_pairs(*p)


def test_vectorised_window():
    torch = pytest.importorskip("torch")
    params = list(_all_params(10)) + list(_random_params(seed_of("test_vectorised_window"), 100))
    for L, K, d, s, causal in params:
        w = _window.axis_windows(L, K, d, s, causal, "cpu")
        for f in w:
            assert f.dtype == torch.int64 and tuple(f.shape) == (L,)
        got = torch.stack([w.group, w.start, w.end], dim=1).tolist()
        assert got == [list(axis_window(x, L, K, d, s, causal)) for x in range(L)], (L, K, d, s,
                                                                                    causal)
        scalar = [_window.axis_window(x, L, K, d, s, causal) for x in range(L)]
        assert torch.stack(list(w), dim=1).tolist() == [list(v) for v in scalar]


def test_vectorised_window_numpy():
    """axis_windows_np: every field an int64 array equal, entry by entry, to the scalar window
    (and to the spec's copy in helpers)."""
    import numpy as np
    params = list(_all_params(10)) + list(_random_params(seed_of("test_vectorised_np"), 100))
    for L, K, d, s, causal in params:
        w = _window.axis_windows_np(L, K, d, s, causal)
        for f in w:
            assert f.dtype == np.int64 and f.shape == (L,)
        got = np.stack([w.group, w.start, w.end], axis=1).tolist()
        assert got == [list(axis_window(x, L, K, d, s, causal)) for x in range(L)], (L, K, d, s,
                                                                                    causal)
        scalar = [_window.axis_window(x, L, K, d, s, causal) for x in range(L)]
        assert np.stack(list(w), axis=1).tolist() == [list(v) for v in scalar]
