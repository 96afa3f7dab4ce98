// Fused backward (backend cuda-fused): checks what the tensor-core path covers, computes the
// per-query statistics {LSE * log2(e), rowsum(dO * O)}, picks tile shapes, and launches the dK/dV
// kernel (bwd_dkdv.cuh; it also accumulates dQ with atomics unless Options::deterministic) and,
// in deterministic mode, the dQ kernel (bwd_dq.cuh). float32 runs on the TF32 tensor cores: split
// TF32 (float32 accuracy) by default, plain TF32 under Options::allow_tf32. Anything outside the
// fast path (head dims > 256, a non-contiguous head dim, pre-sm_80, too little shared memory)
// answers `unsupported`, so that `auto` falls back to the naive backend (unless
// Options::backward_config names a configuration). Head dims are zero-padded to 64, 128 or 256
// (max(D, D_v)); above 128 the dK/dV kernel runs as two passes (bwd_launch.cuh). Rows that are
// not 16-byte aligned (or dims not multiples of 16 bytes) take element-wise loads and stores.
// Tile shapes: Options::backward_config (the table below) or the heuristic (pick_tiles).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "core/backends.h"
#include "core/neighborhood.h"
#include "cuda/common/runtime.cuh"
#include "cuda/fused/bwd_launch.cuh"

