// The problem as every fused kernel sees it: the block of parameters that the forward's FwdParams
// and the backward's Params share (both derive from it), built once on the host by
// problem_block() from the public fna::Problem, so forward and backward speak one vocabulary for
// geometry and sizes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/fused/kernel/common/fast_div.h"
#include "cuda/fused/kernel/common/tiling.cuh"
#include "fna/fna.h"

namespace fna {
namespace fused {

struct ProblemBlock {
  Geometry geo;          // lifted axes (leading unused ones: length 1, kernel 1, dilation 1)
  int batch, heads, heads_kv, heads_per_kv, dim, dim_v, num_add;
  int groups;            // dilation groups (the product of the dilations)
  // Divisions by run-time sizes as multiply-and-shift, for the kernels' CTA placement: by each
  // axis's dilation (Group::of, every kernel but the strip forward), the groups and the heads
  // (the forward's fwd_tile; the backward kernels divide by those, and the strip forward by all:
  // at their register limits the multipliers made them spill).
  FastDiv dil[kAxes], div_groups, div_heads;
  // The query region per lifted axis, global coordinates [qlo, qhi) (fna::Problem::query_offset
  // / query_shape; the whole axis without one). Q-role tensors (Q, O, dO, dQ, LSE) hold only the
  // region: the kernels get their pointers shifted back by the region's offset (fill_params), so
  // that a query's global coordinates address it, and load or store no row outside [qlo, qhi).
  int qlo[kAxes], qhi[kAxes];
  int region;            // the region is not the whole grid
  int64_t tokens;        // tokens of the grid (the product of the axis lengths)
  float scale;           // softmax scale
  float scale_log2;      // scale * log2(e): the softmax runs on exp2
  // The relative positional bias (fna::ForwardArgs::rpb; null: none): float32 tables, element
  // strides [head, lifted axis 0, 1, 2] (lifted axes 0), so that the bias of a query at local
  // coordinates q and a key at local k (both in units of the dilation, in one group) is
  // rpb[h * rpb_stride[0] + sum_a (k_a - q_a + K_a - 1) * rpb_stride[1 + a]] (set_bias).
  const float* rpb;
  int rpb_stride[4];
  int rpb_elems;  // entries of one head's table (prod 2 K_a - 1)
};

// The bias table `data` into `b` (null: none). The fused kernels take dense tables only
// (dense_bias: [H, 2 K_a - 1 ..] row-major, so the last axis has unit stride); false when the
// table's elements exceed 32-bit offsets (the kernels index it with int).
inline bool set_bias(ProblemBlock& b, int rank, const void* data, const int64_t* kernel) {
  b.rpb = static_cast<const float*>(data);
  for (int i = 0; i < 4; ++i) b.rpb_stride[i] = 0;
  b.rpb_elems = 0;
  if (data == nullptr) return true;
  int64_t s = 1;
  for (int a = rank - 1; a >= 0; --a) {
    b.rpb_stride[1 + kAxes - rank + a] = static_cast<int>(s);
    s *= 2 * kernel[a] - 1;
    if (s >= (int64_t(1) << 31)) return false;
  }
  b.rpb_stride[0] = static_cast<int>(s);
  b.rpb_elems = static_cast<int>(s);
  return s * b.heads < (int64_t(1) << 31);
}

// Whether a bias-shaped table (rank + 1 strides) is laid out densely: [H, 2 K_a - 1 ..] row-major.
inline bool dense_bias(int rank, const int64_t* strides, const int64_t* kernel) {
  int64_t expect = 1;
  for (int a = rank - 1; a >= 0; --a) {
    if (strides[1 + a] != expect && kernel[a] != 1) return false;
    expect *= 2 * kernel[a] - 1;
  }
  return strides[0] == expect;
}

// Whether global coordinate x of axis `ax` is a query of the region.
FNA_HD bool in_query_region(const ProblemBlock& b, int ax, int x) {
  return x >= b.qlo[ax] && x < b.qhi[ax];
}
// Whether global coordinates x (every axis) are a query of the region.
FNA_HD bool in_query_region(const ProblemBlock& b, const int* x) {
  bool in = true;
  for (int a = 0; a < kAxes; ++a) in = in && in_query_region(b, a, x[a]);
  return in;
}

// Elements from global coordinates 0 to the region's first query in a Q-role tensor with
// element strides `axis` (lifted axes 0..2): qlo . axis. The host moves those tensors' pointers
// back by it (kernels address queries by global coordinates) and TMA maps forward again.
inline int64_t region_elements(const ProblemBlock& b, const int64_t* axis) {
  int64_t n = 0;
  for (int a = 0; a < kAxes; ++a) n += int64_t(b.qlo[a]) * axis[a];
  return n;
}
// `ptr` moved by `elems` elements of `bytes` bytes (a pointer into or before a tensor).
template <class Ptr>
Ptr moved(Ptr ptr, int64_t elems, int64_t bytes) {
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Ptr>>, const char, char>;
  return reinterpret_cast<Ptr>(reinterpret_cast<Byte*>(ptr) + elems * bytes);
}

// The queries problem `p` computes (tiling.cuh QueryBox): its query region, or the whole grid.
inline QueryBox query_box(const Problem& p) {
  QueryBox b;
  for (int ax = 0; ax < kAxes; ++ax) {
    const int src = ax - (kAxes - p.rank);
    b.lo[ax] = src < 0 ? 0 : static_cast<int>(p.query_offset[src]);
    b.hi[ax] = src < 0 ? 1 : static_cast<int>(p.query_offset[src] + p.query_extent(src));
  }
  return b;
}

// The block of problem `p` with softmax scale `scale` (sizes narrowed to int: the plans reject
// problems whose sizes exceed the kernels' limits before any launch).
inline ProblemBlock problem_block(const Problem& p, double scale) {
  ProblemBlock b{};
  b.geo = Geometry::lift(p.rank, p.shape, p.kernel_size, p.dilation, p.stride, p.is_causal);
  b.batch = static_cast<int>(p.batch);
  b.heads = static_cast<int>(p.heads);
  b.heads_kv = static_cast<int>(p.heads_kv);
  b.heads_per_kv = static_cast<int>(p.heads / p.heads_kv);
  b.dim = static_cast<int>(p.dim);
  b.dim_v = static_cast<int>(p.dim_v);
  b.num_add = static_cast<int>(p.num_additional);
  b.groups = b.geo.num_groups();
  for (int ax = 0; ax < kAxes; ++ax) b.dil[ax] = FastDiv(uint32_t(b.geo.axis[ax].dilation));
  b.div_groups = FastDiv(uint32_t(b.groups));
  b.div_heads = FastDiv(uint32_t(b.heads));
  b.region = p.has_query_region() ? 1 : 0;
  const QueryBox box = query_box(p);
  for (int ax = 0; ax < kAxes; ++ax) b.qlo[ax] = box.lo[ax], b.qhi[ax] = box.hi[ax];
  b.tokens = p.tokens();
  b.scale = static_cast<float>(scale);
  b.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  return b;
}

}  // namespace fused
}  // namespace fna
