// nbr::inverse_window and nbr::inverse_tile_union against brute force over nbr::window, for every
// small axis: length <= 24, every valid kernel, dilation, stride, causal flag, dilation group and
// key. The brute force inverts the forward window by scanning all queries, so the binary searches
// (and the monotonicity they rely on) are what is tested; nbr::window itself is checked against
// the SPEC definition by the support library's spec_window.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "core/neighborhood.h"
#include "support/problem.h"

namespace {

using fna::nbr::Axis;
using fna::nbr::Range;

std::string describe(const Axis& a, int g) {
  std::ostringstream os;
  os << "L=" << a.length << " K=" << a.kernel << " d=" << a.dilation << " s=" << a.stride
     << " causal=" << a.causal << " group=" << g;
  return os.str();
}

template <typename Fn>
void for_every_small_axis(Fn&& fn) {
  for (int L = 1; L <= 24; ++L)
    for (int d = 1; d <= L; ++d)
      for (int K = 1; K * d <= L; ++K)
        for (int s = 1; s <= K; ++s)
          for (int causal = 0; causal < 2; ++causal) {
            const Axis a{L, K, d, s, causal != 0};
            for (int g = 0; g < d; ++g) fn(a, g, fna::nbr::group_length(a, g));
          }
}

// The window of nbr::window is the SPEC's (per global coordinate); the inverse tests below then
// rest on a checked forward window.
TEST(InverseNeighborhood, WindowMatchesSpec) {
  int checked = 0;
  for_every_small_axis([&](const Axis& a, int g, int lg) {
    for (int i = 0; i < lg; ++i) {
      const Range w = fna::nbr::window(a, lg, i);
      const auto spec = fna_test::spec_window(a.length, a.kernel, a.dilation, a.stride, a.causal,
                                              int64_t(i) * a.dilation + g);
      ASSERT_EQ(spec.group, g) << describe(a, g) << " i=" << i;
      ASSERT_EQ(w.begin, spec.start) << describe(a, g) << " i=" << i;
      ASSERT_EQ(w.end, spec.end) << describe(a, g) << " i=" << i;
      ++checked;
    }
  });
  EXPECT_GT(checked, 1000);
}

TEST(InverseNeighborhood, InverseWindowEqualsBruteForce) {
  int checked = 0;
  for_every_small_axis([&](const Axis& a, int g, int lg) {
    for (int j = 0; j < lg; ++j) {
      // Brute force: every query whose window holds j; it must be one contiguous run.
      int first = -1, last = -1, count = 0;
      for (int i = 0; i < lg; ++i) {
        const Range w = fna::nbr::window(a, lg, i);
        if (j >= w.begin && j < w.end) {
          if (first < 0) first = i;
          last = i;
          ++count;
        }
      }
      const Range inv = fna::nbr::inverse_window(a, lg, j);
      // Every key lies in some window (stride <= kernel): the backward's key_tile_ranges
      // (bwd_ktile.cuh) takes a key tile's query range from its keys' windows on that basis.
      ASSERT_GT(count, 0) << "a key in no window: " << describe(a, g) << " j=" << j;
      ASSERT_EQ(last - first + 1, count) << "inverse neighborhood not contiguous: "
                                         << describe(a, g) << " j=" << j;
      ASSERT_EQ(inv.begin, first) << describe(a, g) << " j=" << j;
      ASSERT_EQ(inv.end, last + 1) << describe(a, g) << " j=" << j;
      ++checked;
    }
  });
  EXPECT_GT(checked, 1000);
}

TEST(InverseNeighborhood, InverseTileUnionEqualsBruteForce) {
  int checked = 0;
  for_every_small_axis([&](const Axis& a, int g, int lg) {
    for (int j0 = 0; j0 < lg; ++j0)
      for (int j1 = j0 + 1; j1 <= lg; ++j1) {
        int first = -1, last = -1;
        for (int i = 0; i < lg; ++i) {
          const Range w = fna::nbr::window(a, lg, i);
          if (w.begin < j1 && w.end > j0) {  // the window meets [j0, j1)
            if (first < 0) first = i;
            last = i;
          }
        }
        const Range u = fna::nbr::inverse_tile_union(a, lg, j0, j1);
        if (first < 0) {
          ASSERT_EQ(u.size(), 0) << describe(a, g) << " keys [" << j0 << "," << j1 << ")";
        } else {
          ASSERT_EQ(u.begin, first) << describe(a, g) << " keys [" << j0 << "," << j1 << ")";
          ASSERT_EQ(u.end, last + 1) << describe(a, g) << " keys [" << j0 << "," << j1 << ")";
        }
        ++checked;
      }
  });
  EXPECT_GT(checked, 1000);
}

// The backward's key_tile_ranges (bwd_ktile.cuh) takes a key tile's query range from the inverse
// windows of its first and last keys instead of searching again: for every tile of keys
// [j0, j1), the union is [inverse_window(j0).begin, inverse_window(j1 - 1).end).
TEST(InverseNeighborhood, TileUnionFromItsEndKeysWindows) {
  int checked = 0;
  for_every_small_axis([&](const Axis& a, int g, int lg) {
    for (int j0 = 0; j0 < lg; ++j0)
      for (int j1 = j0 + 1; j1 <= lg; ++j1) {
        const Range u = fna::nbr::inverse_tile_union(a, lg, j0, j1);
        ASSERT_EQ(u.begin, fna::nbr::inverse_window(a, lg, j0).begin)
            << describe(a, g) << " keys [" << j0 << "," << j1 << ")";
        ASSERT_EQ(u.end, fna::nbr::inverse_window(a, lg, j1 - 1).end)
            << describe(a, g) << " keys [" << j0 << "," << j1 << ")";
        ++checked;
      }
  });
  EXPECT_GT(checked, 1000);
}

}  // namespace

