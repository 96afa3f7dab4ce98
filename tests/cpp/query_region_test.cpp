// Query regions (Problem::query_offset / query_shape) on the CPU backends, reference and cpu.
// The queries are a box of the key grid; Q, O, dO, dQ, LSE and d_LSE have the box's extents, K, V
// and their gradients the grid's, and every query's window is that of its grid coordinate
// (docs/semantics.md section 1). So, for each backend:
//   forward:  the region call's O and LSE are the region's rows of the whole-grid call's;
//   backward: the region call's dQ is the region's rows of the whole-grid backward's, and dK, dV
//             (and the additional keys' gradients) are the whole-grid backward's with dO and
//             d_lse zero outside the region (queries outside it contribute nothing).
// The reference must match exactly: it computes each query row alone, in float64, summing the
// keys of dK / dV in token order either way (the whole grid's extra rows add exact zeros).
// The cpu backend: O, LSE and dQ exactly too, dK / dV and the additional keys' gradients to a
// tight tolerance. A region's tiles start at its first query, not at the grid's, so the kernels'
// groups of four queries sharing a span of vector lanes (cpu/kernels_impl.h: next_group) are
// other groups, and a query's window sits at another lane offset. Its own sums do not change:
// masked lanes hold exact zeros, and a lane-wise accumulation followed by the halving fold
// (hsum) pairs elements by their positions modulo powers of two, which a shift keeps, so a
// query's max, softmax sum, P V and dS K are the same floats in the same association. dK / dV
// (and d_add) however sum the contributions of several queries per key, grouped by tile and
// worker: another grouping rounds differently (observed up to ~2e-7 of the largest gradient in
// float32; bound 1e-5, the float32 criterion of docs/semantics.md section 4; bfloat16 outputs an
// ulp more).
// And the cpu backend's region results against the reference's region results, by the
// docs/semantics.md section 4 criterion the cpu-vs-reference tests use (cpu_backend_test.cpp).
// Inputs are random (never zero), each case seeded; ranks 1-3 with dilation, stride, causal axes,
// GQA, dim_v != dim, additional keys, float32 and bfloat16, regions at the grid's borders and
// strictly inside. Then the validation of regions at the API boundary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/tile.h"
#include "support/check.h"
#include "support/kernel_sets.h"