namespace fna {
namespace bwd {

FNA_BWD_DECLARE(__half, 64)
FNA_BWD_DECLARE(__half, 128)
FNA_BWD_DECLARE(__nv_bfloat16, 64)
FNA_BWD_DECLARE(__nv_bfloat16, 128)
FNA_BWD_DECLARE(__half, 256)
FNA_BWD_DECLARE(__nv_bfloat16, 256)
FNA_BWD_DECLARE(mma::F32, 64)
FNA_BWD_DECLARE(mma::F32, 128)
FNA_BWD_DECLARE(mma::F32, 256)
FNA_BWD_DECLARE(mma::TF32, 64)
FNA_BWD_DECLARE(mma::TF32, 128)
FNA_BWD_DECLARE(mma::TF32, 256)

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// One backward configuration: tile shapes lifted to kAxes (leading extents 1 below rank 3).
struct BwdConfig {
  int rank;
  DType dtype;
  int dim;       // padded head dim (64, 128, 256)
  int kv[kAxes]; // dK/dV kernel: the key tile it owns
  int q[kAxes];  //   and the query tiles it visits
  int dq_q[kAxes];   // dQ kernel (deterministic mode): the query tile it owns
  int dq_kv[kAxes];  //   and the key tiles it visits
  std::string name() const;
};

// stats = {LSE * log2(e), sum_d dO * O} per (batch, token, head) row, 2^log_tpr threads per row,
// each reading 16 bytes of dO and of O per step. `dense`: O, dO and LSE laid out densely, so a
// row's place takes no division; `vec`: 16-byte loads (dense, aligned, D_v a multiple of 16
// bytes). kTf32 (plain TF32): dO rounded to TF32 as in dP = dO V^T, so that dS = P (dP - sum)
// stays consistent (a query alone in its window gets dS = 0, not the rounding error of dP).
template <typename T, bool kTf32 = false>
__global__ void stats_kernel(const Params p, const T* o, TokStrides so, const float* lse,
                             TokStrides sl, float2* stats, int log_tpr, bool dense, bool vec) {
  constexpr int kPer = 16 / int(sizeof(T));
  const int tpr = 1 << log_tpr;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> log_tpr;
  const int lane = threadIdx.x & 31, sub = lane & (tpr - 1);
  if (row >= int64_t(p.batch) * p.tokens * p.heads) return;  // whole rows: the shuffles' groups
  const T* gdO;
  const T* gO;
  int64_t lse_off;
  if (dense) {
    gdO = static_cast<const T*>(p.d_o) + row * p.dim_v;
    gO = o + row * p.dim_v;
    lse_off = row;
  } else {
    const RowPlace r = row_place(p, row);
    gdO = static_cast<const T*>(p.d_o) + tok_offset(p.sdo, r.b, r.x, r.h);
    gO = o + tok_offset(so, r.b, r.x, r.h);
    lse_off = tok_offset(sl, r.b, r.x, r.h);
  }
  float acc = 0.f;
  for (int c = kPer * sub; c < p.dim_v; c += kPer * tpr) {
    T a[kPer], b[kPer];
    if (vec) {
      *reinterpret_cast<uint4*>(a) = *reinterpret_cast<const uint4*>(gdO + c);
      *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(gO + c);
    } else {
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const bool in = c + e < p.dim_v;
        a[e] = in ? gdO[c + e] : T(0.f);
        b[e] = in ? gO[c + e] : T(0.f);
      }
    }
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      float x = float(a[e]);
      if constexpr (kTf32) x = __uint_as_float(mma::to_tf32(x));
      acc += x * float(b[e]);
    }
  }
  // The row's threads are 2^log_tpr aligned lanes of one warp, all present.
  const unsigned group = (tpr == 32 ? 0xffffffffu : ((1u << tpr) - 1u)) << (lane & ~(tpr - 1));
  for (int m = tpr / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(group, acc, m);
  if (sub == 0) stats[row] = make_float2(lse[lse_off] * kLog2e, acc);
}

// Strides of a [B, L.., H, D] TensorRef lifted to 3 axes. Returns false when the head dim is not
// contiguous (no path reads that); clears *aligned when rows are not 16-byte aligned (cp.async).
// `vec`: elements per 16-byte chunk (8 16-bit, 4 float).
bool lift(const Problem& p, const TensorRef& t, TokStrides* s, bool* aligned, int vec) {
  s->b = t.strides[0];
  const int lead = kAxes - p.rank;  // lifted axes (tiling.cuh): the problem's are the last ones
  for (int a = 0; a < kAxes; ++a) s->x[a] = a >= lead ? t.strides[1 + a - lead] : 0;
  s->h = t.strides[p.rank + 1];
  bool al = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && s->b % vec == 0 && s->h % vec == 0;
  for (int a = 0; a < kAxes; ++a) al = al && s->x[a] % vec == 0;
  *aligned = *aligned && al;
  return t.strides[p.rank + 2] == 1;
}
bool lift_add(const TensorRef& t, AddStrides* s, bool* aligned, int vec) {
  s->b = t.strides[0];
  s->n = t.strides[1];
  s->h = t.strides[2];
  *aligned = *aligned && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && s->b % vec == 0 &&
             s->n % vec == 0 && s->h % vec == 0;
  return t.strides[3] == 1;
}

int next_pow2(int v) {
  int r = 1;
  while (r < v) r *= 2;
  return r;
}

int log2_exact(int v) {
  int e = 0;
  while ((1 << e) < v) ++e;
  return e;
}

// Tile shapes (powers of two, `own_rows` and `other_rows` in all) that minimize the tile pairs
// visited. Ties go to the shape that overhangs the axes least, then to the later axes (contiguous
// in memory; lifted axes lead, so they never win a tie).
void pick_tiles_uncached(const Params& p, int own_rows, int other_rows, bool own_kv, int* own,
                         int* other) {
  const int eo = log2_exact(own_rows), et = log2_exact(other_rows);
  for (int a = 0; a < kAxes; ++a) own[a] = other[a] = 1;  // a valid answer before the search
  own[kAxes - 1] = own_rows;
  other[kAxes - 1] = other_rows;
  double pairs[kAxes][8][8];
  for (int a = 0; a < kAxes; ++a)
    for (int i = 0; i <= eo; ++i)
      for (int j = 0; j <= et; ++j)
        // Extents on an axis of length 1 only waste rows: never chosen, except on the last axis
        // (always one of the problem's), which keeps every shape on it a candidate even when
        // all lengths are 1.
        pairs[a][i][j] = p.geo.axis[a].length == 1 && (i > 0 || j > 0) && a < kAxes - 1
                             ? -1
                             : fused::axis_tile_pairs(p.geo.axis[a], 1 << i, 1 << j, own_kv);
  double best = -1;
  long best_over = 0, best_pref = 0;
  for (int i0 = 0; i0 <= eo; ++i0)
    for (int i1 = 0; i0 + i1 <= eo; ++i1) {
      const int io[kAxes] = {i0, i1, eo - i0 - i1};
      for (int j0 = 0; j0 <= et; ++j0)
        for (int j1 = 0; j0 + j1 <= et; ++j1) {
          const int jo[kAxes] = {j0, j1, et - j0 - j1};
          double cost = 1;
          long over = 0, pref = 0;
          bool skip = false;
          for (int a = 0; a < kAxes; ++a) {
            skip = skip || pairs[a][io[a]][jo[a]] < 0;
            cost *= pairs[a][io[a]][jo[a]];
            const int cap = next_pow2(nbr::group_length(p.geo.axis[a], 0));
            over += std::max(0, (1 << io[a]) - cap) + std::max(0, (1 << jo[a]) - cap);
            pref = pref * 16 + io[a] + jo[a];
          }
          if (skip) continue;
          const bool better = best < 0 || cost < best ||
                              (cost == best && (over < best_over ||
                                                (over == best_over && pref > best_pref)));
          if (better) {
            best = cost, best_over = over, best_pref = pref;
            for (int a = 0; a < kAxes; ++a) own[a] = 1 << io[a], other[a] = 1 << jo[a];
          }
        }
    }
}

// Host time matters next to short kernels: the choice is cached per geometry.
void pick_tiles(const Params& p, int own_rows, int other_rows, bool own_kv, int* own, int* other) {
  std::vector<int> key = {own_rows, other_rows, own_kv ? 1 : 0};
  for (int a = 0; a < kAxes; ++a) {
    const nbr::Axis& x = p.geo.axis[a];
    key.insert(key.end(), {x.length, x.kernel, x.dilation, x.stride, x.causal ? 1 : 0});
  }
  static std::mutex mu;
  static std::map<std::vector<int>, std::vector<int>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      for (int a = 0; a < kAxes; ++a) own[a] = it->second[a], other[a] = it->second[kAxes + a];
      return;
    }
  }
  pick_tiles_uncached(p, own_rows, other_rows, own_kv, own, other);
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() > 4096) cache.clear();
  cache[key] = {own[0], own[1], own[2], other[0], other[1], other[2]};
}

