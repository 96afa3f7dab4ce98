// Development timing of the cuda-fused forward on the docs/semantics.md standard problems, per tile
// configuration (the heuristic's pick and every listed alternative). Not part of the build:
//   nvcc -std=c++17 -O2 -Iinclude -Isrc tools/gpu/fused_fwd_timing.cu build/gpu/libfna.a -o t
// Random inputs in [-1, 1] (never zeros), 3 warm-up runs, median of 10 CUDA-event timings.
// Effective TFLOP/s = 4 * B * H * N * W * D / time (docs/semantics.md section 3).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_fp16.h>

#include "cuda/fused/tiling.cuh"
#include "fna/fna.h"

namespace {

// Elements of 2 bytes (bf16 / f16) or 4 (f32).
__global__ void fill_random(void* x, size_t n, uint32_t seed, fna::DType dt) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ (seed * 40503u + uint32_t(i >> 32));
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float f = (h & 0xffffff) / float(0x800000) - 1.0f;  // [-1, 1)
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (dt == fna::DType::f32) {
      static_cast<float*>(x)[i] = f;
    } else if (dt == fna::DType::bf16) {
      static_cast<uint16_t*>(x)[i] = uint16_t(bits >> 16);
    } else {
      const __half hf = __float2half(f);
      std::memcpy(&static_cast<uint16_t*>(x)[i], &hf, 2);
    }
  }
}

struct Spec {
  const char* name;
  int rank;
  int64_t batch, heads;
  int64_t shape[3];
  int64_t dim;
  int64_t kernel[3];
};

