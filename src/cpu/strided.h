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
struct Strided {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 1;
  int64_t sb = 0, sl[kMaxRank] = {0, 0, 0}, sh = 0, se = 0;
  int64_t shape[kMaxRank] = {1, 1, 1};

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
    int64_t off = b * sb + h * sh;
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
inline Strided add_view(const TensorRef& r, const Problem& p) {
  const int64_t n[kMaxRank] = {p.num_additional, 1, 1};
  return Strided(r, p.dtype, 1, n);
}

}  // namespace cpu
}  // namespace fna
