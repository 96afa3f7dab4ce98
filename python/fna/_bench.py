"""The installed `fna-bench` command: the C++ benchmark CLI, run through the extension (the same
code as the fna-bench executable a CMake build makes; `fna-bench --help` lists its options).
`fna-bench profile ...` is the configuration profiler, `python -m fna.profiler ...` (dry-run
listing and timing of every cuda-fused configuration of a problem; `fna-bench profile --help`)."""

import sys


def main() -> int:
    if sys.argv[1:2] == ["profile"]:
        from .profiler import main as profile

        return profile(sys.argv[2:], prog="fna-bench profile")
    from . import _C

    sys.stdout.flush()
    sys.stderr.flush()
    return _C.bench_main(["fna-bench", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
