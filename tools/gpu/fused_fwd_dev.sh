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
         "--rank 1 --dim 128 --config fna_fwd_sm80_bf16_d128_q128_kv64_w8" \
         "--rank 2 --dim 128 --config fna_fwd_sm80_bf16_d128_q8x16_kv8x8_w8" \
         "--rank 2 --dim 128 --config fna_fwd_sm80_bf16_d128_q8x8_kv8x8_w4" \
         "--rank 3 --dim 128 --config fna_fwd_sm80_bf16_d128_q2x8x8_kv2x4x8_w8" \
         "--rank 3 --dim 128 --config fna_fwd_sm80_bf16_d128_q4x4x8_kv4x4x4_w4" \
         "--rank 3 --dim 128 --config fna_fwd_sm80_bf16_d128_q2x4x8_kv2x4x8_w4"; do
  echo "== fwd $a"
  timeout 90 $T --backend cuda-fused --filter fwd --dtype bfloat16 $a > "$OUT/t.log" 2>&1
  echo "rc=$?"; grep -E "^FAIL" -A3 "$OUT/t.log" | head -12; tail -1 "$OUT/t.log"
done
echo "== memcheck"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $T --backend cuda-fused --filter fwd --dim 64 \
  --dtype bfloat16 --cases 2 --sanitize 2>&1 | tail -4
echo "== timing"
nvcc -std=c++17 -O2 -arch=sm_90 -Iinclude -Isrc tools/gpu/fused_fwd_timing.cu build/gpu/libfna.a -lpthread -o /tmp/ft \
  && timeout 200 /tmp/ft ${1:-}
