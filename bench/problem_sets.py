"""The benchmark problem sets (docs/semantics.md sections 3.3 and 3.4): the standard set and the
small-window set, shared by bench/gpu_bench.py and bench/tiling_bound.py (no torch needed)."""

PROBLEMS = {
    # name: (B, H, shape, D, kernel)
    "1d-long": (1, 16, (32768,), 128, (2048,)),
    "2d-nat": (8, 8, (128, 128), 64, (13, 13)),
    "2d-large": (1, 16, (256, 256), 128, (63, 63)),
    "3d-video": (1, 24, (30, 48, 80), 128, (18, 24, 24)),
}
# The small-window set (docs/semantics.md): the windows and head dims most NA models run.
SMALL = {
    # name: (B, H, shape, D, kernel, dilation)
    "nat-t": (32, 3, (56, 56), 32, (7, 7), (1, 1)),
    "dinat-t": (32, 3, (56, 56), 32, (7, 7), (8, 8)),
    "nat-late": (32, 12, (14, 14), 32, (7, 7), (1, 1)),
    "2d-k3": (1, 16, (256, 256), 128, (3, 3), (1, 1)),
    "2d-k7": (1, 16, (256, 256), 128, (7, 7), (1, 1)),
    "3d-small": (2, 8, (16, 32, 32), 64, (3, 7, 7), (1, 1, 1)),
    "1d-small": (8, 16, (8192,), 64, (65,), (1,)),
}
