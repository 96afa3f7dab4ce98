// Host-side sizing of the SIMT forward (kernel/simt/fwd_simt.cuh): the largest halo (the union of
// a query tile's windows) any of its CTAs copies, which sizes its shared memory.
#pragma once

#include <algorithm>
#include <cstddef>

#include "cuda/fused/kernel/common/tiling.cuh"

namespace fna {
namespace fused {

// Bytes per shared-memory row of a padded head dim kD (16-bit elements): the row plus 16 bytes,
// an odd number of 16-byte chunks, so that the eight lanes of a quarter warp reading eight
// consecutive rows with 16-byte loads hit eight distinct bank groups.
constexpr int simt_row_bytes(int kD) { return kD * 2 + 16; }

// Keys per online-softmax step of a thread (8 dot products, one max, one rescale of O).
constexpr int kSimtKeys = 8;

// Registers per thread the kernel is compiled for (its launch bounds: O and Q take 2 kD).
constexpr int simt_registers(int kD) { return kD <= 32 ? 128 : 256; }

// The largest union of windows of a tile of `q` queries on one axis, over every tile origin of
// every dilation group's length (a group is at most one token shorter than group 0, so two
// lengths cover all groups).
inline int simt_axis_halo(const nbr::Axis& a, int q) {
  int best = 1;
  const int lens[2] = {nbr::group_length(a, 0), nbr::group_length(a, a.dilation - 1)};
  for (int len : lens) {
    if (len <= 0) continue;
    for (int o = 0; o < len; o += q)
      best = std::max(best, nbr::tile_union(a, len, o, std::min(o + q, len)).size());
  }
  return best;
}

struct SimtPlan {
  int halo_rows = 0;  // key rows of the largest halo
  size_t smem = 0;    // its K and V
};

inline SimtPlan simt_plan(const Geometry& geo, const int (&q)[kAxes], int kD) {
  SimtPlan sp;
  sp.halo_rows = 1;
  for (int ax = 0; ax < kAxes; ++ax) sp.halo_rows *= simt_axis_halo(geo.axis[ax], q[ax]);
  sp.smem = size_t(2) * size_t(sp.halo_rows) * size_t(simt_row_bytes(kD));
  return sp;
}

}  // namespace fused
}  // namespace fna