// Tile shapes of one kernel: `q` / `kv` (a configuration's, lifted to kAxes) or, when null, the
// heuristic's.
void set_tiles(Params* p, int q_rows, int kv_rows, bool own_kv, const int* q, const int* kv,
               int64_t* n_tiles) {
  if (q != nullptr)
    for (int a = 0; a < kAxes; ++a) p->tq[a] = q[a], p->tkv[a] = kv[a];
  else if (own_kv)
    pick_tiles(*p, kv_rows, q_rows, true, p->tkv, p->tq);
  else
    pick_tiles(*p, q_rows, kv_rows, false, p->tq, p->tkv);
  *n_tiles = 1;
  for (int a = 0; a < kAxes; ++a) {
    const int t = own_kv ? p->tkv[a] : p->tq[a];
    p->tiles[a] = (nbr::group_length(p->geo.axis[a], 0) + t - 1) / t;
    *n_tiles *= p->tiles[a];
  }
}

// The order in which the CTAs take the owned tiles (tiling.cuh walk_order), with one CTA per SM
// resident (the dK / dV kernels' shared memory).
void set_walk(Params* p, bool own_kv, int resident, int (&order)[kAxes]) {
  fused::walk_order(p->geo, own_kv ? p->tkv : p->tq, resident, "FNA_BWD_WALK", order);
  fused::walk_divisors(p->tiles, order, p->tdiv);
}

