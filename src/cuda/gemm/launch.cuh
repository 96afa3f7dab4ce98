// Host side of cuda-gemm (kernels.cuh): the tile choice and one launcher per operator, with the
// interface of the naive launchers (cuda/naive/launch.cuh) over whole (batch, kv head) pairs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/naive/geometry.cuh"
#include "fna/fna.h"

namespace fna {
namespace gemm {

// What the GEMM kernels take: a device of compute capability 8.0 or newer (mma.sync), head dims
// up to 256, halos that an int indexes, and the shared memory of the widest operator on this
// device. `unsupported` naming the limit otherwise.
Status check(const Problem& p, int device_index);

// out[q, slot] = scale * <A[q], B[key]> (+ the bias entry of the pair with `bias`; the additional
// keys' columns; `masked` where a slot holds no neighbor), for every query row of pairs
// [p0, p0 + pairs).
template <typename TIn, typename TOut>
Status pn(const naive::Geometry& g, int64_t p0, int64_t pairs, const void* a,
          const naive::View& va, const void* b, const naive::View& vb, const void* add_b,
          const naive::AddView& vab, int width, void* out, const naive::View& vo, float scale,
          float masked, cudaStream_t stream, const naive::Bias& bias = naive::Bias{});

// out[q, x] = scale * sum_slot attn[q, slot] * B[key of slot, x] (+ the additional columns).
template <typename TAttn, typename T>
Status nn(const naive::Geometry& g, int64_t p0, int64_t pairs, const void* attn,
          const naive::View& vattn, const void* b, const naive::View& vb, const void* add_b,
          const naive::AddView& vab, int width, void* out, const naive::View& vo, float scale,
          cudaStream_t stream);

// out[key, x] = scale * sum over the queries (and query heads) that see the key of
// attn[q, slot of key] * A[q, x], every key of pairs [p0, p0 + pairs).
template <typename TAttn, typename T>
Status inverse(const naive::Geometry& g, int64_t p0, int64_t pairs, const void* attn,
               const naive::View& vattn, const void* a, const naive::View& va, int width,
               void* out, const naive::View& vo, float scale, cudaStream_t stream);

}  // namespace gemm
}  // namespace fna
