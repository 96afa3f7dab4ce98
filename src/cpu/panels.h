// Internal to the CPU backend: the K / V panels of the driver (see cpu/tile.h) and where they
// live while the tile tasks read them.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "cpu/plan.h"

namespace fna {
namespace cpu {
namespace driver {

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
  // floats[i]: floats per panel of panel set i. bufs: the caller's cached buffers. choice:
  // Tuning::cpu_panels (automatic: the test below).
  PanelStore(const Plan& plan, int64_t count, int threads, std::vector<int64_t> floats,
             std::vector<Floats>* bufs, CpuPanels choice = CpuPanels::automatic)
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
    // (Query lines: a query region's tasks walk its lines only.)
    const int64_t line_count = plan.strips ? p.batch * static_cast<int64_t>(plan.last_tiles.size()) * plan.qlines
                                           : p.batch * p.heads_kv * plan.qlines;
    chunk_lines_ = std::max<int64_t>(1, line_count / (2 * threads));
    if (chunk_lines_ > plan.band) chunk_lines_ -= chunk_lines_ % plan.band;  // whole bands
    least_lines_ = std::min(chunk_lines_, (span + plan.band - 1) / plan.band * plan.band);
    if (plan.strips) dilation_ = static_cast<int>(p.heads_kv);  // panels per line (ring_lines)
    const int64_t slots = (span + plan.band) * dilation_;  // a band's lines + the box
    int64_t ring = 0;
    for (int64_t f : floats_) ring += slots * f;
    // Rings when under half of the conversions are redone at chunk starts, and they take
    // <= 64 MB in all. Tuning::cpu_panels rings (where they fit) or shared forces a choice (tests
    // run both).
    const bool fit = ring * threads <= (int64_t(1) << 24);
    if (choice == CpuPanels::rings ? fit : choice != CpuPanels::shared && chunk_lines_ >= 2 * span && fit)
      slots_ = slots;
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

}  // namespace driver
}  // namespace cpu
}  // namespace fna
