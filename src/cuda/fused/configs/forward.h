// The tables of fused forward configurations (16-bit and float32): the one list that drives
// instantiation (one file per rank and dtype, generated from fwd_inst.cu.in), dispatch and the
// config listing (fna::fused_configs / Options::config).
//
// An entry is X(rank, head_dim, q0, q1, q2, kv0, kv1, kv2, m_tiles, dtype): the padded head dim
// the kernel is compiled for (D and D_v are both padded up to it with zero-filled shared-memory
// columns), the query / key-value tile shapes lifted to three axes (leading extents 1 for lower
// ranks) and the 16-row m-tiles per warp (warps = query tile / (16 * m_tiles)).
// Name: fna_fwd_sm80_<dtype>_d<head_dim>_q<q tile>_kv<kv tile>_w<warps>, tiles over the
// problem's axes.
//
// Why these tiles (measured on an H200, bf16, head dim 128, 2026-11): a warp owns two 16-row
// m-tiles (4 warps per 128-query CTA, 2 CTAs per SM), which halves the shared-memory fragment
// traffic per MMA and ran ~25% faster than one m-tile with 8 warps. 64-key tiles, processed in
// 32-key softmax steps at head dim 128, amortize the copy and the barriers. Multi-dimensional
// shapes keep the haloed key region (query tile + kernel - 1 per axis) close to a cube, which is
// what makes 2-D / 3-D neighborhoods cheap (the paper's section 3.3): 8x16 / 8x8 visits 75% needed
// pairs on 2d-large, 2x8x8 / 2x4x8 65% on 3d-video (4x4x8 / 4x4x4: 60%, 12% slower). Fast tile
// axes of 8 keep the border mask to constant-position bit tests. Head dim 256 uses one m-tile and
// half the keys so O fits the registers and shared memory fits sm_80. The one-m-tile (_w8)
// entries take 71 KiB instead of 107 KiB of shared memory, so head dim 128 also runs on sm_86 /
// sm_89 (99 KiB per block); on H200 they were 14-20% slower. The other alternatives serve
// Options::config / the autotuner; the heuristic (plan/fwd_choice.cu) picks among the entries that fit the
// device by counting visited tiles, ties going to the earlier entry.
#pragma once

#define FNA_FWD_CONFIGS_RANK1(X, DT)   \
  X(1, 32, 1, 1, 128, 1, 1, 64, 2, DT)  \
  X(1, 64, 1, 1, 128, 1, 1, 64, 2, DT)  \
  X(1, 128, 1, 1, 128, 1, 1, 64, 2, DT) \
  X(1, 128, 1, 1, 128, 1, 1, 64, 1, DT) \
  X(1, 256, 1, 1, 64, 1, 1, 32, 1, DT)

#define FNA_FWD_CONFIGS_RANK2(X, DT)  \
  X(2, 32, 1, 8, 16, 1, 8, 8, 2, DT)  \
  X(2, 64, 1, 8, 16, 1, 8, 8, 2, DT)  \
  X(2, 64, 1, 8, 8, 1, 8, 8, 1, DT)   \
  X(2, 128, 1, 8, 16, 1, 8, 8, 2, DT) \
  X(2, 128, 1, 8, 8, 1, 8, 8, 1, DT)  \
  X(2, 256, 1, 8, 8, 1, 4, 8, 1, DT)

#define FNA_FWD_CONFIGS_RANK3(X, DT)  \
  X(3, 32, 2, 8, 8, 2, 4, 8, 2, DT)   \
  X(3, 64, 2, 8, 8, 2, 4, 8, 2, DT)   \
  X(3, 128, 2, 8, 8, 2, 4, 8, 2, DT)  \
  X(3, 128, 2, 8, 8, 2, 4, 8, 1, DT)  \
  X(3, 128, 4, 4, 8, 4, 4, 4, 2, DT)  \
  X(3, 256, 4, 4, 4, 2, 4, 4, 1, DT)

#define FNA_FWD_CONFIGS(X, DT) \
  FNA_FWD_CONFIGS_RANK1(X, DT) FNA_FWD_CONFIGS_RANK2(X, DT) FNA_FWD_CONFIGS_RANK3(X, DT)

