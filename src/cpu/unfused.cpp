// The CPU backend's unfused operators (qk -> attn logits, av -> output, and their backwards).
// Memory-bound and secondary to the fused path, so they are plain float loops; they visit only the
// neighborhood (nbr::window), and key-side gradients are gathered per key through the inverse
// neighborhood (nbr::inverse_window), so threads never write the same element.
#include <cmath>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "cpu/guarded.h"
#include "core/backends.h"
#include "core/neighborhood.h"
#include "cpu/parallel.h"
#include "cpu/strided.h"

namespace fna {
namespace cpu {
namespace {

struct Geometry {
  const Problem& p;
  nbr::Axis ax[kMaxRank];
  int64_t N, W, A, group;
  explicit Geometry(const Problem& p_) : p(p_), N(p_.tokens()), W(p_.window()), A(p_.num_additional),
                                         group(p_.heads / p_.heads_kv) {
    for (int a = 0; a < p.rank; ++a)
      ax[a] = {static_cast<int>(p.shape[a]), static_cast<int>(p.kernel_size[a]),
               static_cast<int>(p.dilation[a]), static_cast<int>(p.stride[a]), p.is_causal[a]};
  }
  void coords(int64_t t, int* c) const {
    for (int a = p.rank - 1; a >= 0; --a) {
      c[a] = static_cast<int>(t % p.shape[a]);
      t /= p.shape[a];
    }
  }
  // Window of the query at coordinates c on axis a, in local indices of its group.
  nbr::Range window(const int* c, int a) const {
    const nbr::Axis& x = ax[a];
    return nbr::window(x, nbr::group_length(x, c[a] % x.dilation), c[a] / x.dilation);
  }
  // Slot -> key token of the query at c (-1: the slot is not a neighbor).
  void slots(const int* c, std::vector<int64_t>* out) const {
    nbr::Range w[kMaxRank];
    for (int a = 0; a < p.rank; ++a) w[a] = window(c, a);
    out->resize(static_cast<size_t>(W));
    for (int64_t s = 0; s < W; ++s) {
      int64_t rest = s, key = 0;
      int off[kMaxRank];
      for (int a = p.rank - 1; a >= 0; --a) {
        off[a] = static_cast<int>(rest % p.kernel_size[a]);
        rest /= p.kernel_size[a];
      }
      bool member = true;
      for (int a = 0; a < p.rank; ++a) {
        const int j = w[a].begin + off[a];
        if (j >= w[a].end) member = false;
        key = key * p.shape[a] + static_cast<int64_t>(j) * ax[a].dilation + c[a] % ax[a].dilation;
      }
      (*out)[static_cast<size_t>(s)] = member ? key : -1;
    }
  }
};

void load(const Strided& s, int64_t off, int64_t n, std::vector<float>* out) {
  out->resize(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) (*out)[static_cast<size_t>(e)] = static_cast<float>(s.load(off + e * s.se));
}

float dot(const std::vector<float>& a, const std::vector<float>& b) {
  float s = 0.f;
  for (size_t e = 0; e < a.size(); ++e) s += a[e] * b[e];
  return s;
}

// Calls fn(query token, head, slot) for every (query, head) whose window holds key token kt of
// KV head hk, with the key's slot in that query's window: the inverse neighborhood, per axis.
template <typename Fn>
void for_each_query_of_key(const Geometry& g, int64_t kt, int64_t hk, Fn&& fn) {
  const Problem& p = g.p;
  int kc[kMaxRank];
  g.coords(kt, kc);
  nbr::Range inv[kMaxRank] = {{0, 1}, {0, 1}, {0, 1}};
  for (int a = 0; a < p.rank; ++a) {
    const nbr::Axis& x = g.ax[a];
    inv[a] = nbr::inverse_window(x, nbr::group_length(x, kc[a] % x.dilation), kc[a] / x.dilation);
    if (inv[a].size() == 0) return;
  }
  int li[kMaxRank] = {inv[0].begin, inv[1].begin, inv[2].begin};
  while (true) {
    int qc[kMaxRank];
    int64_t qt = 0, slot = 0;
    for (int a = 0; a < p.rank; ++a) {
      qc[a] = li[a] * g.ax[a].dilation + kc[a] % g.ax[a].dilation;
      qt = qt * p.shape[a] + qc[a];
    }
    for (int a = 0; a < p.rank; ++a) slot = slot * p.kernel_size[a] + (kc[a] / g.ax[a].dilation - g.window(qc, a).begin);
    for (int64_t gi = 0; gi < g.group; ++gi) fn(qt, hk * g.group + gi, slot);
    int a = p.rank - 1;
    for (; a >= 0; --a) {
      if (++li[a] < inv[a].end) break;
      li[a] = inv[a].begin;
    }
    if (a < 0) break;
  }
}

}  // namespace

// out[key] = mult * sum of w[q, h, slot of key] * x[q, h, :] over the queries q that see the key
// (its inverse neighborhood) and the query heads h of its KV head: the key-side gradients of both
// unfused ops (dK = scale dS^T Q, dV = P^T dO). Additional keys see every query; their rows go to
// `out_add`.
static void key_grads(const Problem& p, const Geometry& g, const Strided& x, int64_t dim, const Strided& w,
               float mult, const Strided& out, const Strided& out_add, const Options& opt) {
  const int64_t krows = p.batch * (g.N + g.A);
  parallel_for(krows, resolve_threads(opt.num_threads, krows), [&](int64_t row, int) {
    const int64_t b = row / (g.N + g.A), j = row % (g.N + g.A);
    std::vector<float> xr, acc;
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      acc.assign(static_cast<size_t>(dim), 0.f);
      auto add = [&](int64_t qt, int64_t h, int64_t slot) {
        load(x, x.token_offset(b, qt, h), dim, &xr);
        const float wv = mult * static_cast<float>(w.load(w.token_offset(b, qt, h) + slot * w.se));
        for (int64_t e = 0; e < dim; ++e) acc[static_cast<size_t>(e)] += wv * xr[static_cast<size_t>(e)];
      };
      if (j < g.N) {
        for_each_query_of_key(g, j, hk, add);
        const int64_t o = out.token_offset(b, j, hk);
        for (int64_t e = 0; e < dim; ++e) out.store(o + e * out.se, acc[static_cast<size_t>(e)]);
      } else {
        for (int64_t qt = 0; qt < g.N; ++qt)
          for (int64_t gi = 0; gi < g.group; ++gi) add(qt, hk * g.group + gi, g.W + (j - g.N));
        const int64_t o = out_add.token_offset(b, j - g.N, hk);
        for (int64_t e = 0; e < dim; ++e) out_add.store(o + e * out_add.se, acc[static_cast<size_t>(e)]);
      }
    }
  });
}

Status qk_forward(const Problem& p, const QKArgs& a, const Options& opt) {
  const Geometry g(p);
  const Strided q = grid_view(a.q, p, p.dtype), k = grid_view(a.k, p, p.dtype);
  const Strided ak = add_view(a.add_k, p), attn = grid_view(a.attn, p, p.dtype);
  const float* rpb = static_cast<const float*>(a.rpb.data);
  const int64_t rows = p.batch * g.N;
  parallel_for(rows, resolve_threads(opt.num_threads, rows), [&](int64_t row, int) {
    const int64_t b = row / g.N, t = row % g.N;
    int c[kMaxRank];
    g.coords(t, c);
    std::vector<int64_t> slots;
    g.slots(c, &slots);
    // With a bias: each neighbor slot's entry in one head's table (rpb's strides).
    std::vector<int64_t> entry;
    if (rpb != nullptr) {
      entry.assign(static_cast<size_t>(g.W), 0);
      for (int64_t s = 0; s < g.W; ++s) {
        if (slots[static_cast<size_t>(s)] < 0) continue;
        int kc[kMaxRank];
        g.coords(slots[static_cast<size_t>(s)], kc);
        for (int x = 0; x < p.rank; ++x) {
          const int d = g.ax[x].dilation;
          entry[static_cast<size_t>(s)] +=
              nbr::bias_index(g.ax[x], c[x] / d, kc[x] / d) * a.rpb.strides[1 + x];
        }
      }
    }
    std::vector<float> qr, kr;
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t hk = h / g.group;
      load(q, q.token_offset(b, t, h), p.dim, &qr);
      const int64_t off = attn.token_offset(b, t, h);
      for (int64_t s = 0; s < g.W + g.A; ++s) {
        float val;
        if (s < g.W && slots[static_cast<size_t>(s)] < 0) {
          val = -std::numeric_limits<float>::infinity();
        } else {
          if (s < g.W) load(k, k.token_offset(b, slots[static_cast<size_t>(s)], hk), p.dim, &kr);
          else load(ak, ak.token_offset(b, s - g.W, hk), p.dim, &kr);
          val = static_cast<float>(opt.scale) * dot(qr, kr);
          if (rpb != nullptr && s < g.W)
            val += rpb[h * a.rpb.strides[0] + entry[static_cast<size_t>(s)]];
        }
        attn.store(off + s * attn.se, val);
      }
    }
  });
  return Status::Ok();
}

