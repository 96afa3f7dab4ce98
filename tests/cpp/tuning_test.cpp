// Options::tuning: set_tuning / tuning_string as text, its validation against the call (a field
// of another backend, a bad walk), and the cpu fields against the reference on random problems.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "core/validate.h"
#include "cpu/tile.h"
#include "support/check.h"

namespace fna_test {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Valid values of every key (the first non-default one is used for the round trip).
const std::map<std::string, std::vector<std::string>>& valid_values() {
  static const std::vector<std::string> sw = {"automatic", "off", "on"};
  static const std::vector<std::string> copy = {"automatic", "tma", "cp_async"};
  static const std::map<std::string, std::vector<std::string>> v = {
      {"mode", {"heuristic", "auto"}},
      {"autotune_cache_dir", {"", "/tmp/fna-cache", "relative/dir"}},
      {"autotune_budget_ms", {"0", "1", "2000"}},
      {"fwd_strip", sw},
      {"fwd_box", sw},
      {"fwd_simt", sw},
      {"fwd_schedule", {"automatic", "plain", "warp_specialized", "mma_sync"}},
      {"fwd_wg_skip", sw},
      {"fwd_spread", sw},
      {"fwd_copy", copy},
      {"persistent", sw},
      {"fwd_walk", {"", "10", "0", "210"}},
      {"fwd_rpb_stage", sw},
      {"bwd_kernel", {"automatic", "sm80", "sm90", "sm90ws"}},
      {"bwd_copy", copy},
      {"bwd_walk", {"", "01", "2", "120"}},
      {"bwd_rpb_sums", {"automatic", "warps", "shared", "global"}},
      {"bwd_q_pairs", sw},
      {"bwd_dq_strip", sw},
      {"bwd_dq_sm90", sw},
      {"bwd_strip", sw},
      {"naive_workspace_bytes", {"0", "1", "4096", "1073741824"}},
      {"cpu_isa", {"automatic", "generic", "avx2", "avx512"}},
      {"cpu_band", {"0", "1", "2", "8", "1024"}},
      {"cpu_strips", sw},
      {"cpu_panels", {"automatic", "rings", "shared"}},
      {"cpu_acc_rings", sw},
  };
  return v;
}

bool is_walk(const std::string& key) { return key == "fwd_walk" || key == "bwd_walk"; }
bool is_text(const std::string& key) { return is_walk(key) || key == "autotune_cache_dir"; }
bool is_default(const std::string& key, const std::string& v) {
  return is_text(key) ? v.empty() : v == "automatic" || v == "0" || v == "heuristic";
}

// Parses tuning_string's "key=value,..." back through set_tuning.
fna::Status parse(const std::string& s, fna::Tuning* t) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    const std::string kv = s.substr(pos, end - pos);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) return {fna::Code::invalid_argument, "no '=' in " + kv};
    const fna::Status st = fna::set_tuning(t, kv.substr(0, eq), kv.substr(eq + 1));
    if (!st.ok()) return st;
    pos = end + 1;
  }
  return fna::Status::Ok();
}

TEST(SetTuning, AcceptsEveryKeyWithValidValues) {
  const std::vector<std::string> keys = fna::tuning_keys();
  ASSERT_EQ(keys.size(), valid_values().size());
  for (const std::string& key : keys) {
    ASSERT_TRUE(valid_values().count(key)) << "no valid values listed for key " << key;
    for (const std::string& value : valid_values().at(key)) {
      fna::Tuning t;
      const fna::Status st = fna::set_tuning(&t, key, value);
      ASSERT_TRUE(st.ok()) << key << "=" << value << ": " << st.message;
      // The value is echoed (and only it) unless it is the default.
      EXPECT_EQ(fna::tuning_string(t), is_default(key, value) ? "" : key + "=" + value) << key;
    }
  }
  EXPECT_EQ(fna::tuning_string(fna::Tuning{}), "");
}

