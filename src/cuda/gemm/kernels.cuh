// cuda-gemm: the unfused operators as tensor-core GEMMs over tiles (the paper's section 3.2).
//
// The naive kernels (cuda/naive) give each output element its own thread and dot product. Here a
// CTA owns a tile of 64 rows that share a (batch, head) and a dilation group: a box of query
// tokens (PN, NN) or of key tokens (IN), the box's extents per axis chosen by the host (Tile).
// Along each axis the windows of a box of queries are contained in one interval (the windows'
// bounds are monotone: nbr::tile_union), so the keys a query tile needs form a box, its halo;
// the keys' inverse neighborhoods likewise (nbr::inverse_tile_union). The halo is walked in
// chunks of 64 tokens (halo tokens in row-major order, then the additional keys), each chunk
// gathered into shared memory, and the tile's rows are multiplied with the chunk by mma.sync:
//
//   PN (Q K^T; dO V^T):  S[64 x 64]  = A_tile[64 x D] * B_chunk[64 x D]^T, then every product whose
//                        key is in its query's window is scattered to the attention tensor slot
//                        (pairs outside the windows are computed and dropped: the paper's cost of
//                        the GEMM formulation).
//   NN (P V; dS K):      O[64 x Dv] += P_chunk[64 x 64] * B_chunk[64 x Dv], P_chunk gathered from
//                        the attention tensor (0 where the key is not in the query's window).
//   IN (dS^T Q; P^T dO): out[key x D] += P^T_chunk[64 keys x 64 (query, head)] * A_chunk, the
//                        columns running over the key tile's inverse halo times the query heads
//                        of the KV head; each output row is owned by one CTA (no atomics).
//
// Operands sit in shared memory with the GEMM's reduction axis contiguous ([row][k]); the MMA
// fragments are read with 32-bit shared loads (rows padded by 16 bytes: conflict-free). float16 /
// bfloat16 run m16n8k16; float32 runs m16n8k8 TF32 split into three products (float32-class
// accuracy, as the fused kernels' default). Attention weights stored in float32 (the composed
// forward / backward's workspace) are rounded to the MMA's element type for NN / IN, as the fused
// kernels round P. Accumulation is float32 throughout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/mma.cuh"
#include "cuda/naive/geometry.cuh"

namespace fna {
namespace gemm {

using naive::AddView;
using naive::Geometry;
using naive::View;

constexpr int kRows = 64;     // rows of a tile: 4 warps x 16
constexpr int kChunk = 64;    // halo tokens (columns, or the reduction of NN / IN) per chunk
constexpr int kThreads = 128;

// Extents of a tile per axis (local indices of one dilation group); their product is <= kRows.
struct Tile {
  int t[3];
  int per_axis[3];  // tiles along each axis: ceil(ceil(L / d) / t)
};

// What one launch needs beyond the geometry.
struct Launch {
  Tile tile;
  int64_t p0;       // first (batch, kv head) pair
  int64_t pairs;    // pairs of this launch
  int heads_per;    // query heads per tile column of the grid: G for PN / NN, 1 for IN
  int width;        // PN: the dot products' length; NN / IN: the output rows' length
  int width_pad;    // PN: width rounded up to the MMA's k (NN / IN: unused)
  float scale;
  float masked;     // PN: the value of slots that hold no neighbor
  bool causal;      // any causal axis (PN writes `masked` slots)
  bool staged;      // PN: the tile's rows of the attention tensor are assembled in shared memory
                    // (after the index arrays) and written out row by row, coalesced; NN: they
                    // are read once, coalesced, into shared memory
};

// ---- element types -----------------------------------------------------------------------------
template <typename T>
struct Elem;
template <>
struct Elem<__half> {
  using M = mma::F16;
  static constexpr int kK = 16, kPad = 8;
};
template <>
struct Elem<__nv_bfloat16> {
  using M = mma::BF16;
  static constexpr int kK = 16, kPad = 8;
};
template <>
struct Elem<float> {
  static constexpr int kK = 8, kPad = 4;
};

template <typename T>
__device__ __forceinline__ uint32_t lds32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// acc[n] += A[16 rows of this warp][0, kdim) * B[8 n .. 8 n + 8)[0, kdim)^T. Both operands are
// row-major over the reduction axis with leading dimensions lda / ldb (elements).
template <typename T, int NT>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], const T* sA, int lda, const T* sB,
                                         int ldb, int kdim) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const T* a_row = sA + ((threadIdx.x >> 5) * 16 + g) * lda;
  if constexpr (sizeof(T) == 2) {
    using M = typename Elem<T>::M;
    for (int k0 = 0; k0 < kdim; k0 += 16) {
      const T* pa = a_row + k0 + 2 * t;
      const uint32_t a[4] = {lds32(pa), lds32(pa + 8 * lda), lds32(pa + 8), lds32(pa + 8 * lda + 8)};
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const T* pb = sB + (8 * n + g) * ldb + k0 + 2 * t;
        mma::mma_16816<M>(acc[n], a, lds32(pb), lds32(pb + 8));
      }
    }
  } else {
    for (int k0 = 0; k0 < kdim; k0 += 8) {
      const float* pa = a_row + k0 + t;
      const float av[4] = {pa[0], pa[8 * lda], pa[4], pa[8 * lda + 4]};
      uint32_t ab[4], as[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) mma::split_tf32(av[i], ab[i], as[i]);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float* pb = sB + (8 * n + g) * ldb + k0 + t;
        uint32_t b0, b0s, b1, b1s;
        mma::split_tf32(pb[0], b0, b0s);
        mma::split_tf32(pb[4], b1, b1s);
        mma::mma_1688_tf32(acc[n], as, b0, b1);
        mma::mma_1688_tf32(acc[n], ab, b0s, b1s);
        mma::mma_1688_tf32(acc[n], ab, b0, b1);
      }
    }
  }
