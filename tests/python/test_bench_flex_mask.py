"""The GPU benchmark's FlexAttention mask_mod (bench/flex_na.py) must be fna's neighborhood.

Dense masked attention with that mask, in float64, is compared with fna's reference backend on
random small problems over every parameter, so the peer comparison in gpu_bench.py is of the same
function.
"""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fna  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from flex_na import na_mask_mod  # noqa: E402

NA = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}


@pytest.mark.parametrize("case", range(48))
def test_flex_mask_is_fna_neighborhood(case):
    rng = np.random.default_rng(1000 + case)
    rank = 1 + case % 3
    shape = tuple(int(rng.integers(3, 10)) for _ in range(rank))
    kernel, dil, stride, causal = [], [], [], []
    for L in shape:
        d = int(rng.integers(1, 3)) if L >= 4 else 1
        K = int(rng.integers(1, L // d + 1))
        kernel.append(K)
        dil.append(d)
        stride.append(int(rng.integers(1, K + 1)))
        causal.append(bool(rng.integers(0, 2)))
    N = int(np.prod(shape))
    D = 4
    g = torch.Generator().manual_seed(case)
    q, k, v = (torch.rand(1, *shape, 1, D, generator=g) * 2 - 1 for _ in range(3))
    out = NA[rank](q, k, v, tuple(kernel), stride=tuple(stride), dilation=tuple(dil),
                   is_causal=tuple(causal), backend="reference")
    mask = na_mask_mod(shape, kernel, dil, stride, causal)
    qi = torch.arange(N)[:, None].expand(N, N)
    ki = torch.arange(N)[None, :].expand(N, N)
    M = mask(0, 0, qi, ki)
    Q, K_, V = (t.reshape(N, D).double() for t in (q, k, v))
    S = (Q @ K_.T * D ** -0.5).masked_fill(~M, float("-inf"))
    ref = torch.softmax(S, -1) @ V
    err = (ref - out.reshape(N, D).double()).abs().max().item()
    assert err < 1e-5, (shape, kernel, dil, stride, causal, err)
