// The box forward: rank-2 neighborhood attention with small windows on mma.sync (sm_80+), where
// the tiled kernels (fwd_sm80.cuh, fwd_sm90.cuh) spend most of their work on masked pairs.
//
// A 64-query tile's keys are the union of 64 windows: for 13x13 windows a 16x4 tile visits
// 28x16 = 448 keys per query, of which 169 are neighbors. Here the CTA still owns a query tile
// (QT, e.g. 8x8) and copies the union of its windows, the halo, into shared memory once; but
// each warp owns a 4x4 box of queries (one m16 tile) and multiplies it only against the union
// of the box's own windows (16x16 = 256 keys for 13x13 windows, 0.57x the pairs). The warps'
// key sets differ, so K and V fragments are gathered by ldmatrix with a per-lane row address:
// the 8 keys of an n8 block are 8 consecutive positions of one halo row, which lie in 8
// consecutive (swizzled) shared-memory rows. A box's keys are walked as 64-key chunks of 4 union
// rows x 16 columns; each chunk is S = Q K^T (registers), the mask from two bit sets per query
// row (rows of the union x columns), the online softmax of fwd_common.cuh and O += P V.
// Q goes from global memory straight into the A fragments. The halo arrives in bands of 4 halo
// rows, one mbarrier each; past the barrier that publishes the mbarriers' init the warps run
// independently, each waiting only for the bands its chunks read.
//
// Shared memory: the halo's K and V, each row 128 bytes (head dim 64, zero-filled past D / D_v)
// with its 16-byte chunks XOR-swizzled by the row's low three bits, so that ldmatrix's eight rows
// hit eight distinct bank groups.
// Host-side limits and statistics: fwd_box.h. 16-bit only, no additional keys.
#pragma once

#include "cuda/fused/kernel/common/box_parts.cuh"

