// Options::tuning as text (set_tuning / tuning_string) and its validation against the call.
// One table names every field, its values and the backend it concerns, so that parsing,
// printing and the "this field does not concern the backend that runs" check cannot drift apart.
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/autotune.h"
#include "core/validate.h"
#include "fna/fna.h"

namespace fna {
namespace {

// The text of each enumerator, in enum order (index = static_cast<int>(value)).
const std::vector<std::string> kSwitch = {"automatic", "off", "on"};
const std::vector<std::string> kCopy = {"automatic", "tma", "cp_async"};
const std::vector<std::string> kSchedule = {"automatic", "plain", "warp_specialized", "mma_sync"};
const std::vector<std::string> kRpbSums = {"automatic", "warps", "shared", "global"};
const std::vector<std::string> kBwdKernel = {"automatic", "sm80", "sm90", "sm90ws"};
const std::vector<std::string> kIsa = {"automatic", "generic", "avx2", "avx512"};
const std::vector<std::string> kPanels = {"automatic", "rings", "shared"};
const std::vector<std::string> kMode = {"heuristic", "auto"};

enum class Kind { enumeration, integer, walk, text };

// One field: its key, the backend it concerns, its kind, and how to read and write it (enums and
// integers as int64; walks as the string member).
struct Field {
  const char* key;
  Backend backend;
  Kind kind;
  const std::vector<std::string>* names;  // enumerations: the text of each value
  int64_t (*get)(const Tuning&);
  void (*set)(Tuning&, int64_t);
  std::string Tuning::*walk;
};

#define FNA_ENUM_FIELD(name, backend, names)                                            \
  Field {                                                                               \
    #name, backend, Kind::enumeration, &names,                                          \
        [](const Tuning& t) { return static_cast<int64_t>(t.name); },                   \
        [](Tuning& t, int64_t v) { t.name = static_cast<decltype(t.name)>(v); }, nullptr \
  }
#define FNA_INT_FIELD(name, backend)                                                    \
  Field {                                                                               \
    #name, backend, Kind::integer, nullptr,                                             \
        [](const Tuning& t) { return static_cast<int64_t>(t.name); },                   \
        [](Tuning& t, int64_t v) { t.name = static_cast<decltype(t.name)>(v); }, nullptr \
  }
#define FNA_WALK_FIELD(name, backend) \
  Field { #name, backend, Kind::walk, nullptr, nullptr, nullptr, &Tuning::name }
#define FNA_TEXT_FIELD(name, backend) \
  Field { #name, backend, Kind::text, nullptr, nullptr, nullptr, &Tuning::name }

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      FNA_ENUM_FIELD(mode, Backend::cuda_fused, kMode),
      FNA_TEXT_FIELD(autotune_cache_dir, Backend::cuda_fused),
      FNA_INT_FIELD(autotune_budget_ms, Backend::cuda_fused),
      FNA_ENUM_FIELD(fwd_strip, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(fwd_box, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(fwd_simt, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(fwd_schedule, Backend::cuda_fused, kSchedule),
      FNA_ENUM_FIELD(fwd_wg_skip, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(fwd_spread, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(fwd_copy, Backend::cuda_fused, kCopy),
      FNA_ENUM_FIELD(persistent, Backend::cuda_fused, kSwitch),
      FNA_WALK_FIELD(fwd_walk, Backend::cuda_fused),
      FNA_ENUM_FIELD(fwd_rpb_stage, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(bwd_kernel, Backend::cuda_fused, kBwdKernel),
      FNA_ENUM_FIELD(bwd_copy, Backend::cuda_fused, kCopy),
      FNA_WALK_FIELD(bwd_walk, Backend::cuda_fused),
      FNA_ENUM_FIELD(bwd_rpb_sums, Backend::cuda_fused, kRpbSums),
      FNA_ENUM_FIELD(bwd_q_pairs, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(bwd_dq_strip, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(bwd_dq_sm90, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(bwd_strip, Backend::cuda_fused, kSwitch),
      FNA_INT_FIELD(naive_workspace_bytes, Backend::cuda_naive),
      FNA_ENUM_FIELD(cpu_isa, Backend::cpu, kIsa),
      FNA_INT_FIELD(cpu_band, Backend::cpu),
      FNA_ENUM_FIELD(cpu_strips, Backend::cpu, kSwitch),
      FNA_ENUM_FIELD(cpu_panels, Backend::cpu, kPanels),
      FNA_ENUM_FIELD(cpu_acc_rings, Backend::cpu, kSwitch),
  };
  return f;
}
#undef FNA_ENUM_FIELD
#undef FNA_INT_FIELD
#undef FNA_WALK_FIELD
#undef FNA_TEXT_FIELD

Status invalid(const std::string& m) { return {Code::invalid_argument, m}; }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The field's value as text, or "" when it holds its default.
std::string value_text(const Field& f, const Tuning& t) {
  if (f.kind == Kind::walk || f.kind == Kind::text) return t.*f.walk;
  const int64_t v = f.get(t);
  if (v == 0) return "";
  if (f.kind == Kind::integer) return std::to_string(v);
  return v > 0 && v < static_cast<int64_t>(f.names->size()) ? (*f.names)[static_cast<size_t>(v)]
                                                              : std::to_string(v);
}

// The largest value an integer field takes.
int64_t int_cap(const Field& f) {
  return std::string(f.key) == "cpu_band" ? 1024 : (int64_t(1) << 62);
}

}  // namespace

std::vector<std::string> tuning_keys() {
  std::vector<std::string> k;
  for (const Field& f : fields()) k.push_back(f.key);
  return k;
}

Status set_tuning(Tuning* t, const std::string& key, const std::string& value) {
  for (const Field& f : fields()) {
    if (key != f.key) continue;
    const std::string what = "tuning " + key + "='" + value + "'";
    switch (f.kind) {
      case Kind::enumeration:
        for (size_t i = 0; i < f.names->size(); ++i)
          if (value == (*f.names)[i]) {
            f.set(*t, static_cast<int64_t>(i));
            return Status::Ok();
          }
        return invalid(what + " is not one of " + join(*f.names));
      case Kind::integer: {
        char* end = nullptr;
        errno = 0;
        const long long v = value.empty() ? -1 : std::strtoll(value.c_str(), &end, 10);
        const int64_t cap = int_cap(f);
        if (value.empty() || errno != 0 || *end != '\0' || v < 0 || v > cap)
          return invalid(what + " must be an integer in [0, " + std::to_string(cap) + "]");
        f.set(*t, v);
        return Status::Ok();
      }
      case Kind::walk:
        for (char c : value)
          if (c < '0' || c > '2') return invalid(what + " must be axis digits 0-2, fastest first");
        t->*f.walk = value;
        return Status::Ok();
      case Kind::text:
        if (value.find(',') != std::string::npos || value.find('\n') != std::string::npos)
          return invalid(what + " must not hold ',' or a newline");
        t->*f.walk = value;
        return Status::Ok();
    }
  }
  return invalid("tuning key '" + key + "' is not one of " + join(tuning_keys()));
}

Status parse_tuning(const std::string& text, Tuning* t) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string pair = text.substr(at, end - at);
    const size_t eq = pair.find('=');
    if (eq == std::string::npos) return invalid("tuning entry '" + pair + "' is not key=value");
    Status st = set_tuning(t, pair.substr(0, eq), pair.substr(eq + 1));
    if (!st.ok()) return st;
    at = end + 1;
  }
  return Status::Ok();
}

std::string tuning_string(const Tuning& t) {
  std::string s;
  for (const Field& f : fields()) {
    const std::string v = value_text(f, t);
    if (!v.empty()) s += (s.empty() ? "" : ",") + std::string(f.key) + "=" + v;
  }
  return s;
}

namespace detail {

Tuning kernel_tuning(const Tuning& t) {
  Tuning rest = t;
  rest.mode = TuningMode::heuristic;
  rest.autotune_cache_dir.clear();
  rest.autotune_budget_ms = 0;
  return rest;
}

// Every non-default field must concern the backend that runs the call, hold a known value, and
// (walks) name each of the problem's axes once; the unfused operators take none (no field
// changes what they run).
Status validate_tuning(const Problem& p, const Tuning& t, Backend resolved, bool unfused) {
  for (const Field& f : fields()) {
    const std::string v = value_text(f, t);
    if (v.empty()) continue;
    const std::string what = std::string("tuning ") + f.key + "='" + v + "'";
    if (f.kind == Kind::enumeration &&
        (f.get(t) < 0 || f.get(t) >= static_cast<int64_t>(f.names->size())))
      return invalid(std::string("tuning ") + f.key + "=" + v + " is not one of " +
                     join(*f.names));
    if (f.kind == Kind::integer && (f.get(t) < 0 || f.get(t) > int_cap(f)))
      return invalid(what + " must be an integer in [0, " + std::to_string(int_cap(f)) + "]");
    if (f.kind == Kind::walk) {
      int seen = 0;
      bool ok = static_cast<int>(v.size()) == p.rank;
      for (char c : v) {
        const int ax = c - '0';
        ok = ok && ax >= 0 && ax < p.rank && !(seen & (1 << ax));
        if (ax >= 0 && ax < 30) seen |= 1 << ax;
      }
      if (!ok)
        return invalid(what + " must name each of the problem's " + std::to_string(p.rank) +
                       " axes (0.." + std::to_string(p.rank - 1) + ") once, fastest first");
    }
    if (unfused)
      return invalid(what + ": the unfused operators (qk / av) take no tuning");
    // The composed forward / backward of cuda-gemm use cuda-naive's workspace too.
    const bool shared = f.backend == Backend::cuda_naive && resolved == Backend::cuda_gemm;
    if (resolved != f.backend && !shared)
      return invalid(what + " concerns backend=" + backend_name(f.backend) + ", but backend=" +
                     backend_name(resolved) + " runs this call");
  }
  return Status::Ok();
}

}  // namespace detail
}  // namespace fna
