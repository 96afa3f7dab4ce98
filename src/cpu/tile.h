// The CPU backend's tile contract: what the driver (backend.cpp) gathers for one tile of queries
// and what the ISA-specific kernels (kernels_impl.h, compiled once per instruction set) compute.
//
// A tile is up to kTileQueries queries that are consecutive (in local dilation-group indices) along
// the LAST axis and share every other coordinate, so they share the windows of all other axes: the
// key box is R "rows" (the product of those windows) times M columns (the union of the queries'
// last-axis windows). Query t's neighbors are columns [col_begin[t], col_begin[t] + col_count[t])
// of every row. Additional keys are A extra keys every query sees.
#pragma once

#include <cstdint>

#include "fna/fna.h"

namespace fna {
namespace cpu {

#ifndef FNA_CPU_TILE_QUERIES  // tuning knob (compile-time overridable for experiments)
#define FNA_CPU_TILE_QUERIES 32  // measured best of 16 / 32 on the 13x13 benchmark
#endif
constexpr int kTileQueries = FNA_CPU_TILE_QUERIES;

// The AVX2 / AVX-512 kernel sets need x86 and GCC's target pragmas (clang: its target attribute
// pragma); elsewhere only the portable kernels are built (avx2_kernels() / avx512_kernels() report
// null).
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FNA_CPU_X86_KERNELS 1
#else
#define FNA_CPU_X86_KERNELS 0
#endif

struct TileShape {
  int T = 0;      // queries
  int R = 0;      // key rows
  int M = 0;      // key columns (box width)
  int D = 0, Dp = 0;    // head dim and its padding to the vector width
  int Dv = 0, Dvp = 0;  // value head dim and its padding
  int A = 0;            // additional keys
  int col_begin[kTileQueries];
  int col_count[kTileQueries];
};

// Keys and values are converted into float "panels" as the tiles first need them (backend.cpp's
// PanelStore), one per (batch, KV head, line of the other axes, dilation group of the last
// axis), in two layouts: transposed [dim][pitch] (columns contiguous: scores vectorize over keys)
// and row-major [pitch][dim_pad] (P V, dQ, dK, dV vectorize over the head dim). A tile sees row r
// of its box through pointers already offset to the box's first column.
// Cache lines the driver wants in L2 before the next tiles: the next tile's query / output rows
// and the source rows of the key / value panels the next line converts. The kernels issue them a
// few at a time between their FMA blocks, so the memory latency hides behind this tile's math
// instead of stalling the copies (which otherwise ran out of line-fill buffers in bursts).
struct Prefetch {
  const char* const* rows = nullptr;  // n rows, each `lines` cache lines from its pointer on
  int n = 0, lines = 0;
};

// A relative positional bias (ForwardArgs::rpb) of one head, for the kernels: `table` is the
// head's dense table [2 K_0 - 1 ..] scaled by log2(e) (scores are base 2), and the bias of query
// t and box column m of row r is table[row[r] + col[t] + m] (TileGeom::bias_row / bias_col).
// Null table: no bias.
struct TileBias {
  const float* table = nullptr;
  const int64_t* row = nullptr;  // [R]
  const int64_t* col = nullptr;  // [T]
};

struct ForwardTile {
  TileShape s;
  TileBias bias;
  Prefetch prefetch;
  int pitch = 0;                // columns per transposed panel row (>= every read, zero padded)
  float scale_log2 = 0;         // scale * log2(e): scores are kept in base 2
  // Query t's row is q + t * q_pitch (Dp floats, zero beyond D), its output row o + t * o_pitch
  // (Dvp floats written): the driver's buffers, or the caller's float32 tensors themselves when
  // their rows need no conversion and no padding.
  int q_pitch = 0, o_pitch = 0;
  const float* q;               // [T][q_pitch]
  const float* const* kt_rows;  // [R] -> [D][pitch] transposed keys
  const float* const* v_rows;   // [R] -> [M][Dvp] values
  const float* add_k;           // [A][Dp]
  const float* add_v;           // [A][Dvp]
  float* o;                     // [T][o_pitch] normalized output
  float* lse;                   // [T] natural-log LSE
  float* scratch;               // >= R * padded_window(max count) + A floats
};

// Backward for one query head: P (from the row's recomputed max and sum, not the saved float32
// LSE: kernels_impl.h, backward_finish), dS, dQ; dK / dV are accumulated in place.
struct BackwardTile {
  TileShape s;
  TileBias bias;
  double* d_bias = nullptr;     // with a bias: the head's dense gradient table (accumulated:
                                // += dS of every pair, natural-log units)
  Prefetch prefetch;
  int pitch = 0;
  float scale = 0, scale_log2 = 0;
  int q_pitch = 0, do_pitch = 0, o_pitch = 0, dq_pitch = 0;  // as in ForwardTile
  const float* q;               // [T][q_pitch]
  const float* d_o;             // [T][do_pitch]
  const float* o;               // [T][o_pitch] the forward's output
  float* delta;                 // scratch [T]: rowsum(dO * O) - d_lse
  const float* d_lse = nullptr; // [T] the gradient into each query's LSE; null = zero
  const float* const* kt_rows;  // [R] -> [D][pitch]
  const float* const* k_rows;   // [R] -> [M][Dp]
  const float* const* vt_rows;  // [R] -> [Dv][pitch]
  const float* add_k;           // [A][Dp]
  const float* add_v;           // [A][Dvp]
  float* dq;                    // [T][dq_pitch]  (written)
  float* const* dk_rows;        // [R] -> [M][Dp]  (accumulated)
  float* const* dv_rows;        // [R] -> [M][Dvp] (accumulated)
  float* d_add_k;               // [A][Dp]  (accumulated)
  float* d_add_v;               // [A][Dvp] (accumulated)
  float* p;                     // scratch [T][R][Wp] probabilities
  float* ds;                    // scratch [T][R][Wp] dS
  float* p_add;                 // scratch [T][A] (the additional keys' scores, then P)
  float* ds_add;                // scratch [T][A]
};

// Columns a query's window occupies in the score buffers, padded to the vector width.
inline int padded_window(int count, int vw) { return (count + vw - 1) / vw * vw; }

// Per-ISA kernel table.
struct Kernels {
  const char* name;
  int vector_width;  // floats per vector
  // n = 1 or 2 tiles of one TileShape (the same query columns and windows of two lines, say):
  // the box rows both read (the same panel row pointers) are loaded once for both tiles' scores.
  // The prefetch hints of tiles[0] serve the call.
  void (*forward)(const ForwardTile* tiles, int n);
  void (*backward)(const BackwardTile* tiles, int n);
  // Transposes n <= vector_width rows into the columns of a [dim][pitch] panel (see
  // kernels_impl.h): the K / V panels' conversion.
  void (*transpose)(const float* rows, int row_pitch, int n, int dim, float* out, int64_t pitch);
};

const Kernels& best_kernels();     // the best the CPU and the build have (cpu_isa automatic)
// The kernel set of `isa` (automatic: best_kernels()); null when the CPU or the build lacks it.
const Kernels* kernels_for(CpuIsa isa);
// kernels_for(opt.tuning.cpu_isa), or an unsupported Status naming `tuning cpu_isa='...'` when
// the CPU or the build lacks the set asked for (no silent fallback).
Status select_kernels(const Options& opt, const Kernels** out);
const Kernels& generic_kernels();  // portable fallback (for tests)
const Kernels* avx2_kernels();     // null when the CPU lacks AVX2 + FMA
const Kernels* avx512_kernels();   // null when the CPU lacks AVX-512F

}  // namespace cpu
}  // namespace fna
