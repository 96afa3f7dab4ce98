// The strip forward's ring of halo rows (fwd_strip.cuh), replayed on the host for the plans that
// strip_plan accepts: per CTA, every warp's hand-backs and waits in program order (its box rows
// kPhases * box_h apart, a hand-back of the bands below each box row's union, a wait per 64-key
// chunk), against a ring whose first `slots` bands are filled at the start and whose band x +
// slots is filled once every warp has handed band x back. A replay that stops with warps left,
// all waiting, is a deadlock: on the GPU, a hang.
//
// The kernel hands bands back in rounds of at most `slots`, each round waiting only for its own
// bands. Waiting first for every band below the target (the earlier kernel) deadlocks where a
// stride on axis 1 moves a warp's next union more than the ring's length ahead: the bands past
// the ring wait on this warp's own hand-backs. That happened on devices with 99 KB or 163 KB of
// shared memory per block (smaller rings), not on the H100's 227 KB in the configurations here.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/fused/kernel/common/strip_plan.h"

namespace {

using fna::fused::Geometry;
using fna::fused::StripParams;
using fna::fused::StripPlan;
using fna::fused::kBoxChunkRows;
using fna::fused::kStripBandRows;
using fna::fused::kStripCols;

enum class Release { per_round, wait_all_first };

struct Config {  // a strip configuration (configs/forward.h FNA_FWD_CONFIGS_STRIP)
  int box_h, box_w, phases;
  int dim;  // the padded head dim (128: two planes per ring, so fewer ring rows)
};
const Config kConfigs[] = {{4, 4, 2, 64}, {4, 4, 3, 64}, {4, 4, 4, 64}, {2, 8, 6, 64},
                           {2, 8, 7, 64}, {2, 8, 8, 64}, {4, 4, 2, 128}, {2, 8, 4, 128}};

// The shared memory a block may opt into: 99 KB (sm_86 / sm_89), 163 KB (sm_80), 227 KB (sm_90).
const int kOptins[] = {101376, 166912, 232448};

// One CTA (dilation groups g1, g2; column strip `strip`; row segment `seg`): true when every warp
// finishes.
bool replay_cta(const Geometry& geo, const StripParams& sp, const Config& cfg, int g1, int g2,
                int strip, int seg, Release rule) {
  const fna::nbr::Axis& a1 = geo.axis[1];
  const fna::nbr::Axis& a2 = geo.axis[2];
  const int len1 = fna::nbr::group_length(a1, g1), len2 = fna::nbr::group_length(a2, g2);
  const int c0 = strip * kStripCols, r0 = seg * sp.seg_rows;
  if (c0 >= len2 || r0 >= len1) return true;  // the kernel's CTA returns at once
  const int r1 = std::min(r0 + sp.seg_rows, len1);
  const fna::nbr::Range h1 = fna::nbr::tile_union(a1, len1, r0, r1);
  const int y0 = h1.begin;
  const int n_bands = (h1.size() + kStripBandRows - 1) / kStripBandRows;
  const int slots = sp.ring_rows / kStripBandRows;
  const int n_release = n_bands - slots;
  const int box_cols = kStripCols / cfg.box_w, warps = box_cols * cfg.phases;
  const int step = cfg.phases * cfg.box_h;

  // Each warp's events: {true, b}: release_below(b); {false, b}: wait_filled(b).
  std::vector<std::vector<std::pair<bool, int>>> ev(warps);
  for (int w = 0; w < warps; ++w) {
    const int phase = w / box_cols, qb2 = c0 + (w % box_cols) * cfg.box_w;
    const bool col_active = qb2 < len2;
    for (int qb1 = r0 + phase * cfg.box_h; qb1 < r1; qb1 += step) {
      const fna::nbr::Range u1 = fna::nbr::tile_union(a1, len1, qb1, std::min(qb1 + cfg.box_h, len1));
      const int u_off = u1.begin - y0, un = u1.size();
      ev[w].push_back({true, u_off / kStripBandRows});
      if (!col_active) continue;
      for (int ch = 0; ch < (un + kBoxChunkRows - 1) / kBoxChunkRows; ++ch)
        ev[w].push_back(
            {false, (u_off + std::min(kBoxChunkRows * ch + kBoxChunkRows, un) - 1) / kStripBandRows});
    }
    ev[w].push_back({true, n_release});
  }

  std::vector<char> filled(std::max(n_bands, 1), 0);
  std::vector<int> handed(std::max(n_bands, 1), 0);
  for (int b = 0; b < std::min(slots, n_bands); ++b) filled[b] = 1;
  auto hand_back = [&](int band) {
    if (++handed[band] == warps) filled[band + slots] = 1;  // band < n_release: in range
  };
  std::vector<size_t> pc(warps, 0);
  std::vector<int> released(warps, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int w = 0; w < warps; ++w) {
      while (pc[w] < ev[w].size()) {
        const auto [release, b] = ev[w][pc[w]];
        if (!release) {
          if (!filled[b]) break;  // waits
          ++pc[w];
        } else {
          const int target = std::min(b, n_release);
          if (released[w] >= target) {
            ++pc[w];
          } else if (rule == Release::per_round) {
            const int n = std::min(target - released[w], slots);
            if (!filled[released[w] + n - 1]) break;  // waits for this round's bands
            for (int i = 0; i < n; ++i) hand_back(released[w] + i);
            released[w] += n;
          } else {
            if (!filled[target - 1]) break;  // waits for every band below the target
            while (released[w] < target) hand_back(released[w]++);
            ++pc[w];
          }
        }
        progress = true;
      }
    }
  }
  for (int w = 0; w < warps; ++w)
    if (pc[w] < ev[w].size()) return false;
  return true;
}

