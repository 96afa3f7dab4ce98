// The strip forward: the box forward's warp work (fwd_box.cuh: a 4x4 query box against the
// union of the box's windows, 64-key chunks, mma.sync) on a CTA that owns a strip of 16 query
// columns of one (batch, head, dilation group) and walks its rows, instead of one query tile.
// Its warp boxes may also be 2x8 queries: a 2-row box's union spans fewer rows (7x7 windows: 8
// rows, two chunks of 4 rows x 16 columns, against 10 rows and three chunks), where the union of
// 8 columns' windows still fits a chunk's 16 columns. At head dims up to 32 (kD = 32) the ring
// rows keep their 64 columns (zeros past D) and the products skip the k-steps and n8 blocks
// past column 32. At head dim 128 each ring has two planes, columns 0-63 and 64-127, each laid
// out as a head-dim-64 ring (a band is one TMA box, or one round of cp.async copies, per plane).
//
// The box forward copies each CTA tile's halo whole (200 KB for 16x16 queries with 13x13
// windows, one CTA per SM), so the SM idles while a tile's halo arrives and its tail drains, and
// each halo row is copied by every tile that needs it. Here the strip's halo rows (the union of
// its columns' windows on the last axis, every row its box rows need) stream through a ring in
// shared memory, two halo rows per band, each ring slot with a "full" mbarrier (its copies
// landed), an "empty" mbarrier (every warp handed its band back) and a count of the warps that
// handed bands of it back, which elects the last one. A halo row is copied once per strip, and the
// copies run ahead of the multiplications by as many bands as the ring has free. On sm_90 a band
// is one TMA box per tensor (2 halo rows x pitch columns, issued by one lane, completing on the
// barrier's transaction count); elsewhere, or where TMA cannot describe the tensors, a warp's
// cp.async copies (Tuning::fwd_copy = cp_async asks for them).
//
// Warp w takes box column w % B of the strip (B = 16 / box width) and box rows w / B, w / B +
// kPhases, ...: the kPhases box rows side by side share most of their halo rows. Before a box row
// the warp hands back every band below the row's union, a lane per band (an arrive on the slot's
// "empty" barrier, then the count); a band is handed back only once it has been filled (waited on),
// so the hand-backs of a slot follow the ring's generations, and the lane whose count is last waits
// for the "empty" barrier and copies the band that reuses the slot (there is no producer warp: it
// would round the CTA's register budget to the next four warps). No memory fence is on that path: a
// fence waits for the thread's global loads in flight, the next box's Q, and with fences the
// hand-backs took 11.5% of the warps' time (2d-nat, H100). A box row's union fits the ring with a
// band to spare (strip_plan), and the warps hand bands back in row order, so the lowest box row in
// flight can always proceed. At 8 warps the next box's Q fragments wait in registers through the
// current box; at 12 and 16 warps they are loaded during the last chunk (kPrefetchQ).
//
// Shared memory (1024-byte aligned): ring_rows x pitch K rows, then as many V rows, 128 bytes
// each (head dim 64) with the box forward's XOR swizzle, which is TMA's 128-byte swizzle; ring
// row y is rows y * pitch .. y * pitch + pitch - 1 (the strip's hn2 <= pitch halo columns first;
// pitch % 4 == 0, so every band starts on the swizzle's 1024-byte period).
#pragma once

#include <cmath>
#include <cstdlib>
#include <string>

#include "cuda/common/mbarrier.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/fused/kernel/common/box_parts.cuh"
#include "cuda/fused/kernel/common/fwd_common.cuh"
#include "cuda/fused/kernel/common/fwd_params.h"
#include "cuda/fused/kernel/common/strip_plan.h"

