// In-process A/B of the cpu backend on issue 2's problem (fp32, B=1, 128x128, H=4, D=64, 13x13):
// calls alternate between two tuning settings A and B (fna::set_tuning "key=value,key=value" or "-"), so
// both see the same minute of this VM, whose speed drifts by up to 2x. Prints the medians and the
// median B/A of adjacent calls. Mode 0: forward, 1: backward, 2: A = forward, B = backward (the
// backward / forward ratio). Any cpu field of Options::tuning can be compared (e.g. cpu_band,
// cpu_panels, cpu_isa, cpu_strips, cpu_acc_rings). Build (CPU-only build dir build/bench-dev):
//   g++ -O2 -std=c++17 -Iinclude -Isrc -Itools/bench tools/experiments/cpu_tuning_ab.cpp tools/bench/buffers.cpp \
//       build/bench-dev/libfna.a -pthread -o /tmp/fna_ab
//   /tmp/fna_ab 30 0 cpu_band=1 -      # [calls per setting] [mode] [A] [B] [threads]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "buffers.h"
#include "fna/fna.h"
#include "default_problem.h"

namespace {

// The tuning a setting names ("-": the defaults); exits on a key or value set_tuning rejects.
fna::Tuning parse(const std::string& spec) {
  fna::Tuning t;
  if (spec == "-") return t;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string kv = spec.substr(pos, end - pos);
    const size_t eq = kv.find('=');
    const fna::Status st =
        fna::set_tuning(&t, kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.message.c_str());
      std::exit(1);
    }
    pos = end + 1;
  }
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const int mode = argc > 2 ? std::atoi(argv[2]) : 0;
  const std::string a = argc > 3 ? argv[3] : "-", b = argc > 4 ? argv[4] : "-";
  const fna::Tuning tune_a = parse(a), tune_b = parse(b);
  const fna::Problem p = default_problem();
  fna_bench::Buffers buf(p, fna::Device::cpu, 1);
  fna::Options opt;
  opt.backend = fna::Backend::cpu;
  opt.device = fna::Device::cpu;
  opt.scale = 0.125;
  opt.num_threads = argc > 5 ? std::atoi(argv[5]) : 0;
  auto call = [&](bool backward) {
    const auto t0 = std::chrono::steady_clock::now();
    const fna::Status st = backward ? fna::backward(p, buf.backward_args(), opt) : fna::forward(p, buf.forward_args(), opt);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.message.c_str());
      std::exit(1);
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  call(false);  // LSE / O for the backward, and warm-up
  std::vector<double> ta, tb, ratio;
  for (int i = 0; i < n + 2; ++i) {
    opt.tuning = tune_a;
    const double x = call(mode == 1);
    opt.tuning = tune_b;
    const double y = call(mode >= 1);
    if (i < 2) continue;  // warm-up pairs
    ta.push_back(x);
    tb.push_back(y);
    ratio.push_back(y / x);
  }
  std::sort(ratio.begin(), ratio.end());
  std::printf("A[%s] %.2f ms  B[%s] %.2f ms (medians of %d)  B/A %.3f (quartiles %.3f, %.3f)\n", a.c_str(),
              median(ta), b.c_str(), median(tb), n, ratio[n / 2], ratio[n / 4], ratio[3 * n / 4]);
}