// Tile extents from a configuration name (..._q<a>x<b>_kv<c>x<d>_w..), lifted to three axes.
bool parse_tiles(const std::string& name, int rank, int (&q)[3], int (&kv)[3]) {
  auto parse = [&](const char* tag, int (&out)[3]) {
    const size_t at = name.find(tag);
    if (at == std::string::npos) return false;
    int vals[3] = {1, 1, 1}, n = 0;
    const char* c = name.c_str() + at + std::strlen(tag);
    while (n < 3) {
      vals[n++] = std::atoi(c);
      while (*c >= '0' && *c <= '9') ++c;
      if (*c != 'x') break;
      ++c;
    }
    if (n != rank) return false;
    for (int i = 0; i < 3; ++i) out[i] = i < 3 - rank ? 1 : vals[i - (3 - rank)];
    return true;
  };
  return parse("_q", q) && parse("_kv", kv);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("CUDA error %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Spec specs[] = {
      {"1d-long", 1, 1, 16, {32768}, 128, {2048}},
      {"2d-nat", 2, 8, 8, {128, 128}, 64, {13, 13}},
      {"2d-large", 2, 1, 16, {256, 256}, 128, {63, 63}},
      {"3d-video", 3, 1, 24, {30, 48, 80}, 128, {18, 24, 24}},
  };
  // argv[1]: problems to run (substring match, e.g. "1d-long,3d-video"); argv[2]: variants
  // (fp32: float32 split TF32, the default precision; tf32: float32 with allow_tf32).
  const char* only = argc > 1 && argv[1][0] != '\0' ? argv[1] : nullptr;
  std::vector<std::string> variants = {"base", "dil2", "causal0", "fp16", "fp32", "tf32"};
  if (argc > 2) {
    std::vector<std::string> keep;
    for (const std::string& v : variants)
      if (std::strstr(argv[2], v.c_str()) != nullptr) keep.push_back(v);
    variants = keep;
  }
  // argv[3] == "heuristic": time only the heuristic's pick (for profiling one launch set).
  const bool heuristic_only = argc > 3 && std::string(argv[3]) == "heuristic";
  for (const Spec& s : specs) {
    if (only && std::strstr(only, s.name) == nullptr) continue;
    for (const std::string& var : variants) {
      fna::Problem p;
      p.rank = s.rank;
      p.batch = s.batch;
      p.heads = p.heads_kv = s.heads;
      p.dim = p.dim_v = s.dim;
      const bool f32 = var == "fp32" || var == "tf32";
      p.dtype = var == "fp16" ? fna::DType::f16 : (f32 ? fna::DType::f32 : fna::DType::bf16);
      double pairs = 1;
      for (int i = 0; i < s.rank; ++i) {
        p.shape[i] = s.shape[i];
        p.kernel_size[i] = s.kernel[i];
        if (var == "dil2" && s.kernel[i] * 2 <= s.shape[i]) p.dilation[i] = 2;
        if (var == "causal0" && i == 0) p.is_causal[i] = true;
        // causal on axis 0: query i sees min(i + 1, K) keys
        double per = double(s.shape[i]) * s.kernel[i];
        if (p.is_causal[i]) {
          per = 0;
          for (int64_t x = 0; x < s.shape[i]; ++x) per += std::min<int64_t>(x + 1, s.kernel[i]);
        }
        pairs *= per;
      }
      const double flops = 4.0 * p.batch * p.heads * pairs * p.dim;
      const size_t n = size_t(p.batch) * p.tokens() * p.heads * p.dim;
      const size_t es = f32 ? 4 : 2;
      void *q, *k, *v, *o;
      check(cudaMalloc(&q, n * es), "malloc");
      check(cudaMalloc(&k, n * es), "malloc");
      check(cudaMalloc(&v, n * es), "malloc");
      check(cudaMalloc(&o, n * es), "malloc");
      fill_random<<<1024, 256>>>(q, n, 1, p.dtype);
      fill_random<<<1024, 256>>>(k, n, 2, p.dtype);
      fill_random<<<1024, 256>>>(v, n, 3, p.dtype);
      check(cudaDeviceSynchronize(), "fill");
      std::vector<int64_t> ext = {p.batch};
      for (int i = 0; i < p.rank; ++i) ext.push_back(p.shape[i]);
      ext.push_back(p.heads);
      ext.push_back(p.dim);
      fna::ForwardArgs a;
      a.q = fna::dense(q, ext);
      a.k = fna::dense(k, ext);
      a.v = fna::dense(v, ext);
      a.o = fna::dense(o, ext);
      std::vector<std::string> cfgs = {""};
      if (!heuristic_only)
        for (const std::string& c : fna::fused_configs(p.rank, p.dtype, p.dim)) cfgs.push_back(c);
      for (const std::string& cfg : cfgs) {
        fna::Options opt;
        opt.backend = fna::Backend::cuda_fused;
        opt.device = fna::Device::cuda;
        opt.config = cfg;
        opt.allow_tf32 = var == "tf32";
        fna::Status st;
        for (int i = 0; i < 3; ++i) st = fna::forward(p, a, opt);
        if (!st.ok()) {
          std::printf("%-9s %-8s %-40s error: %s\n", s.name, var.c_str(),
                      cfg.empty() ? "(heuristic)" : cfg.c_str(), st.message.c_str());
          continue;
        }
        check(cudaDeviceSynchronize(), "warmup");
        std::vector<float> ms;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (int r = 0; r < 10; ++r) {
          cudaEventRecord(e0);
          fna::forward(p, a, opt);
          cudaEventRecord(e1);
          cudaEventSynchronize(e1);
          float t = 0;
          cudaEventElapsedTime(&t, e0, e1);
          ms.push_back(t);
        }
        check(cudaGetLastError(), "timing");
        std::sort(ms.begin(), ms.end());
        const float med = ms[ms.size() / 2];
        // Tiling efficiency of a named configuration: key tiles needing no mask among those
        // visited, and needed / computed score pairs.
        char eff[96] = "";
        int qe[3], ke[3];
        if (!cfg.empty() && parse_tiles(cfg, p.rank, qe, ke)) {
          const auto geo = fna::fused::Geometry::lift(p.rank, p.shape, p.kernel_size, p.dilation,
                                                      p.stride, p.is_causal);
          const auto ts = fna::fused::tiling_stats(geo, qe, ke);
          const double computed = ts.visited * p.batch * p.heads * (qe[0] * qe[1] * qe[2]) *
                                  (ke[0] * ke[1] * ke[2]);
          std::snprintf(eff, sizeof(eff), "  unmasked tiles %.3f  needed pairs %.3f",
                        ts.unmasked / ts.visited, pairs * p.batch * p.heads / computed);
        }
        std::printf("%-9s %-8s %-40s %9.3f ms %8.1f TFLOP/s%s\n", s.name, var.c_str(),
                    cfg.empty() ? "(heuristic)" : cfg.c_str(), med, flops / med / 1e9, eff);
        std::fflush(stdout);
      }
      cudaFree(q);
      cudaFree(k);
      cudaFree(v);
      cudaFree(o);
    }
  }
  return 0;
}