namespace fna {
namespace fused {

template <class T, int kD, class QT, bool kBias>
__global__ void __launch_bounds__(BoxTraits<T, kD, QT>::kThreads, BoxTraits<T, kD, QT>::kMinBlocks)
    fna_fwd_box_kernel(const FwdParams p, int halo_cap) {
  using Tr = BoxTraits<T, kD, QT>;
  using Elem = typename Tr::Elem;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sK = mma::smem_u32(smem_raw);
  const BoxSmem layout{uint32_t(Tr::kRowBytes), uint32_t(halo_cap)};
  const uint32_t sV = sK + layout.v_offset();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  FwdTile ft;
  if (!fwd_tile<QT>(p, blockIdx.x, ft)) return;
  const Geometry& geo = p.geo;
  const Group& gr = ft.gr;
  const int hkv = ft.h / p.heads_per_kv;
  const int len1 = gr.len[1], len2 = gr.len[2];

  // The CTA's halo: the union of its queries' windows on each axis.
  const nbr::Range h1 = nbr::tile_union(geo.axis[1], len1, ft.qo[1],
                                        min(ft.qo[1] + QT::kExt[1], len1));
  const nbr::Range h2 = nbr::tile_union(geo.axis[2], len2, ft.qo[2],
                                        min(ft.qo[2] + QT::kExt[2], len2));
  const int hn1 = h1.size(), hn2 = h2.size();

  // Copies: 8 threads per row, one 16-byte chunk each.
  const int sub = threadIdx.x % Tr::kChunks;
  const int r0 = threadIdx.x / Tr::kChunks;
  // The halo's K / V rows, row-major over (axis 1, axis 2), in bands of kBoxChunkRows halo rows:
  // every thread issues its copies band by band and arrives on the band's mbarrier once its
  // copies so far have landed, so a warp starts on its first chunk while later bands still fly.
  // Eight threads copy a row (one 16-byte chunk each); the CTA's kSlots row slots take
  // kSlots / hn2 whole halo rows per pass when a halo row fits them (a slot keeps its column,
  // so the global offsets only step along axis 1), else one halo row in column strides.
  __shared__ __align__(8) uint64_t bars[kBoxMaxBands];
  const int n_bands = (hn1 + kBoxChunkRows - 1) / kBoxChunkRows;
  const uint32_t bar0 = mma::smem_u32(bars);
  if (threadIdx.x < n_bands) mbar::init(bar0 + 8 * threadIdx.x, Tr::kThreads);
  // The bias (kBias): the head's table, divided by the scale, staged after the halo
  // (fwd_bias.cuh stage_bias; FwdParams::rpb_staged).
  BiasRows<Tr> br{};
  if constexpr (kBias)
    stage_bias<Tr>(p, ft.h,
                   reinterpret_cast<float*>(smem_raw + bias_stage_offset(layout.bytes())), br);
  const uint32_t sB = br.sbase;
  __syncthreads();
  {
    constexpr int kSlots = Tr::kRowsPerPass;
    const Elem* gK = static_cast<const Elem*>(p.k) + ft.b * p.k_stride[0] + hkv * p.k_stride[4];
    const Elem* gV = static_cast<const Elem*>(p.v) + ft.b * p.v_stride[0] + hkv * p.v_stride[4];
    const bool kin = sub * 8 < p.dim, vin = sub * 8 < p.dim_v;
    const bool fits = hn2 <= kSlots;
    const int rpp = fits ? kSlots / hn2 : 1;            // halo rows per pass
    const int x0 = fits ? r0 % hn2 : r0;                // this slot's first column
    const int y0 = fits ? r0 / hn2 : 0;                 // this slot's first row
    const int xstep = fits ? hn2 : kSlots;
    const int dil1 = geo.axis[1].dilation, dil2 = geo.axis[2].dilation;
    const int64_t k1 = p.k_stride[2] * dil1, v1 = p.v_stride[2] * dil1;
    int band = 0;
    if (y0 < rpp) {
      // Global row offsets of halo row y (axis 1), stepped by rpp rows per pass.
      const int gy0 = (h1.begin + y0) * dil1 + gr.g[1];
      int64_t ok1 = int64_t(gy0) * p.k_stride[2], ov1 = int64_t(gy0) * p.v_stride[2];
      for (int y = y0; y < hn1; y += rpp, ok1 += rpp * k1, ov1 += rpp * v1) {
        while (y >= (band + 1) * kBoxChunkRows) mbar::arrive_cp_async(bar0 + 8 * band++);
        for (int x = x0; x < hn2; x += xstep) {
          const int gx = (h2.begin + x) * dil2 + gr.g[2];
          const uint32_t off = box_sw(y * hn2 + x, sub);
          mma::cp_async_16(sK + off, kin ? gK + ok1 + int64_t(gx) * p.k_stride[3] + sub * 8 : p.k,
                           kin);
          mma::cp_async_16(sV + off, vin ? gV + ov1 + int64_t(gx) * p.v_stride[3] + sub * 8 : p.v,
                           vin);
        }
      }
    }
    while (band < n_bands) mbar::arrive_cp_async(bar0 + 8 * band++);
  }

  // This warp's box, the union of its windows, and the thread's two query rows' windows as bit
  // sets over that union (rows: one bit per union row; columns: the four columns t2, t2 + 1,
  // t2 + 8, t2 + 9 this thread holds in each 16-column row of a chunk).
  const int qb1 = ft.qo[1] + (warp / Tr::kBoxes2) * kBoxExt;
  const int qb2 = ft.qo[2] + (warp % Tr::kBoxes2) * kBoxExt;
  const bool active = qb1 < len1 && qb2 < len2;
  nbr::Range u1{0, 0}, u2{0, 0};
  if (active) {
    u1 = nbr::tile_union(geo.axis[1], len1, qb1, min(qb1 + kBoxExt, len1));
    u2 = nbr::tile_union(geo.axis[2], len2, qb2, min(qb2 + kBoxExt, len2));
  }
  const int t2 = 2 * (lane & 3);
  unsigned rowbits[2], pat[2];
  uint32_t bias_at[2];  // kBias: the rows' entries of union position (0, t2) (box_bias)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = (lane >> 2) + 8 * r;
    const int q1 = qb1 + (i >> 2), q2 = qb2 + (i & 3);
    bias_at[r] = sB + 4u * uint32_t((u1.begin - q1 + geo.axis[1].kernel - 1) * stage_stride(1) +
                                    u2.begin - q2 + geo.axis[2].kernel - 1 + t2);
    rowbits[r] = 0;
    pat[r] = 0;
    if (active && q1 < len1 && q2 < len2) {
      const nbr::Range w1 = nbr::window(geo.axis[1], len1, q1);
      const nbr::Range w2 = nbr::window(geo.axis[2], len2, q2);
      rowbits[r] = box_bits(w1.begin - u1.begin, w1.end - u1.begin);
      const unsigned cb = box_bits(w2.begin - u2.begin, w2.end - u2.begin) >> t2;
      pat[r] = (cb & 3u) | ((cb >> 6) & 0xcu);
    }
  }
  const int r_off = u1.begin - h1.begin, c_off = u2.begin - h2.begin;
  const int n_chunks = (u1.size() + kBoxChunkRows - 1) / kBoxChunkRows;
  // The halo column of the key this lane addresses in K's (non-transposed) and V's (transposed)
  // ldmatrix, clamped into the halo (columns past the union are masked).
  const int kcol = min(c_off + (lane & 7) + ((lane >> 4) << 3), hn2 - 1);
  const int vcol = min(c_off + (lane & 7) + (((lane >> 3) & 1) << 3), hn2 - 1);
  const int ksel = (lane >> 3) & 1, vsel = lane >> 4;

