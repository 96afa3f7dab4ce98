// Host-side geometry of the strip forward (fwd_strip.cuh): which problems it takes, the ring of
// halo rows a CTA keeps in shared memory, and the work items of the launch. Shared by the
// launcher, the configuration choice (forward.cu) and the plan statistics.
//
// The strip forward multiplies exactly what the box forward does (box_plan.h: each warp's 4x4
// query box against the union of the box's windows, in 64-key chunks), so box_plan's limits and
// pair counts are its own. What differs is the CTA: it owns a strip of 16 query columns of one
// (batch, head, dilation group) and walks its rows, a run of box rows at a time, while the
// strip's halo rows stream through a ring in shared memory. Each halo row is
// copied once per strip instead of once per query tile, and the per-CTA setup runs once per
// strip.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "cuda/fused/kernel/common/box_plan.h"

namespace fna {
namespace fused {

constexpr int kStripCols = 16;      // query columns of a strip (4 warp boxes of 4x4, or 2 of 2x8)
// A ring row's key row: 64 16-bit elements with the 128-byte swizzle, whatever the head dim the
// kernel multiplies (at head dims up to 32 the TMA box's columns past D land as zeros and the
// products skip them). Head dim 128 keeps two such planes per ring (columns 0-63, then 64-127),
// each laid out as one ring of head dim 64.
constexpr int kStripRowBytes = 128;
constexpr int kStripPlaneCols = kStripRowBytes / 2;

// The rings' planes for a padded head dim (32, 64 or 128).
constexpr int strip_planes(int dim) { return dim > kStripPlaneCols ? 2 : 1; }

constexpr int kStripBandRows = 2;   // halo rows per ring band (one mbarrier and hand-back count)
constexpr int kStripMaxBands = 32;  // ring bands at most (64 halo rows)

// What the launch needs besides FwdParams (passed by value to the kernel).
struct StripParams {
  int strips;     // column strips per (batch, head, group), over the largest group
  int segs;       // row segments per strip
  int seg_rows;   // query rows per segment (a multiple of the warp box's rows)
  int ring_rows;  // halo rows the ring holds (a multiple of kStripBandRows, at least 16)
  int pitch;      // key rows per ring row: the widest strip halo (columns)
};

// The strip forward's shared memory, one layout for the host (its size) and the kernel (its
// offsets): after up to 1024 bytes of alignment (the 128-byte swizzle's period), the K ring's
// planes of ring_rows x pitch key rows each (one plane per 64 columns), then the V ring's; a band
// is kStripBandRows ring rows of one plane. (The backward's strip kernels use it alike: dQ with K
// / V rings, dK / dV with rings of Q / dO rows.)
struct StripSmem {
  uint32_t row_bytes;  // one key row of a plane: kStripRowBytes (64 16-bit elements, zeros past D)
  int ring_rows, pitch;
  int planes;  // strip_planes(head dim)
  FNA_HD uint32_t plane_bytes() const { return uint32_t(ring_rows * pitch) * row_bytes; }
  FNA_HD uint32_t v_offset() const { return uint32_t(planes) * plane_bytes(); }
  FNA_HD uint32_t band_bytes() const { return uint32_t(kStripBandRows * pitch) * row_bytes; }
  FNA_HD size_t bytes() const { return 2 * size_t(v_offset()) + 1024; }
};

// What a strip kernel computes: the forward, the backward's dQ (query boxes over K / V rings),
// or its dK / dV (key boxes over rings of Q and dO rows: the inverse neighborhoods).
enum class StripRole : int { fwd = 0, dq = 1, dkdv = 2 };

struct StripPlan {
  bool ok = false;
  std::string why;  // when !ok: what rules the problem out
  StripParams sp{};
  size_t smem = 0;     // dynamic shared memory per CTA (bytes)
  double items = 0;    // CTAs of one (batch, head)
  double loaded = 0;   // K / V rows the CTAs copy per (batch, head)
  int box_rows = 0;    // the most rows one box row's union spans (the ring holds at least 4 more)
  BoxPlan box;         // the multiplied pairs and chunks (the box forward's)
};

// `box_h` x `box_w`: the warp box (4x4 or 2x8); `rows_in_flight`: box rows the consumer warps
// work on side by side (the configuration's phases); `sms`: the device's SM count (for the row
// segments); `smem_optin`: the most dynamic shared memory a CTA may take; `heads_items`: batch x
// heads (work items scale with it); `dim`: the kernel's padded head dim (32, 64 or 128: its
// rings' planes); `bias`: whether the call has a relative positional bias.
// `inverse`: boxes of keys whose rings hold the query rows of their inverse neighborhoods (the
// dK / dV kernel), unions of inverse windows in place of windows.
inline StripPlan strip_plan(const Geometry& geo, int box_h, int box_w, int rows_in_flight,
                            int sms, int smem_optin, double heads_items, int dim,
                            bool bias = false, bool inverse = false) {
  auto uni = [inverse](const nbr::Axis& a, int len, int i0, int i1) {
    return nbr::tile_union_of(a, len, i0, i1, inverse);
  };
  StripPlan sp;
  if (dim != 32 && dim != 64 && dim != 128) {
    sp.why = "head dim " + std::to_string(dim) + " (the strip forward's are 32, 64 and 128)";
    return sp;
  }
  const int planes = strip_planes(dim);
  if (box_h * box_w != 16 || kStripCols % box_w != 0) {
    sp.why = "warp box " + std::to_string(box_h) + "x" + std::to_string(box_w) +
             " (the strip forward's boxes are 16 queries across a divisor of its 16 columns)";
    return sp;
  }
  size_t bias_bytes = 0;  // with a bias: its staged table after the rings
  if (bias && !box_bias_bytes(geo, &bias_bytes, &sp.why)) return sp;
  const int q[kAxes] = {1, box_h, kStripCols};
  const int wb[kAxes] = {1, box_h, box_w};
  sp.box = box_plan(geo, q, kStripRowBytes / 2, wb, inverse);
  if (!sp.box.ok) {
    sp.why = sp.box.why;  // the strip forward multiplies the box forward's boxes
    return sp;
  }
  const nbr::Axis& a1 = geo.axis[1];
  const nbr::Axis& a2 = geo.axis[2];
  // The widest strip halo, and the most rows a box's union spans.
  int pitch = 1, box_rows = 1;
  int max_len1 = 1, max_len2 = 1;
  for (int g = 0; g < a2.dilation; ++g) {
    const int len = nbr::group_length(a2, g);
    max_len2 = std::max(max_len2, len);
    for (int c0 = 0; c0 < len; c0 += kStripCols)
      pitch = std::max(pitch, uni(a2, len, c0, std::min(c0 + kStripCols, len)).size());
  }
  for (int g = 0; g < a1.dilation; ++g) {
    const int len = nbr::group_length(a1, g);
    max_len1 = std::max(max_len1, len);
    for (int r0 = 0; r0 < len; r0 += box_h)
      box_rows = std::max(box_rows, uni(a1, len, r0, std::min(r0 + box_h, len)).size());
  }
  // Ring rows hold a multiple of 4 columns, so that a band (2 rows) is a multiple of 1024 bytes
  // and each band's TMA box starts on the 128-byte swizzle's period.
  pitch = (pitch + 3) / 4 * 4;
  const size_t row_bytes = kStripRowBytes;
  const size_t ring_row_bytes = 2 * size_t(planes) * size_t(pitch) * row_bytes;  // K and V
  // Up to 1024 bytes to align the ring's start, and up to 1024 of static shared memory (the
  // barriers).
  const size_t avail =
      size_t(smem_optin) > 2048 + bias_bytes ? size_t(smem_optin) - 2048 - bias_bytes : 0;
  int ring = int(std::min<size_t>(avail / ring_row_bytes, size_t(kStripMaxBands * kStripBandRows)));
  ring -= ring % kStripBandRows;
  // A box's union (up to box_rows rows, at any band offset) must fit the ring with a band to
  // spare, or its warp would wait for a band the ring cannot take; the kernel's ring index
  // arithmetic also assumes at least 16 rows.
  const int need = std::max(16, box_rows + 2 * kStripBandRows);
  if (ring < need) {
    sp.why = "its ring of halo rows needs " + std::to_string(need * ring_row_bytes) +
             " bytes of shared memory, the device has " + std::to_string(smem_optin);
    return sp;
  }
  // Row segments: whole columns unless that leaves fewer than two CTAs per SM; a segment keeps at
  // least two rounds of the consumers' box rows.
  const int box_rows_total = (max_len1 + box_h - 1) / box_h;
  const double per_seg = heads_items * double(a1.dilation) * double(a2.dilation) *
                         double((max_len2 + kStripCols - 1) / kStripCols);
  int segs = 1;
  const int min_seg = 2 * rows_in_flight;
  while (per_seg * segs < 2.0 * sms && box_rows_total / (segs + 1) >= min_seg) ++segs;
  const int seg_box_rows = (box_rows_total + segs - 1) / segs;
  segs = (box_rows_total + seg_box_rows - 1) / seg_box_rows;
  sp.sp.strips = (max_len2 + kStripCols - 1) / kStripCols;
  sp.sp.segs = segs;
  sp.sp.seg_rows = seg_box_rows * box_h;
  sp.sp.ring_rows = ring;
  sp.sp.pitch = pitch;
  sp.box_rows = box_rows;
  sp.smem = StripSmem{uint32_t(row_bytes), ring, pitch, planes}.bytes() + bias_bytes;
  sp.items = double(a1.dilation) * a2.dilation * sp.sp.strips * segs;
  // Halo rows copied: per (group, strip, segment) the rows of the segment's union times the
  // strip's columns.
  double loaded = 0;
  for (int g1 = 0; g1 < a1.dilation; ++g1) {
    const int len1 = nbr::group_length(a1, g1);
    double rows = 0;
    for (int r0 = 0; r0 < len1; r0 += sp.sp.seg_rows)
      rows += uni(a1, len1, r0, std::min(r0 + sp.sp.seg_rows, len1)).size();
    for (int g2 = 0; g2 < a2.dilation; ++g2) {
      const int len2 = nbr::group_length(a2, g2);
      for (int c0 = 0; c0 < len2; c0 += kStripCols)
        loaded += rows * uni(a2, len2, c0, std::min(c0 + kStripCols, len2)).size();
    }
  }
  sp.loaded = loaded;
  sp.ok = true;
  return sp;
}

}  // namespace fused
}  // namespace fna