namespace fna {
namespace fused {

// kD: the head dim the products cover (64; 32 where max(D, D_v) <= 32: the ring rows keep 64
// columns, the k-steps of S and the n8 blocks of O past 32 are skipped; 128: two planes per ring);
// kBH x kBW: the warp box.
// kSplit: warps per box, each accumulating its share of the head-dim columns (2: the strip dK /
// dV kernel at head dim 128, whose dK and dV take 128 registers a thread over all 128 columns).
template <class T, int kD_, int kPhases_, int kBH_, int kBW_, int kSplit_ = 1>
struct StripTraits {
  using Elem = typename T::type;
  using Tag = T;  // the MMA's element type (mma::BF16, mma::F16)
  // The names softmax_scores / FwdState / store_row read.
  static constexpr bool kF32 = false;
  static constexpr int kD = kD_;
  static constexpr int kFirstAxis = 1;
  static constexpr int kMT = 1;
  static constexpr int kStepN = 64;
  static constexpr bool kQInRegs = false;
  static constexpr int kPhases = kPhases_;
  static constexpr int kBH = kBH_, kBW = kBW_;
  static constexpr int kBoxCols = kStripCols / kBW;  // boxes across the strip
  static constexpr int kSplit = kSplit_;
  static constexpr int kWarps = kBoxCols * kPhases * kSplit;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowBytes = kStripRowBytes;
  static constexpr int kPlanes = strip_planes(kD);
  static_assert(kD == 32 || kD == 64 || kD == 128, "strip forward: head dim 32, 64 or 128");
  static_assert(kBH * kBW == 16 && kStripCols % kBW == 0, "strip forward: 16-query warp boxes");
};

// x, as a value the compiler cannot see through: what is computed from it is recomputed where
// it is used instead of being held in registers (or spilled) from an earlier point.
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

// The ring position of a band: its slot and the parity of its generation, stepped one band at a
// time (no division).
struct RingCursor {
  int band = 0, slot = 0;
  uint32_t parity = 0;
  __device__ __forceinline__ void next(int slots) {
    ++band;
    if (++slot == slots) {
      slot = 0;
      parity ^= 1u;
    }
  }
  // n bands on (0 <= n <= slots).
  __device__ __forceinline__ void advance(int n, int slots) {
    band += n;
    slot += n;
    if (slot >= slots) {
      slot -= slots;
      parity ^= 1u;
    }
  }
};


// The shared-memory row offsets of chunk `ch`'s kBoxChunkRows union rows (rows past the union's
// `un` repeat its last), the union starting at ring row `ring_base`: a union spans at most 32
// rows and ring_rows >= 16, so two conditional subtractions keep a row inside the ring.
__device__ __forceinline__ void chunk_rows(int (&row)[kBoxChunkRows], int ring_base, int ch,
                                           int un, int ring_rows, int pitch) {
#pragma unroll
  for (int a = 0; a < kBoxChunkRows; ++a) {
    int y = ring_base + min(kBoxChunkRows * ch + a, un - 1);
    y -= y >= ring_rows ? ring_rows : 0;
    y -= y >= ring_rows ? ring_rows : 0;
    row[a] = y * pitch;
  }
}


// At head dim 128 the dK / dV kernel's boxes take two warps each (StripTraits::kSplit).
template <int kRole, int kD>
constexpr int strip_split() { return kRole == int(StripRole::dkdv) && kD == 128 ? 2 : 1; }

// kRole (StripRole): the forward; the backward's strip dQ kernel (the same CTAs, ring and chunks;
// per box Q and dO fragments, P from the saved LSE, dS = P (dP - rowsum(dO O)), dQ = scale dS K
// into p.o: box_dq_update), which the plan runs after a dK / dV kernel that leaves dQ out (the
// plain Hopper one, or the strip one); or the backward's strip dK / dV kernel: boxes of 16 keys (K
// and V fragments), the ring holding the query rows (Q and dO) of their inverse neighborhoods,
// S^T = K Q^T and dP^T = V dO^T per chunk, P^T and dS^T from the queries' statistics, dV += P^T
// dO and dK += dS^T Q (box_dkdv_update), stored once per box: no atomics.
template <class T, int kD, int kPhases, int kBH, int kBW, bool kTma, bool kBias, int kRole = 0>
__global__ void __launch_bounds__(
    StripTraits<T, kD, kPhases, kBH, kBW, strip_split<kRole, kD>()>::kThreads, 1)
    fna_fwd_strip_kernel(const FwdParams p, const StripParams sp,
                         const __grid_constant__ StripTma tm, const StripBwd bw) {
  constexpr bool kDq = kRole == int(StripRole::dq), kDkdv = kRole == int(StripRole::dkdv);
  static_assert(kRole == 0 || !kBias, "strip backward: no bias");
  // A box's union on one axis and one box position's window: inverse ones for dK / dV.
  auto uni = [](const nbr::Axis& a, int len, int i0, int i1) {
    return nbr::tile_union_of(a, len, i0, i1, kDkdv);
  };
  auto win = [](const nbr::Axis& a, int len, int i) {
    return kDkdv ? nbr::inverse_window(a, len, i) : nbr::window(a, len, i);
  };
  using Tr = StripTraits<T, kD, kPhases, kBH, kBW, strip_split<kRole, kD>()>;
  using Elem = typename Tr::Elem;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (kTma) {
    __trap();  // the launcher takes TMA only on sm_90+
    return;
  }
#endif
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full_bars[kStripMaxBands];
  // Per slot, an "empty" barrier every warp arrives on as it hands a band of the slot back (its
  // reads of the slot come first: the arrive releases them), and the number of warps that
  // handed a band of it back (all generations), which elects the lane that copies the next one.
  __shared__ __align__(8) uint64_t empty_bars[kStripMaxBands];
  __shared__ int handed_back[kStripMaxBands];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  // The work item: (batch, head, group, strip, segment), segments fastest, so neighboring CTAs
  // share halo rows in L2.
  FwdTile ft;
  int seg, strip;
  {
    int flat = blockIdx.x;
    seg = flat % sp.segs;
    flat /= sp.segs;
    strip = flat % sp.strips;
    flat /= sp.strips;
    const int grp = flat % p.groups;
    flat /= p.groups;
    ft.h = flat % p.heads;
    ft.b = flat / p.heads;
    ft.gr = Group::of(p.geo, grp);
    ft.qo[0] = ft.qo[1] = ft.qo[2] = 0;
  }
  const Geometry& geo = p.geo;
  const Group& gr = ft.gr;
  const int len1 = gr.len[1], len2 = gr.len[2];
  const int c0 = strip * kStripCols, r0 = seg * sp.seg_rows;
  if (c0 >= len2 || r0 >= len1) return;
  const int r1 = min(r0 + sp.seg_rows, len1);
  const int hkv = ft.h / p.heads_per_kv;

  // The strip's halo: columns h2 (every box row), rows h1 (the segment's union).
  const nbr::Range h2 = uni(geo.axis[2], len2, c0, min(c0 + kStripCols, len2));
  const nbr::Range h1 = uni(geo.axis[1], len1, r0, r1);
  const int hn2 = h2.size(), y0 = h1.begin;
  const int n_bands = (h1.size() + kStripBandRows - 1) / kStripBandRows;
  const int slots = sp.ring_rows / kStripBandRows;
  // Bands whose slot is reused (for band + slots): the first n_bands - slots.
  const int n_release = n_bands - slots;

  const uint32_t full0 = mma::smem_u32(full_bars), empty0 = mma::smem_u32(empty_bars);
  if (threadIdx.x < slots) {
    mbar::init(full0 + 8 * threadIdx.x, kTma ? 1 : 32);  // the TMA thread, or a warp's lanes
    mbar::init(empty0 + 8 * threadIdx.x, Tr::kWarps);
    if constexpr (kTma) mbar::fence_init_for_tma();
    handed_back[threadIdx.x] = 0;
  }
  // The ring starts 1024-byte aligned (the 128-byte swizzle of TMA is a function of the address;
  // box_sw's is of the row, and a band is a multiple of 1024 bytes: pitch % 4 == 0).
  const uint32_t raw = mma::smem_u32(smem_raw);
  const uint32_t sK = raw + ((1024u - (raw & 1023u)) & 1023u);
  const StripSmem layout{uint32_t(Tr::kRowBytes), sp.ring_rows, sp.pitch, Tr::kPlanes};
  const uint32_t sV = sK + layout.v_offset();
  const uint32_t band_bytes = layout.band_bytes();
  const uint32_t plane_bytes = Tr::kPlanes > 1 ? layout.plane_bytes() : 0u;
  // The bias (kBias): the head's table, divided by the scale, staged after the rings
  // (fwd_bias.cuh stage_bias; FwdParams::rpb_staged).
  BiasRows<Tr> br{};
  if constexpr (kBias)
    stage_bias<Tr>(p, ft.h, reinterpret_cast<float*>(smem_raw + (sK + 2 * layout.v_offset() - raw)),
                   br);
  const uint32_t sB = br.sbase;
  __syncthreads();

  // TMA: one thread copies band `band` into ring slot `slot`, one box of kStripBandRows halo rows
  // x pitch columns per tensor and plane (zeros past the axes' ends and the head dim), completing
  // on the slot's "full" barrier.
  auto issue_tma = [&](int band, int slot) {
    const uint32_t bar = full0 + 8 * slot;
    tma::arrive_expect_tx(bar, 2 * Tr::kPlanes * band_bytes);
    // This slot's previous band was read by ldmatrix; the "empty" barrier's wait ordered those
    // reads before this thread's TMA writes (a read-then-write hazard needs no proxy fence, as
    // in CUTLASS's TMA pipelines; a fence here would also wait for this thread's global loads
    // in flight).
    const int o[kAxes] = {0, (y0 + band * kStripBandRows) * geo.axis[1].dilation + gr.g[1],
                          h2.begin * geo.axis[2].dilation + gr.g[2]};
    int ck[4], cv[4];
    tma::box_coords(tm.k, ft.b, o, hkv, ck);
    tma::box_coords(tm.v, ft.b, o, hkv, cv);
#pragma unroll
    for (int pl = 0; pl < Tr::kPlanes; ++pl) {
      tma::load_box(sK + pl * plane_bytes + slot * band_bytes, tm.k, pl * kStripPlaneCols, ck, bar);
      tma::load_box(sV + pl * plane_bytes + slot * band_bytes, tm.v, pl * kStripPlaneCols, cv, bar);
    }
  };
  // Copies band `band` into ring slot `slot` (the whole warp calls it) and arrives on the slot's
  // "full" barrier: by TMA (lane 0), or lane l copies 16-byte chunk l % 8 of the band's halo row
  // (l / 8) % 2, columns l / 16, l / 16 + 2, ... of each plane and arrives when its copies land.
  auto issue_band = [&](int band, int slot) {
    if constexpr (kTma) {
      if (lane == 0) issue_tma(band, slot);
      return;
    }
    const int sub = lane & 7, rr = (lane >> 3) & 1, x0 = lane >> 4;
    const int y = y0 + band * kStripBandRows + rr;
    if (y < h1.end) {
      const int dil2 = geo.axis[2].dilation;
      const int gy = y * geo.axis[1].dilation + gr.g[1];
      const int gx = (h2.begin + x0) * dil2 + gr.g[2];
      const int64_t kx = 2 * int64_t(dil2) * p.k_stride[3], vx = 2 * int64_t(dil2) * p.v_stride[3];
#pragma unroll
      for (int pl = 0; pl < Tr::kPlanes; ++pl) {
        const int col = pl * kStripPlaneCols + sub * 8;
        const bool kin = col < p.dim, vin = col < p.dim_v;
        const Elem* k = static_cast<const Elem*>(p.k) + ft.b * p.k_stride[0] +
                        hkv * p.k_stride[4] + int64_t(gy) * p.k_stride[2] +
                        int64_t(gx) * p.k_stride[3] + col;
        const Elem* v = static_cast<const Elem*>(p.v) + ft.b * p.v_stride[0] +
                        hkv * p.v_stride[4] + int64_t(gy) * p.v_stride[2] +
                        int64_t(gx) * p.v_stride[3] + col;
        int row = (slot * kStripBandRows + rr) * sp.pitch + x0;
        const uint32_t k0 = sK + pl * plane_bytes, v0 = sV + pl * plane_bytes;
        for (int x = x0; x < hn2; x += 2, row += 2, k += kx, v += vx) {
          const uint32_t off = box_sw(row, sub);
          mma::cp_async_16(k0 + off, kin ? k : p.k, kin);
          mma::cp_async_16(v0 + off, vin ? v : p.v, vin);
        }
      }
    }
    mbar::arrive_cp_async(full0 + 8 * slot);
  };
  // The ring's first fill, bands spread over the warps.
  for (int band = warp; band < min(slots, n_bands); band += Tr::kWarps) issue_band(band, band);

  // Consumers. Fixed per warp: the box column, its union's columns and the thread's column
  // patterns (the four columns t2, t2 + 1, t2 + 8, t2 + 9 of a 16-column chunk row).
  // (kSplit warps per box: `half` picks the warp's head-dim columns.)
  const int wbox = warp / Tr::kSplit, half = warp % Tr::kSplit;
  const int phase = wbox / Tr::kBoxCols;
  const int qb2 = c0 + (wbox % Tr::kBoxCols) * kBW;
  const bool col_active = qb2 < len2;
  const int t2 = 2 * (lane & 3);
  nbr::Range u2{0, 0};
  unsigned pat[2] = {0u, 0u};
  if (col_active) {
    u2 = uni(geo.axis[2], len2, qb2, min(qb2 + kBW, len2));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q2 = qb2 + ((lane >> 2) + 8 * r) % kBW;
      if (q2 < len2) {
        const nbr::Range w2 = win(geo.axis[2], len2, q2);
        const unsigned cb = box_bits(w2.begin - u2.begin, w2.end - u2.begin) >> t2;
        pat[r] = (cb & 3u) | ((cb >> 6) & 0xcu);
      }
    }
  }
  const int c_off = u2.begin - h2.begin;
  const int kcol = min(c_off + (lane & 7) + ((lane >> 4) << 3), hn2 - 1);
  const int vcol = min(c_off + (lane & 7) + (((lane >> 3) & 1) << 3), hn2 - 1);
  const int ksel = (lane >> 3) & 1, vsel = lane >> 4;

