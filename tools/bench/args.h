// Command-line parsing for fna-bench: one problem per run, or a sweep of problems.
#pragma once

#include <string>
#include <vector>

#include "fna/fna.h"

namespace fna_bench {

struct BenchConfig {
  fna::Problem problem;
  std::vector<fna::Backend> backends;  // empty = every compiled backend of the device
  fna::Device device = fna::Device::cpu;  // resolved in main: --device, else cuda if visible
  bool device_set = false;                 // --device given (it wins over the default)
  bool forward = true;   // time the forward (--mode fwd|both)
  bool backward = true;  // time the backward (--mode bwd|both; bwd runs the forward once untimed)
  int repeats = 5;
  int warmup = 1;
  int threads = 0;
  int check_samples = 64;   // queries checked against the reference; 0 = no check
  bool check_set = false;   // --check given (on CUDA the check runs only when asked)
  bool sweep = false;
  bool time_reference = false;
  std::string json;          // write results as JSON lines here
  std::string csv;           // append one CSV row per result here (a header row first if empty)
  std::string config;        // cuda-fused tile configuration (Options::config); empty = heuristic
  std::string backward_config;  // cuda-fused backward tiles (Options::backward_config)
  fna::Tuning tuning;           // Options::tuning (--tuning)
  bool allow_tf32 = false;   // Options::allow_tf32 (cuda-fused float32: plain TF32)
  bool deterministic = false;  // Options::deterministic
  std::string name = "custom";
};

// Parses argv into `cfg`. Returns false with `err` set (naming the flag and value) on bad input;
// sets `help` when --help was asked.
bool parse_args(int argc, char** argv, BenchConfig* cfg, std::string* err, bool* help);

const char* usage();

// Splits "13x13", "13,13" or "13" into per-axis values; an int broadcasts to `rank` axes.
bool parse_axes(const std::string& s, int rank, long long out[3], std::string* err, const char* flag);

}  // namespace fna_bench
