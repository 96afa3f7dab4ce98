// The fused backward's instantiation table (its tile configurations are run-time shapes: the
// table of styles in plan/bwd_choice.cu): one row per (element type, padded head dim) of the
// mma.sync kernels, and the Hopper dK / dV kernels' rows. The build generates one file per row
// (CMakeLists.txt fna_instantiate), plan/backward.cu and bwd_choice.cu declare them from the same table.
#pragma once

// The fused backward's instantiations: X(element type, padded head dim), one per (dtype, head
// dim); the build generates one file per row (parallel compiles).
#define FNA_BWD_INSTANCES(X)                                                                  \
  X(__half, 64) X(__half, 128) X(__half, 256) X(__nv_bfloat16, 64) X(__nv_bfloat16, 128)     \
      X(__nv_bfloat16, 256) X(mma::F32, 64) X(mma::F32, 128) X(mma::F32, 256) X(mma::TF32, 64) \
          X(mma::TF32, 128) X(mma::TF32, 256)

// The strip backward kernels (kernel/strip/fwd_strip.cuh: the strip forward's CTAs and ring of
// halo rows), rank 2, 16-bit, built with the Hopper kernels (sm_90a). dQ (role 1): per warp box
// of 16 queries, P from the saved LSE, dS and dQ = scale dS K over the K / V ring, after the plain
// Hopper dK / dV kernel without its dQ (Tuning::bwd_dq_strip). dK / dV (role 2): per box of 16
// keys, the query rows of their inverse neighborhoods (Q, dO) through the ring
// (Tuning::bwd_strip). X(role, head_dim, phases, box_h, box_w, dtype): dQ at head dim 32 on 12
// warps, everything else on 8 (more fragments and accumulators than 12 warps' registers hold);
// dK / dV at head dim 128 with two warps per box, each accumulating 64 of the columns.
#define FNA_BWD_STRIP_CONFIGS(X, DT)                                                      \
  X(1, 32, 6, 2, 8, DT) X(1, 32, 3, 4, 4, DT) X(1, 64, 4, 2, 8, DT) X(1, 64, 2, 4, 4, DT)     \
      X(1, 128, 4, 2, 8, DT) X(1, 128, 2, 4, 4, DT) X(2, 32, 4, 2, 8, DT)                   \
          X(2, 32, 2, 4, 4, DT) X(2, 64, 4, 2, 8, DT) X(2, 64, 2, 4, 4, DT)                 \
              X(2, 128, 2, 2, 8, DT) X(2, 128, 1, 4, 4, DT)

// The Hopper backward's instantiations: X(dtype, padded head dim).
#define FNA_BWD_SM90_INSTANCES(X)                                                   \
  X(__half, 64) X(__half, 128) X(__half, 256) X(__nv_bfloat16, 64) X(__nv_bfloat16, 128) \
      X(__nv_bfloat16, 256)
