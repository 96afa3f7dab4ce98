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
#include "cuda/fused/kernel/common/fast_div.h"
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
  int full_ld;      // full-tile kernels: leading dimension of the tile's dense [64 x halo] block
                    // (PN: 0 = direct stores)
  int stages;       // full-tile NN: chunk buffers (2: the next chunk is copied during this one)
  fused::FastDiv k1, k2;  // full-tile kernels: slot -> window offsets (kernel sizes of axes 1, 2)
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
// Row padding (elements) of operands stored reduction-axis first ([k][x]): 16 bytes for 16-bit
// types (ldmatrix rows), 8 floats (scalar fragment loads) for float32.
constexpr int kPadKN = 8;

template <typename T>
__device__ __forceinline__ uint32_t lds32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// acc[n] += A[16 rows of this warp][0, kdim) * B[0, kdim)[8 n .. 8 n + 8) for n < NT. Operand
// storage, leading dimensions lda / ldb in elements:
//   A: [m][k] (kATrans false: 32-bit loads, rows padded to 4 mod 32 words) or [k][m] (kATrans:
//      ldmatrix.trans; float32: scalar loads, rows of 8 mod 32 words);
//   B: [n][k] (kBKN false: 32-bit loads) or [k][n] (kBKN: ldmatrix.trans, NT even; float32: scalar
//      loads, rows of 8 mod 32 words).
// Every layout is read without bank conflicts at the paddings the kernels use.
template <typename T, int NT, bool kATrans = false, bool kBKN = false>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], const T* sA, int lda, const T* sB,
                                         int ldb, int kdim) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int m0 = (threadIdx.x >> 5) * 16;
  if constexpr (sizeof(T) == 2) {
    using M = typename Elem<T>::M;
    static_assert(!kBKN || NT % 2 == 0, "ldmatrix.trans loads two n-tiles");
    for (int k0 = 0; k0 < kdim; k0 += 16) {
      uint32_t a[4];
      if constexpr (kATrans) {
        mma::ldsm_x4_trans(a, mma::smem_u32(sA + (k0 + (lane & 7) + ((lane >> 4) << 3)) * lda +
                                            m0 + ((lane >> 3) & 1) * 8));
      } else {
        const T* pa = sA + (m0 + g) * lda + k0 + 2 * t;
        a[0] = lds32(pa);
        a[1] = lds32(pa + 8 * lda);
        a[2] = lds32(pa + 8);
        a[3] = lds32(pa + 8 * lda + 8);
      }
      if constexpr (kBKN) {
        const mma::LdsmOffset o = mma::ldsm_b_kn_addr(lane);
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
          uint32_t b[4];
          mma::ldsm_x4_trans(b, mma::smem_u32(sB + (k0 + o.row) * ldb + 8 * n + o.col));
          mma::mma_16816<M>(acc[n], a, b[0], b[1]);
          mma::mma_16816<M>(acc[n + 1], a, b[2], b[3]);
        }
      } else {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const T* pb = sB + (8 * n + g) * ldb + k0 + 2 * t;
          mma::mma_16816<M>(acc[n], a, lds32(pb), lds32(pb + 8));
        }
      }
    }
  } else {
    for (int k0 = 0; k0 < kdim; k0 += 8) {
      float av[4];
      if constexpr (kATrans) {
        const float* pa = sA + (k0 + t) * lda + m0 + g;
        av[0] = pa[0], av[1] = pa[8], av[2] = pa[4 * lda], av[3] = pa[4 * lda + 8];
      } else {
        const float* pa = sA + (m0 + g) * lda + k0 + t;
        av[0] = pa[0], av[1] = pa[8 * lda], av[2] = pa[4], av[3] = pa[8 * lda + 4];
      }
      uint32_t ab[4], as[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) mma::split_tf32(av[i], ab[i], as[i]);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float b0f, b1f;
        if constexpr (kBKN) {
          const float* pb = sB + (k0 + t) * ldb + 8 * n + g;
          b0f = pb[0], b1f = pb[4 * ldb];
        } else {
          const float* pb = sB + (8 * n + g) * ldb + k0 + t;
          b0f = pb[0], b1f = pb[4];
        }
        uint32_t b0, b0s, b1, b1s;
        mma::split_tf32(b0f, b0, b0s);
        mma::split_tf32(b1f, b1, b1s);
        mma::mma_1688_tf32(acc[n], as, b0, b1);
        mma::mma_1688_tf32(acc[n], ab, b0s, b1s);
        mma::mma_1688_tf32(acc[n], ab, b0, b1);
      }
    }
  }
