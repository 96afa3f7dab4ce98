#!/usr/bin/env bash
# Builds the CPU library of two source trees, each in a namespace of its own, into one binary
# whose calls alternate between them (the same minute of this VM for both).
#   bash tools/experiments/cpu_builds_ab.sh <tree A> <tree B> [calls = 30] [mode: 0 forward, 1 backward]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
a=$(cd "$1" && pwd); b=$(cd "$2" && pwd); n=${3:-30}; mode=${4:-0}
out=${AB_OUT:-/tmp/fna_ab_builds}
mkdir -p "$out"
build() {  # tree namespace entry
  local dir="$out/$2"; mkdir -p "$dir"
  for f in "$1"/src/core/*.cpp "$1"/src/cpu/*.cpp "$here/cpu_builds_ab_side.cpp"; do
    g++ -O3 -std=c++17 -pthread -Dfna=$2 -DSIDE_FN=$3 -I"$1/include" -I"$1/src" -c "$f" -o "$dir/$(basename "$f").o" &
  done
  wait
}
build "$a" fna_ab_a run_a
build "$b" fna_ab_b run_b
g++ -O2 -std=c++17 -pthread "$here/cpu_builds_ab.cpp" "$out"/fna_ab_a/*.o "$out"/fna_ab_b/*.o -o "$out/ab"
"$out/ab" "$n" "$mode"