TEST(SetTuning, RejectsUnknownKeysAndBadValues) {
  fna::Tuning t;
  fna::Status st = fna::set_tuning(&t, "cpu_kernels", "avx2");
  EXPECT_EQ(st.code, fna::Code::invalid_argument);
  EXPECT_TRUE(contains(st.message, "cpu_kernels")) << st.message;
  st = fna::set_tuning(&t, "", "on");
  EXPECT_EQ(st.code, fna::Code::invalid_argument);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"cpu_isa", "sse4"},        {"cpu_isa", "AVX2"},        {"cpu_isa", ""},
      {"cpu_strips", "1"},        {"cpu_strips", "yes"},      {"cpu_panels", "ring"},
      {"cpu_acc_rings", "full"},  {"cpu_band", "-1"},         {"cpu_band", "abc"},
      {"cpu_band", "3x"},         {"cpu_band", "1025"},       {"cpu_band", ""},
      {"naive_workspace_bytes", "-5"}, {"naive_workspace_bytes", "1e6"},
      {"fwd_walk", "13"},         {"bwd_walk", "a"},          {"fwd_copy", "tmaa"},
      {"bwd_kernel", "sm100"},    {"fwd_schedule", "coop"},   {"persistent", "true"},
      {"bwd_rpb_sums", "warp"},
  };
  for (const auto& kv : bad) {
    fna::Tuning u;
    st = fna::set_tuning(&u, kv.first, kv.second);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << kv.first << "='" << kv.second << "'";
    EXPECT_TRUE(contains(st.message, kv.first)) << st.message;
    EXPECT_TRUE(contains(st.message, "'" + kv.second + "'")) << st.message;
    // A rejected value leaves the field as it was.
    EXPECT_EQ(fna::tuning_string(u), "") << kv.first << "='" << kv.second << "'";
  }
}

TEST(SetTuning, TuningStringRoundTrips) {
  // Every key with its first non-default value, then subsets of them (seeded choice).
  fna::Tuning all;
  for (const auto& kv : valid_values())
    for (const std::string& v : kv.second)
      if (!is_default(kv.first, v)) {
        ASSERT_TRUE(fna::set_tuning(&all, kv.first, v).ok()) << kv.first;
        break;
      }
  const std::string s = fna::tuning_string(all);
  EXPECT_EQ(std::count(s.begin(), s.end(), '='), static_cast<long>(valid_values().size())) << s;
  fna::Tuning back;
  fna::Status st = parse(s, &back);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(fna::tuning_string(back), s);

  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int round = 0; round < 50; ++round) {
    fna::Tuning t;
    for (const auto& kv : valid_values()) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const std::string& v = kv.second[x % kv.second.size()];
      ASSERT_TRUE(fna::set_tuning(&t, kv.first, v).ok()) << kv.first << "=" << v;
    }
    const std::string text = fna::tuning_string(t);
    fna::Tuning u;
    st = parse(text, &u);
    ASSERT_TRUE(st.ok()) << text << ": " << st.message;
    EXPECT_EQ(fna::tuning_string(u), text);
  }
}

// A float32 random case (seeded, random inputs) of rank r.
Case f32_case(uint64_t seed, int rank) {
  RandomLimits lim;
  lim.dtypes = {fna::DType::f32};
  return random_case(seed, rank, 1, lim);
}

TEST(TuningValidation, CpuFieldWithReferenceBackendIsRejected) {
  const Case c = f32_case(31000, 2);
  ProblemTensors t(c);
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"cpu_isa", "generic"}, {"cpu_band", "4"},     {"cpu_strips", "on"},
      {"cpu_panels", "shared"}, {"cpu_acc_rings", "off"},
  };
  for (const auto& kv : fields) {
    fna::Options o = options_for(c, fna::Backend::reference);
    ASSERT_TRUE(fna::set_tuning(&o.tuning, kv.first, kv.second).ok());
    fna::Status st = fna::forward(c.p, t.forward_args(), o);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << kv.first;
    EXPECT_TRUE(contains(st.message, kv.first)) << st.message;
    EXPECT_TRUE(contains(st.message, "reference")) << st.message;
    // The same field is accepted where it belongs.
    o.backend = fna::Backend::cpu;
    st = fna::forward(c.p, t.forward_args(), o);
    EXPECT_TRUE(st.ok()) << kv.first << ": " << st.message;
  }
  // cuda-gemm's composed forward / backward take cuda-naive's workspace budget; its unfused
  // operators, like every backend's, take no tuning.
  {
    fna::Tuning t2;
    t2.naive_workspace_bytes = 1;
    const fna::Status st = fna::detail::validate_tuning(c.p, t2, fna::Backend::cuda_gemm, false);
    EXPECT_TRUE(st.ok()) << st.message;
    EXPECT_FALSE(fna::detail::validate_tuning(c.p, t2, fna::Backend::cuda_gemm, true).ok());
    EXPECT_FALSE(fna::detail::validate_tuning(c.p, t2, fna::Backend::cpu, false).ok());
  }
  // A cuda-naive field on the cpu backend, too.
  fna::Options o = options_for(c, fna::Backend::cpu);
  o.tuning.naive_workspace_bytes = 1;
  const fna::Status st = fna::forward(c.p, t.forward_args(), o);
  EXPECT_EQ(st.code, fna::Code::invalid_argument);
  EXPECT_TRUE(contains(st.message, "naive_workspace_bytes")) << st.message;
}