  RingCursor filled;    // the next band to wait "full" for
  RingCursor released;  // the next band to hand back
  // Waits until band `b` (and every band before it) is filled.
  auto wait_filled = [&](int b) {
    while (filled.band <= b) {
      mbar::wait(full0 + 8 * filled.slot, filled.parity);
      filled.next(slots);
    }
  };
  // Hands back every band below `b` whose slot is reused, up to `slots` bands at a time, lane i
  // the i-th: it arrives on the slot's "empty" barrier, and the lane whose count is last waits
  // for that barrier (every warp's reads of the slot done) and copies band + slots into the
  // slot. No fence: one would also wait for this thread's global loads in flight (the next
  // box's Q). Each round waits only for its own bands to be filled: a band `slots` or more past
  // the first one not yet handed back is refilled only after this warp's hand-back of the band
  // `slots` before it, so waiting for all of [released, b) first would wait on this warp itself
  // (a stride on axis 1 can move a warp's next union more than the ring's length ahead;
  // tests/cpp/strip_ring_test.cpp).
  auto release_below = [&](int b) {
    b = min(b, n_release);
    while (released.band < b) {
      const int n = min(b - released.band, slots);
      wait_filled(released.band + n - 1);
      __syncwarp();
      RingCursor mine = released;  // this lane's band (lanes past n: unused)
      mine.advance(lane < n ? lane : 0, slots);
      const int slot = mine.slot;
      const uint32_t parity = mine.parity;
      bool won = false;
      if (lane < n) {
        mbar::arrive(empty0 + 8 * slot);
        won = atomicAdd(&handed_back[slot], 1) % Tr::kWarps == Tr::kWarps - 1;
      }
      if constexpr (kTma) {
        if (won) {
          mbar::wait(empty0 + 8 * slot, parity);
          issue_tma(released.band + lane + slots, slot);
        }
      } else {
        for (unsigned wins = __ballot_sync(0xffffffffu, won); wins != 0u; wins &= wins - 1u) {
          const int i = __ffs(wins) - 1;
          const int si = __shfl_sync(0xffffffffu, slot, i);
          mbar::wait(empty0 + 8 * si, __shfl_sync(0xffffffffu, parity, i));
          issue_band(released.band + i + slots, si);
        }
      }
      released.advance(n, slots);
    }
  };

