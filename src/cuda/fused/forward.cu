// cuda-fused forward: the configuration table, the choice of a configuration, layout checks and
// the launch. The kernels are in fwd_kernel.cuh, instantiated from the same table (config.h) by
// files CMake generates from fwd_inst.cu.in.
#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/backends.h"
#include "cuda/common/mma.cuh"
#include "cuda/common/runtime.cuh"
#include "cuda/fused/config.h"
#include "cuda/fused/fwd_box.h"
#include "cuda/fused/fwd_strip.h"
#include "cuda/fused/fwd_params.h"

namespace fna {
namespace detail {

namespace {

using fused::FwdParams;
using fused::kAxes;
using fused::Tile;

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<mma::F16> {
  static constexpr DType value = DType::f16;
};
template <>
struct DTypeOf<mma::BF16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct DTypeOf<mma::F32> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<mma::TF32> {
  static constexpr DType value = DType::f32;
};

// float32 entries exist twice, split TF32 (the default) and plain TF32 (Options::allow_tf32).
template <class T>
constexpr bool plain_tf32() {
  return std::is_same<T, mma::TF32>::value;
}

constexpr int kArchBox = 1;
constexpr int kArchStrip = 2;
struct FwdEntry {
  int rank;
  DType dtype;
  bool tf32;  // float32 with plain TF32 products (Options::allow_tf32)
  int dim;    // padded head dim the kernel is compiled for
  int q[kAxes];
  int kv[kAxes];
  int warps;
  // 80: mma.sync kernels (fwd_kernel.cuh, sm_80+); 90: wgmma kernels (fwd_sm90.cuh, 9.0 only);
  // kArchBox: the box forward (fwd_box.cuh, mma.sync, sm_80+; `kv` holds the warp box).
  // kArchStrip: the strip forward (fwd_strip.cuh; `q` holds the box rows in flight x the strip's
  // 16 columns, `kv` the warp box).
  int arch;
  cudaError_t (*launch)(const FwdParams&, int, cudaStream_t);
  size_t (*smem)();