Status qk_backward(const Problem& p, const QKBackwardArgs& a, const Options& opt) {
  const Geometry g(p);
  const Strided q = grid_view(a.q, p, p.dtype), k = grid_view(a.k, p, p.dtype);
  const Strided ak = add_view(a.add_k, p), da = grid_view(a.d_attn, p, p.dtype);
  const Strided dq = grid_view(a.dq, p, p.dtype), dk = grid_view(a.dk, p, p.dtype);
  const Strided dak = add_view(a.d_add_k, p);
  const float scale = static_cast<float>(opt.scale);
  const int64_t rows = p.batch * g.N;
  const int threads = resolve_threads(opt.num_threads, rows);
  // dQ per query.
  parallel_for(rows, threads, [&](int64_t row, int) {
    const int64_t b = row / g.N, t = row % g.N;
    int c[kMaxRank];
    g.coords(t, c);
    std::vector<int64_t> slots;
    g.slots(c, &slots);
    std::vector<float> kr, acc;
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t hk = h / g.group, off = da.token_offset(b, t, h);
      acc.assign(static_cast<size_t>(p.dim), 0.f);
      for (int64_t s = 0; s < g.W + g.A; ++s) {
        if (s < g.W && slots[static_cast<size_t>(s)] < 0) continue;
        if (s < g.W) load(k, k.token_offset(b, slots[static_cast<size_t>(s)], hk), p.dim, &kr);
        else load(ak, ak.token_offset(b, s - g.W, hk), p.dim, &kr);
        const float w = scale * static_cast<float>(da.load(off + s * da.se));
        for (int64_t e = 0; e < p.dim; ++e) acc[static_cast<size_t>(e)] += w * kr[static_cast<size_t>(e)];
      }
      const int64_t o = dq.token_offset(b, t, h);
      for (int64_t e = 0; e < p.dim; ++e) dq.store(o + e * dq.se, acc[static_cast<size_t>(e)]);
    }
  });
  // dK = scale dS^T Q per key.
  key_grads(p, g, q, p.dim, da, scale, dk, dak, opt);
  return Status::Ok();
}

