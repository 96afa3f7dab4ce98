// Internal to the CPU backend: the driver's data structures and helpers shared by the forward
// (backend.cpp) and the backward (backward.cpp): the work plan, tile geometry, K / V panels and
// their per-worker store, row loads / stores and prefetch hints.
#pragma once

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cpu/guarded.h"
#include "core/backends.h"
#include "core/neighborhood.h"
#include "cpu/parallel.h"
#include "cpu/strided.h"
#include "cpu/tile.h"

namespace fna {
namespace cpu {
namespace driver {

constexpr float kLog2e = 1.4426950408889634f;

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// A float buffer whose data() is 64-byte aligned (one cache line, one AVX-512 vector), unlike a
// large std::vector's (malloc returns 16-byte aligned blocks): panel rows, value rows and score
// rows, whose starts are multiples of the vector width, then load without straddling two lines.
// Growing discards the contents (every user refills what it reads).
class Floats {
 public:
  using value_type = float;
  void resize(size_t n) {
    if (n > cap_) {
      mem_.reset(static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64)));
      if (!mem_) throw std::bad_alloc();
      cap_ = n;
    }
    size_ = n;
  }
  size_t size() const { return size_; }
  float* data() { return mem_.get(); }
  const float* data() const { return mem_.get(); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> mem_;
  size_t cap_ = 0, size_ = 0;
};

// Loads n elements of a strided row into floats (zero padding up to n_pad).
inline void load_row(const Strided& s, int64_t off, int n, int n_pad, float* dst) {
  if (s.dtype == DType::f32 && s.se == 1) {
    std::memcpy(dst, static_cast<const float*>(s.data) + off, sizeof(float) * n);
  } else {
    for (int e = 0; e < n; ++e) dst[e] = static_cast<float>(s.load(off + e * s.se));
  }
  for (int e = n; e < n_pad; ++e) dst[e] = 0.f;
}

// Asks for the cache lines of a row of n contiguous elements (a hint; nothing when strided).
inline void prefetch_row(const Strided& s, int64_t off, int n) {
  if (s.se != 1) return;
  const char* row = static_cast<const char*>(s.data) + off * detail::dtype_size(s.dtype);
  const int64_t bytes = n * detail::dtype_size(s.dtype);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(row + i);
}

// Rows to prefetch (tile.h: Prefetch): each row's first cache line, and the most lines any row
// spans.
struct HintRows {
  std::vector<const char*> rows;
  int lines = 0;
  void clear() {
    rows.clear();
    lines = 0;
  }
  // `count` rows of n contiguous elements, the first at element offset `off`, `step` apart
  // (nothing when the elements are strided).
  void add(const Strided& s, int64_t off, int64_t step, int count, int n) {
    if (s.se != 1 || n <= 0) return;
    const int64_t es = detail::dtype_size(s.dtype);
    const char* base = static_cast<const char*>(s.data);
    for (int j = 0; j < count; ++j) {
      const uintptr_t b = reinterpret_cast<uintptr_t>(base + (off + j * step) * es);
      const uintptr_t e = b + static_cast<uintptr_t>(n * es) - 1;
      lines = std::max(lines, static_cast<int>((e >> 6) - (b >> 6) + 1));
      rows.push_back(reinterpret_cast<const char*>(b & ~uintptr_t(63)));
    }
  }
};

inline void store_row(const Strided& s, int64_t off, int n, const float* src) {
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
  // Task order: band == 1, line by line (every tile of a line, then the next line); band > 1,
  // bands of `band` consecutive lines (flattened over batch and KV heads) run tile-column-major:
  // tile 0 of every line of the band, then tile 1, .. . A band's tasks then read one column
  // strip of its panels at a time, so what they share stays in L2 even when a whole line's
  // panels do not (the backward's five panel sets).
  int band;
  // Tasks per work item (a worker's unit, one kernel call): with an even band, tasks 2i and
  // 2i + 1 are the same tile of two adjacent lines, whose key boxes share all rows but one or two
  // (2-D windows): one call computes both tiles' scores, each shared key vector loaded once
  // (Kernels::forward). Otherwise one task.
  int per_item() const { return band % 2 == 0 ? 2 : 1; }
  int64_t items() const { return (tasks() + per_item() - 1) / per_item(); }
  // Strip order (the forward's, see backend.cpp: strips_fit): tile-column-major, i.e.
  // per batch, one tile column (a "strip") at a time down all lines, bands of `band` lines, and
  // within a band the KV heads outermost: (b, tile, band, hk, line). A heads-last token row holds
  // every head's vector (1 KB at H = 4, D = 64), so the band's tasks read and write whole rows
  // within a few items (4 KB pages and hardware-prefetched streams used in full, instead of a
  // quarter of every row once per head pass); the panels are then per strip (the tile's key
  // columns only, Panels::strip), so that every head's panels of the box fit the L2 ring.
  bool strips;

  Plan(const Problem& p_, int vw_, int band_ = 1, bool strips_ = false)
      : p(p_), la(p_.rank - 1), N(p_.tokens()), vw(vw_), band(band_ > 1 ? band_ : 1), strips(strips_) {
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
  int64_t b, hk;  // batch and KV head of the task
  int64_t line, tile;  // line and last-axis tile (Plan::last_tiles) of the task
  TileShape s;
  int64_t q_token[kTileQueries];
  std::vector<int64_t> row_token;  // token index of each row's key with last coordinate 0
  int u0, g, d_last;

  int64_t key_token(int r, int m) const { return row_token[r] + static_cast<int64_t>(u0 + m) * d_last + g; }

  void build(const Plan& pl, int64_t task, int D, int Dv, int A) {
    const Problem& p = pl.p;
    const int64_t nt = static_cast<int64_t>(pl.last_tiles.size());
    // Order (slowest first): batch, KV head, line, tile. The tiles of a line share their key
    // rows, and the next line's tiles all but one of them, so the panels in use (about the window
    // height in lines, of one head) stay in L2 and each panel is converted (PanelStore) just
    // before its first tiles read it.
    tile = task % nt;
    int64_t rest = task / nt;
    if (pl.strips) {  // see Plan::strips: (b, tile, band, hk, line in band)
      const int64_t L = pl.lines, H = p.heads_kv, per_b = nt * L * H;
      b = task / per_b;
      const int64_t in_b = task % per_b;
      tile = in_b / (L * H);
      const int64_t in_strip = in_b % (L * H), first = in_strip / (pl.band * H) * pl.band;
      const int64_t len = std::min<int64_t>(pl.band, L - first), in = in_strip - first * H;
      hk = in / len;
      rest = (b * H + hk) * L + first + in % len;  // (b, hk, line) as below
    } else if (pl.band > 1) {  // see Plan::band
      const int64_t first = task / (pl.band * nt) * pl.band;  // the band's first line
      const int64_t len = std::min<int64_t>(pl.band, pl.tasks() / nt - first), in = task - first * nt;
      tile = in / len;
      rest = first + in % len;
    }
    line = rest % pl.lines;
    rest /= pl.lines;
    hk = rest % p.heads_kv;
    b = rest / p.heads_kv;
    const Plan::LastTile& lt = pl.last_tiles[tile];
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
    for (int t = 0; t < s.T; ++t) {
      const nbr::Range w = nbr::window(L, lg, lt.i0 + t);
      s.col_begin[t] = w.begin - u0;
      s.col_count[t] = w.size();
      q_token[t] = line_token + static_cast<int64_t>(lt.i0 + t) * L.dilation + lt.g;
    }
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

// Float panels of a key-side tensor (see cpu/tile.h): one per (b, hk, line, last-axis group),
// columns = local indices along the last axis, zero beyond the group's length.
struct Panels {
  const Plan& pl;
  const Kernels& kern;  // its transpose converts the transposed layout
  int64_t count = 0;
  int pitch = 0;  // columns of a transposed panel; also the rows of a row-major one
  // Plan::strips: one panel per (b, tile, line, hk) holding the tile's key columns (its box's
  // columns, [u0, u0 + M)) rather than the line's, zero from M to pitch.
  bool strip = false;
  Panels(const Plan& plan, const Kernels& k) : pl(plan), kern(k), strip(plan.strips) {
    const Problem& p = plan.p;
    const nbr::Axis& L = plan.ax[plan.la];
    if (!strip) {
      count = p.batch * p.heads_kv * plan.lines * L.dilation;
      pitch = round_up(nbr::group_length(L, 0), plan.vw) + plan.vw;
      return;
    }
    count = p.batch * static_cast<int64_t>(plan.last_tiles.size()) * plan.lines * p.heads_kv;
    // Columns the kernels read: the box's, and each query group's span padded to whole vectors
    // (a group starting at query t reads from col_begin[t] on at most padded_window(count + 3)
    // columns, kGroup = 4 queries: kernels_products.h).
    int need = 0;
    for (const Plan::LastTile& lt : plan.last_tiles) {
      const int lg = nbr::group_length(L, lt.g);
      const nbr::Range u = nbr::tile_union(L, lg, lt.i0, lt.i1);
      need = std::max(need, u.size());
      for (int i = lt.i0; i < lt.i1; ++i) {
        const nbr::Range w = nbr::window(L, lg, i);
        need = std::max(need, w.begin - u.begin + padded_window(w.size() + 3, plan.vw));
      }
    }
    pitch = round_up(need, plan.vw);
  }
  int64_t id(int64_t b, int64_t hk, int64_t line, int g) const {
    return ((b * pl.p.heads_kv + hk) * pl.lines + line) * pl.ax[pl.la].dilation + g;
  }
  // The panel of key line `line` that tile tg reads.
  int64_t id_of(const TileGeom& tg, int64_t line) const {
    if (!strip) return id(tg.b, tg.hk, line, tg.g);
    return ((tg.b * static_cast<int64_t>(pl.last_tiles.size()) + tg.tile) * pl.lines + line) * pl.p.heads_kv + tg.hk;
  }
  // Where panel `id`'s column 0 lies: its tensor's element offset (head hk), the step between
  // columns, and how many columns it holds.
  void source(const Strided& src, int64_t id, int64_t* first, int64_t* step, int* ncols) const {
    const Problem& p = pl.p;
    const nbr::Axis& L = pl.ax[pl.la];
    *step = L.dilation * src.sl[src.rank - 1];
    if (strip) {
      const int64_t hk = id % p.heads_kv;
      int64_t rest = id / p.heads_kv;
      const int64_t line = rest % pl.lines;
      rest /= pl.lines;
      const int64_t nt = static_cast<int64_t>(pl.last_tiles.size()), tile = rest % nt, b = rest / nt;
      const Plan::LastTile& lt = pl.last_tiles[static_cast<size_t>(tile)];
      const nbr::Range u = nbr::tile_union(L, nbr::group_length(L, lt.g), lt.i0, lt.i1);
      *first = src.token_offset(b, line * p.shape[pl.la] + static_cast<int64_t>(u.begin) * L.dilation + lt.g, hk);
      *ncols = u.size();
      return;
    }
    const int g = static_cast<int>(id % L.dilation);
    int64_t rest = id / L.dilation;
    const int64_t line = rest % pl.lines;
    rest /= pl.lines;
    const int64_t hk = rest % p.heads_kv, b = rest / p.heads_kv;
    // Row j of the panel is the token line * L + j * dilation + g: one offset, then steps.
    *first = src.token_offset(b, line * p.shape[pl.la] + g, hk);
    *ncols = nbr::group_length(L, g);
  }
  static constexpr int kBlock = 16;  // columns transposed at once: whole cache lines per write
  static constexpr int kPrefetch = 8;  // tokens ahead (measured: 8 beats 16, 32 and none)
  // Converts panel `id` of a strided tensor into transposed [dim][pitch] floats at `tr` and / or
  // row-major [pitch][dim_pad] floats at `rw` (either may be null), zero beyond the group's
  // length. tmp: kBlock * dim_pad floats. Allocates nothing (see LazyPanels).
  void convert(const Strided& src, int dim, int dim_pad, int64_t id, float* tr, float* rw,
               float* tmp) const {
    int64_t first = 0, step = 0;
    int lg = 0;  // columns
    source(src, id, &first, &step, &lg);
    for (int j0 = 0; j0 < lg; j0 += kBlock) {
      const int nj = lg - j0 < kBlock ? lg - j0 : kBlock;
      for (int j = 0; j < nj; ++j) {
        const int64_t off = first + (j0 + j) * step;
        float* dst = rw ? rw + static_cast<int64_t>(j0 + j) * dim_pad : tmp + j * dim_pad;
        if (j0 + j + kPrefetch < lg)  // the source rows are strided (heads, other tokens between)
          prefetch_row(src, off + kPrefetch * step, dim);
        load_row(src, off, dim, dim_pad, dst);
      }
      if (tr) {  // (columns from lg on get zeros; the padding is zeroed below anyway)
        const float* blk = rw ? rw + static_cast<int64_t>(j0) * dim_pad : tmp;
        for (int j = 0; j < nj; j += pl.vw)
          kern.transpose(blk + static_cast<int64_t>(j) * dim_pad, dim_pad, std::min(pl.vw, nj - j), dim,
                         tr + j0 + j, pitch);
      }
    }
    if (rw) std::fill(rw + static_cast<int64_t>(lg) * dim_pad, rw + static_cast<int64_t>(pitch) * dim_pad, 0.f);
    if (tr)
      for (int e = 0; e < dim; ++e)
        std::fill(tr + static_cast<int64_t>(e) * pitch + lg, tr + static_cast<int64_t>(e + 1) * pitch, 0.f);
  }
  // Panel rows of a tile's box: pointers to column u0 of each row's panel (panel id at `base` +
  // id * panel_floats, or at slot id % slots when slots > 0: see PanelStore).
  template <typename T>
  void rows_of(const TileGeom& tg, const int64_t* key_line, T* base, int64_t panel_floats,
               int64_t col_floats, std::vector<T*>* out, int64_t slots = 0) const {
    out->resize(static_cast<size_t>(tg.s.R));
    const int64_t col = strip ? 0 : tg.u0 * col_floats;  // (a strip panel starts at column u0)
    for (int r = 0; r < tg.s.R; ++r) {
      const int64_t i = id_of(tg, key_line[r]);
      (*out)[static_cast<size_t>(r)] = base + (slots > 0 ? i % slots : i) * panel_floats + col;
    }
  }
};

// Converts the panels on first use, from inside the tile tasks, rather than all of them up front:
// a panel is then still in the converting core's cache when the first tiles read it, and the
// converted tensors never make a round trip through memory. One state per panel: 0 = not
// started, 1 = being converted, 2 = ready.
class LazyPanels {
 public:
  explicit LazyPanels(int64_t count) : state_(static_cast<size_t>(count)) {}
  // Makes panels ids[0 .. n) ready, converting (convert(id)) those no thread has claimed. While
  // another thread finishes one of them, converts `ahead` (a panel needed soon; -1: none) if
  // nobody has claimed it, instead of only waiting.
  template <typename Convert>
  void ensure(const int64_t* ids, int n, int64_t ahead, Convert&& convert) {
    bool busy = false;
    for (int i = 0; i < n; ++i) busy |= !claim_or_ready(ids[i], convert);
    if (!busy) return;
    if (ahead >= 0) claim_or_ready(ahead, convert);
    for (int i = 0; i < n; ++i)
      while (state_[static_cast<size_t>(ids[i])].load(std::memory_order_acquire) != 2)
        std::this_thread::yield();
  }

 private:
  // True when the panel is ready (possibly converted here), false while another thread has it.
  template <typename Convert>
  bool claim_or_ready(int64_t id, Convert& convert) {
    std::atomic<unsigned char>& st = state_[static_cast<size_t>(id)];
    unsigned char v = st.load(std::memory_order_acquire);
    if (v == 2) return true;
    if (v == 0 && st.compare_exchange_strong(v, 1, std::memory_order_acquire)) {
      convert(id);  // must not throw: waiting threads would spin forever
      st.store(2, std::memory_order_release);
      return true;
    }
    return false;
  }
  std::vector<std::atomic<unsigned char>> state_;
};

// Where the K / V panels live while tasks read them. Shared (slots() == 0): one buffer of every
// panel, converted once by the first worker that needs it (LazyPanels). Rings (slots() > 0):
// each worker converts its tasks' panels into its own buffers, panel id into slot id % slots,
// unless the slot still holds it; workers take chunks of consecutive lines (chunk()), so each
// new line converts one row's panels and finds the others. The rings stay in the core's L2:
// panels never go to memory and back, and no core reads panels that another one wrote. Rings
// are used when a task's key rows span few lines of the flattened grid (2-D windows); a 3-D
// box spans many, and rings would convert the same panels over and over.
class PanelStore {
 public:
  // floats[i]: floats per panel of panel set i. bufs: the caller's cached buffers.
  PanelStore(const Plan& plan, int64_t count, int threads, std::vector<int64_t> floats,
             std::vector<Floats>* bufs)
      : floats_(std::move(floats)), bufs_(*bufs), dilation_(static_cast<int>(plan.p.dilation[plan.la])) {
    const Problem& p = plan.p;
    int64_t span = 1, stride = 1;  // lines from a task's first key row to its last
    for (int a = plan.la - 1; a >= 0; --a) {
      span += (p.kernel_size[a] - 1) * p.dilation[a] * stride;
      stride *= p.shape[a];
    }
    // Chunks of deterministic mode, and the test for rings below: about two per worker (each
    // chunk start redoes a box's worth of conversions). Otherwise workers start on one range of
    // lines each and steal halves of the others' ranges down to least_lines_ (parallel_ranges).
    // (Plan::strips: lines of the strips, each of heads_kv tasks, whose panels are per head.)
    const int64_t line_count = plan.strips ? p.batch * static_cast<int64_t>(plan.last_tiles.size()) * plan.lines
                                           : p.batch * p.heads_kv * plan.lines;
    chunk_lines_ = std::max<int64_t>(1, line_count / (2 * threads));
    if (chunk_lines_ > plan.band) chunk_lines_ -= chunk_lines_ % plan.band;  // whole bands
    least_lines_ = std::min(chunk_lines_, (span + plan.band - 1) / plan.band * plan.band);
    if (plan.strips) dilation_ = static_cast<int>(p.heads_kv);  // panels per line (ring_lines)
    const int64_t slots = (span + plan.band) * dilation_;  // a band's lines + the box
    int64_t ring = 0;
    for (int64_t f : floats_) ring += slots * f;
    // Rings when under half of the conversions are redone at chunk starts, and they take
    // <= 64 MB in all. FNA_CPU_PANELS=rings|shared forces a choice (tests run both).
    const char* env = std::getenv("FNA_CPU_PANELS");
    const std::string force = env ? env : "";
    const bool fit = ring * threads <= (int64_t(1) << 24);
    if (force == "rings" ? fit : force != "shared" && chunk_lines_ >= 2 * span && fit) slots_ = slots;
    workers_ = slots_ > 0 ? threads : 1;
    bufs_.resize(floats_.size() * static_cast<size_t>(workers_));
    for (size_t i = 0; i < floats_.size(); ++i)
      for (int w = 0; w < workers_; ++w)
        bufs_[i * static_cast<size_t>(workers_) + static_cast<size_t>(w)].resize(
            static_cast<size_t>((slots_ > 0 ? slots_ : count) * floats_[i]));
    if (slots_ > 0)
      tags_.assign(static_cast<size_t>(threads), std::vector<int64_t>(static_cast<size_t>(slots_), -1));
    else
      lazy_.reset(new LazyPanels(count));
  }
  int64_t slots() const { return slots_; }
  // Consecutive lines whose panels a ring holds at once (0: shared, all of them).
  int64_t ring_lines() const { return slots_ / dilation_; }
  // Tasks per line of a chunk (chunk()): one per tile, or with Plan::strips one per KV head.
  static int64_t tasks_per_line(const Plan& plan) {
    return plan.strips ? plan.p.heads_kv : static_cast<int64_t>(plan.last_tiles.size());
  }
  // Whether `worker`'s ring holds panel id now (rings only).
  bool holds(int worker, int64_t id) const {
    return slots_ > 0 && tags_[static_cast<size_t>(worker)][static_cast<size_t>(id % slots_)] == id;
  }
  int64_t chunk(int64_t tasks_per_line) const { return slots_ > 0 ? chunk_lines_ * tasks_per_line : 1; }
  // The smallest range worth its start (parallel_ranges' `least`): the box's lines, whose
  // panels a range start converts again, in whole bands.
  int64_t least_chunk(int64_t tasks_per_line) const { return slots_ > 0 ? least_lines_ * tasks_per_line : 1; }
  // Panel `index` (a slot, or the id when shared) of set i lies at base(i, worker) + index * floats.
  float* base(size_t i, int worker) {
    return bufs_[i * static_cast<size_t>(workers_) + static_cast<size_t>(slots_ > 0 ? worker : 0)].data();
  }
  // Makes panels ids[0 .. n) readable by `worker`; convert(id, index) fills panel id at `index` of
  // every set. `ahead`: see LazyPanels.
  template <typename Convert>
  void ensure(int worker, const int64_t* ids, int n, int64_t ahead, Convert&& convert) {
    if (slots_ == 0) {
      lazy_->ensure(ids, n, ahead, [&](int64_t id) { convert(id, id); });
      return;
    }
    std::vector<int64_t>& tag = tags_[static_cast<size_t>(worker)];
    for (int i = 0; i < n; ++i) {  // a task's ids are < slots apart: distinct slots
      const size_t slot = static_cast<size_t>(ids[i] % slots_);
      if (tag[slot] != ids[i]) {
        convert(ids[i], static_cast<int64_t>(slot));
        tag[slot] = ids[i];
      }
    }
  }

 private:
  std::vector<int64_t> floats_;
  std::vector<Floats>& bufs_;
  int64_t slots_ = 0, chunk_lines_ = 1, least_lines_ = 1;
  int workers_ = 1, dilation_ = 1;  // (dilation_: panels per line, heads_kv with Plan::strips)
  std::vector<std::vector<int64_t>> tags_;
  std::unique_ptr<LazyPanels> lazy_;
};

inline void gather_additional(const Strided& src, int64_t b, int64_t hk, int A, int dim, int pitch, float* dst) {
  for (int n = 0; n < A; ++n)
    load_row(src, src.token_offset(b, n, hk), dim, pitch, dst + static_cast<int64_t>(n) * pitch);
}

// Per worker: the state of each tile of a work item (see Plan::per_item), and what they share.
struct TileScratch {
  Floats add_k, add_v, q, o, d_o, dq, work, work2;
  std::vector<float> lse, delta;
  std::vector<float> d_add_k, d_add_v, p_add, ds_add;
  std::vector<int64_t> key_line, panel_ids;
  std::vector<const float*> r1, r2, r3;
  std::vector<float*> r4, r5;
  TileGeom tg, next;  // this item's geometry; the next item's, built ahead by plan_hints
  int64_t next_task = -1;
};
struct Scratch {
  std::vector<float> tmp;  // Panels::convert's block
  // Prefetch hints (tile.h: Prefetch): this item's list; the source lines of the panels the
  // next band converts, shared out over the tasks of the band starting at task `ahead_first`.
  HintRows hints, ahead;
  int64_t ahead_first = -1;
  TileScratch tile[2];
};

template <typename V>
typename V::value_type* sized(V& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

inline int max_count(const TileShape& s) {
  int w = 0;
  for (int t = 0; t < s.T; ++t) w = s.col_count[t] > w ? s.col_count[t] : w;
  return w;
}

inline void key_lines(const TileGeom& tg, int64_t last_len, std::vector<int64_t>* out) {
  out->resize(tg.row_token.size());
  for (size_t r = 0; r < tg.row_token.size(); ++r) (*out)[r] = tg.row_token[r] / last_len;
}

// Makes the panels of the tile's box rows ready (converting them with convert(id) as needed);
// `ahead` is the panel of the line after the box's last row, which the next line's tiles need.
// Fills ts.key_line and ts.panel_ids.
template <typename Convert>
void ensure_box(PanelStore& store, int worker, const Panels& panels, const TileGeom& tg, TileScratch& ts,
                Convert&& convert) {
  const int R = tg.s.R;
  key_lines(tg, panels.pl.p.shape[panels.pl.la], &ts.key_line);
  ts.panel_ids.resize(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r)
    ts.panel_ids[static_cast<size_t>(r)] = panels.id_of(tg, ts.key_line[static_cast<size_t>(r)]);
  const int64_t next = ts.key_line[static_cast<size_t>(R - 1)] + 1;
  const int64_t ahead = next < panels.pl.lines ? panels.id_of(tg, next) : -1;
  store.ensure(worker, ts.panel_ids.data(), R, ahead, convert);
}

// The caller's float32 rows of a tile's queries in tensor x (head h), read or written in place:
// query t's row at the result + t * *pitch. Null when x needs a conversion: another dtype, strided
// elements, a padded row (n < n_pad: the kernels read and write n_pad floats), or rows that
// overlap.
template <typename T>
T* direct_rows(const Strided& x, int n, int n_pad, const Plan& plan, const TileGeom& tg, int64_t h,
               int* pitch) {
  if (!x.present() || x.dtype != DType::f32 || x.se != 1 || n != n_pad) return nullptr;
  const int64_t step = plan.ax[plan.la].dilation * x.sl[x.rank - 1];
  if (step < n && tg.s.T > 1) return nullptr;
  if (step > (int64_t(1) << 30)) return nullptr;
  *pitch = static_cast<int>(step);
  return static_cast<T*>(x.data) + x.token_offset(tg.b, tg.q_token[0], h);
}

// The task's geometry, built when the previous item prefetched it (ts.next) or now.
inline TileGeom& task_geom(const Plan& plan, int64_t task, int D, int Dv, int A, TileScratch& ts) {
  if (ts.next_task == task) {
    std::swap(ts.tg, ts.next);
    ts.next_task = -1;
  } else {
    ts.tg.build(plan, task, D, Dv, A);
  }
  return ts.tg;
}

// The geometries of work item `item`'s tasks (Plan::per_item) in sc.tile[k].tg; returns how many
// tasks it has. *paired: whether one kernel call takes them: two tiles of one shape whose boxes'
// panels are all readable at once (with rings: their key rows within `ring_lines` consecutive
// lines of the flattened batch, KV head and line index, the panels of distinct ring slots).
inline int item_geoms(const Plan& plan, int64_t item, int64_t ring_lines, int D, int Dv, int A, Scratch& sc,
                      bool* paired) {
  const int64_t t0 = item * plan.per_item();
  const int n = static_cast<int>(std::min<int64_t>(plan.per_item(), plan.tasks() - t0));
  for (int k = 0; k < n; ++k) task_geom(plan, t0 + k, D, Dv, A, sc.tile[k]);
  *paired = false;
  if (n == 2) {
    const TileShape &a = sc.tile[0].tg.s, &b = sc.tile[1].tg.s;
    *paired = a.T == b.T && a.R == b.R && a.M == b.M;
    for (int t = 0; t < a.T && *paired; ++t)
      *paired = a.col_begin[t] == b.col_begin[t] && a.col_count[t] == b.col_count[t];
    if (*paired && plan.strips) {  // the same tile and head, lines < ring_lines apart
      const TileGeom &ga = sc.tile[0].tg, &gb = sc.tile[1].tg;
      *paired = ga.b == gb.b && ga.tile == gb.tile && ga.hk == gb.hk;
      if (*paired && ring_lines > 0) {
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        for (int k = 0; k < 2; ++k)
          for (int64_t tok : sc.tile[k].tg.row_token) {
            lo = std::min(lo, tok / plan.p.shape[plan.la]);
            hi = std::max(hi, tok / plan.p.shape[plan.la]);
          }
        *paired = hi - lo < ring_lines;
      }
    } else if (*paired && ring_lines > 0) {
      int64_t lo = INT64_MAX, hi = INT64_MIN;
      for (int k = 0; k < 2; ++k) {
        const TileGeom& tg = sc.tile[k].tg;
        const int64_t base = (tg.b * plan.p.heads_kv + tg.hk) * plan.lines;
        for (int64_t tok : tg.row_token) {
          lo = std::min(lo, base + tok / plan.p.shape[plan.la]);
          hi = std::max(hi, base + tok / plan.p.shape[plan.la]);
        }
      }
      *paired = hi - lo < ring_lines;
    }
  }
  return n;
}

// Fills sc.hints for work item `item` of a range of consecutive items ending at `chunk_end`
// (exclusive; one worker runs them in order; < 0: items are not chunked, no hints): the `rows`
// tensors' lines of the next item's query tokens (every head of the KV group), and, with rings,
// this item's share of the source lines of the panels that the next band's tasks will convert
// (those the worker's ring does not hold), of every tensor in `panel_src`.
inline void plan_hints(const Plan& plan, int64_t item, int64_t chunk_end, int worker, const PanelStore& store,
                       const Panels& panels, const std::vector<std::pair<const Strided*, int>>& rows,
                       const std::vector<std::pair<const Strided*, int>>& panel_src, int D, int Dv, int A,
                       Scratch& sc) {
  sc.hints.clear();
  if (chunk_end < 0) return;
  const Problem& p = plan.p;
  const nbr::Axis& L = plan.ax[plan.la];
  const int per = plan.per_item();
  // (Plan::strips with rings: the next band's query rows, every head, are listed with its panels
  // below instead: the band's items read and write the same token rows head after head.)
  const bool band_rows = plan.strips && store.slots() > 0;
  if (item + 1 < chunk_end && !band_rows)
    for (int k = 0; k < per && (item + 1) * per + k < plan.tasks(); ++k) {
      TileScratch& ts = sc.tile[k];
      const TileGeom& nx = ts.next;
      ts.next_task = (item + 1) * per + k;
      ts.next.build(plan, ts.next_task, D, Dv, A);
      for (int64_t gi = 0; gi < plan.group; ++gi)
        for (const auto& r : rows) {  // a tile's queries: consecutive in the group, dilation apart
          const Strided& x = *r.first;
          if (x.present())
            sc.hints.add(x, x.token_offset(nx.b, nx.q_token[0], nx.hk * plan.group + gi),
                         L.dilation * x.sl[x.rank - 1], nx.s.T, r.second);
        }
    }
  if (store.slots() == 0) return;
  // Bands (Plan::band) of band * nt tasks: the next band's lines convert their new panels when
  // their first tiles run (tile-column-major: the band's first tasks).
  const int64_t nt = static_cast<int64_t>(plan.last_tiles.size());
  const int64_t per_line = PanelStore::tasks_per_line(plan), per_band = plan.band * per_line;
  const int64_t task = item * per, first = task - task % per_band;
  if (sc.ahead_first != first) {
    sc.ahead_first = first;
    sc.ahead.clear();
    const int64_t next = first + per_band;
    int64_t next_lines = std::min<int64_t>(plan.band, plan.tasks() / nt - next / nt);
    if (plan.strips) {  // (the band's lines within its strip)
      const int64_t in_strip = next % (plan.lines * per_line);
      next_lines = std::min<int64_t>(plan.band, plan.lines - in_strip / per_band * plan.band);
    }
    if (plan.strips && next < chunk_end * per && next < plan.tasks()) {
      // The rows the next band reads: its query rows (Q, O) and the source rows of every KV
      // head's strip panels its boxes add (its first tasks are its lines' tasks of head 0), each
      // token's heads as one run where they are contiguous (heads-last rows read whole).
      auto whole = [](const Strided& x, int64_t heads, int n) {
        return x.sh == n ? static_cast<int>((heads - 1) * x.sh + n) : 0;
      };
      std::vector<int64_t> seen;
      TileGeom gn;
      for (int64_t l = 0; l < next_lines; ++l) {
        gn.build(plan, next + l, D, Dv, A);
        for (const auto& r : rows) {
          if (!r.first->present()) continue;
          const int w = whole(*r.first, p.heads, r.second);
          for (int64_t h = 0; h < (w ? 1 : p.heads); ++h)
            sc.ahead.add(*r.first, r.first->token_offset(gn.b, gn.q_token[0], h),
                         L.dilation * r.first->sl[r.first->rank - 1], gn.s.T, w ? w : r.second);
        }
        bool all = true;  // every source tensor's heads contiguous
        for (const auto& r : panel_src) all = all && whole(*r.first, p.heads_kv, r.second) > 0;
        auto add_rows = [&](int64_t id, bool every_head) {
          for (const auto& r : panel_src) {
            int64_t off = 0, step = 0;
            int cols = 0;
            panels.source(*r.first, id, &off, &step, &cols);
            sc.ahead.add(*r.first, off, step, cols, every_head ? whole(*r.first, p.heads_kv, r.second) : r.second);
          }
        };
        for (int64_t tok : gn.row_token) {
          bool missing = false;  // some head's panel of this key line
          for (int64_t h = 0; h < p.heads_kv; ++h) {
            gn.hk = h;
            const int64_t id = panels.id_of(gn, tok / p.shape[plan.la]);
            if (store.holds(worker, id) || std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
            seen.push_back(id);
            missing = true;
            if (!all) add_rows(id, false);
          }
          if (all && missing) {  // one run per token: head 0's rows through the last head's
            gn.hk = 0;
            add_rows(panels.id_of(gn, tok / p.shape[plan.la]), true);
          }
        }
      }
    } else if (next < chunk_end * per && next < plan.tasks()) {
      std::vector<int64_t> seen;  // panels already listed
      TileGeom gn;
      for (int64_t l = 0; l < next_lines; ++l) {
        gn.build(plan, next + l, D, Dv, A);  // (tile 0 of the band's line l)
        for (int64_t tok : gn.row_token) {
          const int64_t kl = tok / p.shape[plan.la];
          for (int g = 0; g < L.dilation && g < L.length; ++g) {
            const int64_t id = panels.id(gn.b, gn.hk, kl, g);
            if (store.holds(worker, id) || std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
            seen.push_back(id);
            for (const auto& r : panel_src) {
              const Strided& x = *r.first;
              sc.ahead.add(x, x.token_offset(gn.b, kl * p.shape[plan.la] + g, gn.hk),
                           L.dilation * x.sl[x.rank - 1], nbr::group_length(L, g), r.second);
            }
          }
        }
      }
    }
  }
  const size_t n = sc.ahead.rows.size();
  const int64_t in = task - first;
  sc.hints.rows.insert(sc.hints.rows.end(), sc.ahead.rows.begin() + static_cast<int64_t>(n * in / per_band),
                       sc.ahead.rows.begin() + static_cast<int64_t>(n * std::min(in + per, per_band) / per_band));
  sc.hints.lines = std::max(sc.hints.lines, sc.ahead.lines);
}

}  // namespace driver

// The two halves of the driver (backend.cpp, backward.cpp).
Status forward(const Problem& p, const ForwardArgs& a, const Options& opt);
Status backward(const Problem& p, const BackwardArgs& a, const Options& opt);

}  // namespace cpu
}  // namespace fna