namespace fna_test {
namespace {

// ---- cases --------------------------------------------------------------------------------------

enum Kind : int {
  kStart = 0,   // every axis: offset 0, extent < L (touches the start borders)
  kEnd = 1,     // every axis: offset > 0 up to the end (query_shape 0 or L - offset)
  kInside = 2,  // every axis: strictly inside (offset >= 1, offset + extent <= L - 1)
  kMixed = 3,   // each axis one of the above or the whole axis
  kKinds = 4,
};
const char* kind_name(int k) {
  static const char* names[] = {"start", "end", "inside", "mixed"};
  return names[k];
}

struct RegionCase {
  Case c;  // the whole grid: c.p has no region
  int64_t off[fna::kMaxRank] = {0, 0, 0};
  int64_t shape[fna::kMaxRank] = {0, 0, 0};  // query_shape as passed (0: the rest of the axis)
  bool with_d_lse = false;
  int kind = kStart;
  int64_t ext(int a) const { return shape[a] != 0 ? shape[a] : c.p.shape[a] - off[a]; }
  fna::Problem region() const {
    fna::Problem p = c.p;
    for (int a = 0; a < fna::kMaxRank; ++a) {
      p.query_offset[a] = off[a];
      p.query_shape[a] = shape[a];
    }
    return p;
  }
  std::string str() const {
    std::ostringstream os;
    os << c.str() << " query_offset=(";
    for (int a = 0; a < c.p.rank; ++a) os << (a ? "," : "") << off[a];
    os << ") query_shape=(";
    for (int a = 0; a < c.p.rank; ++a) os << (a ? "," : "") << shape[a];
    os << ") (" << kind_name(kind) << ") d_lse=" << with_d_lse;
    return os.str();
  }
};

// Case `index` of (rank, dtype, kind): every case has GQA and dim_v != dim; the axis index % rank
// is dilated, the axis (index + 1) % rank strided, the axis (index + 2) % rank causal in half of
// the cases; even cases have additional keys, odd ones strided layouts; two cases in three give a
// d_lse.
// larger: longer axes (rank 1 up to 200, rank 2 up to 40 x 40, rank 3 up to 12^3), so that the cpu
// backend's bands, rings and strips span many lines and tiles.
RegionCase region_case(uint64_t index, int rank, fna::DType dtype, int kind, bool larger = false) {
  Rng rng(0x9e6100ull + index * 7919 + static_cast<uint64_t>(rank) * 104729 +
          static_cast<uint64_t>(kind) * 1299709 + (dtype == fna::DType::bf16 ? 15485863 : 0) +
          (larger ? 32452843 : 0));
  RegionCase rc;
  rc.kind = kind;
  Case& c = rc.c;
  c.seed = rng.next();
  c.layout = index % 2 ? Layout::mixed : Layout::contiguous;
  c.with_lse = true;
  c.scale = index % 3 == 2 ? 0.3 : -1.0;
  rc.with_d_lse = index % 3 != 0;
  fna::Problem& p = c.p;
  p.rank = rank;
  p.dtype = dtype;
  p.batch = rng.range(1, 2);
  p.heads_kv = rng.range(1, 2);
  p.heads = p.heads_kv * rng.range(2, 3);
  p.dim = rng.range(3, 20);
  p.dim_v = p.dim + (rng.chance(0.5) ? 1 : -1) * rng.range(1, 6);
  if (p.dim_v < 1) p.dim_v = p.dim + 2;
  p.num_additional = index % 2 == 0 ? rng.range(1, 3) : 0;
  // Rank 1 up to 90 tokens: a region of several 32-query cpu tiles along the axis.
  const int64_t lo_len[3] = {20, 7, 5}, hi_len[3] = {90, 16, 8};
  const int64_t lo_big[3] = {100, 24, 9}, hi_big[3] = {200, 40, 12};
  for (int a = 0; a < rank; ++a) {
    const int64_t L = larger ? rng.range(lo_big[rank - 1], hi_big[rank - 1])
                             : rng.range(lo_len[rank - 1], hi_len[rank - 1]);
    int64_t d = a == static_cast<int>(index % rank) ? rng.range(2, 3) : rng.range(1, 2);
    if (L / d < 2) d = 1;
    const int64_t K = rng.range(2, std::min<int64_t>(7, L / d));
    p.shape[a] = L;
    p.dilation[a] = d;
    p.kernel_size[a] = K;
    p.stride[a] = a == static_cast<int>((index + 1) % rank) ? rng.range(2, K)
                                                           : (rng.chance(0.3) ? rng.range(1, K) : 1);
    p.is_causal[a] = a == static_cast<int>((index + 2) % rank) ? index % 4 < 2 : rng.chance(0.2);
  }
  bool whole = true;
  for (int a = 0; a < rank; ++a) {
    const int64_t L = p.shape[a];
    const int k = kind == kMixed ? static_cast<int>(rng.range(0, 3)) : kind;
    switch (k) {
      case kStart:
        rc.off[a] = 0;
        rc.shape[a] = rng.range(1, L - 1);
        break;
      case kEnd:
        rc.off[a] = rng.range(1, L - 1);
        rc.shape[a] = rng.chance(0.5) ? 0 : L - rc.off[a];
        break;
      case kInside:
        rc.off[a] = rng.range(1, L - 2);
        rc.shape[a] = rng.range(1, L - 1 - rc.off[a]);
        break;
      default:  // the whole axis
        rc.off[a] = 0;
        rc.shape[a] = rng.chance(0.5) ? 0 : L;
    }
    whole = whole && rc.off[a] == 0 && rc.ext(a) == L;
  }
  if (whole) {  // (kMixed) a region after all: axis 0 strictly inside
    rc.off[0] = 1;
    rc.shape[0] = p.shape[0] - 2;
  }
  return rc;
}

// The cases of one rank: both dtypes, every kind, `per` cases each.
std::vector<RegionCase> cases(int rank, int per = 4, bool larger = false) {
  std::vector<RegionCase> v;
  for (fna::DType dt : {fna::DType::f32, fna::DType::bf16})
    for (int kind = 0; kind < kKinds; ++kind)
      for (int i = 0; i < per; ++i)
        v.push_back(region_case(static_cast<uint64_t>(i + per * kind), rank, dt, kind, larger));
  return v;
}

// ---- region tensors -----------------------------------------------------------------------------

// Logical indices, in a grid-shaped [B, L.., H, X] tensor (X = last; last < 0: [B, L.., H], the
// LSE), of the region tensor's elements [B, E.., H, X] in their logical order.
std::vector<int64_t> region_elements(const RegionCase& rc, int64_t heads, int64_t last) {
  const fna::Problem& p = rc.c.p;
  const int64_t X = last < 0 ? 1 : last;
  int64_t n = 1;
  for (int a = 0; a < p.rank; ++a) n *= rc.ext(a);
  const int64_t N = p.tokens();
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(p.batch * n * heads * X));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t r = 0; r < n; ++r) {
      int64_t i[fna::kMaxRank] = {0, 0, 0}, rest = r;
      for (int a = p.rank - 1; a >= 0; --a) {
        i[a] = rest % rc.ext(a);
        rest /= rc.ext(a);
      }
      int64_t t = 0;
      for (int a = 0; a < p.rank; ++a) t = t * p.shape[a] + rc.off[a] + i[a];
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t x = 0; x < X; ++x) out.push_back(((b * N + t) * heads + h) * X + x);
    }
  return out;
}

