"""The GPU benchmark's roofline (bench/gpu_bench.py roofline_ms / roofline_table): bytes of one
pass over the call's tensors at the copy bandwidth against FLOPs at cuDNN's dense rate of the
same run, whichever is longer; variants without SDPA rows take their base variant's rate."""
import math
import os
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpu_bench  # noqa: E402


def test_roofline_memory_and_compute_bound():
    case = gpu_bench.make_case("nat-t", "base")  # 32 x 3 heads x 56 x 56 x 32, bf16
    tensor = 32 * 3 * 56 * 56 * 32 * 2
    flops = 1.9e9
    bw = 4.0e12
    fwd, fb = gpu_bench.roofline_ms(case, flops, bw, 250.0, 200.0)
    # Memory-bound at this rate: 4 passes forward, 12 forward+backward.
    assert fwd == pytest.approx(4 * tensor / bw * 1e3)
    assert fb == pytest.approx(12 * tensor / bw * 1e3)
    # A slow dense rate makes the FLOPs the bound.
    fwd, fb = gpu_bench.roofline_ms(case, flops, bw, 1.0, 1.0)
    assert fwd == pytest.approx(flops / 1e12 * 1e3)
    assert fb == pytest.approx(3.5 * flops / 1e12 * 1e3)
    assert gpu_bench.roofline_ms(case, flops, bw, None, 5.0)[0] is None


def test_roofline_table_uses_base_rate_for_variants():
    base = gpu_bench.make_case("2d-nat", "base")
    dil = gpu_bench.make_case("2d-nat", "dil2")
    flops = 4.0 * base["B"] * base["H"] * math.prod(base["shape"]) * 169 * base["D"]
    fna_row = dict(impl="fna cuda-fused", fwd_ms=0.5, fb_ms=3.0,
                   tiling="tiles: needed pairs 1.000, unmasked 1.000 (fna_fwd_x, walk 01)")
    runs = [dict(case=base, flops=flops, results=[
                fna_row, dict(impl="sdpa cudnn (dense)", fwd_ms=9.0, fwd_tflops=500.0,
                              fb_tflops=400.0),
                dict(impl="natten 0.21.6", fwd_ms=1.0, fb_ms=4.5)]),
            dict(case=dil, flops=flops, results=[dict(fna_row)])]
    text = gpu_bench.roofline_table(runs, 4.0e12)
    rows = [line for line in text.splitlines() if line.startswith("| 2d-nat")]
    assert len(rows) == 2
    rf, _ = gpu_bench.roofline_ms(base, flops, 4.0e12, 500.0, 400.0)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[3]) == pytest.approx(rf, abs=1e-3)
        assert cells[4] == f"{0.5 / rf:.2f}x"
        assert cells[10] == "fna_fwd_x"
    assert "2.00x / 1.50x" in rows[0] and "2.00x" not in rows[1]