  // Q of a box straight into A fragments (as the box forward), zeros past the axes' ends and D.
  // The box's addresses are recomputed from the parameters (opaque: not hoisted out of the box
  // loop), which costs a few integer instructions per box; held across the chunks at 16 warps
  // (128 registers) they spill, and the spills miss L1 beside a 227 KB ring.
  // (`src`, `stride`, `cols`: the tensor read, Q by default; the dQ kernel's dO.)
  auto load_q = [&](int qb1, uint32_t (&qf)[kD / 16][4], const void* src = nullptr,
                    const int64_t* stride = nullptr, int cols = 0) {
    if (src == nullptr) src = p.q, stride = p.q_stride, cols = p.dim;
    const int b = opaque(ft.b), h = opaque(ft.h), qc = opaque(qb2);
    const Elem* gQ = static_cast<const Elem*>(src) + b * stride[0] + h * stride[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = (lane >> 2) + 8 * r;
      int c[kAxes] = {0, qb1 + i / kBW, qc + i % kBW};
      const bool ok = qc < len2 && c[1] < r1 && c[2] < len2;
      const Elem* row = gQ + (ok ? token_offset<1>(geo, gr, c, stride) : 0);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int col = kk * 16 + hh * 8 + t2;
          qf[kk][r + 2 * hh] =
              ok && col < cols ? __ldg(reinterpret_cast<const unsigned int*>(row + col)) : 0u;
        }
    }
  };
  constexpr int kStep = kPhases * kBH;
  if constexpr (kDq || kDkdv) {
    // dQ: the statistics of the thread's two query rows ({+inf, 0} past the group's ends: P =
    // 0), per box.
    auto load_stat = [&](int qb1, float2 (&stat)[2]) {
      if constexpr (kDq) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = (lane >> 2) + 8 * r;
          const int q1 = qb1 + i / kBW, q2 = qb2 + i % kBW;
          stat[r] = make_float2(INFINITY, 0.f);
          if (q1 < r1 && q2 < len2) {
            const int64_t tok = int64_t(gr.global(geo, 1, q1)) * geo.axis[2].length +
                                gr.global(geo, 2, q2);
            stat[r] = __ldg(bw.stats + (int64_t(ft.b) * p.tokens + tok) * p.heads + ft.h);
          }
        }
      }
    };
    // dK / dV: the statistics of a chunk's query columns, per chunk: the thread's four columns
    // (8 h + t2 + e of the union's 16) at `col_tok` (their global column, clamped to the group:
    // past its end the mask removes them), each chunk row's offset computed in `load_cs`.
    int64_t col_tok[4] = {0, 0, 0, 0};
    const float2* stats_bh = bw.stats + (int64_t(ft.b) * p.tokens) * p.heads + ft.h;
    if constexpr (kDkdv) {
#pragma unroll
      for (int c = 0; c < 4; ++c)
        col_tok[c] = gr.global(geo, 2, min(u2.begin + 8 * (c >> 1) + t2 + (c & 1), len2 - 1));
    }
    // A box's fragments (dQ: Q and dO; dK / dV: K and V) and statistics; the next box's are
    // loaded during the last chunk, the first once S is computed, the second once dP is, the
    // statistics into `stn`. At head dim 128 the chunk's rows go one at a time (kRowWise,
    // box_dq_row / box_dkdv_row: with whole chunks ptxas spilled 60-104 bytes) and the next box's
    // loads follow the last row.
    constexpr bool kRowWise = kD == 128;
    constexpr int kCols = kD / Tr::kSplit;
    const int col0 = half * kCols;
    uint32_t qf[kD / 16][4], of[kD / 16][4];
    float2 stat[2], stn[2];
    if (col_active && r0 + phase * kBH < r1) {
      load_q(r0 + phase * kBH, qf);
      load_q(r0 + phase * kBH, of, bw.a2, bw.a2_stride, p.dim_v);
      load_stat(r0 + phase * kBH, stat);
    }
    for (int qb1 = r0 + phase * kBH; qb1 < r1; qb1 += kStep) {
      const nbr::Range u1 = uni(geo.axis[1], len1, qb1, min(qb1 + kBH, len1));
      const int u_off = u1.begin - y0;
      release_below(u_off / kStripBandRows);
      if (!col_active) continue;
      const bool more = qb1 + kStep < r1;
      unsigned rowbits[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int q1 = qb1 + ((lane >> 2) + 8 * r) / kBW;
        rowbits[r] = 0u;
        if (q1 < r1) {
          const nbr::Range w1 = win(geo.axis[1], len1, q1);
          rowbits[r] = box_bits(w1.begin - u1.begin, w1.end - u1.begin);
        }
      }
      const int ring_base = u_off % sp.ring_rows;
      const int un = u1.size();
      const int n_chunks = (un + kBoxChunkRows - 1) / kBoxChunkRows;
      // dQ, or dK; dV (dK / dV only): the warp's kCols head-dim columns from col0.
      float acc[1][kCols / 8][4], acc2[1][kDkdv ? kCols / 8 : 1][4];
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j)
        acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.f;