#else
  (void)acc; (void)sA; (void)lda; (void)sB; (void)ldb; (void)kdim;
  __trap();  // the host never launches these kernels below sm_80 (gemm::launch checks)
#endif
}

// ---- tiles -------------------------------------------------------------------------------------
// The CTA's place: pair, query head in group (PN / NN), dilation group and local start per axis.
struct Place {
  int64_t b;
  int hkv, gi;
  int grp[3], len[3];  // dilation group and its length per axis
  int i0[3], i1[3];    // the tile's local index range per axis (clipped to the group)
  bool empty;          // the tile starts past the end of its (short) dilation group
};

__device__ __forceinline__ Place place_of(const Geometry& g, const Launch& L) {
  Place pl;
  int64_t x = blockIdx.x;
  int tt[3];
  for (int a = 2; a >= 0; --a) {
    tt[a] = static_cast<int>(x % L.tile.per_axis[a]);
    x /= L.tile.per_axis[a];
  }
  for (int a = 2; a >= 0; --a) {
    pl.grp[a] = static_cast<int>(x % g.axis[a].dilation);
    x /= g.axis[a].dilation;
  }
  pl.gi = static_cast<int>(x % L.heads_per);
  x /= L.heads_per;
  const int64_t pair = L.p0 + x;
  pl.b = pair / g.heads_kv;
  pl.hkv = static_cast<int>(pair % g.heads_kv);
  pl.empty = false;
  for (int a = 0; a < 3; ++a) {
    pl.len[a] = nbr::group_length(g.axis[a], pl.grp[a]);
    pl.i0[a] = tt[a] * L.tile.t[a];
    pl.i1[a] = min(pl.i0[a] + L.tile.t[a], pl.len[a]);
    pl.empty = pl.empty || pl.i0[a] >= pl.len[a];
  }
  return pl;
}

// Row m of the tile: its local coordinates, or false when it lies outside the clipped tile.
__device__ __forceinline__ bool tile_row(const Launch& L, const Place& pl, int m, int* local) {
  const int t1 = L.tile.t[1], t2 = L.tile.t[2];
  if (m >= L.tile.t[0] * t1 * t2) return false;
  local[0] = pl.i0[0] + m / (t1 * t2);
  local[1] = pl.i0[1] + (m / t2) % t1;
  local[2] = pl.i0[2] + m % t2;
  return local[0] < pl.i1[0] && local[1] < pl.i1[1] && local[2] < pl.i1[2];
}

// Halo token h (row-major over the box of `span` starting at local `begin`) -> local indices.
__device__ __forceinline__ void halo_token(int h, const int* begin, const int* span, int* local) {
  local[2] = begin[2] + h % span[2];
  h /= span[2];
  local[1] = begin[1] + h % span[1];
  local[0] = begin[0] + h / span[1];
}