#else
  (void)acc; (void)sA; (void)lda; (void)sB; (void)ldb; (void)kdim;
  __trap();  // the host never launches these kernels below sm_80 (gemm::check)
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
// into dst[r][0, wpad) with leading dimension ld, zero past width. With `vec` (sx == 1, width a
// multiple of 16 bytes, every row 16-byte aligned) by 16-byte copies: cp.async ones with `async`
// (the caller commits and waits), else loads and stores; otherwise element by element.
template <typename T>
__device__ __forceinline__ void load_rows(T* dst, int ld, const T* src, const int64_t* off,
                                          int rows, int width, int wpad, int64_t sx, bool vec,
                                          bool async = false) {
  constexpr int kVec = 16 / sizeof(T);
  if (vec) {
    const int per_row = wpad / kVec;
    auto one = [&](int r, int x) {
      const bool ok = off[r] >= 0 && x < width;
      T* d = dst + r * ld + x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
      if (async) {
        mma::cp_async_16(mma::smem_u32(d), ok ? src + off[r] + x : src, ok);
        return;
      }
#endif
      uint4 v = make_uint4(0, 0, 0, 0);
      if (ok) v = *reinterpret_cast<const uint4*>(src + off[r] + x);
      *reinterpret_cast<uint4*>(d) = v;
    };
    if ((per_row & (per_row - 1)) == 0 && per_row <= kThreads) {  // no division per vector
      const int x = (threadIdx.x & (per_row - 1)) * kVec, step = kThreads / per_row;
      for (int r = threadIdx.x / per_row; r < rows; r += step) one(r, x);
    } else {
      for (int e = threadIdx.x; e < rows * per_row; e += kThreads)
        one(e / per_row, (e % per_row) * kVec);
    }
    return;
  }
  for (int e = threadIdx.x; e < rows * wpad; e += kThreads) {
    const int r = e / wpad, x = e % wpad;
    dst[r * ld + x] = off[r] >= 0 && x < width ? src[off[r] + x * sx] : naive::from_f32<T>(0.f);
  }
}

// cp.async bookkeeping (no-ops below sm_80, where the kernels never run).
__device__ __forceinline__ void async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  mma::cp_async_commit();
#endif
}
// Waits for this thread's copies but the newest group (`next`: a later chunk's is in flight).
__device__ __forceinline__ void async_wait(bool next) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (next)
    mma::cp_async_wait<1>();
  else
    mma::cp_async_wait<0>();
#else
  (void)next;
#endif
}

// ---- shared by PN and NN ------------------------------------------------------------------------
// Full tiles: where the tile's whole halo fits shared memory as a dense [64 x halo] block (leading
// dimension L.full_ld), the scattered slot <-> halo mapping is done once per (row, slot) instead
// of once per (row, halo token) and chunk: PN multiplies every chunk into the block and then
// writes each row's slots out, coalesced; NN scatters each row's slots into the zeroed block,
// coalesced, and then multiplies it chunk by chunk. A row's slot s is the window offset
// (s0, s1, s2) of s = (s0 K1 + s1) K2 + s2 (L.k1 / L.k2 divide), and lies past a truncated causal
// window where s_a >= e_a - b_a on some axis.

