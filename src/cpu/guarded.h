// The CPU backends allocate (std::vector) and may throw std::bad_alloc; the API returns Status
// values, never exceptions, so each entry point runs inside this guard.
#pragma once

#include <exception>
#include <string>

#include "fna/fna.h"

namespace fna {
namespace cpu {

template <typename Fn>
Status guarded(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return {Code::runtime_error, std::string("cpu ") + what + " failed: " + e.what()};
  }
}

}  // namespace cpu
}  // namespace fna
