// The CPU kernels' vector primitives (kernels_impl.h includes this file; the same rules apply:
// compiled once per instruction set, FNA_CPU_ISA and FNA_CPU_VW defined by kernels_<isa>.cpp, no
// std:: templates): the vector types, loads and stores, broadcasts, the written-out fused
// multiply-add, shuffles and horizontal folds (GCC's __builtin_shuffle, clang's
// __builtin_shufflevector), exp2, and the dot products and axpy of whole padded rows.
#pragma once

namespace fna {
namespace cpu {
namespace FNA_CPU_ISA {

constexpr int kVW = FNA_CPU_VW;
typedef float vf __attribute__((vector_size(kVW * 4)));
typedef int vi __attribute__((vector_size(kVW * 4)));

static inline vf ld(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
static inline void st(float* p, vf v) { __builtin_memcpy(p, &v, sizeof(v)); }
static inline vf splat(float x) { return vf{} + x; }
// Broadcast of a float in memory. The x86 forms fold into the FMA as an embedded / memory
// broadcast (a load-port uop); `splat(*p)` compiled to a register broadcast, which competes with
// the FMAs for port 5 on AVX-512 cores.
static inline vf splat_load(const float* p) {
#if FNA_CPU_VW == 16
  return (vf)_mm512_set1_ps(*p);
#elif FNA_CPU_VW == 8
  return (vf)_mm256_broadcast_ss(p);
#else
  return vf{} + *p;
#endif
}
// a * b + c, one rounding where the ISA has FMA (AVX2 / AVX-512), two on the generic ISA. Written
// out because the kernel sources are compiled with -ffp-contract=off (CMakeLists.txt): a compiler
// free to fuse products on its own may fuse the same expression in one inlined copy and not in
// another, and the kernels' bits would then depend on the code path (line / paired / strip order:
// cpu_backend_test's *MatchesLineOrder tests, which failed by one ulp under another GCC).
static inline vf fmadd(vf a, vf b, vf c) {
#if FNA_CPU_VW == 16
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif FNA_CPU_VW == 8
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}
#if defined(__clang__)
// clang's two-operand shuffle takes its lanes as constants: lane l of the result is lane
// L::at(l) of a:b (b's lanes from kVW). (GCC's __builtin_shuffle folds a constant mask vector.)
template <class T, T... I>
struct IntSeq {};
template <class L, int... I>
static inline vf shuffle2_impl(vf a, vf b, IntSeq<int, I...>) {
  return __builtin_shufflevector(a, b, L::at(I)...);
}
template <class L>
static inline vf shuffle2(vf a, vf b) {
  return shuffle2_impl<L>(a, b, __make_integer_seq<IntSeq, int, kVW>{});
}
#endif
static inline vi lanes() {  // 0, 1, .., kVW - 1 (from memory: a loop-built vector is not folded)
  static const int kLanes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  vi l;
  __builtin_memcpy(&l, kLanes, sizeof(l));
  return l;
}
// Horizontal sum / max: log2(kVW) steps, each combining lanes l and l ^ h (literal shuffle
// masks: a loop-built index vector is not folded into a constant).
#if defined(__clang__)  // clang: __builtin_shufflevector with the same literal lanes
#if FNA_CPU_VW == 16
#define FNA_CPU_FOLD(v, OP) \
  v = OP(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7)); \
  v = OP(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11)); \
  v = OP(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13)); \
  v = OP(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14))
#elif FNA_CPU_VW == 8
#define FNA_CPU_FOLD(v, OP) \
  v = OP(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3)); \
  v = OP(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5)); \
  v = OP(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6))
#else
#define FNA_CPU_FOLD(v, OP) \
  v = OP(v, __builtin_shufflevector(v, v, 2, 3, 0, 1)); \
  v = OP(v, __builtin_shufflevector(v, v, 1, 0, 3, 2))
#endif
#else
#if FNA_CPU_VW == 16
#define FNA_CPU_FOLD(v, OP) \
  v = OP(v, __builtin_shuffle(v, vi{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7})); \
  v = OP(v, __builtin_shuffle(v, vi{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11})); \
  v = OP(v, __builtin_shuffle(v, vi{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13})); \
  v = OP(v, __builtin_shuffle(v, vi{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}))
#elif FNA_CPU_VW == 8
#define FNA_CPU_FOLD(v, OP) \
  v = OP(v, __builtin_shuffle(v, vi{4, 5, 6, 7, 0, 1, 2, 3})); \
  v = OP(v, __builtin_shuffle(v, vi{2, 3, 0, 1, 6, 7, 4, 5})); \
  v = OP(v, __builtin_shuffle(v, vi{1, 0, 3, 2, 5, 4, 7, 6}))
