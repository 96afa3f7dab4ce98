// The autotuner core (core/autotune.h) on the CPU with fake timers and clocks: the fastest
// candidate wins, memory and disk caches are hit without timing, stale / corrupt / colliding
// entries are misses, may_time=false never times, the budget bounds the timing, progress lines
// only past 1 s, and concurrent threads and processes leave only whole, valid files.
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/autotune.h"

namespace fna_test {
namespace {

using fna::Code;
using fna::Status;
using fna::detail::AutotuneRequest;
using fna::detail::AutotuneResult;
using fna::detail::autotune;
using fna::detail::autotune_cache_file;
using fna::detail::autotune_clear_memory_cache;
using fna::detail::autotune_format_entry;
using fna::detail::autotune_parse_entry;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  return names;
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const std::string& n : list_dir(path)) remove_tree(path + "/" + n);
    rmdir(path.c_str());
  } else {
    unlink(path.c_str());
  }
}

// A fake timer with preset times that counts its calls.
struct FakeTimer {
  std::map<std::string, double> ms;
  std::atomic<int> calls{0};
  std::function<double(const std::string&)> fn() {
    return [this](const std::string& name) {
      ++calls;
      auto it = ms.find(name);
      return it == ms.end() ? 1.0 : it->second;
    };
  }
};

class Autotune : public ::testing::Test {
 protected:
  void SetUp() override {
    autotune_clear_memory_cache();
    char tmpl[] = "/tmp/fna_autotune_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/cache/nested";  // created by the first write
  }
  void TearDown() override {
    autotune_clear_memory_cache();
    remove_tree(root_);
  }
  AutotuneRequest request(const std::string& sig, FakeTimer* timer) {
    AutotuneRequest r;
    r.signature = sig;
    r.candidates = {"a", "b", "c", "d"};
    r.cache_dir = dir_;
    r.time_ms = timer->fn();
    return r;
  }
  void make_cache_dir() {
    mkdir((root_ + "/cache").c_str(), 0755);
    mkdir(dir_.c_str(), 0755);
  }
  std::string root_, dir_;
};

TEST_F(Autotune, PicksFastest) {
  FakeTimer t;
  t.ms = {{"a", 3.0}, {"b", 2.0}, {"c", 0.5}, {"d", 4.0}};
  AutotuneResult res;
  ASSERT_TRUE(autotune(request("sig-fast", &t), &res).ok());
  EXPECT_EQ(res.choice, "c");
  EXPECT_TRUE(res.timed);
  EXPECT_FALSE(res.from_cache);
  EXPECT_EQ(t.calls, 4);
  ASSERT_EQ(res.times.size(), 4u);
  EXPECT_EQ(res.times[2].first, "c");
  EXPECT_EQ(res.times[2].second, 0.5);
}

TEST_F(Autotune, TieGoesToEarlierCandidate) {
  FakeTimer t;
  t.ms = {{"a", 3.0}, {"b", 1.0}, {"c", 1.0}, {"d", 1.0}};
  AutotuneResult res;
  ASSERT_TRUE(autotune(request("sig-tie", &t), &res).ok());
  EXPECT_EQ(res.choice, "b");
}

TEST_F(Autotune, FailedTimingsAreSkipped) {
  FakeTimer t;
  t.ms = {{"a", -1.0}, {"b", NAN}, {"c", INFINITY}, {"d", 7.0}};
  AutotuneResult res;
  ASSERT_TRUE(autotune(request("sig-fail", &t), &res).ok());
  EXPECT_EQ(res.choice, "d");
  EXPECT_EQ(res.times.size(), 4u);
}

TEST_F(Autotune, EveryTimingFailedFallsBackToFirstInMemoryOnly) {
  FakeTimer t;
  t.ms = {{"a", -1.0}, {"b", -1.0}, {"c", -1.0}, {"d", -1.0}};
  AutotuneResult res;
  AutotuneRequest r = request("sig-allfail", &t);
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "a");
  EXPECT_FALSE(std::ifstream(autotune_cache_file(dir_, r.signature)).good());
}