// float32 (DT = F32, split TF32, or TF32, plain; one name for both, Options::allow_tf32 picks).
// Elements take twice the bytes, and Q is re-read from shared memory every step (its split
// fragments would not fit the registers), so the tiles are smaller: two m-tiles per warp up to
// head dim 64 (58 / 108 KB), one m-tile and 32 keys at 128, 16 keys at 256 (135 KB: fits sm_80's
// 163 KiB). Fast tile axes of 8 as above. Head dim 128 (measured on an H200, 2026-11, split TF32):
// 128-query tiles with 8 warps (138 KB, one CTA per SM) ran 2d-large 18% and 3d-video 16% faster
// than 64-query tiles with 4 warps (103 KB, two CTAs per SM), 1d-long the same; 64-key tiles
// (170 KB, 4 warps) ran 2.6x slower. Both 128 entries stay: the heuristic picks the 8-warp one
// where its cost model says so.
#define FNA_FWD_CONFIGS_F32_RANK1(X, DT) \
  X(1, 32, 1, 1, 128, 1, 1, 64, 2, DT)    \
  X(1, 64, 1, 1, 128, 1, 1, 64, 2, DT)    \
  X(1, 128, 1, 1, 64, 1, 1, 32, 1, DT)    \
  X(1, 128, 1, 1, 128, 1, 1, 32, 1, DT)   \
  X(1, 256, 1, 1, 64, 1, 1, 16, 1, DT)

#define FNA_FWD_CONFIGS_F32_RANK2(X, DT) \
  X(2, 32, 1, 8, 16, 1, 8, 8, 2, DT)      \
  X(2, 64, 1, 8, 16, 1, 8, 8, 2, DT)      \
  X(2, 128, 1, 8, 8, 1, 4, 8, 1, DT)      \
  X(2, 128, 1, 8, 16, 1, 4, 8, 1, DT)     \
  X(2, 256, 1, 8, 8, 1, 2, 8, 1, DT)

#define FNA_FWD_CONFIGS_F32_RANK3(X, DT) \
  X(3, 32, 2, 8, 8, 2, 4, 8, 2, DT)       \
  X(3, 64, 2, 8, 8, 2, 4, 8, 2, DT)       \
  X(3, 128, 2, 4, 8, 2, 2, 8, 1, DT)      \
  X(3, 128, 2, 8, 8, 2, 2, 8, 1, DT)      \
  X(3, 256, 2, 4, 8, 1, 2, 8, 1, DT)

#define FNA_FWD_CONFIGS_F32(X, DT)                                   \
  FNA_FWD_CONFIGS_F32_RANK1(X, DT) FNA_FWD_CONFIGS_F32_RANK2(X, DT) \
      FNA_FWD_CONFIGS_F32_RANK3(X, DT)