  // Q straight into the A fragments (rows g and g + 8 of the box, columns 2t, 2t + 1 and
  // 2t + 8, 2t + 9 of each 16-column step), zeros past the axes' ends and past D; the loads fly
  // with the halo's copies.
  uint32_t qf[kD / 16][4];
  {
    const Elem* gQ = static_cast<const Elem*>(p.q) + ft.b * p.q_stride[0] + ft.h * p.q_stride[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = (lane >> 2) + 8 * r;
      int c[kAxes] = {0, qb1 + (i >> 2), qb2 + (i & 3)};
      const bool ok = active && c[1] < len1 && c[2] < len2;
      const Elem* row = gQ + (ok ? token_offset<1>(geo, gr, c, p.q_stride) : 0);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int col = kk * 16 + hh * 8 + t2;
          qf[kk][r + 2 * hh] =
              ok && col < p.dim ? __ldg(reinterpret_cast<const unsigned int*>(row + col)) : 0u;
        }
    }
  }

  if (!active) return;

  FwdState<Tr> st;
  init_state(st);
  for (int ch = 0; ch < n_chunks; ++ch) {
    // The chunk's last halo row has landed (a band's phase completes only after every earlier
    // band's copies too: each thread's arrive waits for all its copies so far).
    const int last = min(r_off + kBoxChunkRows * ch + kBoxChunkRows - 1, hn1 - 1);
    mbar::wait(bar0 + 8 * (last / kBoxChunkRows), 0);
    int row[kBoxChunkRows];
#pragma unroll
    for (int a = 0; a < kBoxChunkRows; ++a)
      row[a] = min(r_off + kBoxChunkRows * ch + a, hn1 - 1) * hn2;
    float sc[1][8][4];
    box_scores<Tr>(sc, qf, row, sK, kcol, ksel, ch, rowbits, pat);
    if constexpr (kBias) box_bias(sc, bias_at, ch);
    box_update<Tr>(st, sc, row, sV, vcol, vsel, p.scale_log2);
  }

  // Epilogue: the thread's two rows of the box.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = row_sum(st, 0, r);
    const int i = (lane >> 2) + 8 * r;
    const int q[kAxes] = {0, qb1 + (i >> 2), qb2 + (i & 3)};
    store_row<Tr, T, false>(st, p, ft, 0, r, l, q, lane);
  }
}

template <class T, int kD, class QT>
cudaError_t launch_fwd_box(const FwdParams& p, const FwdLaunch& l, cudaStream_t stream) {
  using Tr = BoxTraits<T, kD, QT>;
  auto kernel = p.rpb != nullptr ? fna_fwd_box_kernel<T, kD, QT, true>
                                 : fna_fwd_box_kernel<T, kD, QT, false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(l.smem));
  if (err != cudaSuccess) return err;
  kernel<<<l.grid, Tr::kThreads, l.smem, stream>>>(p, l.halo_cap);
  return cudaGetLastError();
}

template <class T, int kD, class QT>
size_t fwd_box_smem_bytes() {
  return size_t(QT::kSize) * kD * 2;  // a lower bound: the halo of QT's own queries
}

// Instantiates one row of configs/forward.h's box table (the build's generated files expand it).
#define FNA_FWD_BOX_INSTANTIATE(D, Q1, Q2, DT)                                                   \
  template cudaError_t launch_fwd_box<mma::DT, D, Tile<1, Q1, Q2>>(const FwdParams&,           \
                                                                   const FwdLaunch&,           \
                                                                   cudaStream_t);              \
  template size_t fwd_box_smem_bytes<mma::DT, D, Tile<1, Q1, Q2>>();

}  // namespace fused
}  // namespace fna
