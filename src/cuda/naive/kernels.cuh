// The paper's section 3.1 operators as plain CUDA kernels (one thread per output element), plus
// the row softmax and its backward. Correctness over speed: f32 accumulation, no atomics (every
// output element is owned by one thread), neighborhoods only from core/neighborhood.h.
//
// Rows of attention weights are addressed through `View`s so the same kernels read / write both
// the user's strided tensors (unfused ops) and the dense f32 workspace (fused forward / backward).
//
// kRegion (fused forward / backward with a query region, see geometry.cuh): query rows are the
// region's; query-role tensors and the workspace are addressed at region coordinates, windows at
// global ones, and the key-side kernels visit only the queries inside the region. kRegion = false
// is the whole-grid code as it always was.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda/naive/geometry.cuh"

namespace fna {
namespace naive {

constexpr int kThreads = 256;

#define FNA_GRID_STRIDE(i, total) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (total); \
       i += int64_t(gridDim.x) * blockDim.x)

// <a, b> over `width` elements in f32, summed in index order. Each thread walks its own key row,
// so scalar loads cost one L1 transaction per element for the warp's 32 rows; 16-byte loads (dense
// rows, 16-byte aligned) cut that by 4-8x without changing the summation order or the result.
template <typename T>
__device__ __forceinline__ float dot(const T* a, int64_t sa, const T* b, int64_t sb, int width) {
  constexpr int kVec = 16 / sizeof(T);
  float acc = 0.f;
  const bool vec = sa == 1 && sb == 1 && width % kVec == 0 &&
                   (reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) % 16 == 0;
  if (vec) {
    for (int x = 0; x < width; x += kVec) {
      const uint4 ua = *reinterpret_cast<const uint4*>(a + x);
      const uint4 ub = *reinterpret_cast<const uint4*>(b + x);
      T ea[kVec], eb[kVec];
      memcpy(ea, &ua, 16);
      memcpy(eb, &ub, 16);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc = fmaf(to_f32(ea[e]), to_f32(eb[e]), acc);
    }
    return acc;
  }
  for (int x = 0; x < width; ++x) acc = fmaf(to_f32(a[x * sa]), to_f32(b[x * sb]), acc);
  return acc;
}

// PN (pointwise-neighborhood): out[row, w] = scale * <A[row], B[w-th neighbor]> for w < W, and
// scale * <A[row], addB[w - W]> for the additional columns. Slots that are not neighbors (causal
// windows near the start of an axis) get `masked`. A is query-head role, B KV-head role, both of
// width `width`. Serves QK^T (A=Q, B=K; with `bias` the neighbors' entries are added, in float32)
// and the gradient of P (A=dO, B=V).
template <typename TIn, typename TOut, bool kRegion = false>
__global__ void pn_kernel(Geo<kRegion> g, int64_t p0, int64_t rows, const TIn* a, View va,
                          const TIn* bm, View vb, const TIn* add_b, AddView vab, int width,
                          TOut* out, View vo, float scale, float masked, Bias bias) {
  FNA_GRID_STRIDE(t, rows * g.cols) {
    const int64_t r = t / g.cols;
    const int col = static_cast<int>(t % g.cols);
    const Row row = decode_row<kRegion>(g, p0, r);
    const int* q = query_coords<kRegion>(row);  // A and out; the window is row.c's
    const TIn* pa = a + va.at(row.b, q, row.hkv, row.g, 0);
    const TIn* pb;
    int64_t sbx;
    float add = 0.f;
    if (col < g.window) {
      const int k[3] = {col / (g.axis[1].kernel * g.axis[2].kernel),
                        (col / g.axis[2].kernel) % g.axis[1].kernel, col % g.axis[2].kernel};
      int y[3], bi[3];
      bool neighbor = true;
      for (int ax = 0; ax < 3; ++ax) {
        const Local l = local_of(g.axis[ax], row.c[ax]);
        const nbr::Range w = nbr::window(g.axis[ax], l.length, l.index);
        const int j = w.begin + k[ax];
        neighbor = neighbor && j < w.end;
        y[ax] = j * g.axis[ax].dilation + l.group;
        bi[ax] = nbr::bias_index(g.axis[ax], l.index, j);
      }
      if (!neighbor) {
        out[vo.at(row.b, q, row.hkv, row.g, col)] = from_f32<TOut>(masked);
        continue;
      }
      if (bias.t != nullptr) add = bias.at(row.hkv * g.group + row.g, bi);
      pb = bm + vb.at(row.b, y, row.hkv, 0, 0);
      sbx = vb.sx;
    } else {
      pb = add_b + vab.at(row.b, col - g.window, row.hkv, 0);
      sbx = vab.sx;
    }
    out[vo.at(row.b, q, row.hkv, row.g, col)] =
        from_f32<TOut>(scale * dot(pa, va.sx, pb, sbx, width) + add);
  }
}

// NN (neighborhood-neighborhood): out[row, x] = scale * sum_w attn[row, w] * B[w-th neighbor, x]
// (+ the additional columns against addB). Only true neighbors are read, so masked slots of a
// user's attention tensor (-inf) never enter. Serves P V (-> O) and dS K (-> dQ).
template <typename TAttn, typename T, bool kRegion = false>
__global__ void nn_kernel(Geo<kRegion> g, int64_t p0, int64_t rows, const TAttn* attn, View vattn,
                          const T* bm, View vb, const T* add_b, AddView vab, int width, T* out,
                          View vo, float scale) {
  FNA_GRID_STRIDE(t, rows * width) {
    const int64_t r = t / width;
    const int x = static_cast<int>(t % width);
    const Row row = decode_row<kRegion>(g, p0, r);
    const int* q = query_coords<kRegion>(row);  // attn and out; the window is row.c's
    const TAttn* pa = attn + vattn.at(row.b, q, row.hkv, row.g, 0);
    Local l[3];
    nbr::Range w[3];
    for (int ax = 0; ax < 3; ++ax) {
      l[ax] = local_of(g.axis[ax], row.c[ax]);
      w[ax] = nbr::window(g.axis[ax], l[ax].length, l[ax].index);
    }
    const int k1 = g.axis[1].kernel, k2 = g.axis[2].kernel;
    float acc = 0.f;
    int y[3];
    for (int j0 = w[0].begin; j0 < w[0].end; ++j0) {
      y[0] = j0 * g.axis[0].dilation + l[0].group;
      for (int j1 = w[1].begin; j1 < w[1].end; ++j1) {
        y[1] = j1 * g.axis[1].dilation + l[1].group;
        for (int j2 = w[2].begin; j2 < w[2].end; ++j2) {
          y[2] = j2 * g.axis[2].dilation + l[2].group;
          const int slot = ((j0 - w[0].begin) * k1 + (j1 - w[1].begin)) * k2 + (j2 - w[2].begin);
          acc = fmaf(to_f32(pa[slot * vattn.sx]), to_f32(bm[vb.at(row.b, y, row.hkv, 0, x)]), acc);
        }
      }
    }
    for (int n = 0; n < g.num_add; ++n)
      acc = fmaf(to_f32(pa[(g.window + n) * vattn.sx]), to_f32(add_b[vab.at(row.b, n, row.hkv, x)]),
                 acc);
    out[vo.at(row.b, q, row.hkv, row.g, x)] = from_f32<T>(scale * acc);
  }
}

// IN (inverse neighborhood): for each key token, the queries whose windows contain it.
// out[key, x] = scale * sum_{g < G} sum_{query sees key} attn[query, g, slot of key] * A[query, g, x].
// Serves dS^T Q (-> dK) and P^T dO (-> dV). One thread owns one output element: no atomics.
// Rows here are KV rows: [pair][token] for pairs p0.. (every key of the grid). With kRegion only
// the queries of the key's inverse window inside the region are visited (a key none of them sees
// gets 0), attn and A read at the query's region coordinate.
template <typename TAttn, typename T, bool kRegion = false>
__global__ void in_kernel(Geo<kRegion> g, int64_t p0, int64_t kv_rows, const TAttn* attn,
                          View vattn, const T* a, View va, int width, T* out, View vo,
                          float scale) {
  FNA_GRID_STRIDE(t, kv_rows * width) {
    const int64_t r = t / width;
    const int x = static_cast<int>(t % width);
    const int64_t n = r % g.tokens;
    const int64_t pair = p0 + r / g.tokens;
    const int64_t b = pair / g.heads_kv;
    const int hkv = static_cast<int>(pair % g.heads_kv);
    int yc[3];
    token_coords(g, n, yc);
    Local l[3];
    nbr::Range inv[3];
    for (int ax = 0; ax < 3; ++ax) {
      l[ax] = local_of(g.axis[ax], yc[ax]);
      inv[ax] = nbr::inverse_window(g.axis[ax], l[ax].length, l[ax].index);
      if constexpr (kRegion) {
        // Queries of the group inside [q_off, q_off + q_len); an empty range skips the loops.
        const nbr::Range in = group_span(g.q_off[ax], g.q_off[ax] + g.q_len[ax], l[ax].group,
                                         g.axis[ax].dilation);
        inv[ax].begin = inv[ax].begin > in.begin ? inv[ax].begin : in.begin;
        inv[ax].end = inv[ax].end < in.end ? inv[ax].end : in.end;
      }
    }
    const int k1 = g.axis[1].kernel, k2 = g.axis[2].kernel;
    float acc = 0.f;
    // The query's coordinate as attn and A address it: global, less the region's offset.
    int c[3];
    for (int i0 = inv[0].begin; i0 < inv[0].end; ++i0) {
      c[0] = i0 * g.axis[0].dilation + l[0].group - query_offset(g, 0);
      const int o0 = l[0].index - nbr::window(g.axis[0], l[0].length, i0).begin;
      for (int i1 = inv[1].begin; i1 < inv[1].end; ++i1) {
        c[1] = i1 * g.axis[1].dilation + l[1].group - query_offset(g, 1);
        const int o1 = l[1].index - nbr::window(g.axis[1], l[1].length, i1).begin;
        for (int i2 = inv[2].begin; i2 < inv[2].end; ++i2) {
          c[2] = i2 * g.axis[2].dilation + l[2].group - query_offset(g, 2);
          const int o2 = l[2].index - nbr::window(g.axis[2], l[2].length, i2).begin;
          const int slot = (o0 * k1 + o1) * k2 + o2;
          for (int gi = 0; gi < g.group; ++gi)
            acc = fmaf(to_f32(attn[vattn.at(b, c, hkv, gi, slot)]),
                       to_f32(a[va.at(b, c, hkv, gi, x)]), acc);
        }
      }
    }
    out[vo.at(b, yc, hkv, 0, x)] = from_f32<T>(scale * acc);
  }
}

// Gradients of the additional keys / values: every query of the pair sees every additional token.
// out[b, n, hkv, x] = scale * sum_{tokens, g} attn[query, g, W + n] * A[query, g, x].
// With kRegion the queries are the region's (region coordinates): the others contribute nothing.
template <typename TAttn, typename T, bool kRegion = false>
__global__ void add_grad_kernel(Geo<kRegion> g, int64_t p0, int64_t pairs, const TAttn* attn,
                                View vattn, const T* a, View va, int width, T* out, AddView vo,
                                float scale) {
  FNA_GRID_STRIDE(t, pairs * g.num_add * width) {
    const int x = static_cast<int>(t % width);
    const int n = static_cast<int>((t / width) % g.num_add);
    const int64_t pair = p0 + t / (int64_t(width) * g.num_add);
    const int64_t b = pair / g.heads_kv;
    const int hkv = static_cast<int>(pair % g.heads_kv);
    float acc = 0.f;
    int c[3];
    const int64_t queries = query_tokens(g);
    for (int64_t tok = 0; tok < queries; ++tok) {
      if constexpr (kRegion)
        region_coords(g, tok, c);
      else
        token_coords(g, tok, c);
      for (int gi = 0; gi < g.group; ++gi)
        acc = fmaf(to_f32(attn[vattn.at(b, c, hkv, gi, g.window + n)]),
                   to_f32(a[va.at(b, c, hkv, gi, x)]), acc);
    }
    out[vo.at(b, n, hkv, x)] = from_f32<T>(scale * acc);
  }
}

// Row softmax in place over the dense workspace rows of pairs [p0, p0 + rows / (N G)): logits ->
// probabilities, and the row's log-sum-exp into `lse` (a user LSE view) when it is not null.
// With a RegionGeometry the rows are the query region's (N = q_tokens), the LSE addressed at
// region coordinates.
cudaError_t launch_softmax_forward(const Geometry& g, int64_t p0, int64_t rows, float* ws,
                                   float* lse, const View& vlse, cudaStream_t stream);
cudaError_t launch_softmax_forward(const RegionGeometry& g, int64_t p0, int64_t rows, float* ws,
                                   float* lse, const View& vlse, cudaStream_t stream);

// Softmax backward in place over the dense workspace rows of pairs [p0, p0 + rows / (N G)): `s`
// holds the logits and becomes P = softmax(s); `dp` holds dL/dP and becomes
// dL/dS = P * (dP - (sum(P * dP) - d_lse)), with d_lse the gradient into the row's LSE (a user
// LSE view; null = zero). A RegionGeometry as in the forward (d_lse at region coordinates).
cudaError_t launch_softmax_backward(const Geometry& g, int64_t p0, int64_t rows, float* s,
                                    float* dp, const float* d_lse, const View& vdlse,
                                    cudaStream_t stream);
cudaError_t launch_softmax_backward(const RegionGeometry& g, int64_t p0, int64_t rows, float* s,
                                    float* dp, const float* d_lse, const View& vdlse,
                                    cudaStream_t stream);

// Blocks for a grid-stride launch over `total` elements.
inline unsigned grid_for(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (int64_t(1) << 20) ? (blocks > 0 ? blocks : 1) : (int64_t(1) << 20));
}

}  // namespace naive
}  // namespace fna