#pragma unroll
      for (int j = 0; j < (kDkdv ? kCols / 8 : 1); ++j)
        acc2[0][j][0] = acc2[0][j][1] = acc2[0][j][2] = acc2[0][j][3] = 0.f;
      for (int ch = 0; ch < n_chunks; ++ch) {
        wait_filled((u_off + min(kBoxChunkRows * ch + kBoxChunkRows, un) - 1) / kStripBandRows);
        int row[kBoxChunkRows];
        chunk_rows(row, ring_base, ch, un, sp.ring_rows, sp.pitch);
        // dK / dV: the statistics of chunk row a's four columns (h * 2 + e): loaded before the
        // chunk's products at head dim 32, after them at 64 (held through them, they spilled),
        // before each row's at 128.
        auto load_cs = [&](int a, float2 (&cs)[4]) {
          const int ua = min(kBoxChunkRows * ch + a, un - 1);
          const int64_t rt = int64_t(gr.global(geo, 1, u1.begin + ua)) * geo.axis[2].length;
#pragma unroll
          for (int c = 0; c < 4; ++c) cs[c] = __ldg(stats_bh + (rt + col_tok[c]) * p.heads);
        };
        const bool last = more && ch == n_chunks - 1;
        if constexpr (kRowWise) {
          // Row by row; the chunk's rows past the union repeat its last row: masked.
#pragma unroll
          for (int a = 0; a < kBoxChunkRows; ++a) {
            unsigned keep[2];
#pragma unroll
            for (int r = 0; r < 2; ++r)
              keep[r] = kBoxChunkRows * ch + a < un &&
                                ((rowbits[r] >> (kBoxChunkRows * ch + a)) & 1u) != 0u
                            ? pat[r]
                            : 0u;
            if constexpr (kDkdv) {
              float2 cs[4];
              load_cs(a, cs);
              box_dkdv_row<Tr, kCols>(acc, acc2, qf, of, cs, row[a], sK, sV, kcol, ksel, vcol,
                                      vsel, keep, p.scale_log2, plane_bytes, col0);
            } else {
              box_dq_row<Tr>(acc, qf, of, stat, row[a], sK, sV, kcol, ksel, vcol, vsel, keep,
                             p.scale_log2, plane_bytes);
            }
          }
          if (last) {
            load_q(qb1 + kStep, qf);
            load_q(qb1 + kStep, of, bw.a2, bw.a2_stride, p.dim_v);
            load_stat(qb1 + kStep, stn);
          }
        } else {
        // dK / dV: the chunk's column statistics, loaded before the products at head dim 32
        // (their latency behind the MMAs), after them at 64 (held through them, they spilled).
        constexpr bool kEarlyCs = kDkdv && kD <= 32;
        float2 cs[kDkdv ? kBoxChunkRows : 1][4];
        if constexpr (kEarlyCs) {
#pragma unroll
          for (int a = 0; a < kBoxChunkRows; ++a) load_cs(a, cs[a]);
        }
        float sc[1][8][4], dp[1][8][4];
        box_scores<Tr>(sc, qf, row, sK, kcol, ksel, ch, rowbits, pat, plane_bytes);
        if (last) load_q(qb1 + kStep, qf);
        box_products<Tr>(dp, of, row, sV, kcol, ksel, plane_bytes);
        if (last) {
          load_q(qb1 + kStep, of, bw.a2, bw.a2_stride, p.dim_v);
          load_stat(qb1 + kStep, stn);
        }
        if constexpr (kDkdv) {
          if constexpr (!kEarlyCs) {
#pragma unroll
            for (int a = 0; a < kBoxChunkRows; ++a) load_cs(a, cs[a]);
          }
          box_dkdv_update<Tr>(acc, acc2, sc, dp, cs, row, sK, sV, vcol, vsel, p.scale_log2,
                              plane_bytes);
        } else {
          box_dq_update<Tr>(acc, sc, dp, stat, row, sK, vcol, vsel, p.scale_log2, plane_bytes);
        }
        }  // kRowWise
      }
      stat[0] = stn[0], stat[1] = stn[1];
      // dQ = scale dS K (columns below D); dK = scale dS^T Q (below D), dV = P^T dO (below D_v):
      // at the thread's two box rows.
      const int b = opaque(ft.b), h = opaque(ft.h);
      Elem* g1 = static_cast<Elem*>(p.o) + b * p.o_stride[0] + h * p.o_stride[4];
      Elem* g2 = kDkdv ? static_cast<Elem*>(bw.out2) + b * bw.out2_stride[0] +
                             h * bw.out2_stride[4]
                       : nullptr;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = (lane >> 2) + 8 * r;
        const int q[kAxes] = {0, qb1 + i / kBW, qb2 + i % kBW};
        if (q[1] >= r1 || q[2] >= len2) continue;
        Elem* out = g1 + token_offset<1>(geo, gr, q, p.o_stride);
