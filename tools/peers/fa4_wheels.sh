#!/usr/bin/env bash
# FlashAttention 4 (PyPI `flash-attn-4`: pure Python on NVIDIA's CUTLASS DSL) for the GPU machine,
# which has no network: its wheels and their dependencies for CPython 3.12 / x86_64 / CUDA 13
# (torch and typing-extensions are there already), downloaded here into build/peers/fa4:
#   bash tools/peers/fa4_wheels.sh [PYTHON_VERSION (3.12)]
# The device tool carries at most 64 MiB per call and the CUDA 13 library wheel of the DSL is
# about 92 MB, so files over 60 MB are split: build/peers/fa4/a holds the small wheels and each big
# file's first part, build/peers/fa4/b the second parts. Carry `build/peers/fa4/a` on one call
# and `build/peers/fa4/b` on the next call of the same warm machine (each call copies its part to
# /tmp/fa4 there); the second call joins the parts and installs every wheel into /tmp/site (the
# lines printed at the end). The DSL's own .pth is not read from a PYTHONPATH entry, so its
# dsl_packages directory goes on PYTHONPATH too.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
py=${1:-3.12}
out=$here/build/peers/fa4
rm -rf "$out" && mkdir -p "$out/a" "$out/b" "$out/dl"
# libs-core holds the DSL's Python modules (cutlass.cute); without it flash_attn.cute fails to
# import (No module named 'cutlass.cute'), as the first try on the GPU machine did.
pkgs=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
      nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
      cuda-bindings==13.5.0 cuda-pathfinder==1.9.1 protobuf==7.36.2 quack-kernels==0.6.5
      apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 einops==0.8.2)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --platform manylinux_2_28_x86_64 -d "$out/dl" "${pkgs[@]}"
limit=$((60 * 1000 * 1000))
in_a=0  # bytes in part a: whole wheels past 55 MB go to part b
for f in "$out"/dl/*.whl; do
  name=$(basename "$f")
  size=$(stat -c %s "$f")
  if [ "$size" -le "$limit" ] && [ $((in_a + size)) -gt $((55 * 1000 * 1000)) ]; then
    cp "$f" "$out/b/"
  elif [ "$size" -gt "$limit" ]; then
    half=$(( ($(stat -c %s "$f") + 1) / 2 ))
    head -c "$half" "$f" > "$out/a/$name.part0"
    in_a=$((in_a + half))
    tail -c +"$((half + 1))" "$f" > "$out/b/$name.part1"
    cat "$out/a/$name.part0" "$out/b/$name.part1" | cmp -s - "$f" || { echo "split of $name differs"; exit 1; }
  else
    cp "$f" "$out/a/"
    in_a=$((in_a + size))
  fi
done
rm -rf "$out/dl"
du -sh "$out/a" "$out/b"
cat <<MSG
On the device (call 1 carries build/peers/fa4/a, call 2 build/peers/fa4/b):
  call 1:  mkdir -p /tmp/fa4 && cp build/peers/fa4/a/* /tmp/fa4/
  call 2:  cp build/peers/fa4/b/* /tmp/fa4/ && cd /tmp/fa4 && for p in *.part0; do cat "\$p" "\${p%.part0}.part1" > "\${p%.part0}"; done \\
           && rm -f *.part0 *.part1 && python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/fa4/*.whl
  then PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:\$PYTHONPATH and
  \`from flash_attn.cute import flash_attn_func\` (q, k, v as [B, L, H, D], fna's 1-D layout).
MSG
