// The fused kernels' tiling arithmetic (src/cuda/fused/kernel/common/tiling.cuh, host-callable) against brute
// force over the SPEC neighbor relation (the support library's spec_is_neighbor, which shares
// nothing with core/), on random small geometries (seeded) and several query / key tile shapes:
//   - kv_span: every neighbor of every query of a query tile lies in the span's key tiles, every
//     key tile of the span holds at least one neighbor pair, and a key tile flagged "inside" (no
//     mask) holds only neighbor pairs;
//   - tiling_stats: the visited and unmasked key tiles those spans add up to;
//   - rows_span / rows_walk / part_tiling_stats: the runs of key tiles that parts of a query tile
//     (the warp-specialized forward's warpgroups) visit, and their sums;
//   - needed_pairs: the needed (query, key) pairs;
//   - box_plan (the box forward's limits, halo sizes and pair counts, box_plan.h): every 4x4 box's
//     keys, from the SPEC relation, lie in the 16-column x 4-row-chunk region the kernel walks and
//     in its CTA's halo, and the counts add up;
//   - strip_plan (the strip forward's ring, segments and copied rows, strip_plan.h): the widest
//     16-column strip halo, the ring it affords, the refusal when a box's union does not fit it,
//     segments that tile the rows, and the halo rows copied, from the SPEC relation (over inverse
//     neighborhoods: strip_inverse_test.cpp);
//   - axis_tile_pairs, the per-axis tile pairs behind the backward's tile choice and fused_plan:
//     key tiles walking the query tiles laid from their first attending query to their last
//     (the dK / dV kernel), and query tiles walking the key tiles of their windows' union.
// The GPU kernels use these through the device suite; this runs them in CI, without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/fused/kernel/common/box_plan.h"
#include "cuda/fused/kernel/common/strip_plan.h"
#include "cuda/fused/kernel/common/tiling.cuh"
#include "support/problem.h"

namespace {

using fna::fused::Geometry;
using fna::fused::Group;
using fna::fused::KvSpan;
using fna::fused::QueryBox;
using fna::fused::Tile;
using fna::fused::kAxes;

// A random geometry of rank 1-3 (lifted), small enough for brute force: axis lengths up to 300
// (rank 1), 24 (rank 2) or 9 (rank 3); any valid kernel, dilation, stride and causal flag.
Geometry random_geometry(std::mt19937_64& rng, int* rank_out) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int rank = pick(1, 3);
  const int max_len = rank == 1 ? 300 : (rank == 2 ? 24 : 9);
  int64_t len[3], ker[3], dil[3], str[3];
  bool cau[3];
  for (int a = 0; a < rank; ++a) {
    len[a] = pick(1, max_len);
    dil[a] = pick(1, 3) == 1 ? pick(1, static_cast<int>(len[a])) : 1;
    ker[a] = pick(1, static_cast<int>(len[a] / dil[a]));
    str[a] = pick(1, static_cast<int>(ker[a]));
    cau[a] = pick(0, 2) == 0;
  }
  *rank_out = rank;
  return Geometry::lift(rank, len, ker, dil, str, cau);
}

std::string describe(const Geometry& geo) {
  std::ostringstream os;
  for (int a = 0; a < kAxes; ++a) {
    const auto& x = geo.axis[a];
    os << "[L=" << x.length << " K=" << x.kernel << " d=" << x.dilation << " s=" << x.stride
       << " c=" << x.causal << "]";
  }
  return os.str();
}

// Per axis of one dilation group: nb[a][i * len + j] = local key j is a neighbor of local query i
// on axis a (SPEC, on global coordinates).
struct GroupTables {
  std::vector<char> nb[kAxes];
  GroupTables(const Geometry& geo, const Group& gr) {
    for (int a = 0; a < kAxes; ++a) {
      const auto& x = geo.axis[a];
      const int n = gr.len[a];
      nb[a].assign(size_t(n) * n, 0);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
          nb[a][size_t(i) * n + j] = fna_test::spec_is_neighbor(
              x.length, x.kernel, x.dilation, x.stride, x.causal, gr.global(geo, a, i),
              gr.global(geo, a, j));
    }
  }
  bool on_axis(const Group& gr, int a, int i, int j) const {
    return nb[a][size_t(i) * gr.len[a] + j] != 0;
  }
  bool pair(const Group& gr, const int (&q)[kAxes], const int (&k)[kAxes]) const {
    for (int a = 0; a < kAxes; ++a)
      if (!on_axis(gr, a, q[a], k[a])) return false;
    return true;
  }
};

// Calls fn(coords) for every point of the box [lo, hi) (last axis fastest).
template <typename Fn>
void for_box(const int (&lo)[kAxes], const int (&hi)[kAxes], Fn&& fn) {
  for (int x0 = lo[0]; x0 < hi[0]; ++x0)
    for (int x1 = lo[1]; x1 < hi[1]; ++x1)
      for (int x2 = lo[2]; x2 < hi[2]; ++x2) {
        const int c[kAxes] = {x0, x1, x2};
        fn(c);
      }
}

