// Autotuner core: memory and disk caches of the fastest candidate per problem signature, and the
// timing loop with its budget and progress lines. See core/autotune.h.
#include "core/autotune.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

namespace fna {
namespace detail {
namespace {

const char kHeader[] = "fna-autotune-cache 1";
const size_t kMaxFileBytes = size_t(1) << 20;  // larger files are not ours: a miss

Status invalid(const std::string& msg) { return Status{Code::invalid_argument, "autotune: " + msg}; }

// ---- process-wide state ---------------------------------------------------------------------
struct State {
  std::mutex mu;                                              // guards everything below
  std::map<std::string, std::string> memory;                  // key -> choice
  std::map<std::string, std::shared_ptr<std::mutex>> tuning;  // key -> its tuning lock
  std::set<std::string> warned_dirs;                          // disk-cache warnings given
};

State& state() {
  static State* s = new State;  // never destroyed: usable from other static destructors
  return *s;
}

// The memory cache is a layer in front of one disk cache: keyed by directory and signature.
std::string memory_key(const AutotuneRequest& req) {
  std::string k = req.cache_dir;
  k.push_back('\0');
  k += req.signature;
  return k;
}

bool memory_get(const std::string& key, std::string* choice) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.memory.find(key);
  if (it == s.memory.end()) return false;
  *choice = it->second;
  return true;
}

void memory_put(const std::string& key, const std::string& choice) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.memory[key] = choice;
}

void memory_erase(const std::string& key) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.memory.erase(key);
}

std::shared_ptr<std::mutex> tuning_lock(const std::string& key) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::shared_ptr<std::mutex>& m = s.tuning[key];
  if (!m) m = std::make_shared<std::mutex>();
  return m;
}

// True the first time it is asked for a directory.
bool first_warning(const std::string& dir) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.warned_dirs.insert(dir).second;
}

// ---- text ---------------------------------------------------------------------------------------
std::string escape(const std::string& s) {
  std::string r;
  r.reserve(s.size());
  for (char c : s) {
    if (c == '\\') r += "\\\\";
    else if (c == '\n') r += "\\n";
    else if (c == '\r') r += "\\r";
    else r.push_back(c);
  }
  return r;
}

bool unescape(const std::string& s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out->push_back(s[i]);
      continue;
    }
    if (++i == s.size()) return false;
    if (s[i] == '\\') out->push_back('\\');
    else if (s[i] == 'n') out->push_back('\n');
    else if (s[i] == 'r') out->push_back('\r');
    else return false;
  }
  return true;
}

std::string seconds(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms / 1000.0);
  return buf;
}

// ---- files --------------------------------------------------------------------------------------
// Whole file, or false when it cannot be read or exceeds kMaxFileBytes.
bool read_file(const std::string& path, std::string* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->clear();
  char buf[4096];
  bool ok = true;
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      ok = false;
      break;
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > kMaxFileBytes) {
      ok = false;
      break;
    }
  }
  ::close(fd);
  return ok;
}