std::vector<double> gather(const std::vector<double>& v, const std::vector<int64_t>& idx) {
  std::vector<double> out;
  out.reserve(idx.size());
  for (int64_t i : idx) out.push_back(v[static_cast<size_t>(i)]);
  return out;
}

// A region-shaped tensor of a Q role (the case's layout), NaN until written.
HostTensor region_tensor(const RegionCase& rc, fna::DType dt, int64_t heads, int64_t last,
                         uint64_t seed) {
  const fna::Problem& p = rc.c.p;
  std::vector<int64_t> e{p.batch};
  for (int a = 0; a < p.rank; ++a) e.push_back(rc.ext(a));
  e.push_back(heads);
  if (last >= 0) e.push_back(last);
  return HostTensor::make(dt, e, rc.c.layout, p.rank + 1, seed);
}

// The region's rows of a grid tensor, into a region tensor.
void copy_rows(const HostTensor& grid, const std::vector<int64_t>& idx, HostTensor* region) {
  for (size_t i = 0; i < idx.size(); ++i) region->set(static_cast<int64_t>(i), grid.get(idx[i]));
}

// Zero outside the region's rows.
void zero_outside(const std::vector<int64_t>& idx, HostTensor* grid) {
  std::vector<char> in(static_cast<size_t>(grid->numel()), 0);
  for (int64_t i : idx) in[static_cast<size_t>(i)] = 1;
  for (int64_t i = 0; i < grid->numel(); ++i)
    if (!in[static_cast<size_t>(i)]) grid->set(i, 0.0);
}

// What a forward and backward pair returns (region rows for the Q roles; the grid's K roles).
struct Results {
  std::vector<double> o, lse, dq, dk, dv, d_add_k, d_add_v;
};

// The whole grid's tensors of case rc in dtype dt (t.c.p.dtype), with a d_lse where rc has one.
ProblemTensors grid_tensors(const RegionCase& rc) {
  ProblemTensors t(rc.c);
  t.c.with_lse = true;
  if (rc.with_d_lse) t.make_d_lse();
  return t;
}

