"""Before / after: the cuda-fused backend of two source trees on the standard problem set, timed in
the same run (`bash tools/gpu/run.sh before-after` builds both and runs this in each tree in turn, round after
round, so the machine's drift hits both alike).

    python3 bench/before_after.py run --tag after --out results.jsonl [--reps 10]
    python3 bench/before_after.py table before.jsonl after.jsonl

`run` times forward and forward+backward (GPU time, gpu_bench.py's method) of the fna on
PYTHONPATH for every standard problem x {base, dil2, causal0} x {bf16, fp16} and appends one JSON
line per (problem, variant, dtype) to --out. `table` prints, per row, the median over rounds of
each tree and their ratio (after / before; above 1 is slower).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def run(args):
    import torch

    import fna
    from gpu_bench import PROBLEMS, make_case, timed

    with open(args.out, "a") as f:
        for name in args.problems.split(","):
            for variant in ("base", "dil2", "causal0"):
                for dt_name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
                    case = make_case(name, variant)
                    B, H, shape, D = case["B"], case["H"], case["shape"], case["D"]
                    g = torch.Generator(device="cuda").manual_seed(0)
                    q, k, v = (torch.randn(B, *shape, H, D, device="cuda", dtype=dt, generator=g)
                               for _ in range(3))
                    na = {1: fna.na1d, 2: fna.na2d, 3: fna.na3d}[len(shape)]
                    kw = dict(kernel_size=case["kernel"], dilation=case["dilation"],
                              is_causal=case["causal"], backend="cuda-fused")
                    fwd_ms, _ = timed(lambda: na(q, k, v, **kw), args.reps, args.warmup)
                    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
                    go = torch.randn_like(q)

                    def step():
                        qg.grad = kg.grad = vg.grad = None
                        na(qg, kg, vg, **kw).backward(go)

                    fb_ms, _ = timed(step, args.reps, args.warmup)
                    row = dict(tag=args.tag, problem=name, variant=variant, dtype=dt_name,
                               fwd_ms=fwd_ms, fb_ms=fb_ms, device=torch.cuda.get_device_name())
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(f"{args.tag} {name} {variant} {dt_name}: fwd {fwd_ms:.3f} ms, "
                          f"fwd+bwd {fb_ms:.3f} ms", flush=True)
                    del q, k, v, qg, kg, vg, go
                    torch.cuda.empty_cache()


def table(args):
    def load(path):
        rows = {}
        for line in open(path):
            r = json.loads(line)
            rows.setdefault((r["problem"], r["variant"], r["dtype"]), []).append(r)
        return rows

    a, b = load(args.before), load(args.after)
    print("| problem | variant | dtype | fwd before ms | fwd after ms | after / before | "
          "f+b before ms | f+b after ms | after / before |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    for key in sorted(a, key=lambda k: list(a).index(k)):
        if key not in b:
            continue
        fa = statistics.median(r["fwd_ms"] for r in a[key])
        fb = statistics.median(r["fwd_ms"] for r in b[key])
        ga = statistics.median(r["fb_ms"] for r in a[key])
        gb = statistics.median(r["fb_ms"] for r in b[key])
        worst = max(worst, fb / fa, gb / ga)
        print(f"| {key[0]} | {key[1]} | {key[2]} | {fa:.3f} | {fb:.3f} | {fb / fa:.3f} | "
              f"{ga:.3f} | {gb:.3f} | {gb / ga:.3f} |")
    rounds = min(len(v) for v in list(a.values()) + list(b.values()))
    print(f"\nrounds: {rounds}; largest after / before: {worst:.3f}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--tag", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--problems", default="1d-long,2d-nat,2d-large,3d-video")
    r.add_argument("--reps", type=int, default=10)
    r.add_argument("--warmup", type=int, default=3)
    t = sub.add_parser("table")
    t.add_argument("before")
    t.add_argument("after")
    args = ap.parse_args()
    run(args) if args.cmd == "run" else table(args)


if __name__ == "__main__":
    main()
