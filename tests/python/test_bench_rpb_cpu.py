"""bench/rpb_cpu.py: it runs (tiny problem, one round), prints its table, and its pre-timing check
stops it when the kernels' biased result and the composition's differ."""

import importlib.util
import io
import os

import pytest

torch = pytest.importorskip("torch")

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "rpb_cpu.py")
_spec = importlib.util.spec_from_file_location("rpb_cpu", _PATH)
rb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rb)


def test_runs_and_reports():
    out = io.StringIO()
    rows = rb.run(["tiny"], 1, out=out)
    assert [(p, m) for p, m, _ in rows] == [("tiny", "fwd"), ("tiny", "fwd+bwd")]
    for _, _, med in rows:
        assert set(med) == {"no bias", "rpb (cpu kernels)", "rpb (composition)"}
        assert all(t > 0 for t in med.values())
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("| problem | mode | no bias (ms)") and len(lines) == 4


def test_check_catches_a_wrong_bias(monkeypatch):
    fns = rb.variants(rb.PROBLEMS["tiny"])
    good = fns["rpb (composition)"]
    fns["rpb (composition)"] = lambda q, k, v, rpb: good(q, k, v, rpb.roll(1, -1))
    with pytest.raises(AssertionError, match="output"):
        rb.check(rb.PROBLEMS["tiny"], fns)
