#!/usr/bin/env bash
# Installs what fna's build and tests need and is missing. Idempotent; pinned versions.
set -euo pipefail
PY=${1:-python3}
need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[deps] apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_apt[@]}"
fi
here=$(cd "$(dirname "$0")/.." && pwd)
missing=$("$PY" - "$here/requirements-dev.txt" <<'PYEOF'
import sys
from importlib import metadata
out = []
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, ver = line.split("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have is None or have.split("+")[0] != ver:
        out.append(line)
print(" ".join(out))
PYEOF
)
if [ -n "$missing" ]; then
  echo "[deps] pip install $missing"
  "$PY" -m pip install -q --disable-pip-version-check $missing
fi
echo "[deps] ok"