TEST_F(Autotune, MemoryThenDiskCache) {
  FakeTimer t;
  t.ms = {{"a", 3.0}, {"b", 1.0}, {"c", 2.0}, {"d", 4.0}};
  AutotuneRequest r = request("sig-cache", &t);
  AutotuneResult res;
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "b");
  EXPECT_EQ(t.calls, 4);

  // Second call: memory hit, no timing.
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "b");
  EXPECT_TRUE(res.from_cache);
  EXPECT_FALSE(res.timed);
  EXPECT_TRUE(res.times.empty());
  EXPECT_EQ(t.calls, 4);

  // The file: header, signature, choice.
  const std::string file = autotune_cache_file(dir_, r.signature);
  std::string sig, choice;
  ASSERT_TRUE(autotune_parse_entry(read_text(file), &sig, &choice));
  EXPECT_EQ(sig, r.signature);
  EXPECT_EQ(choice, "b");
  // No temporary files left behind.
  EXPECT_EQ(list_dir(dir_).size(), 1u);

  // A new "process": disk hit, no timing.
  autotune_clear_memory_cache();
  t.ms["c"] = 0.1;  // would win if timed
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "b");
  EXPECT_TRUE(res.from_cache);
  EXPECT_FALSE(res.timed);
  EXPECT_EQ(t.calls, 4);
}

TEST_F(Autotune, InMemoryOnlyWithoutCacheDir) {
  FakeTimer t;
  t.ms = {{"a", 3.0}, {"b", 1.0}};
  AutotuneRequest r = request("sig-nodisk", &t);
  r.cache_dir = "";
  AutotuneResult res;
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "b");
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_TRUE(res.from_cache);
  EXPECT_EQ(t.calls, 4);
  autotune_clear_memory_cache();
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_TRUE(res.timed);
  EXPECT_EQ(t.calls, 8);
  EXPECT_TRUE(list_dir(root_).empty());
}

TEST_F(Autotune, CachedChoiceThatNoLongerFitsIsRetuned) {
  FakeTimer t;
  t.ms = {{"a", 3.0}, {"b", 1.0}, {"c", 2.0}, {"d", 4.0}};
  AutotuneRequest r = request("sig-fits", &t);
  AutotuneResult res;
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "b");

  // "b" no longer runs this problem: memory hit ignored, retuned without "b".
  r.fits = [](const std::string& n) { return n != "b"; };
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "c");
  EXPECT_TRUE(res.timed);
  EXPECT_FALSE(res.from_cache);
  EXPECT_EQ(t.calls, 7);  // "b" is not timed

  std::string sig, choice;
  ASSERT_TRUE(autotune_parse_entry(read_text(autotune_cache_file(dir_, r.signature)), &sig, &choice));
  EXPECT_EQ(choice, "c");

  // A disk entry naming something no longer among the candidates is ignored too.
  autotune_clear_memory_cache();
  write_text(autotune_cache_file(dir_, r.signature), autotune_format_entry(r.signature, "zz"));
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_TRUE(res.timed);
  EXPECT_EQ(res.choice, "c");

  // Without timing: a disk entry that does not fit falls back to the first candidate.
  autotune_clear_memory_cache();
  r.fits = [](const std::string& n) { return n != "c"; };
  r.may_time = false;
  const int before = t.calls;
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "a");
  EXPECT_FALSE(res.from_cache);
  EXPECT_FALSE(res.timed);
  EXPECT_EQ(t.calls, before);
}

TEST_F(Autotune, CorruptFileIsRetunedAndRewritten) {
  FakeTimer t;
  t.ms = {{"a", 3.0}, {"b", 2.0}, {"c", 1.0}, {"d", 4.0}};
  AutotuneRequest r = request("sig-corrupt", &t);
  const std::string file = autotune_cache_file(dir_, r.signature);
  const std::string good = autotune_format_entry(r.signature, "a");
  const std::vector<std::string> corrupt = {
      "",
      "garbage\n",
      good.substr(0, good.size() - 4),              // truncated
      good.substr(0, good.size() - 1),              // no final newline
      good + "extra\n",                             // trailing content
      "fna-autotune-cache 999\n" + good.substr(good.find('\n') + 1),  // other version
      std::string("\0\0\0\0", 4),
  };
  for (const std::string& text : corrupt) {
    autotune_clear_memory_cache();
    make_cache_dir();
    write_text(file, text);
    AutotuneResult res;
    const int before = t.calls;
    ASSERT_TRUE(autotune(r, &res).ok());
    EXPECT_EQ(res.choice, "c");
    EXPECT_TRUE(res.timed);
    EXPECT_EQ(t.calls, before + 4);
    std::string sig, choice;
    ASSERT_TRUE(autotune_parse_entry(read_text(file), &sig, &choice));
    EXPECT_EQ(sig, r.signature);
    EXPECT_EQ(choice, "c");
  }
}

