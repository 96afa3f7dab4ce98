"""python -m fna.profiler (issue 31): argument parsing, the dry-run listing, the table / CSV / JSON
logic with a fake timer and fake candidates (CPU), the CPU-only build's message, and one profile
of a small 2-D problem end to end on a GPU."""

import csv
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fna
from fna import profiler as P

BASE = ["--shape", "32x24", "--kernel", "7x5", "--heads", "2", "--dim", "32"]


# ---- argument parsing ----------------------------------------------------------------------------

def test_parse_args_per_axis_and_defaults():
    prob, args = P.parse_args(BASE + ["--causal", "1x0", "--dilation", "2x1", "--batch", "3",
                                      "--dtype", "bf16"])
    assert prob.shape == (32, 24) and prob.kernel == (7, 5) and prob.rank == 2
    assert prob.dilation == (2, 1) and prob.stride == (1, 1) and prob.causal == (True, False)
    assert prob.heads_kv == 2 and prob.dim_v == 32 and prob.batch == 3
    assert prob.dtype == "bfloat16" and prob.query_shape == (3, 32, 24, 2, 32)
    assert args.backward and not args.dry_run and args.reps == 10 and args.warmup == 3
    prob, args = P.parse_args(["--shape", "64", "--kernel", "9", "--heads", "4", "--heads-kv",
                               "2", "--dim", "32", "--dim-v", "64", "--no-backward",
                               "--dtype", "float32", "--allow-tf32"])
    assert prob.rank == 1 and prob.heads_kv == 2 and prob.dim_v == 64 and prob.config_dim == 64
    assert not args.backward and prob.allow_tf32
    prob, _ = P.parse_args(["--shape", "8x16x16", "--kernel", "3", "--stride", "1x2x2",
                            "--heads", "1", "--dim", "16"])
    assert prob.kernel == (3, 3, 3) and prob.stride == (1, 2, 2)


@pytest.mark.parametrize("extra, flag, words", [
    (["--shape", "12a"], "--shape", "not an integer"),
    (["--shape", "0x8"], "--shape", ">= 1"),
    (["--shape", "4x4x4x4"], "--shape", "1 to 3 axes"),
    (["--dtype", "float64"], "--dtype", "float32, float16, bfloat16"),
    (["--kernel", "3x3x3"], "--kernel", "3 entries for a rank-2 problem"),
    (["--kernel", "40"], "--kernel", "exceeds the length 32"),
    (["--kernel", "0"], "--kernel", ">= 1"),
    (["--dilation", "8"], "--kernel", "dilation 8"),
    (["--stride", "9"], "--stride", "must be in [1, kernel 7]"),
    (["--causal", "2"], "--causal", "0 or 1"),
    (["--heads-kv", "3"], "--heads-kv", "not a multiple"),
    (["--reps", "0"], "--reps", ">= 1"),
    (["--warmup", "-1"], "--warmup", ">= 0"),
    (["--batch", "x"], "--batch", "not an integer"),
    (["--allow-tf32"], "--allow-tf32", "float32 only"),
])
def test_bad_arguments_exit_2_naming_the_flag(capsys, extra, flag, words):
    opts = dict(zip(BASE[::2], BASE[1::2]))
    switches = []
    if len(extra) == 1:
        switches = extra
    else:
        opts[extra[0]] = extra[1]
    argv = [x for kv in opts.items() for x in kv] + switches
    with pytest.raises(SystemExit) as e:
        P.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and words in err, err


def test_missing_required_flag(capsys):
    with pytest.raises(SystemExit) as e:
        P.parse_args(["--kernel", "3", "--heads", "1", "--dim", "8"])
    assert e.value.code == 2 and "--shape" in capsys.readouterr().err


def test_module_entry_point_bad_shape():
    r = subprocess.run([sys.executable, "-m", "fna.profiler", "--shape", "1x", "--kernel", "3",
                        "--heads", "1", "--dim", "8"], capture_output=True, text=True)
    assert r.returncode == 2 and "argument --shape" in r.stderr, r.stderr


# ---- a CPU-only build ----------------------------------------------------------------------------

@pytest.mark.skipif(fna.backend_compiled("cuda-fused"), reason="this build has cuda-fused")
def test_cpu_only_build_says_cuda_fused_is_not_available():
    r = subprocess.run([sys.executable, "-m", "fna.profiler", "--dry-run"] + BASE,
                       capture_output=True, text=True)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "cuda-fused is not available" in r.stderr and "built without a CUDA" in r.stderr
    assert fna.fused_configs(2, "bfloat16", 32) == []


