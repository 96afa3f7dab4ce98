"""SM clock and power while a kernel runs back to back: is a forward slow because of its code or
because the GPU lowered its clock (power or thermal limits)?

    python3 tools/experiments/clock_probe.py [--problems 2d-nat] [--variants base] [--seconds 4]
        [--dense]

For each (problem, variant) the cuda-fused forward runs back to back for --seconds while
`nvidia-smi` samples the SM clock, power draw and the active clock-event reasons every 50 ms;
--dense does the same for PyTorch SDPA (cuDNN) on the same tensors, a tensor-core-bound
reference. Prints per run: the forward's mean time, and the samples' median SM clock (MHz),
median / max power (W) and the reasons seen.
"""
import argparse
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fna  # noqa: E402
from gpu_bench import PROBLEMS, make_case  # noqa: E402


def sampled(fn, seconds):
    """Runs fn back to back for `seconds` under nvidia-smi sampling; (ms per call, samples)."""
    q = "clocks.sm,power.draw,clocks_event_reasons.active,temperature.gpu"
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)  # the sampler's first rows are taken before the load
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            fn()
        n += 20
        torch.cuda.synchronize()
    ev1.record()
    torch.cuda.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    rows = [r.split(", ") for r in out.strip().splitlines() if r.count(",") >= 3]
    # Keep the samples of the loaded part: drop the first 10 (before and at the load's start).
    rows = rows[10:] if len(rows) > 20 else rows
    return ev0.elapsed_time(ev1) / n, rows


def summary(rows):
    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else float("nan")
    clk = [float(r[0]) for r in rows if r[0].strip().replace(".", "").isdigit()]
    pw = [float(r[1]) for r in rows if r[1].strip().replace(".", "").isdigit()]
    reasons = sorted({r[2].strip() for r in rows})
    temp = [float(r[3]) for r in rows if r[3].strip().isdigit()]
    return (f"SM clock median {med(clk):.0f} MHz (min {min(clk, default=0):.0f}), power median "
            f"{med(pw):.0f} W max {max(pw, default=0):.0f} W, temp max {max(temp, default=0):.0f} C, "
            f"reasons {reasons} ({len(rows)} samples)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default="2d-nat")
    ap.add_argument("--variants", default="base")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--dense", action="store_true")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    _, idle = sampled(lambda: None, 1.0)
    print(f"idle: {summary(idle)}", flush=True)
    for prob in args.problems.split(","):
        for variant in args.variants.split(","):
            case = make_case(prob, variant)
            B, H, shape, D, kernel = PROBLEMS[prob]
            dt = {"bf16": torch.bfloat16, "fp16": torch.float16,
                  "fp32": torch.float32}[case["dtype"]]
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=dt, generator=g)
                       for _ in range(3))
            fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
            kw = dict(dilation=case["dilation"], is_causal=case["causal"], backend="cuda-fused")
            ms, rows = sampled(lambda: fn(q, k, v, kernel, **kw), args.seconds)
            print(f"{prob} {variant} fna cuda-fused: {ms:.3f} ms; {summary(rows)}", flush=True)
            if args.dense:
                qd, kd, vd = (t.flatten(1, len(shape)).transpose(1, 2) for t in (q, k, v))
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    ms, rows = sampled(
                        lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd),
                        args.seconds)
                print(f"{prob} {variant} sdpa cudnn (dense): {ms:.3f} ms; {summary(rows)}",
                      flush=True)
            del q, k, v


if __name__ == "__main__":
    main()