TEST_F(Autotune, HashCollisionIsAMiss) {
  FakeTimer t;
  t.ms = {{"a", 3.0}, {"b", 2.0}, {"c", 1.0}, {"d", 4.0}};
  AutotuneRequest r = request("sig-collide", &t);
  const std::string file = autotune_cache_file(dir_, r.signature);
  make_cache_dir();
  write_text(file, autotune_format_entry("another signature", "a"));
  AutotuneResult res;
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_FALSE(res.from_cache);
  EXPECT_TRUE(res.timed);
  EXPECT_EQ(res.choice, "c");
  std::string sig, choice;
  ASSERT_TRUE(autotune_parse_entry(read_text(file), &sig, &choice));
  EXPECT_EQ(sig, r.signature);
}

TEST_F(Autotune, SignatureWithNewlinesRoundTrips) {
  FakeTimer t;
  t.ms = {{"a", 3.0}, {"b", 2.0}, {"c", 1.0}, {"d", 4.0}};
  AutotuneRequest r = request("line1\nline2\\n\r", &t);
  r.candidates.push_back("odd\nname");
  t.ms["odd\nname"] = 0.01;
  AutotuneResult res;
  ASSERT_TRUE(autotune(r, &res).ok());
  autotune_clear_memory_cache();
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_TRUE(res.from_cache);
  EXPECT_EQ(res.choice, "odd\nname");
  // A signature that only differs in escaping is another entry.
  AutotuneRequest r2 = request("line1\\nline2\\n\r", &t);
  ASSERT_TRUE(autotune(r2, &res).ok());
  EXPECT_FALSE(res.from_cache);
}

TEST_F(Autotune, MayTimeFalseNeverTimes) {
  FakeTimer t;
  t.ms = {{"a", 3.0}, {"b", 2.0}, {"c", 1.0}, {"d", 4.0}};
  AutotuneRequest r = request("sig-notime", &t);
  r.may_time = false;
  AutotuneResult res;
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "a");
  EXPECT_FALSE(res.timed);
  EXPECT_FALSE(res.from_cache);
  EXPECT_EQ(t.calls, 0);
  EXPECT_TRUE(list_dir(root_).empty());  // nothing cached

  // Once tuned elsewhere, the cache is used (memory, then disk).
  r.may_time = true;
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "c");
  r.may_time = false;
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "c");
  EXPECT_TRUE(res.from_cache);
  autotune_clear_memory_cache();
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "c");
  EXPECT_TRUE(res.from_cache);
  EXPECT_EQ(t.calls, 4);

  // No timer at all is fine when timing is not allowed.
  r.time_ms = nullptr;
  r.signature = "sig-notimer";
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "a");
}

TEST_F(Autotune, BudgetStopsTimingAndBestSoFarWins) {
  double clock = 0;
  int calls = 0;
  AutotuneRequest r;
  r.signature = "sig-budget";
  r.candidates = {"a", "b", "c", "d", "e", "f"};
  r.cache_dir = dir_;
  r.budget_ms = 1200;
  r.now_ms = [&clock] { return clock; };
  const std::map<std::string, double> ms = {{"a", 5}, {"b", 3}, {"c", 4}, {"d", 1}, {"e", 1}, {"f", 0.5}};
  r.time_ms = [&](const std::string& n) {
    ++calls;
    clock += 500;  // each timing takes half a second of the fake clock
    return ms.at(n);
  };
  AutotuneResult res;
  ASSERT_TRUE(autotune(r, &res).ok());
  // a (t=500), b (1000), c (1500); then 1500 >= 1200: stop.
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(res.choice, "b");
  EXPECT_EQ(res.times.size(), 3u);

  // A zero budget still times the first candidate.
  autotune_clear_memory_cache();
  r.signature = "sig-budget0";
  r.budget_ms = 0;
  calls = 0;
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(res.choice, "a");
}

