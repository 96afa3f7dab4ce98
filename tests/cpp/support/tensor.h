// Test support: host tensors with arbitrary (possibly non-contiguous) strides, random fill, and the
// full set of tensors of a forward / backward / unfused call. Independent of gtest.
#pragma once

#include <cstdint>
#include <vector>

#include "fna/fna.h"
#include "support/problem.h"

namespace fna_test {

class HostTensor {
 public:
  HostTensor() = default;
  // `order` lists the dims from outermost to innermost in memory (empty = row-major); `pad` extra
  // elements are left after the innermost dim's extent, so the next dim's stride is not dense.
  HostTensor(fna::DType dtype, std::vector<int64_t> extents, std::vector<int> order = {},
             int64_t pad = 0);
  // A tensor of a role laid out per `layout`; heads-first puts dim `heads_dim` right after batch.
  static HostTensor make(fna::DType dtype, const std::vector<int64_t>& extents, Layout layout,
                         int heads_dim, uint64_t layout_seed);

  bool empty() const { return extents_.empty(); }
  fna::DType dtype() const { return dtype_; }
  const std::vector<int64_t>& extents() const { return extents_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t numel() const;                      // logical elements
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  size_t bytes() const { return storage_.size(); }  // storage size (copy this to the device)

  // Uniform values in +-[0.1, 1] * amplitude, never zero. Padding gets NaN so reading it shows.
  void fill_random(uint64_t seed, double amplitude = 1.0);
  void fill(double v);  // every logical element (e.g. NaN to poison an output)

  // Logical (row-major over extents) values as double, and back (rounded to the dtype).
  std::vector<double> to_double() const;
  void from_double(const std::vector<double>& v);
  double get(int64_t logical) const;
  void set(int64_t logical, double v);
  // A copy with the same layout in another dtype (values converted exactly or rounded).
  HostTensor converted(fna::DType dtype) const;

  // A view of this storage (or of a device copy of it at `base`).
  fna::TensorRef ref() { return ref_at(storage_.data()); }
  fna::TensorRef ref_at(void* base) const;

 private:
  int64_t offset(int64_t logical) const;
  fna::DType dtype_ = fna::DType::f32;
  std::vector<int64_t> extents_, strides_;
  std::vector<unsigned char> storage_;
};

// Every tensor of a case. Inputs are filled at construction (attn / d_attn too: they are inputs of
// av / qk_backward); the outputs of forward and backward are poisoned with NaN.
struct ProblemTensors {
  ProblemTensors() = default;
  explicit ProblemTensors(const Case& c);

  Case c;
  HostTensor q, k, v, o, lse, add_k, add_v;   // forward
  HostTensor d_o, dq, dk, dv, d_add_k, d_add_v;  // backward
  HostTensor attn, d_attn;                    // unfused ops: [B, *shape, H, W + N_add]
  HostTensor d_lse;                           // backward input, float32 like lse; empty = none

  // Makes d_lse (the case's layout, random values of `amplitude`, never zero; its own seed, so
  // the other tensors' values do not change).
  void make_d_lse(double amplitude = 1.0);
  void poison_outputs();                      // NaN into o, lse, dq, dk, dv, d_add_*
  fna::ForwardArgs forward_args();
  fna::BackwardArgs backward_args();         // needs o and lse from a forward; d_lse if made
  fna::QKArgs qk_args();
  fna::QKBackwardArgs qk_backward_args();
  fna::AVArgs av_args();
  fna::AVBackwardArgs av_backward_args();
  // The same tensors (same layouts) with every tensor converted to float32: what the reference is
  // run on, so that its float64 result is not rounded to a low-precision output dtype.
  ProblemTensors as_f32() const;
};

fna::Options options_for(const Case& c, fna::Backend backend, int num_threads = 0);

}  // namespace fna_test