  int q_size() const { return q[0] * q[1] * q[2]; }
  int kv_size() const { return kv[0] * kv[1] * kv[2]; }
  std::string name() const {
    auto shape = [&](const int* e) {
      std::string s;
      for (int ax = kAxes - rank; ax < kAxes; ++ax)
        s += (ax > kAxes - rank ? "x" : "") + std::to_string(e[ax]);
      return s;
    };
    const char* dt = dtype == DType::bf16 ? "bf16" : (dtype == DType::f16 ? "f16" : "f32");
    if (arch == kArchBox || arch == kArchStrip)
      return std::string(arch == kArchBox ? "fna_fwd_box_" : "fna_fwd_strip_") + dt + "_d" + std::to_string(dim) + "_q" + shape(q) +
             "_b" + shape(kv) + "_w" + std::to_string(warps);
    return std::string(arch == 90 ? "fna_fwd_sm90_" : "fna_fwd_sm80_") + dt + "_d" +
           std::to_string(dim) + "_q" + shape(q) + "_kv" + shape(kv) + "_w" + std::to_string(warps);
  }
};

#define FNA_FWD_ENTRY(R, D, Q0, Q1, Q2, K0, K1, K2, MT, DT)                           \
  FwdEntry{R,                                                                         \
           DTypeOf<mma::DT>::value,                                                   \
           plain_tf32<mma::DT>(),                                                     \
           D,                                                                         \
           {Q0, Q1, Q2},                                                              \
           {K0, K1, K2},                                                              \
           (Q0) * (Q1) * (Q2) / (16 * (MT)),                                          \
           80,                                                                        \
           &fused::launch_fwd<mma::DT, D, R, MT, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>, \
           &fused::fwd_smem_bytes<mma::DT, D, R, MT, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>},

#define FNA_FWD_SM90_ENTRY(R, D, Q0, Q1, Q2, K0, K1, K2, DT)                                \
  FwdEntry{R,                                                                              \
           DTypeOf<mma::DT>::value,                                                        \
           false,                                                                          \
           D,                                                                              \
           {Q0, Q1, Q2},                                                                   \
           {K0, K1, K2},                                                                   \
           (Q0) * (Q1) * (Q2) / 16,                                                        \
           90,                                                                             \
           &fused::launch_fwd_sm90<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>,     \
           &fused::fwd_sm90_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>},

#define FNA_FWD_BOX_ENTRY(D, Q1, Q2, DT)                                             \
  FwdEntry{2,                                                                       \
           DTypeOf<mma::DT>::value,                                                 \
           false,                                                                   \
           D,                                                                       \
           {1, Q1, Q2},                                                             \
           {1, fused::kBoxExt, fused::kBoxExt},                                     \
           (Q1) * (Q2) / 16,                                                        \
           kArchBox,                                                                \
           &fused::launch_fwd_box<mma::DT, D, Tile<1, Q1, Q2>>,                     \
           &fused::fwd_box_smem_bytes<mma::DT, D, Tile<1, Q1, Q2>>},

#define FNA_FWD_STRIP_ENTRY(D, PH, DT)                          \
  FwdEntry{2,                                                  \
           DTypeOf<mma::DT>::value,                            \
           false,                                              \
           D,                                                  \
           {1, fused::kBoxExt*(PH), fused::kStripCols},        \
           {1, fused::kBoxExt, fused::kBoxExt},                \
           fused::kStripCols / fused::kBoxExt * (PH),          \
           kArchStrip,                                         \
           &fused::launch_fwd_strip<mma::DT, D, PH>,           \
           &fused::fwd_strip_smem_bytes<mma::DT, D, PH>},

const std::vector<FwdEntry>& table() {
  static const std::vector<FwdEntry> t{
      FNA_FWD_CONFIGS_STRIP(FNA_FWD_STRIP_ENTRY, BF16)
      FNA_FWD_CONFIGS_STRIP(FNA_FWD_STRIP_ENTRY, F16)
      FNA_FWD_CONFIGS_BOX(FNA_FWD_BOX_ENTRY, BF16) FNA_FWD_CONFIGS_BOX(FNA_FWD_BOX_ENTRY, F16)
#if defined(FNA_WITH_SM90)
      FNA_FWD_CONFIGS_SM90(FNA_FWD_SM90_ENTRY, BF16) FNA_FWD_CONFIGS_SM90(FNA_FWD_SM90_ENTRY, F16)
#endif
      FNA_FWD_CONFIGS(FNA_FWD_ENTRY, BF16) FNA_FWD_CONFIGS(FNA_FWD_ENTRY, F16)
          FNA_FWD_CONFIGS_F32(FNA_FWD_ENTRY, F32) FNA_FWD_CONFIGS_F32(FNA_FWD_ENTRY, TF32)};
  return t;
}
#undef FNA_FWD_ENTRY
#undef FNA_FWD_SM90_ENTRY
#undef FNA_FWD_BOX_ENTRY
#undef FNA_FWD_STRIP_ENTRY

Status unsupported(const std::string& msg) { return {Code::unsupported, "backend=cuda-fused: " + msg}; }

// Entries of one (rank, dtype, precision); `tf32` only matters for float32.
bool matches(const FwdEntry& e, int rank, DType dtype, bool tf32) {
  return e.rank == rank && e.dtype == dtype && e.tf32 == (tf32 && dtype == DType::f32);
}

// The smallest compiled head dim that holds max(D, D_v); 0 when none does.
int dim_bucket(int rank, DType dtype, bool tf32, int64_t need) {
  int best = 0;
  for (const FwdEntry& e : table())
    if (matches(e, rank, dtype, tf32) && e.dim >= need && (best == 0 || e.dim < best))
      best = e.dim;
  return best;
}

std::vector<const FwdEntry*> candidates(int rank, DType dtype, bool tf32, int64_t need) {
  std::vector<const FwdEntry*> out;
  const int bucket = dim_bucket(rank, dtype, tf32, need);
  for (const FwdEntry& e : table())
    if (matches(e, rank, dtype, tf32) && e.dim == bucket) out.push_back(&e);
  return out;
}

fused::Geometry geometry_of(const Problem& p) {
  return fused::Geometry::lift(p.rank, p.shape, p.kernel_size, p.dilation, p.stride, p.is_causal);
}

// Work estimate of a configuration: every visited key tile costs kQ * kN score pairs, border
// tiles about a quarter more for the mask, and each tile's copy and barrier about as much as 32
// more query rows would on the mma.sync kernels (so smaller query tiles pay for re-reading K/V),
// 64 on the wgmma kernels, whose per-tile waits for MMA completion cost more next to their faster
// MMAs.
// The warp-specialized sm90 kernel's warpgroups take only their own rows' key tiles and end
// together, so there the multiply-and-mask term is each query tile's slowest warpgroup
// (tiling.cuh part_critical_tiles) as if all ran it; the per-tile term still counts every tile the
// CTA loads.
double cost_of(const FwdEntry& e, const fused::Geometry& geo) {
  const fused::TilingStats s = fused::tiling_stats(geo, e.q, e.kv);
  const double masked = s.visited - s.unmasked;
  const double per_tile_rows = e.arch == 90 ? 64.0 : 32.0;
  double work = s.visited + 0.25 * masked;
  if (e.arch == 90 && fused::use_fwd_wg_skip() && fused::fwd_sm90_runs_ws(e.q_size(), e.rank))
    work = fused::part_critical_tiles(geo, fused::Ext3{{e.q[0], e.q[1], e.q[2]}},
                                      fused::Ext3{{e.kv[0], e.kv[1], e.kv[2]}}, 64, 0.25);
  return (work * double(e.q_size()) + per_tile_rows * s.visited) * double(e.kv_size());
}

// The order in which the CTAs take query tiles (tiling.cuh walk_order), with one CTA per SM
// resident (the warp-specialized kernels'; the smaller ones fit several).
void fwd_walk(const fused::Geometry& geo, const FwdEntry& e, const Options& opt,
              int (&order)[kAxes]) {
  fused::walk_order(geo, e.q, cuda_sm_count(opt.device_index), "FNA_FWD_WALK", order);
}

// Pairs a tiled configuration multiplies per (batch, head): visited key tiles x tile sizes.
double tiled_pairs(const FwdEntry& e, const fused::Geometry& geo) {
  return fused::tiling_stats(geo, e.q, e.kv).visited * double(e.q_size()) * double(e.kv_size());
}

// Whether the box forward takes this problem on this device (its plan in `bp`); `why` says why
// not.
bool box_applies(const FwdEntry& e, const Problem& p, const fused::Geometry& geo, int smem_optin,
                 fused::BoxPlan* bp, std::string* why) {
  if (p.num_additional > 0) {
    *why = "num_additional=" + std::to_string(p.num_additional) +
           " (the box forward takes no additional keys)";
    return false;
  }
  *bp = fused::box_plan(geo, e.q, e.dim);
  if (!bp->ok) {
    *why = bp->why;
    return false;
  }
  if (bp->smem > static_cast<size_t>(smem_optin)) {
    *why = "its halo needs " + std::to_string(bp->smem) + " bytes of shared memory, the device has " +
           std::to_string(smem_optin);
    return false;
  }
  return true;
}

// Whether the strip forward takes this problem on this device (its plan in `sp`).
bool strip_applies(const FwdEntry& e, const Problem& p, const fused::Geometry& geo, int smem_optin,
                   int sms, fused::StripPlan* sp, std::string* why) {
  if (p.num_additional > 0) {
    *why = "num_additional=" + std::to_string(p.num_additional) +
           " (the strip forward takes no additional keys)";
    return false;
  }
  *sp = fused::strip_plan(geo, e.dim, e.q[1] / fused::kBoxExt, sms, smem_optin,
                          double(p.batch) * double(p.heads));
  if (!sp->ok) *why = sp->why;
  return sp->ok;
}

// The strip forward (fwd_strip.cuh) multiplies the box forward's pairs without re-copying a halo
// per CTA tile, so it takes the box forward's place and, with a looser pairs ratio, some of the
// tiled kernels'. Measured on an H100 (bf16, head dim 64, tools/gpu/box_ab.py --env
// FNA_FWD_STRIP=0,1 and env_ab.py, 2026-11-24): 13x13 and 11x11 windows 1.016-1.018x over the box
// forward, causal 13x13 1.063x, 13x13 with dilation 2 (0.62 of the tiled choice's pairs)
// 1.063x over the tiled kernel; 9x9 / 7x7 (0.75) 0.81-0.95x and 5x5 (half its columns
// outside the unions) 0.95x. FNA_FWD_STRIP=0 turns it off, 1 takes it wherever it applies.
constexpr double kStripPairsRatio = 0.65;
int strip_mode() {
  const char* env = std::getenv("FNA_FWD_STRIP");
  if (env == nullptr || *env == '\0') return -1;
  return std::atoi(env) != 0 ? 1 : 0;
}

// The strip forward's query rows in flight (box rows x 4, 4 warps per box row) that the heuristic
// takes: the most whose halo rows (their union, 4 P + box_rows - 4 rows for P box rows) fit the
// ring with four bands to spare (ring_rows >= q[1] + box_rows + 4), else the fewest. Since the
// bands are handed back without fences (fwd_strip.cuh), the copies' lookahead counts more than
// the warps: 12 warps ran 2d-nat (13x13, ring 32 rows) base / causal0 / dil2 in 0.416 / 0.390 /
// 0.438 ms against 0.426 / 0.400 / 0.447 for 16 (two bands to spare) and 0.467 / 0.442 / 0.475
// for 8 (H100, bf16, tools/gpu/config_ab.py, GPU time, 2026-11-24). FNA_FWD_STRIP_ROWS=8 / 12 /
// 16 forces the choice (read at every call).
int strip_rows_score(const FwdEntry& e, const fused::StripPlan& sp) {
  const char* env = std::getenv("FNA_FWD_STRIP_ROWS");
  if (env != nullptr && *env != '\0') return e.q[1] == std::atoi(env) ? 2000 : -e.q[1];
  return sp.sp.ring_rows >= e.q[1] + sp.box_rows + 2 * fused::kStripBandRows ? 1000 + e.q[1]
                                                                          : -e.q[1];
}

// The box forward replaces the tiled choice when it multiplies at most this fraction of its pairs
// and its chunks' 16 columns are on average at least 3/4 inside their boxes' unions (windows of
// 9+ on the last axis). Measured on an H100 (bf16, head dim 64, tools/gpu/box_ab.py, 2026-11-24):
// 13x13 and 11x11 windows (0.57 of the pairs) ran 1.02-1.09x faster with the box forward, 7x7 and
// 9x9 (0.75) 0.79-0.95x and 5x5 (0.5, half the columns outside the unions) 0.93x: its per-warp
// setup and halo copy cost as much as 4-5 chunks. FNA_BOX_PAIRS_RATIO overrides the ratio (0
// turns the box forward off; a large value takes it wherever it applies, columns regardless).
double box_pairs_ratio(bool* forced) {
  const char* env = std::getenv("FNA_BOX_PAIRS_RATIO");
  *forced = env != nullptr && *env != '\0';
  return *forced ? std::atof(env) : 0.6;
}

// The vectorized path copies 16-byte row chunks: unit stride on the head dim, 16-byte aligned
// base and every other stride a multiple of `vec` elements (16 bytes; dims of extent 1 never move
// the pointer).
Status check_rows(const char* name, const TensorRef& t, int ndim, const int64_t* extents,
                  int vec) {
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0)
    return unsupported(std::string(name) + " pointer is not 16-byte aligned");
  if (t.strides[ndim - 1] != 1)
    return unsupported(std::string(name) + " stride[" + std::to_string(ndim - 1) + "]=" +
                       std::to_string(t.strides[ndim - 1]) + " (head dim) must be 1");
  for (int d = 0; d < ndim - 1; ++d)
    if (extents[d] > 1 && t.strides[d] % vec != 0)
      return unsupported(std::string(name) + " stride[" + std::to_string(d) + "]=" +
                         std::to_string(t.strides[d]) + " is not a multiple of " +
                         std::to_string(vec) + " elements");
  return Status::Ok();
}

// [B, L.., H] strides lifted to [B, axis 0, axis 1, axis 2, H].
void lift_strides(const TensorRef& t, int rank, int64_t (&out)[5]) {
  out[0] = t.strides[0];
  for (int ax = 0; ax < kAxes; ++ax) {
    const int src = ax - (kAxes - rank);
    out[1 + ax] = src < 0 ? 0 : t.strides[1 + src];
  }
  out[4] = t.strides[1 + rank];
}

std::string join_names(const std::vector<const FwdEntry*>& es) {
  std::string s;
  for (const FwdEntry* e : es) s += (s.empty() ? "" : ", ") + e->name();
  return s.empty() ? "(none)" : s;
}

// The configuration the forward runs: Options::config when given (an error when it does not fit
// the call), else the cheapest candidate (cost_of) that fits the device's shared memory.
Status select_config(const Problem& p, const Options& opt, const FwdEntry** out) {
  *out = nullptr;
  // Elements per 16-byte chunk: head dims (and strides, checked by the caller) must be multiples.
  const int vec = p.dtype == DType::f32 ? 4 : 8;
  if (p.dim % vec != 0 || p.dim_v % vec != 0)
    return unsupported("dim=" + std::to_string(p.dim) + ", dim_v=" + std::to_string(p.dim_v) +
                       ": head dims must be multiples of " + std::to_string(vec) + " for " +
                       dtype_name(p.dtype));
  const int64_t need = std::max(p.dim, p.dim_v);
  const bool tf32 = opt.allow_tf32;
  const FwdEntry*& cfg = *out;
  const fused::Geometry geo = geometry_of(p);
  int cc_major = 0, cc_minor = 0;
  FNA_CUDA_TRY(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor,
                                      opt.device_index));
  FNA_CUDA_TRY(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor,
                                      opt.device_index));
  const bool hopper = cc_major == 9 && cc_minor == 0;
  const std::vector<const FwdEntry*> cands = candidates(p.rank, p.dtype, tf32, need);
  if (!opt.config.empty()) {
    for (const FwdEntry& e : table())
      if (e.name() == opt.config && matches(e, p.rank, p.dtype, tf32) && e.dim >= need)
        cfg = &e;
    if (cfg == nullptr)
      return {Code::invalid_argument,
              "config='" + opt.config + "' is not a cuda-fused forward configuration for rank=" +
                  std::to_string(p.rank) + ", dtype=" + dtype_name(p.dtype) +
                  ", dim=" + std::to_string(need) + "; valid: " + join_names(cands)};
    if (cfg->arch == kArchBox || cfg->arch == kArchStrip) {
      int smem_optin = 0;
      FNA_CUDA_TRY(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                          opt.device_index));
      fused::BoxPlan bp;
      fused::StripPlan sp;
      std::string why;
      const bool ok = cfg->arch == kArchBox
                          ? box_applies(*cfg, p, geo, smem_optin, &bp, &why)
                          : strip_applies(*cfg, p, geo, smem_optin,
                                          cuda_sm_count(opt.device_index), &sp, &why);
      if (!ok) return unsupported("config='" + opt.config + "' cannot run this problem: " + why);
    }
    if (cfg->arch == 90 && !hopper)
      return unsupported("config='" + opt.config + "' is a Hopper (wgmma) configuration: it needs "
                         "compute capability 9.0, device " + std::to_string(opt.device_index) +
                         " has " + std::to_string(cc_major) + "." + std::to_string(cc_minor));
  } else {
    if (cands.empty())
      return unsupported("dim=" + std::to_string(need) + " exceeds the largest compiled head dim");
    // Only configurations whose CTA fits the device's shared memory (sm_86 / sm_89 offer 99 KiB,
    // less than the two-m-tile head-dim-128 tiles take) and runs on it; on compute capability 9.0
    // the wgmma kernels when one fits, else the mma.sync ones. Ties go to the earlier entry.
    int smem_optin = 0;
    FNA_CUDA_TRY(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                        opt.device_index));
    bool any90 = false;
    for (const FwdEntry* e : cands)
      any90 = any90 || (e->arch == 90 && hopper && e->smem() <= static_cast<size_t>(smem_optin));
    double best = 0;
    for (const FwdEntry* e : cands) {
      if (e->arch == kArchBox || e->arch == kArchStrip ||
          e->smem() > static_cast<size_t>(smem_optin))
        continue;
      if ((e->arch == 90) != any90) continue;
      const double c = cost_of(*e, geo);
      if (cfg == nullptr || c < best) {
        cfg = e;
        best = c;
      }
    }
    // The box forward where it multiplies sufficiently fewer pairs than the tiled choice. Its
    // entries share the warp box, so they multiply the same pairs; the one copying the fewest
    // halo rows (the largest CTA tile whose halo fits the device) is taken.
    bool forced = false;
    const double ratio = box_pairs_ratio(&forced);
    const double tiled = cfg != nullptr ? tiled_pairs(*cfg, geo) : 0;
    const FwdEntry* box = nullptr;
    double box_loaded = 0;
    for (const FwdEntry* e : cands) {
      // Only 16-warp CTA tiles: the smaller ones (listed for Options::config and the autotuner)
      // copy 1.4-2x the halo rows per query and ran 2d-nat slower than the tiled kernel.
      if (e->arch != kArchBox || ratio <= 0 || e->warps < 16) continue;
      fused::BoxPlan bp;
      std::string why;
      if (!box_applies(*e, p, geo, smem_optin, &bp, &why)) continue;
      if (cfg != nullptr && (bp.computed > ratio * tiled || (!forced && bp.fast_fill < 0.75)))
        continue;
      if (box == nullptr || bp.loaded < box_loaded) {
        box = e;
        box_loaded = bp.loaded;
      }
    }
    if (box != nullptr) cfg = box;
    // The strip forward where it applies and multiplies at most kStripPairsRatio of the tiled
    // choice's pairs with its chunks' columns mostly inside their boxes' unions (as the box
    // forward's rule), or wherever it applies when forced.
    // Among its configurations, the most rows in flight that fit its ring (strip_rows_score).
    const int strip = strip_mode();
    const FwdEntry* strip_cfg = nullptr;
    int strip_score = 0;
    for (const FwdEntry* e : cands) {
      if (strip == 0 || e->arch != kArchStrip) continue;
      fused::StripPlan sp;
      std::string why;
      if (!strip_applies(*e, p, geo, smem_optin, cuda_sm_count(opt.device_index), &sp, &why))
        continue;
      if (!(strip == 1 || box != nullptr || tiled == 0 ||
            (sp.box.computed <= kStripPairsRatio * tiled && sp.box.fast_fill >= 0.75)))
        continue;
      const int score = strip_rows_score(*e, sp);
      if (strip_cfg == nullptr || score > strip_score) {
        strip_cfg = e;
        strip_score = score;
      }
    }
    if (strip_cfg != nullptr) cfg = strip_cfg;
    if (cfg == nullptr)
      return unsupported("no configuration for dim=" + std::to_string(need) + " fits the device's " +
                         std::to_string(smem_optin) + " bytes of shared memory per block");
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string> cuda_fused_configs(int rank, DType dtype, int64_t dim) {
  std::vector<std::string> names;
  // float32: the split-TF32 entries (the plain TF32 ones carry the same names).
  for (const FwdEntry* e : candidates(rank, dtype, false, dim)) names.push_back(e->name());
  return names;
}

