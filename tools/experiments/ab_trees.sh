#!/usr/bin/env bash
# Same-machine A/B of two source trees (e.g. two commits' `git archive` tarballs) on the device:
# builds both side by side, then runs a command in each in turn, ROUNDS times, so that the
# machine's drift hits both alike.
#   bash tools/experiments/ab_trees.sh A.tar B.tar "python3 tools/experiments/kernel_times.py 2d-nat" [ROUNDS]
# The command runs in each tree's root with PYTHONPATH set to that tree's package (so a script it
# names must exist in both trees: for a tree older than tools/experiments/, give the script by an
# absolute path); its output is prefixed with A / B.
set -uo pipefail
a_tar=$1 b_tar=$2 cmd=$3 rounds=${4:-3}
for s in a b; do
  tar_var=${s}_tar
  rm -rf /tmp/ab_$s && mkdir -p /tmp/ab_$s && tar -xf "${!tar_var}" -C /tmp/ab_$s || exit 1
  ( cd /tmp/ab_$s && cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFNA_CUDA=ON \
      -DFNA_CUDA_ARCHS=${FNA_CUDA_ARCHS:-90} -DFNA_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
      -DFNA_TESTS=OFF > /tmp/ab_$s.build.log 2>&1 && cmake --build build/gpu -j 8 >> /tmp/ab_$s.build.log 2>&1
    echo "build $s: rc=$?" ) &
done
wait
for r in $(seq 1 "$rounds"); do
  for s in a b; do
    ( cd /tmp/ab_$s && PYTHONPATH=/tmp/ab_$s/python bash -c "$cmd" 2>&1 | sed "s/^/${s^^} r$r: /" )
  done
done
