"""fna.profiler: the cuda-fused configurations of one problem, listed and timed (issue 31).

    python -m fna.profiler --shape 128x128 --kernel 13 --heads 8 --dim 64 --batch 8 \\
        --dtype bfloat16 [--dry-run] [--no-backward] [--csv FILE] [--json FILE]

For the problem given on the command line it lists the forward and backward candidate
configurations (``fna.fused_configs`` / ``fna.fused_backward_configs``) with their kernel family,
tiles and tiling efficiency (``needed_fraction`` of ``fna.fused_plan``), and whether each can run
the problem on this device; ``--dry-run`` stops there. Otherwise it times every candidate that
can run and prints one table per direction, sorted by time, with the heuristic's pick (the plan's
choice without a configuration) and the autotuned pick (``tuning="auto"``; "n/a" where this build
has no autotuner) marked.

Timing is GPU time, as bench/gpu_bench.py measures it: CUDA events around each call, each call
queued behind a short GPU spin so its host work is not timed, the median of ``--reps`` calls after
``--warmup`` calls. The forward rows time ``na*d(..., config=NAME)``. The backward rows time one
training step, forward with the heuristic's forward configuration and then the backward with
``backward_config=NAME`` (``torch.autograd.grad``), and report that step's time minus the time of
the same forward alone (inputs requiring grad, so it records the graph as in the step): ``ms`` is
the backward's share, ``f+b ms`` the whole step. Effective TFLOP/s count FLOPs as
docs/semantics.md section 3.1 (forward ``2 * B * H * P * (D + D_v)``, ``P`` the attended
(query, key) pairs, counted as ``fna.flops`` does; backward 2.5x that).

The timing function is injectable: :func:`profile` takes ``timer(fn) -> ms`` and a runner that
makes the callables, so the table / CSV / JSON logic runs anywhere (tests use fakes).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from . import _flops

__all__ = ["Problem", "Candidate", "Candidates", "Row", "Report", "parse_args", "build_parser",
           "list_candidates", "attended_pairs", "forward_flops", "gpu_timer", "TorchRunner",
           "profile", "format_dry_run", "format_report", "write_csv", "write_json", "main"]

PROG = "python -m fna.profiler"

DTYPES = {"float32": "float32", "fp32": "float32", "f32": "float32",
          "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}

# Progress bar on stderr when a sweep has more candidates than this.
PROGRESS_MIN = 5



# ---- the problem ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Problem:
    shape: tuple
    kernel: tuple
    dilation: tuple
    stride: tuple
    causal: tuple
    batch: int = 1
    heads: int = 1
    heads_kv: int = 1
    dim: int = 64
    dim_v: int = 64
    dtype: str = "bfloat16"
    device: int = 0
    allow_tf32: bool = False

    @property
    def rank(self):
        return len(self.shape)

    @property
    def query_shape(self):
        return (self.batch, *self.shape, self.heads, self.dim)

    @property
    def config_dim(self):
        """The head dim the configuration lists are keyed by: max(D, D_v)."""
        return max(self.dim, self.dim_v)

    def plan_kwargs(self):
        return dict(stride=self.stride, dilation=self.dilation, is_causal=self.causal,
                    dtype=self.dtype, heads_kv=self.heads_kv, dim_v=self.dim_v,
                    allow_tf32=self.allow_tf32, device_index=self.device)

    def describe(self):
        x = lambda t: "x".join(str(int(e)) for e in t)  # noqa: E731
        return (f"{self.rank}-D {x(self.shape)}, kernel {x(self.kernel)}, dilation "
                f"{x(self.dilation)}, stride {x(self.stride)}, causal {x(self.causal)}, batch "
                f"{self.batch}, heads {self.heads} (kv {self.heads_kv}), dim {self.dim} "
                f"(v {self.dim_v}), {self.dtype}" + (", allow_tf32" if self.allow_tf32 else "")
                + f", device {self.device}")

    def to_dict(self):
        d = dataclasses.asdict(self)
        for k in ("shape", "kernel", "dilation", "stride"):
            d[k] = [int(e) for e in d[k]]
        d["causal"] = [bool(e) for e in d["causal"]]
        return d


# ---- command line --------------------------------------------------------------------------------

def _axes_text(text):
    """"13" or "13x7" (also "13,7") -> tuple of ints, as fna-bench reads per-axis values."""
    parts = text.replace("X", "x").replace(",", "x").split("x")
    try:
        vals = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an integer or a list of integers such as 13x7") from None
    if not 1 <= len(vals) <= 3:
        raise argparse.ArgumentTypeError(f"{text!r} has {len(vals)} entries (1 to 3 axes)")
    return vals


def _positive(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1")
    return v


def _non_negative(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} must be >= 0")
    return v


def _dtype(text):
    if text.lower() not in DTYPES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not one of float32, float16, bfloat16 (or fp32, fp16, bf16)")
    return DTYPES[text.lower()]


def build_parser(prog=PROG):
    ap = argparse.ArgumentParser(
        prog=prog,
        description="List and time the cuda-fused configurations of one neighborhood-attention "
                    "problem: forward and backward, sorted by GPU time, with the heuristic's and "
                    "the autotuner's picks marked.",
        epilog="Per-axis values: '13' (every axis) or '13x7' (one per axis), as fna-bench.")
    ap.add_argument("--shape", type=_axes_text, required=True,
                    help="token grid, e.g. 128x128; its number of axes is the rank (1 to 3)")
    ap.add_argument("--kernel", type=_axes_text, required=True, help="window per axis")
    ap.add_argument("--dilation", type=_axes_text, default=(1,), help="per axis (default 1)")
    ap.add_argument("--stride", type=_axes_text, default=(1,), help="per axis (default 1)")
    ap.add_argument("--causal", type=_axes_text, default=(0,),
                    help="per-axis causal flags 0 / 1, e.g. 1x0 (default 0)")
    ap.add_argument("--batch", type=_positive, default=1, help="batch size (default 1)")
    ap.add_argument("--heads", type=_positive, required=True, help="query heads")
    ap.add_argument("--heads-kv", type=_positive, default=None,
                    help="key / value heads (GQA / MQA; default --heads)")
    ap.add_argument("--dim", type=_positive, required=True, help="query / key head dim")
    ap.add_argument("--dim-v", type=_positive, default=None, help="value head dim (default --dim)")
    ap.add_argument("--dtype", type=_dtype, default="bfloat16",
                    help="float32, float16 or bfloat16 (default bfloat16)")
    ap.add_argument("--allow-tf32", action="store_true",
                    help="float32: plain TF32 products (default: split TF32)")
    ap.add_argument("--dry-run", action="store_true",
                    help="list the candidates (family, tiles, needed_fraction, whether each runs "
                         "here) without timing")
    ap.add_argument("--backward", dest="backward", action=argparse.BooleanOptionalAction,
                    default=True, help="also time the backward configurations (default: yes)")
    ap.add_argument("--reps", type=_positive, default=10, help="timed calls per candidate (median)")
    ap.add_argument("--warmup", type=_non_negative, default=3, help="untimed calls first")
    ap.add_argument("--csv", metavar="FILE", default=None, help="write every row as CSV")
    ap.add_argument("--json", metavar="FILE", default=None, help="write the report as JSON")
    ap.add_argument("--device", type=_non_negative, default=0, help="CUDA device index")
    ap.add_argument("--no-progress", dest="progress", action="store_false",
                    help="no progress bar on stderr")
    return ap


def _per_axis(ap, flag, vals, rank):
    if len(vals) == 1:
        return vals * rank
    if len(vals) != rank:
        ap.error(f"argument {flag}: {'x'.join(map(str, vals))} has {len(vals)} entries for a "
                 f"rank-{rank} problem (--shape has {rank} axes)")
    return vals


def parse_args(argv=None, prog=PROG):
    """(Problem, argparse.Namespace) from the command line; argparse errors (exit code 2, a
    message naming the flag) for anything invalid."""
    ap = build_parser(prog)
    a = ap.parse_args(argv)
    rank = len(a.shape)
    for i, L in enumerate(a.shape):
        if L < 1:
            ap.error(f"argument --shape: axis {i} has length {L}; lengths must be >= 1")
    kernel = _per_axis(ap, "--kernel", a.kernel, rank)
    dilation = _per_axis(ap, "--dilation", a.dilation, rank)
    stride = _per_axis(ap, "--stride", a.stride, rank)
    causal = _per_axis(ap, "--causal", a.causal, rank)
    for i in range(rank):
        if kernel[i] < 1:
            ap.error(f"argument --kernel: axis {i} is {kernel[i]}; must be >= 1")
        if dilation[i] < 1:
            ap.error(f"argument --dilation: axis {i} is {dilation[i]}; must be >= 1")
        if kernel[i] * dilation[i] > a.shape[i]:
            ap.error(f"argument --kernel: axis {i}: kernel {kernel[i]} * dilation {dilation[i]} "
                     f"exceeds the length {a.shape[i]} of --shape")
        if not 1 <= stride[i] <= kernel[i]:
            ap.error(f"argument --stride: axis {i} is {stride[i]}; must be in [1, kernel "
                     f"{kernel[i]}]")
        if causal[i] not in (0, 1):
            ap.error(f"argument --causal: axis {i} is {causal[i]}; flags are 0 or 1")
    heads_kv = a.heads if a.heads_kv is None else a.heads_kv
    if a.heads % heads_kv:
        ap.error(f"argument --heads-kv: --heads {a.heads} is not a multiple of --heads-kv "
                 f"{heads_kv}")
    if a.allow_tf32 and a.dtype != "float32":
        ap.error(f"argument --allow-tf32: applies to float32 only (--dtype is {a.dtype})")
    prob = Problem(shape=tuple(a.shape), kernel=tuple(kernel), dilation=tuple(dilation),
                   stride=tuple(stride), causal=tuple(bool(c) for c in causal), batch=a.batch,
                   heads=a.heads, heads_kv=heads_kv, dim=a.dim,
                   dim_v=a.dim if a.dim_v is None else a.dim_v, dtype=a.dtype, device=a.device,
                   allow_tf32=a.allow_tf32)
    return prob, a


# ---- candidates ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Candidate:
    direction: str            # "forward" or "backward"
    name: str
    family: str = ""
    tiles: str = ""
    needed_fraction: float | None = None
    runs: bool = True
    reason: str = ""          # why it cannot run here (runs False)
    heuristic: bool = False
    own: bool = False         # the plan's own backward tiles (not a listed name: run without one)


@dataclasses.dataclass
class Candidates:
    forward: list
    backward: list
    heuristic_forward: str | None = None
    heuristic_backward: str | None = None
    heuristic_error: str = ""  # why the heuristic's plan is unknown (e.g. no device)


def _tiles(*pairs):
    return " ".join(f"{label}{'x'.join(str(int(e)) for e in t)}" for label, t in pairs if t)


def _family_of(name):
    # fna_fwd_<family>_... / fna_bwd_<family>_...
    parts = name.split("_")
    return parts[2] if len(parts) > 2 else ""


def _tiles_of(name):
    # The tile fields of a name, after family, dtype and head dim: q8x16 kv8x8 (forward),
    # q64 b16x16 (box / strip), kv8x16 q8x8 dqq8x8 dqkv8x8 (backward); not the warps (w12).
    return " ".join(t for t in name.split("_")[5:]
                    if t.startswith(("q", "kv", "b", "dqq", "dqkv")))


def _reason(exc):
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{type(exc).__name__}: {msg}"


def list_candidates(problem, api=None, backward=True):
    """The forward (and backward) candidates of `problem`: every configuration name of its rank,
    dtype and head dim, each with the plan it would run (family, tiles, needed_fraction) or the
    reason it cannot run here; the heuristic's picks marked. `api` provides fused_configs,
    fused_backward_configs and fused_plan (default: the fna module)."""
    if api is None:
        import fna as api
    qshape, ks, kw = problem.query_shape, problem.kernel, problem.plan_kwargs()
    cands = Candidates(forward=[], backward=[])
    try:
        heur = api.fused_plan(qshape, ks, **kw)
        cands.heuristic_forward = heur.get("config") or None
        cands.heuristic_backward = heur.get("backward_config") or None
    except Exception as exc:  # noqa: BLE001 - no device, or the fused kernels do not take it
        cands.heuristic_error = _reason(exc)
    for name in api.fused_configs(problem.rank, problem.dtype, problem.config_dim):
        c = Candidate("forward", name, family=_family_of(name), tiles=_tiles_of(name),
                      heuristic=name == cands.heuristic_forward)
        try:
            plan = api.fused_plan(qshape, ks, config=name, **kw)
            c.family = plan.get("family") or c.family
            c.tiles = _tiles(("q", plan.get("q_tile")), ("kv", plan.get("kv_tile"))) or c.tiles
            c.needed_fraction = plan.get("needed_fraction")
            if plan.get("config") and plan["config"] != name:
                c.runs, c.reason = False, f"the plan runs {plan['config']} instead"
        except Exception as exc:  # noqa: BLE001 - ValueError / NotImplementedError / no device
            c.runs, c.reason = False, _reason(exc)
        cands.forward.append(c)
    if backward:
        for name in api.fused_backward_configs(problem.rank, problem.dtype, problem.config_dim):
            c = Candidate("backward", name, family=_family_of(name), tiles=_tiles_of(name),
                          heuristic=name == cands.heuristic_backward)
            try:
                plan = api.fused_plan(qshape, ks, backward_config=name, **kw)
                c.family = plan.get("backward_family") or c.family
                c.tiles = _tiles(("kv", plan.get("backward_kv_tile")),
                                 ("q", plan.get("backward_q_tile"))) or c.tiles
                c.needed_fraction = plan.get("backward_needed_fraction")
                if plan.get("backward_config") != name:
                    c.runs = False
                    c.reason = ("the fused backward does not take this problem"
                                if not plan.get("backward_config")
                                else f"the plan runs {plan['backward_config']} instead")
            except Exception as exc:  # noqa: BLE001
                c.runs, c.reason = False, _reason(exc)
            cands.backward.append(c)
        # The plan's own backward tiles are not a listed configuration (the heuristic searches
        # every tile shape): a candidate of their own, run without backward_config.
        hb = cands.heuristic_backward
        if hb and not any(c.name == hb for c in cands.backward):
            cands.backward.insert(0, Candidate("backward", hb, family=heur.get("backward_family", ""),
                                               tiles=_tiles(("kv", heur.get("backward_kv_tile")),
                                                            ("q", heur.get("backward_q_tile"))),
                                               needed_fraction=heur.get("backward_needed_fraction"),
                                               heuristic=True, own=True))
    return cands


# ---- FLOPs ---------------------------------------------------------------------------------------

def attended_pairs(problem, api=None):
    """Sum over queries of the neighborhood size, as ``fna.flops`` counts it (fna._flops, from
    the window of docs/semantics.md section 1.1): the window is a product over axes, so the total
    is a product of per-axis sums; a non-causal axis holds K keys per query, a causal one fewer
    near its start. ``api`` is accepted for compatibility and not used (the count needs no
    extension call)."""
    return _flops.attended_pairs(problem.shape, problem.kernel, problem.stride,
                                 problem.dilation, problem.causal)


def forward_flops(problem, pairs=None):
    """docs/semantics.md 3.1: 2 * B * H * P * (D + D_v) (= 4 * B * H * P * D for D_v = D)."""
    if pairs is None:
        pairs = attended_pairs(problem)
    return 2.0 * problem.batch * problem.heads * pairs * (problem.dim + problem.dim_v)


# ---- timing (fna._profiler_torch) ----------------------------------------------------------------

from ._profiler_torch import TorchRunner, gpu_timer  # noqa: E402,F401  (re-exported)


# ---- profiling -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Row:
    direction: str
    config: str
    family: str
    tiles: str
    needed_fraction: float | None
    ms: float | None = None          # forward: the call; backward: step minus forward
    fb_ms: float | None = None       # backward rows: the whole forward + backward step
    tflops: float | None = None
    heuristic: bool = False
    autotuned: bool | None = False   # None: no autotuned pick known (n/a)
    status: str = "ok"               # "ok", "cannot run: ...", "failed: ..."
    rank: int | None = None          # 1 = fastest of its direction

    def to_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Report:
    problem: Problem
    pairs: int
    flops_forward: float
    rows: list
    heuristic: dict
    autotuned: dict
    backward_baseline_ms: float | None = None
    device: str = ""
    timing: str = ""

    def direction(self, d):
        return [r for r in self.rows if r.direction == d]

    def to_dict(self):
        return dict(problem=self.problem.to_dict(), pairs=self.pairs,
                    flops_forward=self.flops_forward, flops_backward=2.5 * self.flops_forward,
                    device=self.device, timing=self.timing, heuristic=self.heuristic,
                    autotuned=self.autotuned, backward_baseline_ms=self.backward_baseline_ms,
                    rows=[r.to_dict() for r in self.rows])


TIMING_NOTE = ("GPU time (CUDA events behind a GPU spin), median of reps after warm-up; backward "
               "ms = (forward + backward step) - (forward alone, heuristic configuration)")


class Progress:
    """A one-line progress bar on `stream`, shown when `total` > PROGRESS_MIN (and enabled)."""

    def __init__(self, total, stream=None, enabled=True, width=20):
        self.total, self.width = total, width
        self.stream = sys.stderr if stream is None else stream
        self.on = enabled and total > PROGRESS_MIN
        self.done = 0
        self._last = 0

    def step(self, label):
        if not self.on:
            return
        n = self.done
        fill = self.width * n // max(self.total, 1)
        line = f"[{'#' * fill}{'.' * (self.width - fill)}] {n}/{self.total} {label}"[:110]
        pad = " " * max(0, self._last - len(line))
        self.stream.write("\r" + line + pad)
        self.stream.flush()
        self._last = len(line)

    def advance(self):
        self.done += 1

    def close(self):
        if self.on:
            self.step("done")
            self.stream.write("\n")
            self.stream.flush()


def _time_of(r):
    """The time a row is ranked by: the call (forward), the whole step (backward)."""
    if r.status != "ok":
        return None
    return r.fb_ms if r.direction == "backward" else r.ms


def _rank_rows(rows):
    """Timed rows sorted fastest first and numbered, then the others in their listing order."""
    timed = sorted((r for r in rows if _time_of(r) is not None), key=_time_of)
    for i, r in enumerate(timed, 1):
        r.rank = i
    return timed + [r for r in rows if _time_of(r) is None]


def profile(problem, timer=None, runner=None, candidates=None, backward=True, reps=10, warmup=3,
            pairs=None, progress=True, stream=None, autotuned=None):
    """Times every candidate that can run `problem` and returns a Report.

    timer: ``timer(fn) -> ms`` (default: :func:`gpu_timer` with `reps` / `warmup`). runner: makes
    the callables (default: :class:`TorchRunner` on the problem's CUDA device). candidates: a
    :class:`Candidates` (default: :func:`list_candidates`). autotuned: the autotuned picks
    (default: ``runner.autotuned()``); a dict(forward=, backward=, note=). pairs: the attended
    pairs (default: :func:`attended_pairs`)."""
    if candidates is None:
        candidates = list_candidates(problem, backward=backward)
    if runner is None:
        runner = TorchRunner(problem)
    if timer is None:
        timer = gpu_timer(reps, warmup)
    if pairs is None:
        pairs = attended_pairs(problem)
    flops = forward_flops(problem, pairs)
    if autotuned is None:
        try:
            autotuned = runner.autotuned(backward=backward)
        except Exception as exc:  # noqa: BLE001 - the timing of the candidates stands
            autotuned = dict(forward=None, backward=None, note=f"autotuned failed: {_reason(exc)}")
    autotuned = dict(dict(forward=None, backward=None, note=""), **autotuned)

    def auto_mark(direction, name):
        pick = autotuned.get(direction)
        return None if pick is None else pick == name

    cands = list(candidates.forward) + (list(candidates.backward) if backward else [])
    todo = [c for c in cands if c.runs]
    # The backward steps' forward alone is timed once, before the first backward candidate.
    need_baseline = any(c.direction == "backward" for c in todo)
    bar = Progress(len(todo) + need_baseline, stream=stream, enabled=progress)
    rows = []
    baseline_ms, baseline_err, baseline_done = None, "", not need_baseline
    for c in cands:
        if c.direction == "backward" and c.runs and not baseline_done:
            # The forward of the backward step, alone: subtracted from each step's time.
            baseline_done = True
            bar.step("forward of the backward step: " + str(candidates.heuristic_forward))
            try:
                baseline_ms = timer(runner.backward_baseline(candidates.heuristic_forward))
            except Exception as exc:  # noqa: BLE001
                baseline_err = _reason(exc)
            bar.advance()
        row = Row(c.direction, c.name, c.family, c.tiles, c.needed_fraction,
                  heuristic=c.heuristic, autotuned=auto_mark(c.direction, c.name))
        if not c.runs:
            row.status = f"cannot run: {c.reason}"
            rows.append(row)
            continue
        bar.step(c.name)
        try:
            if c.direction == "forward":
                row.ms = timer(runner.forward(c.name))
                row.tflops = flops / row.ms / 1e9 if row.ms > 0 else None
            else:
                row.fb_ms = timer(runner.backward(c.name, candidates.heuristic_forward,
                                                  own=c.own))
                if baseline_ms is not None:
                    row.ms = row.fb_ms - baseline_ms
                    row.tflops = 2.5 * flops / row.ms / 1e9 if row.ms > 0 else None
        except Exception as exc:  # noqa: BLE001 - report it and carry on
            row.status = f"failed: {_reason(exc)}"
        bar.advance()
        rows.append(row)
    bar.close()
    fwd = _rank_rows([r for r in rows if r.direction == "forward"])
    bwd = _rank_rows([r for r in rows if r.direction == "backward"])
    heuristic = dict(forward=candidates.heuristic_forward,
                     backward=candidates.heuristic_backward, note=candidates.heuristic_error)
    rep = Report(problem, pairs, flops, fwd + bwd, heuristic, autotuned,
                 backward_baseline_ms=baseline_ms, timing=TIMING_NOTE)
    if baseline_err:
        rep.heuristic["note"] = (rep.heuristic["note"] + "; " if rep.heuristic["note"] else "") + \
            f"backward baseline failed: {baseline_err}"
    try:
        import torch
        if torch.cuda.is_available():
            rep.device = torch.cuda.get_device_name(problem.device)
    except Exception:  # noqa: BLE001 - informational only
        pass
    return rep


# ---- output (fna._profiler_output) --------------------------------------------------------------

from ._profiler_output import (  # noqa: E402,F401  (re-exported: the profiler's public output API)
    CSV_FIELDS, format_dry_run, format_report, write_csv, write_json)


def _dry_report(problem, candidates):
    """A Report without times (dry run), for --csv / --json."""
    rows = [Row(c.direction, c.name, c.family, c.tiles, c.needed_fraction,
                heuristic=c.heuristic, autotuned=None,
                status="ok" if c.runs else f"cannot run: {c.reason}")
            for c in list(candidates.forward) + list(candidates.backward)]
    return Report(problem, 0, 0.0, rows,
                  dict(forward=candidates.heuristic_forward,
                       backward=candidates.heuristic_backward, note=candidates.heuristic_error),
                  dict(forward=None, backward=None, note="dry run"), timing="dry run (not timed)")


# ---- main ----------------------------------------------------------------------------------------

def main(argv=None, api=None, runner=None, timer=None, autotuned=None, prog=PROG):
    """The command line; returns the exit code (0 ok, 1 nothing to profile / no device, 2 bad
    arguments via argparse). api / runner / timer / autotuned: injected for tests; prog: the
    name messages use (`fna-bench profile` runs this same command line)."""
    problem, args = parse_args(argv, prog)
    if api is None:
        import fna as api

    def fail(msg):
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 1

    if not api.backend_compiled("cuda-fused"):
        return fail("cuda-fused is not available: this build of fna has no fused CUDA kernels "
                    "(it was built without a CUDA compiler), so there are no configurations to "
                    "list or time")
    if not api.fused_configs(problem.rank, problem.dtype, problem.config_dim):
        return fail(f"cuda-fused has no configurations for rank {problem.rank}, {problem.dtype}, "
                    f"head dim {problem.config_dim} (max of --dim and --dim-v)")
    cands = list_candidates(problem, api=api, backward=args.backward)
    if args.dry_run:
        print(format_dry_run(problem, cands))
        report = _dry_report(problem, cands)
    else:
        if runner is None:
            try:
                import torch
            except ImportError:
                return fail("timing needs torch (pip install torch); --dry-run works without it")
            if not torch.cuda.is_available():
                return fail("timing needs a CUDA device, but none is visible (--dry-run lists "
                            "the candidates without one)")
            if problem.device >= torch.cuda.device_count():
                return fail(f"--device {problem.device}: only {torch.cuda.device_count()} CUDA "
                            "device(s) visible")
        if not any(c.runs for c in cands.forward + cands.backward):
            print(format_dry_run(problem, cands))
            return fail("no candidate configuration can run this problem here")
        if runner is None:
            runner = TorchRunner(problem)
        report = profile(problem, timer=timer, runner=runner, candidates=cands,
                         backward=args.backward, reps=args.reps, warmup=args.warmup,
                         progress=args.progress, autotuned=autotuned)
        print(format_report(report))
    if args.csv:
        write_csv(report, args.csv)
        print(f"wrote {args.csv}")
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
