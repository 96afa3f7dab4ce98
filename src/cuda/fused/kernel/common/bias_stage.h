// The staged layout of a relative positional bias table in shared memory (host and device, no
// CUDA headers): the head's table divided by the scale, element strides stage_stride per lifted
// axis, after a kernel's own shared memory. The tiled forwards stage it when it fits
// (FwdParams::rpb_staged, fwd_bias.cuh stage_bias), the box and strip forwards always.
#pragma once

#include <cstddef>

#include "core/neighborhood.h"  // FNA_HD

namespace fna {
namespace fused {

// A staged bias table starts at bias_stage_offset(own) after a kernel's own `own` bytes of
// shared memory.
constexpr size_t bias_stage_offset(size_t own) { return (own + 15) / 16 * 16; }
// (lifted axes 0, 1, 2: 1024, 32, 1)
constexpr int stage_stride(int ax) { return ax == 0 ? 1024 : (ax == 1 ? 32 : 1); }
// Whether the staged layout holds a table of kernel sizes `kernel` (lifted), and its bytes.
FNA_HD bool bias_stageable(const int* kernel, size_t* bytes) {
  *bytes = 4 * size_t(2 * kernel[2] - 1);
  if (kernel[0] > 1) *bytes = 4 * size_t(2 * kernel[0] - 1) * stage_stride(0);
  else if (kernel[1] > 1) *bytes = 4 * size_t(2 * kernel[1] - 1) * stage_stride(1);
  const bool last = (kernel[0] == 1 && kernel[1] == 1) || 2 * kernel[2] - 1 <= stage_stride(1);
  const bool middle = kernel[0] == 1 || 2 * kernel[1] - 1 <= stage_stride(0) / stage_stride(1);
  return last && middle;
}

// The key-tile slices of a table (fwd_bias.cuh BiasSlice): for a box of w[a] query rows against
// key tiles of k[a] keys per axis, the relative positions one tile's pairs address span
// w[a] + k[a] - 1 per axis; the floats of a slice, and the bytes of `parts` warpgroups' two
// buffers of slices (each padded to 16 bytes).
FNA_HD constexpr int bias_slice_floats(int w0, int w1, int w2, int k0, int k1, int k2) {
  return (w0 + k0 - 1) * (w1 + k1 - 1) * (w2 + k2 - 1);
}
FNA_HD constexpr size_t bias_slice_bytes(int floats, int parts) {
  return size_t(2) * size_t(parts) * size_t((floats + 3) / 4 * 4) * sizeof(float);
}

}  // namespace fused
}  // namespace fna