// The unfused operators take no tuning (no field changes what they run): a field set for them is
// an error naming it, on the backend the field belongs to as well.
TEST(TuningValidation, UnfusedOperatorsTakeNone) {
  const Case c = f32_case(31500, 2);
  ProblemTensors t(c);
  for (fna::Backend b : {fna::Backend::cpu, fna::Backend::reference}) {
    fna::Options o = options_for(c, b);
    o.tuning.cpu_isa = fna::CpuIsa::generic;
    const fna::Status st = fna::qk_forward(c.p, t.qk_args(), o);
    EXPECT_EQ(st.code, fna::Code::invalid_argument) << st.message;
    EXPECT_TRUE(contains(st.message, "cpu_isa")) << st.message;
    EXPECT_TRUE(contains(st.message, "unfused")) << st.message;
    o.tuning = fna::Tuning{};
    EXPECT_TRUE(fna::qk_forward(c.p, t.qk_args(), o).ok());
  }
}

TEST(TuningValidation, WalkMustNameEachAxisOnce) {
  for (int rank = 1; rank <= 3; ++rank) {
    const Case c = f32_case(32000 + rank, rank);
    ProblemTensors t(c);
    std::vector<std::string> bad = {std::string(static_cast<size_t>(rank) + 1, '0'),  // too long
                                    "2" + std::string(static_cast<size_t>(rank), '1')};
    if (rank >= 2) {
      bad.push_back(std::string(static_cast<size_t>(rank), '0'));  // repeated axis
      bad.push_back("0");                                          // too short
    } else {
      bad.push_back("1");  // an axis the problem lacks
    }
    for (const char* key : {"fwd_walk", "bwd_walk"})
      for (const std::string& w : bad) {
        fna::Options o = options_for(c, fna::Backend::cpu);
        ASSERT_TRUE(fna::set_tuning(&o.tuning, key, w).ok()) << key << "=" << w;
        const fna::Status st = fna::forward(c.p, t.forward_args(), o);
        EXPECT_EQ(st.code, fna::Code::invalid_argument) << key << "=" << w;
        EXPECT_TRUE(contains(st.message, std::string(key) + "='" + w + "'")) << st.message;
        EXPECT_TRUE(contains(st.message, "axes")) << st.message;
      }
  }
}

// The cpu_isa names the CPU (and the build) has.
std::vector<fna::CpuIsa> isas_present(std::vector<fna::CpuIsa>* absent) {
  std::vector<fna::CpuIsa> v;
  for (fna::CpuIsa isa : {fna::CpuIsa::automatic, fna::CpuIsa::generic, fna::CpuIsa::avx2, fna::CpuIsa::avx512}) {
    if (fna::cpu::kernels_for(isa))
      v.push_back(isa);
    else if (absent)
      absent->push_back(isa);
  }
  return v;
}

std::string isa_name(fna::CpuIsa isa) {
  const char* names[] = {"automatic", "generic", "avx2", "avx512"};
  return names[static_cast<int>(isa)];
}

