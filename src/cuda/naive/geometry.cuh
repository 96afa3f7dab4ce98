// Problem geometry and strided views for the naive CUDA kernels.
//
// Every problem is lifted to rank 3 by padding trailing axes with L = K = d = s = 1: a padded axis
// has the single window [0, 1), so neighbor order (row-major over the window box, last axis
// fastest) and token order are those of the original rank.
//
// The query region (Problem::query_offset / query_shape, fused forward / backward only): the
// queries are the box [q_off, q_off + q_len) of the key grid. Query-role tensors (Q, O, dO, dQ,
// LSE, d_LSE) and the workspace rows are indexed by region coordinates q; a query's window is that
// of its global coordinate c = q + q_off. Kernels take the region through a `kRegion` template
// flag and Geo<kRegion>: with it false they are the whole-grid kernels on the plain Geometry,
// unchanged; with it true they take a RegionGeometry.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/neighborhood.h"
#include "fna/fna.h"

namespace fna {
namespace naive {

struct Geometry {
  nbr::Axis axis[3];
  int64_t batch;
  int64_t tokens;    // N = L0 * L1 * L2
  int heads;         // H
  int heads_kv;      // H_kv
  int group;         // G = H / H_kv: query heads sharing one KV head
  int dim;           // D
  int dim_v;         // D_v
  int window;        // W = K0 * K1 * K2
  int num_add;       // N_add
  int cols;          // W + N_add: one row of attention weights
};

// A call with a query region: the region's offset and extent per axis (padded axes: 0 and 1) and
// its token count prod(q_len).
struct RegionGeometry : Geometry {
  int q_off[3];
  int q_len[3];
  int64_t q_tokens;
};

// The geometry type of the kernels' kRegion flag.
template <bool kRegion>
using Geo = std::conditional_t<kRegion, RegionGeometry, Geometry>;

inline Geometry make_geometry(const Problem& p) {
  Geometry g{};
  for (int a = 0; a < 3; ++a) {
    if (a < p.rank)
      g.axis[a] = {static_cast<int>(p.shape[a]), static_cast<int>(p.kernel_size[a]),
                   static_cast<int>(p.dilation[a]), static_cast<int>(p.stride[a]), p.is_causal[a]};
    else
      g.axis[a] = {1, 1, 1, 1, false};
  }
  g.batch = p.batch;
  g.tokens = p.tokens();
  g.heads = static_cast<int>(p.heads);
  g.heads_kv = static_cast<int>(p.heads_kv);
  g.group = static_cast<int>(p.heads / p.heads_kv);
  g.dim = static_cast<int>(p.dim);
  g.dim_v = static_cast<int>(p.dim_v);
  g.window = static_cast<int>(p.window());
  g.num_add = static_cast<int>(p.num_additional);
  g.cols = g.window + g.num_add;
  return g;
}

inline RegionGeometry make_region_geometry(const Problem& p) {
  RegionGeometry g{};
  static_cast<Geometry&>(g) = make_geometry(p);
  for (int a = 0; a < 3; ++a) {
    g.q_off[a] = a < p.rank ? static_cast<int>(p.query_offset[a]) : 0;
    g.q_len[a] = a < p.rank ? static_cast<int>(p.query_extent(a)) : 1;
  }
  g.q_tokens = int64_t(g.q_len[0]) * g.q_len[1] * g.q_len[2];
  return g;
}

template <bool kRegion>
inline Geo<kRegion> make_geo(const Problem& p) {
  if constexpr (kRegion)
    return make_region_geometry(p);
  else
    return make_geometry(p);
}

// Query tokens per (batch, kv head) pair: the region's, or the whole grid's.
__host__ __device__ __forceinline__ int64_t query_tokens(const Geometry& g) { return g.tokens; }
__host__ __device__ __forceinline__ int64_t query_tokens(const RegionGeometry& g) {
  return g.q_tokens;
}
// The region's offset on axis `ax` (0 without a region).
__host__ __device__ __forceinline__ int query_offset(const Geometry&, int) { return 0; }
__host__ __device__ __forceinline__ int query_offset(const RegionGeometry& g, int ax) {
  return g.q_off[ax];
}

// A token-major tensor [B, L0, L1, L2, heads, X] (query, key, value, output, LSE, attention
// weights). Query heads are addressed as (kv head, index in group) so that the f32 workspace,
// which stores the G query heads of one KV head together, is a View too. `origin` is subtracted
// from every offset: a workspace chunk that starts at (batch, kv head) pair p0 has origin at p0.
struct View {
  int64_t sb, sl[3], shkv, sg, sx, origin;
  __host__ __device__ __forceinline__ int64_t at(int64_t b, const int* c, int hkv, int g,
                                                 int64_t x) const {
    return b * sb + c[0] * sl[0] + c[1] * sl[1] + c[2] * sl[2] + hkv * shkv + g * sg + x * sx -
           origin;
  }
};

// Additional keys / values [B, N_add, H_kv, X].
struct AddView {
  int64_t sb, sn, sh, sx;
  __host__ __device__ __forceinline__ int64_t at(int64_t b, int n, int hkv, int64_t x) const {
    return b * sb + n * sn + hkv * sh + x * sx;
  }
};

// The relative positional bias of the QK operator (QKArgs::rpb, float32 [H, 2 K_0 - 1 ..], any
// strides): query head h's entry at per-axis indices i (nbr::bias_index) is t[at(h, i)]; axes past
// the problem's rank have stride 0 (their index is 0). t null: no bias.
struct Bias {
  const float* t = nullptr;
  int64_t sh = 0, st[3] = {0, 0, 0};
  __host__ __device__ __forceinline__ float at(int h, const int* i) const {
    return t[h * sh + i[0] * st[0] + i[1] * st[1] + i[2] * st[2]];
  }
};
inline Bias bias_view(const TensorRef& rpb, int rank) {
  Bias b;
  b.t = static_cast<const float*>(rpb.data);
  b.sh = rpb.strides[0];
  for (int a = 0; a < rank; ++a) b.st[a] = rpb.strides[1 + a];
  return b;
}

// View of a user tensor of rank + 3 dims (rank + 2 for LSE: has_last = false). `group` is G for
// query-head tensors and 1 for KV-head tensors.
inline View user_view(const TensorRef& t, int rank, int group, bool has_last) {
  View v{};
  v.sb = t.strides[0];
  for (int a = 0; a < 3; ++a) v.sl[a] = a < rank ? t.strides[1 + a] : 0;
  const int64_t sh = t.strides[rank + 1];
  v.shkv = sh * group;
  v.sg = sh;
  v.sx = has_last ? t.strides[rank + 2] : 0;
  v.origin = 0;
  return v;
}

inline AddView add_view(const TensorRef& t) {
  return {t.strides[0], t.strides[1], t.strides[2], t.strides[3]};
}

// The dense f32 workspace of attention rows for pairs [p0, p1): layout [pair - p0][token][g][col].
inline View workspace_view(const Geometry& g, int64_t p0) {
  View v{};
  const int64_t row = g.cols, tok = int64_t(g.group) * row;
  v.sx = 1;
  v.sg = row;
  v.sl[2] = tok;
  v.sl[1] = tok * g.axis[2].length;
  v.sl[0] = v.sl[1] * g.axis[1].length;
  v.shkv = tok * g.tokens;
  v.sb = v.shkv * g.heads_kv;
  v.origin = p0 * v.shkv;
  return v;
}

// With a query region the rows are the region's tokens only, row-major over the region and
// addressed by region coordinates: [pair - p0][region token][g][col].
inline View workspace_view(const RegionGeometry& g, int64_t p0) {
  View v{};
  const int64_t row = g.cols, tok = int64_t(g.group) * row;
  v.sx = 1;
  v.sg = row;
  v.sl[2] = tok;
  v.sl[1] = tok * g.q_len[2];
  v.sl[0] = v.sl[1] * g.q_len[1];
  v.shkv = tok * g.q_tokens;
  v.sb = v.shkv * g.heads_kv;
  v.origin = p0 * v.shkv;
  return v;
}

// ---- element access: every load widens to f32, every store rounds once -------------------------
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- token coordinates ---------------------------------------------------------------------------
__device__ __forceinline__ void token_coords(const Geometry& g, int64_t n, int* c) {
  c[2] = static_cast<int>(n % g.axis[2].length);
  n /= g.axis[2].length;
  c[1] = static_cast<int>(n % g.axis[1].length);
  c[0] = static_cast<int>(n / g.axis[1].length);
}

// Region coordinates of query token n of the region (row-major over q_len, last axis fastest).
__device__ __forceinline__ void region_coords(const RegionGeometry& g, int64_t n, int* q) {
  q[2] = static_cast<int>(n % g.q_len[2]);
  n /= g.q_len[2];
  q[1] = static_cast<int>(n % g.q_len[1]);
  q[0] = static_cast<int>(n / g.q_len[1]);
}

// The local indices of dilation group `grp` (global coordinate i * d + grp) on one axis whose
// global coordinates lie in [x0, x1) (0 <= x0 < x1): [ceil((x0 - grp) / d), ceil((x1 - grp) / d)).
// Both numerators are >= 0 since grp < d, so integer division is the ceiling.
__device__ __forceinline__ nbr::Range group_span(int x0, int x1, int grp, int d) {
  return {(x0 - grp + d - 1) / d, (x1 - grp + d - 1) / d};
}

// Where a global coordinate sits in its dilation group: group index, local index, group length.
struct Local {
  int group, index, length;
};
__device__ __forceinline__ Local local_of(const nbr::Axis& a, int x) {
  const int grp = x % a.dilation;
  return {grp, x / a.dilation, nbr::group_length(a, grp)};
}

// One row of attention weights of a chunk: which (batch, query token, kv head, query head in
// group) it belongs to. Rows enumerate [pair][token][g] for pairs p0.. (pair = b * H_kv + kv head);
// with kRegion the tokens are the region's (n < q_tokens). `c` is the query's global coordinate
// (its window), `q` its region coordinate (set with kRegion only); query_coords gives the one that
// query-role tensors and the workspace are addressed by.
struct Row {
  int64_t b, n;
  int hkv, g;
  int c[3];
  int q[3];
};
template <bool kRegion = false>
__device__ __forceinline__ Row decode_row(const Geo<kRegion>& g, int64_t p0, int64_t r) {
  Row row;
  row.g = static_cast<int>(r % g.group);
  r /= g.group;
  if constexpr (kRegion) {
    row.n = r % g.q_tokens;
    const int64_t pair = p0 + r / g.q_tokens;
    row.b = pair / g.heads_kv;
    row.hkv = static_cast<int>(pair % g.heads_kv);
    region_coords(g, row.n, row.q);
    for (int ax = 0; ax < 3; ++ax) row.c[ax] = row.q[ax] + g.q_off[ax];
  } else {
    row.n = r % g.tokens;
    const int64_t pair = p0 + r / g.tokens;
    row.b = pair / g.heads_kv;
    row.hkv = static_cast<int>(pair % g.heads_kv);
    token_coords(g, row.n, row.c);
  }
  return row;
}

// The coordinates of a row's query in query-role tensors and the workspace: its region
// coordinates, or without a region its global ones.
template <bool kRegion>
__device__ __forceinline__ const int* query_coords(const Row& row) {
  return kRegion ? row.q : row.c;
}

}  // namespace naive
}  // namespace fna