// The region call: Q, dO, d_lse the region's rows of t's, K, V (and additional) t's; forward, then
// backward from the forward's O and LSE. Results in logical order.
fna::Status run_region(const RegionCase& rc, const ProblemTensors& t, const fna::Options& opt,
                       Results* out) {
  const fna::Problem& g = t.c.p;
  fna::Problem p = rc.region();
  p.dtype = g.dtype;
  const std::vector<int64_t> iq = region_elements(rc, g.heads, g.dim),
                             io = region_elements(rc, g.heads, g.dim_v),
                             il = region_elements(rc, g.heads, -1);
  Rng rng(t.c.seed ^ 0x2e6109ull);
  HostTensor q = region_tensor(rc, g.dtype, g.heads, g.dim, rng.next());
  HostTensor o = region_tensor(rc, g.dtype, g.heads, g.dim_v, rng.next());
  HostTensor lse = region_tensor(rc, fna::DType::f32, g.heads, -1, rng.next());
  HostTensor d_o = region_tensor(rc, g.dtype, g.heads, g.dim_v, rng.next());
  HostTensor dq = region_tensor(rc, g.dtype, g.heads, g.dim, rng.next());
  HostTensor d_lse;
  copy_rows(t.q, iq, &q);
  copy_rows(t.d_o, io, &d_o);
  if (!t.d_lse.empty()) {
    d_lse = region_tensor(rc, fna::DType::f32, g.heads, -1, rng.next());
    copy_rows(t.d_lse, il, &d_lse);
  }
  HostTensor k = t.k, v = t.v, add_k = t.add_k, add_v = t.add_v;
  HostTensor dk = t.dk, dv = t.dv, d_add_k = t.d_add_k, d_add_v = t.d_add_v;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (HostTensor* x : {&dk, &dv, &d_add_k, &d_add_v})
    if (!x->empty()) x->fill(nan);
  fna::ForwardArgs fa;
  fa.q = q.ref();
  fa.k = k.ref();
  fa.v = v.ref();
  fa.o = o.ref();
  fa.lse = lse.ref();
  fa.add_k = add_k.ref();
  fa.add_v = add_v.ref();
  fna::Status st = fna::forward(p, fa, opt);
  if (!st.ok()) return st;
  fna::BackwardArgs ba;
  ba.q = q.ref();
  ba.k = k.ref();
  ba.v = v.ref();
  ba.o = o.ref();
  ba.d_o = d_o.ref();
  ba.lse = lse.ref();
  ba.d_lse = d_lse.ref();
  ba.dq = dq.ref();
  ba.dk = dk.ref();
  ba.dv = dv.ref();
  ba.add_k = add_k.ref();
  ba.add_v = add_v.ref();
  ba.d_add_k = d_add_k.ref();
  ba.d_add_v = d_add_v.ref();
  st = fna::backward(p, ba, opt);
  if (!st.ok()) return st;
  *out = {o.to_double(), lse.to_double(), dq.to_double(), dk.to_double(), dv.to_double(),
          d_add_k.to_double(), d_add_v.to_double()};
  return st;
}

// The whole-grid calls: forward (its region rows), then backward with dO and d_lse zero outside
// the region (dQ's region rows; dK, dV, additional whole).
fna::Status run_whole(const RegionCase& rc, ProblemTensors t, const fna::Options& opt,
                      Results* out) {
  const fna::Problem& g = t.c.p;
  const std::vector<int64_t> iq = region_elements(rc, g.heads, g.dim),
                             io = region_elements(rc, g.heads, g.dim_v),
                             il = region_elements(rc, g.heads, -1);
  t.poison_outputs();
  fna::Status st = fna::forward(g, t.forward_args(), opt);
  if (!st.ok()) return st;
  zero_outside(io, &t.d_o);
  if (!t.d_lse.empty()) zero_outside(il, &t.d_lse);
  st = fna::backward(g, t.backward_args(), opt);
  if (!st.ok()) return st;
  *out = {gather(t.o.to_double(), io), gather(t.lse.to_double(), il), gather(t.dq.to_double(), iq),
          t.dk.to_double(), t.dv.to_double(), t.d_add_k.to_double(), t.d_add_v.to_double()};
  return st;
}

// ---- comparisons --------------------------------------------------------------------------------

// Bitwise-equal values (NaN never equal).
Check same(const std::string& name, const std::vector<double>& got,
           const std::vector<double>& want) {
  Check c;
  std::ostringstream os;
  int64_t bad = 0, first = -1;
  if (got.size() != want.size()) {
    c.ok = false;
    os << "  " << name << ": size " << got.size() << " != " << want.size() << "\n";
  } else {
    for (size_t i = 0; i < got.size(); ++i)
      if (!(got[i] == want[i])) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++bad;
      }
    c.ok = bad == 0;
    os << "  " << name << ": " << bad << " of " << got.size() << " differ";
    if (first >= 0) os << " (first at " << first << ": " << got[first] << " vs " << want[first] << ")";
    os << "\n";
  }
  c.what = os.str();
  return c;
}

