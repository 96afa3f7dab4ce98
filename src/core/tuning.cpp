// Options::tuning as text (set_tuning / tuning_string) and its validation against the call.
// One table names every field, its values and the backend it concerns, so that parsing,
// printing and the "this field does not concern the backend that runs" check cannot drift apart.
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/validate.h"
#include "fna/fna.h"

namespace fna {
namespace {

// The text of each enumerator, in enum order (index = static_cast<int>(value)).
const std::vector<std::string> kSwitch = {"automatic", "off", "on"};
const std::vector<std::string> kCopy = {"automatic", "tma", "cp_async"};
const std::vector<std::string> kSchedule = {"automatic", "plain", "warp_specialized"};
const std::vector<std::string> kBwdKernel = {"automatic", "sm80", "sm90", "sm90ws"};
const std::vector<std::string> kIsa = {"automatic", "generic", "avx2", "avx512"};
const std::vector<std::string> kPanels = {"automatic", "rings", "shared"};

enum class Kind { enumeration, integer, walk };

struct Field {
  const char* key;
  Backend backend;  // the backend the field concerns
  Kind kind;
  const std::vector<std::string>* names;  // enumerations
  int* (*as_enum)(Tuning*);
  int64_t* (*as_int)(Tuning*);
  std::string* (*as_walk)(Tuning*);
};

template <class E>
int* enum_ptr(E* e) {
  return reinterpret_cast<int*>(e);
}

#define FNA_ENUM_FIELD(name, backend, names) \
  Field { #name, backend, Kind::enumeration, &names, [](Tuning* t) { return enum_ptr(&t->name); }, nullptr, nullptr }
#define FNA_WALK_FIELD(name, backend) \
  Field { #name, backend, Kind::walk, nullptr, nullptr, nullptr, [](Tuning* t) { return &t->name; } }

int64_t* naive_ws(Tuning* t) { return &t->naive_workspace_bytes; }

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      FNA_ENUM_FIELD(fwd_strip, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(fwd_box, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(fwd_schedule, Backend::cuda_fused, kSchedule),
      FNA_ENUM_FIELD(fwd_wg_skip, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(fwd_spread, Backend::cuda_fused, kSwitch),
      FNA_ENUM_FIELD(fwd_copy, Backend::cuda_fused, kCopy),
      FNA_ENUM_FIELD(persistent, Backend::cuda_fused, kSwitch),
      FNA_WALK_FIELD(fwd_walk, Backend::cuda_fused),
      FNA_ENUM_FIELD(bwd_kernel, Backend::cuda_fused, kBwdKernel),
      FNA_ENUM_FIELD(bwd_copy, Backend::cuda_fused, kCopy),
      FNA_WALK_FIELD(bwd_walk, Backend::cuda_fused),
      Field{"naive_workspace_bytes", Backend::cuda_naive, Kind::integer, nullptr, nullptr,
            &naive_ws, nullptr},
      FNA_ENUM_FIELD(cpu_isa, Backend::cpu, kIsa),
      // cpu_band is an int: no int64 accessor (get_int / set_tuning read and write it directly).
      Field{"cpu_band", Backend::cpu, Kind::integer, nullptr, nullptr, nullptr, nullptr},
      FNA_ENUM_FIELD(cpu_strips, Backend::cpu, kSwitch),
      FNA_ENUM_FIELD(cpu_panels, Backend::cpu, kPanels),
      FNA_ENUM_FIELD(cpu_acc_rings, Backend::cpu, kSwitch),
  };
  return f;
}
#undef FNA_ENUM_FIELD
#undef FNA_WALK_FIELD

Status invalid(const std::string& m) { return {Code::invalid_argument, m}; }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The value of an integer field (cpu_band is an int, the others int64).
int64_t get_int(const Field& f, const Tuning& t) {
  Tuning& m = const_cast<Tuning&>(t);
  return f.as_int ? *f.as_int(&m) : int64_t(t.cpu_band);
}

// The field's value as text, or "" when it holds its default.
std::string value_text(const Field& f, const Tuning& t) {
  Tuning& m = const_cast<Tuning&>(t);
  switch (f.kind) {
    case Kind::enumeration: {
      const int v = *f.as_enum(&m);
      return v == 0 ? "" : (*f.names)[static_cast<size_t>(v)];
    }
    case Kind::integer: {
      const int64_t v = get_int(f, t);
      return v == 0 ? "" : std::to_string(v);
    }
    case Kind::walk: return *f.as_walk(&m);
  }
  return "";
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
            *f.as_enum(t) = static_cast<int>(i);
            return Status::Ok();
          }
        return invalid(what + " is not one of " + join(*f.names));
      case Kind::integer: {
        char* end = nullptr;
        errno = 0;
        const long long v = value.empty() ? -1 : std::strtoll(value.c_str(), &end, 10);
        const int64_t cap = f.as_int ? (int64_t(1) << 62) : 1024;
        if (value.empty() || errno != 0 || *end != '\0' || v < 0 || v > cap)
          return invalid(what + " must be an integer in [0, " + std::to_string(cap) + "]");
        if (f.as_int)
          *f.as_int(t) = v;
        else
          t->cpu_band = static_cast<int>(v);
        return Status::Ok();
      }
      case Kind::walk:
        for (char c : value)
          if (c < '0' || c > '2') return invalid(what + " must be axis digits 0-2, fastest first");
        *f.as_walk(t) = value;
        return Status::Ok();
    }
  }
  return invalid("tuning key '" + key + "' is not one of " + join(tuning_keys()));
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

// Every non-default field must concern the backend that runs the call, hold a known value, and
// (walks) name each of the problem's axes once; the unfused operators take none (no field
// changes what they run).
Status validate_tuning(const Problem& p, const Tuning& t, Backend resolved, bool unfused) {
  Tuning& m = const_cast<Tuning&>(t);
  for (const Field& f : fields()) {
    const std::string v = value_text(f, t);
    if (v.empty()) continue;
    const std::string what = std::string("tuning ") + f.key + "='" + v + "'";
    if (f.kind == Kind::enumeration) {
      const int e = *f.as_enum(&m);
      if (e < 0 || e >= static_cast<int>(f.names->size()))
        return invalid(std::string("tuning ") + f.key + "=" + std::to_string(e) +
                       " is not one of " + join(*f.names));
    }
    if (f.kind == Kind::integer && get_int(f, t) < 0)
      return invalid(what + " must be >= 0");
    if (f.kind == Kind::walk) {
      int seen = 0;
      for (char c : v) {
        const int ax = c - '0';
        if (ax < 0 || ax >= p.rank || (seen & (1 << ax)))
          return invalid(what + " must name each of the problem's " + std::to_string(p.rank) +
                         " axes (0.." + std::to_string(p.rank - 1) + ") once, fastest first");
        seen |= 1 << ax;
      }
      if (static_cast<int>(v.size()) != p.rank)
        return invalid(what + " must name each of the problem's " + std::to_string(p.rank) +
                       " axes once, fastest first");
    }
    if (unfused)
      return invalid(what + ": the unfused operators (qk / av) take no tuning");
    if (resolved != f.backend)
      return invalid(what + " concerns backend=" + backend_name(f.backend) + ", but backend=" +
                     backend_name(resolved) + " runs this call");
  }
  return Status::Ok();
}

}  // namespace detail
}  // namespace fna
