// The strip plan over inverse neighborhoods (strip_plan.h with `inverse`: the strip dK / dV
// kernel's boxes of keys and rings of the query rows that attend them) against brute force over
// the SPEC neighbor relation (the support library's spec_is_neighbor, which shares nothing with
// core/), on random rank-2 geometries (seeded) with dilation, stride and causal axes. Runs in CI,
// without a GPU; the kernel itself runs in the device suite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>

#include "core/neighborhood.h"
#include "cuda/fused/kernel/common/strip_plan.h"
#include "support/problem.h"

namespace {

using fna::fused::Geometry;
using fna::fused::kAxes;

std::string describe(const Geometry& geo) {
  std::ostringstream os;
  for (int a = 0; a < kAxes; ++a) {
    const auto& x = geo.axis[a];
    os << "[L=" << x.length << " K=" << x.kernel << " d=" << x.dilation << " s=" << x.stride
       << " c=" << x.causal << "]";
  }
  return os.str();
}

// strip_plan with `inverse` (the strip dK / dV kernel: boxes of keys, rings of the query rows of
// their inverse neighborhoods) against brute force over the SPEC relation: a box's union is the
// queries with a neighbor among its keys; the plan takes the problem exactly when every key box's
// union fits 16 columns and 32 rows and the ring holds a box's rows, and then its pitch is the
// widest union of 16 consecutive key columns (rounded up to 4), its box rows the widest union of a
// box's key rows, and its chunks the boxes' unions in 4-row chunks.
TEST(StripInverse, PlanMatchesBruteForce) {
  std::mt19937_64 rng(20261127);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int accepted = 0, refused = 0;
  for (int c = 0; c < 60; ++c) {
    int64_t len[2], ker[2], dil[2], str[2];
    bool cau[2];
    for (int a = 0; a < 2; ++a) {
      len[a] = pick(1, 70);
      dil[a] = pick(1, 3) == 1 ? pick(1, 3) : 1;
      const int kmax = std::max<int>(1, static_cast<int>(len[a] / dil[a]));
      ker[a] = pick(1, std::min(kmax, 13));
      str[a] = pick(1, 3) == 1 ? pick(1, static_cast<int>(ker[a])) : 1;
      cau[a] = pick(0, 3) == 0;
    }
    const Geometry geo = Geometry::lift(2, len, ker, dil, str, cau);
    const int bh = c % 2 == 0 ? 4 : 2, bw = 16 / bh;
    SCOPED_TRACE("case " + std::to_string(c) + " " + describe(geo) + " box " +
                 std::to_string(bh) + "x" + std::to_string(bw));
    const fna::fused::StripPlan sp =
        fna::fused::strip_plan(geo, bh, bw, 2, 132, 232448, 64.0, 64, false, true);
    auto glen = [&](int ax, int g) {
      const auto& x = geo.axis[ax];
      return static_cast<int>((x.length - g + x.dilation - 1) / x.dilation);
    };
    // Queries of group g on axis ax with a neighbor among local keys [j0, j1): their extent, and
    // (checked) that nbr::tile_union_of(.., inverse) gives the same range.
    auto inv = [&](int ax, int g, int j0, int j1) {
      const auto& x = geo.axis[ax];
      const int lg = glen(ax, g);
      int lo = lg, hi = -1;
      for (int i = 0; i < lg; ++i)
        for (int j = j0; j < j1; ++j)
          if (fna_test::spec_is_neighbor(x.length, x.kernel, x.dilation, x.stride, x.causal,
                                         int64_t(i) * x.dilation + g, int64_t(j) * x.dilation + g)) {
            lo = std::min(lo, i);
            hi = std::max(hi, i);
          }
      const fna::nbr::Range r = fna::nbr::tile_union_of(x, lg, j0, j1, true);
      EXPECT_EQ(r.begin, lo) << "axis " << ax << " keys " << j0 << ".." << j1;
      EXPECT_EQ(r.end, hi + 1) << "axis " << ax << " keys " << j0 << ".." << j1;
      return hi - lo + 1;
    };
    int pitch = 1, box_rows = 1, box_cols = 1;
    double chunks1 = 0, boxes2 = 0;
    for (int g = 0; g < geo.axis[2].dilation; ++g)
      for (int c0 = 0; c0 < glen(2, g); c0 += 16) {
        pitch = std::max(pitch, inv(2, g, c0, std::min(c0 + 16, glen(2, g))));
        for (int j0 = c0; j0 < c0 + 16 && j0 < glen(2, g); j0 += bw) {
          box_cols = std::max(box_cols, inv(2, g, j0, std::min(j0 + bw, glen(2, g))));
          boxes2 += 1;
        }
      }
    for (int g = 0; g < geo.axis[1].dilation; ++g)
      for (int r0 = 0; r0 < glen(1, g); r0 += bh) {
        const int u = inv(1, g, r0, std::min(r0 + bh, glen(1, g)));
        box_rows = std::max(box_rows, u);
        chunks1 += (u + 3) / 4;
      }
    if (box_cols > 16 || box_rows > 32) {
      ASSERT_FALSE(sp.ok);
      EXPECT_NE(sp.why.find("positions"), std::string::npos) << sp.why;
      ++refused;
      continue;
    }
    // The ring (head dim 64: one plane) must hold a box's rows and two bands.
    const int pitch4 = (pitch + 3) / 4 * 4;
    const int ring = std::min((232448 - 2048) / (2 * pitch4 * 128), 64) / 2 * 2;
    if (ring < std::max(16, box_rows + 4)) {
      ASSERT_FALSE(sp.ok);
      EXPECT_NE(sp.why.find("shared memory"), std::string::npos) << sp.why;
      ++refused;
      continue;
    }
    ASSERT_TRUE(sp.ok) << sp.why;
    ++accepted;
    EXPECT_EQ(sp.sp.pitch, pitch4);
    EXPECT_EQ(sp.box_rows, box_rows);
    EXPECT_EQ(sp.box.chunks, chunks1 * boxes2);
  }
  EXPECT_GT(accepted, 15);
  EXPECT_GT(refused, 3);
}

}  // namespace
