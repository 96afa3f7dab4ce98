#!/usr/bin/env bash
# The cpu backend's forward on issue 2's problem next to the FMA peak of the same minute:
# `rounds` times, the peak then `fna-bench --repeats 30 --warmup 3 --backend cpu --mode fwd`.
#   bash tools/cpu_peak/measure.sh [path/to/fna-bench] [rounds]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bench=${1:-build/py/fna-bench}
rounds=${2:-5}
g++ -O2 -std=c++17 -pthread "$here/fma_peak.cpp" -o /tmp/fna_fma_peak
flops=$(python3 -c "print(4*1*4*128*128*169*64)")  # docs/semantics.md section 3: 4 B H N W D
for r in $(seq "$rounds"); do
  peak=$(/tmp/fna_fma_peak 2 5 | sed -E 's/.*median ([0-9.]+).*/\1/')
  ms=$("$bench" --repeats 30 --warmup 3 --backend cpu --mode fwd | awk '$1 == "cpu" {print $2}')
  python3 -c "g=$flops/($ms*1e6); print(f'round $r: peak {$peak:.0f} GFLOP/s, forward {$ms} ms = {g:.1f} GFLOP/s = {100*g/$peak:.1f}% of peak')"
done
