// The forward configuration table: configs/forward.h's rows, one FwdEntry each, with the
// launcher and shared-memory size of the kernel instantiated from the same row.
#include "cuda/fused/configs/forward_table.h"

#include <type_traits>

#include "cuda/common/mma.cuh"
#include "cuda/fused/configs/forward.h"
#include "cuda/fused/kernel/common/box_plan.h"
#include "cuda/fused/kernel/common/simt_plan.h"
#include "cuda/fused/kernel/common/strip_plan.h"

namespace fna {
namespace fused {
namespace {

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

}  // namespace

// The table rows of each family (configs/forward.h's tables, one X macro per family).
#define FNA_FWD_ENTRY(R, D, Q0, Q1, Q2, K0, K1, K2, MT, DT)                                     \
  FwdEntry{R, DTypeOf<mma::DT>::value, plain_tf32<mma::DT>(), D, {Q0, Q1, Q2}, {K0, K1, K2},    \
           (Q0) * (Q1) * (Q2) / (16 * (MT)), FwdFamily::sm80,                                  \
           &launch_fwd<mma::DT, D, R, MT, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>,           \
           &fwd_smem_bytes<mma::DT, D, R, MT, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>},
// The warp-specialized schedule adds a loader warpgroup to the compute warps.
#define FNA_FWD_SM90_ENTRY_Sm90(R, D, Q0, Q1, Q2, K0, K1, K2, DT)                               \
  FwdEntry{R, DTypeOf<mma::DT>::value, false, D, {Q0, Q1, Q2}, {K0, K1, K2},                    \
           (Q0) * (Q1) * (Q2) / 16, FwdFamily::sm90,                                           \
           &launch_fwd_sm90<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>,          \
           &fwd_sm90_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>,      \
           &launch_dq_sm90<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>,           \
           &dq_sm90_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>},
#define FNA_FWD_SM90_ENTRY_Sm90Ws(R, D, Q0, Q1, Q2, K0, K1, K2, DT)                             \
  FwdEntry{R, DTypeOf<mma::DT>::value, false, D, {Q0, Q1, Q2}, {K0, K1, K2},                    \
           (Q0) * (Q1) * (Q2) / 16 + 4, FwdFamily::sm90ws,                                     \
           &launch_fwd_sm90ws<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>,        \
           &fwd_sm90ws_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>,    \
           nullptr, nullptr,                                                                   \
           &fwd_sm90ws_bias_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>, Tile<K0, K1, K2>>},
#define FNA_FWD_SM90_ENTRY(R, D, Q0, Q1, Q2, K0, K1, K2, S, DT) \
  FNA_FWD_SM90_ENTRY_##S(R, D, Q0, Q1, Q2, K0, K1, K2, DT)
#define FNA_FWD_BOX_ENTRY(D, Q1, Q2, DT)                                                       \
  FwdEntry{2, DTypeOf<mma::DT>::value, false, D, {1, Q1, Q2},                                   \
           {1, kBoxExt, kBoxExt}, (Q1) * (Q2) / 16, FwdFamily::box,              \
           &launch_fwd_box<mma::DT, D, Tile<1, Q1, Q2>>,                                 \
           &fwd_box_smem_bytes<mma::DT, D, Tile<1, Q1, Q2>>},
#define FNA_FWD_SIMT_ENTRY(R, D, Q0, Q1, Q2, DT)                                               \
  FwdEntry{R, DTypeOf<mma::DT>::value, false, D, {Q0, Q1, Q2}, {1, 1, kSimtKeys},                       \
           (Q0) * (Q1) * (Q2) / 32, FwdFamily::simt,                                           \
           &launch_fwd_simt<mma::DT, D, R, Tile<Q0, Q1, Q2>>,                                  \
           &fwd_simt_smem_bytes<mma::DT, D, R, Tile<Q0, Q1, Q2>>},
#define FNA_FWD_STRIP_ENTRY(D, PH, BH, BW, DT)                                                 \
  FwdEntry{2, DTypeOf<mma::DT>::value, false, D, {1, (BH) * (PH), kStripCols}, {1, BH, BW},     \
           kStripCols / (BW) * (PH), FwdFamily::strip, &launch_fwd_strip<mma::DT, D, PH, BH, BW>, \
           &fwd_strip_smem_bytes<mma::DT, D, PH, BH, BW>},

const std::vector<FwdEntry>& forward_table() {
  static const std::vector<FwdEntry> t{
      FNA_FWD_CONFIGS_STRIP(FNA_FWD_STRIP_ENTRY, BF16)
      FNA_FWD_CONFIGS_STRIP(FNA_FWD_STRIP_ENTRY, F16)
      FNA_FWD_CONFIGS_BOX(FNA_FWD_BOX_ENTRY, BF16) FNA_FWD_CONFIGS_BOX(FNA_FWD_BOX_ENTRY, F16)
      FNA_FWD_CONFIGS_SIMT(FNA_FWD_SIMT_ENTRY, BF16) FNA_FWD_CONFIGS_SIMT(FNA_FWD_SIMT_ENTRY, F16)
#if defined(FNA_WITH_SM90)
      FNA_FWD_CONFIGS_SM90(FNA_FWD_SM90_ENTRY, BF16) FNA_FWD_CONFIGS_SM90(FNA_FWD_SM90_ENTRY, F16)
#endif
      FNA_FWD_CONFIGS(FNA_FWD_ENTRY, BF16) FNA_FWD_CONFIGS(FNA_FWD_ENTRY, F16)
          FNA_FWD_CONFIGS_F32(FNA_FWD_ENTRY, F32) FNA_FWD_CONFIGS_F32(FNA_FWD_ENTRY, TF32)};
  return t;
}
#undef FNA_FWD_ENTRY
#undef FNA_FWD_SM90_ENTRY
#undef FNA_FWD_SM90_ENTRY_Sm90
#undef FNA_FWD_SM90_ENTRY_Sm90Ws
#undef FNA_FWD_BOX_ENTRY
#undef FNA_FWD_STRIP_ENTRY
#undef FNA_FWD_SIMT_ENTRY

}  // namespace fused
}  // namespace fna
