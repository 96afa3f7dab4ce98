// Test support: the docs/semantics.md section 4 correctness criterion. Independent of gtest: every check
// returns a Check value; a gtest test does EXPECT_TRUE(c.ok) << c.str(), a plain program prints it.
//
// Low precision (f16 / bf16):  max|out - ref| <= 2 * max|out_naive - ref| + atol
//   out_naive: the same computation done plainly in the dtype (dense masked attention rounding
//   every intermediate to the dtype, like a plain bf16 PyTorch implementation);
//   atol = 2 * u * max|ref| with u the dtype's unit roundoff (the rounding of ref to the dtype).
// float32: max|out - ref| <= f32_rel * max|ref| (1e-5 by default).
// float32 computed with TF32 products (Tolerance::tf32, forward and backward): the low-precision
//   rule with u = 2^-11 and out_naive = dense attention (and its gradients) with the products'
//   operands (Q, K, P, V, dO, dS) rounded to TF32, float32 accumulation, like a plain TF32 matmul
//   graph.
// NaN never passes; an infinite ref (-inf logits of non-neighbor slots) must be matched exactly.
#pragma once

#include <string>
#include <vector>

#include "fna/fna.h"
#include "support/tensor.h"

namespace fna_test {

struct Check {
  bool ok = true;
  double err = 0.0, bound = 0.0;  // of the worst tensor (largest err / bound)
  std::string what;               // one line per tensor compared
  std::string str() const { return what; }
  void merge(const Check& other);
};

struct Tolerance {
  double f32_rel = 1e-5;   // relative bound for float32 outputs
  bool tf32 = false;       // float32 outputs of TF32 products: judged against a naive TF32 result
  double naive_factor = 2.0;
  double atol_units = 2.0;  // atol in units of u * max|ref|
  // max|ref| is taken as at least this. The whole-call checks set it to the largest max|ref| of
  // the call's gradients, so an exactly-zero gradient (e.g. dQ when a query sees one key) is
  // judged on the call's scale instead of demanding exact zeros.
  double magnitude_floor = 0.0;
};

// Unit roundoff of a dtype: 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16).
double unit_roundoff(fna::DType t);

// Compare one tensor (logical order). `naive` is ignored for float32.
Check compare(const std::string& name, const std::vector<double>& out,
              const std::vector<double>& ref, const std::vector<double>& naive, fna::DType dtype,
              const Tolerance& tol = {});

// ---- The plain low-precision computations (dense masked attention in the dtype) --------------
// Inputs are read from `t` (its dtype is the precision); results are in logical order.
struct NaiveForward {
  std::vector<double> o, lse;
};
struct NaiveBackward {
  std::vector<double> dq, dk, dv, d_add_k, d_add_v;
};
// tf32: operands of the products rounded to TF32 (float32 problems).
NaiveForward naive_forward(const ProblemTensors& t, bool tf32 = false);
NaiveBackward naive_backward(const ProblemTensors& t, bool tf32 = false);  // from t.d_o (and t.d_lse)
std::vector<double> naive_qk(const ProblemTensors& t);     // attn logits (non-neighbors -inf)
std::vector<double> naive_av(const ProblemTensors& t);     // o from t.attn
NaiveBackward naive_qk_backward(const ProblemTensors& t);  // dq, dk, d_add_k from t.d_attn
struct NaiveAVBackward {
  std::vector<double> d_attn, dv, d_add_v;
};
NaiveAVBackward naive_av_backward(const ProblemTensors& t);  // from t.attn and t.d_o

// ---- Whole-call checks: `got` ran the backend under test, `ref` the reference (usually on
// got.as_f32()). The naive result is computed from got's inputs in got's dtype. -----------------
Check check_forward(const ProblemTensors& got, const ProblemTensors& ref, const Tolerance& tol = {});
Check check_backward(const ProblemTensors& got, const ProblemTensors& ref, const Tolerance& tol = {});
Check check_qk(const ProblemTensors& got, const ProblemTensors& ref, const Tolerance& tol = {});
Check check_av(const ProblemTensors& got, const ProblemTensors& ref, const Tolerance& tol = {});
Check check_qk_backward(const ProblemTensors& got, const ProblemTensors& ref,
                        const Tolerance& tol = {});
Check check_av_backward(const ProblemTensors& got, const ProblemTensors& ref,
                        const Tolerance& tol = {});

}  // namespace fna_test
