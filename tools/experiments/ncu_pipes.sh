#!/usr/bin/env bash
# Where one cuda-fused kernel launch spends its cycles, under Nsight Compute: the speed-of-light
# breakdown (every unit's throughput as a share of its peak, shared memory and the tensor pipe
# included), the compute and memory workload sections, the warp stall reasons and the tensor
# path's executed bf16 operations. Run on the device after `tools/gpu/run.sh build`:
#   bash tools/experiments/ncu_pipes.sh 2d-large [bwd|fwd] [LOG] [--tuning K=V,..] [--config NAME]
# bwd profiles the dK / dV kernel of the second forward+backward call, fwd the forward kernel of
# the third call (tools/experiments/profile_fwd.py; arguments from the first `--...` on go to it).
# The full report goes to LOG (default $OUT/ncu_<problem>_<what>.txt); the lines that matter are
# printed.
set -uo pipefail
prob=${1:-2d-large}
what=${2:-bwd}
OUT=${OUT:-/tmp/fna-out}
shift $(( $# < 2 ? $# : 2 ))
log=$OUT/ncu_${prob}_${what}.txt
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
  log=$1
  shift
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
if [ "$what" = bwd ]; then
  sel=(-k regex:dkdv --launch-skip 1 --launch-count 1)
  args=(python3 tools/experiments/profile_fwd.py "$prob" --bwd "$@")
else
  sel=(-k regex:fna_fwd --launch-skip 2 --launch-count 1)
  args=(python3 tools/experiments/profile_fwd.py "$prob" "$@")
fi
ncu "${sel[@]}" --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  --section WarpStateStats --section Occupancy --print-details all "${args[@]}" > "$log" 2>&1
echo "== $prob $what: $(grep -m1 -E ' (dkdv|fna_fwd)' "$log" | sed 's/^ *//' | cut -c1-110)"
# The breakdown rows (units at their share of peak), the workload summaries and the stalls.
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|  (sm|l1tex|lts|dram|smsp|gpu|idc|fbpa)__[a-z_]+[^ ]* +%|Issue Slots Busy|Executed Ipc Active|Mem Busy|Max Bandwidth|Mem Pipes Busy|L1/TEX Hit|L2 Hit|Stall|Warp Cycles Per Issued|Achieved Occupancy|Shared Memory" "$log" \
  | sed 's/  */ /g' | head -80
# The tensor path's bf16 operations: executed FLOPs over the kernel's time.
ncu "${sel[@]}" --metrics gpu__time_duration.sum,sm__ops_path_tensor_src_bf16_dst_fp32.sum \
  "${args[@]}" 2>&1 | grep -E "gpu__time_duration|sm__ops_path" | sed 's/  */ /g' | tee -a "$log"
