"""The output of python -m fna.profiler (fna.profiler): the dry-run listing, the timed tables, CSV
and JSON. Works on the profiler's Report / Candidates objects by their fields."""
from __future__ import annotations

import csv
import json

# ---- output --------------------------------------------------------------------------------------

def _render(headers, rows, right=()):
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    # The last column (status / reason) may be long: its rule spans its header only.
    rule = ["-" * (w if i < len(widths) - 1 else len(headers[i])) for i, w in enumerate(widths)]
    return "\n".join([line(headers), line(rule)] + [line(r) for r in rows])


def _f(x, spec):
    return "-" if x is None else format(x, spec)


def _mark(v):
    return "n/a" if v is None else ("yes" if v else "")


def format_dry_run(problem, candidates):
    """The candidate listing of --dry-run."""
    out = [f"problem: {problem.describe()}"]
    hf, hb = candidates.heuristic_forward, candidates.heuristic_backward
    out.append(f"heuristic: forward {hf or '-'}, backward {hb or '-'}"
               + (f" ({candidates.heuristic_error})" if candidates.heuristic_error else ""))
    for label, cs in (("forward", candidates.forward), ("backward", candidates.backward)):
        n_run = sum(c.runs for c in cs)
        out.append("")
        out.append(f"{label} candidates: {len(cs)} ({n_run} run here)")
        if not cs:
            continue
        rows = [[c.name, c.family, c.tiles, _f(c.needed_fraction, ".3f"),
                 "yes" if c.heuristic else "", "yes" if c.runs else f"cannot run: {c.reason}"]
                for c in cs]
        out.append(_render(["config", "family", "tiles", "needed", "heuristic", "runs here"],
                           rows, right=(3,)))
    return "\n".join(out)


def format_report(report):
    """The tables: per direction, sorted by time (fastest first), then what could not run."""
    p = report.problem
    out = [f"problem: {p.describe()}"]
    if report.device:
        out.append(f"device: {report.device}")
    out.append(f"FLOPs: forward {report.flops_forward / 1e9:.3f} GFLOP "
               f"({report.pairs} attended pairs per batch and head), backward 2.5x")
    out.append(f"timing: {report.timing}")
    h, a = report.heuristic, report.autotuned
    out.append(f"heuristic: forward {h.get('forward') or '-'}, backward "
               f"{h.get('backward') or '-'}" + (f" ({h['note']})" if h.get("note") else ""))
    if a.get("forward") is None and a.get("backward") is None:
        out.append("autotuned: n/a" + (f" ({a['note']})" if a.get("note") else ""))
    else:
        out.append(f"autotuned: forward {a.get('forward') or 'n/a'}, backward "
                   f"{a.get('backward') or 'n/a'}" + (f" ({a['note']})" if a.get("note") else ""))
    for d in ("forward", "backward"):
        rows = report.direction(d)
        if not rows:
            continue
        out.append("")
        if d == "backward":
            out.append(f"backward (forward {h.get('forward') or '-'}, alone "
                       f"{_f(report.backward_baseline_ms, '.4f')} ms, subtracted):")
            headers = ["#", "config", "family", "tiles", "needed", "ms", "f+b ms", "TFLOP/s",
                       "heuristic", "autotuned", "status"]
        else:
            out.append("forward:")
            headers = ["#", "config", "family", "tiles", "needed", "ms", "TFLOP/s", "heuristic",
                       "autotuned", "status"]
        cells = []
        for r in rows:
            c = [_f(r.rank, "d"), r.config, r.family, r.tiles, _f(r.needed_fraction, ".3f"),
                 _f(r.ms, ".4f")]
            if d == "backward":
                c.append(_f(r.fb_ms, ".4f"))
            c += [_f(r.tflops, ".2f"), _mark(r.heuristic), _mark(r.autotuned),
                  "" if r.status == "ok" else r.status]
            cells.append(c)
        right = (0, 4, 5, 6, 7) if d == "backward" else (0, 4, 5, 6)
        out.append(_render(headers, cells, right=right))
    return "\n".join(out)


CSV_FIELDS = ["direction", "rank", "config", "family", "tiles", "needed_fraction", "ms", "fb_ms",
              "tflops", "heuristic", "autotuned", "status"]


def _csv_value(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    return v


def write_csv(report, path):
    """Every row (both directions, ranked first) as CSV; `autotuned` "n/a" where unknown."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in report.rows:
            d = r.to_dict()
            row = {k: _csv_value(d[k]) for k in CSV_FIELDS}
            if r.autotuned is None:
                row["autotuned"] = "n/a"
            w.writerow(row)


def write_json(report, path):
    with open(path, "w") as f:
        json.dump(report.to_dict(), f, indent=1)
        f.write("\n")