// Hopper (sm_90a, wgmma) configurations, 16-bit only: X(rank, head_dim, q0, q1, q2, kv0, kv1, kv2,
// schedule, dtype). Query tiles of 64 rows per compute warpgroup (64, 128 or 192 rows), key tiles
// of 64 or 128 keys (the border mask keeps one bit per position on axes up to 64 keys and range
// tests beyond); the head dim padded to 64, 128 or 256 (256: warp-specialized 128-query tiles
// only, two K / V stages with K and V handed back apart). The schedule column says which kernel runs the
// tile: Sm90 the plain kernel (fwd_sm90.cuh: every warp copies and computes; NATTEN's "non"
// schedule), Sm90Ws the warp-specialized one (fwd_sm90_ws.cuh: a loader warpgroup feeds the compute
// warpgroups; NATTEN's "coop"). 128-query tiles are listed with both; the plan's cost model picks
// the schedule per problem (plan/fwd_cost.h model_cost: the plain kernel's co-resident CTAs
// against the warp-specialized one's faster pipeline); 64-query tiles run plain only, 192-query
// tiles warp-specialized only.
// Names: fna_fwd_sm90_* / fna_fwd_sm90ws_* <dtype>_d<head_dim>_q<q>_kv<kv>_w<warps> (the
// warp-specialized kernel's warps include its loader warpgroup).
// Built only when FNA_CUDA_ARCHS names 90 (FNA_WITH_SM90); run only on compute capability 9.0,
// where the heuristic prefers them. Measured on an H100 (bf16, 2026-11-22, tools/experiments/fwd_configs.py,
// TFLOP/s): at head dim 128, 128 queries x 64 keys (two CTAs per SM) ran 1d-long 318, 2d-large 243
// (8x16 / 8x8), 3d-video 203 (2x8x8 / 2x4x8); 128-key tiles (one CTA per SM: S and O both take 64
// registers) ran 236 / 190 / 155, and 256-query tiles (four warpgroups) 292 / 210 / 179, so
// neither is listed. At head dim 64 (2d-nat, 13x13 windows) the one-warpgroup 8x8 / 8x8 tile ran
// 44-45 against 40 for 8x16 / 8x16 and 35 for 8x16 / 8x8 (halo waste falls with the query tile);
// 16x4 queries / 4x16 keys (needed pairs 0.391, 6.8 key tiles per query tile, against 0.319 and
// 8.3) then ran 42.2 and 55.5 against 40.6 and 50.3 for 8x8 / 8x8 in two passes of
// tools/experiments/fwd_configs.py (commit f93e010), and the heuristic picks it there.
// The warp-specialized kernel (fwd_sm90_ws.cuh, 2-D and 3-D 128-query tiles) with 128-key tiles at
// head dim 128 (three K/V stages) ran 237 / 209 / 183 against 361 / 316 / 257 for the 64-key
// tiles (commit eb06b1a), so those are not listed either. 192-query tiles (three compute
// warpgroups, warp-specialized only) at rank 3: 3x8x8 / 2x4x8 reads 2/3 of 2x8x8's K / V per query
// for 18-frame windows (both unions take ten 2-frame key tiles) and ran 3d-video in 50.25 ms against
// 55.91 (causal0 39.48 against 42.68; H100, tools/experiments/config_ab.py, commit 8833ffb). At rank 2
// the 192-query tile is 24x8 (each warpgroup 8 rows of 8; an 8x24 tile, whose warpgroups own
// partial rows, computed 10% more pairs than 8x16 and ran 2d-large 1.03x slower, commit 1c97a77):
// 24x8 / 8x8 needs 0.810 of its pairs on 2d-large against 0.746 for 8x16 / 8x8 and ran it in
// 4.82 ms against 5.25, 2d-k3 and 2d-k7 in 0.61 ms against 0.70 / 0.72; at rank 1, q192 / kv64
// ran 1d-long in 0.97 ms against 1.16 (H200, tools/experiments/fwd_configs.py, 2026-11-27).
// Their Q is loaded by TMA one warpgroup's box at a time (a 192-row box with dilation 2 passes
// TMA's 256 rows per dim). Head dim 256: 128-query tiles only (O takes 128 registers per
// thread). 3x8x8 queries over 1x8x8 key tiles: each
// warpgroup (one frame) then needs exactly its own window's frames, where 2-frame key tiles give
// the middle one 20 frames for 18; on 3d-video causal0 it ran 32.698 ms against 34.362 for
// 3x8x8 / 2x4x8, on base 46.124 against 43.032 (its 8-row key tiles waste more at the borders of
// the 48-row axis; H100, tools/experiments/config_ab.py in ABBA order, 2026-11-24). The heuristic's
// cost model (plan/fwd_cost.h model_cost) counts a warpgroup's average run of key tiles, not the
// slowest one's, so whether it still picks it for the causal problem is to be measured.
// Small 3-D windows at head dim 64 (3d-small: 16x32x32, 3x7x7): one-warpgroup tiles whose key
// tiles follow the window's narrow axes, 2x4x8 queries over 4x1x16 keys (needed pairs 0.248, the
// best any searched shape reaches: bench/tiling_bound.py) and 1x8x8 over 1x4x16 (0.219), against
// 0.144 for 2x8x8 / 2x8x8. They ran 3d-small in 0.216 / 0.243 ms against 0.273 (dilation 2:
// 0.204 against 0.272; causal frames 0.217 against 0.257), H200, bench/heuristic_quality.py
// --forward-only, 2026-11-27; the cost model picks them there. The warp-specialized 2x8x8 /
// 1x4x16 (0.281) and 4x4x8 / 4x1x16 were slower and are not listed. Likewise at rank 1, head dim
// 64: 64 queries over 64-key tiles visit two key tiles for a 65-key window where the 128-query
// tile's warpgroups visit three (needed pairs 0.508 against 0.339): 1d-small 0.250 ms against
// 0.304; on 12 random 1-D problems at head dims 32 / 64 the cost model picks the fastest
// configuration 10 times, this tile where a SIMT one ran 1.04x / 1.09x faster the other two
// (H200, same tool and day).
// Head dim 64, 192 queries over 128-key tiles (3x8x8 / 2x8x8): on a whole-grid 16x32x32 problem
// (16 heads) 2.224 ms against 2.382 for the plain 2x8x8 / 2x8x8 (1.00x cuDNN against 0.93x);
// with windows that mask tiles it was slower (3d-video's shape at head dim 64 30.66 against
// 29.96 ms, 9x9x9 1.416 against 1.210, 13x13x13 1.289 against 1.173; ptxas spills 96 bytes, its
// masked path in the loop), so the plan offers it only where no tile is masked
// (plan/fwd_choice.cu deep_enough). At rank 1, q192 / kv128 (28 bytes spilled once the walk no
// longer carried the lifted axes, 180 before) ran 16384 tokens with whole-grid windows in 2.118 ms
// against 2.468 for q128 / kv128 (1.05x cuDNN), 2049-token windows 0.368 against 0.420, 8193
// 1.130 against 1.309, 32768 tokens with 2048 0.698 against 0.809; with 513 0.319 against 0.297
// for q64 / kv64: offered for windows of 1024 or more. The 2-D 24x8 / 8x16 spilled 236 bytes and
// ran slower everywhere (whole grid 1.08x): not listed (H200, 2026-11-28).
#define FNA_FWD_CONFIGS_SM90_RANK1(X, DT)    \
  X(1, 64, 1, 1, 128, 1, 1, 64, Sm90, DT)    \
  X(1, 64, 1, 1, 64, 1, 1, 64, Sm90, DT)     \
  X(1, 64, 1, 1, 128, 1, 1, 64, Sm90Ws, DT)  \
  X(1, 64, 1, 1, 128, 1, 1, 128, Sm90Ws, DT) \
  X(1, 64, 1, 1, 192, 1, 1, 128, Sm90Ws, DT) \
  X(1, 128, 1, 1, 128, 1, 1, 64, Sm90, DT)   \
  X(1, 128, 1, 1, 128, 1, 1, 64, Sm90Ws, DT) \
  X(1, 128, 1, 1, 192, 1, 1, 64, Sm90Ws, DT) \
  X(1, 256, 1, 1, 128, 1, 1, 64, Sm90Ws, DT)

