// The fused backward's heuristic tiles on the CPU (src/cuda/fused/plan/bwd_tiles.h): pick_tiles
// gives power-of-two shapes with the asked rows that visit no more tile pairs than any other such
// shape (brute force over every shape), and sm90_key_rows takes, on the problems where every
// configuration was timed on an H100 (docs/benchmarks.md, small windows), the tile that ran
// fastest: 64 keys at head dims up to 64 over small windows, 128 over large ones and at padded
// head dim 128, and with a bias at head dims 33-64 the 128 keys it took before.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "cuda/fused/plan/bwd_tiles.h"

namespace {

using fna::fused::Geometry;
using fna::fused::kAxes;

Geometry geometry(int rank, const std::vector<int64_t>& len, const std::vector<int64_t>& ker,
                  const std::vector<int64_t>& dil) {
  const int64_t st[3] = {1, 1, 1};
  const bool ca[3] = {false, false, false};
  return Geometry::lift(rank, len.data(), ker.data(), dil.data(), st, ca);
}

double visited(const Geometry& geo, const int* own, const int* other, bool own_kv) {
  double v = 1;
  for (int a = 0; a < kAxes; ++a)
    v *= fna::fused::axis_tile_pairs(geo.axis[a], own[a], other[a], own_kv);
  return v;
}

TEST(BwdTiles, PickTilesIsTheFewestPairsShape) {
  std::mt19937_64 rng(0xb7d71e5);
  for (int c = 0; c < 60; ++c) {
    const int rank = 1 + int(rng() % 3);
    std::vector<int64_t> len(rank), ker(rank), dil(rank);
    for (int a = 0; a < rank; ++a) {
      len[a] = 2 + int64_t(rng() % (rank == 1 ? 400 : rank == 2 ? 60 : 20));
      ker[a] = 1 + int64_t(rng() % std::min<int64_t>(len[a], 15));
      dil[a] = 1 + int64_t(rng() % std::max<int64_t>(1, std::min<int64_t>(3, len[a] / ker[a])));
    }
    const Geometry geo = geometry(rank, len, ker, dil);
    for (const bool own_kv : {true, false}) {
      const int own_rows = own_kv ? 64 << (c % 2) : 64, other_rows = 64;
      int own[kAxes], other[kAxes];
      fna::bwd::pick_tiles(geo, own_rows, other_rows, own_kv, own, other);
      int po = 1, pt = 1;
      for (int a = 0; a < kAxes; ++a) {
        EXPECT_EQ(own[a] & (own[a] - 1), 0) << "case " << c;
        EXPECT_EQ(other[a] & (other[a] - 1), 0) << "case " << c;
        po *= own[a];
        pt *= other[a];
      }
      ASSERT_EQ(po, own_rows) << "case " << c;
      ASSERT_EQ(pt, other_rows) << "case " << c;
      const double got = visited(geo, own, other, own_kv);
      // Every shape of those rows over the problem's axes (lifted axes of length 1 take 1).
      const int lead = kAxes - rank;
      for (int o0 = 1; o0 <= own_rows; o0 *= 2)
        for (int o1 = 1; o0 * o1 <= own_rows; o1 *= 2)
          for (int t0 = 1; t0 <= other_rows; t0 *= 2)
            for (int t1 = 1; t0 * t1 <= other_rows; t1 *= 2) {
              int o[kAxes] = {o0, o1, own_rows / (o0 * o1)};
              int t[kAxes] = {t0, t1, other_rows / (t0 * t1)};
              bool ok = true;
              for (int a = 0; a < lead; ++a) ok = ok && o[a] == 1 && t[a] == 1;
              if (!ok) continue;
              EXPECT_LE(got, visited(geo, o, t, own_kv)) << "case " << c;
            }
    }
  }
}

// Among the fewest-pairs shapes pick_tiles takes the one that overhangs the axes least, then the
// one with more rows on the later axes (contiguous in memory): nat-t's 8x8 key tiles visit 4x16
// query tiles rather than 16x4 or 8x8 (the same 4 tiles each; 16x4 ran its forward+backward
// 1.035x slower, H100), and a 1-D-like shape is never split onto a leading axis of length 1.
TEST(BwdTiles, TiesGoToTheLaterAxes) {
  const Geometry nat = geometry(2, {56, 56}, {7, 7}, {1, 1});
  int own[kAxes], other[kAxes];
  fna::bwd::pick_tiles_uncached(nat, 64, 64, true, own, other);
  EXPECT_EQ(own[1], 8);
  EXPECT_EQ(own[2], 8);
  EXPECT_EQ(other[1], 4);
  EXPECT_EQ(other[2], 16);
  // Brute force on random 2-D geometries: no fewest-pairs shape without overhang has more rows
  // on the last axis (own + other exponents) than the one chosen.
  std::mt19937_64 rng(0x71e5);
  for (int c = 0; c < 40; ++c) {
    const int64_t l0 = 8 + int64_t(rng() % 60), l1 = 8 + int64_t(rng() % 60);
    const Geometry geo = geometry(2, {l0, l1}, {1 + int64_t(rng() % 7), 1 + int64_t(rng() % 7)},
                                  {1, 1});
    fna::bwd::pick_tiles_uncached(geo, 64, 64, true, own, other);
    const double got = visited(geo, own, other, true);
    auto over = [&](const int* o, const int* t) {
      long v = 0;
      for (int a = 1; a < kAxes; ++a) {
        const int cap = fna::bwd::next_pow2(int(geo.axis[a].length));
        v += std::max(0, o[a] - cap) + std::max(0, t[a] - cap);
      }
      return v;
    };
    const long got_over = over(own, other);
    const int got_last = fna::bwd::log2_exact(own[2]) + fna::bwd::log2_exact(other[2]);
    for (int o1 = 1; o1 <= 64; o1 *= 2)
      for (int t1 = 1; t1 <= 64; t1 *= 2) {
        const int o[kAxes] = {1, o1, 64 / o1}, t[kAxes] = {1, t1, 64 / t1};
        if (visited(geo, o, t, true) != got || over(o, t) != got_over) continue;
        EXPECT_LE(fna::bwd::log2_exact(o[2]) + fna::bwd::log2_exact(t[2]), got_last)
            << "case " << c << ": " << o1 << "x" << 64 / o1 << " / " << t1 << "x" << 64 / t1;
      }
  }
}

TEST(BwdTiles, KeyRowsAreTheTimedBest) {
  struct Case {
    const char* name;
    int rank;
    std::vector<int64_t> len, ker, dil;
    int64_t dmax;
    int want, want_bias;
  };
  const Case cases[] = {
      {"nat-t", 2, {56, 56}, {7, 7}, {1, 1}, 32, 64, 64},
      {"dinat-t", 2, {56, 56}, {7, 7}, {8, 8}, 32, 64, 64},
      {"nat-late", 2, {14, 14}, {7, 7}, {1, 1}, 32, 64, 64},
      {"2d-nat", 2, {128, 128}, {13, 13}, {1, 1}, 64, 64, 128},
      {"3d-small", 3, {16, 32, 32}, {3, 7, 7}, {1, 1, 1}, 64, 64, 128},
      {"1d-small", 1, {8192}, {65}, {1}, 64, 64, 64},
      {"2d-large at head dim 64", 2, {256, 256}, {63, 63}, {1, 1}, 64, 128, 128},
      {"3d-video at head dim 64", 3, {30, 48, 80}, {18, 24, 24}, {1, 1, 1}, 64, 128, 128},
      {"1d-long at head dim 64", 1, {32768}, {2048}, {1}, 64, 128, 128},
  };
  for (const Case& c : cases) {
    const Geometry geo = geometry(c.rank, c.len, c.ker, c.dil);
    EXPECT_EQ(fna::bwd::sm90_key_rows(geo, 64, c.dmax, false), c.want) << c.name;
    EXPECT_EQ(fna::bwd::sm90_key_rows(geo, 64, c.dmax, true), c.want_bias) << c.name << " (bias)";
    // Padded head dim 128: the one warpgroup would run both dQ column blocks in turn.
    EXPECT_EQ(fna::bwd::sm90_key_rows(geo, 128, 128, false), 128) << c.name;
  }
}

}  // namespace
