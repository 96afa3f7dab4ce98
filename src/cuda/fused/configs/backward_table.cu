// The backward configuration table: the tile styles, names and listing (configs/backward_table.h).
#include "cuda/fused/configs/backward_table.h"

#include "cuda/fused/launch/bwd_launch.cuh"

namespace fna {
namespace bwd {

// ---- backward configurations (Options::backward_config, fna::fused_backward_configs) ----------
// The kernels' row counts are fixed per (dtype, padded head dim) (BwdShape, bwd_launch.cuh); a
// configuration fixes how those rows spread over the axes, for both kernels: the dK/dV kernel's
// owned key tile and visited query tile, and the deterministic dQ kernel's owned query tile and
// visited key tile. The table is one shape per row count (16, 32, 64 or 128 rows) for each of a
// few styles per rank, applied to all four tiles of a (dtype, head dim):
//   rank 2: square (8x16: haloes closest to square windows), wide (4x32: long windows on the
//           last, contiguous axis), tall (16x8: long windows on the first axis);
//   rank 3: cube (4x4x8), slab (2x8x8: shallow first axis, as video windows often are).
// Name: fna_bwd_<family>_<dtype>_d<padded dim>_kv<dK/dV keys>_q<dK/dV queries>_dqq<dQ queries>_dqkv<dQ
// keys>, shapes over the problem's axes; the family is the dK / dV kernel (sm80: mma.sync, every
// sm_80+ device; sm90 / sm90ws: the Hopper wgmma kernel, plain or warp-specialized, 16-bit head
// dims up to 128 in the atomic-dQ mode, compute capability 9.0). The default (no backward_config)
// is not one of these but the plan's: the heuristic's search over every power-of-two shape
// (pick_tiles) and its family, which the table serves to override (and an autotuner to explore).
struct BwdStyle {
  int rank;
  int shape[4][kAxes];  // for 16, 32, 64 and 128 rows, lifted to kAxes
};
const BwdStyle kBwdStyles[] = {
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
  return std::string("fna_bwd_") + fused::family_name(family) + "_" + dt + "_d" +
         std::to_string(dim) + "_kv" + shape(kv) + "_q" + shape(q) + "_dqq" + shape(dq_q) +
         "_dqkv" + shape(dq_kv);
}

// Whether this build has the Hopper dK / dV kernels for (dtype, padded head dim).
bool sm90_built(DType dtype, int dpad, fused::BwdFamily family) {
#if defined(FNA_WITH_SM90)
  // Both Hopper kernels up to 128; at 256 the warp-specialized one (bwd_dkdv_sm90_d256.cuh).
  if (dtype == DType::f32 || family == fused::BwdFamily::sm80) return false;
  return dpad <= 128 || (dpad == 256 && family == fused::BwdFamily::sm90ws);
#else
  (void)dtype, (void)dpad, (void)family;
  return false;
#endif
}

// The configurations for (rank, dtype, max(D, D_v)); empty above 256.
std::vector<BwdConfig> bwd_configs(int rank, DType dtype, int64_t dmax) {
  std::vector<BwdConfig> out;
  if (dmax < 1 || dmax > 256) return out;
  const int dpad = padded_dim(dmax);
  auto copy = [](const BwdStyle& s, int rows, int* dst) {
    const int i = rows == 16 ? 0 : rows == 32 ? 1 : rows == 64 ? 2 : 3;
    for (int a = 0; a < kAxes; ++a) dst[a] = s.shape[i][a];
  };
  std::vector<fused::BwdFamily> families = {fused::BwdFamily::sm80};
  for (fused::BwdFamily f : {fused::BwdFamily::sm90, fused::BwdFamily::sm90ws})
    if (sm90_built(dtype, dpad, f)) families.push_back(f);
  for (fused::BwdFamily f : families) {
    const TileRows tr = family_tile_rows(f, dpad, dtype == DType::f32);
    // The plain Hopper kernel also runs 64-key tiles (one warpgroup: small windows).
    std::vector<int> key_rows = {tr.dkdv_keys};
    if (f == fused::BwdFamily::sm90) key_rows.push_back(64);
    for (int kv_rows : key_rows)
      for (const BwdStyle& s : kBwdStyles) {
        if (s.rank != rank) continue;
        BwdConfig c{f, rank, dtype, dpad, {}, {}, {}, {}};
        copy(s, kv_rows, c.kv);
        copy(s, tr.dkdv_queries, c.q);
        copy(s, tr.dq_queries, c.dq_q);
        copy(s, tr.dq_keys, c.dq_kv);
        bool dup = false;  // styles that agree at these row counts
        for (const BwdConfig& o : out) dup = dup || o.name() == c.name();
        if (!dup) out.push_back(c);
      }
  }
  return out;
}

}  // namespace bwd
}  // namespace fna
