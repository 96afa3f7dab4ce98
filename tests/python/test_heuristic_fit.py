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