__device__ __forceinline__ void global_of(const Geometry& g, const Place& pl, const int* local,
                                          int* c) {
  for (int a = 0; a < 3; ++a) c[a] = local[a] * g.axis[a].dilation + pl.grp[a];
}

// A window per axis, [b, e) in local indices.
struct Win {
  int b[3], e[3];
};

__device__ __forceinline__ Win window_of(const Geometry& g, const Place& pl, const int* local) {
  Win w;
  for (int a = 0; a < 3; ++a) {
    const nbr::Range r = nbr::window(g.axis[a], pl.len[a], local[a]);
    w.b[a] = r.begin;
    w.e[a] = r.end;
  }
  return w;
}

// The slot of key `k` (local indices) in window w, or -1 when it is not a neighbor.
__device__ __forceinline__ int slot_of(const Geometry& g, const Win& w, const int* k) {
  bool in = true;
  for (int a = 0; a < 3; ++a) in = in && k[a] >= w.b[a] && k[a] < w.e[a];
  if (!in) return -1;
  return ((k[0] - w.b[0]) * g.axis[1].kernel + (k[1] - w.b[1])) * g.axis[2].kernel +
         (k[2] - w.b[2]);
}

// Copies rows of `width` elements (element stride sx; row r at src + off[r], off < 0: a zero row)
// into dst[r][0, wpad) with leading dimension ld, zero past width. Vector loads where the rows
// allow them.
template <typename T>
__device__ __forceinline__ void load_rows(T* dst, int ld, const T* src, const int64_t* off,
                                          int rows, int width, int wpad, int64_t sx, bool vec) {
  constexpr int kVec = 16 / sizeof(T);
  if (vec) {  // sx == 1, width % kVec == 0, every row 16-byte aligned
    const int per_row = wpad / kVec;
    for (int e = threadIdx.x; e < rows * per_row; e += kThreads) {
      const int r = e / per_row, x = (e % per_row) * kVec;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (off[r] >= 0 && x < width) v = *reinterpret_cast<const uint4*>(src + off[r] + x);
      *reinterpret_cast<uint4*>(dst + r * ld + x) = v;
    }
    return;
  }
  for (int e = threadIdx.x; e < rows * wpad; e += kThreads) {
    const int r = e / wpad, x = e % wpad;
    dst[r * ld + x] = off[r] >= 0 && x < width ? src[off[r] + x * sx] : naive::from_f32<T>(0.f);
  }
}

// Copies columns [x0, x0 + ncols) of the rows (as load_rows) transposed: dst[x][r] with leading
// dimension ld, zero past width.
template <typename T>
__device__ __forceinline__ void load_rows_t(T* dst, int ld, const T* src, const int64_t* off,
                                            int rows, int x0, int ncols, int width, int64_t sx) {
  for (int e = threadIdx.x; e < rows * ncols; e += kThreads) {
    const int r = e / ncols, x = e % ncols;
    dst[x * ld + r] = off[r] >= 0 && x0 + x < width ? src[off[r] + (x0 + x) * sx]
                                                   : naive::from_f32<T>(0.f);
  }
}

