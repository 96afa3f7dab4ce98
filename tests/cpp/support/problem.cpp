#include "support/problem.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace fna_test {

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::heads_first: return "heads_first";
    case Layout::padded: return "padded";
    case Layout::mixed: return "mixed";
  }
  return "?";
}

double Case::resolved_scale() const {
  return scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(p.dim));
}

std::string Case::str() const {
  std::ostringstream os;
  auto axes = [&](const int64_t* v) {
    os << "(";
    for (int i = 0; i < p.rank; ++i) os << (i ? "," : "") << v[i];
    os << ")";
  };
  os << "rank=" << p.rank << " B=" << p.batch << " shape=";
  axes(p.shape);
  os << " H=" << p.heads << " H_kv=" << p.heads_kv << " D=" << p.dim << " D_v=" << p.dim_v
     << " kernel=";
  axes(p.kernel_size);
  os << " dilation=";
  axes(p.dilation);
  os << " stride=";
  axes(p.stride);
  os << " causal=(";
  for (int i = 0; i < p.rank; ++i) os << (i ? "," : "") << (p.is_causal[i] ? 1 : 0);
  os << ") N_add=" << p.num_additional << " dtype=" << fna::dtype_name(p.dtype)
     << " scale=" << scale << " layout=" << layout_name(layout) << " lse=" << with_lse
     << " seed=" << seed;
  return os.str();
}

Case random_case(uint64_t case_index, int rank, int intensity, const RandomLimits& lim) {
  Rng rng(case_index * 7919 + static_cast<uint64_t>(rank) * 104729 + intensity);
  Case c;
  c.seed = rng.next();
  fna::Problem& p = c.p;
  p.rank = rank >= 1 && rank <= 3 ? rank : static_cast<int>(rng.range(1, 3));
  const int64_t max_len = static_cast<int64_t>(lim.max_axis[p.rank - 1]) * std::max(1, intensity);
  p.batch = rng.range(1, lim.max_batch);
  for (int a = 0; a < p.rank; ++a) {
    const int64_t L = rng.range(1, max_len);
    // Dilation: mostly 1, sometimes one that does not divide L.
    int64_t d = rng.chance(0.6) ? 1 : rng.range(1, std::max<int64_t>(1, std::min<int64_t>(4, L)));
    const int64_t kmax = L / d;
    int64_t K;
    const double u = rng.uniform();
    if (u < 0.1) K = 1;
    else if (u < 0.2) K = kmax;  // full (sub-)axis
    else K = rng.range(1, kmax);
    const double v = rng.uniform();
    int64_t s = v < 0.5 ? 1 : (v < 0.65 ? K : rng.range(1, K));
    p.shape[a] = L;
    p.dilation[a] = d;
    p.kernel_size[a] = K;
    p.stride[a] = s;
    p.is_causal[a] = lim.allow_causal && rng.chance(0.3);
  }
  p.heads_kv = rng.range(1, lim.max_heads_kv);
  p.heads = p.heads_kv * rng.range(1, lim.max_group);
  const int64_t dims[] = {1, 2, 3, 4, 7, 8, 16, 17, 32, 33};
  const int64_t max_dim = lim.max_dim * std::max(1, intensity);
  auto pick_dim = [&]() {
    int64_t dd = rng.chance(0.5) ? dims[rng.range(0, 9)] : rng.range(1, max_dim);
    return std::min(dd, max_dim);
  };
  p.dim = pick_dim();
  p.dim_v = rng.chance(0.5) ? p.dim : pick_dim();
  p.num_additional =
      lim.allow_additional && lim.max_additional > 0 && rng.chance(0.4) ? rng.range(1, lim.max_additional) : 0;
  p.dtype = lim.dtypes[rng.range(0, static_cast<int64_t>(lim.dtypes.size()) - 1)];
  c.scale = rng.chance(0.7) ? -1.0 : 0.05 + rng.uniform();
  c.layout = lim.allow_strided_layouts ? static_cast<Layout>(rng.range(0, 3)) : Layout::contiguous;
  c.with_lse = rng.chance(0.8);
  return c;
}

