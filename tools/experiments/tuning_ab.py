"""Same-process A/B of cuda-fused kernel variants chosen through Options::tuning (the `tuning=`
keyword; keys: fna.tuning_keys()): for each standard problem and variant, the forward (and with
--bwd the forward+backward) time, rounds alternating between the settings, the plan each setting
runs (fna.fused_plan's forward / backward configuration) and the max difference of each setting's
output from the first's.

    python3 tools/experiments/tuning_ab.py --tuning "fwd_schedule=plain;fwd_schedule=warp_specialized"
        [--problems 1d-long,2d-large] [--variants base,dil2,causal0] [--rounds 3] [--reps 10] [--bwd]
        [--deterministic]

--tuning lists the settings separated by `;`, each a comma-separated K=V list (as
`fna-bench --tuning`) or `-` for the defaults, e.g. "-;fwd_copy=cp_async" or
"bwd_kernel=sm90;bwd_kernel=sm90ws,bwd_copy=cp_async". Prints one line per (problem, variant,
setting): median ms over the rounds' medians, effective TFLOP/s (docs/semantics.md section 3), the
ratio to the first setting, and the output difference. A setting that the problem cannot take
(the asked-for kernel does not apply) prints its error instead.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fna  # noqa: E402
from fwd_configs import timed  # noqa: E402
from gpu_bench import PROBLEMS, attended_pairs, make_case  # noqa: E402


def parse_tunings(text):
    """"K=V,K=V;K=V;-" -> [(label, dict or None)], one per setting (`-`: the defaults)."""
    out = []
    for alt in text.split(";"):
        alt = alt.strip()
        if alt in ("", "-"):
            out.append(("(default)", None))
            continue
        d = {}
        for kv in alt.split(","):
            key, sep, value = kv.partition("=")
            if not sep or not key.strip():
                raise SystemExit(f"--tuning: {kv!r} is not K=V (keys: {', '.join(fna.tuning_keys())})")
            d[key.strip()] = value.strip()
        out.append((alt, d))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tuning", required=True,
                    help="settings separated by ';', each K=V[,K=V..] or '-' (defaults)")
    ap.add_argument("--problems", default=",".join(PROBLEMS),
                    help="comma list of problems of gpu_bench.py's sets (standard or small)")
    ap.add_argument("--variants", default="base")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--bwd", action="store_true", help="also time forward+backward")
    ap.add_argument("--deterministic", action="store_true",
                    help="every call with deterministic=True")
    args = ap.parse_args()
    settings = parse_tunings(args.tuning)
    labels = [label for label, _ in settings]
    width = max(len(label) for label in labels)
    print(f"device: {torch.cuda.get_device_name()}; A/B of tuning {labels}", flush=True)
    for prob in args.problems.split(","):
        for variant in args.variants.split(","):
            case = make_case(prob, variant)
            B, H, shape, D, kernel = (case[k] for k in ("B", "H", "shape", "D", "kernel"))
            dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case["dtype"]]
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn((B, *shape, H, D), device="cuda", dtype=dt, generator=g)
                       for _ in range(3))
            fn = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
            kw = dict(dilation=case["dilation"], is_causal=case["causal"])
            if args.deterministic:
                kw["deterministic"] = True
            flops = 4.0 * B * H * attended_pairs(case) * D
            qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
            do = torch.randn_like(q)

            def fwd(tuning):
                return lambda: fn(q, k, v, kernel, backend="cuda-fused", tuning=tuning, **kw)

            def fwd_bwd(tuning):
                def step():
                    # Fresh gradients each call (as bench/gpu_bench.py), so no accumulation
                    # kernels run after the backward.
                    qg.grad = kg.grad = vg.grad = None
                    out = fn(qg, kg, vg, kernel, backend="cuda-fused", tuning=tuning, **kw)
                    out.backward(do)
                    return out
                return step

            outs, plans, errors = {}, {}, {}
            times = {label: [] for label in labels}
            tbw = {label: [] for label in labels}
            for r in range(args.rounds):
                for label, tuning in settings:
                    if label in errors:
                        continue
                    try:
                        if r == 0:
                            outs[label] = fwd(tuning)().float()
                            plan = fna.fused_plan(list(q.shape), kernel, dtype=dt, tuning=tuning,
                                                  **kw)
                            plans[label] = (plan["config"], plan["backward_config"] or "-")
                        times[label].append(timed(fwd(tuning), args.reps))
                        if args.bwd:
                            tbw[label].append(timed(fwd_bwd(tuning), max(3, args.reps // 2)))
                    except Exception as e:  # noqa: BLE001 - the problem cannot take this setting
                        errors[label] = f"{type(e).__name__}: {str(e)[:140]}"
            base, ref = None, None
            for label in labels:
                if label in errors:
                    print(f"{prob:9s} {variant:8s} {label:{width}s} error: {errors[label]}",
                          flush=True)
                    continue
                ms = sorted(times[label])[len(times[label]) // 2]
                base = base or ms
                ref = outs[label] if ref is None else ref
                diff = (outs[label] - ref).abs().max().item()
                line = (f"{prob:9s} {variant:8s} {label:{width}s} fwd {ms:8.3f} ms "
                        f"{flops / ms / 1e9:7.1f} TFLOP/s x{base / ms:5.3f} maxdiff {diff:.1e}")
                if args.bwd:
                    mb = sorted(tbw[label])[len(tbw[label]) // 2]
                    line += f" | f+b {mb:8.3f} ms {3.5 * flops / mb / 1e9:7.1f} TFLOP/s"
                line += f"  [{plans[label][0]}; bwd {plans[label][1]}]"
                print(line, flush=True)
            del q, k, v, qg, kg, vg, do, outs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