// ---- PN ----------------------------------------------------------------------------------------
// out[q, slot] = scale * <A[q], B[key]> for every key of q's window (slot: its place in the window
// box) and scale * <A[q], addB[n]> at slot W + n; slots without a neighbor get `masked`.
// vec: bit 0, A's rows take 16-byte loads; bit 1, B's.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads) pn_kernel(Geometry g, Launch L, const TIn* a, View va,
                                                      const TIn* bm, View vb, const TIn* add_b,
                                                      AddView vab, TOut* out, View vo, int vec) {
  const Place pl = place_of(g, L);
  if (pl.empty) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ld = L.width_pad + Elem<TIn>::kPad;
  TIn* sA = reinterpret_cast<TIn*>(smem_raw);
  TIn* sB = sA + kRows * ld;
  int64_t* sOff = reinterpret_cast<int64_t*>(sB + kChunk * ld);  // row sources, then key sources
  int* sKey = reinterpret_cast<int*>(sOff + kRows);              // [kChunk][3]; additional: -1 - n
  int64_t* sRowOut = reinterpret_cast<int64_t*>(sKey + 3 * kChunk);
  int* sRowWin = reinterpret_cast<int*>(sRowOut + kRows);        // [kRows][6]
  TOut* sOut = reinterpret_cast<TOut*>(sRowWin + 6 * kRows);     // staged: [kRows][W + N_add]

  // The key halo of the tile.
  int hb[3], hs[3];
  for (int ax = 0; ax < 3; ++ax) {
    const nbr::Range u = nbr::tile_union(g.axis[ax], pl.len[ax], pl.i0[ax], pl.i1[ax]);
    hb[ax] = u.begin;
    hs[ax] = u.size();
  }
  const int halo = hs[0] * hs[1] * hs[2];
  const int cols = halo + g.num_add;

  if (threadIdx.x < kRows) {
    const int m = threadIdx.x;
    int loc[3], c[3];
    if (tile_row(L, pl, m, loc)) {
      global_of(g, pl, loc, c);
      sOff[m] = va.at(pl.b, c, pl.hkv, pl.gi, 0);
      sRowOut[m] = vo.at(pl.b, c, pl.hkv, pl.gi, 0);
      const Win w = window_of(g, pl, loc);
      for (int ax = 0; ax < 3; ++ax) {
        sRowWin[6 * m + ax] = w.b[ax];
        sRowWin[6 * m + 3 + ax] = w.e[ax];
      }
    } else {
      sOff[m] = -1;
      sRowOut[m] = -1;
    }
  }
  __syncthreads();
  load_rows(sA, ld, a, sOff, kRows, L.width, L.width_pad, va.sx, (vec & 1) != 0);
  if (L.staged) {  // every slot starts as `masked`; the neighbors' products overwrite theirs
    for (int e = threadIdx.x; e < kRows * g.cols; e += kThreads)
      sOut[e] = naive::from_f32<TOut>(L.masked);
  } else if (L.causal) {  // slots of the window box past a truncated causal window
    for (int e = threadIdx.x; e < kRows * g.window; e += kThreads) {
      const int m = e / g.window, s = e % g.window;
      if (sRowOut[m] < 0) continue;
      const int k[3] = {s / (g.axis[1].kernel * g.axis[2].kernel),
                        (s / g.axis[2].kernel) % g.axis[1].kernel, s % g.axis[2].kernel};
      bool nb = true;
      for (int ax = 0; ax < 3; ++ax) nb = nb && sRowWin[6 * m + ax] + k[ax] < sRowWin[6 * m + 3 + ax];
      if (!nb) out[sRowOut[m] + s * vo.sx] = naive::from_f32<TOut>(L.masked);
    }
  }
  // This thread's two accumulator rows.
  const int lane = threadIdx.x & 31;
  const int r0 = (threadIdx.x >> 5) * 16 + (lane >> 2);
  Win w[2];
  int64_t ro[2];
  for (int i = 0; i < 2; ++i) {
    const int m = r0 + 8 * i;
    ro[i] = sRowOut[m];
    for (int ax = 0; ax < 3; ++ax) {
      w[i].b[ax] = sRowWin[6 * m + ax];
      w[i].e[ax] = sRowWin[6 * m + 3 + ax];
    }
  }
  __syncthreads();  // sOff is reused for the key rows

  for (int c0 = 0; c0 < cols; c0 += kChunk) {
    if (threadIdx.x < kChunk) {
      const int j = threadIdx.x, h = c0 + j;
      int* key = sKey + 3 * j;
      sOff[j] = -1;  // additional keys are loaded below, from their own tensor
      if (h < halo) {
        int loc[3], y[3];
        halo_token(h, hb, hs, loc);
        global_of(g, pl, loc, y);
        sOff[j] = vb.at(pl.b, y, pl.hkv, 0, 0);
        key[0] = loc[0], key[1] = loc[1], key[2] = loc[2];
      } else if (h < cols) {
        key[0] = -1 - (h - halo);
      } else {
        key[0] = INT32_MIN;
      }
    }
    __syncthreads();
    load_rows(sB, ld, bm, sOff, kChunk, L.width, L.width_pad, vb.sx, (vec & 2) != 0);
    if (c0 + kChunk > halo && c0 < cols) {  // the chunk holds additional keys
      __syncthreads();
      for (int e = threadIdx.x; e < kChunk * L.width_pad; e += kThreads) {
        const int j = e / L.width_pad, x = e % L.width_pad, k0 = sKey[3 * j];
        if (k0 < 0 && k0 != INT32_MIN)
          sB[j * ld + x] = x < L.width ? add_b[vab.at(pl.b, -1 - k0, pl.hkv, x)]
                                       : naive::from_f32<TIn>(0.f);
      }
    }
    __syncthreads();
    float acc[8][4] = {};
    warp_mma<TIn, 8>(acc, sA, ld, sB, ld, L.width_pad);
    const int t = lane & 3;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1, j = 8 * n + 2 * t + (e & 1);
        if (ro[i] < 0) continue;
        const int* key = sKey + 3 * j;
        int slot;
        if (key[0] >= 0)
          slot = slot_of(g, w[i], key);
        else
          slot = key[0] == INT32_MIN ? -1 : g.window + (-1 - key[0]);
        if (slot < 0) continue;
        const TOut val = naive::from_f32<TOut>(L.scale * acc[n][e]);
        if (L.staged)
          sOut[(r0 + 8 * i) * g.cols + slot] = val;
        else
          out[ro[i] + slot * vo.sx] = val;
      }
    }
    __syncthreads();
  }
  if (L.staged) {  // consecutive threads write consecutive slots of a row
    for (int e = threadIdx.x; e < kRows * g.cols; e += kThreads) {
      const int m = e / g.cols, slot = e % g.cols;
      if (sRowOut[m] >= 0) out[sRowOut[m] + slot * vo.sx] = sOut[e];
    }
  }
}

