#!/usr/bin/env bash
# One call on the device machine: build fna for sm_90, then run the named steps.
#   bash tools/gpu/run.sh [build] [test] [pytest] [sanitize] [bench] [bench-quick] [cli]
# Logs go to $OUT (the device tool brings them back); a short table is printed last.
# Extra arguments for the GPU suite can be passed in GPU_TEST_ARGS, for the benchmark in BENCH_ARGS.
set -uo pipefail
OUT=${OUT:-/tmp/fna-out}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(test)
export PYTHONUNBUFFERED=1
# Build what is committed (HEAD), not the shared working tree, where teammates' files may be half
# written. FNA_INPLACE=1 builds the working tree as it is. The device's copy has no git history:
# there, carry `git archive HEAD -o build/head.tar`, untar it and run with FNA_INPLACE=1 and
# FNA_COMMIT=$(git get-tar-commit-id < build/head.tar).
if [ -z "${FNA_INPLACE:-}" ] && git rev-parse -q --verify HEAD >/dev/null 2>&1; then
  rm -rf /tmp/fna-src && mkdir -p /tmp/fna-src && git archive HEAD | tar -x -C /tmp/fna-src && cd /tmp/fna-src \
    || { echo "could not export HEAD"; exit 1; }
fi
summary=()
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
# FNA_COMMIT names the commit when the tree came as a tarball (`git get-tar-commit-id < tar`).
echo "commit: ${FNA_COMMIT:-$(git -C "$OLDPWD" rev-parse --short HEAD 2>/dev/null || echo unknown)} in $PWD, $(date -u +%FT%TZ)" | tee -a "$OUT/gpu.txt"

t0=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFNA_CUDA=ON -DFNA_CUDA_ARCHS=${FNA_CUDA_ARCHS:-90} \
  -DFNA_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" -DFNA_TESTS=OFF > "$OUT/build.log" 2>&1 \
  && cmake --build build/gpu -j 16 >> "$OUT/build.log" 2>&1
rc=$?
summary+=("build: rc=$rc ($(( $(date +%s) - t0 ))s)")
if [ $rc -ne 0 ]; then
  grep -E "error|Error" "$OUT/build.log" | head -40
  tail -20 "$OUT/build.log"
  printf '%s\n' "${summary[@]}"
  exit 1
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}

# One cuda-fused part of the GPU suite (`fwd` / `bwd`) under environment settings NAME=VALUE...,
# logged to $OUT/LOG.log:  suite FILTER LOG NAME=VALUE...
suite() {
  local filter=$1 log=$2
  shift 2
  env "$@" ./build/gpu/fna-gpu-test --backend cuda-fused --filter "$filter" > "$OUT/$log.log" 2>&1
  local rc=$?
  summary+=("gpu-test $filter $*: rc=$rc $(tail -1 "$OUT/$log.log")")
}

for s in "${steps[@]}"; do
  t0=$(date +%s)
  case "$s" in
    build) continue ;;
    test)
      ./build/gpu/fna-gpu-test ${GPU_TEST_ARGS:-} 2>&1 | tee "$OUT/gpu_test.log" | tail -40
      rc=${PIPESTATUS[0]}
      summary+=("gpu-test: rc=$rc $(tail -1 "$OUT/gpu_test.log") ($(( $(date +%s) - t0 ))s)")
      # The sm90 forward's other kernel for 128-query tiles (plain for 2-D / 3-D, warp-specialized
      # for 1-D), which the default run does not reach: FNA_SM90_WS forces each one.
      for ws in 0 1; do suite fwd "gpu_test_ws$ws" "FNA_SM90_WS=$ws"; done
      # The sm90 backward's dK / dV kernels where the default does not run them: the plain one at
      # head dim 128, the warp-specialized one at 64 (FNA_BWD_SM90_WS forces one everywhere).
      for ws in 0 1; do suite bwd "gpu_test_bwd_ws$ws" "FNA_BWD_SM90_WS=$ws"; done
      # The plain sm90 forward's two row copies (spread at head dim 64, per thread at 128 by
      # default): FNA_FWD_SM90_SPREAD forces each one everywhere.
      for sp in 0 1; do suite fwd "gpu_test_spread$sp" "FNA_FWD_SM90_SPREAD=$sp"; done
      # The warp-specialized forward's persistent mode (off by default, FNA_SM90_PERSIST=1), on
      # every rank.
      suite fwd gpu_test_persist FNA_SM90_WS=1 FNA_SM90_PERSIST=1
      # The warp-specialized kernels' cp.async copies where TMA is the default (FNA_FWD_TMA=0,
      # FNA_BWD_TMA=0), with the forward's warp-specialized kernel on every rank.
      suite fwd gpu_test_tma0 FNA_SM90_WS=1 FNA_FWD_TMA=0
      # The strip forward's cp.async band copies where TMA is the default (FNA_FWD_STRIP_TMA=0).
      suite fwd gpu_test_strip_tma0 FNA_FWD_STRIP_TMA=0
      suite bwd gpu_test_bwd_tma0 FNA_BWD_TMA=0
      # Tile walks other than the heuristic's (tiling.cuh walk_order), forward and backward.
      suite fwd,bwd gpu_test_walk FNA_FWD_WALK=012 FNA_BWD_WALK=102 ;;
    sanitize)
      compute-sanitizer --tool memcheck --error-exitcode 9 ./build/gpu/fna-gpu-test --sanitize \
        > "$OUT/sanitize.log" 2>&1
      rc=$?
      tail -15 "$OUT/sanitize.log"
      summary+=("memcheck: rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/sanitize.log" | tail -1) ($(( $(date +%s) - t0 ))s)") ;;
    pytest)
      python3 -X faulthandler -m pytest -q -x tests/python 2>&1 | tee "$OUT/pytest.log" | tail -15
      rc=${PIPESTATUS[0]}
      summary+=("pytest: rc=$rc $(tail -1 "$OUT/pytest.log")") ;;
    bench)
      python3 bench/gpu_bench.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -60
      summary+=("bench: rc=${PIPESTATUS[0]} ($(( $(date +%s) - t0 ))s)") ;;
    bench-quick)
      python3 bench/gpu_bench.py --quick --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -40
      summary+=("bench-quick: rc=${PIPESTATUS[0]} ($(( $(date +%s) - t0 ))s)") ;;
    cli)
      ./build/gpu/fna-bench --device cuda ${CLI_ARGS:-} 2>&1 | tee "$OUT/cli.log" | tail -20
      summary+=("cli: rc=${PIPESTATUS[0]}") ;;
    *) echo "unknown step $s"; summary+=("$s: unknown step") ;;
  esac
done
echo "==== summary ===="
cat "$OUT/gpu.txt"
printf '%s\n' "${summary[@]}"
