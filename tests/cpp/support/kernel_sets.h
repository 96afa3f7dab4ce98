// Test support: the CPU kernel sets (cpu_isa values) this machine and build have.
#pragma once

#include <string>
#include <vector>

namespace fna_test {

// "generic", and "avx2" / "avx512" where the CPU and the build have them (cpu::kernels_for).
std::vector<std::string> kernel_sets();

}  // namespace fna_test
