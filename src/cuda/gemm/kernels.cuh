// cuda-gemm: the unfused operators as tensor-core GEMMs over tiles (the paper's section 3.2).
//
// The naive kernels (cuda/naive) give each output element its own thread and dot product. Here a
// CTA owns a tile of 64 rows that share a (batch, head) and a dilation group: a box of query
// tokens (PN, NN) or of key tokens (IN), the box's extents per axis chosen by the host (Tile).
// Along each axis the windows of a box of queries are contained in one interval (the windows'
// bounds are monotone: nbr::tile_union), so the keys a query tile needs form a box, its halo;
// the keys' inverse neighborhoods likewise (nbr::inverse_tile_union). The halo is walked in
// chunks of 64 tokens (halo tokens in row-major order, then the additional keys), each chunk's
// rows copied into shared memory (cp.async, the next chunk's during this one's products), and the
// tile's rows are multiplied with the chunk by mma.sync:
//
//   PN (Q K^T; dO V^T):  S[64 x 64]  = A_tile[64 x D] * B_chunk[64 x D]^T; every product whose key
//                        is in its query's window goes to its attention-tensor slot (pairs outside
//                        the windows are computed and dropped: the paper's cost of the GEMM
//                        formulation), directly or through the tile's [64 x halo] block.
//   NN (P V; dS K):      O[64 x Dv] += P[64 x chunk] * B_chunk[64 x Dv], P the tile's attention
//                        rows scattered once into a zeroed [64 x halo] block (or, where that does
//                        not fit, gathered chunk by chunk): 0 where the key is not a neighbor.
//   IN (dS^T Q; P^T dO): out[key x D] += P^T_chunk[64 keys x 64 (query, head)] * A_chunk, the
//                        columns running over the key tile's inverse halo times the query heads
//                        of the KV head; each output row is owned by one CTA (no atomics).
//
// float16 / bfloat16 run m16n8k16; float32 runs m16n8k8 TF32 split into three products
// (float32-class accuracy, as the fused kernels' default). Attention weights stored in float32
// (the composed forward / backward's workspace) are rounded to the MMA's element type for NN / IN,
// as the fused kernels round P. Accumulation is float32 throughout.
#pragma once

#include "cuda/gemm/tile.cuh"

