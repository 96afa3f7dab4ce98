#!/usr/bin/env bash
# Host cost of the Python layer, a commit's package (BASE, default HEAD) against the working
# tree's, sharing one built extension (run after `FNA_INPLACE=1 bash tools/gpu/run.sh build`),
# rounds alternating:
#   BASE=HEAD~1 bash tools/gpu/host_ab.sh [ROUNDS] [--problem 2d-nat]
set -uo pipefail
base=${BASE:-HEAD}
rounds=${1:-2}
shift || true
rm -rf /tmp/fna-head-py && mkdir -p /tmp/fna-head-py && cp -r python/fna /tmp/fna-head-py/
git rev-parse -q --verify "$base^{commit}" >/dev/null || { echo "no commit $base here"; exit 1; }
for f in $(git ls-tree -r --name-only "$base" python/fna); do
  git show "$base:$f" > "/tmp/fna-head-py/fna/${f#python/fna/}" || exit 1
done
for r in $(seq 1 "$rounds"); do
  for side in base tree; do
    dir=/tmp/fna-head-py
    [ "$side" = tree ] && dir=$PWD/python
    PYTHONPATH=$dir python3 tools/gpu/host_overhead.py --calls 2000 "$@" 2>&1 |
      grep -E "^ +[0-9.]+ us|forward:" | sed "s/^/$side r$r: /"
  done
done
