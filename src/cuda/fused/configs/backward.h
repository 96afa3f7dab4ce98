// The fused backward's instantiation table (its tile configurations are run-time shapes: the
// table of styles in plan/backward.cu): one row per (element type, padded head dim) of the
// mma.sync kernels, and the Hopper dK / dV kernels' rows. The build generates one file per row
// (CMakeLists.txt fna_instantiate), plan/backward.cu declares them from the same table.
#pragma once

// The fused backward's instantiations: X(element type, padded head dim), one per (dtype, head
// dim); the build generates one file per row (parallel compiles).
#define FNA_BWD_INSTANCES(X)                                                                  \
  X(__half, 64) X(__half, 128) X(__half, 256) X(__nv_bfloat16, 64) X(__nv_bfloat16, 128)     \
      X(__nv_bfloat16, 256) X(mma::F32, 64) X(mma::F32, 128) X(mma::F32, 256) X(mma::TF32, 64) \
          X(mma::TF32, 128) X(mma::TF32, 256)

// The Hopper backward's instantiations: X(dtype, padded head dim).
#define FNA_BWD_SM90_INSTANCES(X)                                                   \
  X(__half, 64) X(__half, 128) X(__half, 256) X(__nv_bfloat16, 64) X(__nv_bfloat16, 128) \
      X(__nv_bfloat16, 256)
