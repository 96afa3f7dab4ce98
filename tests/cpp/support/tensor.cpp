#include "support/tensor.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "core/dtype.h"

namespace fna_test {

namespace {
int64_t elem_size(fna::DType t) { return t == fna::DType::f32 ? 4 : 2; }
}  // namespace

HostTensor::HostTensor(fna::DType dtype, std::vector<int64_t> extents, std::vector<int> order,
                       int64_t pad)
    : dtype_(dtype), extents_(std::move(extents)) {
  const int n = static_cast<int>(extents_.size());
  if (order.empty()) {
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
  }
  strides_.assign(n, 0);
  int64_t s = 1;
  for (int k = n - 1; k >= 0; --k) {
    const int d = order[k];
    strides_[d] = s;
    s *= extents_[d] + (k == n - 1 ? pad : 0);
  }
  int64_t max_off = 0;
  bool any_zero = false;
  for (int d = 0; d < n; ++d) {
    if (extents_[d] == 0) any_zero = true;
    else max_off += (extents_[d] - 1) * strides_[d];
  }
  const int64_t slots = any_zero ? 0 : max_off + 1;
  storage_.assign(static_cast<size_t>(slots * elem_size(dtype_)), 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < slots; ++i) fna::detail::store_from_float(storage_.data(), i, dtype_, nan);
}

HostTensor HostTensor::make(fna::DType dtype, const std::vector<int64_t>& extents, Layout layout,
                            int heads_dim, uint64_t layout_seed) {
  Rng rng(layout_seed);
  if (layout == Layout::mixed) layout = static_cast<Layout>(rng.range(0, 2));
  const int n = static_cast<int>(extents.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  int64_t pad = 0;
  if (layout == Layout::heads_first && heads_dim > 1) {
    order.clear();
    order.push_back(0);
    order.push_back(heads_dim);
    for (int d = 1; d < n; ++d)
      if (d != heads_dim) order.push_back(d);
  } else if (layout == Layout::padded) {
    pad = rng.range(1, 5);
  }
  return HostTensor(dtype, extents, order, pad);
}

int64_t HostTensor::numel() const {
  if (extents_.empty()) return 0;
  int64_t n = 1;
  for (int64_t e : extents_) n *= e;
  return n;
}

int64_t HostTensor::offset(int64_t logical) const {
  int64_t off = 0;
  for (int d = static_cast<int>(extents_.size()) - 1; d >= 0; --d) {
    off += (logical % extents_[d]) * strides_[d];
    logical /= extents_[d];
  }
  return off;
}

double HostTensor::get(int64_t logical) const {
  return fna::detail::load_as_float(storage_.data(), offset(logical), dtype_);
}

void HostTensor::set(int64_t logical, double v) {
  fna::detail::store_from_float(storage_.data(), offset(logical), dtype_, static_cast<float>(v));
}

void HostTensor::fill_random(uint64_t seed, double amplitude) {
  Rng rng(seed);
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) {
    const double mag = 0.1 + 0.9 * rng.uniform();
    set(i, (rng.chance(0.5) ? mag : -mag) * amplitude);
  }
}

void HostTensor::fill(double v) {
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) set(i, v);
}

std::vector<double> HostTensor::to_double() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[i] = get(i);
  return out;
}

void HostTensor::from_double(const std::vector<double>& v) {
  for (int64_t i = 0; i < numel(); ++i) set(i, v[i]);
}

HostTensor HostTensor::converted(fna::DType dtype) const {
  HostTensor t = *this;
  t.dtype_ = dtype;
  const int64_t slots = static_cast<int64_t>(storage_.size()) / elem_size(dtype_);
  t.storage_.assign(static_cast<size_t>(slots * elem_size(dtype)), 0);
  for (int64_t i = 0; i < slots; ++i)
    fna::detail::store_from_float(t.storage_.data(), i, dtype,
                                  fna::detail::load_as_float(storage_.data(), i, dtype_));
  return t;
}

fna::TensorRef HostTensor::ref_at(void* base) const {
  fna::TensorRef r;
  if (numel() == 0) return r;
  r.data = base;
  for (size_t d = 0; d < extents_.size() && d < static_cast<size_t>(fna::kMaxDims); ++d)
    r.strides[d] = strides_[d];
  return r;
}

// ---- ProblemTensors -------------------------------------------------------------------------------

namespace {
std::vector<int64_t> spatial(const fna::Problem& p, int64_t heads, int64_t last) {
  std::vector<int64_t> e{p.batch};
  for (int a = 0; a < p.rank; ++a) e.push_back(p.shape[a]);
  e.push_back(heads);
  if (last >= 0) e.push_back(last);
  return e;
}
}  // namespace

