// core/neighborhood.h against a literal evaluation of the docs/semantics.md formulas (support/problem.cpp),
// exhaustively over every small axis: L <= 12, every valid kernel, dilation, stride, causal.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "core/neighborhood.h"
#include "support/problem.h"

namespace fna_test {
namespace {

using fna::nbr::Axis;
using fna::nbr::Range;

struct AxisCase {
  int L, K, d, s;
  bool causal;
  std::string str() const {
    std::ostringstream os;
    os << "L=" << L << " K=" << K << " d=" << d << " s=" << s << " causal=" << causal;
    return os.str();
  }
};

std::vector<AxisCase> all_small_axes(int max_len) {
  std::vector<AxisCase> out;
  for (int L = 1; L <= max_len; ++L)
    for (int K = 1; K <= L; ++K)
      for (int d = 1; K * d <= L; ++d)
        for (int s = 1; s <= K; ++s)
          for (int c = 0; c < 2; ++c) out.push_back({L, K, d, s, c == 1});
  return out;
}

// Brute force: the set of local key indices j of group g that SPEC calls neighbors of x.
std::vector<bool> brute_members(const AxisCase& a, int x) {
  const int g = x % a.d;
  const int lg = (a.L - g + a.d - 1) / a.d;
  std::vector<bool> in(static_cast<size_t>(lg), false);
  for (int y = 0; y < a.L; ++y)
    if (spec_is_neighbor(a.L, a.K, a.d, a.s, a.causal, x, y)) {
      EXPECT_EQ(y % a.d, g) << a.str() << " x=" << x << ": neighbor y=" << y << " in another group";
      in[static_cast<size_t>(y / a.d)] = true;
    }
  return in;
}

TEST(Neighborhood, WindowEqualsSpecForEverySmallAxis) {
  int checked = 0;
  for (const AxisCase& a : all_small_axes(12)) {
    const Axis ax{a.L, a.K, a.d, a.s, a.causal};
    for (int x = 0; x < a.L; ++x) {
      const int g = x % a.d, i = x / a.d;
      const int lg = fna::nbr::group_length(ax, g);
      ASSERT_EQ(lg, (a.L - g + a.d - 1) / a.d) << a.str();
      const Range w = fna::nbr::window(ax, lg, i);
      const std::vector<bool> in = brute_members(a, x);
      for (int j = 0; j < lg; ++j)
        ASSERT_EQ(in[static_cast<size_t>(j)], j >= w.begin && j < w.end)
            << a.str() << " x=" << x << " j=" << j << " window=[" << w.begin << "," << w.end << ")";
      ASSERT_GE(w.begin, 0) << a.str();
      ASSERT_LE(w.end, lg) << a.str();
      // The query always sees itself; non-causal windows never shrink.
      ASSERT_TRUE(i >= w.begin && i < w.end) << a.str() << " x=" << x;
      if (!a.causal) ASSERT_EQ(w.size(), a.K) << a.str() << " x=" << x;
      else ASSERT_LE(w.size(), a.K) << a.str() << " x=" << x;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10000);
}

TEST(Neighborhood, WindowsAreMonotone) {
  for (const AxisCase& a : all_small_axes(12)) {
    const Axis ax{a.L, a.K, a.d, a.s, a.causal};
    for (int g = 0; g < a.d; ++g) {
      const int lg = fna::nbr::group_length(ax, g);
      for (int i = 1; i < lg; ++i) {
        const Range p = fna::nbr::window(ax, lg, i - 1), c = fna::nbr::window(ax, lg, i);
        ASSERT_LE(p.begin, c.begin) << a.str() << " i=" << i;
        ASSERT_LE(p.end, c.end) << a.str() << " i=" << i;
      }
    }
  }
}

TEST(Neighborhood, InverseWindowEqualsBruteForce) {
  for (const AxisCase& a : all_small_axes(12)) {
    const Axis ax{a.L, a.K, a.d, a.s, a.causal};
    for (int g = 0; g < a.d; ++g) {
      const int lg = fna::nbr::group_length(ax, g);
      for (int j = 0; j < lg; ++j) {
        std::vector<int> qs;  // local queries whose SPEC neighborhood holds key j
        for (int i = 0; i < lg; ++i)
          if (brute_members(a, i * a.d + g)[static_cast<size_t>(j)]) qs.push_back(i);
        const Range inv = fna::nbr::inverse_window(ax, lg, j);
        ASSERT_EQ(inv.size(), static_cast<int>(qs.size())) << a.str() << " g=" << g << " j=" << j;
        for (size_t n = 0; n < qs.size(); ++n)
          ASSERT_EQ(qs[n], inv.begin + static_cast<int>(n)) << a.str() << " g=" << g << " j=" << j;
      }
    }
  }
}

TEST(Neighborhood, TileUnionAndIntersectionEqualBruteForce) {
  for (const AxisCase& a : all_small_axes(10)) {
    const Axis ax{a.L, a.K, a.d, a.s, a.causal};
    for (int g = 0; g < a.d; ++g) {
      const int lg = fna::nbr::group_length(ax, g);
      std::vector<std::vector<bool>> members(static_cast<size_t>(lg));
      for (int i = 0; i < lg; ++i) members[static_cast<size_t>(i)] = brute_members(a, i * a.d + g);
      for (int i0 = 0; i0 < lg; ++i0)
        for (int i1 = i0 + 1; i1 <= lg; ++i1) {
          std::vector<bool> any(static_cast<size_t>(lg), false), all(static_cast<size_t>(lg), true);
          for (int i = i0; i < i1; ++i)
            for (int j = 0; j < lg; ++j) {
              const bool m = members[static_cast<size_t>(i)][static_cast<size_t>(j)];
              any[static_cast<size_t>(j)] = any[static_cast<size_t>(j)] || m;
              all[static_cast<size_t>(j)] = all[static_cast<size_t>(j)] && m;
            }
          const Range u = fna::nbr::tile_union(ax, lg, i0, i1);
          const Range x = fna::nbr::tile_intersection(ax, lg, i0, i1);
          for (int j = 0; j < lg; ++j) {
            ASSERT_EQ(any[static_cast<size_t>(j)], j >= u.begin && j < u.end)
                << a.str() << " tile [" << i0 << "," << i1 << ") j=" << j;
            ASSERT_EQ(all[static_cast<size_t>(j)], j >= x.begin && j < x.end)
                << a.str() << " tile [" << i0 << "," << i1 << ") j=" << j;
          }
          // Keys needed by the queries of a key range: inverse_tile_union over [i0, i1) as keys.
          const Range iq = fna::nbr::inverse_tile_union(ax, lg, i0, i1);
          for (int i = 0; i < lg; ++i) {
            bool needs = false;
            for (int j = i0; j < i1; ++j) needs = needs || members[static_cast<size_t>(i)][static_cast<size_t>(j)];
            ASSERT_EQ(needs, i >= iq.begin && i < iq.end)
                << a.str() << " keys [" << i0 << "," << i1 << ") query " << i;
          }
        }
    }
  }
}

// The slot order used by qk / av: spec_slots (support) lists row-major window-box slots; check it
// against membership on random multi-axis problems so the unfused tests rest on a sound oracle.
TEST(Neighborhood, SlotsListExactlyTheNeighbors) {
  for (int c = 0; c < 60; ++c) {
    const fna::Problem p = random_problem(c, 0);
    for (int64_t q = 0; q < p.tokens(); ++q) {
      const std::vector<int64_t> slots = spec_slots(p, q);
      std::vector<bool> seen(static_cast<size_t>(p.tokens()), false);
      int64_t prev = -1;
      for (int64_t k : slots) {
        if (k < 0) continue;
        ASSERT_TRUE(spec_is_neighbor(p, q, k)) << "case " << c << " q=" << q << " k=" << k;
        ASSERT_GT(k, prev) << "slots must be in increasing token order";
        prev = k;
        seen[static_cast<size_t>(k)] = true;
      }
      for (int64_t k = 0; k < p.tokens(); ++k)
        if (spec_is_neighbor(p, q, k)) ASSERT_TRUE(seen[static_cast<size_t>(k)]) << "case " << c << " q=" << q << " k=" << k;
    }
  }
}

}  // namespace
}  // namespace fna_test