Status cuda_fused_plan(const Problem& p, const Options& opt, FusedPlan* plan) {
  const FwdEntry* cfg = nullptr;
  Status st = select_config(p, opt, &cfg);
  if (!st.ok()) return st;
  const fused::Geometry geo = geometry_of(p);
  const double needed = fused::needed_pairs(geo);
  plan->config = cfg->name();
  double computed = 0;
  if (cfg->arch == kArchBox || cfg->arch == kArchStrip) {
    // Visited "tiles" are the warps' 64-key chunks, all masked (the strip forward multiplies the
    // box forward's boxes).
    const int q_box[kAxes] = {1, fused::kBoxExt, fused::kStripCols};
    const fused::BoxPlan bp = fused::box_plan(geo, cfg->arch == kArchBox ? cfg->q : q_box, cfg->dim);
    plan->visited_tiles = bp.chunks * double(p.batch) * double(p.heads);
    plan->unmasked_fraction = 0.0;
    computed = bp.computed;
  } else {
    // The warp-specialized sm90 forward (192-query tiles, and 128-query ones where it runs) visits
    // per compute warpgroup (64 rows) only its own run of key tiles (tiling.cuh rows_walk).
    const bool parts = cfg->arch == 90 && fused::use_fwd_wg_skip() &&
                       fused::fwd_sm90_runs_ws(cfg->q_size(), p.rank);
    const fused::Ext3 qe{{cfg->q[0], cfg->q[1], cfg->q[2]}};
    const fused::Ext3 ke{{cfg->kv[0], cfg->kv[1], cfg->kv[2]}};
    const fused::TilingStats ts = parts ? fused::part_tiling_stats(geo, qe, ke, 64)
                                        : fused::tiling_stats(geo, cfg->q, cfg->kv);
    plan->visited_tiles = ts.visited * double(p.batch) * double(p.heads);
    plan->unmasked_fraction = ts.visited > 0 ? ts.unmasked / ts.visited : 0.0;
    computed = ts.visited * double(cfg->q_size()) * double(cfg->kv_size());
  }
  plan->needed_fraction = computed > 0 ? needed / computed : 0.0;
  int order[kAxes];
  fwd_walk(geo, *cfg, opt, order);
  if (cfg->arch == kArchStrip) {
    // The strip forward's CTAs: row segments (the first axis) fastest, then strips.
    order[0] = 1;
    order[1] = 2;
    order[2] = 0;
  }
  plan->walk = fused::walk_axes(p.rank, order);
  // The backward's dK / dV tiles; a problem the fused backward does not take leaves them empty.
  if (!cuda_fused_backward_plan(p, opt, plan).ok()) {
    plan->backward_kv_tile.clear();
    plan->backward_q_tile.clear();
    plan->backward_walk.clear();
    plan->backward_visited_tiles = plan->backward_needed_fraction = 0;
  }
  return Status::Ok();
}