#else
#define FNA_CPU_FOLD(v, OP) \
  v = OP(v, __builtin_shuffle(v, vi{2, 3, 0, 1})); \
  v = OP(v, __builtin_shuffle(v, vi{1, 0, 3, 2}))
#endif
#endif
static inline vf vadd(vf a, vf b) { return a + b; }
static inline vf vmax(vf a, vf b) { return a > b ? a : b; }
static inline float hsum(vf v) {
  FNA_CPU_FOLD(v, vadd);
  return v[0];
}
static inline float hmax(vf v) {
  FNA_CPU_FOLD(v, vmax);
  return v[0];
}
#undef FNA_CPU_FOLD

// 2^x for x <= 0 (scores minus their max: callers guarantee the sign, see group_exp; x > 0
// would overflow the exponent bits silently), relative error ~1e-7 (float rounding; 2e-9 before):
// x = n + f with n integer, f in [-0.5, 0.5]; 2^f by a degree-6 minimax polynomial.
static inline vf exp2v(vf x) {
#if FNA_CPU_VW == 16
  // AVX-512: one rounding and one scaling instruction instead of four integer / float steps;
  // scalef takes any finite n (2^n underflows to zero); -inf (a difference of scores that
  // overflowed) would make f = -inf - -inf = NaN, hence the clamp.
  x = (vf)_mm512_maskz_max_ps(__mmask16(0xffff), (__m512)x, _mm512_set1_ps(-256.f));
  const vf n = (vf)_mm512_maskz_roundscale_ps(__mmask16(0xffff), (__m512)x,
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  x = x < -126.f ? splat(-126.f) : x;  // the exponent bits below must stay a normal float's
  const vf n = (x + 12582912.f) - 12582912.f;  // round to nearest (1.5 * 2^23 trick)
#endif
  const vf f = x - n;
  vf p = splat(1.5345810970757157e-4f);
  p = fmadd(p, f, splat(1.3399930903688073e-3f));
  p = fmadd(p, f, splat(9.618489071726799e-3f));
  p = fmadd(p, f, splat(5.550328642129898e-2f));
  p = fmadd(p, f, splat(2.4022646248340607e-1f));
  p = fmadd(p, f, splat(6.931471824645996e-1f));
  p = fmadd(p, f, splat(1.0f));
#if FNA_CPU_VW == 16
  return (vf)_mm512_maskz_scalef_ps(__mmask16(0xffff), (__m512)p, (__m512)n);
#else
  const vi e = __builtin_convertvector(n, vi) << 23;
  vi bits;
  __builtin_memcpy(&bits, &p, sizeof(p));
  bits += e;
  vf out;
  __builtin_memcpy(&out, &bits, sizeof(out));
  return out;
#endif
}
static inline float exp2s(float x) { return exp2v(splat(x))[0]; }

static float dot(const float* a, const float* b, int n) {  // n is a multiple of kVW (padded)
  vf acc = vf{};
  for (int e = 0; e < n; e += kVW) acc = fmadd(ld(a + e), ld(b + e), acc);
  return hsum(acc);
}

// sum a[e] * b[e] in double (exact products, kVW / 2 lanes per accumulator); n padded.
static double dot_f64(const float* a, const float* b, int n) {
  typedef float vh __attribute__((vector_size(kVW * 2)));
  typedef double vd __attribute__((vector_size(kVW * 4)));
  vd acc[2] = {};
  for (int e = 0; e < n; e += kVW)
    for (int h = 0; h < 2; ++h) {
      vh x, y;
      __builtin_memcpy(&x, a + e + h * kVW / 2, sizeof(x));
      __builtin_memcpy(&y, b + e + h * kVW / 2, sizeof(y));
      acc[h] += __builtin_convertvector(x, vd) * __builtin_convertvector(y, vd);
    }
  const vd sum = acc[0] + acc[1];
  double out = 0;
  for (int l = 0; l < kVW / 2; ++l) out += sum[l];
  return out;
}

// sum (a[e] * mult) * b[e]: a score of an additional key, scaled the way tile_scores scales the
// queries (mult = scale * log2(e) folded into the query operand, rounded, before the products).
static float scaled_dot(const float* a, float mult, const float* b, int n) {  // n padded
  const vf m = splat(mult);
  vf acc = vf{};
  for (int e = 0; e < n; e += kVW) acc = fmadd(ld(a + e) * m, ld(b + e), acc);
  return hsum(acc);
}

static void axpy(float a, const float* x, float* y, int n) {  // n padded
  const vf b = splat(a);
  for (int e = 0; e < n; e += kVW) st(y + e, fmadd(b, ld(x + e), ld(y + e)));
}

}  // namespace FNA_CPU_ISA
}  // namespace cpu
}  // namespace fna
