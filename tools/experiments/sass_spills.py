"""Where a kernel's register spills sit: per kernel of a compiled object (or cubin), its local-memory
stores and loads (STL / LDL) in all and those between its first and last tensor-core instruction
(HGMMA / HMMA), where the main loops run, with the spill sites there when asked.

    python3 tools/experiments/sass_spills.py OBJECT [--match TEXT] [--sites N]

Needs `cuobjdump` on the PATH: the CUDA toolkit's, or the one in PyPI's `nvidia-cuda-cuobjdump`
wheel (`pip download --no-deps nvidia-cuda-cuobjdump`, unzip it, add its nvidia/cu13/bin). ptxas
-v gives only the totals; a spill outside the loops costs little, one inside costs every tile.
"""
import argparse
import re
import subprocess
import sys


def kernels(sass):
    """(mangled name, [instruction lines]) per function of cuobjdump -sass output."""
    for part in re.split(r"\n\s+Function : ", sass)[1:]:
        name = part.split("\n", 1)[0].strip()
        lines = [ln.strip() for ln in part.split("\n") if re.search(r"/\*[0-9a-f]{4,}\*/", ln)]
        yield name, lines


def spill_report(lines):
    """(all spill instructions, indices of those between the first and last MMA)."""
    mma = [i for i, ln in enumerate(lines) if re.search(r"\b(HGMMA|HMMA)\b", ln)]
    spills = [i for i, ln in enumerate(lines) if re.search(r"\b(STL|LDL)\b", ln)]
    inside = [i for i in spills if mma and mma[0] < i < mma[-1]]
    return spills, inside


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("object")
    ap.add_argument("--match", default="", help="only kernels whose mangled name contains TEXT")
    ap.add_argument("--sites", type=int, default=0, help="print up to N in-loop spill sites")
    args = ap.parse_args(argv)
    try:
        sass = subprocess.run(["cuobjdump", "-sass", args.object], check=True,
                              capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit("sass_spills.py: cuobjdump not found on PATH (see the module docstring)")
    except subprocess.CalledProcessError as e:
        sys.exit(f"sass_spills.py: cuobjdump failed on {args.object}: {e.stderr.strip()}")
    print("| kernel | instructions | spill instructions | in the loops |")
    print("| --- | --- | --- | --- |")
    for name, lines in kernels(sass):
        if args.match not in name:
            continue
        spills, inside = spill_report(lines)
        print(f"| {name} | {len(lines)} | {len(spills)} | {len(inside)} |")
        for i in inside[:args.sites]:
            print(f"|   {lines[i][:90]} | | | |")


if __name__ == "__main__":
    main()
