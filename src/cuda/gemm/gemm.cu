// cuda-gemm launchers: the tile choice, shared-memory sizes, vector-load eligibility and the
// kernel instantiations of kernels.cuh.
#include <algorithm>
#include <string>

#include "cuda/common/runtime.cuh"
#include "cuda/gemm/kernels.cuh"
#include "cuda/gemm/launch.cuh"

namespace fna {
namespace gemm {

namespace {

using naive::AddView;
using naive::Geometry;
using naive::View;

constexpr int kMaxDim = 256;
constexpr int64_t kMaxGrid = 2147483647;

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Local tokens of the longest dilation group of an axis.
int group_max(const nbr::Axis& a) { return ceil_div(a.length, a.dilation); }

// A bound on the tokens one tile's halo spans along an axis: t + K - 1 keys around t queries (or
// queries around t keys), widened by the stride's shared windows, never more than the group.
int64_t span_bound(const nbr::Axis& a, int t) {
  return std::min<int64_t>(int64_t(t) + a.kernel + a.stride - 2, group_max(a));
}

// The tile extents that minimise tiles x chunks (the MMA work, 64 x 64 per chunk of a tile) over
// power-of-two extents with at most kRows tokens. `per_col`: halo columns per halo token (G for
// IN, whose columns are (query, head) pairs); `extra`: columns besides the halo (additional keys).
Tile choose_tile(const Geometry& g, int per_col, int extra) {
  Tile best{{1, 1, 1}, {1, 1, 1}};
  double best_cost = -1;
  int best_size = 0;
  for (int t0 = 1; t0 <= kRows; t0 *= 2)
    for (int t1 = 1; t0 * t1 <= kRows; t1 *= 2)
      for (int t2 = 1; t0 * t1 * t2 <= kRows; t2 *= 2) {
        const int t[3] = {t0, t1, t2};
        bool useful = true;  // no extent past the next power of two of its axis
        double tiles = 1, halo = 1;
        for (int a = 0; a < 3; ++a) {
          const int lg = group_max(g.axis[a]);
          useful = useful && (t[a] == 1 || t[a] / 2 < lg);
          tiles *= ceil_div(lg, t[a]);
          halo *= double(span_bound(g.axis[a], t[a]));
        }
        if (!useful) continue;
        const double cost = tiles * std::ceil((halo * per_col + extra) / kChunk);
        const int size = t0 * t1 * t2;
        if (best_cost < 0 || cost < best_cost || (cost == best_cost && size > best_size)) {
          best_cost = cost;
          best_size = size;
          for (int a = 0; a < 3; ++a) best.t[a] = t[a];
        }
      }
  for (int a = 0; a < 3; ++a) best.per_axis[a] = ceil_div(group_max(g.axis[a]), best.t[a]);
  return best;
}

// May rows of `v` (`width` elements each) be copied with 16-byte loads?
bool rows_vec(const void* base, const View& v, int width, int elem) {
  const int64_t k = 16 / elem;
  bool ok = v.sx == 1 && width % k == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
  const int64_t s[] = {v.sb, v.sl[0], v.sl[1], v.sl[2], v.shkv, v.sg};
  for (int64_t x : s) ok = ok && x % k == 0;
  return ok;
}

int slice_tiles(int width) { return width <= 32 ? 4 : width <= 64 ? 8 : 16; }

// Runs `launch(p0, pairs)` over [p0, p0 + pairs) in pieces whose grids fit gridDim.x.
template <typename F>
Status for_pieces(int64_t p0, int64_t pairs, int64_t blocks_per_pair, F&& launch) {
  const int64_t per = std::max<int64_t>(1, kMaxGrid / blocks_per_pair);
  for (int64_t q = p0; q < p0 + pairs; q += per) {
    Status st = launch(q, std::min(per, p0 + pairs - q));
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

int64_t blocks_per_pair(const Geometry& g, const Tile& t, int heads_per) {
  int64_t n = heads_per;
  for (int a = 0; a < 3; ++a) n *= int64_t(g.axis[a].dilation) * t.per_axis[a];
  return n;
}

// Row padding of operands stored [row][k] (Elem::kPad): 16 bytes.
int pad_of(int elem) { return 16 / elem; }

// Dynamic shared memory of each kernel (kernels.cuh): operands, then index arrays.
constexpr size_t kIndexBytes = 2 * 64 * 8 + 9 * 64 * 4;  // nn: 2 offsets, 9 ints per row
// The most shared memory the full-tile kernels may take: PN keeps three CTAs per SM (it holds
// two operand blocks besides the tile's), NN two.
constexpr size_t kPnFullBytes = 64 * 1024, kNnFullBytes = 100 * 1024;

size_t nn_smem(int nt, int elem) {
  return size_t(kRows + nt * 8) * (kChunk + pad_of(elem)) * elem + kIndexBytes;
}
// Column windows (2 x 2 x 64 int4), A / attn rows (2 x 2 x 64 int64), weights, two A buffers.
size_t in_smem(int nt, int elem) {
  return 6144 + size_t(kChunk) * (kRows + kPadKN + 2 * (nt * 8 + kPadKN)) * elem;
}
// A, two key buffers, the [64 x halo] block (full_ld 0: none); offsets (A rows, 2 x key rows, out
// rows), 6 + 2 + 6 + 3 ints per row.
size_t pn_smem_of(int width_pad, int elem, int full_ld, int out_elem) {
  return size_t(kRows + 2 * kChunk) * (width_pad + pad_of(elem)) * elem +
         size_t(kRows) * full_ld * out_elem + 6400;
}
// The block, `stages` B buffers; offsets (2 x key rows, attn rows), 6 + 2 ints per row.
size_t nn_full_smem(int nt, int elem, int full_ld, int stages) {
  return size_t(kRows) * full_ld * elem + size_t(stages * kChunk) * (nt * 8 + kPadKN) * elem +
         3584;
}
// CTAs of `smem` bytes one SM holds (Hopper and A100: 228 / 164 KB, 1 KB reserved per CTA).
int ctas_per_sm(size_t smem, size_t optin) {
  const size_t sm = optin + 1024;
  return static_cast<int>(sm / (smem + 1024));
}

// Leading dimension of a full-tile kernel's [64 x halo] block: the largest halo of any tile (the
// span bound), with the additional keys, in whole chunks, plus 16 bytes.
int full_ld_of(const Geometry& g, const Tile& t, int elem) {
  int64_t halo = 1;
  for (int a = 0; a < 3; ++a) halo *= span_bound(g.axis[a], t.t[a]);
  const int64_t cols = (halo + g.num_add + kChunk - 1) / kChunk * kChunk;
  return static_cast<int>(std::min<int64_t>(cols, 1 << 28)) + pad_of(elem);
}

// The most dynamic shared memory one block may take on the current device.
Status smem_optin(size_t* out) {
  int device = 0;
  detail::DeviceProps props;
  FNA_CUDA_TRY(cudaGetDevice(&device));
  Status st = detail::device_props(device, &props);
  *out = size_t(props.smem_optin);
  return st;
}

template <typename K>
Status opt_in(K kernel, size_t smem) {
  if (smem > 48 * 1024)
    FNA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  return Status::Ok();
}

}  // namespace

Status check(const Problem& p, int device_index) {
  detail::DeviceProps props;
  Status st = detail::device_props(device_index, &props);
  if (!st.ok()) return st;
  if (props.cc_major < 8)
    return {Code::unsupported, "backend=cuda-gemm needs a GPU of compute capability 8.0 or newer "
                               "(mma.sync); this one is " + std::to_string(props.cc_major) + "." +
                               std::to_string(props.cc_minor) + ": use backend=cuda-naive"};
  if (p.dim > kMaxDim || p.dim_v > kMaxDim)
    return {Code::unsupported, "dim=" + std::to_string(p.dim) + ", dim_v=" +
                                   std::to_string(p.dim_v) + ": backend=cuda-gemm takes head dims "
                                   "up to 256; use backend=cuda-naive"};
  // The largest halo any tile may have (PN / NN: keys; IN: queries x heads) must fit an int.
  const Geometry g = naive::make_geometry(p);
  double halo = 1;
  for (int a = 0; a < 3; ++a) halo *= double(span_bound(g.axis[a], kRows));
  if (halo * g.group + g.num_add > double(1 << 30))
    return {Code::unsupported, "window=" + std::to_string(p.window()) +
                                   ": a tile's halo exceeds backend=cuda-gemm's 2^30 tokens; "
                                   "use backend=cuda-naive"};
  const int elem = p.dtype == DType::f32 ? 4 : 2;
  const int k = p.dtype == DType::f32 ? 8 : 16;
  const int wmax = static_cast<int>(std::max(p.dim, p.dim_v));
  const size_t need = std::max(
      {pn_smem_of(ceil_div(wmax, k) * k, elem, 0, elem), nn_smem(16, elem), in_smem(16, elem)});
  if (need > size_t(props.smem_optin))
    return {Code::unsupported, "dim=" + std::to_string(wmax) + " " + dtype_name(p.dtype) +
                                   ": backend=cuda-gemm needs " + std::to_string(need) +
                                   " bytes of shared memory, this GPU gives " +
                                   std::to_string(props.smem_optin) + "; use backend=cuda-naive"};
  return Status::Ok();
}

template <typename TIn, typename TOut>
Status pn(const Geometry& g, int64_t p0, int64_t pairs, const void* a, const View& va,
          const void* b, const View& vb, const void* add_b, const AddView& vab, int width,
          void* out, const View& vo, float scale, float masked, cudaStream_t stream,
          const naive::Bias& bias) {
  Launch L{};
  L.tile = choose_tile(g, 1, g.num_add);
  L.heads_per = g.group;
  L.width = width;
  L.width_pad = ceil_div(width, Elem<TIn>::kK) * Elem<TIn>::kK;
  L.scale = scale;
  L.masked = masked;
  L.k1 = fused::FastDiv(g.axis[1].kernel);
  L.k2 = fused::FastDiv(g.axis[2].kernel);
  for (int ax = 0; ax < 3; ++ax) L.causal = L.causal || g.axis[ax].causal;
  const int vec = (rows_vec(a, va, width, sizeof(TIn)) ? 1 : 0) |
                  (rows_vec(b, vb, width, sizeof(TIn)) ? 2 : 0);
  size_t optin = 0;
  if (Status st = smem_optin(&optin); !st.ok()) return st;
  L.full_ld = full_ld_of(g, L.tile, sizeof(TOut));
  const size_t with_block = pn_smem_of(L.width_pad, sizeof(TIn), L.full_ld, sizeof(TOut));
  if (with_block > std::min(kPnFullBytes, optin)) L.full_ld = 0;  // direct stores
  const size_t smem = pn_smem_of(L.width_pad, sizeof(TIn), L.full_ld, sizeof(TOut));
  const bool biased = bias.t != nullptr;
  auto kernel = L.full_ld > 0 ? (biased ? pn_kernel<TIn, TOut, true, true>
                                        : pn_kernel<TIn, TOut, true, false>)
                              : (biased ? pn_kernel<TIn, TOut, false, true>
                                        : pn_kernel<TIn, TOut, false, false>);
  if (Status st = opt_in(kernel, smem); !st.ok()) return st;
  return for_pieces(p0, pairs, blocks_per_pair(g, L.tile, L.heads_per), [&](int64_t q, int64_t n) {
    L.p0 = q;
    L.pairs = n;
    const unsigned blocks = static_cast<unsigned>(n * blocks_per_pair(g, L.tile, L.heads_per));
    kernel<<<blocks, kThreads, smem, stream>>>(
        g, L, static_cast<const TIn*>(a), va, static_cast<const TIn*>(b), vb,
        static_cast<const TIn*>(add_b), vab, static_cast<TOut*>(out), vo, vec, bias);
    FNA_CUDA_CHECK_LAUNCH("cuda-gemm PN kernel");
    return Status::Ok();
  });
}

// NN and IN: a kernel of NT column tiles per slice, slices over grid.y.
template <typename TAttn, typename T, int NT, bool kInverse>
Status slice_op(const Geometry& g, int64_t p0, int64_t pairs, const void* attn, const View& vattn,
                const void* b, const View& vb, const void* add_b, const AddView& vab, int width,
                void* out, const View& vo, float scale, cudaStream_t stream) {
  Launch L{};
  L.tile = kInverse ? choose_tile(g, g.group, 0) : choose_tile(g, 1, g.num_add);
  L.heads_per = kInverse ? 1 : g.group;
  L.width = width;
  L.scale = scale;
  L.k1 = fused::FastDiv(g.axis[1].kernel);
  L.k2 = fused::FastDiv(g.axis[2].kernel);
  const int vec = rows_vec(b, vb, width, sizeof(T)) ? 1 : 0;
  const unsigned slices = static_cast<unsigned>(ceil_div(width, NT * 8));
  const int64_t per_pair = blocks_per_pair(g, L.tile, L.heads_per);
  auto run = [&](auto kernel, size_t smem, auto&& launch) -> Status {
    if (Status st = opt_in(kernel, smem); !st.ok()) return st;
    return for_pieces(p0, pairs, per_pair, [&](int64_t q, int64_t n) {
      L.p0 = q;
      L.pairs = n;
      const dim3 grid(static_cast<unsigned>(n * per_pair), slices);
      launch(kernel, grid, smem);
      FNA_CUDA_CHECK_LAUNCH("cuda-gemm NN / IN kernel");
      return Status::Ok();
    });
  };
  if constexpr (kInverse) {
    return run(in_kernel<TAttn, T, NT>, in_smem(NT, sizeof(T)), [&](auto k, dim3 grid, size_t sm) {
      k<<<grid, kThreads, sm, stream>>>(g, L, static_cast<const TAttn*>(attn), vattn,
                                        static_cast<const T*>(b), vb, static_cast<T*>(out), vo,
                                        vec);
    });
  } else {
    size_t optin = 0;
    if (Status st = smem_optin(&optin); !st.ok()) return st;
    L.full_ld = full_ld_of(g, L.tile, sizeof(T));
    // Two chunk buffers unless the second costs a CTA per SM below three.
    const size_t one = nn_full_smem(NT, sizeof(T), L.full_ld, 1);
    const size_t two = nn_full_smem(NT, sizeof(T), L.full_ld, 2);
    L.stages = ctas_per_sm(two, optin) >= std::min(3, ctas_per_sm(one, optin)) ? 2 : 1;
    const size_t full = L.stages == 2 ? two : one;
    const bool use_full = full <= std::min(kNnFullBytes, optin);
    auto kernel = use_full ? nn_full_kernel<TAttn, T, NT> : nn_kernel<TAttn, T, NT>;
    return run(kernel, use_full ? full : nn_smem(NT, sizeof(T)), [&](auto k, dim3 grid, size_t sm) {
      k<<<grid, kThreads, sm, stream>>>(g, L, static_cast<const TAttn*>(attn), vattn,
                                        static_cast<const T*>(b), vb, static_cast<const T*>(add_b),
                                        vab, static_cast<T*>(out), vo, vec);
    });
  }
}

template <typename TAttn, typename T, bool kInverse>
Status sliced(const Geometry& g, int64_t p0, int64_t pairs, const void* attn, const View& vattn,
              const void* b, const View& vb, const void* add_b, const AddView& vab, int width,
              void* out, const View& vo, float scale, cudaStream_t stream) {
  switch (slice_tiles(width)) {
    case 4:
      return slice_op<TAttn, T, 4, kInverse>(g, p0, pairs, attn, vattn, b, vb, add_b, vab, width,
                                             out, vo, scale, stream);
    case 8:
      return slice_op<TAttn, T, 8, kInverse>(g, p0, pairs, attn, vattn, b, vb, add_b, vab, width,
                                             out, vo, scale, stream);
    default:
      return slice_op<TAttn, T, 16, kInverse>(g, p0, pairs, attn, vattn, b, vb, add_b, vab, width,
                                              out, vo, scale, stream);
  }
}

template <typename TAttn, typename T>
Status nn(const Geometry& g, int64_t p0, int64_t pairs, const void* attn, const View& vattn,
          const void* b, const View& vb, const void* add_b, const AddView& vab, int width,
          void* out, const View& vo, float scale, cudaStream_t stream) {
  return sliced<TAttn, T, false>(g, p0, pairs, attn, vattn, b, vb, add_b, vab, width, out, vo,
                                 scale, stream);
}

template <typename TAttn, typename T>
Status inverse(const Geometry& g, int64_t p0, int64_t pairs, const void* attn, const View& vattn,
               const void* a, const View& va, int width, void* out, const View& vo, float scale,
               cudaStream_t stream) {
  return sliced<TAttn, T, true>(g, p0, pairs, attn, vattn, a, va, nullptr, AddView{}, width, out,
                                vo, scale, stream);
}

#define FNA_GEMM_INSTANTIATE(T)                                                                 \
  template Status pn<T, T>(const Geometry&, int64_t, int64_t, const void*, const View&,         \
                           const void*, const View&, const void*, const AddView&, int, void*,   \
                           const View&, float, float, cudaStream_t, const naive::Bias&);         \
  template Status pn<T, float>(const Geometry&, int64_t, int64_t, const void*, const View&,     \
                               const void*, const View&, const void*, const AddView&, int,      \
                               void*, const View&, float, float, cudaStream_t,                  \
                               const naive::Bias&);                                             \
  template Status nn<T, T>(const Geometry&, int64_t, int64_t, const void*, const View&,         \
                           const void*, const View&, const void*, const AddView&, int, void*,   \
                           const View&, float, cudaStream_t);                                   \
  template Status nn<float, T>(const Geometry&, int64_t, int64_t, const void*, const View&,     \
                               const void*, const View&, const void*, const AddView&, int,      \
                               void*, const View&, float, cudaStream_t);                        \
  template Status inverse<T, T>(const Geometry&, int64_t, int64_t, const void*, const View&,    \
                                const void*, const View&, int, void*, const View&, float,       \
                                cudaStream_t);                                                  \
  template Status inverse<float, T>(const Geometry&, int64_t, int64_t, const void*,             \
                                    const View&, const void*, const View&, int, void*,          \
                                    const View&, float, cudaStream_t);

FNA_GEMM_INSTANTIATE(__half)
FNA_GEMM_INSTANTIATE(__nv_bfloat16)
#undef FNA_GEMM_INSTANTIATE

// float32: T and the f32 workspace coincide.
template Status pn<float, float>(const Geometry&, int64_t, int64_t, const void*, const View&,
                                 const void*, const View&, const void*, const AddView&, int,
                                 void*, const View&, float, float, cudaStream_t,
                                 const naive::Bias&);
template Status nn<float, float>(const Geometry&, int64_t, int64_t, const void*, const View&,
                                 const void*, const View&, const void*, const AddView&, int,
                                 void*, const View&, float, cudaStream_t);
template Status inverse<float, float>(const Geometry&, int64_t, int64_t, const void*, const View&,
                                      const void*, const View&, int, void*, const View&, float,
                                      cudaStream_t);

}  // namespace gemm
}  // namespace fna