// Forward and backward of the cpu backend with tuning tun against the reference.
void expect_matches_reference(const Case& c, const fna::Tuning& tun, int threads) {
  ProblemTensors got(c);
  got.c.with_lse = true;
  ProblemTensors ref = got.as_f32();
  fna::Options o = options_for(c, fna::Backend::cpu, threads);
  o.tuning = tun;
  const std::string what = fna::tuning_string(tun) + " " + c.str();
  fna::Status st = fna::forward(c.p, got.forward_args(), o);
  ASSERT_TRUE(st.ok()) << what << ": " << st.message;
  fna::Problem p32 = c.p;
  p32.dtype = fna::DType::f32;
  const fna::Options ro = options_for(c, fna::Backend::reference);
  ASSERT_TRUE(fna::forward(p32, ref.forward_args(), ro).ok());
  got.c.with_lse = c.with_lse;
  Check chk = check_forward(got, ref);
  EXPECT_TRUE(chk.ok) << what << "\n" << chk.str();
  st = fna::backward(c.p, got.backward_args(), o);
  ASSERT_TRUE(st.ok()) << what << ": " << st.message;
  ASSERT_TRUE(fna::backward(p32, ref.backward_args(), ro).ok());
  chk = check_backward(got, ref);
  EXPECT_TRUE(chk.ok) << "backward " << what << "\n" << chk.str();
}

TEST(CpuTuning, EveryIsaTheCpuHasMatchesReference) {
  const std::vector<fna::CpuIsa> isas = isas_present(nullptr);
  ASSERT_GE(isas.size(), 2u);  // automatic and generic always
  for (fna::CpuIsa isa : isas)
    for (int rank = 1; rank <= 3; ++rank)
      for (int i = 0; i < 4; ++i) {
        const Case c = random_case(33000 + 10 * rank + i, rank);
        fna::Tuning tun;
        tun.cpu_isa = isa;
        SCOPED_TRACE("cpu_isa=" + isa_name(isa));
        expect_matches_reference(c, tun, 1 + i % 2);
        if (HasFatalFailure()) return;
      }
}

// An ISA the CPU (or the build) lacks is an error naming it, never a silent fallback.
TEST(CpuTuning, MissingIsaIsAnError) {
  std::vector<fna::CpuIsa> absent;
  isas_present(&absent);
  if (absent.empty()) GTEST_SKIP() << "this CPU has every kernel set (generic, avx2, avx512)";
  Case c = f32_case(34000, 2);
  c.with_lse = true;
  ProblemTensors t(c);
  ASSERT_TRUE(fna::forward(c.p, t.forward_args(), options_for(c, fna::Backend::cpu)).ok());  // O, LSE
  for (fna::CpuIsa isa : absent) {
    fna::Options o = options_for(c, fna::Backend::cpu);
    o.tuning.cpu_isa = isa;
    const std::string want = "tuning cpu_isa='" + isa_name(isa) + "'";
    fna::Status st = fna::forward(c.p, t.forward_args(), o);
    EXPECT_EQ(st.code, fna::Code::unsupported);
    EXPECT_TRUE(contains(st.message, want)) << st.message;
    st = fna::backward(c.p, t.backward_args(), o);
    EXPECT_EQ(st.code, fna::Code::unsupported);
    EXPECT_TRUE(contains(st.message, want)) << st.message;
  }
}

// The other cpu fields: every value gives results matching the reference.
TEST(CpuTuning, ScheduleFieldsMatchReference) {
  const std::vector<std::pair<std::string, std::string>> settings = {
      {"cpu_band", "1"},        {"cpu_band", "3"},        {"cpu_band", "16"},
      {"cpu_strips", "off"},    {"cpu_strips", "on"},     {"cpu_panels", "rings"},
      {"cpu_panels", "shared"}, {"cpu_acc_rings", "off"}, {"cpu_acc_rings", "on"},
  };
  for (const auto& kv : settings)
    for (int rank = 1; rank <= 3; ++rank)
      for (int i = 0; i < 2; ++i) {
        const Case c = random_case(35000 + 10 * rank + i, rank);
        fna::Tuning tun;
        ASSERT_TRUE(fna::set_tuning(&tun, kv.first, kv.second).ok());
        expect_matches_reference(c, tun, 2);
        if (HasFatalFailure()) return;
      }
}

}  // namespace
}  // namespace fna_test