fna::Problem random_problem(uint64_t case_index, int rank, int intensity, const RandomLimits& lim) {
  return random_case(case_index, rank, intensity, lim).p;
}

SpecWindow spec_window(int64_t L, int64_t K, int64_t d, int64_t s, bool causal, int64_t x) {
  const int64_t g = x % d, i = x / d;
  const int64_t Lg = (L - g + d - 1) / d;
  if (causal) {
    const int64_t leader = std::min((i / s) * s + s - 1, Lg - 1);
    const int64_t start = std::max<int64_t>(leader - K + 1, 0);
    const int64_t end = std::min(i + 1, Lg);
    return {g, start, end};
  }
  const int64_t left = K / 2, right = K - 1 - left;
  const int64_t leader = std::min((i / s) * s + s / 2, Lg - 1);
  const int64_t start =
      std::max<int64_t>(leader - left, 0) + (leader + right >= Lg ? Lg - right - leader - 1 : 0);
  return {g, start, start + K};
}

bool spec_is_neighbor(int64_t L, int64_t K, int64_t d, int64_t s, bool causal, int64_t x,
                      int64_t y) {
  const SpecWindow w = spec_window(L, K, d, s, causal, x);
  if (y % d != w.group) return false;
  const int64_t j = y / d;
  return j >= w.start && j < w.end;
}

int spec_window_union(int64_t L, int64_t K, int64_t d, int64_t s, bool causal, int g, int i0,
                      int i1, int* first) {
  const int lg = static_cast<int>((L - g + d - 1) / d);
  int lo = lg, hi = -1;
  for (int i = i0; i < i1; ++i)
    for (int j = 0; j < lg; ++j)
      if (spec_is_neighbor(L, K, d, s, causal, int64_t(i) * d + g, int64_t(j) * d + g)) {
        lo = std::min(lo, j);
        hi = std::max(hi, j);
      }
  *first = lo;
  return hi - lo + 1;
}

namespace {
void unflatten(const fna::Problem& p, int64_t t, int64_t* c) {
  for (int a = p.rank - 1; a >= 0; --a) {
    c[a] = t % p.shape[a];
    t /= p.shape[a];
  }
}
}  // namespace

bool spec_is_neighbor(const fna::Problem& p, int64_t qt, int64_t kt) {
  int64_t qc[3], kc[3];
  unflatten(p, qt, qc);
  unflatten(p, kt, kc);
  for (int a = 0; a < p.rank; ++a)
    if (!spec_is_neighbor(p.shape[a], p.kernel_size[a], p.dilation[a], p.stride[a], p.is_causal[a],
                          qc[a], kc[a]))
      return false;
  return true;
}

std::vector<int64_t> spec_slots(const fna::Problem& p, int64_t qt) {
  int64_t qc[3];
  unflatten(p, qt, qc);
  SpecWindow w[3];
  for (int a = 0; a < p.rank; ++a)
    w[a] = spec_window(p.shape[a], p.kernel_size[a], p.dilation[a], p.stride[a], p.is_causal[a],
                       qc[a]);
  const int64_t W = p.window();
  std::vector<int64_t> out(W);
  for (int64_t slot = 0; slot < W; ++slot) {
    int64_t r = slot, key = 0;
    int64_t off[3];
    for (int a = p.rank - 1; a >= 0; --a) {
      off[a] = r % p.kernel_size[a];
      r /= p.kernel_size[a];
    }
    bool member = true;
    for (int a = 0; a < p.rank; ++a) {
      const int64_t j = w[a].start + off[a];
      if (j >= w[a].end) member = false;
      key = key * p.shape[a] + (j * p.dilation[a] + w[a].group);
    }
    out[slot] = member ? key : -1;
  }
  return out;
}

}  // namespace fna_test
