// fused::part_axis (src/cuda/fused/kernel/common/tiling.cuh): how the warp-specialized Hopper
// forward splits a query tile into its compute warpgroups' boxes of 64 rows, one of which is the
// box Q's TMA map loads.
#include <gtest/gtest.h>

#include "cuda/fused/kernel/common/tiling.cuh"

// part_axis: the warp-specialized forward's warpgroup boxes (Q's TMA box is one): the slowest
// axis longer than 1, which must divide, so that part w is rows [w * n, (w + 1) * n) of the tile.
TEST(FusedTiling, PartAxisSplitsTheSlowestAxis) {
  const int cases[][5] = {{1, 1, 192, 3, 2}, {1, 24, 8, 3, 1}, {3, 8, 8, 3, 0}, {1, 8, 16, 2, 1},
                          {2, 8, 8, 2, 0},   {2, 8, 8, 3, -1}, {1, 8, 24, 3, -1}, {1, 1, 64, 1, 2}};
  for (const auto& c : cases) {
    const int q[3] = {c[0], c[1], c[2]}, ax = fna::fused::part_axis(q, c[3]);
    ASSERT_EQ(ax, c[4]) << q[0] << "x" << q[1] << "x" << q[2] << " / " << c[3];
    int b[3] = {q[0], q[1], q[2]};
    if (ax >= 0) b[ax] /= c[3];
    for (int w = 0, n = b[0] * b[1] * b[2]; ax >= 0 && w < c[3]; ++w)
      for (int i = 0; i < n; ++i) {  // box coordinates, shifted to part w, as a tile row
        int l[3] = {i / (b[1] * b[2]), (i / b[2]) % b[1], i % b[2]};
        l[ax] += w * b[ax];
        ASSERT_EQ((l[0] * q[1] + l[1]) * q[2] + l[2], w * n + i);
      }
  }
}
