// Internal to the CPU backend: the work plan and tile geometry of the driver (backend.cpp,
// backward.cpp), float buffers, row loads / stores and prefetch hints.
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
// With a query region (Problem::query_offset / query_shape) only the region's queries are tiled:
// the tasks walk the region's lines (qlines, the region's coordinates on the axes before the
// last) and last_tiles cover the region's stretch of the last axis; query tokens stay grid tokens
// (the Q-role tensors are addressed through region_in_grid views), and the key side (`lines`,
// the panels) is the whole grid's.
struct Plan {
  const Problem& p;
  int la;  // last axis
  nbr::Axis ax[kMaxRank];
  int64_t N, lines, group;
  int64_t q_off[kMaxRank] = {0, 0, 0}, q_ext[kMaxRank] = {1, 1, 1};  // the query region
  int64_t qlines;  // query lines: the region's lines (= lines without a region)
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
    qlines = 1;
    for (int a = 0; a < p.rank; ++a) {
      q_off[a] = p.query_offset[a];
      q_ext[a] = p.query_extent(a);
      if (a < la) qlines *= q_ext[a];
    }
    const nbr::Axis& L = ax[la];
    // Group g's local indices whose coordinates i * d + g lie in [q_off, q_off + q_ext).
    const int64_t x0 = q_off[la], x1 = q_off[la] + q_ext[la];
    for (int g = 0; g < L.dilation && g < L.length; ++g) {
      const int lo = x0 > g ? static_cast<int>((x0 - g + L.dilation - 1) / L.dilation) : 0;
      const int hi = x1 > g ? static_cast<int>((x1 - g + L.dilation - 1) / L.dilation) : 0;
      for (int i0 = lo; i0 < hi; i0 += kTileQueries)
        last_tiles.push_back({g, i0, i0 + kTileQueries < hi ? i0 + kTileQueries : hi});
    }
  }
  int64_t tasks() const {
    return p.batch * p.heads_kv * qlines * static_cast<int64_t>(last_tiles.size());
  }
  // The grid coordinate on axis a < la of query line `line` (an index over the region's lines).
  int64_t line_coord(int64_t line, int a) const {
    int64_t st = 1;
    for (int x = a + 1; x < la; ++x) st *= q_ext[x];
    return q_off[a] + (line / st) % q_ext[a];
  }
};

// One tile's geometry: which query tokens, which key tokens (rows x columns).
struct TileGeom {
  int64_t b, hk;  // batch and KV head of the task
  int64_t line, tile;  // query line (Plan::qlines) and last-axis tile (Plan::last_tiles) of the task
  TileShape s;
  int64_t q_token[kTileQueries];
  std::vector<int64_t> row_token;  // token index of each row's key with last coordinate 0
  // Relative positional bias (tile.h: TileBias): each row's offset into a head's dense table
  // [2 K_0 - 1 ..] (its axes before the last), and each query's offset of box column 0 on the
  // last axis: (u0 - i_t) + K_last - 1.
  std::vector<int64_t> bias_row;
  int64_t bias_col[kTileQueries];
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
      const int64_t L = pl.qlines, H = p.heads_kv, per_b = nt * L * H;
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
    line = rest % pl.qlines;  // (a line of the query region)
    rest /= pl.qlines;
    hk = rest % p.heads_kv;
    b = rest / p.heads_kv;
    const Plan::LastTile& lt = pl.last_tiles[tile];
    // Grid coordinates of the line on the axes before the last, and their windows.
    int64_t coord[kMaxRank] = {0, 0, 0};
    for (int a = pl.la - 1; a >= 0; --a) coord[a] = pl.line_coord(line, a);
    row_token.assign(1, 0);
    bias_row.assign(1, 0);
    for (int a = 0; a < pl.la; ++a) {
      const nbr::Axis& x = pl.ax[a];
      const int ga = static_cast<int>(coord[a] % x.dilation), ia = static_cast<int>(coord[a] / x.dilation);
      const nbr::Range w = nbr::window(x, nbr::group_length(x, ga), ia);
      const int64_t span = 2 * static_cast<int64_t>(x.kernel) - 1;  // the table's extent on this axis
      std::vector<int64_t> next;
      std::vector<int64_t> next_bias;
      next.reserve(row_token.size() * static_cast<size_t>(w.size()));
      next_bias.reserve(next.capacity());
      for (size_t r = 0; r < row_token.size(); ++r)
        for (int j = w.begin; j < w.end; ++j) {
          next.push_back((row_token[r] + static_cast<int64_t>(j) * x.dilation + ga) * p.shape[a + 1]);
          next_bias.push_back(bias_row[r] * span + (j - ia + x.kernel - 1));
        }
      row_token.swap(next);
      bias_row.swap(next_bias);
    }
    {  // the last axis is the table's fastest: scale the rows' offsets by its extent
      const int64_t span = 2 * static_cast<int64_t>(pl.ax[pl.la].kernel) - 1;
      for (int64_t& o : bias_row) o *= span;
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
      bias_col[t] = static_cast<int64_t>(u0) - (lt.i0 + t) + L.kernel - 1;
      q_token[t] = line_token + static_cast<int64_t>(lt.i0 + t) * L.dilation + lt.g;
    }
    s.D = D;
    s.Dp = round_up(D, pl.vw);
    s.Dv = Dv;
    s.Dvp = round_up(Dv, pl.vw);
    s.A = A;
  }
};

}  // namespace driver
}  // namespace cpu
}  // namespace fna