// |got - want| <= 2 u |want| + rel * max(floor, max|want|) elementwise (u: the output dtype's unit
// roundoff for bfloat16 outputs, whose roundings of nearly equal float32 values may differ by an
// ulp; 0 for float32 outputs). NaN never passes.
Check near(const std::string& name, const std::vector<double>& got, const std::vector<double>& want,
           fna::DType out_dtype, double rel, double floor = 0) {
  Check c;
  std::ostringstream os;
  if (got.size() != want.size()) {
    c.ok = false;
    os << "  " << name << ": size " << got.size() << " != " << want.size() << "\n";
    c.what = os.str();
    return c;
  }
  double mag = floor;
  for (double w : want) mag = std::max(mag, std::fabs(w));
  const double u = out_dtype == fna::DType::f32 ? 0.0 : unit_roundoff(out_dtype);
  double worst = 0;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]), bound = 2 * u * std::fabs(want[i]) + rel * mag;
    if (!(e <= bound)) {  // (NaN fails)
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
    if (e == e) worst = std::max(worst, e / std::max(mag, 1e-300));
  }
  c.ok = bad == 0;
  c.err = worst;
  os << "  " << name << ": max |got - want| / max|want| = " << worst << ", " << bad << " of "
     << got.size() << " beyond the bound";
  if (first >= 0) os << " (first at " << first << ": " << got[first] << " vs " << want[first] << ")";
  os << "\n";
  c.what = os.str();
  return c;
}

