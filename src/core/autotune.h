// Autotuner core (issue 31), host side and free of CUDA: on the first call of a problem signature,
// time the plan's candidate configurations (through a caller-given timer), pick the fastest and
// cache the choice in memory and, when a cache directory is given, on disk (one small file per
// signature, written atomically), so that later calls, later processes and every rank of a
// multi-GPU job reuse it without timing. A cached choice that is not among the candidates or no
// longer `fits` the problem is ignored: the call retunes, or, where it may not time, falls back to
// the heuristic's pick (candidates[0]). The library reads no environment variables: the cache
// directory, budget and whether timing is allowed all come from the request.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fna/fna.h"

namespace fna {
namespace detail {

struct AutotuneRequest {
  // The problem signature key, built by the caller (device name, driver, fna version, dtypes,
  // rank, shape, heads, dims, kernel / dilation / stride / causal, additional keys, direction,
  // options). Any bytes; must not be empty.
  std::string signature;
  // Candidate configuration names in the plan's preference order (first = the heuristic's pick).
  // Not empty; no name may be empty.
  std::vector<std::string> candidates;
  // Directory of the disk cache ("" = in-memory cache only). Created, with its parents, on the
  // first write.
  std::string cache_dir;
  // Wall time (per now_ms) after which no new candidate is timed; the best so far wins. The first
  // timeable candidate is always timed. >= 0.
  double budget_ms = 2000;
  // false (e.g. inside CUDA graph capture or torch.compile): never time; use the cache, else
  // return candidates[0].
  bool may_time = true;
  // Whether a name (a cached one, or a candidate before it is timed) still runs this problem.
  // Empty = every name fits. A cached name that does not fit is ignored (never wrong).
  std::function<bool(const std::string&)> fits;
  // Measures one candidate (median ms). A negative, NaN or infinite result means it failed: it is
  // skipped. Required when may_time.
  std::function<double(const std::string&)> time_ms;
  // Receives progress lines ("fna: autotuning <sig>: 3/12 configurations, 1.4 s"), only once the
  // tuning has taken over 1 s, at most one a second plus a closing line; also receives a one-time
  // warning per cache directory when the disk cache cannot be written. Empty = silent.
  std::function<void(const std::string&)> progress;
  // Clock in milliseconds (budget and progress). Empty = std::chrono::steady_clock.
  std::function<double()> now_ms;
};

struct AutotuneResult {
  std::string choice;       // the chosen name (always one of the candidates)
  bool from_cache = false;  // memory or disk hit
  bool timed = false;       // timing ran in this call
  // What was timed in this call, in order (name, ms); a failed timing keeps the timer's value.
  std::vector<std::pair<std::string, double>> times;
};

// Looks the signature up in the memory cache, then the disk cache; on a miss (or an entry that no
// longer fits) times the candidates when allowed and caches the winner (equal times: the earlier
// candidate). When every timing fails, candidates[0] is returned and cached in memory only.
// Failing to write the disk cache is not an error. Empty signature / candidates / candidate name,
// a negative or NaN budget, a null `out`, or may_time without time_ms: invalid_argument. An
// exception thrown by a callback: runtime_error. Thread-safe; concurrent tunings of one signature
// in one process are serialized (the later ones reuse the first's choice).
Status autotune(const AutotuneRequest& req, AutotuneResult* out);

// Clears the in-memory cache (tests).
void autotune_clear_memory_cache();
// `t` without the autotuner's own fields (mode, cache directory, budget): the choices it makes of
// the kernels, for signatures and for whether a call binds the fused backend.
Tuning kernel_tuning(const Tuning& t);
// The same and the fused backend's per-process memo of choices (defined with cuda-fused).
void autotune_clear_all();

// ---- the disk format (exposed for tests and tools) ----------------------------------------------
// Stable 64-bit hash of a signature (FNV-1a).
uint64_t autotune_hash(const std::string& signature);
// The cache file of a signature: <cache_dir>/<16 hex digits of the hash>.txt.
std::string autotune_cache_file(const std::string& cache_dir, const std::string& signature);
// A file's content: a versioned header line, the signature line, the choice line and an end line
// (backslash, newline and carriage return escaped).
std::string autotune_format_entry(const std::string& signature, const std::string& choice);
// Parses a file's content; false when it is not exactly one well-formed entry.
bool autotune_parse_entry(const std::string& text, std::string* signature, std::string* choice);

}  // namespace detail
}  // namespace fna