// mkdir -p. Empty string on success, else what failed.
std::string make_dirs(const std::string& dir) {
  std::string path;
  size_t i = 0;
  while (i <= dir.size()) {
    size_t j = dir.find('/', i);
    if (j == std::string::npos) j = dir.size();
    path = dir.substr(0, j);
    i = j + 1;
    if (path.empty() || path == "." || path == "..") continue;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return "mkdir " + path + ": " + std::strerror(errno);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return "stat " + dir + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  return "";
}

bool write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// Writes the entry to a unique temporary file beside the target and renames it over the target,
// so that readers (threads or processes) see the old file or the new one, never a part. Empty
// string on success, else what failed.
std::string write_entry(const std::string& dir, const std::string& signature,
                        const std::string& choice) {
  std::string err = make_dirs(dir);
  if (!err.empty()) return err;
  static std::atomic<uint64_t> counter{0};
  const std::string target = autotune_cache_file(dir, signature);
  char suffix[96];
  std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%zx.%llu", static_cast<long>(::getpid()),
                std::hash<std::thread::id>()(std::this_thread::get_id()),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  const std::string tmp = target + suffix;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return "create " + tmp + ": " + std::strerror(errno);
  const std::string text = autotune_format_entry(signature, choice);
  bool ok = write_all(fd, text);
  if (!ok) err = "write " + tmp + ": " + std::strerror(errno);
  if (ok && ::fsync(fd) != 0) {
    ok = false;
    err = "fsync " + tmp + ": " + std::strerror(errno);
  }
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = "close " + tmp + ": " + std::strerror(errno);
  }
  if (ok && ::rename(tmp.c_str(), target.c_str()) != 0) {
    ok = false;
    err = "rename " + tmp + " to " + target + ": " + std::strerror(errno);
  }
  if (!ok) ::unlink(tmp.c_str());
  return err;
}

// ---- the request --------------------------------------------------------------------------------
bool is_candidate(const AutotuneRequest& req, const std::string& name) {
  for (const std::string& c : req.candidates)
    if (c == name) return true;
  return false;
}

// A cached name is used only when it is still a candidate and still fits.
bool usable(const AutotuneRequest& req, const std::string& name) {
  return is_candidate(req, name) && (!req.fits || req.fits(name));
}

bool disk_get(const AutotuneRequest& req, std::string* choice) {
  std::string text, sig;
  if (!read_file(autotune_cache_file(req.cache_dir, req.signature), &text)) return false;
  if (!autotune_parse_entry(text, &sig, choice)) return false;
  return sig == req.signature;  // another signature under the same hash: a miss
}

double clock_ms(const AutotuneRequest& req) {
  if (req.now_ms) return req.now_ms();
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

Status validate(const AutotuneRequest& req, const AutotuneResult* out) {
  if (out == nullptr) return invalid("out is null");
  if (req.signature.empty()) return invalid("signature is empty");
  if (req.candidates.empty()) return invalid("no candidates for signature " + req.signature);
  for (size_t i = 0; i < req.candidates.size(); ++i)
    if (req.candidates[i].empty())
      return invalid("candidate " + std::to_string(i) + " has an empty name");
  if (!(req.budget_ms >= 0)) return invalid("budget_ms = " + std::to_string(req.budget_ms) +
                                            " (must be >= 0)");
  if (req.may_time && !req.time_ms) return invalid("may_time without a time_ms timer");
  return Status::Ok();
}

// Times the candidates; returns the index of the fastest, or -1 when every timing failed.
int time_candidates(const AutotuneRequest& req, AutotuneResult* out) {
  const double t0 = clock_ms(req);
  const int n = static_cast<int>(req.candidates.size());
  int best = -1;
  double best_ms = 0;
  bool attempted = false;
  bool announced = false;
  double last_line = 0;
  int done = 0;
  for (int i = 0; i < n; ++i) {
    const double elapsed = clock_ms(req) - t0;
    if (attempted && elapsed >= req.budget_ms) break;
    const std::string& name = req.candidates[i];
    ++done;
    if (req.fits && !req.fits(name)) continue;
    attempted = true;
    out->timed = true;
    const double ms = req.time_ms(name);
    out->times.emplace_back(name, ms);
    if (std::isfinite(ms) && ms >= 0 && (best < 0 || ms < best_ms)) {
      best = i;
      best_ms = ms;
    }
    const double now = clock_ms(req) - t0;
    if (req.progress && now > 1000 && (!announced || now - last_line >= 1000)) {
      announced = true;
      last_line = now;
      req.progress("fna: autotuning " + req.signature + ": " + std::to_string(done) + "/" +
                   std::to_string(n) + " configurations, " + seconds(now));
    }
  }
  if (announced && req.progress) {
    const double now = clock_ms(req) - t0;
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.4g", best_ms);
    req.progress("fna: autotuned " + req.signature + ": " +
                 (best >= 0 ? req.candidates[best] + " (" + ms + " ms)"
                            : req.candidates[0] + " (every timing failed)") +
                 " after " + std::to_string(done) + "/" + std::to_string(n) +
                 " configurations, " + seconds(now));
  }
  return best;
}

Status autotune_impl(const AutotuneRequest& req, AutotuneResult* out) {
  const std::string key = memory_key(req);
  std::string cached;

  // Memory, then disk.
  if (memory_get(key, &cached)) {
    if (usable(req, cached)) {
      out->choice = cached;
      out->from_cache = true;
      return Status::Ok();
    }
    memory_erase(key);
  }
  const bool disk = !req.cache_dir.empty();
  if (disk && disk_get(req, &cached) && usable(req, cached)) {
    memory_put(key, cached);
    out->choice = cached;
    out->from_cache = true;
    return Status::Ok();
  }
  if (!req.may_time) {
    out->choice = req.candidates[0];
    return Status::Ok();
  }

  // One tuning per signature at a time in this process; whoever waited reuses the choice.
  std::shared_ptr<std::mutex> m = tuning_lock(key);
  std::lock_guard<std::mutex> tuning(*m);
  if (memory_get(key, &cached) && usable(req, cached)) {
    out->choice = cached;
    out->from_cache = true;
    return Status::Ok();
  }

  const int best = time_candidates(req, out);
  out->choice = req.candidates[best >= 0 ? best : 0];
  memory_put(key, out->choice);
  if (best < 0 || !disk) return Status::Ok();  // a failing timer may be transient: not on disk

  const std::string err = write_entry(req.cache_dir, req.signature, out->choice);
  if (!err.empty() && req.progress && first_warning(req.cache_dir)) {
    req.progress("fna: warning: cannot write the autotuning cache in " + req.cache_dir + " (" +
                 err + "); choices are kept in memory only");
  }
  return Status::Ok();
}

}  // namespace

