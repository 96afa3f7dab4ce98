// Issue 2's CPU benchmark problem (fp32, B = 1, 128x128, H = 4, D = 64, kernel 13x13), shared by
// the A/B tools of this directory.
#pragma once

#include "fna/fna.h"

inline fna::Problem issue2_problem() {
  fna::Problem p;
  p.rank = 2;
  p.shape[0] = p.shape[1] = 128;
  p.heads = p.heads_kv = 4;
  p.dim = p.dim_v = 64;
  p.kernel_size[0] = p.kernel_size[1] = 13;
  p.dtype = fna::DType::f32;
  return p;
}
