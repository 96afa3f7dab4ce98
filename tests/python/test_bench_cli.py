"""fna-bench's --json and --csv, read back with Python's json and csv modules (issue 29).

Runs the built fna-bench binary when it can be found (build/py/fna-bench or build/*/fna-bench, the
newest one whose --help lists --csv); skipped otherwise. CPU only: --device cpu on a tiny problem.
"""
import csv
import glob
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _find_bench():
    """The newest built fna-bench that has --csv (an older build would fail for want of it)."""
    cands = {os.path.join(ROOT, "build", "py", "fna-bench")}
    cands.update(glob.glob(os.path.join(ROOT, "build", "*", "fna-bench")))
    cands = [c for c in cands if os.path.isfile(c) and os.access(c, os.X_OK)]
    for c in sorted(cands, key=os.path.getmtime, reverse=True):
        try:
            out = subprocess.run([c, "--help"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and "--csv FILE" in out.stdout and "--name NAME" in out.stdout:
            return c
    return None


BENCH = _find_bench()
pytestmark = pytest.mark.skipif(BENCH is None, reason="no built fna-bench (with --csv) under build/")

# A label with every character JSON and CSV must escape: quote, backslash, comma, control chars.
NAME = 'q"b\\s,c\tt\nn\x01 \u00e9'
FIELDS = ["problem", "fna_version", "commit", "date", "device", "name", "backend", "threads",
          "mode", "repeats", "fwd_ms", "fwd_ms_min", "fwd_ms_max", "bwd_ms", "bwd_ms_min",
          "bwd_ms_max", "fwd_tflops", "bwd_tflops", "fwd_bwd_tflops", "max_err", "peak_mb",
          "peak_mb_measure", "error"]


def _run(tmp_path, *extra):
    js, cs = tmp_path / "r.json", tmp_path / "r.csv"
    cmd = [BENCH, "--device", "cpu", "--shape", "12x10", "--kernel", "5x3", "--repeats", "3",
           "--check", "16", "--name", NAME, "--json", str(js), "--csv", str(cs), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout, js, cs


def test_json_round_trip(tmp_path):
    stdout, js, _ = _run(tmp_path)
    lines = js.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2  # cpu and reference
    recs = [json.loads(line) for line in lines]
    assert [r["backend"] for r in recs] == ["cpu", "reference"]
    for r in recs:
        assert list(r) == FIELDS
        assert r["name"] == NAME  # escaping round-trips
        assert r["mode"] == "both" and r["error"] == ""
        assert r["threads"] >= 1 and isinstance(r["threads"], int)  # counts are JSON integers
        assert isinstance(r["repeats"], int) and isinstance(r["fwd_ms"], float)
        assert r["date"].endswith("Z") and r["commit"] and r["fna_version"]
        assert r["device"].startswith("cpu")
        assert r["fwd_ms_min"] <= r["fwd_ms"] <= r["fwd_ms_max"]
        assert r["bwd_ms_min"] <= r["bwd_ms"] <= r["bwd_ms_max"]
        assert r["peak_mb"] is None or r["peak_mb"] >= 0
        assert r["max_err"] is not None and r["max_err"] < 1e-4
    assert recs[0]["repeats"] == 3 and recs[1]["repeats"] == 1
    assert f"commit {recs[0]['commit']}" in stdout


def test_json_bwd_mode_nulls(tmp_path):
    _, js, _ = _run(tmp_path, "--mode", "bwd", "--backend", "cpu")
    (r,) = [json.loads(line) for line in js.read_text().splitlines()]
    assert r["mode"] == "bwd"
    assert r["fwd_ms"] is None and r["fwd_tflops"] is None and r["fwd_bwd_tflops"] is None
    assert r["bwd_ms"] > 0


def test_csv_round_trip(tmp_path):
    _, js, cs = _run(tmp_path)
    _run(tmp_path, "--backend", "cpu")  # appends: no second header
    with open(cs, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["backend"] for r in rows] == ["cpu", "reference", "cpu"]
    recs = [json.loads(line) for line in js.read_text().splitlines()]
    for row, rec in zip(rows, recs):
        assert list(row) == FIELDS
        assert row["name"] == NAME
        for k, v in rec.items():
            if isinstance(v, str):
                assert row[k] == v, k
            elif v is None:
                assert row[k] == "", k
            else:
                assert float(row[k]) == pytest.approx(v), k
