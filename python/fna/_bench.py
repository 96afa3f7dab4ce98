"""The installed `fna-bench` command: the C++ benchmark CLI, run through the extension (the same
code as the fna-bench executable a CMake build makes; `fna-bench --help` lists its options)."""

import sys


def main() -> int:
    from . import _C

    sys.stdout.flush()
    sys.stderr.flush()
    return _C.bench_main(["fna-bench", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
