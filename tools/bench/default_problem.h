// fna-bench's default problem, issue 2's CPU target (fp32, B = 1, 128x128, H = 4, D = 64, kernel
// 13x13); also the problem of the A/B tools in tools/cpu_peak.
#pragma once

#include "fna/fna.h"

inline fna::Problem default_problem() {
  fna::Problem p;
  p.rank = 2;
  p.batch = 1;
  p.shape[0] = p.shape[1] = 128;
  p.heads = p.heads_kv = 4;
  p.dim = p.dim_v = 64;
  p.kernel_size[0] = p.kernel_size[1] = 13;
  p.dtype = fna::DType::f32;
  return p;
}