// ---- NN ----------------------------------------------------------------------------------------
// out[q, x] = scale * (sum over q's neighbors of attn[q, slot] * B[key, x] + sum_n attn[q, W + n] *
// addB[n, x]) for x in this CTA's column slice [8 NT blockIdx.y, 8 NT (blockIdx.y + 1)).
template <typename TAttn, typename T, int NT>
__global__ void __launch_bounds__(kThreads) nn_kernel(Geometry g, Launch L, const TAttn* attn,
                                                      View vattn, const T* bm, View vb,
                                                      const T* add_b, AddView vab, T* out,
                                                      View vo) {
  const Place pl = place_of(g, L);
  if (pl.empty) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kLd = kChunk + Elem<T>::kPad;
  const int x0 = blockIdx.y * NT * 8;
  T* sP = reinterpret_cast<T*>(smem_raw);  // [kRows][kLd]
  T* sBt = sP + kRows * kLd;               // [NT * 8][kLd]
  int64_t* sOff = reinterpret_cast<int64_t*>(sBt + NT * 8 * kLd);  // key sources [kChunk]
  int64_t* sRowAttn = sOff + kChunk;                               // [kRows]
  int* sKey = reinterpret_cast<int*>(sRowAttn + kRows);             // [kChunk][3]
  int* sRowWin = sKey + 3 * kChunk;                                 // [kRows][6]
  T* sRows = reinterpret_cast<T*>(sRowWin + 6 * kRows);  // staged: the rows [kRows][W + N_add]

  int hb[3], hs[3];
  for (int ax = 0; ax < 3; ++ax) {
    const nbr::Range u = nbr::tile_union(g.axis[ax], pl.len[ax], pl.i0[ax], pl.i1[ax]);
    hb[ax] = u.begin;
    hs[ax] = u.size();
  }
  const int halo = hs[0] * hs[1] * hs[2];
  const int cols = halo + g.num_add;

  if (threadIdx.x < kRows) {
    const int m = threadIdx.x;
    int loc[3], c[3];
    if (tile_row(L, pl, m, loc)) {
      global_of(g, pl, loc, c);
      sRowAttn[m] = vattn.at(pl.b, c, pl.hkv, pl.gi, 0);
      const Win w = window_of(g, pl, loc);
      for (int ax = 0; ax < 3; ++ax) {
        sRowWin[6 * m + ax] = w.b[ax];
        sRowWin[6 * m + 3 + ax] = w.e[ax];
      }
    } else {
      sRowAttn[m] = -1;
    }
  }
  if (L.staged) {  // the tile's attention rows, read once and coalesced
    __syncthreads();
    for (int e = threadIdx.x; e < kRows * g.cols; e += kThreads) {
      const int m = e / g.cols, slot = e % g.cols;
      sRows[e] = naive::from_f32<T>(
          sRowAttn[m] >= 0 ? naive::to_f32(attn[sRowAttn[m] + slot * vattn.sx]) : 0.f);
    }
  }
  float acc[NT][4] = {};
  for (int c0 = 0; c0 < cols; c0 += kChunk) {
    __syncthreads();  // the previous chunk's operands are consumed
    if (threadIdx.x < kChunk) {
      const int j = threadIdx.x, h = c0 + j;
      int* key = sKey + 3 * j;
      if (h < halo) {
        int loc[3], y[3];
        halo_token(h, hb, hs, loc);
        global_of(g, pl, loc, y);
        sOff[j] = vb.at(pl.b, y, pl.hkv, 0, 0);
        key[0] = loc[0], key[1] = loc[1], key[2] = loc[2];
      } else if (h < cols) {
        sOff[j] = vab.at(pl.b, h - halo, pl.hkv, 0);
        key[0] = -1 - (h - halo);
      } else {
        sOff[j] = -1;
        key[0] = INT32_MIN;
      }
    }
    __syncthreads();
    // P chunk: consecutive threads take consecutive keys of one query (neighbouring slots).
    for (int e = threadIdx.x; e < kRows * kChunk; e += kThreads) {
      const int m = e / kChunk, j = e % kChunk;
      float p = 0.f;
      const int* key = sKey + 3 * j;
      if (sRowAttn[m] >= 0 && key[0] != INT32_MIN) {
        int slot;
        if (key[0] >= 0) {
          Win w;
          for (int ax = 0; ax < 3; ++ax) {
            w.b[ax] = sRowWin[6 * m + ax];
            w.e[ax] = sRowWin[6 * m + 3 + ax];
          }
          slot = slot_of(g, w, key);
        } else {
          slot = g.window + (-1 - key[0]);
        }
        if (slot >= 0)
          p = L.staged ? naive::to_f32(sRows[m * g.cols + slot])
                       : naive::to_f32(attn[sRowAttn[m] + slot * vattn.sx]);
      }
      sP[m * kLd + j] = naive::from_f32<T>(p);
    }
    // B^T chunk: grid keys and additional keys have different sources.
    for (int e = threadIdx.x; e < kChunk * NT * 8; e += kThreads) {
      const int j = e / (NT * 8), x = e % (NT * 8);
      const int k0 = sKey[3 * j];
      T v = naive::from_f32<T>(0.f);
      if (k0 != INT32_MIN && x0 + x < L.width)
        v = k0 >= 0 ? bm[sOff[j] + (x0 + x) * vb.sx] : add_b[sOff[j] + (x0 + x) * vab.sx];
      sBt[x * kLd + j] = v;
    }
    __syncthreads();
    warp_mma<T, NT>(acc, sP, kLd, sBt, kLd, kChunk);
  }
  // Epilogue: rows r0, r0 + 8 of this thread, columns 8 n + 2 t (+1).
  const int lane = threadIdx.x & 31, t = lane & 3;
  const int r0 = (threadIdx.x >> 5) * 16 + (lane >> 2);
  for (int i = 0; i < 2; ++i) {
    const int m = r0 + 8 * i;
    int loc[3], c[3];
    if (!tile_row(L, pl, m, loc)) continue;
    global_of(g, pl, loc, c);
    const int64_t o = vo.at(pl.b, c, pl.hkv, pl.gi, 0);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int x = x0 + 8 * n + 2 * t + e;
        if (x < L.width) out[o + x * vo.sx] = naive::from_f32<T>(L.scale * acc[n][2 * i + e]);
      }
  }
}