// A random query region of `geo` (global coordinates per lifted axis, at least one query), or
// the whole grid one time in four.
QueryBox random_box(std::mt19937_64& rng, const Geometry& geo) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  QueryBox b = QueryBox::whole(geo);
  if (pick(0, 3) == 0) return b;
  for (int a = 0; a < kAxes; ++a) {
    const int n = geo.axis[a].length;
    b.lo[a] = pick(0, n - 1);
    b.hi[a] = pick(b.lo[a] + 1, n);
  }
  return b;
}

std::string describe(const QueryBox& b) {
  std::ostringstream os;
  os << " queries";
  for (int a = 0; a < kAxes; ++a) os << " [" << b.lo[a] << "," << b.hi[a] << ")";
  return os.str();
}

// Calls fn(flat, gr, tables, q0, q_end) for every query tile (origin q0, tiles of QT) of every
// group `flat` of `geo` over the queries of `box`, laid as the forward kernels lay them (fwd_tile:
// from the group's first query of the box; q_end: the end of its queries per axis), until a fatal
// failure.
template <class QT, typename Fn>
void for_each_test_tile(const Geometry& geo, const QueryBox& box, Fn&& fn) {
  for (int flat = 0; flat < geo.num_groups(); ++flat) {
    const Group gr = Group::of(geo, flat);
    const GroupTables t(geo, gr);
    const int zero[kAxes] = {0, 0, 0};
    int ntiles[kAxes], qb[kAxes], qe[kAxes];
    for (int a = 0; a < kAxes; ++a) {
      qb[a] = box.begin(geo, a, gr.g[a]);
      qe[a] = box.end(geo, a, gr.g[a]);
      ntiles[a] = qe[a] > qb[a] ? fna::fused::tiles_over(qe[a] - qb[a], QT::ext(a)) : 0;
    }
    for_box(zero, ntiles, [&](const int (&ti)[kAxes]) {
      if (::testing::Test::HasFatalFailure()) return;
      int q0[kAxes];
      for (int a = 0; a < kAxes; ++a) q0[a] = qb[a] + ti[a] * QT::ext(a);
      fn(flat, gr, t, q0, qe);
    });
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Checks every query tile of every group of `geo` for tile shapes QT / KT; returns the number of
// key tiles checked.
template <class QT, class KT>
int64_t check_forward(const Geometry& geo, const QueryBox& box) {
  const std::string what = describe(geo) + describe(box) + " q=" + std::to_string(QT::ext(0)) + "x" +
                           std::to_string(QT::ext(1)) + "x" + std::to_string(QT::ext(2)) +
                           " kv=" + std::to_string(KT::ext(0)) + "x" + std::to_string(KT::ext(1)) +
                           "x" + std::to_string(KT::ext(2));
  double visited = 0, unmasked = 0;
  int64_t checked = 0;
  const int zero[kAxes] = {0, 0, 0};
  for_each_test_tile<QT>(geo, box, [&](int flat, const Group& gr, const GroupTables& t,
                                       const int (&q0)[kAxes], const int (&q_end)[kAxes]) {
    int q1[kAxes];
    for (int a = 0; a < kAxes; ++a) q1[a] = std::min(q0[a] + QT::ext(a), q_end[a]);
    const KvSpan sp = fna::fused::kv_span<QT, KT>(geo, gr, q0, q_end);
    // Every neighbor of every query lies in the span's box.
    int box0[kAxes], box1[kAxes];
    for (int a = 0; a < kAxes; ++a) {
      box0[a] = sp.origin[a];
      box1[a] = sp.origin[a] + sp.count[a] * KT::ext(a);
    }
    for_box(q0, q1, [&](const int (&q)[kAxes]) {
      for_box(zero, gr.len, [&](const int (&k)[kAxes]) {
        if (!t.pair(gr, q, k)) return;
        for (int a = 0; a < kAxes; ++a)
          ASSERT_TRUE(k[a] >= box0[a] && k[a] < box1[a])
              << what << " group " << flat << ": key outside the span on axis " << a;
      });
    });
    // Every key tile of the span holds a neighbor pair; an "inside" tile only neighbor pairs.
    for (int n = 0; n < sp.total(); ++n) {
      int k0[kAxes], k1[kAxes];
      const bool inside = fna::fused::kv_tile_at<KT>(sp, n, k0);
      for (int a = 0; a < kAxes; ++a) k1[a] = std::min(k0[a] + KT::ext(a), gr.len[a]);
      bool any = false, all = true;
      for_box(q0, q1, [&](const int (&q)[kAxes]) {
        for_box(k0, k1, [&](const int (&k)[kAxes]) {
          const bool p = t.pair(gr, q, k);
          any = any || p;
          all = all && p;
        });
      });
      if (inside) {
        for (int a = 0; a < kAxes; ++a)
          ASSERT_EQ(k1[a], k0[a] + KT::ext(a)) << what << ": an inside tile overhangs axis " << a;
        ASSERT_TRUE(all) << what << " group " << flat << ": an inside key tile needs a mask";
      }
      ASSERT_TRUE(any) << what << " group " << flat << ": key tile " << n << " has no pair";
      visited += 1;
      unmasked += inside ? 1 : 0;
      ++checked;
    }
  });
  if (::testing::Test::HasFatalFailure()) return checked;
  const fna::fused::TilingStats st = fna::fused::tiling_stats(geo, QT::kExt, KT::kExt, &box);
  EXPECT_EQ(st.visited, visited) << what;
  EXPECT_EQ(st.unmasked, unmasked) << what;
  return checked;
}

// With `regions`, over a random query region of each geometry (the kernels' tiles of a region call,
// whose last tile per axis may overhang the region: the span covers only its queries' windows).
void check_spans(uint64_t seed, bool regions) {
  std::mt19937_64 rng(seed);
  int64_t key_tiles = 0;
  for (int c = 0; c < 60; ++c) {
    int rank = 0;
    const Geometry geo = random_geometry(rng, &rank);
    const QueryBox box = regions ? random_box(rng, geo) : QueryBox::whole(geo);
    SCOPED_TRACE("case " + std::to_string(c) + " rank " + std::to_string(rank));
    // Shapes of the configuration tables (config.h, the backward's) and small odd ones.
    key_tiles += check_forward<Tile<1, 1, 128>, Tile<1, 1, 64>>(geo, box);
    key_tiles += check_forward<Tile<1, 8, 16>, Tile<1, 8, 8>>(geo, box);
    key_tiles += check_forward<Tile<1, 16, 4>, Tile<1, 4, 16>>(geo, box);
    key_tiles += check_forward<Tile<2, 8, 8>, Tile<2, 4, 8>>(geo, box);
    key_tiles += check_forward<Tile<3, 8, 8>, Tile<2, 4, 8>>(geo, box);  // 192 queries
    key_tiles += check_forward<Tile<4, 4, 4>, Tile<2, 8, 8>>(geo, box);
    key_tiles += check_forward<Tile<1, 2, 4>, Tile<2, 1, 2>>(geo, box);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(key_tiles, 1000);  // the sweep reached real spans
}

TEST(FusedTiling, SpansAndStatsMatchBruteForce) { check_spans(20261122, false); }
TEST(FusedTiling, RegionSpansAndStatsMatchBruteForce) { check_spans(20261127, true); }

// Parts of a query tile (rows [r0, r0 + rows), the warp-specialized forward's warpgroups: rows_span,
// rows_walk) against the SPEC relation: every key tile of the span holding a pair with a valid
// query of the part lies in the part's run of the walk, a tile the part's span calls inside (no
// mask) holds only pairs for those queries, and where the part is a box of the tile (`box`; a part
// that wraps around an axis is bounded by a larger box) the run starts and ends on such tiles;
// and part_tiling_stats adds the runs up, part_critical_tiles the slowest part's per query tile.
template <class QT, class KT>
void check_parts(const Geometry& geo, const QueryBox& qbox, int rows, bool box, bool critical) {
  const std::string what = describe(geo) + describe(qbox) + " q=" + std::to_string(QT::ext(0)) + "x" +
                           std::to_string(QT::ext(1)) + "x" + std::to_string(QT::ext(2)) +
                           " rows " + std::to_string(rows);
  const fna::fused::Ext3 qe = fna::fused::ext_of<QT>(), ke = fna::fused::ext_of<KT>();
  const double share = double(rows) / QT::kSize;
  double visited = 0, unmasked = 0, worst_sum = 0;
  for_each_test_tile<QT>(geo, qbox, [&](int, const Group& gr, const GroupTables& t,
                                        const int (&q0)[kAxes], const int (&q_end)[kAxes]) {
    const KvSpan sp = fna::fused::kv_span<QT, KT>(geo, gr, q0, q_end);
    const int n = sp.total();
    double worst = 0;  // the slowest part's tiles, masked ones weighing 1.25
    for (int r0 = 0; r0 < QT::kSize; r0 += rows) {
      const fna::fused::RowsSpan rs = fna::fused::rows_span(geo, gr, q0, q_end, qe, r0, rows);
      const fna::fused::WalkRun run = fna::fused::rows_walk(sp, rs, ke, n, n);
      ASSERT_TRUE(0 <= run.first && run.first <= run.last && run.last <= n)
          << what << ": run [" << run.first << ", " << run.last << ") of " << n;
      KvSpan part = sp;  // the kernel's: the part's inner ranges decide "inside"
      for (int a = 0; a < kAxes; ++a) {
        part.inner_begin[a] = rs.inner_begin[a];
        part.inner_end[a] = rs.inner_end[a];
      }
      int first_needed = -1, last_needed = -1, inside_in_run = 0;
      for (int it = 0; it < n; ++it) {
        int k0[kAxes], k1[kAxes];
        const bool inside = fna::fused::kv_tile_at<KT>(part, it, k0);
        for (int a = 0; a < kAxes; ++a) k1[a] = std::min(k0[a] + KT::ext(a), gr.len[a]);
        bool any = false, all = true;
        for (int r = r0; r < r0 + rows; ++r) {
          int q[kAxes];
          QT::coord(r, q);
          bool valid = true;
          for (int a = 0; a < kAxes; ++a) {
            q[a] += q0[a];
            valid = valid && q[a] < q_end[a];
          }
          if (!valid) continue;
          for_box(k0, k1, [&](const int (&k)[kAxes]) {
            const bool pr = t.pair(gr, q, k);
            any = any || pr;
            all = all && pr;
          });
        }
        if (any) {
          ASSERT_TRUE(it >= run.first && it < run.last)
              << what << ": key tile " << it << " has a pair but lies outside the run ["
              << run.first << ", " << run.last << ")";
          if (first_needed < 0) first_needed = it;
          last_needed = it;
        }
        if (inside && it >= run.first && it < run.last) {
          for (int a = 0; a < kAxes; ++a)
            ASSERT_EQ(k1[a], k0[a] + KT::ext(a)) << what << ": an inside tile overhangs";
          ASSERT_TRUE(all) << what << ": key tile " << it << " is inside but needs a mask";
          unmasked += share;
          ++inside_in_run;
        }
      }
      if (box && first_needed >= 0) {
        EXPECT_EQ(run.first, first_needed) << what;
        EXPECT_EQ(run.last, last_needed + 1) << what;
      } else if (box) {
        EXPECT_EQ(run.first, run.last) << what << ": a part without pairs visits tiles";
      }
      visited += share * (run.last - run.first);
      const int len = run.last - run.first;
      worst = std::max(worst, len + 0.25 * (len - inside_in_run));
    }
    worst_sum += worst;
  });
  if (::testing::Test::HasFatalFailure()) return;
  const fna::fused::TilingStats st = fna::fused::part_tiling_stats(geo, qe, ke, rows, &qbox);
  EXPECT_NEAR(st.visited, visited, 1e-9 * (1 + visited)) << what;
  EXPECT_NEAR(st.unmasked, unmasked, 1e-9 * (1 + unmasked)) << what;
  // The heuristic's per-axis product (exact where the parts split the tile's slowest axis).
  if (critical) {
    EXPECT_NEAR(fna::fused::part_critical_tiles(geo, qe, ke, rows, 0.25, &qbox), worst_sum,
                1e-9 * (1 + worst_sum))
        << what;
  }
}

void check_part_runs(uint64_t seed, bool regions) {
  std::mt19937_64 rng(seed);
  for (int c = 0; c < 40; ++c) {
    int rank = 0;
    const Geometry geo = random_geometry(rng, &rank);
    const QueryBox qb = regions ? random_box(rng, geo) : QueryBox::whole(geo);
    SCOPED_TRACE("case " + std::to_string(c) + " rank " + std::to_string(rank));
    // The warp-specialized forward's tiles (64-row warpgroups), and parts that wrap around an
    // axis (8 rows of a 4x6 tile) or split the fastest one (2 rows of 4).
    check_parts<Tile<1, 1, 128>, Tile<1, 1, 64>>(geo, qb, 64, true, true);
    check_parts<Tile<1, 8, 16>, Tile<1, 8, 8>>(geo, qb, 64, true, true);
    check_parts<Tile<2, 8, 8>, Tile<2, 4, 8>>(geo, qb, 64, true, true);
    check_parts<Tile<3, 8, 8>, Tile<2, 4, 8>>(geo, qb, 64, true, true);
    check_parts<Tile<3, 8, 8>, Tile<1, 8, 8>>(geo, qb, 64, true, true);
    check_parts<Tile<1, 4, 6>, Tile<1, 2, 4>>(geo, qb, 8, false, false);
    check_parts<Tile<2, 2, 4>, Tile<2, 1, 2>>(geo, qb, 2, true, false);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(FusedTiling, PartRunsMatchBruteForce) { check_part_runs(20261124, false); }
// A region call's tiles: a warpgroup whose rows lie past the region visits no key tile.
TEST(FusedTiling, RegionPartRunsMatchBruteForce) { check_part_runs(20261128, true); }

// axis_tile_pairs per axis against the SPEC relation: tiles of `own` at multiples of it (per
// dilation group), each visiting ceil(span / other) tiles of the other kind, where span runs from
// the first to the last position with a neighbor in the tile (queries of a key tile, or keys of a
// query tile).
TEST(FusedTiling, AxisTilePairsMatchBruteForce) {
  std::mt19937_64 rng(11);
  int checked = 0;
  for (int c = 0; c < 80; ++c) {
    int rank = 0;
    const Geometry geo = random_geometry(rng, &rank);
    for (int ax = kAxes - rank; ax < kAxes; ++ax) {
      const auto& x = geo.axis[ax];
      for (int own = 1; own <= 128; own *= 2)
        for (int other = 1; other <= 128; other *= 4)
          for (int own_kv = 0; own_kv < 2; ++own_kv) {
            double want = 0;
            for (int g = 0; g < x.dilation; ++g) {
              const int len = fna::nbr::group_length(x, g);
              auto nb = [&](int i, int j) {  // local query i, local key j
                return fna_test::spec_is_neighbor(x.length, x.kernel, x.dilation, x.stride,
                                                  x.causal, int64_t(i) * x.dilation + g,
                                                  int64_t(j) * x.dilation + g);
              };
              for (int t0 = 0; t0 < len; t0 += own) {
                const int t1 = std::min(t0 + own, len);
                int lo = len, hi = -1;  // positions of the other kind with a neighbor in the tile
                for (int u = 0; u < len; ++u)
                  for (int v = t0; v < t1; ++v)
                    if (own_kv ? nb(u, v) : nb(v, u)) lo = std::min(lo, u), hi = std::max(hi, u);
                if (hi >= lo) want += (hi - lo + 1 + other - 1) / other;
              }
            }
            ASSERT_EQ(fna::fused::axis_tile_pairs(x, own, other, own_kv != 0), want)
                << describe(geo) << " axis " << ax << " own " << own << " other " << other
                << " own_kv " << own_kv;
            ++checked;
          }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(FusedTiling, NeededPairsMatchSpec) {
  std::mt19937_64 rng(7);
  for (int c = 0; c < 200; ++c) {
    int rank = 0;
    const Geometry geo = random_geometry(rng, &rank);
    double want = 1;
    for (int a = 0; a < kAxes; ++a) {
      const auto& x = geo.axis[a];
      double sum = 0;
      for (int64_t q = 0; q < x.length; ++q) {
        const auto w = fna_test::spec_window(x.length, x.kernel, x.dilation, x.stride, x.causal, q);
        sum += double(w.end - w.start);
      }
      want *= sum;
    }
    ASSERT_EQ(fna::fused::needed_pairs(geo), want) << describe(geo);
    // Over a query region: the sums run over the region's queries only.
    const QueryBox box = random_box(rng, geo);
    double want_box = 1;
    for (int a = 0; a < kAxes; ++a) {
      const auto& x = geo.axis[a];
      double sum = 0;
      for (int64_t q = box.lo[a]; q < box.hi[a]; ++q) {
        const auto w = fna_test::spec_window(x.length, x.kernel, x.dilation, x.stride, x.causal, q);
        sum += double(w.end - w.start);
      }
      want_box *= sum;
    }
    ASSERT_EQ(fna::fused::needed_pairs(geo, &box), want_box) << describe(geo) << describe(box);
  }
}

// box_plan against brute force over the SPEC relation, on rank-2 geometries with small windows
// (where the box forward applies) and any dilation, stride and causal flag. Per dilation group and
// axis, the union of a query range's windows is [first key with a neighbor, last + 1); every 4x4
// box's union must fit the region the kernel walks from the union's start (16 columns, rows in
// chunks of 4, at most 32) and lie in its CTA tile's halo; the plan's maximum halo per axis, the
// pairs it multiplies, the rows it copies and the chunks add up over boxes and CTAs; and a plan
// refused for its spans has a box whose union is wider.
TEST(FusedTiling, BoxPlanMatchesBruteForce) {
  std::mt19937_64 rng(20261124);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int accepted = 0, refused = 0;
  for (int c = 0; c < 80; ++c) {
    int64_t len[2], ker[2], dil[2], str[2];
    bool cau[2];
    for (int a = 0; a < 2; ++a) {
      len[a] = pick(1, 45);
      dil[a] = pick(1, 3) == 1 ? pick(1, 3) : 1;
      const int kmax = std::max<int>(1, static_cast<int>(len[a] / dil[a]));
      ker[a] = pick(1, std::min(kmax, c % 3 == 0 ? 20 : 13));
      str[a] = pick(1, 2) == 1 ? pick(1, static_cast<int>(ker[a])) : 1;
      cau[a] = pick(0, 3) == 0;
    }
    const Geometry geo = Geometry::lift(2, len, ker, dil, str, cau);
    const int q[kAxes] = {1, c % 2 == 0 ? 16 : 8, c % 4 < 2 ? 16 : 8};
    // Warp boxes of 4x4 queries (the box and strip forwards) or 2x8 (the strip forward).
    const int wb[kAxes] = {1, c % 3 == 2 ? 2 : 4, c % 3 == 2 ? 8 : 4};
    SCOPED_TRACE("case " + std::to_string(c) + " " + describe(geo) + " tile " +
                 std::to_string(q[1]) + "x" + std::to_string(q[2]) + " box " +
                 std::to_string(wb[1]) + "x" + std::to_string(wb[2]));
    const fna::fused::BoxPlan bp = fna::fused::box_plan(geo, q, 64, wb);
    // Per axis (1: rows, 2: columns): brute-force unions, summed like the plan.
    int halo_max[kAxes] = {1, 1, 1}, box_max[kAxes] = {1, 1, 1};
    double keys[kAxes] = {1, 1, 1}, chunks[kAxes] = {1, 1, 1}, halo[kAxes] = {1, 1, 1};
    for (int ax = 1; ax < kAxes; ++ax) {
      const auto& x = geo.axis[ax];
      keys[ax] = chunks[ax] = halo[ax] = 0;
      for (int g = 0; g < x.dilation; ++g) {
        const int lg = static_cast<int>((x.length - g + x.dilation - 1) / x.dilation);
        // Union of the windows of local queries [i0, i1): local keys with a neighbor among them.
        auto uni = [&](int i0, int i1, int* b) {
          return fna_test::spec_window_union(x.length, x.kernel, x.dilation, x.stride, x.causal, g,
                                             i0, i1, b);
        };
        for (int i0 = 0; i0 < lg; i0 += q[ax]) {
          int hb = 0;
          const int hn = uni(i0, std::min(i0 + q[ax], lg), &hb);
          halo_max[ax] = std::max(halo_max[ax], hn);
          halo[ax] += hn;
          for (int j0 = i0; j0 < i0 + q[ax] && j0 < lg; j0 += wb[ax]) {
            int ub = 0;
            const int un = uni(j0, std::min(j0 + wb[ax], lg), &ub);
            box_max[ax] = std::max(box_max[ax], un);
            ASSERT_GE(ub, hb);
            ASSERT_LE(ub + un, hb + hn);  // the box's keys are in its CTA's halo
            const int ch = ax == 1 ? (un + 3) / 4 : 1;
            chunks[ax] += ch;
            keys[ax] += double(wb[ax]) * (ax == 1 ? 4 * ch : 16);
          }
        }
      }
    }
    const bool spans_fit = box_max[2] <= 16 && box_max[1] <= 32;
    ASSERT_EQ(bp.ok, spans_fit) << bp.why;
    if (!bp.ok) {
      ++refused;
      EXPECT_NE(bp.why.find("positions"), std::string::npos) << bp.why;
      continue;
    }
    ++accepted;
    EXPECT_EQ(bp.halo_rows[1], halo_max[1]);
    EXPECT_EQ(bp.halo_rows[2], halo_max[2]);
    EXPECT_EQ(bp.computed, keys[1] * keys[2]);
    EXPECT_EQ(bp.chunks, chunks[1] * chunks[2]);
    EXPECT_EQ(bp.loaded, halo[1] * halo[2]);
    EXPECT_EQ(bp.smem, size_t(2) * halo_max[1] * halo_max[2] * 128);
  }
  EXPECT_GT(accepted, 20);
  EXPECT_GT(refused, 3);
}

// strip_plan against brute force over the SPEC relation: the ring pitch is the widest union of
// 16 consecutive columns' windows, the ring rows are what the shared-memory budget affords
// (even, at most 64), the plan is refused exactly when the box forward's limits refuse the
// problem or the ring holds fewer than max(16, a box union's rows + 4) rows, the row segments
// (whole multiples of the warp box's rows, none empty) cover the axis, and the copied rows add up the
// segments' unions times the strips' unions over the dilation groups.
TEST(FusedTiling, StripPlanMatchesBruteForce) {
  std::mt19937_64 rng(20261125);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int accepted = 0, refused_ring = 0, segmented = 0;
  for (int c = 0; c < 60; ++c) {
    int64_t len[2], ker[2], dil[2], str[2];
    bool cau[2];
    for (int a = 0; a < 2; ++a) {
      len[a] = pick(1, 100);
      dil[a] = pick(1, 3) == 1 ? pick(1, 3) : 1;
      const int kmax = std::max<int>(1, static_cast<int>(len[a] / dil[a]));
      ker[a] = pick(1, std::min(kmax, 13));
      str[a] = pick(1, 3) == 1 ? pick(1, static_cast<int>(ker[a])) : 1;
      cau[a] = pick(0, 3) == 0;
    }
    const Geometry geo = Geometry::lift(2, len, ker, dil, str, cau);
    // Shared memory: the H100's 227 KB, or a small budget (a ring that may not fit).
    const int optin = c % 5 == 4 ? pick(40, 140) * 1024 : 232448;
    const int sms = 132;
    const double heads = c % 3 == 0 ? 1 : 64;
    SCOPED_TRACE("case " + std::to_string(c) + " " + describe(geo) + " smem " +
                 std::to_string(optin) + " heads " + std::to_string(heads));
    // Warp boxes of 4x4 or 2x8 queries; head dims 64 and 128 (two planes per ring).
    const int bh = c % 2 == 0 ? 4 : 2;
    const int dim = c % 7 < 2 ? 128 : 64, planes = dim / 64;
    const int q[kAxes] = {1, bh, 16};
    const int wb[kAxes] = {1, bh, 16 / bh};
    const fna::fused::BoxPlan bp = fna::fused::box_plan(geo, q, 64, wb);
    // With a bias the head's table follows the rings: 2 K_1 - 1 rows of 32 floats, or one row of
    // 2 K_2 - 1 where K_1 is 1.
    const bool bias = c % 4 == 1;
    const int bias_bytes = !bias ? 0
                           : ker[0] > 1 ? (2 * static_cast<int>(ker[0]) - 1) * 32 * 4
                                        : (2 * static_cast<int>(ker[1]) - 1) * 4;
    const fna::fused::StripPlan sp =
        fna::fused::strip_plan(geo, bh, 16 / bh, 2, sms, optin, heads, dim, bias);
    // Union of the windows of local queries [i0, i1) of group g on axis ax, from the SPEC relation.
    auto uni = [&](int ax, int g, int lg, int i0, int i1) {
      const auto& x = geo.axis[ax];
      int lo = lg, hi = -1;
      for (int i = i0; i < i1; ++i)
        for (int j = 0; j < lg; ++j)
          if (fna_test::spec_is_neighbor(x.length, x.kernel, x.dilation, x.stride, x.causal,
                                         int64_t(i) * x.dilation + g, int64_t(j) * x.dilation + g)) {
            lo = std::min(lo, j);
            hi = std::max(hi, j);
          }
      return hi - lo + 1;
    };
    auto glen = [&](int ax, int g) {
      const auto& x = geo.axis[ax];
      return static_cast<int>((x.length - g + x.dilation - 1) / x.dilation);
    };
    int pitch = 1, box_rows = 1, max_len1 = 1;
    for (int g = 0; g < geo.axis[2].dilation; ++g)
      for (int c0 = 0; c0 < glen(2, g); c0 += 16)
        pitch = std::max(pitch, uni(2, g, glen(2, g), c0, std::min(c0 + 16, glen(2, g))));
    for (int g = 0; g < geo.axis[1].dilation; ++g) {
      max_len1 = std::max(max_len1, glen(1, g));
      for (int r0 = 0; r0 < glen(1, g); r0 += bh)
        box_rows = std::max(box_rows, uni(1, g, glen(1, g), r0, std::min(r0 + bh, glen(1, g))));
    }
    if (!bp.ok) {
      ASSERT_FALSE(sp.ok);
      EXPECT_EQ(sp.why, bp.why);
      continue;
    }
    // Ring rows of `pitch` columns: the widest strip halo rounded up to a multiple of 4 (a band
    // of two rows is then a multiple of 1024 bytes, the TMA swizzle's period); 1024 bytes for the
    // ring's alignment and up to 1024 of static shared memory come off the budget.
    const int halo = pitch;
    pitch = (halo + 3) / 4 * 4;
    const int ring =
        std::min((optin - 2048 - bias_bytes) / (2 * planes * pitch * 128), 64) / 2 * 2;
    if (ring < std::max(16, box_rows + 4)) {
      ASSERT_FALSE(sp.ok) << "ring " << ring;
      EXPECT_NE(sp.why.find("shared memory"), std::string::npos) << sp.why;
      ++refused_ring;
      continue;
    }
    ASSERT_TRUE(sp.ok) << sp.why;
    ++accepted;
    EXPECT_EQ(sp.sp.pitch, pitch);
    EXPECT_GE(sp.sp.pitch, halo);
    EXPECT_EQ(2 * sp.sp.pitch * 128 % 1024, 0);
    EXPECT_EQ(sp.sp.ring_rows, ring);
    EXPECT_EQ(sp.box_rows, box_rows);
    EXPECT_EQ(sp.smem, size_t(ring) * 2 * planes * pitch * 128 + 1024 + bias_bytes);
    EXPECT_LE(sp.smem + 1024, size_t(optin));
    const int seg = sp.sp.seg_rows;
    ASSERT_GT(seg, 0);
    EXPECT_EQ(seg % bh, 0);
    EXPECT_GE(int64_t(sp.sp.segs) * seg, max_len1);
    EXPECT_LT(int64_t(sp.sp.segs - 1) * seg, max_len1);
    if (sp.sp.segs > 1) ++segmented;
    double loaded = 0;
    for (int g1 = 0; g1 < geo.axis[1].dilation; ++g1)
      for (int r0 = 0; r0 < glen(1, g1); r0 += seg) {
        const int rows = uni(1, g1, glen(1, g1), r0, std::min(r0 + seg, glen(1, g1)));
        for (int g2 = 0; g2 < geo.axis[2].dilation; ++g2)
          for (int c0 = 0; c0 < glen(2, g2); c0 += 16)
            loaded += double(rows) * uni(2, g2, glen(2, g2), c0, std::min(c0 + 16, glen(2, g2)));
      }
    EXPECT_EQ(sp.loaded, loaded);
    EXPECT_EQ(sp.box.computed, bp.computed);
  }
  EXPECT_GT(accepted, 15);
  EXPECT_GT(refused_ring, 1);
  EXPECT_GT(segmented, 3);
}

}  // namespace

// The tile walk (walk_divisors): for every order and random tile counts, tile numbers 0 .. n - 1
// land on every tile exactly once, with order[0] the fastest axis.
TEST(FusedTiling, WalkVisitsEveryTileOnce) {
  std::mt19937_64 rng(13);
  const int orders[6][kAxes] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (int c = 0; c < 60; ++c) {
    int count[kAxes];
    for (int& n : count) n = std::uniform_int_distribution<int>(1, 7)(rng);
    for (const auto& order : orders) {
      int div[kAxes];
      fna::fused::walk_divisors(count, order, div);
      const int n = count[0] * count[1] * count[2];
      std::vector<int> seen(n, 0);
      for (int t = 0; t < n; ++t) {
        int flat = 0;
        for (int a = 0; a < kAxes; ++a) flat = flat * count[a] + t / div[a] % count[a];
        ++seen[flat];
      }
      for (int f = 0; f < n; ++f) ASSERT_EQ(seen[f], 1) << "tile " << f;
      // Consecutive tile numbers step along the fastest axis.
      if (count[order[0]] > 1) EXPECT_EQ(1 / div[order[0]] % count[order[0]], 1);
    }
  }
}

// walk_order: the default (last axis fastest) where no order reaches 10% fewer halo tokens
// (2d-large's square windows); the axes whose windows cover most of them fastest for 3d-video
// (18x24x24 windows on 30x48x80: axis 0, then 1, then 2); the box model's footprint is the
// product of per-axis extents, checked against a direct count on one case; and a walk named by
// the problem's axes (Tuning::fwd_walk) lifted to three axes, invalid names refused.
TEST(FusedTiling, WalkOrderHeuristic) {
  auto geo_of = [](int rank, std::vector<int64_t> len, std::vector<int64_t> ker) {
    const int64_t one[3] = {1, 1, 1};
    const bool no[3] = {false, false, false};
    return Geometry::lift(rank, len.data(), ker.data(), one, one, no);
  };
  int order[kAxes];
  const Geometry video = geo_of(3, {30, 48, 80}, {18, 24, 24});
  fna::fused::walk_order(video, {2, 8, 8}, 132, order);
  EXPECT_EQ(order[0] * 100 + order[1] * 10 + order[2], 12);  // 0, 1, 2
  fna::fused::walk_order(video, {3, 8, 8}, 132, order);
  EXPECT_EQ(order[0] * 100 + order[1] * 10 + order[2], 12);
  const Geometry large = geo_of(2, {256, 256}, {63, 63});
  for (const auto& ext : {std::vector<int>{1, 8, 16}, std::vector<int>{1, 16, 8}}) {
    fna::fused::walk_order(large, {ext[0], ext[1], ext[2]}, 132, order);
    EXPECT_EQ(order[0] * 100 + order[1] * 10 + order[2], 210) << ext[1] << "x" << ext[2];
  }
  // Footprint of 132 tiles of 2x8x8 walked 2, 1, 0 on the video grid: 10 x 6 tiles per frame
  // pair, so 3 frame pairs (6 frames + 17), all 48 rows, all 80 columns.
  const int def[kAxes] = {2, 1, 0};
  EXPECT_EQ(fna::fused::walk_footprint(video, {2, 8, 8}, 132, def), 23.0 * 48 * 80);
  ASSERT_TRUE(fna::fused::lifted_walk("102", 3, order));
  EXPECT_EQ(order[0] * 100 + order[1] * 10 + order[2], 102);
  ASSERT_TRUE(fna::fused::lifted_walk("01", 2, order));  // problem axes 0, 1 are lifted 1, 2
  EXPECT_EQ(order[0] * 100 + order[1] * 10 + order[2], 120);
  ASSERT_TRUE(fna::fused::lifted_walk("0", 1, order));
  EXPECT_EQ(order[0] * 100 + order[1] * 10 + order[2], 210);
  for (const char* bad : {"112", "21", "0123", "x01", "2"}) {
    order[0] = order[1] = order[2] = 7;
    EXPECT_FALSE(fna::fused::lifted_walk(bad, std::string(bad) == "2" ? 2 : 3, order)) << bad;
  }
}