// ---- backward configurations (Options::backward_config, fna::fused_backward_configs) ----------
// The kernels' row counts are fixed per (dtype, padded head dim) (BwdShape, bwd_launch.cuh); a
// configuration fixes how those rows spread over the axes, for both kernels: the dK/dV kernel's
// owned key tile and visited query tile, and the deterministic dQ kernel's owned query tile and
// visited key tile. The table is one shape per row count (16, 32, 64 or 128 rows) for each of a
// few styles per rank, applied to all four tiles of a (dtype, head dim):
//   rank 2: square (8x16: haloes closest to square windows), wide (4x32: long windows on the
//           last, contiguous axis), tall (16x8: long windows on the first axis);
//   rank 3: cube (4x4x8), slab (2x8x8: shallow first axis, as video windows often are).
// Name: fna_bwd_sm80_<dtype>_d<padded dim>_kv<dK/dV keys>_q<dK/dV queries>_dqq<dQ queries>_dqkv<dQ
// keys>, shapes over the problem's axes. The default (no backward_config) is not one of these
// but the heuristic's search over every power-of-two shape (pick_tiles), which the table serves
// to override (and an autotuner to explore).
struct BwdStyle {
  int rank;
  int shape[4][kAxes];  // for 16, 32, 64 and 128 rows, lifted to kAxes
};
constexpr BwdStyle kBwdStyles[] = {
    {1, {{1, 1, 16}, {1, 1, 32}, {1, 1, 64}, {1, 1, 128}}},   // line
    {2, {{1, 4, 4}, {1, 4, 8}, {1, 8, 8}, {1, 8, 16}}},       // square
    {2, {{1, 2, 8}, {1, 2, 16}, {1, 4, 16}, {1, 4, 32}}},     // wide
    {2, {{1, 4, 4}, {1, 8, 4}, {1, 8, 8}, {1, 16, 8}}},       // tall
    {3, {{2, 2, 4}, {2, 4, 4}, {4, 4, 4}, {4, 4, 8}}},        // cube
    {3, {{1, 4, 4}, {1, 4, 8}, {2, 4, 8}, {2, 8, 8}}},        // slab
};

int padded_dim(int64_t dmax) { return dmax <= 64 ? 64 : dmax <= 128 ? 128 : 256; }

std::string BwdConfig::name() const {
  auto shape = [&](const int* e) {
    std::string s;
    for (int ax = kAxes - rank; ax < kAxes; ++ax)
      s += (ax > kAxes - rank ? "x" : "") + std::to_string(e[ax]);
    return s;
  };
  const char* dt = dtype == DType::bf16 ? "bf16" : (dtype == DType::f16 ? "f16" : "f32");
  return std::string("fna_bwd_sm80_") + dt + "_d" + std::to_string(dim) + "_kv" + shape(kv) +
         "_q" + shape(q) + "_dqq" + shape(dq_q) + "_dqkv" + shape(dq_kv);
}

// The configurations for (rank, dtype, max(D, D_v)); empty above 256.
std::vector<BwdConfig> bwd_configs(int rank, DType dtype, int64_t dmax) {
  std::vector<BwdConfig> out;
  if (dmax < 1 || dmax > 256) return out;
  const int dpad = padded_dim(dmax);
  const TileRows tr = tile_rows(dpad, dtype == DType::f32);
  auto copy = [](const BwdStyle& s, int rows, int* dst) {
    const int i = rows == 16 ? 0 : rows == 32 ? 1 : rows == 64 ? 2 : 3;
    for (int a = 0; a < kAxes; ++a) dst[a] = s.shape[i][a];
  };
  for (const BwdStyle& s : kBwdStyles) {
    if (s.rank != rank) continue;
    BwdConfig c{rank, dtype, dpad, {}, {}, {}, {}};
    copy(s, tr.dkdv_keys, c.kv);
    copy(s, tr.dkdv_queries, c.q);
    copy(s, tr.dq_queries, c.dq_q);
    copy(s, tr.dq_keys, c.dq_kv);
    bool dup = false;  // styles that agree at these row counts
    for (const BwdConfig& o : out) dup = dup || o.name() == c.name();
    if (!dup) out.push_back(c);
  }
  return out;
}

// Options::backward_config's entry of the table (null when none is given: the heuristic); the
// table is kept in *table, which *cfg points into.
Status backward_config_of(const Problem& pr, const Options& opt, int64_t dmax,
                          std::vector<BwdConfig>* table, const BwdConfig** cfg) {
  *cfg = nullptr;
  if (opt.backward_config.empty()) return Status::Ok();
  *table = bwd_configs(pr.rank, pr.dtype, dmax);
  for (const BwdConfig& c : *table)
    if (c.name() == opt.backward_config) *cfg = &c;
  if (*cfg == nullptr)  // validate_options lists the valid names; this is a second guard
    return {Code::invalid_argument, "backward_config='" + opt.backward_config +
                                        "' is not a cuda-fused backward configuration for " +
                                        "this problem (see fna::fused_backward_configs)"};
  return Status::Ok();
}