Status av_forward(const Problem& p, const AVArgs& a, const Options& opt) {
  const Geometry g(p);
  const Strided attn = grid_view(a.attn, p, p.dtype), v = grid_view(a.v, p, p.dtype);
  const Strided av = add_view(a.add_v, p), o = grid_view(a.o, p, p.dtype);
  const int64_t rows = p.batch * g.N;
  parallel_for(rows, resolve_threads(opt.num_threads, rows), [&](int64_t row, int) {
    const int64_t b = row / g.N, t = row % g.N;
    int c[kMaxRank];
    g.coords(t, c);
    std::vector<int64_t> slots;
    g.slots(c, &slots);
    std::vector<float> vr, acc;
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t hk = h / g.group, off = attn.token_offset(b, t, h);
      acc.assign(static_cast<size_t>(p.dim_v), 0.f);
      for (int64_t s = 0; s < g.W + g.A; ++s) {
        if (s < g.W && slots[static_cast<size_t>(s)] < 0) continue;  // not a neighbor: ignored
        if (s < g.W) load(v, v.token_offset(b, slots[static_cast<size_t>(s)], hk), p.dim_v, &vr);
        else load(av, av.token_offset(b, s - g.W, hk), p.dim_v, &vr);
        const float w = static_cast<float>(attn.load(off + s * attn.se));
        for (int64_t e = 0; e < p.dim_v; ++e) acc[static_cast<size_t>(e)] += w * vr[static_cast<size_t>(e)];
      }
      const int64_t oo = o.token_offset(b, t, h);
      for (int64_t e = 0; e < p.dim_v; ++e) o.store(oo + e * o.se, acc[static_cast<size_t>(e)]);
    }
  });
  return Status::Ok();
}