TEST_F(Autotune, ProgressOnlyPastOneSecond) {
  double clock = 0;
  double step = 100;
  std::vector<std::pair<double, std::string>> lines;
  AutotuneRequest r;
  r.signature = "sig-progress";
  r.candidates = {"a", "b", "c", "d", "e", "f", "g", "h"};
  r.cache_dir = dir_;
  r.budget_ms = 1e9;
  r.now_ms = [&clock] { return clock; };
  r.time_ms = [&](const std::string&) {
    clock += step;
    return 1.0;
  };
  r.progress = [&](const std::string& line) { lines.emplace_back(clock, line); };
  AutotuneResult res;
  // 8 x 100 ms: under a second, silent.
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_TRUE(lines.empty());

  // 8 x 400 ms: lines once past 1 s (at 1.2 s and 2.4 s), then a closing line.
  r.signature = "sig-progress-slow";
  step = 400;
  const double start = clock;
  ASSERT_TRUE(autotune(r, &res).ok());
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& l : lines) EXPECT_GT(l.first - start, 1000) << l.second;
  EXPECT_EQ(lines[0].second, "fna: autotuning sig-progress-slow: 3/8 configurations, 1.2 s");
  EXPECT_EQ(lines[1].second, "fna: autotuning sig-progress-slow: 6/8 configurations, 2.4 s");
  EXPECT_TRUE(contains(lines[2].second, "autotuned sig-progress-slow: a")) << lines[2].second;
  EXPECT_TRUE(contains(lines[2].second, "8/8 configurations, 3.2 s")) << lines[2].second;
}

TEST_F(Autotune, UnwritableCacheIsNotAnError) {
  // A directory under a regular file cannot be created (even by root).
  const std::string file = root_ + "/plainfile";
  write_text(file, "x");
  FakeTimer t;
  t.ms = {{"a", 3.0}, {"b", 1.0}};
  std::vector<std::string> lines;
  AutotuneRequest r = request("sig-ro", &t);
  r.cache_dir = file + "/cache";
  r.progress = [&](const std::string& l) { lines.push_back(l); };
  AutotuneResult res;
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_EQ(res.choice, "b");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(contains(lines[0], "warning")) << lines[0];
  EXPECT_TRUE(contains(lines[0], r.cache_dir)) << lines[0];
  // Kept in memory; the warning is given once per directory.
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_TRUE(res.from_cache);
  autotune_clear_memory_cache();
  ASSERT_TRUE(autotune(r, &res).ok());
  EXPECT_TRUE(res.timed);
  EXPECT_EQ(res.choice, "b");
  EXPECT_EQ(lines.size(), 1u);
}

TEST_F(Autotune, InvalidArguments) {
  FakeTimer t;
  AutotuneResult res;
  AutotuneRequest r = request("sig", &t);
  r.signature = "";
  EXPECT_EQ(autotune(r, &res).code, Code::invalid_argument);
  r = request("sig", &t);
  r.candidates.clear();
  EXPECT_EQ(autotune(r, &res).code, Code::invalid_argument);
  r = request("sig", &t);
  r.candidates = {"a", ""};
  EXPECT_EQ(autotune(r, &res).code, Code::invalid_argument);
  r = request("sig", &t);
  r.budget_ms = -1;
  EXPECT_EQ(autotune(r, &res).code, Code::invalid_argument);
  r.budget_ms = NAN;
  EXPECT_EQ(autotune(r, &res).code, Code::invalid_argument);
  r = request("sig", &t);
  r.time_ms = nullptr;
  EXPECT_EQ(autotune(r, &res).code, Code::invalid_argument);
  r = request("sig", &t);
  EXPECT_EQ(autotune(r, nullptr).code, Code::invalid_argument);
  EXPECT_EQ(t.calls, 0);
}

TEST_F(Autotune, ThrowingTimerIsARuntimeError) {
  AutotuneRequest r;
  r.signature = "sig-throw";
  r.candidates = {"a"};
  r.time_ms = [](const std::string&) -> double { throw std::runtime_error("boom"); };
  AutotuneResult res;
  Status st = autotune(r, &res);
  EXPECT_EQ(st.code, Code::runtime_error);
  EXPECT_TRUE(contains(st.message, "boom"));
}

// Every file in the directory is a whole entry naming one of the candidates under its own hash.
void expect_valid_files(const std::string& dir, const std::vector<std::string>& candidates,
                        size_t max_files) {
  std::vector<std::string> names = list_dir(dir);
  EXPECT_GE(names.size(), 1u);
  EXPECT_LE(names.size(), max_files);
  for (const std::string& n : names) {
    EXPECT_EQ(n.size(), 20u) << n;  // 16 hex digits + ".txt": no temporary files left
    std::string sig, choice;
    ASSERT_TRUE(autotune_parse_entry(read_text(dir + "/" + n), &sig, &choice)) << n;
    EXPECT_EQ(autotune_cache_file(dir, sig), dir + "/" + n);
    EXPECT_NE(std::find(candidates.begin(), candidates.end(), choice), candidates.end()) << choice;
  }
}

