#include "support/kernel_sets.h"

#include "cpu/tile.h"
#include "fna/fna.h"

namespace fna_test {

std::vector<std::string> kernel_sets() {
  std::vector<std::string> v;
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    fna::Tuning t;
    if (fna::set_tuning(&t, "cpu_isa", isa).ok() && fna::cpu::kernels_for(t.cpu_isa)) v.push_back(isa);
  }
  return v;
}

}  // namespace fna_test