double max_abs(std::initializer_list<const std::vector<double>*> vs) {
  double m = 0;
  for (const auto* v : vs)
    for (double x : *v)
      if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

// ---- cpu tunings --------------------------------------------------------------------------------

// The cpu backend's options for case number i with kernel set isa: threads 1-3, both panel
// stores, line order (band 1) in some, strip order forced on in some rank-2 cases, deterministic
// in some.
fna::Options cpu_options(const RegionCase& rc, int i, const std::string& isa) {
  fna::Options o = options_for(rc.c, fna::Backend::cpu, 1 + i % 3);
  EXPECT_TRUE(fna::set_tuning(&o.tuning, "cpu_isa", isa).ok());
  o.tuning.cpu_panels = i % 2 ? fna::CpuPanels::shared : fna::CpuPanels::rings;
  if (i % 4 == 3) o.tuning.cpu_band = 1;
  if (rc.c.p.rank == 2 && i % 3 == 1) o.tuning.cpu_strips = fna::Switch::on;
  o.deterministic = i % 5 == 4;
  return o;
}

class QueryRegion : public ::testing::TestWithParam<int> {
 protected:
  int rank() const { return GetParam(); }
};

// ---- the reference: region rows of the whole grid, exactly -----------------------------------

TEST_P(QueryRegion, ReferenceEqualsWholeGridRows) {
  const std::vector<RegionCase> cs = cases(rank());
  for (size_t i = 0; i < cs.size(); ++i) {
    const RegionCase& rc = cs[i];
    SCOPED_TRACE("case " + std::to_string(i) + ": " + rc.str());
    const ProblemTensors t = grid_tensors(rc);
    const fna::Options opt = options_for(rc.c, fna::Backend::reference);
    Results reg, whole;
    fna::Status st = run_region(rc, t, opt, &reg);
    ASSERT_TRUE(st.ok()) << st.message;
    st = run_whole(rc, t, opt, &whole);
    ASSERT_TRUE(st.ok()) << st.message;
    Check c = same("output", reg.o, whole.o);
    c.merge(same("lse", reg.lse, whole.lse));
    c.merge(same("d_query", reg.dq, whole.dq));
    c.merge(same("d_key", reg.dk, whole.dk));
    c.merge(same("d_value", reg.dv, whole.dv));
    if (rc.c.p.num_additional > 0) {
      c.merge(same("d_additional_keys", reg.d_add_k, whole.d_add_k));
      c.merge(same("d_additional_values", reg.d_add_v, whole.d_add_v));
    }
    EXPECT_TRUE(c.ok) << c.str();
  }
}

// ---- cpu: region rows of its own whole-grid calls (O, LSE, dQ exactly; dK / dV tightly) ----------

// Case rc (number i) on the cpu backend with each kernel set: the region call against the region
// rows of the whole-grid calls.
void check_cpu_whole(const RegionCase& rc, int i) {
  const ProblemTensors t = grid_tensors(rc);
  const fna::DType dt = rc.c.p.dtype;
  for (const std::string& isa : kernel_sets()) {
    SCOPED_TRACE("case " + std::to_string(i) + " " + isa + ": " + rc.str());
    const fna::Options opt = cpu_options(rc, i, isa);
    Results reg, whole;
    fna::Status st = run_region(rc, t, opt, &reg);
    ASSERT_TRUE(st.ok()) << st.message;
    st = run_whole(rc, t, opt, &whole);
    ASSERT_TRUE(st.ok()) << st.message;
    // Per query: the same floats (see the top of the file).
    Check c = same("output", reg.o, whole.o);
    c.merge(same("lse", reg.lse, whole.lse));
    c.merge(same("d_query", reg.dq, whole.dq));
    // Sums over queries, grouped otherwise: judged on the largest gradient of the call, as
    // check_backward does.
    const double mag = max_abs({&whole.dq, &whole.dk, &whole.dv, &whole.d_add_k, &whole.d_add_v});
    c.merge(near("d_key", reg.dk, whole.dk, dt, 1e-5, mag));
    c.merge(near("d_value", reg.dv, whole.dv, dt, 1e-5, mag));
    if (rc.c.p.num_additional > 0) {
      c.merge(near("d_additional_keys", reg.d_add_k, whole.d_add_k, dt, 1e-5, mag));
      c.merge(near("d_additional_values", reg.d_add_v, whole.d_add_v, dt, 1e-5, mag));
    }
    EXPECT_TRUE(c.ok) << c.str();
  }
}

// ---- cpu against the reference, both with the region ------------------------------------------

// Case rc (number i): the cpu backend's region call with each kernel set against the reference's
// region call, by the docs/semantics.md section 4 criterion.
void check_cpu_reference(const RegionCase& rc, int i) {
  const ProblemTensors t = grid_tensors(rc);
  const fna::DType dt = rc.c.p.dtype;
  // The reference on float32 copies of the same inputs (its float64 result is not rounded to
  // bfloat16), as cpu_backend_test.cpp runs it.
  Results ref;
  {
    SCOPED_TRACE("reference, case " + std::to_string(i) + ": " + rc.str());
    const fna::Status st = run_region(rc, t.as_f32(), options_for(rc.c, fna::Backend::reference), &ref);
    ASSERT_TRUE(st.ok()) << st.message;
  }
  // The plain bfloat16 computation of the section 4 criterion: the whole grid's (dO and d_lse
  // zero outside the region for the backward), its region rows.
  const fna::Problem& g = rc.c.p;
  const std::vector<int64_t> iq = region_elements(rc, g.heads, g.dim),
                             io = region_elements(rc, g.heads, g.dim_v),
                             il = region_elements(rc, g.heads, -1);
  NaiveForward nf;
  NaiveBackward nb;
  if (dt != fna::DType::f32) {
    nf = naive_forward(t);
    nf.o = gather(nf.o, io);
    nf.lse = gather(nf.lse, il);
    ProblemTensors tz = t;
    zero_outside(io, &tz.d_o);
    if (!tz.d_lse.empty()) zero_outside(il, &tz.d_lse);
    nb = naive_backward(tz);
    nb.dq = gather(nb.dq, iq);
  }
  Tolerance tol;
  tol.magnitude_floor = max_abs({&ref.dq, &ref.dk, &ref.dv, &ref.d_add_k, &ref.d_add_v});
  for (const std::string& isa : kernel_sets()) {
    SCOPED_TRACE("case " + std::to_string(i) + " " + isa + ": " + rc.str());
    Results got;
    const fna::Status st = run_region(rc, t, cpu_options(rc, i + 1, isa), &got);
    ASSERT_TRUE(st.ok()) << st.message;
    Check c = compare("output", got.o, ref.o, nf.o, dt);
    c.merge(compare("lse", got.lse, ref.lse, nf.lse, dt));
    c.merge(compare("d_query", got.dq, ref.dq, nb.dq, dt, tol));
    c.merge(compare("d_key", got.dk, ref.dk, nb.dk, dt, tol));
    c.merge(compare("d_value", got.dv, ref.dv, nb.dv, dt, tol));
    if (g.num_additional > 0) {
      c.merge(compare("d_additional_keys", got.d_add_k, ref.d_add_k, nb.d_add_k, dt, tol));
      c.merge(compare("d_additional_values", got.d_add_v, ref.d_add_v, nb.d_add_v, dt, tol));
    }
    EXPECT_TRUE(c.ok) << c.str();
  }
}

TEST_P(QueryRegion, CpuMatchesWholeGridRows) {
  const std::vector<RegionCase> cs = cases(rank());
  for (size_t i = 0; i < cs.size(); ++i) {
    check_cpu_whole(cs[i], static_cast<int>(i));
    if (HasFatalFailure()) return;
  }
}

TEST_P(QueryRegion, CpuMatchesReference) {
  const std::vector<RegionCase> cs = cases(rank());
  for (size_t i = 0; i < cs.size(); ++i) {
    check_cpu_reference(cs[i], static_cast<int>(i));
    if (HasFatalFailure()) return;
  }
}

// Both cpu checks on longer axes: many lines and several tiles per line, so that the region
// restricts the bands, rings, strips and tiles the cpu backend walks.
TEST_P(QueryRegion, CpuLargerGrids) {
  const std::vector<RegionCase> cs = cases(rank(), 1, true);
  for (size_t i = 0; i < cs.size(); ++i) {
    check_cpu_whole(cs[i], static_cast<int>(i));
    if (HasFatalFailure()) return;
    check_cpu_reference(cs[i], static_cast<int>(i));
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, QueryRegion, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "rank" + std::to_string(info.param);
                         });

// ---- validation ---------------------------------------------------------------------------------

// A valid 2-D problem (8 x 6) with a region; each test breaks one field.
RegionCase valid_region() {
  RegionCase rc;
  fna::Problem& p = rc.c.p;
  p.rank = 2;
  p.batch = 2;
  p.shape[0] = 8;
  p.shape[1] = 6;
  p.heads = 4;
  p.heads_kv = 2;
  p.dim = 8;
  p.dim_v = 4;
  p.kernel_size[0] = 3;
  p.kernel_size[1] = 5;
  p.dilation[0] = 2;
  p.num_additional = 2;
  p.dtype = fna::DType::f32;
  rc.c.seed = 11;
  rc.off[0] = 2;
  rc.off[1] = 1;
  rc.shape[0] = 3;
  rc.shape[1] = 4;
  return rc;
}

// Forward and backward of problem p (whose region fields may be broken) with region tensors of
// rc's (valid) region, on `backend`: both must answer invalid_argument with a message holding
// `needle`, and leave the outputs untouched.
void expect_rejected(const RegionCase& rc, const fna::Problem& p, fna::Backend backend,
                     const std::string& needle) {
  SCOPED_TRACE(std::string(fna::backend_name(backend)) + ": " + rc.str());
  ProblemTensors t = grid_tensors(rc);
  const fna::Problem& g = t.c.p;
  Rng rng(3);
  HostTensor q = region_tensor(rc, g.dtype, g.heads, g.dim, rng.next());
  HostTensor o = region_tensor(rc, g.dtype, g.heads, g.dim_v, rng.next());
  HostTensor lse = region_tensor(rc, fna::DType::f32, g.heads, -1, rng.next());
  HostTensor d_o = region_tensor(rc, g.dtype, g.heads, g.dim_v, rng.next());
  HostTensor dq = region_tensor(rc, g.dtype, g.heads, g.dim, rng.next());
  q.fill_random(1);
  d_o.fill_random(2);
  lse.fill_random(3);
  fna::ForwardArgs fa = t.forward_args();
  fa.q = q.ref();
  fa.o = o.ref();
  fa.lse = lse.ref();
  const fna::Options opt = options_for(rc.c, backend);
  fna::Status st = fna::forward(p, fa, opt);
  EXPECT_EQ(st.code, fna::Code::invalid_argument) << st.message;
  EXPECT_NE(st.message.find(needle), std::string::npos) << st.message;
  for (double x : o.to_double()) ASSERT_TRUE(std::isnan(x)) << "forward wrote its output";
  o.fill_random(4);
  fna::BackwardArgs ba = t.backward_args();
  ba.q = q.ref();
  ba.o = o.ref();
  ba.lse = lse.ref();
  ba.d_o = d_o.ref();
  ba.dq = dq.ref();
  st = fna::backward(p, ba, opt);
  EXPECT_EQ(st.code, fna::Code::invalid_argument) << st.message;
  EXPECT_NE(st.message.find(needle), std::string::npos) << st.message;
  for (double x : dq.to_double()) ASSERT_TRUE(std::isnan(x)) << "backward wrote d_query";
  for (double x : t.dk.to_double()) ASSERT_TRUE(std::isnan(x)) << "backward wrote d_key";
}

TEST(QueryRegionValidation, ValidRegionRuns) {
  const RegionCase rc = valid_region();
  for (fna::Backend b : {fna::Backend::reference, fna::Backend::cpu, fna::Backend::automatic}) {
    Results r;
    const fna::Status st = run_region(rc, grid_tensors(rc), options_for(rc.c, b), &r);
    EXPECT_TRUE(st.ok()) << fna::backend_name(b) << ": " << st.message;
  }
}

TEST(QueryRegionValidation, OffsetOutOfRange) {
  const RegionCase rc = valid_region();
  for (fna::Backend b : {fna::Backend::reference, fna::Backend::cpu}) {
    fna::Problem p = rc.region();
    p.query_offset[1] = 6;  // == shape[1]
    expect_rejected(rc, p, b, "query_offset[1]=6 must be in [0, shape[1]=6)");
    p = rc.region();
    p.query_offset[0] = -1;
    expect_rejected(rc, p, b, "query_offset[0]=-1 must be in [0, shape[0]=8)");
  }
}

TEST(QueryRegionValidation, ShapeTooLarge) {
  const RegionCase rc = valid_region();
  for (fna::Backend b : {fna::Backend::reference, fna::Backend::cpu}) {
    fna::Problem p = rc.region();
    p.query_shape[0] = 7;  // offset 2 + 7 > 8
    expect_rejected(rc, p, b, "query_shape[0]=7 must be in [1, shape[0] - query_offset[0] = 6]");
    p = rc.region();
    p.query_shape[1] = -2;
    expect_rejected(rc, p, b, "query_shape[1]=-2");
  }
}

// The unfused operators take no region: qk_forward (and the others) answer invalid_argument
// naming query_offset / query_shape, and write nothing.
TEST(QueryRegionValidation, UnfusedRejectsRegion) {
  const RegionCase rc = valid_region();
  const fna::Problem p = rc.region();
  for (fna::Backend b : {fna::Backend::reference, fna::Backend::cpu}) {
    SCOPED_TRACE(fna::backend_name(b));
    ProblemTensors t(rc.c);  // grid-shaped: the region is rejected before the tensors are checked
    const fna::Options opt = options_for(rc.c, b);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    t.attn.fill(nan);
    fna::Status st = fna::qk_forward(p, t.qk_args(), opt);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << st.message;
    EXPECT_NE(st.message.find("query_offset / query_shape"), std::string::npos) << st.message;
    EXPECT_NE(st.message.find("unfused (qk / av)"), std::string::npos) << st.message;
    for (double x : t.attn.to_double()) ASSERT_TRUE(std::isnan(x)) << "qk_forward wrote attn";
    st = fna::av_forward(p, t.av_args(), opt);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << st.message;
    EXPECT_NE(st.message.find("query_offset / query_shape"), std::string::npos) << st.message;
    st = fna::qk_backward(p, t.qk_backward_args(), opt);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << st.message;
    st = fna::av_backward(p, t.av_backward_args(), opt);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << st.message;
    // The whole grid given explicitly is no region: the unfused operators take it.
    fna::Problem whole = rc.c.p;
    whole.query_shape[0] = whole.shape[0];
    whole.query_shape[1] = whole.shape[1];
    st = fna::qk_forward(whole, t.qk_args(), opt);
    EXPECT_TRUE(st.ok()) << st.message;
  }
}

}  // namespace
}  // namespace fna_test
