// The production CPU backend, fused forward and backward: the driver. It splits the problem into
// tiles of queries along the last axis (see cpu/tile.h), gathers each tile's key box once into
// contiguous float buffers (converting dtype and strides), and runs the ISA-specific tile kernels.
// Only the neighborhood is visited: the box comes from nbr::window / nbr::tile_union.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "core/backends.h"
#include "core/neighborhood.h"
#include "cpu/parallel.h"
#include "cpu/strided.h"
#include "cpu/tile.h"

namespace fna {
namespace cpu {

const Kernels& avx512_kernel_table();
const Kernels& avx2_kernel_table();
const Kernels& generic_kernel_table();

const Kernels* avx512_kernels() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") ? &avx512_kernel_table()
                                                                                 : nullptr;
}
const Kernels* avx2_kernels() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &avx2_kernel_table()
                                                                         : nullptr;
}
const Kernels& generic_kernels() { return generic_kernel_table(); }

// FNA_CPU_KERNELS=generic|avx2|avx512 forces a kernel set (tests run every one the CPU has).
const Kernels& best_kernels() {
  const char* env = std::getenv("FNA_CPU_KERNELS");
  const std::string want = env ? env : "";
  if (want == "generic") return generic_kernels();
  if (want == "avx2" && avx2_kernels()) return *avx2_kernels();
  if ((want.empty() || want == "avx512") && avx512_kernels()) return *avx512_kernels();
  if (avx2_kernels()) return *avx2_kernels();
  return generic_kernels();
}

namespace {

constexpr float kLog2e = 1.4426950408889634f;

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Loads n elements of a strided row into floats (zero padding up to n_pad).
void load_row(const Strided& s, int64_t off, int n, int n_pad, float* dst) {
  if (s.dtype == DType::f32 && s.se == 1) {
    std::memcpy(dst, static_cast<const float*>(s.data) + off, sizeof(float) * n);
  } else {
    for (int e = 0; e < n; ++e) dst[e] = static_cast<float>(s.load(off + e * s.se));
  }
  for (int e = n; e < n_pad; ++e) dst[e] = 0.f;
}

void store_row(const Strided& s, int64_t off, int n, const float* src) {
  if (s.dtype == DType::f32 && s.se == 1) {
    std::memcpy(static_cast<float*>(s.data) + off, src, sizeof(float) * n);
  } else {
    for (int e = 0; e < n; ++e) s.store(off + e * s.se, src[e]);
  }
}

// The tiling of a problem: lines (all coordinates but the last) x tiles along the last axis.
struct Plan {
  const Problem& p;
  int la;  // last axis
  nbr::Axis ax[kMaxRank];
  int64_t N, lines, group;
  struct LastTile {
    int g, i0, i1;
  };
  std::vector<LastTile> last_tiles;
  int vw;

  Plan(const Problem& p_, int vw_) : p(p_), la(p_.rank - 1), N(p_.tokens()), vw(vw_) {
    for (int a = 0; a < p.rank; ++a)
      ax[a] = {static_cast<int>(p.shape[a]), static_cast<int>(p.kernel_size[a]),
               static_cast<int>(p.dilation[a]), static_cast<int>(p.stride[a]), p.is_causal[a]};
    lines = N / p.shape[la];
    group = p.heads / p.heads_kv;
    const nbr::Axis& L = ax[la];
    for (int g = 0; g < L.dilation && g < L.length; ++g) {
      const int lg = nbr::group_length(L, g);
      for (int i0 = 0; i0 < lg; i0 += kTileQueries)
        last_tiles.push_back({g, i0, i0 + kTileQueries < lg ? i0 + kTileQueries : lg});
    }
  }
  int64_t tasks() const {
    return p.batch * p.heads_kv * lines * static_cast<int64_t>(last_tiles.size());
  }
};

// One tile's geometry: which query tokens, which key tokens (rows x columns).
struct TileGeom {
  int64_t b, hk;
  TileShape s;
  int64_t q_token[kTileQueries];
  std::vector<int64_t> row_token;  // token index of each row's key with last coordinate 0
  int u0, g, d_last;

  int64_t key_token(int r, int m) const { return row_token[r] + static_cast<int64_t>(u0 + m) * d_last + g; }