const std::vector<std::string> kManyCandidates = {"c0", "c1", "c2", "c3", "c4", "c5"};

// One hammering call: a random signature from a small set, random times, now and then a cleared
// memory cache (the disk is read again) and a candidate that no longer fits (a cached choice of it
// is retuned and rewritten). Before the call, the file, if there is one, must be a whole entry:
// readers racing the writers never see a part. Returns false on any fault; counts timed calls.
bool hammer_once(const std::string& dir, std::mt19937* rng, std::atomic<int>* timed) {
  std::uniform_int_distribution<int> pick(0, 4);
  std::uniform_int_distribution<int> cand(0, static_cast<int>(kManyCandidates.size()) - 1);
  std::uniform_real_distribution<double> ms(0.1, 2.0);
  AutotuneRequest r;
  r.signature = "hammer-" + std::to_string(pick(*rng));
  r.candidates = kManyCandidates;
  r.cache_dir = dir;
  std::mt19937 local((*rng)());
  r.time_ms = [&](const std::string&) { return ms(local); };
  if (pick(*rng) == 0) autotune_clear_memory_cache();
  std::string excluded = kManyCandidates[cand(*rng)];
  std::ifstream f(autotune_cache_file(dir, r.signature), std::ios::binary);
  if (f.good()) {
    std::stringstream ss;
    ss << f.rdbuf();
    std::string sig, choice;
    if (!autotune_parse_entry(ss.str(), &sig, &choice) || sig != r.signature) return false;
    if (pick(*rng) < 3) excluded = choice;  // most often the cached choice: retune and rewrite
  }
  r.fits = [excluded](const std::string& n) { return n != excluded; };
  AutotuneResult res;
  if (!autotune(r, &res).ok()) return false;
  if (res.timed) ++*timed;
  return res.choice != excluded &&
         std::find(kManyCandidates.begin(), kManyCandidates.end(), res.choice) != kManyCandidates.end();
}

TEST_F(Autotune, ConcurrentThreads) {
  std::atomic<int> bad{0}, timed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      for (int i = 0; i < 50; ++i)
        if (!hammer_once(dir_, &rng, &timed)) ++bad;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, 0);
  EXPECT_GE(timed, 20);  // the disk was rewritten many times
  expect_valid_files(dir_, kManyCandidates, 5);
}

TEST_F(Autotune, ConcurrentProcesses) {
  std::vector<pid_t> kids;
  for (int p = 0; p < 4; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::mt19937 rng(777 + p);
      int bad = 0;
      std::atomic<int> timed{0};
      for (int i = 0; i < 200; ++i) {
        autotune_clear_memory_cache();  // every call goes to the disk
        if (!hammer_once(dir_, &rng, &timed)) ++bad;
      }
      _exit(bad != 0 ? 1 : timed < 20 ? 2 : 0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  expect_valid_files(dir_, kManyCandidates, 5);
  // And a fresh reader hits the disk for every signature without timing.
  autotune_clear_memory_cache();
  for (int s = 0; s < 5; ++s) {
    AutotuneRequest r;
    r.signature = "hammer-" + std::to_string(s);
    r.candidates = kManyCandidates;
    r.cache_dir = dir_;
    r.may_time = false;
    AutotuneResult res;
    ASSERT_TRUE(autotune(r, &res).ok());
    if (std::ifstream(autotune_cache_file(dir_, r.signature)).good()) EXPECT_TRUE(res.from_cache);
  }
}

TEST(AutotuneFormat, HashIsStable) {
  // FNV-1a 64 reference values: the file names must not change between builds.
  EXPECT_EQ(fna::detail::autotune_hash(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fna::detail::autotune_hash("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(autotune_cache_file("/x/y", "a"), "/x/y/af63dc4c8601ec8c.txt");
  EXPECT_EQ(autotune_cache_file("/x/y/", "a"), "/x/y/af63dc4c8601ec8c.txt");
}

}  // namespace
}  // namespace fna_test