# ---- fakes ---------------------------------------------------------------------------------------

FWD = ["fna_fwd_sm80_bf16_d32_q8x8_kv8x8_w4", "fna_fwd_sm80_bf16_d32_q16x8_kv8x8_w4",
       "fna_fwd_sm90_bf16_d32_q8x8_kv8x16_w4", "fna_fwd_box_bf16_d32_q64_b16x16",
       "fna_fwd_sm90ws_bf16_d32_q8x16_kv8x8_w12"]
BWD = ["fna_bwd_sm80_bf16_d32_kv8x8_q8x8_dqq8x8_dqkv8x8",
       "fna_bwd_sm80_bf16_d32_kv16x8_q8x8_dqq8x8_dqkv8x8",
       "fna_bwd_sm90_bf16_d32_kv8x16_q8x8_dqq8x8_dqkv8x8"]
HEUR_F, HEUR_B = FWD[1], BWD[0]


class FakeApi:
    """fused_configs / fused_backward_configs / fused_plan of a device where the box forward does
    not take the problem and the sm90 backward is not available."""

    def __init__(self, compiled=True, fwd=FWD, bwd=BWD):
        self.compiled, self.fwd, self.bwd = compiled, list(fwd), list(bwd)
        self.plans = []

    def backend_compiled(self, name):
        return self.compiled

    def fused_configs(self, rank, dtype, dim):
        return list(self.fwd) if self.compiled else []

    def fused_backward_configs(self, rank, dtype, dim):
        return list(self.bwd) if self.compiled else []

    def fused_plan(self, query_shape, kernel_size, config=None, backward_config=None, **kw):
        self.plans.append((tuple(query_shape), config, backward_config, kw))
        if config and "_box_" in config:
            raise ValueError(f"config='{config}': the box forward takes windows up to 7x7")
        if backward_config and "_sm90_" in backward_config:
            raise NotImplementedError("the sm90 backward needs compute capability 9.0")
        fwd = config or HEUR_F
        bwd = backward_config or HEUR_B
        q = [int(x) for x in fwd.split("_q")[1].split("_")[0].split("x")]
        return dict(config=fwd, family=fwd.split("_")[2], q_tile=q, kv_tile=[8, 8],
                    needed_fraction=0.75 if q == [8, 8] else 0.875, backward_config=bwd,
                    backward_family=bwd.split("_")[2], backward_kv_tile=[8, 8],
                    backward_q_tile=[8, 8], backward_needed_fraction=0.625)


# GPU milliseconds the fake timer returns for each callable (the callable returns its key).
TIMES = {FWD[0]: 0.50, FWD[1]: 0.40, FWD[2]: 0.30, FWD[4]: 0.90,
         "baseline": 0.40, BWD[0]: 1.40, BWD[1]: 1.20}


class FakeRunner:
    def __init__(self, auto=None, fail=()):
        self.auto, self.fail, self.calls = auto, set(fail), []

    def forward(self, name):
        self.calls.append(("forward", name))
        if name in self.fail:
            raise RuntimeError("an illegal memory access was encountered")
        return lambda: name

    def backward_baseline(self, forward_name):
        self.calls.append(("baseline", forward_name))
        return lambda: "baseline"

    def backward(self, name, forward_name, own=False):
        self.calls.append(("backward", name, forward_name))
        return lambda: name

    def autotuned(self, backward=True):
        if self.auto is None:
            return dict(forward=None, backward=None,
                        note="autotuner not available (tuning='auto': TypeError: ...)")
        return dict(self.auto)


def fake_timer(fn):
    return TIMES[fn()]


def problem():
    return P.parse_args(BASE + ["--batch", "2"])[0]


# ---- dry run -------------------------------------------------------------------------------------

def test_list_candidates_and_dry_run_listing():
    api = FakeApi()
    c = P.list_candidates(problem(), api=api)
    assert [x.name for x in c.forward] == FWD and [x.name for x in c.backward] == BWD
    assert c.heuristic_forward == HEUR_F and c.heuristic_backward == HEUR_B
    box = c.forward[3]
    assert not box.runs and box.reason.startswith("ValueError: config=") and box.family == "box"
    assert box.tiles == "q64 b16x16"  # from the name where there is no plan
    assert [x.heuristic for x in c.forward] == [False, True, False, False, False]
    assert c.forward[4].family == "sm90ws" and c.forward[4].tiles == "q8x16 kv8x8"
    assert c.backward[2].reason.startswith("NotImplementedError: the sm90 backward")
    assert c.backward[0].tiles == "kv8x8 q8x8" and c.backward[0].needed_fraction == 0.625
    # Every plan was asked with the problem's parameters and head dim max(D, D_v).
    shape, _, _, kw = api.plans[0]
    assert shape == (2, 32, 24, 2, 32) and kw["dtype"] == "bfloat16" and kw["heads_kv"] == 2
    text = P.format_dry_run(problem(), c)
    assert "forward candidates: 5 (4 run here)" in text
    assert "backward candidates: 3 (2 run here)" in text
    assert "cannot run: ValueError: config='fna_fwd_box" in text
    assert f"heuristic: forward {HEUR_F}, backward {HEUR_B}" in text
    line = next(ln for ln in text.splitlines() if ln.startswith(HEUR_F))
    assert line.split()[-3:] == ["0.875", "yes", "yes"]


