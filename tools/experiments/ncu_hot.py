"""Hot spots of one cuda-fused kernel launch by SASS instruction, from Nsight Compute's source
page: run on the device after `tools/gpu/run.sh build`:

    python3 tools/experiments/ncu_hot.py 2d-nat [fwd|bwd] [--top 40] [--tuning K=V,..] [--config NAME]

Profiles the launch that tools/experiments/ncu_pipes.sh does (SourceCounters section), exports
the SASS source page as CSV and prints warp-stall samples and executed instructions summed per
opcode, then the instructions with the most samples. The raw CSV goes to
$OUT/ncu_hot_<problem>_<what>.csv. Arguments it does not know (--tuning, --config,
--backward-config) go to tools/experiments/profile_fwd.py.
"""
import argparse
import collections
import csv
import io
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("problem")
    ap.add_argument("what", nargs="?", default="fwd")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--csv", help="summarize this exported CSV instead of profiling")
    args, extra = ap.parse_known_args()
    if args.csv:
        with open(args.csv) as f:
            return summarize(f.read(), args)
    out = os.environ.get("OUT", "/tmp/fna-out")
    os.makedirs(out, exist_ok=True)
    rep = f"/tmp/ncu_hot_{args.problem}_{args.what}"
    if args.what == "bwd":
        sel = ["-k", "regex:dkdv", "--launch-skip", "1", "--launch-count", "1"]
        prog = ["python3", "tools/experiments/profile_fwd.py", args.problem, "--bwd", *extra]
    else:
        sel = ["-k", "regex:fna_fwd", "--launch-skip", "2", "--launch-count", "1"]
        prog = ["python3", "tools/experiments/profile_fwd.py", args.problem, *extra]
    subprocess.run(["ncu", *sel, "--section", "SourceCounters", "-f", "-o", rep, *prog],
                   check=True, stdout=subprocess.DEVNULL)
    res = subprocess.run(["ncu", "-i", rep + ".ncu-rep", "--page", "source", "--csv",
                          "--print-source", "sass"], check=True, capture_output=True, text=True)
    path = os.path.join(out, f"ncu_hot_{args.problem}_{args.what}.csv")
    with open(path, "w") as f:
        f.write(res.stdout)
    return summarize(res.stdout, args)


def summarize(raw, args):
    # The first line names the kernel; the header follows.
    text = raw[raw.find('"Address"'):]
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        print(raw[:2000])
        return 1
    keys = list(rows[0].keys())
    src = next(k for k in keys if k and k.lower() == "source")
    samp = next(k for k in keys if k and "Sampling (All" in k)
    inst = next(k for k in keys if k and k.startswith("Instructions Executed"))

    def num(v):
        try:
            return float(str(v).replace(",", ""))
        except ValueError:
            return 0.0

    by_op = collections.defaultdict(lambda: [0.0, 0.0])
    total_s = total_i = 0.0
    for r in rows:
        op = r[src].strip().split(" ")[0]
        if op.startswith("@"):
            op = r[src].strip().split(" ")[1]
        op = op.split(".")[0]
        s, i = num(r[samp]), num(r[inst])
        by_op[op][0] += s
        by_op[op][1] += i
        total_s += s
        total_i += i
    print(f"{args.problem} {args.what}: {total_s:.0f} stall samples, {total_i:.3e} warp "
          f"instructions executed")
    print(f"{'opcode':12s} {'samples %':>9s} {'instr %':>8s}")
    for op, (s, i) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:25]:
        print(f"{op:12s} {100 * s / max(total_s, 1):9.1f} {100 * i / max(total_i, 1):8.1f}")
    print("hottest instructions (samples %, instr %, index, SASS):")
    ranked = sorted(enumerate(rows), key=lambda kv: -num(kv[1][samp]))[:args.top]
    for idx, r in ranked:
        print(f"{100 * num(r[samp]) / max(total_s, 1):6.2f} {100 * num(r[inst]) / max(total_i, 1):6.2f}"
              f" {idx:5d}  {r[src].strip()[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
