// Host: the TMA maps of the forward kernels that load by TMA (the plan builds them when it
// chooses TMA copies; the kernels receive them as __grid_constant__ parameters).
#pragma once

#include <string>

#include "cuda/common/tma.h"
#include "cuda/fused/kernel/common/fwd_params.h"

namespace fna {
namespace fused {

// One warpgroup's box of 64 rows of query tile `q` (the tile split along part_axis), or false
// where the tile does not split into such boxes.
inline bool warpgroup_box(const int (&q)[kAxes], int (&box)[kAxes]) {
  const int parts = q[0] * q[1] * q[2] / 64;
  const int split = part_axis(q, parts);
  if (split < 0) return false;
  for (int a = 0; a < kAxes; ++a) box[a] = q[a];
  box[split] /= parts;
  return true;
}

// The map of a query-role tensor (Q, or the Hopper dQ kernel's dO: `dim` columns, `stride`)
// spanning the query region (the whole grid without one): it describes the tensor as it is (the
// pointer `shifted`, moved back by the region's offset, see fill_params, moved forward again), and
// the kernels' coordinates are global minus qlo; rows past the region's end read as zeros.
inline bool query_map(tma::TokenMap* m, const FwdParams& p, const void* shifted, int64_t dim,
                      const int64_t (&stride)[5], const int (&box)[kAxes], std::string* why) {
  const int dil[kAxes] = {p.geo.axis[0].dilation, p.geo.axis[1].dilation, p.geo.axis[2].dilation};
  const int64_t lq[5] = {p.batch, p.qhi[0] - p.qlo[0], p.qhi[1] - p.qlo[1], p.qhi[2] - p.qlo[2],
                         p.heads};
  return tma::token_map(m, moved(shifted, region_elements(p, stride + 1), 2), dim, lq, stride,
                        box, dil, why);  // 16-bit elements
}

// The maps for a problem of `p` with query / key tiles of `qext` / `kvext` rows per axis (the
// plan calls it when TMA copies are chosen), or on = 0 with `why` when TMA cannot load its tiles:
// additional keys (their own tensors), or tensors or dilations TMA cannot describe
// (tma::token_map).
inline FwdTma fwd_tma_maps(const FwdParams& p, const int (&qext)[kAxes],
                           const int (&kvext)[kAxes], std::string* why) {
  FwdTma t{};
  t.on = 0;
  if (p.num_add > 0) {
    *why = "additional keys are loaded from their own tensors";
    return t;
  }
  const int dil[kAxes] = {p.geo.axis[0].dilation, p.geo.axis[1].dilation, p.geo.axis[2].dilation};
  const int64_t lk[5] = {p.batch, p.geo.axis[0].length, p.geo.axis[1].length,
                         p.geo.axis[2].length, p.heads / p.heads_per_kv};
  if (!query_map(&t.q, p, p.q, p.dim, p.q_stride, qext, why) ||
      !tma::token_map(&t.k, p.k, p.dim, lk, p.k_stride, kvext, dil, why) ||
      !tma::token_map(&t.v, p.v, p.dim_v, lk, p.v_stride, kvext, dil, why))
    return t;
  t.on = 1;
  return t;
}

// The band maps for a strip plan (the plan calls it on sm_90+ devices when TMA copies are
// chosen), or on = 0 where TMA cannot describe the bands (a dilation or tensor layout:
// tma::token_map).
inline StripTma strip_tma_maps(const FwdParams& p, const StripParams& sp, std::string* why) {
  StripTma t{};
  t.on = 0;
  const int box[kAxes] = {1, kStripBandRows, sp.pitch};
  const int dil[kAxes] = {p.geo.axis[0].dilation, p.geo.axis[1].dilation, p.geo.axis[2].dilation};
  const int64_t lk[5] = {p.batch, p.geo.axis[0].length, p.geo.axis[1].length,
                         p.geo.axis[2].length, p.heads / p.heads_per_kv};
  if (!tma::token_map(&t.k, p.k, p.dim, lk, p.k_stride, box, dil, why) ||
      !tma::token_map(&t.v, p.v, p.dim_v, lk, p.v_stride, box, dil, why))
    return t;
  t.on = 1;
  return t;
}

}  // namespace fused
}  // namespace fna