#define FNA_FWD_CONFIGS_SM90_RANK2(X, DT)    \
  X(2, 64, 1, 8, 16, 1, 8, 16, Sm90Ws, DT)   \
  X(2, 64, 1, 8, 16, 1, 8, 16, Sm90, DT)     \
  X(2, 64, 1, 8, 8, 1, 8, 8, Sm90, DT)       \
  X(2, 64, 1, 16, 4, 1, 4, 16, Sm90, DT)     \
  X(2, 128, 1, 8, 16, 1, 8, 8, Sm90Ws, DT)   \
  X(2, 128, 1, 8, 16, 1, 8, 8, Sm90, DT)     \
  X(2, 128, 1, 24, 8, 1, 8, 8, Sm90Ws, DT)   \
  X(2, 256, 1, 8, 16, 1, 8, 8, Sm90Ws, DT)

#define FNA_FWD_CONFIGS_SM90_RANK3(X, DT)    \
  X(3, 64, 2, 8, 8, 2, 8, 8, Sm90Ws, DT)     \
  X(3, 64, 2, 8, 8, 2, 8, 8, Sm90, DT)       \
  X(3, 64, 2, 8, 8, 2, 4, 8, Sm90Ws, DT)     \
  X(3, 64, 2, 8, 8, 2, 4, 8, Sm90, DT)       \
  X(3, 64, 2, 4, 8, 4, 1, 16, Sm90, DT)      \
  X(3, 64, 1, 8, 8, 1, 4, 16, Sm90, DT)      \
  X(3, 64, 3, 8, 8, 2, 8, 8, Sm90Ws, DT)     \
  X(3, 128, 2, 8, 8, 2, 4, 8, Sm90Ws, DT)    \
  X(3, 128, 2, 8, 8, 2, 4, 8, Sm90, DT)      \
  X(3, 128, 3, 8, 8, 2, 4, 8, Sm90Ws, DT)    \
  X(3, 128, 3, 8, 8, 1, 8, 8, Sm90Ws, DT)    \
  X(3, 256, 2, 8, 8, 2, 4, 8, Sm90Ws, DT)

#define FNA_FWD_CONFIGS_SM90(X, DT)                                    \
  FNA_FWD_CONFIGS_SM90_RANK1(X, DT) FNA_FWD_CONFIGS_SM90_RANK2(X, DT) \
      FNA_FWD_CONFIGS_SM90_RANK3(X, DT)