namespace fna {
namespace gemm {

// ---- PN ----------------------------------------------------------------------------------------
// out[q, slot] = scale * <A[q], B[key]> for every key of q's window (slot: its place in the window
// box) and scale * <A[q], addB[n]> at slot W + n; slots without a neighbor get `masked`. The next
// chunk's key rows are copied (cp.async, two buffers) while this one is multiplied. The products
// go to the attention tensor directly (each with its slot), or with kFull into the tile's
// [64 x halo] block (leading dimension L.full_ld), written out row by row at the end. With `bias`
// (QK's relative positional bias) each stored product gets its pair's entry added in float32:
// per product before its rounding in the direct stores; per slot when the block is written out,
// to the product as the block holds it (rounded to TOut: a float32 block doubles the block's
// shared memory and pushed nat-t to the direct stores, 0.431 against 0.262 ms on an H100).
// kBias: separate instantiations, so that calls without a bias run the kernels without its
// registers and tests.
// vec: bit 0, A's rows take 16-byte copies; bit 1, B's.
template <typename TIn, typename TOut, bool kFull, bool kBias>
__global__ void __launch_bounds__(kThreads) pn_kernel(Geometry g, Launch L, const TIn* a, View va,
                                                      const TIn* bm, View vb, const TIn* add_b,
                                                      AddView vab, TOut* out, View vo, int vec,
                                                      naive::Bias bias) {
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
  int* sRowQ = sLoc + 6 * kChunk;                              // [kRows][3]: bias only

  int hb[3], hs[3];
  const int halo = key_halo(g, pl, hb, hs);
  const int cols = halo + g.num_add;
  row_info(g, L, pl, va, vo, sOff, sRowOut, sRowWin);
  if (kBias && threadIdx.x < kRows) tile_row(L, pl, threadIdx.x, sRowQ + 3 * threadIdx.x);
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
  int qr[2][3];  // and with a bias their local query coordinates
  const int head = pl.hkv * g.group + pl.gi;
  if constexpr (!full)
    for (int i = 0; i < 2; ++i) {
      w[i] = row_window(sRowWin, r0 + 8 * i);
      ro[i] = sRowOut[r0 + 8 * i];
      for (int ax = 0; ax < 3; ++ax) qr[i][ax] = kBias ? sRowQ[3 * (r0 + 8 * i) + ax] : 0;
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
        const int i = e >> 1, m = r0 + 8 * i, j = 8 * n + 2 * t + (e & 1);
        float val = L.scale * acc[n][e];
        int slot = -1;
        if constexpr (!full) {
          const int at = buf * kChunk + j;
          const int* loc = sLoc + 3 * at;
          if (loc[0] >= 0) {
            slot = slot_of(g, w[i], loc);
            if (kBias && slot >= 0 && ro[i] >= 0) {
              int bi[3];
              for (int ax = 0; ax < 3; ++ax)
                bi[ax] = nbr::bias_index(g.axis[ax], qr[i][ax], loc[ax]);
              val += bias.at(head, bi);
            }
          } else if (sAdd[at] >= 0) {
            slot = g.window + sAdd[at];
          }
        }
        if constexpr (full) {
          sS[m * L.full_ld + c0 + j] = naive::from_f32<TOut>(val);
        } else {
          if (ro[i] >= 0 && slot >= 0) out[ro[i] + slot * vo.sx] = naive::from_f32<TOut>(val);
        }
      }
    __syncthreads();  // this buffer is free
  }
  if constexpr (!full) return;
  const TOut masked = naive::from_f32<TOut>(L.masked);
  for (int m = warp; m < kRows; m += kThreads / 32) {
    if (sRowOut[m] < 0) continue;
    const Win rw = row_window(sRowWin, m);
    if constexpr (!kBias) {
      for (int s = lane; s < g.cols; s += 32) {
        const int h = halo_of_slot(g, L, rw, hb, hs, halo, s);
        out[sRowOut[m] + s * vo.sx] = h >= 0 ? sS[m * L.full_ld + h] : masked;
      }
    } else {
      // The table entry of the window box's first slot; slot (s0, s1, s2) adds s_a per axis.
      int first[3];
      for (int ax = 0; ax < 3; ++ax)
        first[ax] = nbr::bias_index(g.axis[ax], sRowQ[3 * m + ax], rw.b[ax]);
      for (int s = lane; s < g.cols; s += 32) {
        int o[3];
        const int h = halo_of_slot(g, L, rw, hb, hs, halo, s, o);
        if (h < 0) {
          out[sRowOut[m] + s * vo.sx] = masked;
          continue;
        }
        float x = naive::to_f32(sS[m * L.full_ld + h]);
        if (s < g.window) {
          for (int ax = 0; ax < 3; ++ax) o[ax] += first[ax];
          x += bias.at(head, o);
        }
        out[sRowOut[m] + s * vo.sx] = naive::from_f32<TOut>(x);
      }
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
  const int halo = key_halo(g, pl, hb, hs);
  const int cols = halo + g.num_add;
  row_info(g, L, pl, vattn, vattn, nullptr, sRowAttn, sRowWin);
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
          slot = slot_of(g, row_window(sRowWin, m), key);
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
  store_tile<T, NT>(acc, g, L, pl, pl.gi, x0, out, vo);
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
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
  store_tile<T, NT>(acc, g, L, pl, pl.gi, x0, out, vo);
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
  store_tile<T, NT>(acc, g, L, pl, 0, x0, out, vo);
}

}  // namespace gemm
}  // namespace fna
