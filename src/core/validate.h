// Validation at the API boundary. Every message names the argument and its value.
#pragma once

#include "fna/fna.h"

namespace fna {
namespace detail {

// One tensor argument to check: its role name (as the user knows it), view, extents, dtype size.
struct TensorCheck {
  const char* name;
  const TensorRef* ref;
  int ndim;
  int64_t extents[kMaxDims];
  int64_t elem_size;
  bool output;
  bool required;
};

Status check_tensor(const TensorCheck& t, const Options& opt);

// Extents of each role for a problem.
// Q-role tensors (region = true: Q, O, dO, dQ) have the query region's extents
// (Problem::query_extent), K-role tensors the grid's; LSE has the region's.
void extents_qo(const Problem& p, int64_t heads, int64_t dim, int64_t* out, int* ndim,
                bool region = false);
void extents_lse(const Problem& p, int64_t* out, int* ndim);
void extents_add(const Problem& p, int64_t dim, int64_t* out, int* ndim);

// Options::tuning against the problem and the backend that runs the call (core/tuning.cpp).
Status validate_tuning(const Problem& p, const Tuning& t, Backend resolved, bool unfused);

Status validate_options(const Problem& p, const Options& opt, Backend* resolved, bool unfused);

// A thread count (Options::num_threads, fna::set_num_threads, the Python bindings' int64 argument
// `name`) in [0, kMaxThreads]; the message names `name` and the value.
Status check_num_threads(int64_t n, const char* name = "num_threads");

}  // namespace detail
}  // namespace fna
