// What the plans report of themselves outside a launch: the family names, the record of the last
// launches (core/launch_record.h) that the tests compare with fna::fused_plan, and the reset of
// the autotuner's in-process choices.
#include <mutex>
#include <string>

#include "core/autotune.h"
#include "core/launch_record.h"
#include "cuda/fused/plan/autotune_device.h"
#include "cuda/fused/plan/plan.h"

namespace fna {
namespace detail {

void autotune_clear_all() {
  autotune_clear_memory_cache();
  AutotuneMemo::get().clear();
}

namespace {
std::mutex launch_mu;
LaunchRecord launch_record;
}  // namespace

LaunchRecord last_launch() {
  std::lock_guard<std::mutex> lock(launch_mu);
  return launch_record;
}

void record_forward_launch(const std::string& config, bool tma, unsigned grid, size_t smem) {
  std::lock_guard<std::mutex> lock(launch_mu);
  launch_record.forward = config;
  launch_record.forward_tma = tma;
  launch_record.forward_grid = grid;
  launch_record.forward_smem = smem;
}

void record_backward_launch(const std::string& config, bool tma) {
  std::lock_guard<std::mutex> lock(launch_mu);
  launch_record.backward = config;
  launch_record.backward_tma = tma;
}

}  // namespace detail

namespace fused {

const char* family_name(FwdFamily f) {
  switch (f) {
    case FwdFamily::sm80: return "sm80";
    case FwdFamily::sm90: return "sm90";
    case FwdFamily::sm90ws: return "sm90ws";
    case FwdFamily::box: return "box";
    case FwdFamily::strip: return "strip";
    case FwdFamily::simt: return "simt";
  }
  return "?";
}

const char* family_name(BwdFamily f) {
  switch (f) {
    case BwdFamily::sm80: return "sm80";
    case BwdFamily::sm90: return "sm90";
    case BwdFamily::sm90ws: return "sm90ws";
  }
  return "?";
}

}  // namespace fused
}  // namespace fna
