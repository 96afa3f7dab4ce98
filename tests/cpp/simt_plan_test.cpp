// The SIMT forward's host sizing (src/cuda/fused/kernel/common/simt_plan.h) against the definition:
// the kernel copies each CTA's halo, the union of its query tile's windows, into shared memory
// sized by simt_plan, so the plan's rows must be at least every tile's halo (and, per axis,
// exactly the largest one). Unions are brute-forced from the spec's membership test
// (support/problem.h spec_is_neighbor), not from the library's window code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "cuda/fused/kernel/common/simt_plan.h"
#include "support/problem.h"

namespace {

using fna::fused::Geometry;
using fna::fused::kAxes;

// The largest union of windows over query tiles of `q` local queries, every dilation group.
int brute_axis_halo(const fna::nbr::Axis& x, int q) {
  int best = 1;
  for (int g = 0; g < x.dilation; ++g) {
    const int lg = (x.length - g + x.dilation - 1) / x.dilation;
    for (int i0 = 0; i0 < lg; i0 += q) {
      int first = 0;
      best = std::max(best, fna_test::spec_window_union(x.length, x.kernel, x.dilation, x.stride,
                                                        x.causal, g, i0, std::min(i0 + q, lg),
                                                        &first));
    }
  }
  return best;
}

TEST(SimtPlan, HaloRowsMatchBruteForce) {
  std::mt19937_64 rng(20261126);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int c = 0; c < 120; ++c) {
    const int rank = 1 + c % 3;
    const int max_len = rank == 1 ? 200 : (rank == 2 ? 30 : 10);
    int64_t len[3], ker[3], dil[3], str[3];
    bool cau[3];
    for (int a = 0; a < rank; ++a) {
      len[a] = pick(1, max_len);
      dil[a] = pick(0, 2) == 0 ? pick(1, 3) : 1;
      const int kmax = std::max<int>(1, static_cast<int>(len[a] / dil[a]));
      ker[a] = pick(1, std::min(kmax, 15));
      str[a] = pick(0, 2) == 0 ? pick(1, static_cast<int>(ker[a])) : 1;
      cau[a] = pick(0, 3) == 0;
    }
    const Geometry geo = Geometry::lift(rank, len, ker, dil, str, cau);
    const int q[kAxes] = {rank == 3 ? pick(1, 4) : 1, rank >= 2 ? 8 : 1,
                          rank == 1 ? 128 : (c % 2 == 0 ? 8 : 16)};
    const int kD = c % 2 == 0 ? 32 : 64;
    SCOPED_TRACE("case " + std::to_string(c) + " rank " + std::to_string(rank));
    const fna::fused::SimtPlan sp = fna::fused::simt_plan(geo, q, kD);
    int rows = 1;
    for (int ax = 0; ax < kAxes; ++ax) {
      const int b = brute_axis_halo(geo.axis[ax], q[ax]);
      EXPECT_EQ(fna::fused::simt_axis_halo(geo.axis[ax], q[ax]), b) << "axis " << ax;
      rows *= b;
    }
    EXPECT_EQ(sp.halo_rows, rows);
    // K and V, each row kD 16-bit elements and 16 bytes of padding.
    EXPECT_EQ(sp.smem, size_t(2) * size_t(rows) * size_t(2 * kD + 16));
  }
}

TEST(SimtPlan, RowPitchIsAnOddNumberOfChunks) {
  // Eight consecutive rows read with 16-byte loads hit eight distinct bank groups only when the
  // row pitch is an odd number of 16-byte chunks.
  for (int kD : {32, 64}) {
    const int chunks = fna::fused::simt_row_bytes(kD) / 16;
    EXPECT_EQ(chunks % 2, 1) << kD;
    int seen = 0;
    for (int r = 0; r < 8; ++r) seen |= 1 << ((r * chunks) % 8);
    EXPECT_EQ(seen, 0xff) << kD;
  }
}

}  // namespace
