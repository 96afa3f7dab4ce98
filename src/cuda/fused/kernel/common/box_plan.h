// Host-side geometry of the box forward (fwd_box.cuh): which problems it takes, how much shared
// memory a CTA needs, and how many (query, key) pairs it computes. Shared by the launcher, the
// configuration choice (forward.cu) and the plan statistics.
//
// The kernel tiles a rank-2 problem's queries into CTA tiles (QT, e.g. 8x8) of 4x4 warp boxes.
// A CTA copies the union of its queries' windows (the halo) once; each warp multiplies its 16
// queries only against the union of *their* windows, walked as 64-key chunks of 4 rows x 16
// columns (two 8-key ldmatrix blocks per row). So the fast axis of a box's union must fit 16
// positions and its row axis 32 (one bit per row in the mask).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "cuda/fused/kernel/common/bias_stage.h"
#include "cuda/fused/kernel/common/tiling.cuh"

namespace fna {
namespace fused {

constexpr int kBoxExt = 4;        // warp box: 4 x 4 queries (one m16 tile)
constexpr int kBoxChunkRows = 4;  // box-union rows per 64-key chunk
constexpr int kBoxCols = 16;      // box-union columns a chunk covers (fast axis)
constexpr int kBoxMaxRows = 32;   // box-union rows the row mask holds
// Bands of kBoxChunkRows halo rows, one mbarrier each: a CTA tile of at most 32 rows whose boxes'
// unions span at most 32 rows has a halo of at most 32 - 4 + 32 = 60 rows.
constexpr int kBoxMaxBands = 16;

// The box forward's shared memory, one layout for the host (its size) and the kernel (its
// offsets): the halo's K rows, then as many V rows (Q goes straight to registers).
struct BoxSmem {
  uint32_t row_bytes;  // one key row (the padded head dim's 16-bit elements)
  uint32_t halo;       // rows of the largest CTA halo
  FNA_HD uint32_t v_offset() const { return halo * row_bytes; }
  FNA_HD size_t bytes() const { return 2 * size_t(halo) * row_bytes; }
};

// The bytes of a bias table staged after the box or strip forward's K / V rows (bias_stage.h's
// layout); false, with the reason, where the layout does not hold it (it always does for the
// windows these kernels take: a box union's 16 columns bound K_2).
inline bool box_bias_bytes(const Geometry& geo, size_t* bytes, std::string* why) {
  const int ks[kAxes] = {geo.axis[0].kernel, geo.axis[1].kernel, geo.axis[2].kernel};
  if (bias_stageable(ks, bytes)) return true;
  *why = "its bias table does not fit the staged layout (rows of up to " +
         std::to_string(stage_stride(1)) + " entries)";
  return false;
}

struct BoxPlan {
  bool ok = false;
  std::string why;          // when !ok: what rules the problem out
  int halo_rows[kAxes] = {1, 1, 1};  // largest CTA halo per axis (all groups)
  size_t smem = 0;          // dynamic shared memory per CTA (bytes)
  double chunks = 0;        // 64-key chunks per (batch, head), over all warps
  double computed = 0;      // (query, key) pairs multiplied per (batch, head)
  double loaded = 0;        // K / V rows the CTAs copy per (batch, head) (their halos)
  double fast_fill = 0;     // mean share of a chunk's 16 columns inside its box's union
};

// `q` is the CTA tile lifted to three axes (q[0] == 1), `dim` the padded head dim, `wb` the warp
// box (16 queries: 4x4, or 2x8 for the strip forward, whose 2-row boxes' unions span fewer rows).
// `inverse` (the strip dK / dV kernel): boxes of keys against their inverse neighborhoods.
inline BoxPlan box_plan(const Geometry& geo, const int (&q)[kAxes], int dim,
                        const int (&wb)[kAxes] = {1, kBoxExt, kBoxExt}, bool inverse = false) {
  BoxPlan bp;
  auto uni = [inverse](const nbr::Axis& a, int len, int i0, int i1) {
    return nbr::tile_union_of(a, len, i0, i1, inverse);
  };
  if (geo.axis[0].length != 1 || q[0] != 1) {
    bp.why = "the box forward takes rank-2 problems only";
    return bp;
  }
  int max_box[kAxes] = {1, 1, 1};
  double chunks_ax[kAxes] = {1, 1, 1}, keys_ax[kAxes] = {1, 1, 1}, halo_ax[kAxes] = {1, 1, 1};
  for (int ax = 1; ax < kAxes; ++ax) {
    const nbr::Axis& a = geo.axis[ax];
    double ch = 0, keys = 0, halo = 0, fill = 0, boxes = 0;
    for (int g = 0; g < a.dilation; ++g) {
      const int len = nbr::group_length(a, g);
      for (int i0 = 0; i0 < len; i0 += q[ax]) {
        const int i1 = std::min(i0 + q[ax], len);
        const int hn = uni(a, len, i0, i1).size();
        bp.halo_rows[ax] = std::max(bp.halo_rows[ax], hn);
        halo += hn;
        for (int j0 = i0; j0 < i0 + q[ax] && j0 < len; j0 += wb[ax]) {
          const int u = uni(a, len, j0, std::min(j0 + wb[ax], len)).size();
          max_box[ax] = std::max(max_box[ax], u);
          fill += double(std::min(u, kBoxCols)) / kBoxCols;
          boxes += 1;
          // Along the rows a box walks ceil(u / 4) chunks; across, one 16-column chunk.
          const int c = ax == 1 ? (u + kBoxChunkRows - 1) / kBoxChunkRows : 1;
          ch += c;
          keys += double(wb[ax]) * (ax == 1 ? c * kBoxChunkRows : kBoxCols);
        }
      }
    }
    chunks_ax[ax] = ch;
    keys_ax[ax] = keys;
    halo_ax[ax] = halo;
    if (ax == 2) bp.fast_fill = boxes > 0 ? fill / boxes : 0;
  }
  if (max_box[2] > kBoxCols) {
    bp.why = "a " + std::to_string(wb[2]) + "-query box's windows span " +
             std::to_string(max_box[2]) +
             " positions on the last axis (the box forward holds " + std::to_string(kBoxCols) + ")";
    return bp;
  }
  if (max_box[1] > kBoxMaxRows) {
    bp.why = "a " + std::to_string(wb[1]) + "-query box's windows span " +
             std::to_string(max_box[1]) +
             " positions on the first axis (the box forward holds " + std::to_string(kBoxMaxRows) +
             ")";
    return bp;
  }
  bp.smem = BoxSmem{uint32_t(dim) * 2, uint32_t(bp.halo_rows[1] * bp.halo_rows[2])}.bytes();
  bp.chunks = chunks_ax[1] * chunks_ax[2];
  bp.computed = keys_ax[1] * keys_ax[2];
  bp.loaded = halo_ax[1] * halo_ax[2];
  bp.ok = true;
  return bp;
}

}  // namespace fused
}  // namespace fna
