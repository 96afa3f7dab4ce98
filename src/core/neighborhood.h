// The one definition of the neighborhood (docs/semantics.md section 1), shared by every kernel, host and
// device. The CPU reference deliberately does NOT include this file: it re-derives membership from
// the definition so that a bug here cannot hide.
//
// Everything is per axis, in the *local* coordinates of one dilation group: a token at global
// coordinate x belongs to group g = x % d at local index i = x / d, and the group has
// L_g = ceil((L - g) / d) tokens. The key at local index j of group g is the token j * d + g.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FNA_HD __host__ __device__ __forceinline__
#else
#define FNA_HD inline
#endif

namespace fna {
namespace nbr {

// One axis of the problem.
struct Axis {
  int length;    // L
  int kernel;    // K
  int dilation;  // d
  int stride;    // s
  bool causal;
};

// Half-open interval [begin, end) of local indices.
struct Range {
  int begin;
  int end;
  FNA_HD int size() const { return end > begin ? end - begin : 0; }
};

// Number of tokens of dilation group g. `div_d(n)` returns n / a.dilation (the kernels pass a
// multiply-and-shift division, fused::FastDiv).
template <class DivD>
FNA_HD int group_length(const Axis& a, int g, const DivD& div_d) {
  return div_d(a.length - g + a.dilation - 1);
}
FNA_HD int group_length(const Axis& a, int g) {
  return group_length(a, g, [&](int n) { return n / a.dilation; });
}

// The window of the query at local index i in a group of length lg: [start, end).
// Non-causal windows always hold exactly K keys (they slide inward at borders); causal windows are
// truncated near the start of the axis.
FNA_HD Range window(const Axis& a, int lg, int i) {
  const int K = a.kernel, s = a.stride;
  if (a.causal) {
    int leader = s == 1 ? i : (i / s) * s + s - 1;  // no division for the common stride 1
    leader = leader < lg - 1 ? leader : lg - 1;
    int start = leader - K + 1;
    start = start > 0 ? start : 0;
    int end = i + 1 < lg ? i + 1 : lg;
    return {start, end};
  }
  const int left = K / 2, right = K - 1 - left;
  int leader = s == 1 ? i : (i / s) * s + s / 2;
  leader = leader < lg - 1 ? leader : lg - 1;
  int start = leader - left > 0 ? leader - left : 0;
  if (leader + right >= lg) start += lg - right - leader - 1;
  return {start, start + K};
}

// Window start and end are both non-decreasing in i (see docs/design.md), so the queries whose
// windows contain key j form one contiguous range: the inverse neighborhood. Found by binary search
// on the two monotone bounds. A window holds K keys and its leader is within s of its query
// (stride s <= K), so every query whose window holds j, and both searches' answers, lie in
// [j - K - s, j + K + s + 1) (clamped to the group): the searches take O(log(K + s)) steps
// whatever the length (the kernels run them per CTA, tests/cpp/inverse_neighborhood_test.cpp
// checks them against brute force).
FNA_HD int inverse_search_lo(const Axis& a, int j) {
  const int v = j - a.kernel - a.stride;
  return v > 0 ? v : 0;
}
FNA_HD int inverse_search_hi(const Axis& a, int lg, int j) {
  // min(j + K + s + 1, lg) without forming the sum where it would pass lg: with K and s near an
  // axis of 2^30 it would pass 2^31.
  return lg - j - a.stride > a.kernel + 1 ? j + a.kernel + a.stride + 1 : lg;
}
// First i with window(i).end > j: the inverse neighborhood's first query.
FNA_HD int inverse_begin(const Axis& a, int lg, int j) {
  int lo = inverse_search_lo(a, j), hi = inverse_search_hi(a, lg, j);
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (window(a, lg, mid).end > j) hi = mid; else lo = mid + 1;
  }
  return lo;
}
// First i >= from with window(i).begin > j: one past the inverse neighborhood's last query.
FNA_HD int inverse_end(const Axis& a, int lg, int j, int from) {
  const int slo = inverse_search_lo(a, j);
  int lo = from > slo ? from : slo, hi = inverse_search_hi(a, lg, j);
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (window(a, lg, mid).begin > j) hi = mid; else lo = mid + 1;
  }
  return lo;
}
FNA_HD Range inverse_window(const Axis& a, int lg, int j) {
  const int first = inverse_begin(a, lg, j);
  return {first, inverse_end(a, lg, j, first)};
}

// Keys needed by a tile of queries [i0, i1) (local indices): the union of their windows, which by
// monotonicity is [window(i0).begin, window(i1 - 1).end).
FNA_HD Range tile_union(const Axis& a, int lg, int i0, int i1) {
  return {window(a, lg, i0).begin, window(a, lg, i1 - 1).end};
}

// Keys in *every* window of the tile [i0, i1): [window(i1 - 1).begin, window(i0).end). Key tiles
// inside this range need no mask.
FNA_HD Range tile_intersection(const Axis& a, int lg, int i0, int i1) {
  return {window(a, lg, i1 - 1).begin, window(a, lg, i0).end};
}

// Queries that need any key of [j0, j1): the union of inverse windows (monotone too).
FNA_HD Range inverse_tile_union(const Axis& a, int lg, int j0, int j1) {
  const int first = inverse_begin(a, lg, j0);
  return {first, inverse_end(a, lg, j1 - 1, first)};
}

// tile_union, or with `inverse` inverse_tile_union: the union a box of queries, or of keys (the
// strip dK / dV kernel's), needs on one axis.
FNA_HD Range tile_union_of(const Axis& a, int lg, int i0, int i1, bool inverse) {
  return inverse ? inverse_tile_union(a, lg, i0, i1) : tile_union(a, lg, i0, i1);
}

// Number of keys attended by the query (product over axes of window sizes); used for FLOP counts.
FNA_HD int window_size(const Axis& a, int lg, int i) { return window(a, lg, i).size(); }

// Index along axis `a` of a relative positional bias table ([H, 2 K_0 - 1, ..]) for local query i
// and local key j of one dilation group: their offset in units of the dilation, plus K - 1
// (docs/semantics.md section 1.3). In [0, 2 K - 1) for every neighbor.
FNA_HD int bias_index(const Axis& a, int i, int j) { return j - i + a.kernel - 1; }

}  // namespace nbr
}  // namespace fna
