// One side of an A/B of two builds of the library in one process (see cpu_builds_ab.sh): compiled
// once per build, with -Dfna=<a namespace of its own> and -DSIDE_FN=<this side's entry point>.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fna/fna.h"
#include "../bench/default_problem.h"

// Issue 2's problem (fp32, B = 1, 128x128, H = 4, D = 64, 13x13), heads-last dense tensors at the
// given pointers. mode 0: forward, 1: backward. Returns milliseconds.
extern "C" double SIDE_FN(float* const* t, int mode) {
  const fna::Problem p = default_problem();
  const std::vector<int64_t> ext{p.batch, p.shape[0], p.shape[1], p.heads, p.dim},
      lext{p.batch, p.shape[0], p.shape[1], p.heads};
  fna::Options opt;
  opt.backend = fna::Backend::cpu;
  opt.device = fna::Device::cpu;
  opt.scale = 0.125;
  const auto t0 = std::chrono::steady_clock::now();
  fna::Status st;
  if (mode == 0) {
    fna::ForwardArgs a;
    a.q = fna::dense(t[0], ext);
    a.k = fna::dense(t[1], ext);
    a.v = fna::dense(t[2], ext);
    a.o = fna::dense(t[3], ext);
    a.lse = fna::dense(t[4], lext);
    st = fna::forward(p, a, opt);
  } else {
    fna::BackwardArgs a;
    a.q = fna::dense(t[0], ext);
    a.k = fna::dense(t[1], ext);
    a.v = fna::dense(t[2], ext);
    a.o = fna::dense(t[3], ext);
    a.lse = fna::dense(t[4], lext);
    a.d_o = fna::dense(t[5], ext);
    a.dq = fna::dense(t[6], ext);
    a.dk = fna::dense(t[7], ext);
    a.dv = fna::dense(t[8], ext);
    st = fna::backward(p, a, opt);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message.c_str());
    std::exit(1);
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
