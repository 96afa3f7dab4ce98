#!/usr/bin/env bash
# Sets up what fna's build and tests need, without touching the system interpreter:
#   tools/install_deps.sh VENV [BASE_PYTHON] [EXTRA_REQUIREMENT...]
# 1. System packages (CMake, a C++ compiler, GoogleTest, python3-venv) through apt when missing.
# 2. A virtual environment VENV made from BASE_PYTHON (default python3) with its site packages
#    visible, so a torch the user already has is used, not replaced.
# 3. In VENV, the requirements of requirements-dev.txt (and any EXTRA_REQUIREMENT given) that are
#    missing or out of range, installed at the tested versions of constraints.txt. Torch comes from
#    PyTorch's CPU index when no NVIDIA GPU is visible (the default wheel carries CUDA libraries).
#    ONLY_EXTRA=1: only the EXTRA_REQUIREMENTs (make bench-cpu needs nlohmann-json alone).
# Idempotent: a second run installs nothing.
set -euo pipefail
VENV=${1:?usage: install_deps.sh VENV [BASE_PYTHON] [EXTRA_REQUIREMENT...]}
BASE=${2:-python3}
shift $(( $# >= 2 ? 2 : 1 ))
here=$(cd "$(dirname "$0")/.." && pwd)

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
# NEED_GTEST=0 (make wheel): no C++ tests are built, GoogleTest is not needed.
[ "${NEED_GTEST:-1}" = 0 ] || [ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
if [ ! -x "$VENV/bin/python" ] && ! "$BASE" -c "import ensurepip" >/dev/null 2>&1; then
  need_apt+=("python3-venv")
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[deps] apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[deps] creating $VENV from $($BASE -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  "$BASE" -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -c 'import sys; assert sys.version_info >= (3, 9), "fna needs Python 3.9 or newer, not " + sys.version' \
  || exit 1

# Which requirements are missing or out of range (pip's own packaging library judges the ranges).
missing=$("$PY" - "$here/requirements-dev.txt" "$@" <<'PYEOF'
import sys
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
import os
base = [] if os.environ.get("ONLY_EXTRA") == "1" else open(sys.argv[1])
lines = [l.split("#")[0].strip() for l in base] + sys.argv[2:]
out = []
for line in filter(None, lines):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate():
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        have = None
    if have is None or not req.specifier.contains(have.split("+")[0], prereleases=True):
        out.append(line)
print("\n".join(out))
PYEOF
)
if [ -n "$missing" ]; then
  mapfile -t reqs <<< "$missing"
  index=()
  if printf '%s\n' "${reqs[@]}" | grep -q '^torch' && ! nvidia-smi -L >/dev/null 2>&1; then
    # Only where the index answers: pip retries an unreachable index for every package, which
    # costs minutes; without it torch comes from PyPI (with its CUDA libraries).
    if "$PY" -c 'import urllib.request as u; u.urlopen("https://download.pytorch.org/whl/cpu/", timeout=10)' \
        >/dev/null 2>&1; then
      index=(--extra-index-url https://download.pytorch.org/whl/cpu)
    else
      echo "[deps] download.pytorch.org/whl/cpu does not answer: torch from PyPI"
    fi
  fi
  echo "[deps] pip install (in $VENV) ${reqs[*]}"
  "$PY" -m pip install -q --disable-pip-version-check -c "$here/constraints.txt" \
    ${index[@]+"${index[@]}"} "${reqs[@]}"
fi
echo "[deps] ok ($PY)"