ProblemTensors::ProblemTensors(const Case& cs) : c(cs) {
  const fna::Problem& p = c.p;
  const fna::DType t = p.dtype;
  Rng rng(c.seed);
  auto role = [&](const std::vector<int64_t>& ext, int heads_dim, fna::DType dt) {
    return HostTensor::make(dt, ext, c.layout, heads_dim, rng.next());
  };
  const int hd = p.rank + 1;  // heads dim of the [B, L.., H, D] roles
  q = role(spatial(p, p.heads, p.dim), hd, t);
  k = role(spatial(p, p.heads_kv, p.dim), hd, t);
  v = role(spatial(p, p.heads_kv, p.dim_v), hd, t);
  o = role(spatial(p, p.heads, p.dim_v), hd, t);
  d_o = role(spatial(p, p.heads, p.dim_v), hd, t);
  dq = role(spatial(p, p.heads, p.dim), hd, t);
  dk = role(spatial(p, p.heads_kv, p.dim), hd, t);
  dv = role(spatial(p, p.heads_kv, p.dim_v), hd, t);
  lse = role(spatial(p, p.heads, -1), hd, fna::DType::f32);
  attn = role(spatial(p, p.heads, p.window() + p.num_additional), hd, t);
  d_attn = role(spatial(p, p.heads, p.window() + p.num_additional), hd, t);
  if (p.num_additional > 0) {
    add_k = role({p.batch, p.num_additional, p.heads_kv, p.dim}, 2, t);
    add_v = role({p.batch, p.num_additional, p.heads_kv, p.dim_v}, 2, t);
    d_add_k = role({p.batch, p.num_additional, p.heads_kv, p.dim}, 2, t);
    d_add_v = role({p.batch, p.num_additional, p.heads_kv, p.dim_v}, 2, t);
  }
  // Q and K get a larger amplitude so that softmax is far from uniform.
  q.fill_random(rng.next(), 1.5);
  k.fill_random(rng.next(), 1.5);
  v.fill_random(rng.next());
  d_o.fill_random(rng.next());
  d_attn.fill_random(rng.next());
  attn.fill_random(rng.next());
  if (p.num_additional > 0) {
    add_k.fill_random(rng.next(), 1.5);
    add_v.fill_random(rng.next());
  }
  poison_outputs();
}

void ProblemTensors::make_d_lse(double amplitude) {
  const fna::Problem& p = c.p;
  Rng rng(c.seed ^ 0xd15eull);
  d_lse = HostTensor::make(fna::DType::f32, spatial(p, p.heads, -1), c.layout, p.rank + 1,
                           rng.next());
  d_lse.fill_random(rng.next(), amplitude);
}

void ProblemTensors::poison_outputs() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (HostTensor* t : {&o, &lse, &dq, &dk, &dv, &d_add_k, &d_add_v})
    if (!t->empty()) t->fill(nan);
}

fna::ForwardArgs ProblemTensors::forward_args() {
  fna::ForwardArgs a;
  a.q = q.ref();
  a.k = k.ref();
  a.v = v.ref();
  a.o = o.ref();
  if (c.with_lse) a.lse = lse.ref();
  a.add_k = add_k.ref();
  a.add_v = add_v.ref();
  return a;
}

fna::BackwardArgs ProblemTensors::backward_args() {
  fna::BackwardArgs a;
  a.q = q.ref();
  a.k = k.ref();
  a.v = v.ref();
  a.o = o.ref();
  a.d_o = d_o.ref();
  a.lse = lse.ref();
  a.dq = dq.ref();
  a.dk = dk.ref();
  a.dv = dv.ref();
  a.add_k = add_k.ref();
  a.add_v = add_v.ref();
  a.d_add_k = d_add_k.ref();
  a.d_add_v = d_add_v.ref();
  a.d_lse = d_lse.ref();
  return a;
}

fna::QKArgs ProblemTensors::qk_args() {
  fna::QKArgs a;
  a.q = q.ref();
  a.k = k.ref();
  a.add_k = add_k.ref();
  a.attn = attn.ref();
  return a;
}

fna::QKBackwardArgs ProblemTensors::qk_backward_args() {
  fna::QKBackwardArgs a;
  a.q = q.ref();
  a.k = k.ref();
  a.add_k = add_k.ref();
  a.d_attn = d_attn.ref();
  a.dq = dq.ref();
  a.dk = dk.ref();
  a.d_add_k = d_add_k.ref();
  return a;
}

fna::AVArgs ProblemTensors::av_args() {
  fna::AVArgs a;
  a.attn = attn.ref();
  a.v = v.ref();
  a.add_v = add_v.ref();
  a.o = o.ref();
  return a;
}

fna::AVBackwardArgs ProblemTensors::av_backward_args() {
  fna::AVBackwardArgs a;
  a.attn = attn.ref();
  a.v = v.ref();
  a.add_v = add_v.ref();
  a.d_o = d_o.ref();
  a.d_attn = d_attn.ref();
  a.dv = dv.ref();
  a.d_add_v = d_add_v.ref();
  return a;
}

ProblemTensors ProblemTensors::as_f32() const {
  ProblemTensors t = *this;
  t.c.p.dtype = fna::DType::f32;
  for (HostTensor* h : {&t.q, &t.k, &t.v, &t.o, &t.add_k, &t.add_v, &t.d_o, &t.dq, &t.dk, &t.dv,
                        &t.d_add_k, &t.d_add_v, &t.attn, &t.d_attn})
    if (!h->empty()) *h = h->converted(fna::DType::f32);
  return t;
}

fna::Options options_for(const Case& c, fna::Backend backend, int num_threads) {
  fna::Options o;
  o.backend = backend;
  o.scale = c.scale;
  o.num_threads = num_threads;
  return o;
}

}  // namespace fna_test