def test_no_plan_without_a_device():
    class NoDevice(FakeApi):
        def fused_plan(self, *a, **k):
            raise RuntimeError("fused_plan needs a CUDA device, but none is visible")
    c = P.list_candidates(problem(), api=NoDevice())
    assert c.heuristic_forward is None and "needs a CUDA device" in c.heuristic_error
    assert all(not x.runs and "needs a CUDA device" in x.reason for x in c.forward + c.backward)
    assert c.forward[0].family == "sm80" and c.forward[0].tiles == "q8x8 kv8x8"
    text = P.format_dry_run(problem(), c)
    assert "heuristic: forward -, backward - (RuntimeError: fused_plan needs a CUDA" in text


def test_dry_run_main_with_csv_and_json(tmp_path, capsys):
    csv_path, json_path = tmp_path / "c.csv", tmp_path / "c.json"
    rc = P.main(BASE + ["--dry-run", "--csv", str(csv_path), "--json", str(json_path)],
                api=FakeApi(), runner=FakeRunner())
    assert rc == 0
    out = capsys.readouterr().out
    assert "forward candidates: 5" in out and "fna_fwd_sm90ws" in out
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == 8 and all(r["ms"] == "" for r in rows)
    doc = json.load(open(json_path))
    assert doc["heuristic"]["forward"] == HEUR_F and len(doc["rows"]) == 8


def test_main_no_configurations(capsys):
    rc = P.main(BASE + ["--dry-run"], api=FakeApi(fwd=[], bwd=[]))
    assert rc == 1 and "no configurations for rank 2, bfloat16, head dim 32" in \
        capsys.readouterr().err
    rc = P.main(BASE + ["--dry-run"], api=FakeApi(compiled=False))
    assert rc == 1 and "cuda-fused is not available" in capsys.readouterr().err


# ---- timing logic with a fake timer --------------------------------------------------------------

def test_profile_sorts_marks_and_counts():
    prob = problem()
    c = P.list_candidates(prob, api=FakeApi())
    auto = dict(forward=FWD[2], backward=BWD[1], note="")
    runner = FakeRunner(auto=auto)
    rep = P.profile(prob, timer=fake_timer, runner=runner, candidates=c, progress=False)
    fwd = rep.direction("forward")
    assert [r.config for r in fwd] == [FWD[2], FWD[1], FWD[0], FWD[4], FWD[3]]
    assert [r.rank for r in fwd] == [1, 2, 3, 4, None]
    assert fwd[-1].status.startswith("cannot run: ValueError") and fwd[-1].ms is None
    assert fwd[0].autotuned is True and fwd[1].heuristic and not fwd[0].heuristic
    assert fwd[1].autotuned is False
    pairs = 32 * 7 * 24 * 5
    assert rep.pairs == pairs and rep.flops_forward == 4.0 * 2 * 2 * pairs * 32
    assert fwd[0].tflops == pytest.approx(rep.flops_forward / 0.30 / 1e9)
    bwd = rep.direction("backward")
    assert [r.config for r in bwd] == [BWD[1], BWD[0], BWD[2]]
    assert bwd[0].fb_ms == 1.20 and bwd[0].ms == pytest.approx(0.80)
    assert bwd[0].tflops == pytest.approx(2.5 * rep.flops_forward / 0.80 / 1e9)
    assert bwd[0].autotuned and bwd[1].heuristic and bwd[2].status.startswith("cannot run")
    assert rep.backward_baseline_ms == 0.40
    # The backward step runs the heuristic's forward; the box forward was never run.
    assert ("baseline", HEUR_F) in runner.calls and ("backward", BWD[1], HEUR_F) in runner.calls
    assert ("forward", FWD[3]) not in runner.calls
    text = P.format_report(rep)
    lines = text.splitlines()
    i = lines.index("forward:")
    assert lines[i + 3].split()[:2] == ["1", FWD[2]]
    assert "autotuned: forward " + FWD[2] in text
    assert "0.3000" in lines[i + 3] and "yes" in lines[i + 3]
    j = next(k for k, ln in enumerate(lines) if ln.startswith("backward (forward"))
    assert "alone 0.4000 ms" in lines[j]
    assert lines[j + 3].split()[:2] == ["1", BWD[1]] and "0.8000" in lines[j + 3]
    assert "1.2000" in lines[j + 3]


