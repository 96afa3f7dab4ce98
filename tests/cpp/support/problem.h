// Test support: seeded random problems and a brute-force evaluation of the docs/semantics.md neighborhood.
// Independent of gtest so the plain GPU test program (tests/gpu) can use it too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fna/fna.h"

namespace fna_test {

// splitmix64: tiny, fast, and identical on every platform (std distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  int64_t range(int64_t lo, int64_t hi) {  // inclusive [lo, hi]
    return hi <= lo ? lo : lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return uniform() < p; }

 private:
  uint64_t state_;
};

// How the tensors of a case are laid out in memory.
enum class Layout : int {
  contiguous = 0,   // dense heads-last
  heads_first = 1,  // [B, H, L.., D] in memory, seen as a heads-last strided view
  padded = 2,       // heads-last with padding after the innermost dim (stride of H > D)
  mixed = 3,        // each tensor picks one of the above (from the tensor's seed)
};
const char* layout_name(Layout l);

// One test problem: the Problem plus everything else a call needs.
struct Case {
  fna::Problem p;
  double scale = -1.0;   // > 0: explicit Options::scale; otherwise the 1/sqrt(D) default
  Layout layout = Layout::contiguous;
  bool with_lse = true;
  uint64_t seed = 0;     // seeds the tensor values
  double resolved_scale() const;  // the scale the forward op applies
  std::string str() const;        // a one-line description to print on failure
};

// Limits for random problems. `intensity` (>= 1) scales the sizes.
struct RandomLimits {
  int max_axis[3] = {24, 10, 6};   // per rank: the longest axis for rank 1, 2, 3
  int64_t max_dim = 40;
  int64_t max_batch = 2;
  int max_heads_kv = 2;
  int max_group = 3;               // H / H_kv
  int max_additional = 3;
  bool allow_causal = true;
  bool allow_additional = true;
  bool allow_strided_layouts = true;
  std::vector<fna::DType> dtypes = {fna::DType::f32, fna::DType::f16, fna::DType::bf16};
};

// A random valid case, reproducible from (case_index, rank, intensity). rank 0 = any of 1..3.
Case random_case(uint64_t case_index, int rank, int intensity = 1, const RandomLimits& lim = {});
fna::Problem random_problem(uint64_t case_index, int rank, int intensity = 1,
                            const RandomLimits& lim = {});

// ---- docs/semantics.md section 1, evaluated literally (brute force; shares nothing with core/) --
// The window [start, end) in local indices of the query at global coordinate x along one axis.
struct SpecWindow {
  int64_t group, start, end;
};
SpecWindow spec_window(int64_t L, int64_t K, int64_t d, int64_t s, bool causal, int64_t x);
// Is the key at global coordinate y a neighbor of the query at x along this axis?
bool spec_is_neighbor(int64_t L, int64_t K, int64_t d, int64_t s, bool causal, int64_t x, int64_t y);
// The union of the windows of the local queries [i0, i1) of dilation group g along this axis, by
// brute force over spec_is_neighbor: its size, and its first local key in *first.
int spec_window_union(int64_t L, int64_t K, int64_t d, int64_t s, bool causal, int g, int i0,
                      int i1, int* first);
// Is key token `kt` a neighbor of query token `qt` (flattened row-major token indices)?
bool spec_is_neighbor(const fna::Problem& p, int64_t qt, int64_t kt);
// The key tokens of query token qt in the qk/av slot order (row-major over the window box, last
// axis fastest); -1 for slots that are not neighbors. Size W.
std::vector<int64_t> spec_slots(const fna::Problem& p, int64_t qt);

}  // namespace fna_test
