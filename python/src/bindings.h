// What the extension's source files share (bindings.cpp defines these).
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "fna/fna.h"

namespace fna_py {

[[noreturn]] void raise_error(PyObject* type, const std::string& msg);  // a Python exception
void check_status(const fna::Status& st);  // raises the exception of a failed Status
fna::Tuning tuning_arg(const std::string& text);  // "key=value,..." (fna::parse_tuning)
fna::DType dtype_of_name(const std::string& name);  // "float32", "float16", "bfloat16"

void bind_fused_plan(nanobind::module_& m);  // plan.cpp

}  // namespace fna_py
