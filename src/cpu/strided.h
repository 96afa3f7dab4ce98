// Element access into the API's strided views, shared by the CPU reference and the CPU backend.
// (Layout only: it knows nothing about neighborhoods.)
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "fna/fna.h"

namespace fna {
namespace cpu {

// A [B, L_0 .. L_{r-1}, H, X] view (Q, K, V, O, grads, attn), or with rank = 1 and L_0 = N_add
// an additional-token view [B, N_add, H_kv, X]. LSE views [B, L.., H] use se = 0.
// `origin` is added to every token offset: 0, except in region_in_grid's views (a query region's
// tensor addressed by grid tokens).
struct Strided {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 1;
  int64_t sb = 0, sl[kMaxRank] = {0, 0, 0}, sh = 0, se = 0;
  int64_t shape[kMaxRank] = {1, 1, 1};
  int64_t origin = 0;

  Strided() = default;
  Strided(const TensorRef& r, DType t, int rank_, const int64_t* shape_, bool has_last = true)
      : data(r.data), dtype(t), rank(rank_) {
    sb = r.strides[0];
    for (int a = 0; a < rank; ++a) {
      sl[a] = r.strides[1 + a];
      shape[a] = shape_[a];
    }
    sh = r.strides[rank + 1];
    se = has_last ? r.strides[rank + 2] : 0;
  }
  bool present() const { return data != nullptr; }
  // Offset of the token with flattened row-major index t (batch b, head h, element 0).
  int64_t token_offset(int64_t b, int64_t t, int64_t h) const {
    int64_t off = origin + b * sb + h * sh;
    for (int a = rank - 1; a >= 0; --a) {
      off += (t % shape[a]) * sl[a];
      t /= shape[a];
    }
    return off;
  }
  double load(int64_t off) const { return detail::load_as_float(data, off, dtype); }
  void store(int64_t off, double v) const {
    detail::store_from_float(data, off, dtype, static_cast<float>(v));
  }
};

// The views of a problem's roles.
inline Strided grid_view(const TensorRef& r, const Problem& p, DType t, bool has_last = true) {
  return Strided(r, t, p.rank, p.shape, has_last);
}
// A Q-role tensor (Q, O, dO, dQ; LSE, d_LSE with has_last = false) of a query region
// (Problem::query_offset / query_shape): extents [B, E_0 .. E_{r-1}, H, X], token t the
// row-major index over the region's extents E_a = query_extent(a). Without a region, grid_view.
inline Strided region_view(const TensorRef& r, const Problem& p, DType t, bool has_last = true) {
  int64_t e[kMaxRank] = {1, 1, 1};
  for (int a = 0; a < p.rank; ++a) e[a] = p.query_extent(a);
  return Strided(r, t, p.rank, e, has_last);
}
// The same tensor addressed by grid tokens: token_offset(b, t, h) with t a grid token inside the
// region (coordinate x_a = query_offset_a + i_a) is the region element i. The view's shape is
// the grid's and its origin -sum_a query_offset_a * stride_a; only tokens inside the region may
// be addressed.
inline Strided region_in_grid(const TensorRef& r, const Problem& p, DType t, bool has_last = true) {
  Strided s(r, t, p.rank, p.shape, has_last);
  for (int a = 0; a < p.rank; ++a) s.origin -= p.query_offset[a] * s.sl[a];
  return s;
}
inline Strided add_view(const TensorRef& r, const Problem& p) {
  const int64_t n[kMaxRank] = {p.num_additional, 1, 1};
  return Strided(r, p.dtype, 1, n);
}

// A relative positional bias table (ForwardArgs::rpb, BackwardArgs::d_rpb: float32
// [H, 2 K_0 - 1 ..]): its elements, and the element offset (t's strides) of dense row-major index i.
inline int64_t bias_elements(const Problem& p) {
  int64_t n = p.heads;
  for (int a = 0; a < p.rank; ++a) n *= 2 * p.kernel_size[a] - 1;
  return n;
}
inline int64_t bias_offset(const Problem& p, const TensorRef& t, int64_t i) {
  int64_t off = 0;
  for (int d = p.rank; d >= 1; --d) {
    const int64_t ext = 2 * p.kernel_size[d - 1] - 1;
    off += i % ext * t.strides[d];
    i /= ext;
  }
  return off + i * t.strides[0];
}

}  // namespace cpu
}  // namespace fna
