#!/usr/bin/env bash
# Two fna-bench binaries on issue 2's problem next to the FMA peak of the same minute: `rounds`
# times, the peak, then A's and B's `--repeats 30 --warmup 3 --backend cpu --mode fwd`; each
# round also lists any process above 20% CPU at its start (another developer's compiles).
#   bash tools/cpu_peak/measure_ab.sh path/to/A/fna-bench path/to/B/fna-bench [rounds]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
a=$1 b=$2 rounds=${3:-10}
g++ -O2 -std=c++17 -pthread "$here/fma_peak.cpp" -o /tmp/fna_fma_peak
flops=$(python3 -c "print(4*1*4*128*128*169*64)")  # docs/semantics.md section 3: 4 B H N W D
for r in $(seq "$rounds"); do
  busy=$(top -b -n 1 -w 200 | awk '$1 ~ /^[0-9]+$/ && $9+0 > 20 {print $12}' | tr '\n' ' ')
  peak=$(/tmp/fna_fma_peak 2 5 | sed -E 's/.*median ([0-9.]+).*/\1/')
  ma=$("$a" --repeats 30 --warmup 3 --backend cpu --mode fwd | awk '$1 == "cpu" {print $2}')
  mb=$("$b" --repeats 30 --warmup 3 --backend cpu --mode fwd | awk '$1 == "cpu" {print $2}')
  python3 -c "
ga, gb = $flops / ($ma * 1e6), $flops / ($mb * 1e6)
print(f'round $r $(date +%H:%M:%S): peak {$peak:.0f} GFLOP/s  A {$ma} ms = {100 * ga / $peak:.1f}%  B {$mb} ms = {100 * gb / $peak:.1f}%  B/A {$mb / $ma:.3f}  busy [$busy]')"
done