// ---- IN ----------------------------------------------------------------------------------------
// out[key, x] = scale * sum over the queries q (and query heads of the KV head) whose windows hold
// the key of attn[q, slot of key] * A[q, x]; a tile of 64 keys, the reduction over the tile's
// inverse halo x G in chunks of 64.
template <typename TAttn, typename T, int NT>
__global__ void __launch_bounds__(kThreads) in_kernel(Geometry g, Launch L, const TAttn* attn,
                                                      View vattn, const T* a, View va, T* out,
                                                      View vo) {
  const Place pl = place_of(g, L);
  if (pl.empty) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kLd = kChunk + Elem<T>::kPad;
  const int x0 = blockIdx.y * NT * 8;
  T* sPt = reinterpret_cast<T*>(smem_raw);  // [kRows keys][kLd]
  T* sAt = sPt + kRows * kLd;               // [NT * 8][kLd]
  int64_t* sOff = reinterpret_cast<int64_t*>(sAt + NT * 8 * kLd);  // A row of column j
  int64_t* sColAttn = sOff + kChunk;                               // attn row of column j
  int* sColWin = reinterpret_cast<int*>(sColAttn + kChunk);         // [kChunk][6]
  int* sKey = sColWin + 6 * kChunk;                                 // [kRows][3]; -1: none

  int qb[3], qs[3];
  for (int ax = 0; ax < 3; ++ax) {
    const nbr::Range u = nbr::inverse_tile_union(g.axis[ax], pl.len[ax], pl.i0[ax], pl.i1[ax]);
    qb[ax] = u.begin;
    qs[ax] = u.size();
  }
  const int cols = qs[0] * qs[1] * qs[2] * g.group;

  if (threadIdx.x < kRows) {
    const int m = threadIdx.x;
    int loc[3];
    if (tile_row(L, pl, m, loc)) {
      for (int ax = 0; ax < 3; ++ax) sKey[3 * m + ax] = loc[ax];
    } else {
      sKey[3 * m] = -1;
    }
  }
  float acc[NT][4] = {};
  for (int c0 = 0; c0 < cols; c0 += kChunk) {
    __syncthreads();
    if (threadIdx.x < kChunk) {
      const int j = threadIdx.x, h = c0 + j;
      if (h < cols) {
        int loc[3], c[3];
        halo_token(h / g.group, qb, qs, loc);
        global_of(g, pl, loc, c);
        const int gi = h % g.group;
        sOff[j] = va.at(pl.b, c, pl.hkv, gi, 0);
        sColAttn[j] = vattn.at(pl.b, c, pl.hkv, gi, 0);
        const Win w = window_of(g, pl, loc);
        for (int ax = 0; ax < 3; ++ax) {
          sColWin[6 * j + ax] = w.b[ax];
          sColWin[6 * j + 3 + ax] = w.e[ax];
        }
      } else {
        sOff[j] = -1;
        sColAttn[j] = -1;
      }
    }
    __syncthreads();
    // P^T chunk: consecutive threads take consecutive keys of one query (neighbouring slots).
    for (int e = threadIdx.x; e < kRows * kChunk; e += kThreads) {
      const int j = e / kRows, m = e % kRows;
      float p = 0.f;
      const int* key = sKey + 3 * m;
      if (sColAttn[j] >= 0 && key[0] >= 0) {
        Win w;
        for (int ax = 0; ax < 3; ++ax) {
          w.b[ax] = sColWin[6 * j + ax];
          w.e[ax] = sColWin[6 * j + 3 + ax];
        }
        const int slot = slot_of(g, w, key);
        if (slot >= 0) p = naive::to_f32(attn[sColAttn[j] + slot * vattn.sx]);
      }
      sPt[m * kLd + j] = naive::from_f32<T>(p);
    }
    load_rows_t(sAt, kLd, a, sOff, kChunk, x0, NT * 8, L.width, va.sx);
    __syncthreads();
    warp_mma<T, NT>(acc, sPt, kLd, sAt, kLd, kChunk);
  }
  const int lane = threadIdx.x & 31, t = lane & 3;
  const int r0 = (threadIdx.x >> 5) * 16 + (lane >> 2);
  for (int i = 0; i < 2; ++i) {
    const int m = r0 + 8 * i;
    int loc[3], y[3];
    if (!tile_row(L, pl, m, loc)) continue;
    global_of(g, pl, loc, y);
    const int64_t o = vo.at(pl.b, y, pl.hkv, 0, 0);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int x = x0 + 8 * n + 2 * t + e;
        if (x < L.width) out[o + x * vo.sx] = naive::from_f32<T>(L.scale * acc[n][2 * i + e]);
      }
  }
}

}  // namespace gemm
}  // namespace fna