Status cuda_fused_forward(const Problem& p, const ForwardArgs& a, const Options& opt) {
  const FwdEntry* cfg = nullptr;
  Status st = select_config(p, opt, &cfg);
  if (!st.ok()) return st;
  const int vec = p.dtype == DType::f32 ? 4 : 8;  // elements per 16-byte chunk
  const fused::Geometry geo = geometry_of(p);

  // Layout of every tensor the kernel reads with 16-byte copies or writes with 4-byte (16-bit
  // pairs) or 8-byte (float32 pairs) stores.
  int64_t ext[kMaxDims];
  int n = 0;
  ext[n++] = p.batch;
  for (int i = 0; i < p.rank; ++i) ext[n++] = p.shape[i];
  ext[n++] = p.heads;
  ext[n++] = p.dim;
  const int nd = n;
  st = check_rows("query", a.q, nd, ext, vec);
  if (!st.ok()) return st;
  ext[nd - 1] = p.dim_v;
  if (!(st = check_rows("output", a.o, nd, ext, vec)).ok()) return st;
  ext[nd - 2] = p.heads_kv;
  if (!(st = check_rows("value", a.v, nd, ext, vec)).ok()) return st;
  ext[nd - 1] = p.dim;
  if (!(st = check_rows("key", a.k, nd, ext, vec)).ok()) return st;
  if (p.num_additional > 0) {
    const int64_t add_ext[4] = {p.batch, p.num_additional, p.heads_kv, p.dim};
    const int64_t add_ext_v[4] = {p.batch, p.num_additional, p.heads_kv, p.dim_v};
    if (!(st = check_rows("additional_keys", a.add_k, 4, add_ext, vec)).ok()) return st;
    if (!(st = check_rows("additional_values", a.add_v, 4, add_ext_v, vec)).ok()) return st;
  }
  if (p.num_additional > (int64_t(1) << 30) || p.heads > (int64_t(1) << 30) ||
      p.batch > (int64_t(1) << 30))
    return unsupported("batch, heads and num_additional must each be below 2^30");

  FwdParams fp{};
  fp.q = a.q.data;
  fp.k = a.k.data;
  fp.v = a.v.data;
  fp.o = a.o.data;
  fp.lse = static_cast<float*>(a.lse.data);
  fp.add_k = a.add_k.data;
  fp.add_v = a.add_v.data;
  lift_strides(a.q, p.rank, fp.q_stride);
  lift_strides(a.k, p.rank, fp.k_stride);
  lift_strides(a.v, p.rank, fp.v_stride);
  lift_strides(a.o, p.rank, fp.o_stride);
  if (a.lse.data != nullptr) {
    fp.lse_stride[0] = a.lse.strides[0];
    for (int ax = 0; ax < kAxes; ++ax) {
      const int src = ax - (kAxes - p.rank);
      fp.lse_stride[1 + ax] = src < 0 ? 0 : a.lse.strides[1 + src];
    }
    fp.lse_stride[4] = a.lse.strides[1 + p.rank];
  }
  if (p.num_additional > 0) {
    for (int i = 0; i < 3; ++i) {
      fp.add_k_stride[i] = a.add_k.strides[i];
      fp.add_v_stride[i] = a.add_v.strides[i];
    }
  }
  fp.geo = geo;
  fp.batch = static_cast<int>(p.batch);
  fp.heads = static_cast<int>(p.heads);
  fp.heads_per_kv = static_cast<int>(p.heads / p.heads_kv);
  fp.dim = static_cast<int>(p.dim);
  fp.dim_v = static_cast<int>(p.dim_v);
  fp.num_add = static_cast<int>(p.num_additional);
  fp.groups = geo.num_groups();
  fp.q_tiles_total = 1;
  for (int ax = 0; ax < kAxes; ++ax) {
    fp.q_tiles[ax] = fused::tiles_over(geo.max_group_length(ax), cfg->q[ax]);
    fp.q_tiles_total *= fp.q_tiles[ax];
  }
  {
    int order[kAxes];
    fwd_walk(geo, *cfg, opt, order);
    fused::walk_divisors(fp.q_tiles, order, fp.q_div);
  }
  fp.scale_log2 = static_cast<float>(opt.scale * 1.4426950408889634);
  fp.sm_count = cuda_sm_count(opt.device_index);

  DeviceGuard guard;
  if (!(st = guard.set(opt.device_index)).ok()) return st;
  int major = 0, smem_optin = 0;
  FNA_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, opt.device_index));
  if (major < 8)
    return unsupported("needs compute capability 8.0 or newer (mma.sync bf16 / f16 / tf32)");
  FNA_CUDA_TRY(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                      opt.device_index));
  const cudaError_t err = cfg->launch(fp, smem_optin, stream_of(opt));
  if (err == cudaErrorInvalidConfiguration)
    return unsupported("config " + cfg->name() + " does not fit this device (shared memory " +
                       std::to_string(smem_optin) + " bytes per block, or grid size)");
  return cuda_status(err, ("launching " + cfg->name()).c_str());
}

}  // namespace detail
}  // namespace fna
