#!/usr/bin/env bash
# Memory-side counters of one cuda-fused kernel launch under Nsight Compute: time, DRAM bytes,
# L2 hit rate and throughput, and the L2's read / write / reduction sectors (the backward's dQ
# atomics are reductions). Run on the device after `tools/gpu/run.sh build`:
#   bash tools/experiments/ncu_mem.sh 2d-large [bwd|fwd] [--tuning K=V,..] [--config NAME]
# bwd profiles the dK / dV kernel of the second forward+backward call, fwd the forward kernel of
# the third call (tools/experiments/profile_fwd.py); further arguments go to profile_fwd.py.
set -uo pipefail
prob=${1:-2d-large}
what=${2:-bwd}
shift $(( $# < 2 ? $# : 2 ))
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
m=$m,lts__t_sector_hit_rate.pct,lts__throughput.avg.pct_of_peak_sustained_elapsed
m=$m,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_red.sum
if [ "$what" = bwd ]; then
  ncu -k regex:dkdv --launch-skip 1 --launch-count 1 --metrics "$m" \
    python3 tools/experiments/profile_fwd.py "$prob" --bwd "$@"
else
  ncu -k regex:fna_fwd --launch-skip 2 --launch-count 1 --metrics "$m" \
    python3 tools/experiments/profile_fwd.py "$prob" "$@"
fi
