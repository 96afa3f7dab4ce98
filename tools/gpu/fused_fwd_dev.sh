#!/usr/bin/env bash
# Development loop of the fused forward on the device. The device's copy of the repo has no git
# history, so the source to build travels as build/ffwd_src.tar (HEAD plus the fused forward's
# working files, made locally by `bash tools/gpu/fused_fwd_dev.sh pack`; pass it with carry).
#   bash tools/gpu/fused_fwd_dev.sh [timing filter]
set -uo pipefail
if [ "${1:-}" = pack ]; then
  rm -rf /tmp/ffwd-src && mkdir -p /tmp/ffwd-src && git archive HEAD | tar -x -C /tmp/ffwd-src
  cp --parents src/cuda/fused/forward.cu src/cuda/fused/config.h src/cuda/fused/fwd_* \
    src/cuda/fused/tiling.cuh src/cuda/common/mma.cuh tools/gpu/fused_fwd_timing.cu /tmp/ffwd-src/
  mkdir -p build && tar -cf build/ffwd_src.tar -C /tmp/ffwd-src . && ls -la build/ffwd_src.tar
  exit 0
fi
OUT=${OUT:-/tmp/fna-out}
rm -rf /tmp/fna-src && mkdir -p /tmp/fna-src && tar -xf build/ffwd_src.tar -C /tmp/fna-src || exit 1
cd /tmp/fna-src
FNA_INPLACE=1 bash tools/gpu/run.sh build 2>&1 | tail -4
T=./build/gpu/fna-gpu-test
[ -x $T ] || { tail -30 $OUT/build.log; exit 1; }
for a in "--dim 32" "--dim 64 --dtype float16" "--dim 128" "--dim 64 --dim-v 128" "--dim 128 --dim-v 56 --dtype float16" \
         "--dim 256 --cases 8" "--dim 96 --dim-v 40 --cases 12" "" \
         "--rank 2 --dim 128 --config fna_fwd_sm80_bf16_d128_q8x8_kv8x8_w4" \
         "--rank 3 --dim 128 --config fna_fwd_sm80_bf16_d128_q4x4x8_kv4x4x4_w4" \
         "--rank 2 --dim 64 --config fna_fwd_sm80_bf16_d64_q8x8_kv8x8_w4"; do
  echo "== fwd $a"
  timeout 90 $T --backend cuda-fused --filter fwd --dtype bfloat16 $a > "$OUT/t.log" 2>&1
  echo "rc=$?"; grep -E "^FAIL" -A3 "$OUT/t.log" | head -12; tail -1 "$OUT/t.log"
done
echo "== memcheck"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $T --backend cuda-fused --filter fwd --dim 64 \
  --dtype bfloat16 --cases 2 --sanitize 2>&1 | tail -3
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $T --backend cuda-fused --filter fwd --dim 128 \
  --rank 3 --dtype bfloat16 --cases 2 --sanitize 2>&1 | tail -3
echo "== timing"
nvcc -std=c++17 -O2 -arch=sm_90 -Iinclude -Isrc tools/gpu/fused_fwd_timing.cu build/gpu/libfna.a -lpthread -o /tmp/ft \
  && timeout 200 /tmp/ft ${1:-}
if command -v ncu >/dev/null; then
  echo "== ncu"
  for prob in 1d-long 2d-large 3d-video; do
    timeout 90 ncu -k regex:fna_fwd --launch-skip 3 --launch-count 1 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
      /tmp/ft $prob base heuristic > "$OUT/ncu_$prob.txt" 2>&1
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Warp Cycles Per Issued|Stall|L1/TEX Hit|Registers Per" "$OUT/ncu_$prob.txt" | head -24
  done
fi