// Every CTA of the problem's launch under `cfg` on a device with `optin` bytes of shared memory;
// `ran` counts the plans that build. False at the first CTA that deadlocks.
bool replay_launch(const Geometry& geo, const Config& cfg, int optin, Release rule, int* ran,
                   std::string* where) {
  const StripPlan plan =
      fna::fused::strip_plan(geo, cfg.box_h, cfg.box_w, cfg.phases, 84, optin, 1.0, cfg.dim);
  if (!plan.ok) return true;
  ++*ran;
  const StripParams& sp = plan.sp;
  for (int g1 = 0; g1 < geo.axis[1].dilation; ++g1)
    for (int g2 = 0; g2 < geo.axis[2].dilation; ++g2)
      for (int strip = 0; strip < sp.strips; ++strip)
        for (int seg = 0; seg < sp.segs; ++seg)
          if (!replay_cta(geo, sp, cfg, g1, g2, strip, seg, rule)) {
            *where = "group (" + std::to_string(g1) + ", " + std::to_string(g2) + ") strip " +
                     std::to_string(strip) + " segment " + std::to_string(seg) + ", ring " +
                     std::to_string(sp.ring_rows) + " rows";
            return false;
          }
  return true;
}

Geometry geometry(int l1, int l2, int k1, int k2, int s1, int s2, int d1, bool causal1) {
  const int64_t len[2] = {l1, l2}, ker[2] = {k1, k2}, dil[2] = {d1, 1}, str[2] = {s1, s2};
  const bool cau[2] = {causal1, false};
  return Geometry::lift(2, len, ker, dil, str, cau);
}

// 40x40, kernel (11, 3), stride (10, 1), 2x8 boxes in 6 phases, 99 KB: a ring of 18 rows. The
// warps of the last phase go from box row 8 (union rows 0-10) to box row 20 (union rows 20-30):
// waiting first for band 9 needs their own hand-back of band 0.
TEST(StripRing, StrideJumpDeadlockedTheEarlierRelease) {
  const Geometry geo = geometry(40, 40, 11, 3, 10, 1, 1, false);
  const Config cfg{2, 8, 6, 64};
  int ran = 0;
  std::string where;
  EXPECT_FALSE(replay_launch(geo, cfg, 101376, Release::wait_all_first, &ran, &where));
  EXPECT_EQ(ran, 1);
  EXPECT_TRUE(replay_launch(geo, cfg, 101376, Release::per_round, &ran, &where)) << where;
}

// Problems across strides, causal first axes, dilation and window sizes, every strip
// configuration and the three shared-memory budgets: the kernel's release never deadlocks (the
// earlier one does on some, so the scan reaches the hazard).
TEST(StripRing, NoDeadlockOverProblemsConfigsAndDevices) {
  int ran = 0, old_deadlocks = 0;
  for (int l1 : {24, 40, 64, 100})
    for (int l2 : {16, 40})
      for (int k1 : {3, 5, 7, 11, 13, 17, 21, 31})
        for (int k2 : {1, 3, 7, 13})
          for (int d1 : {1, 2})
            for (bool causal : {false, true})
              for (int s1 = 1; s1 <= k1; s1 += (k1 > 8 ? 2 : 1)) {
                if (k1 * d1 > l1 || k2 > l2) continue;
                const Geometry geo = geometry(l1, l2, k1, k2, s1, 1, d1, causal);
                for (const Config& cfg : kConfigs)
                  for (int optin : kOptins) {
                    std::string where;
                    int unused = 0;
                    ASSERT_TRUE(replay_launch(geo, cfg, optin, Release::per_round, &ran, &where))
                        << l1 << "x" << l2 << " kernel " << k1 << "x" << k2 << " stride " << s1
                        << " dilation " << d1 << " causal " << causal << " boxes " << cfg.box_h
                        << "x" << cfg.box_w << " phases " << cfg.phases << " smem " << optin
                        << ": " << where;
                    old_deadlocks +=
                        !replay_launch(geo, cfg, optin, Release::wait_all_first, &unused, &where);
                  }
              }
  EXPECT_GT(ran, 1000);
  EXPECT_GT(old_deadlocks, 0);
  std::printf("%d strip plans replayed; the earlier release deadlocked on %d\n", ran,
              old_deadlocks);
}

}  // namespace
