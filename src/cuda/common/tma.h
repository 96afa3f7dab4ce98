// Tensor maps for the Tensor Memory Accelerator (TMA, compute capability 9.0): the host side.
// A fused kernel's tile of a token tensor -- a box of rows, consecutive on every axis of the
// grid, of one (batch, head) -- is one TMA box once the tensor is described as a 5-D tiled
// tensor: dim 0 the head dim (64 columns, 128 bytes, per box, with the 128-byte swizzle the wgmma
// kernels read), dims 1-4 the lifted tensor's other dims whose length is above 1 (head, axis 2,
// axis 1, axis 0, batch: innermost first), padded with dims of length 1; a dilated axis is
// traversed with an element stride. Rows past an axis's end
// (tiles overhanging the grid) and columns past the head dim arrive as zeros (TMA's out-of-bounds
// fill), as the cp.async copies write them. Device side: tma.cuh.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

namespace fna {
namespace tma {

// Where the coordinate of a map's dim 1 + i comes from.
enum Role : int8_t { kPad = -1, kHead = 0, kAxis0 = 1, kAxis1 = 2, kAxis2 = 3, kBatch = 4 };

struct TokenMap {  // CUtensorMap carries its own (128-byte) alignment
  CUtensorMap map;
  int8_t role[4];
};

// The map of a 16-bit tensor at `base` with `dim` columns (unit stride), lifted to
// [batch, axis 0, axis 1, axis 2, head] with `len` and `stride` (elements), for boxes of `box`
// rows per axis, every `dil`-th token of the axis (a dilation group: the box's coordinate on the
// axis is then its first row's global coordinate), one batch, one head, 64 columns. False with
// `why` when TMA cannot describe it: more than four dims of length > 1, a base or stride that is
// not a multiple of 16 bytes, a dilation above 8 or box * dilation above 256, or no driver entry
// point. `dim` > 0; box extents >= 1.
bool token_map(TokenMap* m, const void* base, int64_t dim, const int64_t (&len)[5],
               const int64_t (&stride)[5], const int (&box)[3], const int (&dil)[3],
               std::string* why);

}  // namespace tma
}  // namespace fna