// T: __half, __nv_bfloat16, or mma::F32 / mma::TF32 (float32 elements). cfg:
// Options::backward_config's entry, or null (the heuristic).
template <typename T>
Status run(const Problem& pr, const BackwardArgs& a, const Options& opt, Params p, int dpad,
           const BwdConfig* cfg) {
  using E = typename Elem<T>::type;
  cudaStream_t stream = detail::stream_of(opt);
  const int64_t rows = int64_t(p.batch) * p.tokens * p.heads;
  // Benchmark hook: FNA_FUSED_BWD_DETERMINISTIC=1 times the deterministic path through callers
  // (fna-bench, Python) that do not expose Options::deterministic.
  static const bool force_det = std::getenv("FNA_FUSED_BWD_DETERMINISTIC") != nullptr;
  const bool deterministic = opt.deterministic || force_det;
  // Tiles and grids first: nothing is queued when the problem does not fit the grid.
  Params p_dkdv = p, p_dq = p;
  int64_t n_dkdv = 0, n_dq = 0;
  const TileRows tr = tile_rows(dpad, Elem<T>::kF32);
  set_tiles(&p_dkdv, tr.dkdv_queries, tr.dkdv_keys, true, cfg ? cfg->q : nullptr,
            cfg ? cfg->kv : nullptr, &n_dkdv);
  if (deterministic)
    set_tiles(&p_dq, tr.dq_queries, tr.dq_keys, false, cfg ? cfg->dq_q : nullptr,
              cfg ? cfg->dq_kv : nullptr, &n_dq);
  const int sms = detail::cuda_sm_count(opt.device_index);
  int order[kAxes];
  set_walk(&p_dkdv, true, sms, order);
  if (deterministic) set_walk(&p_dq, false, sms, order);
  const int64_t y_dkdv = int64_t(p.batch) * p.heads_kv * p.num_groups;
  const int64_t y_dq = int64_t(p.batch) * p.heads * p.num_groups;
  if (y_dkdv > 65535 || y_dq > 65535 || n_dkdv > INT32_MAX || n_dq > INT32_MAX)
    return {Code::unsupported, "backend=cuda-fused: batch * heads * dilation groups = " +
                                   std::to_string(y_dq) + " exceeds the grid"};
  const dim3 grid_dkdv{unsigned(n_dkdv), unsigned(y_dkdv)};
  const dim3 grid_add{unsigned((p.num_add + tr.dkdv_keys - 1) / tr.dkdv_keys),
                      unsigned(p.batch * p.heads_kv)};
  const dim3 grid_dq{unsigned(n_dq), unsigned(y_dq)};

  detail::Workspace ws(stream);
  Status st = ws.allocate(size_t(rows) * sizeof(float2), "backward statistics");
  if (!st.ok()) return st;
  p.stats = ws.as<float2>();

  TokStrides so{}, sl{};
  bool unused = true;
  lift(pr, a.o, &so, &unused, 4);
  sl.b = a.lse.strides[0];
  const int lead = kAxes - pr.rank;
  for (int ax = 0; ax < kAxes; ++ax) sl.x[ax] = ax >= lead ? a.lse.strides[1 + ax - lead] : 0;
  sl.h = a.lse.strides[pr.rank + 1];

  // Default: dQ accumulated with float32 atomics inside the dK/dV kernel (one pass over the
  // pairs instead of two); `deterministic` runs the separate dQ kernel instead.
  detail::Workspace ws_dq(stream);
  if (!deterministic) {
    p.dq_row = (p.dim + 7) / 8 * 8;
    const size_t bytes = size_t(rows) * p.dq_row * sizeof(float);
    st = ws_dq.allocate(bytes, "backward dQ accumulator");
    if (!st.ok()) return st;
    FNA_CUDA_TRY(cudaMemsetAsync(ws_dq.get(), 0, bytes, stream));
    p.dq_accum = ws_dq.as<float>();
  }
  p_dkdv.dq_accum = p.dq_accum;
  p_dkdv.dq_row = p.dq_row;
  p_dq.stats = p_dkdv.stats = p.stats;

  constexpr int kPer = 16 / int(sizeof(E));
  const int log_tpr = log_threads_per_row((p.dim_v + kPer - 1) / kPer);
  const bool dense = dense_rows(p, so, p.dim_v) && dense_rows(p, p.sdo, p.dim_v) &&
                     dense_rows(p, sl, 1);
  const bool vec = dense && p.dim_v % kPer == 0 && reinterpret_cast<uintptr_t>(a.o.data) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.d_o) % 16 == 0;
  const int threads = 256;
  const unsigned blocks = unsigned(((rows << log_tpr) + threads - 1) / threads);
  stats_kernel<E, std::is_same<T, mma::TF32>::value><<<blocks, threads, 0, stream>>>(
      p, static_cast<const E*>(a.o.data), so, static_cast<const float*>(a.lse.data), sl,
      ws.as<float2>(), log_tpr, dense, vec);
  FNA_CUDA_CHECK_LAUNCH("backward stats kernel");
  if (dpad == 64) return launch_backward<T, 64>(p_dkdv, p_dq, grid_dkdv, grid_add, grid_dq, stream);
  if (dpad == 256)
    return launch_backward<T, 256>(p_dkdv, p_dq, grid_dkdv, grid_add, grid_dq, stream);
  return launch_backward<T, 128>(p_dkdv, p_dq, grid_dkdv, grid_add, grid_dq, stream);
}

}  // namespace
}  // namespace bwd