def test_profile_autotuned_na_and_failures(tmp_path):
    prob = problem()
    c = P.list_candidates(prob, api=FakeApi())
    rep = P.profile(prob, timer=fake_timer, runner=FakeRunner(fail={FWD[0]}), candidates=c,
                    progress=False)
    fwd = rep.direction("forward")
    failed = next(r for r in fwd if r.config == FWD[0])
    assert failed.status == "failed: RuntimeError: an illegal memory access was encountered"
    assert failed.rank is None and failed.ms is None
    assert all(r.autotuned is None for r in rep.rows)
    text = P.format_report(rep)
    assert "autotuned: n/a (autotuner not available" in text
    row = next(ln for ln in text.splitlines() if ln.split()[:2] == ["1", FWD[2]])
    assert row.rstrip().endswith("n/a")
    P.write_csv(rep, tmp_path / "r.csv")
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert rows[0].keys() == set(P.CSV_FIELDS) or list(rows[0].keys()) == P.CSV_FIELDS
    assert all(r["autotuned"] == "n/a" for r in rows)
    first = rows[0]
    assert first["direction"] == "forward" and first["config"] == FWD[2] and first["rank"] == "1"
    assert float(first["ms"]) == 0.30 and first["heuristic"] == "no"
    heur = next(r for r in rows if r["config"] == HEUR_F)
    assert heur["heuristic"] == "yes" and float(heur["tflops"]) > 0
    assert next(r for r in rows if r["config"] == FWD[0])["status"].startswith("failed:")
    P.write_json(rep, tmp_path / "r.json")
    doc = json.load(open(tmp_path / "r.json"))
    assert doc["problem"]["shape"] == [32, 24] and doc["problem"]["causal"] == [False, False]
    assert doc["autotuned"]["forward"] is None and doc["flops_backward"] == \
        2.5 * doc["flops_forward"]
    assert len(doc["rows"]) == 8 and doc["rows"][0]["config"] == FWD[2]
    assert all(r["autotuned"] is None for r in doc["rows"])
    assert "median" in doc["timing"]


def test_profile_without_backward():
    prob = problem()
    c = P.list_candidates(prob, api=FakeApi(), backward=False)
    runner = FakeRunner()
    rep = P.profile(prob, timer=fake_timer, runner=runner, candidates=c, backward=False,
                    progress=False)
    assert {r.direction for r in rep.rows} == {"forward"}
    assert not any(call[0] in ("baseline", "backward") for call in runner.calls)
    assert "backward (" not in P.format_report(rep)


def test_main_times_with_fakes(tmp_path, capsys):
    j = tmp_path / "p.json"
    rc = P.main(BASE + ["--json", str(j), "--no-progress"], api=FakeApi(), runner=FakeRunner(
        auto=dict(forward=FWD[1], backward=None, note="")), timer=fake_timer)
    assert rc == 0
    out = capsys.readouterr().out
    assert "forward:" in out and "backward (forward" in out and f"wrote {j}" in out
    doc = json.load(open(j))
    assert [r["config"] for r in doc["rows"] if r["direction"] == "forward"][0] == FWD[2]
    assert next(r for r in doc["rows"] if r["config"] == FWD[1])["autotuned"] is True
    assert all(r["autotuned"] is None for r in doc["rows"] if r["direction"] == "backward")


def test_main_nothing_runs(capsys):
    class NothingRuns(FakeApi):
        def fused_plan(self, *a, **k):
            raise NotImplementedError("no")
    rc = P.main(BASE, api=NothingRuns(), runner=FakeRunner(), timer=fake_timer)
    assert rc == 1 and "no candidate configuration can run" in capsys.readouterr().err


def test_progress_bar():
    prob = problem()
    c = P.list_candidates(prob, api=FakeApi())
    buf = io.StringIO()
    P.profile(prob, timer=fake_timer, runner=FakeRunner(), candidates=c, stream=buf)
    text = buf.getvalue()
    assert "\r[" in text and text.endswith("\n") and "7/7 done" in text  # 4 + 2 + baseline
    assert FWD[0] in text
    small = P.list_candidates(prob, api=FakeApi(fwd=FWD[:3]), backward=False)
    buf = io.StringIO()
    P.profile(prob, timer=fake_timer, runner=FakeRunner(), candidates=small, backward=False,
              stream=buf)
    assert buf.getvalue() == ""  # 3 candidates: no bar