namespace {

// The inverse window by two binary searches over the whole axis in 64-bit arithmetic: queries
// [first with window.end > j, first with window.begin > j).
Range wide_inverse(const Axis& a, int lg, int j) {
  auto first = [&](auto pred) {
    int64_t lo = 0, hi = lg;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (pred(fna::nbr::window(a, lg, static_cast<int>(mid))))
        hi = mid;
      else
        lo = mid + 1;
    }
    return static_cast<int>(lo);
  };
  return Range{first([&](const Range& w) { return w.end > j; }),
               first([&](const Range& w) { return w.begin > j; })};
}

}  // namespace

// Axes the validation accepts (length up to 2^30) with kernels and strides near the length: the
// searches' bounds j + K + s + 1 would pass 2^31 in 32-bit arithmetic (they are clamped to the
// axis without forming the sum). Keys near both ends, causal and not.
TEST(InverseNeighborhood, AxesNear2To30) {
  const int L = 1 << 30;
  for (int K : {3, (1 << 20) + 1, 1 << 29, (1 << 29) + 1, L - 1, L})
    for (int s : {1, K / 2 + 1, K})
      for (int causal = 0; causal < 2; ++causal) {
        const Axis a{L, K, 1, s, causal != 0};
        for (int j : {0, 1, K - 1, L / 2, L - K, L - 2, L - 1}) {
          if (j < 0 || j >= L) continue;
          const Range got = fna::nbr::inverse_window(a, L, j), want = wide_inverse(a, L, j);
          EXPECT_EQ(got.begin, want.begin) << describe(a, 0) << " key " << j;
          EXPECT_EQ(got.end, want.end) << describe(a, 0) << " key " << j;
        }
      }
  const int L2 = 715827883;  // the smallest L = K = s with L + K + s + 1 > 2^31 - 1 at key L - 1
  const Axis b{L2, L2, 1, L2, false};
  const Range got = fna::nbr::inverse_window(b, L2, L2 - 1);
  EXPECT_EQ(got.begin, 0);
  EXPECT_EQ(got.end, L2);
}