// The halo index of slot `s` of the row with window w (halo box hb / hs), or -1 when the slot holds
// no neighbor; slots W.. are the additional keys (at halo + n).
__device__ __forceinline__ int halo_of_slot(const Geometry& g, const Launch& L, const Win& w,
                                            const int* hb, const int* hs, int halo, int s) {
  if (s >= g.window) return halo + (s - g.window);
  int s0, s1, s2;
  s2 = L.k2.divmod(s, s0);  // s0 = s / K2 for now
  s1 = L.k1.divmod(s0, s0);
  if (s0 >= w.e[0] - w.b[0] || s1 >= w.e[1] - w.b[1] || s2 >= w.e[2] - w.b[2]) return -1;
  return ((w.b[0] - hb[0] + s0) * hs[1] + (w.b[1] - hb[1] + s1)) * hs[2] + (w.b[2] - hb[2] + s2);
}

// Row m's window from the row arrays.
__device__ __forceinline__ Win row_window(const int* sRowWin, int m) {
  Win w;
  for (int ax = 0; ax < 3; ++ax) {
    w.b[ax] = sRowWin[6 * m + ax];
    w.e[ax] = sRowWin[6 * m + 3 + ax];
  }
  return w;
}

// The tile's key halo (nbr::tile_union per axis).
__device__ __forceinline__ int key_halo(const Geometry& g, const Place& pl, int* hb, int* hs) {
  for (int ax = 0; ax < 3; ++ax) {
    const nbr::Range u = nbr::tile_union(g.axis[ax], pl.len[ax], pl.i0[ax], pl.i1[ax]);
    hb[ax] = u.begin;
    hs[ax] = u.size();
  }
  return hs[0] * hs[1] * hs[2];
}

// Rows' sources (threads < kRows): the row's offset in `v` (role of the query; -1 outside the
// tile), its offset in the attention tensor `vo`, and its window.
__device__ __forceinline__ void row_info(const Geometry& g, const Launch& L, const Place& pl,
                                         const View& v, const View& vo, int64_t* sOff,
                                         int64_t* sRowOut, int* sRowWin) {
  if (threadIdx.x >= kRows) return;
  const int m = threadIdx.x;
  int loc[3], c[3];
  if (!tile_row(L, pl, m, loc)) {
    if (sOff) sOff[m] = -1;
    sRowOut[m] = -1;
    return;
  }
  global_of(g, pl, loc, c);
  if (sOff) sOff[m] = v.at(pl.b, c, pl.hkv, pl.gi, 0);
  sRowOut[m] = vo.at(pl.b, c, pl.hkv, pl.gi, 0);
  const Win w = window_of(g, pl, loc);
  for (int ax = 0; ax < 3; ++ax) {
    sRowWin[6 * m + ax] = w.b[ax];
    sRowWin[6 * m + 3 + ax] = w.e[ax];
  }
}

// Key sources of chunk c0 (threads < kChunk): grid keys' offsets in `vb` (-1 otherwise), their
// local coordinates in sLoc (3 per key, -1 first where none; when not null) and, in sAdd, the additional key's index
// (-1 otherwise).
__device__ __forceinline__ void chunk_keys(const Geometry& g, const Place& pl, const int* hb,
                                           const int* hs, int halo, int c0, const View& vb,
                                           int64_t* sOff, int* sAdd, int* sLoc = nullptr) {
  if (threadIdx.x >= kChunk) return;
  const int j = threadIdx.x, h = c0 + j;
  sOff[j] = -1;
  sAdd[j] = -1;
  if (sLoc) sLoc[3 * j] = -1;
  if (h < halo) {
    int loc[3], y[3];
    halo_token(h, hb, hs, loc);
    global_of(g, pl, loc, y);
    sOff[j] = vb.at(pl.b, y, pl.hkv, 0, 0);
    if (sLoc)
      for (int ax = 0; ax < 3; ++ax) sLoc[3 * j + ax] = loc[ax];
  } else if (h < halo + g.num_add) {
    sAdd[j] = h - halo;
  }
}