# ---- FLOPs ---------------------------------------------------------------------------------------

def test_attended_pairs_causal_axis():
    prob = P.parse_args(["--shape", "20x9", "--kernel", "5x3", "--causal", "1x0", "--dilation",
                         "2x1", "--heads", "1", "--dim", "8"])[0]
    # Causal, dilation 2: each dilation group of 10 is a causal 1-D axis of window 5.
    per_group = sum(min(i + 1, 5) for i in range(10))
    assert P.attended_pairs(prob) == 2 * per_group * 9 * 3
    prob.dim_v = 24
    assert P.forward_flops(prob) == 2.0 * 1 * 1 * P.attended_pairs(prob) * (8 + 24)


# ---- GPU: end to end -----------------------------------------------------------------------------

def _gpu():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and fna.backend_compiled("cuda-fused")


@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU and cuda-fused")
def test_gpu_profile_small_2d_end_to_end(tmp_path):
    # The autotuner's disk cache (the autotuned pick) in the test's directory, not the user's.
    env = dict(os.environ, FNA_CACHE_DIR=str(tmp_path / "autotune"))
    argv = ["--shape", "24x20", "--kernel", "5x7", "--heads", "2", "--dim", "32", "--batch", "1",
            "--dtype", "bfloat16", "--reps", "2", "--warmup", "1"]
    r = subprocess.run([sys.executable, "-m", "fna.profiler", "--dry-run"] + argv,
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    plan = fna.fused_plan((1, 24, 20, 2, 32), (5, 7), dtype="bfloat16")
    assert plan["config"] in r.stdout and "forward candidates:" in r.stdout
    j, c = tmp_path / "p.json", tmp_path / "p.csv"
    r = subprocess.run([sys.executable, "-m", "fna.profiler", "--json", str(j), "--csv", str(c)]
                       + argv, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "forward:" in r.stdout and "backward (forward" in r.stdout
    doc = json.load(open(j))
    rows = doc["rows"]
    assert doc["heuristic"]["forward"] == plan["config"]
    fwd = [x for x in rows if x["direction"] == "forward"]
    ok = [x for x in fwd if x["status"] == "ok"]
    assert ok and all(x["ms"] > 0 and x["tflops"] > 0 for x in ok), fwd
    assert [x["ms"] for x in ok] == sorted(x["ms"] for x in ok)
    heur = [x for x in fwd if x["heuristic"]]
    assert len(heur) == 1 and heur[0]["status"] == "ok" and heur[0]["rank"] >= 1
    assert all(x["status"] == "ok" or x["status"].startswith("cannot run") for x in fwd), fwd
    bwd = [x for x in rows if x["direction"] == "backward"]
    assert any(x["status"] == "ok" and x["fb_ms"] > 0 for x in bwd), bwd
    assert sum(x["heuristic"] for x in bwd) == 1
    # The autotuned pick is marked where the build has the autotuner, "n/a" (null) otherwise.
    if doc["autotuned"]["forward"] is not None:
        assert sum(x["autotuned"] is True for x in fwd) == 1
    else:
        assert all(x["autotuned"] is None for x in fwd)
    assert len(list(csv.DictReader(open(c)))) == len(rows)
    assert np.isfinite(doc["flops_forward"]) and doc["pairs"] == 24 * 5 * 20 * 7


def test_through_fna_bench():
    """`fna-bench profile ...` (the installed command, fna._bench) is this profiler's command line:
    its help and its errors carry that name, and without the fused backend it says so (exit 1)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "fna._bench", "profile", *args],
                              capture_output=True, text=True, timeout=120, env=env)

    h = run("--help")
    assert h.returncode == 0 and h.stdout.startswith("usage: fna-bench profile"), h.stdout + h.stderr
    assert "--dry-run" in h.stdout
    bad = run("--shape", "0x4", "--kernel", "3", "--heads", "2", "--dim", "16")
    assert bad.returncode == 2 and "fna-bench profile: error: argument --shape" in bad.stderr, \
        bad.stderr
    if not fna.backend_compiled("cuda-fused"):
        r = run("--shape", "16x16", "--kernel", "3", "--heads", "2", "--dim", "16", "--dry-run")
        assert r.returncode == 1 and "fna-bench profile: error: cuda-fused is not available" \
            in r.stderr, r.stderr