namespace detail {

std::vector<std::string> cuda_fused_backward_configs(int rank, DType dtype, int64_t dim) {
  std::vector<std::string> names;
  for (const bwd::BwdConfig& c : bwd::bwd_configs(rank, dtype, dim)) names.push_back(c.name());
  return names;
}

Status cuda_fused_backward(const Problem& pr, const BackwardArgs& a, const Options& opt) {
  using namespace bwd;
  auto unsupported = [](const std::string& why) {
    return Status{Code::unsupported, "backend=cuda-fused backward: " + why};
  };
  const int64_t dmax = std::max(pr.dim, pr.dim_v);
  if (dmax > 256) return unsupported("head dim " + std::to_string(dmax) + " > 256");
  // Options::config names a forward configuration (config.h) and does not concern the backward;
  // Options::backward_config names one of the table below (validate_options checked the name).
  const BwdConfig* cfg = nullptr;
  std::vector<BwdConfig> cfgs;
  Status cst = backward_config_of(pr, opt, dmax, &cfgs, &cfg);
  if (!cst.ok()) return cst;

  for (int ax = 0; ax < pr.rank; ++ax)
    if (pr.shape[ax] > (1 << 30)) return unsupported("shape too large");
  Params p{};
  p.geo = fused::Geometry::lift(pr.rank, pr.shape, pr.kernel_size, pr.dilation, pr.stride,
                                pr.is_causal);
  p.num_groups = p.geo.num_groups();
  p.batch = int(pr.batch);
  p.heads = int(pr.heads);
  p.heads_kv = int(pr.heads_kv);
  p.heads_per_kv = int(pr.heads / pr.heads_kv);
  p.dim = int(pr.dim);
  p.dim_v = int(pr.dim_v);
  p.num_add = int(pr.num_additional);
  p.tokens = pr.tokens();
  p.scale = float(opt.scale);
  p.scale_log2 = float(opt.scale) * 1.4426950408889634f;

  const int vec = pr.dtype == DType::f32 ? 4 : 8;  // elements per 16-byte chunk
  bool al = pr.dim % vec == 0 && pr.dim_v % vec == 0;
  bool ok = lift(pr, a.q, &p.sq, &al, vec) && lift(pr, a.k, &p.sk, &al, vec) &&
            lift(pr, a.v, &p.sv, &al, vec) && lift(pr, a.d_o, &p.sdo, &al, vec) &&
            lift(pr, a.dq, &p.sdq, &al, vec) && lift(pr, a.dk, &p.sdk, &al, vec) &&
            lift(pr, a.dv, &p.sdv, &al, vec) && a.o.strides[pr.rank + 2] == 1;
  if (p.num_add > 0)
    ok = ok && lift_add(a.add_k, &p.sak, &al, vec) && lift_add(a.add_v, &p.sav, &al, vec) &&
         lift_add(a.d_add_k, &p.sdak, &al, vec) && lift_add(a.d_add_v, &p.sdav, &al, vec);
  if (!ok) return unsupported("needs unit stride on the head dim of every tensor");
  p.aligned = al;
  p.q = a.q.data, p.k = a.k.data, p.v = a.v.data, p.d_o = a.d_o.data;
  p.dq = a.dq.data, p.dk = a.dk.data, p.dv = a.dv.data;
  p.add_k = a.add_k.data, p.add_v = a.add_v.data;
  p.d_add_k = a.d_add_k.data, p.d_add_v = a.d_add_v.data;

  DeviceGuard guard;
  Status st = guard.set(opt.device_index);
  if (!st.ok()) return st;
  int major = 0;
  FNA_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, opt.device_index));
  if (major < 8) return unsupported("needs sm_80 or newer (mma.sync bf16 / f16 / tf32)");
  if (p.batch == 0 || p.tokens == 0 || p.heads == 0) return Status::Ok();

  const int dpad = padded_dim(dmax);
  // float32: split TF32 (float32 accuracy) by default, plain TF32 with Options::allow_tf32.
  if (pr.dtype == DType::f32 && opt.allow_tf32) return run<mma::TF32>(pr, a, opt, p, dpad, cfg);
  if (pr.dtype == DType::f32) return run<mma::F32>(pr, a, opt, p, dpad, cfg);
  if (pr.dtype == DType::f16) return run<__half>(pr, a, opt, p, dpad, cfg);
  return run<__nv_bfloat16>(pr, a, opt, p, dpad, cfg);
}