// Box forward configurations (fwd_box.cuh: rank 2, 16-bit, mma.sync, sm_80+): X(head_dim, q1,
// q2, dtype), a CTA tile of q1 x q2 queries made of 4x4 warp boxes. Each warp multiplies its 16
// queries against the union of their own windows only, so for small windows (where a 64-query
// tile's union is mostly masked pairs) it multiplies fewer pairs. The heuristic (plan/fwd_choice.cu,
// box_pairs_ratio) takes only the 16x16 tile, where it applies (box_plan.h) and multiplies at most
// 0.6x the pairs of the best tiled configuration; the smaller tiles copy 1.4-2x the halo rows per
// query and ran 2d-nat slower than the tiled kernel (H100, docs/benchmarks.md), so they serve
// Options::config and the autotuner. Name: fna_fwd_box_<dtype>_d<head_dim>_q<q1>x<q2>_b4x4_w<warps>.
#define FNA_FWD_CONFIGS_BOX(X, DT) X(64, 8, 8, DT) X(64, 16, 8, DT) X(64, 8, 16, DT) X(64, 16, 16, DT)

// Strip forward configurations (fwd_strip.cuh: the box forward's warp boxes on a CTA that walks a
// 16-column strip of queries, its halo rows streamed through a ring): X(head_dim, phases,
// box_h, box_w, dtype), `phases` box rows side by side (16 / box_w x phases warps), warp boxes of
// box_h x box_w queries: 4x4, or 2x8 whose union spans fewer rows where the window's union of
// 8 columns still fits a chunk's 16 (7x7: 8 rows, two 64-key chunks, against 10 rows and three for
// 4x4). Head dim 32: the products skip the ring rows' columns past 32. Head dim 128: two ring
// planes and 8 warps (a 16-query box's O takes 64 registers a thread; capped at 168 registers by
// 12 warps the kernel spilled 88-208 bytes, at 8 warps it does not spill with TMA copies). Name:
// fna_fwd_strip_<dtype>_d<head_dim>_q<box_h * phases>x16_b<box_h>x<box_w>_w<warps>.
#define FNA_FWD_CONFIGS_STRIP(X, DT)                                                       \
  X(64, 2, 4, 4, DT) X(64, 3, 4, 4, DT) X(64, 4, 4, 4, DT) X(64, 6, 2, 8, DT)             \
  X(64, 7, 2, 8, DT) X(32, 3, 4, 4, DT) X(32, 4, 4, 4, DT) X(32, 6, 2, 8, DT)             \
  X(32, 7, 2, 8, DT) X(32, 8, 2, 8, DT) X(128, 2, 4, 4, DT) X(128, 4, 2, 8, DT)

// SIMT forward configurations (fwd_simt.cuh: the CUDA cores, one query per thread, exactly the
// needed pairs; ranks 1-3, 16-bit, no additional keys, sm_80+): X(rank, head_dim, q0, q1, q2,
// dtype), a CTA tile of q0 x q1 x q2 queries (one thread each) whose halo its shared memory holds.
// For windows of a few dozen keys at head dims 32 / 64 its FMAs on exactly the neighbors compete
// with tensor-core tiles that multiply 4-10x the pairs; the plan's cost model (plan/fwd_cost.h
// simt_cost) decides. The 8x8 tiles serve dilation groups of 8 or fewer rows (DiNAT's 56 / 8 = 7).
// Name: fna_fwd_simt_<dtype>_d<head_dim>_q<q tile>_w<warps>.
#define FNA_FWD_CONFIGS_SIMT(X, DT)                                                    \
  X(1, 32, 1, 1, 128, DT) X(1, 32, 1, 1, 256, DT) X(1, 64, 1, 1, 128, DT)                  \
  X(1, 64, 1, 1, 256, DT)                                                                  \
  X(2, 32, 1, 8, 8, DT) X(2, 32, 1, 8, 16, DT) X(2, 32, 1, 16, 16, DT)                     \
  X(2, 64, 1, 8, 8, DT) X(2, 64, 1, 8, 16, DT) X(2, 64, 1, 16, 16, DT)                     \
  X(3, 32, 1, 8, 8, DT) X(3, 32, 2, 8, 8, DT) X(3, 32, 4, 8, 8, DT)                        \
  X(3, 64, 1, 8, 8, DT) X(3, 64, 2, 8, 8, DT) X(3, 64, 4, 8, 8, DT)