Status av_backward(const Problem& p, const AVBackwardArgs& a, const Options& opt) {
  const Geometry g(p);
  const Strided attn = grid_view(a.attn, p, p.dtype), v = grid_view(a.v, p, p.dtype);
  const Strided av = add_view(a.add_v, p), d_o = grid_view(a.d_o, p, p.dtype);
  const Strided da = grid_view(a.d_attn, p, p.dtype), dv = grid_view(a.dv, p, p.dtype);
  const Strided dav = add_view(a.d_add_v, p);
  const int64_t rows = p.batch * g.N;
  // d_attn per query: dO . V of each neighbor; 0 for slots that are not neighbors.
  parallel_for(rows, resolve_threads(opt.num_threads, rows), [&](int64_t row, int) {
    const int64_t b = row / g.N, t = row % g.N;
    int c[kMaxRank];
    g.coords(t, c);
    std::vector<int64_t> slots;
    g.slots(c, &slots);
    std::vector<float> vr, dor;
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t hk = h / g.group, off = da.token_offset(b, t, h);
      load(d_o, d_o.token_offset(b, t, h), p.dim_v, &dor);
      for (int64_t s = 0; s < g.W + g.A; ++s) {
        float val = 0.f;
        if (s >= g.W || slots[static_cast<size_t>(s)] >= 0) {
          if (s < g.W) load(v, v.token_offset(b, slots[static_cast<size_t>(s)], hk), p.dim_v, &vr);
          else load(av, av.token_offset(b, s - g.W, hk), p.dim_v, &vr);
          val = dot(dor, vr);
        }
        da.store(off + s * da.se, val);
      }
    }
  });
  // dV = P^T dO per key.
  key_grads(p, g, d_o, p.dim_v, attn, 1.f, dv, dav, opt);
  return Status::Ok();
}

}  // namespace cpu

namespace detail {
using cpu::guarded;

Status cpu_qk_forward(const Problem& p, const QKArgs& a, const Options& opt) {
  return guarded("qk_forward", [&] { return cpu::qk_forward(p, a, opt); });
}
Status cpu_qk_backward(const Problem& p, const QKBackwardArgs& a, const Options& opt) {
  return guarded("qk_backward", [&] { return cpu::qk_backward(p, a, opt); });
}
Status cpu_av_forward(const Problem& p, const AVArgs& a, const Options& opt) {
  return guarded("av_forward", [&] { return cpu::av_forward(p, a, opt); });
}
Status cpu_av_backward(const Problem& p, const AVBackwardArgs& a, const Options& opt) {
  return guarded("av_backward", [&] { return cpu::av_backward(p, a, opt); });
}

}  // namespace detail
}  // namespace fna