  void build(const Plan& pl, int64_t task, int D, int Dv, int A) {
    const Problem& p = pl.p;
    const int64_t nt = static_cast<int64_t>(pl.last_tiles.size());
    const Plan::LastTile& lt = pl.last_tiles[task % nt];
    int64_t rest = task / nt;
    const int64_t line = rest % pl.lines;
    rest /= pl.lines;
    hk = rest % p.heads_kv;
    b = rest / p.heads_kv;
    // Coordinates of the line on the axes before the last, and their windows.
    int64_t coord[kMaxRank] = {0, 0, 0};
    for (int a = pl.la - 1; a >= 0; --a) {
      coord[a] = (line / stride_of(p, a, pl.la)) % p.shape[a];
    }
    row_token.assign(1, 0);
    for (int a = 0; a < pl.la; ++a) {
      const nbr::Axis& x = pl.ax[a];
      const int ga = static_cast<int>(coord[a] % x.dilation);
      const nbr::Range w = nbr::window(x, nbr::group_length(x, ga), static_cast<int>(coord[a] / x.dilation));
      std::vector<int64_t> next;
      next.reserve(row_token.size() * static_cast<size_t>(w.size()));
      for (int64_t base : row_token)
        for (int j = w.begin; j < w.end; ++j)
          next.push_back((base + static_cast<int64_t>(j) * x.dilation + ga) * p.shape[a + 1]);
      row_token.swap(next);
    }
    // Tokens of queries: line offset + last coordinate.
    int64_t line_token = 0;
    for (int a = 0; a < pl.la; ++a) line_token = (line_token + coord[a]) * p.shape[a + 1];
    const nbr::Axis& L = pl.ax[pl.la];
    const int lg = nbr::group_length(L, lt.g);
    const nbr::Range u = nbr::tile_union(L, lg, lt.i0, lt.i1);
    g = lt.g;
    d_last = L.dilation;
    u0 = u.begin;
    s.T = lt.i1 - lt.i0;
    s.R = static_cast<int>(row_token.size());
    s.M = u.size();
    int wmax = 0, reach = 0;
    for (int t = 0; t < s.T; ++t) {
      const nbr::Range w = nbr::window(L, lg, lt.i0 + t);
      s.col_begin[t] = w.begin - u0;
      s.col_count[t] = w.size();
      wmax = w.size() > wmax ? w.size() : wmax;
      q_token[t] = line_token + static_cast<int64_t>(lt.i0 + t) * L.dilation + lt.g;
    }
    for (int t = 0; t < s.T; ++t) {
      const int e = s.col_begin[t] + padded_window(wmax, pl.vw);
      reach = e > reach ? e : reach;
    }
    s.Mp = round_up(reach > s.M ? reach : s.M, pl.vw);
    s.D = D;
    s.Dp = round_up(D, pl.vw);
    s.Dv = Dv;
    s.Dvp = round_up(Dv, pl.vw);
    s.A = A;
  }

