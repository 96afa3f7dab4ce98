// cuda-gemm's building blocks (kernels.cuh has the kernels): the launch parameters, the element
// types and the warp-level MMA over shared-memory operands in either storage order, the tile's
// place and coordinates, the halo arithmetic on top of core/neighborhood.h, row copies (plain or
// cp.async) and the index arrays PN and NN share.
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
// no neighbor; slots W.. are the additional keys (at halo + n). With `offsets`, a window slot's
// offsets (s_0, s_1, s_2) into the window box.
__device__ __forceinline__ int halo_of_slot(const Geometry& g, const Launch& L, const Win& w,
                                            const int* hb, const int* hs, int halo, int s,
                                            int* offsets = nullptr) {
  if (s >= g.window) return halo + (s - g.window);
  int s0, s1, s2;
  s2 = L.k2.divmod(s, s0);  // s0 = s / K2 for now
  s1 = L.k1.divmod(s0, s0);
  if (offsets) offsets[0] = s0, offsets[1] = s1, offsets[2] = s2;
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

// The accumulators of NN / IN (rows of the tile, columns [x0, x0 + 8 NT) of the slice): scale,
// round, store at the tile token's row of `vo` (query head gi; IN: the KV head, gi = 0).
template <typename T, int NT>
__device__ __forceinline__ void store_tile(const float (&acc)[NT][4], const Geometry& g,
                                           const Launch& L, const Place& pl, int gi, int x0,
                                           T* out, const View& vo) {
  const int lane = threadIdx.x & 31, t = lane & 3;
  const int r0 = (threadIdx.x >> 5) * 16 + (lane >> 2);
  for (int i = 0; i < 2; ++i) {
    int loc[3], c[3];
    if (!tile_row(L, pl, r0 + 8 * i, loc)) continue;
    global_of(g, pl, loc, c);
    const int64_t o = vo.at(pl.b, c, pl.hkv, gi, 0);
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