uint64_t autotune_hash(const std::string& signature) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64 offset basis
  for (unsigned char c : signature) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string autotune_cache_file(const std::string& cache_dir, const std::string& signature) {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.txt",
                static_cast<unsigned long long>(autotune_hash(signature)));
  std::string path = cache_dir;
  if (!path.empty() && path.back() != '/') path.push_back('/');
  return path + name;
}

std::string autotune_format_entry(const std::string& signature, const std::string& choice) {
  return std::string(kHeader) + "\nsignature " + escape(signature) + "\nchoice " + escape(choice) +
         "\nend\n";
}

bool autotune_parse_entry(const std::string& text, std::string* signature, std::string* choice) {
  std::vector<std::string> lines;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find('\n', i);
    if (j == std::string::npos) return false;  // every line ends in a newline
    lines.push_back(text.substr(i, j - i));
    i = j + 1;
  }
  if (lines.size() != 4 || lines[0] != kHeader || lines[3] != "end") return false;
  const std::string sp = "signature ", cp = "choice ";
  if (lines[1].compare(0, sp.size(), sp) != 0 || lines[2].compare(0, cp.size(), cp) != 0)
    return false;
  if (!unescape(lines[1].substr(sp.size()), signature)) return false;
  if (!unescape(lines[2].substr(cp.size()), choice)) return false;
  return !signature->empty() && !choice->empty();
}

Status autotune(const AutotuneRequest& req, AutotuneResult* out) {
  Status st = validate(req, out);
  if (!st.ok()) return st;
  *out = AutotuneResult{};
  try {
    return autotune_impl(req, out);
  } catch (const std::exception& e) {
    return Status{Code::runtime_error, std::string("autotune: ") + e.what()};
  } catch (...) {
    return Status{Code::runtime_error, "autotune: unknown exception in a callback"};
  }
}

void autotune_clear_memory_cache() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.memory.clear();
}

}  // namespace detail
}  // namespace fna