#pragma unroll
        for (int j = 0; j < kCols / 8; ++j) {
          const int col = col0 + j * 8 + t2;
          if (col < p.dim)
            *reinterpret_cast<uint32_t*>(out + col) =
                mma::pack2<T>(acc[0][j][2 * r] * p.scale, acc[0][j][2 * r + 1] * p.scale);
        }
        if constexpr (kDkdv) {
          Elem* out_v = g2 + token_offset<1>(geo, gr, q, bw.out2_stride);
#pragma unroll
          for (int j = 0; j < kCols / 8; ++j) {
            const int col = col0 + j * 8 + t2;
            if (col < p.dim_v)
              *reinterpret_cast<uint32_t*>(out_v + col) =
                  mma::pack2<T>(acc2[0][j][2 * r], acc2[0][j][2 * r + 1]);
          }
        }
      }
    }
    release_below(n_release);
    return;
  }
  // The next box's Q: at 8 warps it waits in registers (qn) through the current box; at 12 and
  // 16 warps (at most 168 / 128 registers per thread, where qn would spill), and at head dim 128
  // (holding it there took 255 registers at 8 warps), it is loaded into qf once the last chunk's S
  // is computed, and flies during that chunk's softmax and P V.
  constexpr bool kPrefetchQ = Tr::kWarps <= 8 && kD <= 64;
  uint32_t qn[kD / 16][4], qf[kD / 16][4];
  load_q(r0 + phase * kBH, kPrefetchQ ? qn : qf);
  for (int qb1 = r0 + phase * kBH; qb1 < r1; qb1 += kStep) {
    const nbr::Range u1 = uni(geo.axis[1], len1, qb1, min(qb1 + kBH, len1));
    const int u_off = u1.begin - y0;  // the union's first row, relative to the halo
    release_below(u_off / kStripBandRows);
    if (!col_active) continue;
    const bool more = qb1 + kStep < r1;
    if constexpr (kPrefetchQ) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) qf[kk][e] = qn[kk][e];
      if (more) load_q(qb1 + kStep, qn);
    }
    unsigned rowbits[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q1 = qb1 + ((lane >> 2) + 8 * r) / kBW;
      rowbits[r] = 0u;
      if (q1 < r1) {
        const nbr::Range w1 = win(geo.axis[1], len1, q1);
        rowbits[r] = box_bits(w1.begin - u1.begin, w1.end - u1.begin);
      }
    }
    // The bias rows' entries of union position (0, t2) (box_bias).
    uint32_t bias_at[2] = {0u, 0u};
    if constexpr (kBias) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = (lane >> 2) + 8 * r;
        const int d1 = u1.begin - (qb1 + i / kBW) + geo.axis[1].kernel - 1;
        const int d2 = u2.begin - (qb2 + i % kBW) + geo.axis[2].kernel - 1;
        bias_at[r] = sB + 4u * uint32_t(d1 * stage_stride(1) + d2 + t2);
      }
    }
    // The union's first row in the ring (ring_rows >= 16 > 3 chunk rows, and a union spans at
    // most 32 rows, so two conditional subtractions keep a chunk row inside the ring).
    const int ring_base = u_off % sp.ring_rows;
    const int un = u1.size();
    const int n_chunks = (un + kBoxChunkRows - 1) / kBoxChunkRows;

    FwdState<Tr> st;
    init_state(st);
    for (int ch = 0; ch < n_chunks; ++ch) {
      wait_filled((u_off + min(kBoxChunkRows * ch + kBoxChunkRows, un) - 1) / kStripBandRows);
      int row[kBoxChunkRows];
      chunk_rows(row, ring_base, ch, un, sp.ring_rows, sp.pitch);
      float sc[1][8][4];
      box_scores<Tr>(sc, qf, row, sK, kcol, ksel, ch, rowbits, pat, plane_bytes);
      if constexpr (kBias) box_bias(sc, bias_at, ch);
      if (!kPrefetchQ && more && ch == n_chunks - 1) load_q(qb1 + kStep, qf);
      box_update<Tr>(st, sc, row, sV, vcol, vsel, p.scale_log2, plane_bytes);
    }
    FwdTile fo = ft;
    fo.b = opaque(ft.b);
    fo.h = opaque(ft.h);
    const int qc = opaque(qb2);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = row_sum(st, 0, r);
      const int i = (lane >> 2) + 8 * r;
      const int q[kAxes] = {0, qb1 + i / kBW, qc + i % kBW};
      if (q[1] < r1) store_row<Tr, T, false>(st, p, fo, 0, r, l, q, lane);
    }
  }
  release_below(n_release);
}