Status cuda_fused_backward_plan(const Problem& pr, const Options& opt, FusedPlan* plan) {
  using namespace bwd;
  const int64_t dmax = std::max(pr.dim, pr.dim_v);
  if (dmax > 256)
    return {Code::unsupported, "backend=cuda-fused backward: head dim " + std::to_string(dmax) +
                                   " > 256"};
  const BwdConfig* cfg = nullptr;
  std::vector<BwdConfig> cfgs;
  Status cst = backward_config_of(pr, opt, dmax, &cfgs, &cfg);
  if (!cst.ok()) return cst;
  // The tiles exactly as run() picks them for the dK / dV kernel.
  Params p{};
  p.geo = fused::Geometry::lift(pr.rank, pr.shape, pr.kernel_size, pr.dilation, pr.stride,
                                pr.is_causal);
  const TileRows tr = tile_rows(padded_dim(dmax), pr.dtype == DType::f32);
  int64_t n_tiles = 0;
  set_tiles(&p, tr.dkdv_queries, tr.dkdv_keys, true, cfg ? cfg->q : nullptr,
            cfg ? cfg->kv : nullptr, &n_tiles);
  double visited = 1;
  for (int a = 0; a < kAxes; ++a)
    visited *= fused::axis_tile_pairs(p.geo.axis[a], p.tkv[a], p.tq[a], true);
  plan->backward_kv_tile.assign(p.tkv + kAxes - pr.rank, p.tkv + kAxes);
  plan->backward_q_tile.assign(p.tq + kAxes - pr.rank, p.tq + kAxes);
  plan->backward_visited_tiles = visited * double(pr.batch) * double(pr.heads);
  const double computed = visited * double(tr.dkdv_keys) * double(tr.dkdv_queries);
  plan->backward_needed_fraction = computed > 0 ? fused::needed_pairs(p.geo) / computed : 0.0;
  int order[kAxes];
  set_walk(&p, true, detail::cuda_sm_count(opt.device_index), order);
  plan->backward_walk = fused::walk_axes(pr.rank, order);
  return Status::Ok();
}

}  // namespace detail
}  // namespace fna
