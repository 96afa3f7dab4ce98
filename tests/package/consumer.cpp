// A program built against an installed fna (find_package(fna), fna::fna): runs a 2-D
// neighborhood attention forward and backward on the cpu backend and checks them against the
// reference backend, and checks that a bad argument comes back as a Status naming it. Exit code 0
// on success.
#include <fna/fna.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::fmax(m, std::fabs(double(a[i]) - double(b[i])));
  return a.size() == b.size() ? m : INFINITY;
}

}  // namespace

int main() {
  fna::Problem p;
  p.rank = 2;
  p.batch = 2;
  p.shape[0] = 12;
  p.shape[1] = 10;
  p.heads = p.heads_kv = 2;
  p.dim = p.dim_v = 16;
  p.kernel_size[0] = 5;
  p.kernel_size[1] = 3;
  p.dilation[1] = 2;
  p.is_causal[0] = true;
  const int64_t n = p.batch * p.tokens() * p.heads * p.dim;
  const std::vector<int64_t> ext = {p.batch, p.shape[0], p.shape[1], p.heads, p.dim};
  const std::vector<int64_t> ext_lse = {p.batch, p.shape[0], p.shape[1], p.heads};

  std::mt19937 rng(20261127);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random = [&] {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  std::vector<float> q = random(), k = random(), v = random(), d_o = random();

  struct Result {
    std::vector<float> o, lse, dq, dk, dv;
  };
  auto run = [&](fna::Backend backend, Result* r) {
    r->o.assign(size_t(n), NAN);
    r->lse.assign(size_t(n / p.dim), NAN);
    r->dq.assign(size_t(n), NAN);
    r->dk.assign(size_t(n), NAN);
    r->dv.assign(size_t(n), NAN);
    fna::Options opt;
    opt.backend = backend;
    fna::ForwardArgs f;
    f.q = fna::dense(q.data(), ext);
    f.k = fna::dense(k.data(), ext);
    f.v = fna::dense(v.data(), ext);
    f.o = fna::dense(r->o.data(), ext);
    f.lse = fna::dense(r->lse.data(), ext_lse);
    fna::Status st = fna::forward(p, f, opt);
    expect(st.ok(), std::string("forward on ") + fna::backend_name(backend) + ": " + st.message);
    fna::BackwardArgs b;
    b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.lse = f.lse;
    b.d_o = fna::dense(d_o.data(), ext);
    b.dq = fna::dense(r->dq.data(), ext);
    b.dk = fna::dense(r->dk.data(), ext);
    b.dv = fna::dense(r->dv.data(), ext);
    st = fna::backward(p, b, opt);
    expect(st.ok(), std::string("backward on ") + fna::backend_name(backend) + ": " + st.message);
  };
  Result cpu, ref;
  run(fna::Backend::cpu, &cpu);
  run(fna::Backend::reference, &ref);
  const double tol = 1e-4;
  const char* names[] = {"o", "lse", "dq", "dk", "dv"};
  const std::vector<float>* a[] = {&cpu.o, &cpu.lse, &cpu.dq, &cpu.dk, &cpu.dv};
  const std::vector<float>* b[] = {&ref.o, &ref.lse, &ref.dq, &ref.dk, &ref.dv};
  for (int i = 0; i < 5; ++i) {
    const double d = max_diff(*a[i], *b[i]);
    std::printf("%-3s max |cpu - reference| = %.3g\n", names[i], d);
    expect(d <= tol, std::string(names[i]) + ": cpu and reference differ by " + std::to_string(d));
  }

  // A window larger than its axis: an invalid_argument that names the argument.
  fna::Problem bad = p;
  bad.kernel_size[1] = 11;
  fna::ForwardArgs f;
  f.q = fna::dense(q.data(), ext);
  f.k = fna::dense(k.data(), ext);
  f.v = fna::dense(v.data(), ext);
  f.o = fna::dense(cpu.o.data(), ext);
  const fna::Status st = fna::forward(bad, f, fna::Options{});
  std::printf("bad kernel_size: %s\n", st.message.c_str());
  expect(st.code == fna::Code::invalid_argument &&
             st.message.find("kernel_size[1]") != std::string::npos,
         "kernel_size[1]=11 on an axis of 10: " + st.message);

  std::printf("fna %s, cuda-fused %s: %s\n", fna::version(),
              fna::backend_compiled(fna::Backend::cuda_fused) ? "linked" : "not built",
              failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