// Additional keys' rows of a chunk (columns [x0, x0 + wpad) of addB) into dst[j][x].
template <typename T>
__device__ __forceinline__ void load_add_rows(T* dst, int ld, const T* add_b, const AddView& vab,
                                              const Place& pl, const int* sAdd, int x0, int width,
                                              int wpad) {
  for (int e = threadIdx.x; e < kChunk * wpad; e += kThreads) {
    const int j = e / wpad, x = e % wpad;
    if (sAdd[j] >= 0)
      dst[j * ld + x] = x0 + x < width ? add_b[vab.at(pl.b, sAdd[j], pl.hkv, x0 + x)]
                                       : naive::from_f32<T>(0.f);
  }
}

// ---- PN ----------------------------------------------------------------------------------------
// out[q, slot] = scale * <A[q], B[key]> for every key of q's window (slot: its place in the window
// box) and scale * <A[q], addB[n]> at slot W + n; slots without a neighbor get `masked`. The next
// chunk's key rows are copied (cp.async, two buffers) while this one is multiplied. The products
// go to the attention tensor directly (each with its slot), or with kFull into the tile's
// [64 x halo] block (leading dimension L.full_ld), written out row by row at the end.
// vec: bit 0, A's rows take 16-byte copies; bit 1, B's.
template <typename TIn, typename TOut, bool kFull>
__global__ void __launch_bounds__(kThreads) pn_kernel(Geometry g, Launch L, const TIn* a, View va,
                                                      const TIn* bm, View vb, const TIn* add_b,
                                                      AddView vab, TOut* out, View vo, int vec) {
  const Place pl = place_of(g, L);
  if (pl.empty) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ld = L.width_pad + Elem<TIn>::kPad;
  constexpr bool full = kFull;
  TIn* sA = reinterpret_cast<TIn*>(smem_raw);
  TIn* sB = sA + kRows * ld;                                   // [2][kChunk][ld]
  TOut* sS = reinterpret_cast<TOut*>(sB + 2 * kChunk * ld);    // full: [kRows][L.full_ld]
  int64_t* sOff = reinterpret_cast<int64_t*>(sS + kRows * L.full_ld);  // A rows
  int64_t* sKOff = sOff + kRows;                               // [2][kChunk]: key rows
  int64_t* sRowOut = sKOff + 2 * kChunk;
  int* sRowWin = reinterpret_cast<int*>(sRowOut + kRows);      // [kRows][6]
  int* sAdd = sRowWin + 6 * kRows;                             // [2][kChunk]
  int* sLoc = sAdd + 2 * kChunk;                               // [2][kChunk][3]

  int hb[3], hs[3];
  const int halo = key_halo(g, pl, hb, hs);
  const int cols = halo + g.num_add;
  row_info(g, L, pl, va, vo, sOff, sRowOut, sRowWin);
  __syncthreads();
  load_rows(sA, ld, a, sOff, kRows, L.width, L.width_pad, va.sx, (vec & 1) != 0, true);
  if (!full && L.causal) {  // slots of the window box past a truncated causal window
    for (int e = threadIdx.x; e < kRows * g.window; e += kThreads) {
      const int m = e / g.window, s = e % g.window;
      if (sRowOut[m] >= 0 && halo_of_slot(g, L, row_window(sRowWin, m), hb, hs, halo, s) < 0)
        out[sRowOut[m] + s * vo.sx] = naive::from_f32<TOut>(L.masked);
    }
  }
  auto stage = [&](int c0, int buf) {
    chunk_keys(g, pl, hb, hs, halo, c0, vb, sKOff + buf * kChunk, sAdd + buf * kChunk,
               full ? nullptr : sLoc + 3 * buf * kChunk);
    __syncthreads();
    load_rows(sB + buf * kChunk * ld, ld, bm, sKOff + buf * kChunk, kChunk, L.width, L.width_pad,
              vb.sx, (vec & 2) != 0, true);
    async_commit();  // (the first group also holds A's rows)
  };
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
  const int r0 = warp * 16 + (lane >> 2);
  Win w[2];  // direct stores: this thread's two accumulator rows
  int64_t ro[2] = {-1, -1};
  if constexpr (!full)
    for (int i = 0; i < 2; ++i) {
      w[i] = row_window(sRowWin, r0 + 8 * i);
      ro[i] = sRowOut[r0 + 8 * i];
    }
  stage(0, 0);
  for (int c = 0, c0 = 0; c0 < cols; ++c, c0 += kChunk) {
    const int buf = c & 1;
    const bool next = c0 + kChunk < cols;
    if (next) stage(c0 + kChunk, buf ^ 1);
    async_wait(next);
    TIn* B = sB + buf * kChunk * ld;
    if (c0 + kChunk > halo) {  // the chunk holds additional keys: over the zero-filled rows
      __syncthreads();
      load_add_rows(B, ld, add_b, vab, pl, sAdd + buf * kChunk, 0, L.width, L.width_pad);
    }
    __syncthreads();
    float acc[8][4] = {};
    warp_mma<TIn, 8>(acc, sA, ld, B, ld, L.width_pad);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = r0 + 8 * (e >> 1), j = 8 * n + 2 * t + (e & 1);
        const TOut v = naive::from_f32<TOut>(L.scale * acc[n][e]);
        if constexpr (full) {
          sS[m * L.full_ld + c0 + j] = v;
        } else {
          const int at = buf * kChunk + j;
          const int* loc = sLoc + 3 * at;
          int slot = -1;
          if (loc[0] >= 0)
            slot = slot_of(g, w[e >> 1], loc);
          else if (sAdd[at] >= 0)
            slot = g.window + sAdd[at];
          if (ro[e >> 1] >= 0 && slot >= 0) out[ro[e >> 1] + slot * vo.sx] = v;
        }
      }
    __syncthreads();  // this buffer is free
  }
  if constexpr (!full) return;
  const TOut masked = naive::from_f32<TOut>(L.masked);
  for (int m = warp; m < kRows; m += kThreads / 32) {
    if (sRowOut[m] < 0) continue;
    const Win rw = row_window(sRowWin, m);
    for (int s = lane; s < g.cols; s += 32) {
      const int h = halo_of_slot(g, L, rw, hb, hs, halo, s);
      out[sRowOut[m] + s * vo.sx] = h >= 0 ? sS[m * L.full_ld + h] : masked;
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
                                                      View vo, int /*vec: scalar copies here*/) {
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
        if (slot >= 0) p = naive::to_f32(attn[sRowAttn[m] + slot * vattn.sx]);
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

// vec: B's rows take 16-byte copies. The first chunk's rows are copied (cp.async) while the block
// is filled; with L.stages = 2 each next one while the current one is multiplied (two buffers).
template <typename TAttn, typename T, int NT>
__global__ void __launch_bounds__(kThreads) nn_full_kernel(Geometry g, Launch L,
                                                           const TAttn* attn, View vattn,
                                                           const T* bm, View vb, const T* add_b,
                                                           AddView vab, T* out, View vo,
                                                           int vec) {
  const Place pl = place_of(g, L);
  if (pl.empty) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kLdB = NT * 8 + kPadKN;
  const int x0 = blockIdx.y * NT * 8;
  T* sP = reinterpret_cast<T*>(smem_raw);  // [kRows][L.full_ld]
  T* sB = sP + kRows * L.full_ld;           // [stages][kChunk][kLdB]: B's rows, this slice
  int64_t* sOff = reinterpret_cast<int64_t*>(sB + L.stages * kChunk * kLdB);  // [2][kChunk]
  int64_t* sRowAttn = sOff + 2 * kChunk;
  int* sRowWin = reinterpret_cast<int*>(sRowAttn + kRows);  // [kRows][6]
  int* sAdd = sRowWin + 6 * kRows;                          // [2][kChunk]

  int hb[3], hs[3];
  const int halo = key_halo(g, pl, hb, hs);
  const int cols = halo + g.num_add;
  const int ncols = (cols + kChunk - 1) / kChunk * kChunk;
  auto stage = [&](int c0, int buf) {
    chunk_keys(g, pl, hb, hs, halo, c0, vb, sOff + buf * kChunk, sAdd + buf * kChunk);
    __syncthreads();
    load_rows(sB + buf * kChunk * kLdB, kLdB, bm + x0 * vb.sx, sOff + buf * kChunk, kChunk,
              max(L.width - x0, 0), NT * 8, vb.sx, vec != 0, true);
    async_commit();
  };
  row_info(g, L, pl, vattn, vattn, nullptr, sRowAttn, sRowWin);
  stage(0, 0);  // (its barrier also publishes the rows' info)
  {  // zero the block's columns this tile uses
    const int per_row = ncols * int(sizeof(T)) / 16;
    for (int e = threadIdx.x; e < kRows * per_row; e += kThreads) {
      const int m = e / per_row, v = e % per_row;
      *reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(sP + m * L.full_ld) + 16 * v) =
          make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
  constexpr int kU = 4;  // loads in flight per lane
  for (int m = warp; m < kRows; m += kThreads / 32) {
    if (sRowAttn[m] < 0) continue;
    const Win w = row_window(sRowWin, m);
    for (int s0 = lane; s0 < g.cols; s0 += 32 * kU) {
      int h[kU];
      float v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int s = s0 + 32 * u;
        h[u] = s < g.cols ? halo_of_slot(g, L, w, hb, hs, halo, s) : -1;
        v[u] = h[u] >= 0 ? naive::to_f32(attn[sRowAttn[m] + s * vattn.sx]) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (h[u] >= 0) sP[m * L.full_ld + h[u]] = naive::from_f32<T>(v[u]);
    }
  }
  float acc[NT][4] = {};
  const bool two = L.stages == 2;
  for (int c = 0, c0 = 0; c0 < cols; ++c, c0 += kChunk) {
    const int buf = two ? c & 1 : 0;
    const bool next = two && c0 + kChunk < cols;
    if (next)
      stage(c0 + kChunk, buf ^ 1);  // (its barrier also publishes the block)
    else if (!two && c > 0)
      stage(c0, 0);
    async_wait(next);
    T* B = sB + buf * kChunk * kLdB;
    if (c0 + kChunk > halo) {
      __syncthreads();
      load_add_rows(B, kLdB, add_b, vab, pl, sAdd + buf * kChunk, x0, L.width, NT * 8);
    }
    __syncthreads();
    warp_mma<T, NT, false, true>(acc, sP + c0, L.full_ld, B, kLdB, kChunk);
    __syncthreads();  // this buffer is free
  }
  const int r0 = warp * 16 + (lane >> 2);
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
// inverse halo x G in chunks of 64 columns. The chunk's weights are stored [column][key] and its
// rows of A [column][x], both read by ldmatrix.trans (float32: scalar loads); A's rows of the next
// chunk are copied (cp.async) while this one's weights are gathered and multiplied. Windows are
// kept relative to the tile's first key, so a key's slot in a column's window is the difference of
// two linear offsets (key_rel - col_rel).
// vec: A's rows take 16-byte copies.
template <typename TAttn, typename T, int NT>
__global__ void __launch_bounds__(kThreads) in_kernel(Geometry g, Launch L, const TAttn* attn,
                                                      View vattn, const T* a, View va, T* out,
                                                      View vo, int vec) {
  const Place pl = place_of(g, L);
  if (pl.empty) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kLdP = kRows + kPadKN, kLdA = NT * 8 + kPadKN;
  const int x0 = blockIdx.y * NT * 8;
  int4* sColB = reinterpret_cast<int4*>(smem_raw);  // [2][kChunk]: window begin, col_rel
  int4* sColE = sColB + 2 * kChunk;                 // [2][kChunk]: window end
  int64_t* sOff = reinterpret_cast<int64_t*>(sColE + 2 * kChunk);  // [2][kChunk]: A rows
  int64_t* sColAttn = sOff + 2 * kChunk;                           // [2][kChunk]: attn rows
  T* sP = reinterpret_cast<T*>(sColAttn + 2 * kChunk);  // [kChunk columns][kLdP]: weights by key
  T* sA = sP + kChunk * kLdP;                           // [2][kChunk columns][kLdA]

  int qb[3], qs[3];
  for (int ax = 0; ax < 3; ++ax) {
    const nbr::Range u = nbr::inverse_tile_union(g.axis[ax], pl.len[ax], pl.i0[ax], pl.i1[ax]);
    qb[ax] = u.begin;
    qs[ax] = u.size();
  }
  const int cols = qs[0] * qs[1] * qs[2] * g.group;
  const int K1 = g.axis[1].kernel, K2 = g.axis[2].kernel;
  // Thread t gathers the weights of key t % 64 (fixed: the loop below steps by 128 = 2 x 64).
  const int km = threadIdx.x & (kRows - 1);
  int kl[3];
  const bool key_ok = tile_row(L, pl, km, kl);
  const int dk0 = kl[0] - pl.i0[0], dk1 = kl[1] - pl.i0[1], dk2 = kl[2] - pl.i0[2];
  const int key_rel = (dk0 * K1 + dk1) * K2 + dk2;

  auto stage = [&](int c0, int buf) {
    if (threadIdx.x < kChunk) {
      const int j = threadIdx.x, h = c0 + j, at = buf * kChunk + j;
      if (h < cols) {
        int loc[3], c[3];
        halo_token(h / g.group, qb, qs, loc);
        global_of(g, pl, loc, c);
        const int gi = h % g.group;
        sOff[at] = va.at(pl.b, c, pl.hkv, gi, 0);
        sColAttn[at] = vattn.at(pl.b, c, pl.hkv, gi, 0);
        const Win w = window_of(g, pl, loc);
        const int b0 = w.b[0] - pl.i0[0], b1 = w.b[1] - pl.i0[1], b2 = w.b[2] - pl.i0[2];
        sColB[at] = make_int4(b0, b1, b2, (b0 * K1 + b1) * K2 + b2);
        sColE[at] = make_int4(w.e[0] - pl.i0[0], w.e[1] - pl.i0[1], w.e[2] - pl.i0[2], 0);
      } else {
        sOff[at] = -1;
        sColAttn[at] = -1;
      }
    }
    __syncthreads();
    load_rows(sA + buf * kChunk * kLdA, kLdA, a + x0 * va.sx, sOff + buf * kChunk, kChunk,
              max(L.width - x0, 0), NT * 8, va.sx, vec != 0, true);
    async_commit();
  };

  float acc[NT][4] = {};
  stage(0, 0);
  for (int c = 0, c0 = 0; c0 < cols; ++c, c0 += kChunk) {
    const int buf = c & 1;
    const bool next = c0 + kChunk < cols;
    if (next) stage(c0 + kChunk, buf ^ 1);
    // Weights: a warp takes 32 consecutive keys of one column (neighbouring slots, one window);
    // a thread has kU loads in flight.
    constexpr int kU = 8, kStep = kThreads / kRows;
    for (int j0 = threadIdx.x >> 6; j0 < kChunk; j0 += kStep * kU) {
      float p[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int at = buf * kChunk + j0 + kStep * u;
        p[u] = 0.f;
        if (key_ok && sColAttn[at] >= 0) {
          const int4 b = sColB[at], e = sColE[at];
          if (dk0 >= b.x && dk0 < e.x && dk1 >= b.y && dk1 < e.y && dk2 >= b.z && dk2 < e.z)
            p[u] = naive::to_f32(attn[sColAttn[at] + int64_t(key_rel - b.w) * vattn.sx]);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) sP[(j0 + kStep * u) * kLdP + km] = naive::from_f32<T>(p[u]);
    }
    async_wait(next);
    __syncthreads();
    warp_mma<T, NT, true, true>(acc, sP, kLdP, sA + buf * kChunk * kLdA, kLdA, kChunk);
    __syncthreads();  // sP and this buffer are free
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
