#!/usr/bin/env bash
# Nsight Compute on cuda-gemm's kernels (run on the device after `tools/gpu/run.sh build`):
#   bash tools/experiments/gemm_ncu.sh [problem]   (a problem of bench/unfused_gpu.py; 2d-nat)
# $OUT/gemm_ncu.txt: speed of light, warp states, occupancy of every pn / nn / in launch of
# tools/experiments/gemm_profile.py (qk, av, qk backward, av backward); then the SASS hot spots
# (stall samples and instructions by opcode, tools/experiments/ncu_hot.py's summary) of the first
# launch of each kernel in $OUT/gemm_hot_<kernel>.txt.
set -u
OUT=${OUT:-/tmp/fna-out}
p=${1:-2d-nat}
ncu -k regex:"^(pn|nn|in)(_full)?_kernel" --section SpeedOfLight --section WarpStateStats \
  --section Occupancy --section LaunchStats \
  python3 tools/experiments/gemm_profile.py "$p" > "$OUT/gemm_ncu.txt" 2>&1
for k in pn_kernel pn_full_kernel nn_kernel nn_full_kernel in_kernel; do
  ncu -k regex:"^$k" --launch-count 1 --section SourceCounters -f -o /tmp/gemm_hot_$k \
    python3 tools/experiments/gemm_profile.py "$p" > /dev/null 2>&1
  [ -f /tmp/gemm_hot_$k.ncu-rep ] || continue  # this problem does not run that kernel
  ncu -i /tmp/gemm_hot_$k.ncu-rep --page source --csv --print-source sass > /tmp/gemm_hot_$k.csv
  python3 tools/experiments/ncu_hot.py "$p" $k --csv /tmp/gemm_hot_$k.csv --top 30 \
    > "$OUT/gemm_hot_$k.txt" 2>&1
done