template <class T, int kD, int kPhases, int kBH, int kBW>
cudaError_t launch_fwd_strip(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream) {
  using Tr = StripTraits<T, kD, kPhases, kBH, kBW>;
  const bool bias = p.rpb != nullptr;
  auto kernel = l.strip_tma.on
                    ? (bias ? fna_fwd_strip_kernel<T, kD, kPhases, kBH, kBW, true, true>
                            : fna_fwd_strip_kernel<T, kD, kPhases, kBH, kBW, true, false>)
                    : (bias ? fna_fwd_strip_kernel<T, kD, kPhases, kBH, kBW, false, true>
                            : fna_fwd_strip_kernel<T, kD, kPhases, kBH, kBW, false, false>);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(l.smem));
  if (err != cudaSuccess) return err;
  kernel<<<l.grid, Tr::kThreads, l.smem, stream>>>(p, l.strip, l.strip_tma, StripBwd{});
  return cudaGetLastError();
}

// The backward's strip kernels (kRole: StripRole::dq or dkdv): `p` the box tensor, the ring
// tensors and the first output (dQ: Q, K / V, dQ; dK / dV: K, Q / dO, dK), `l` the strip plan's
// launch (no bias; inverse windows for dK / dV), `bw` the second box tensor and output and the
// statistics.
template <class T, int kRole, int kD, int kPhases, int kBH, int kBW>
cudaError_t launch_bwd_strip(const FwdParams& p, const FwdLaunch& l, const StripBwd& bw,
                             cudaStream_t stream) {
  using Tr = StripTraits<T, kD, kPhases, kBH, kBW, strip_split<kRole, kD>()>;
  auto kernel = l.strip_tma.on ? fna_fwd_strip_kernel<T, kD, kPhases, kBH, kBW, true, false, kRole>
                               : fna_fwd_strip_kernel<T, kD, kPhases, kBH, kBW, false, false, kRole>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(l.smem));
  if (err != cudaSuccess) return err;
  kernel<<<l.grid, Tr::kThreads, l.smem, stream>>>(p, l.strip, l.strip_tma, bw);
  return cudaGetLastError();
}

template <class T, int kD, int kPhases, int kBH, int kBW>
size_t fwd_strip_smem_bytes() {
  // A lower bound: a ring of 16 rows of a 16-column halo.
  return size_t(16) * kStripCols * 2 * strip_planes(kD) * kStripRowBytes;
}

// Instantiates one row of configs/forward.h's strip table (the build's generated files expand it).
#define FNA_FWD_STRIP_INSTANTIATE(D, PH, BH, BW, DT)                                            \
  template cudaError_t launch_fwd_strip<mma::DT, D, PH, BH, BW>(                               \
      const FwdParams&, const FwdLaunch&, cudaStream_t);                                       \
  template size_t fwd_strip_smem_bytes<mma::DT, D, PH, BH, BW>();
#define FNA_BWD_STRIP_INSTANTIATE(ROLE, D, PH, BH, BW, DT)                                      \
  template cudaError_t launch_bwd_strip<mma::DT, ROLE, D, PH, BH, BW>(                         \
      const FwdParams&, const FwdLaunch&, const StripBwd&, cudaStream_t);

}  // namespace fused
}  // namespace fna
