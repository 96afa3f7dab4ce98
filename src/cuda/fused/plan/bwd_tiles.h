// Host: the fused backward's heuristic tile shapes (pick_tiles) and the plain Hopper dK / dV
// kernel's keys per tile (sm90_key_rows), from the lifted geometry alone. make_bwd_plan
// (bwd_choice.cu) decides with them; tests/cpp/bwd_tiles_test.cpp checks their choices on the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/neighborhood.h"
#include "cuda/fused/kernel/common/tiling.cuh"

namespace fna {
namespace bwd {

using fused::kAxes;

inline int next_pow2(int v) {
  int r = 1;
  while (r < v) r *= 2;
  return r;
}

inline int log2_exact(int v) {
  int e = 0;
  while ((1 << e) < v) ++e;
  return e;
}

// Tile shapes (powers of two, `own_rows` and `other_rows` in all) that minimize the tile pairs
// visited. Ties go to the shape that overhangs the axes least, then to the later axes (contiguous
// in memory; lifted axes lead, so they never win a tie).
inline void pick_tiles_uncached(const fused::Geometry& geo, int own_rows, int other_rows, bool own_kv, int* own,
                         int* other) {
  const int eo = log2_exact(own_rows), et = log2_exact(other_rows);
  for (int a = 0; a < kAxes; ++a) own[a] = other[a] = 1;  // a valid answer before the search
  own[kAxes - 1] = own_rows;
  other[kAxes - 1] = other_rows;
  double pairs[kAxes][8][8];
  for (int a = 0; a < kAxes; ++a)
    for (int i = 0; i <= eo; ++i)
      for (int j = 0; j <= et; ++j)
        // Extents on an axis of length 1 only waste rows: never chosen, except on the last axis
        // (always one of the problem's), which keeps every shape on it a candidate even when
        // all lengths are 1.
        pairs[a][i][j] = geo.axis[a].length == 1 && (i > 0 || j > 0) && a < kAxes - 1
                             ? -1
                             : fused::axis_tile_pairs(geo.axis[a], 1 << i, 1 << j, own_kv);
  double best = -1;
  long best_over = 0, best_pref = 0;
  for (int i0 = 0; i0 <= eo; ++i0)
    for (int i1 = 0; i0 + i1 <= eo; ++i1) {
      const int io[kAxes] = {i0, i1, eo - i0 - i1};
      for (int j0 = 0; j0 <= et; ++j0)
        for (int j1 = 0; j0 + j1 <= et; ++j1) {
          const int jo[kAxes] = {j0, j1, et - j0 - j1};
          double cost = 1;
          long over = 0, pref = 0;
          bool skip = false;
          for (int a = 0; a < kAxes; ++a) {
            skip = skip || pairs[a][io[a]][jo[a]] < 0;
            cost *= pairs[a][io[a]][jo[a]];
            const int cap = next_pow2(nbr::group_length(geo.axis[a], 0));
            over += std::max(0, (1 << io[a]) - cap) + std::max(0, (1 << jo[a]) - cap);
          }
          // Rows on the later axes first (the last axis is the most significant digit).
          for (int a = kAxes - 1; a >= 0; --a) pref = pref * 16 + io[a] + jo[a];
          if (skip) continue;
          const bool better = best < 0 || cost < best ||
                              (cost == best && (over < best_over ||
                                                (over == best_over && pref > best_pref)));
          if (better) {
            best = cost, best_over = over, best_pref = pref;
            for (int a = 0; a < kAxes; ++a) own[a] = 1 << io[a], other[a] = 1 << jo[a];
          }
        }
    }
}

// Host time matters next to short kernels: the choice is cached per geometry.
inline void pick_tiles(const fused::Geometry& geo, int own_rows, int other_rows, bool own_kv, int* own, int* other) {
  std::vector<int> key = {own_rows, other_rows, own_kv ? 1 : 0};
  for (int a = 0; a < kAxes; ++a) {
    const nbr::Axis& x = geo.axis[a];
    key.insert(key.end(), {x.length, x.kernel, x.dilation, x.stride, x.causal ? 1 : 0});
  }
  static std::mutex mu;
  static std::map<std::vector<int>, std::vector<int>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      for (int a = 0; a < kAxes; ++a) own[a] = it->second[a], other[a] = it->second[kAxes + a];
      return;
    }
  }
  pick_tiles_uncached(geo, own_rows, other_rows, own_kv, own, other);
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() > 4096) cache.clear();
  cache[key] = {own[0], own[1], own[2], other[0], other[1], other[2]};
}

// The plain Hopper dK / dV kernel's keys per tile (64 or 128) for the heuristic's own tiles: the
// one whose query-tile steps cost less, a step counted as 1 (the query tile's copy, its dQ
// atomics and the barriers) plus its MMAs' share, which scales with the keys and the columns.
// Over a small window a 64-key tile's inverse neighborhood spans fewer query tiles per key
// (nat-t's 7x7 windows: 4 query tiles per 64 keys against 6 per 128); over large windows the
// steps double and 128 keys stay. Only at padded head dim 64: at 128 the one warpgroup also runs
// both dQ column blocks in turn, and 64-key tiles ran 2d-k3 / 2d-k7 forward+backward 1.30x /
// 1.37x slower. At 64 the 64-key kernel runs three CTAs per SM against the 128-key kernel's one,
// so its MMAs count 0.75 against 2: with 1.0, 2d-nat and 3d-small took 128-key tiles and ran
// forward+backward 1.10x / 1.08x slower; with 0.75 both run their best configuration and random
// 1-D, 2-D and 3-D problems at head dim 64 stay within 1.09x of theirs. Where max(D, D_v) <= 32
// its products cover 32 columns (BwdLaunch::dim_cols) and count 0.5 (nat-late ran 1.27x slower
// on 128-key tiles). bench/heuristic_quality.py, H100, 2026-11-26. With a bias the 64-column
// instance keeps two CTAs per SM (bwd_dkdv_sm90.cuh), so its MMAs count 1 as before.
inline int sm90_key_rows(const fused::Geometry& geo, int dpad, int64_t dmax, bool bias) {
  if (dpad != 64) return 128;
  double cost[2];
  const int rows[2] = {64, 128};
  const double mma[2] = {dmax <= 32 ? 0.5 : bias ? 1.0 : 0.75, 2.0};  // the MMAs' share of a step
  for (int i = 0; i < 2; ++i) {
    int kv[kAxes], q[kAxes];
    pick_tiles(geo, rows[i], 64, true, kv, q);
    double visited = 1;
    for (int a = 0; a < kAxes; ++a) visited *= fused::axis_tile_pairs(geo.axis[a], kv[a], q[a], true);
    cost[i] = visited * (1.0 + mma[i]);
  }
  return cost[0] < cost[1] ? 64 : 128;
}

}  // namespace bwd
}  // namespace fna
