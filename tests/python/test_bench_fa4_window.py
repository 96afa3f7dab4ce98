"""The GPU benchmark's FlashAttention 4 peer (bench/gpu_bench.py fa4_window): the sliding window
it gives FA4 for a 1-D problem is neighborhood attention exactly on the rows it compares, and the
rows it leaves out (the borders of a centered window, where NA moves the window inward) do
differ, so the comparison is neither vacuous nor too wide. Checked on the CPU with fna's cpu
backend against attention under the sliding-window mask; no problem with dilation or stride gets
a window."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
import fna  # noqa: E402
from helpers import seed_of  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpu_bench  # noqa: E402


def _sliding_window_attention(q, k, v, left, right, causal, scale):
    """softmax(q k^T) v with key j visible from query i when i - left <= j <= i + right (and j <= i
    when causal); q, k, v as [B, N, H, D]."""
    n = q.shape[1]
    i = torch.arange(n).view(n, 1)
    j = torch.arange(n).view(1, n)
    allowed = (j >= i - left) & (j <= i + right)
    if causal:
        allowed &= j <= i
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), v)


@pytest.mark.parametrize("n,ks,causal", [(40, 7, False), (40, 8, False), (33, 5, True),
                                         (64, 13, True), (50, 49, False)])
def test_fa4_window_rows_are_na(n, ks, causal):
    case = dict(shape=(n,), kernel=(ks,), dilation=(1,), stride=(1,), causal=(causal,))
    (left, right), fa_causal, rows = gpu_bench.fa4_window(case)
    assert fa_causal == causal
    g = torch.Generator().manual_seed(seed_of("fa4-window", n, ks, causal))
    q, k, v = (torch.randn(2, n, 3, 16, generator=g) for _ in range(3))
    scale = 16 ** -0.5
    na = fna.na1d(q, k, v, ks, is_causal=causal, backend="cpu")
    sw = _sliding_window_attention(q, k, v, left, right, causal, scale)
    assert rows.stop - rows.start >= 1
    assert (na[:, rows] - sw[:, rows]).abs().max().item() < 1e-5
    outside = torch.ones(n, dtype=torch.bool)
    outside[rows] = False
    if causal:
        assert not outside.any()  # every row compared
    else:
        # Each left-out row has a window NA moved inward: its output differs.
        diff = (na - sw).abs().amax(dim=(0, 2, 3))
        assert outside.any() and bool((diff[outside] > 1e-3).all()), diff


def test_fa4_window_only_plain_1d():
    base = dict(shape=(64,), kernel=(7,), dilation=(1,), stride=(1,), causal=(False,))
    assert gpu_bench.fa4_window(base) is not None
    assert gpu_bench.fa4_window(dict(base, dilation=(2,))) is None
    assert gpu_bench.fa4_window(dict(base, stride=(2,))) is None
    assert gpu_bench.fa4_window(dict(base, shape=(8, 8), kernel=(3, 3), dilation=(1, 1),
                                     stride=(1, 1), causal=(False, False))) is None


def test_fa4_peer_absent_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # the import fails
    fn, why = gpu_bench.fa4_import()
    assert fn is None and "flash_attn" in why