  // Token stride of axis a (product of the later axes' lengths) within the line index space.
  static int64_t stride_of(const Problem& p, int a, int la) {
    int64_t st = 1;
    for (int x = a + 1; x < la; ++x) st *= p.shape[x];
    return st;
  }
};

// Gathers the box: transposed [R][dim][Mp] and/or row-major [R][M][pitch] buffers.
void gather_box(const TileGeom& tg, const Strided& src, int dim, int pitch, float* transposed,
                float* rows, std::vector<float>& tmp) {
  const TileShape& s = tg.s;
  tmp.resize(static_cast<size_t>(pitch));
  if (transposed) std::memset(transposed, 0, sizeof(float) * s.R * dim * s.Mp);
  for (int r = 0; r < s.R; ++r)
    for (int m = 0; m < s.M; ++m) {
      float* dst = rows ? rows + (static_cast<int64_t>(r) * s.M + m) * pitch : tmp.data();
      load_row(src, src.token_offset(tg.b, tg.key_token(r, m), tg.hk), dim, pitch, dst);
      if (transposed) {
        float* col = transposed + static_cast<int64_t>(r) * dim * s.Mp + m;
        for (int e = 0; e < dim; ++e) col[static_cast<int64_t>(e) * s.Mp] = dst[e];
      }
    }
}

void gather_additional(const Strided& src, int64_t b, int64_t hk, int A, int dim, int pitch, float* dst) {
  for (int n = 0; n < A; ++n)
    load_row(src, src.token_offset(b, n, hk), dim, pitch, dst + static_cast<int64_t>(n) * pitch);
}

struct Scratch {
  std::vector<float> kt, k, v, vt, add_k, add_v, q, o, d_o, dq, lse, delta, work, work2, tmp;
  std::vector<float> dk_box, dv_box, d_add_k, d_add_v, p_add, ds_add;
};

template <typename V>
float* sized(V& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

}  // namespace

Status forward(const Problem& p, const ForwardArgs& a, const Options& opt) {
  const Kernels& kern = best_kernels();
  const Plan plan(p, kern.vector_width);
  const Strided q = grid_view(a.q, p, p.dtype), k = grid_view(a.k, p, p.dtype);
  const Strided v = grid_view(a.v, p, p.dtype), o = grid_view(a.o, p, p.dtype);
  const Strided lse = grid_view(a.lse, p, DType::f32, false);
  const Strided add_k = add_view(a.add_k, p), add_v = add_view(a.add_v, p);
  const int D = static_cast<int>(p.dim), Dv = static_cast<int>(p.dim_v);
  const int A = static_cast<int>(p.num_additional);
  const int threads = resolve_threads(opt.num_threads, plan.tasks());
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  const float scale_log2 = static_cast<float>(opt.scale) * kLog2e;
  parallel_for(plan.tasks(), threads, [&](int64_t task, int worker) {
    Scratch& sc = scratch[static_cast<size_t>(worker)];
    TileGeom tg;
    tg.build(plan, task, D, Dv, A);
    const TileShape& s = tg.s;
    ForwardTile ft;
    ft.s = s;
    ft.scale_log2 = scale_log2;
    float* kt = sized(sc.kt, static_cast<int64_t>(s.R) * D * s.Mp);
    float* vb = sized(sc.v, static_cast<int64_t>(s.R) * s.M * s.Dvp);
    gather_box(tg, k, D, s.Dp, kt, nullptr, sc.tmp);
    gather_box(tg, v, Dv, s.Dvp, nullptr, vb, sc.tmp);
    float* ak = sized(sc.add_k, static_cast<int64_t>(A) * s.Dp + 1);
    float* av = sized(sc.add_v, static_cast<int64_t>(A) * s.Dvp + 1);
    gather_additional(add_k, tg.b, tg.hk, A, D, s.Dp, ak);
    gather_additional(add_v, tg.b, tg.hk, A, Dv, s.Dvp, av);
    int wmax = 0;
    for (int t = 0; t < s.T; ++t) wmax = s.col_count[t] > wmax ? s.col_count[t] : wmax;
    float* qb = sized(sc.q, static_cast<int64_t>(s.T) * s.Dp);
    float* ob = sized(sc.o, static_cast<int64_t>(s.T) * s.Dvp);
    float* lb = sized(sc.lse, s.T);
    float* work = sized(sc.work, static_cast<int64_t>(s.R) * padded_window(wmax, plan.vw) + A + 1);
    ft.kt = kt;
    ft.v = vb;
    ft.add_k = ak;
    ft.add_v = av;
    ft.q = qb;
    ft.o = ob;
    ft.lse = lb;
    ft.scratch = work;
    for (int64_t gi = 0; gi < plan.group; ++gi) {
      const int64_t h = tg.hk * plan.group + gi;
      for (int t = 0; t < s.T; ++t)
        load_row(q, q.token_offset(tg.b, tg.q_token[t], h), D, s.Dp, qb + static_cast<int64_t>(t) * s.Dp);
      kern.forward(ft);
      for (int t = 0; t < s.T; ++t) {
        store_row(o, o.token_offset(tg.b, tg.q_token[t], h), Dv, ob + static_cast<int64_t>(t) * s.Dvp);
        if (lse.present()) lse.store(lse.token_offset(tg.b, tg.q_token[t], h), lb[t]);
      }
    }
  });
  return Status::Ok();
}

Status backward(const Problem& p, const BackwardArgs& a, const Options& opt) {
  const Kernels& kern = best_kernels();
  const Plan plan(p, kern.vector_width);
  const Strided q = grid_view(a.q, p, p.dtype), k = grid_view(a.k, p, p.dtype);
  const Strided v = grid_view(a.v, p, p.dtype), o = grid_view(a.o, p, p.dtype);
  const Strided d_o = grid_view(a.d_o, p, p.dtype), dq = grid_view(a.dq, p, p.dtype);
  const Strided lse = grid_view(a.lse, p, DType::f32, false);
  const Strided add_k = add_view(a.add_k, p), add_v = add_view(a.add_v, p);
  const int D = static_cast<int>(p.dim), Dv = static_cast<int>(p.dim_v);
  const int A = static_cast<int>(p.num_additional);
  const int Dp = round_up(D, plan.vw), Dvp = round_up(Dv, plan.vw);
  // dK / dV: every thread accumulates into its own float copy (boxes of different tiles
  // overlap, so direct writes would race); they are summed at the end. Cap the copies' memory.
  const int64_t keys = p.batch * (plan.N + A) * p.heads_kv;
  const int64_t acc_floats = keys * (Dp + Dvp);
  int threads = resolve_threads(opt.num_threads, plan.tasks());
  const int64_t cap = std::max<int64_t>(1, (int64_t(1) << 28) / std::max<int64_t>(acc_floats, 1));
  threads = static_cast<int>(std::min<int64_t>(threads, cap));
  std::vector<std::vector<float>> acc(static_cast<size_t>(threads));
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  const float scale = static_cast<float>(opt.scale);
  auto acc_at = [&](int worker, int64_t b, int64_t token, int64_t hk) {
    return acc[static_cast<size_t>(worker)].data() + ((b * (plan.N + A) + token) * p.heads_kv + hk) * (Dp + Dvp);
  };
  parallel_for(plan.tasks(), threads, [&](int64_t task, int worker) {
    Scratch& sc = scratch[static_cast<size_t>(worker)];
    if (acc[static_cast<size_t>(worker)].empty()) acc[static_cast<size_t>(worker)].assign(static_cast<size_t>(acc_floats), 0.f);
    TileGeom tg;
    tg.build(plan, task, D, Dv, A);
    const TileShape& s = tg.s;
    int wmax = 0;
    for (int t = 0; t < s.T; ++t) wmax = s.col_count[t] > wmax ? s.col_count[t] : wmax;
    const int64_t plane = static_cast<int64_t>(s.R) * padded_window(wmax, plan.vw);
    BackwardTile bt;
    bt.s = s;
    bt.scale = scale;
    bt.scale_log2 = scale * kLog2e;
    float* kt = sized(sc.kt, static_cast<int64_t>(s.R) * D * s.Mp);
    float* kb = sized(sc.k, static_cast<int64_t>(s.R) * s.M * s.Dp);
    float* vt = sized(sc.vt, static_cast<int64_t>(s.R) * Dv * s.Mp);
    gather_box(tg, k, D, s.Dp, kt, kb, sc.tmp);
    gather_box(tg, v, Dv, s.Dvp, vt, nullptr, sc.tmp);
    float* ak = sized(sc.add_k, static_cast<int64_t>(A) * s.Dp + 1);
    float* av = sized(sc.add_v, static_cast<int64_t>(A) * s.Dvp + 1);
    gather_additional(add_k, tg.b, tg.hk, A, D, s.Dp, ak);
    gather_additional(add_v, tg.b, tg.hk, A, Dv, s.Dvp, av);
    float* dkb = sized(sc.dk_box, static_cast<int64_t>(s.R) * s.M * s.Dp);
    float* dvb = sized(sc.dv_box, static_cast<int64_t>(s.R) * s.M * s.Dvp);
    float* dak = sized(sc.d_add_k, static_cast<int64_t>(A) * s.Dp + 1);
    float* dav = sized(sc.d_add_v, static_cast<int64_t>(A) * s.Dvp + 1);
    std::memset(dkb, 0, sizeof(float) * s.R * s.M * s.Dp);
    std::memset(dvb, 0, sizeof(float) * s.R * s.M * s.Dvp);
    std::memset(dak, 0, sizeof(float) * (A * s.Dp + 1));
    std::memset(dav, 0, sizeof(float) * (A * s.Dvp + 1));
    float* qb = sized(sc.q, static_cast<int64_t>(s.T) * s.Dp);
    float* dob = sized(sc.d_o, static_cast<int64_t>(s.T) * s.Dvp);
    float* ob = sized(sc.o, static_cast<int64_t>(s.T) * s.Dvp);
    float* lb = sized(sc.lse, s.T);
    float* db = sized(sc.delta, s.T);
    float* dqb = sized(sc.dq, static_cast<int64_t>(s.T) * s.Dp);
    bt.q = qb;
    bt.d_o = dob;
    bt.delta = db;
    bt.lse2 = lb;
    bt.kt = kt;
    bt.k = kb;
    bt.vt = vt;
    bt.add_k = ak;
    bt.add_v = av;
    bt.dq = dqb;
    bt.dk = dkb;
    bt.dv = dvb;
    bt.d_add_k = dak;
    bt.d_add_v = dav;
    bt.p = sized(sc.work, s.T * plane);
    bt.ds = sized(sc.work2, s.T * plane);
    bt.p_add = sized(sc.p_add, static_cast<int64_t>(s.T) * A + 1);
    bt.ds_add = sized(sc.ds_add, static_cast<int64_t>(s.T) * A + 1);
    for (int64_t gi = 0; gi < plan.group; ++gi) {
      const int64_t h = tg.hk * plan.group + gi;
      for (int t = 0; t < s.T; ++t) {
        const int64_t tok = tg.q_token[t];
        load_row(q, q.token_offset(tg.b, tok, h), D, s.Dp, qb + static_cast<int64_t>(t) * s.Dp);
        load_row(d_o, d_o.token_offset(tg.b, tok, h), Dv, s.Dvp, dob + static_cast<int64_t>(t) * s.Dvp);
        load_row(o, o.token_offset(tg.b, tok, h), Dv, s.Dvp, ob + static_cast<int64_t>(t) * s.Dvp);
        double dl = 0;
        for (int e = 0; e < Dv; ++e) dl += static_cast<double>(dob[t * s.Dvp + e]) * ob[t * s.Dvp + e];
        db[t] = static_cast<float>(dl);
        lb[t] = static_cast<float>(lse.load(lse.token_offset(tg.b, tok, h))) * kLog2e;
      }
      kern.backward(bt);
      for (int t = 0; t < s.T; ++t)
        store_row(dq, dq.token_offset(tg.b, tg.q_token[t], h), D, dqb + static_cast<int64_t>(t) * s.Dp);
    }
    for (int r = 0; r < s.R; ++r)
      for (int m = 0; m < s.M; ++m) {
        float* dst = acc_at(worker, tg.b, tg.key_token(r, m), tg.hk);
        const float* sk = dkb + (static_cast<int64_t>(r) * s.M + m) * s.Dp;
        const float* sv = dvb + (static_cast<int64_t>(r) * s.M + m) * s.Dvp;
        for (int e = 0; e < D; ++e) dst[e] += sk[e];
        for (int e = 0; e < Dv; ++e) dst[Dp + e] += sv[e];
      }
    for (int n = 0; n < A; ++n) {
      float* dst = acc_at(worker, tg.b, plan.N + n, tg.hk);
      for (int e = 0; e < D; ++e) dst[e] += dak[n * s.Dp + e];
      for (int e = 0; e < Dv; ++e) dst[Dp + e] += dav[n * s.Dvp + e];
    }
  });
  // Sum the per-thread accumulators and store, split over key tokens.
  const Strided dk = grid_view(a.dk, p, p.dtype), dv = grid_view(a.dv, p, p.dtype);
  const Strided dak = add_view(a.d_add_k, p), dav = add_view(a.d_add_v, p);
  const int64_t rows = p.batch * (plan.N + A);
  const int store_threads = resolve_threads(opt.num_threads, rows);
  parallel_for(rows, store_threads, [&](int64_t row, int) {
    const int64_t b = row / (plan.N + A), j = row % (plan.N + A);
    std::vector<float> sum(static_cast<size_t>(Dp + Dvp));
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      std::fill(sum.begin(), sum.end(), 0.f);
      for (int w = 0; w < threads; ++w) {
        if (acc[static_cast<size_t>(w)].empty()) continue;
        const float* src = acc_at(w, b, j, hk);
        for (int e = 0; e < Dp + Dvp; ++e) sum[static_cast<size_t>(e)] += src[e];
      }
      const Strided& sk = j < plan.N ? dk : dak;
      const Strided& sv = j < plan.N ? dv : dav;
      const int64_t tok = j < plan.N ? j : j - plan.N;
      store_row(sk, sk.token_offset(b, tok, hk), D, sum.data());
      store_row(sv, sv.token_offset(b, tok, hk), Dv, sum.data() + Dp);
    }
  });
  return Status::Ok();
}

}  // namespace cpu

namespace detail {

namespace {
template <typename Fn>
Status guarded(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return {Code::runtime_error, std::string("cpu ") + what + " failed: " + e.what()};
  }
}
}  // namespace

Status cpu_forward(const Problem& p, const ForwardArgs& a, const Options& opt) {
  return guarded("forward", [&] { return cpu::forward(p, a, opt); });
}
Status cpu_backward(const Problem& p, const BackwardArgs& a, const Options& opt) {
  return guarded("backward", [&] { return cpu::backward(p, a, opt); });
}

}  // namespace detail
}  // namespace fna
