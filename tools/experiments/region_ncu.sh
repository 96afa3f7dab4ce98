#!/usr/bin/env bash
# Nsight Compute sections of the forward kernel of the whole 3d-video call and of rank R's region
# call (tools/experiments/region_cost.py's cases, 4 ranks), side by side: time, throughput, memory,
# occupancy, warp states. Run on the device after `tools/gpu/run.sh build`:
#   bash tools/experiments/region_ncu.sh [R] [extra region_cost.py arguments]
# region_cost.py launches each case 13 times (3 warm-up, 10 timed): the whole call's kernels are
# launches 0-12, rank R's 13-25.
set -uo pipefail
r=${1:-1}
shift $(( $# < 1 ? $# : 1 ))
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
for skip in 2 15; do
  ncu -k regex:fna_fwd --launch-skip $skip --launch-count 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    --metrics smsp__inst_executed.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum \
    python3 tools/experiments/region_cost.py --only-ranks "$r" "$@"
done
