"""bench/heuristic_fit.py mirrors the plan's forward cost model offline: its fitted constants must
be the ones plan/fwd_cost.h compiles (a refit changes both, or the offline counts mean nothing)."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_fit_constants_match_the_plan():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import heuristic_fit
    finally:
        sys.path.pop(0)
    with open(os.path.join(ROOT, "src", "cuda", "fused", "plan", "fwd_cost.h")) as f:
        text = f.read()
    models = dict(re.findall(r"constexpr CostModel k(\w+)Model\{([^}]*)\}", text))
    assert set(models) == {"Plain", "Ws", "Box", "Strip", "Simt"}, models
    family = {"Plain": "sm90", "Ws": "sm90ws", "Box": "box", "Strip": "strip", "Simt": "simt"}
    for name, body in models.items():
        cta, tile, pairs, share = (float(x) for x in body.split(","))
        p = heuristic_fit.PARAMS[family[name]]
        assert (p.get("C", 0.0), p.get("K", 0.0), p.get("P", 0.0), p.get("g", 0.0)) == \
            (cta, tile, pairs, share), (name, body, p)


def test_head_dim_64_rule_matches_the_plan():
    # plan/fwd_choice.cu deep_enough at padded head dim 64 (the cases of
    # tests/cpp/fwd_choice_test.cpp ForwardChoice.NoMaskedTilesForQ192AtHeadDim64 and the rank-1
    # threshold).
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import heuristic_fit
    finally:
        sys.path.pop(0)

    def deep(shape, kernel, dil, causal):
        r = dict(shape=shape, kernel=kernel, dil=dil, causal=causal)
        return heuristic_fit.deep_d64(r, len(shape.split("x")), int(kernel.split("x")[0]))

    assert deep("16x32x32", "16x32x32", "1x1x1", "000")
    assert deep("16x32x32", "8x16x16", "2x2x2", "000")
    assert not deep("30x48x80", "18x24x24", "1x1x1", "000")
    assert not deep("16x32x32", "16x32x32", "1x1x1", "100")
    assert not deep("16x32x32", "16x31x32", "1x1x1", "000")
    assert not deep("16x32x32", "8x16x15", "2x2x2", "000")
    assert deep("16384", "16384", "1", "0") and deep("32768", "2048", "1", "0")
    assert not deep("8192", "513", "1", "0")
