// fna._C.fused_plan: the binding of fna::fused_plan (what cuda-fused runs for a problem), apart
// from bindings.cpp's tensor calls.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"
#include "fna/fna.h"

namespace nb = nanobind;

namespace fna_py {

void bind_fused_plan(nb::module_& m) {
  m.def("fused_plan", [](const std::vector<int64_t>& query_shape, const std::string& dtype,
                         const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride,
                         const std::vector<int64_t>& dilation, const std::vector<bool>& is_causal,
                         int64_t heads_kv, int64_t dim_v, const std::string& config,
                         bool allow_tf32, int device_index, const std::string& backward_config,
                         bool deterministic, const std::string& tuning,
                         const std::vector<int64_t>& query_offset,
                         const std::vector<int64_t>& grid_shape, bool rpb) {
    const size_t nd = query_shape.size();
    if (nd < 4 || nd > 6)
      raise_error(PyExc_ValueError, "query_shape has " + std::to_string(nd) +
                                  " entries; expected [B, *spatial, H, D] with 1-3 spatial axes");
    fna::Problem p;
    p.rank = static_cast<int>(nd) - 3;
    p.batch = query_shape[0];
    for (int i = 0; i < p.rank; ++i) p.shape[i] = query_shape[1 + i];
    p.heads = query_shape[nd - 2];
    p.dim = query_shape[nd - 1];
    p.heads_kv = heads_kv > 0 ? heads_kv : p.heads;
    p.dim_v = dim_v > 0 ? dim_v : p.dim;
    p.dtype = dtype_of_name(dtype);
    p.rpb = rpb;
    const std::vector<int64_t>* per_axis[] = {&kernel_size, &stride, &dilation};
    const char* names[] = {"kernel_size", "stride", "dilation"};
    for (int k = 0; k < 3; ++k)
      if (per_axis[k]->size() != static_cast<size_t>(p.rank))
        raise_error(PyExc_ValueError, std::string(names[k]) + " has " +
                                    std::to_string(per_axis[k]->size()) + " entries for a " +
                                    std::to_string(p.rank) + "-D problem");
    if (is_causal.size() != static_cast<size_t>(p.rank))
      raise_error(PyExc_ValueError, "is_causal has " + std::to_string(is_causal.size()) +
                                  " entries for a " + std::to_string(p.rank) + "-D problem");
    for (int i = 0; i < p.rank; ++i) {
      p.kernel_size[i] = kernel_size[i];
      p.stride[i] = stride[i];
      p.dilation[i] = dilation[i];
      p.is_causal[i] = is_causal[i];
    }
    if (!query_offset.empty()) {  // the queries: a region of the grid `grid_shape`
      if (query_offset.size() != static_cast<size_t>(p.rank) ||
          grid_shape.size() != static_cast<size_t>(p.rank))
        raise_error(PyExc_ValueError, "query_offset and grid_shape need " + std::to_string(p.rank) +
                                    " entries each for a " + std::to_string(p.rank) +
                                    "-D problem");
      for (int i = 0; i < p.rank; ++i) {
        p.query_offset[i] = query_offset[i];
        p.query_shape[i] = p.shape[i];
        p.shape[i] = grid_shape[i];
      }
    }
    fna::Options o;
    o.backend = fna::Backend::cuda_fused;
    o.device = fna::Device::cuda;
    o.device_index = device_index;
    o.config = config;
    o.backward_config = backward_config;
    o.deterministic = deterministic;
    o.allow_tf32 = allow_tf32;
    o.tuning = tuning_arg(tuning);
    fna::FusedPlan plan;
    check_status(fna::fused_plan(p, o, &plan));
    auto list = [](const std::vector<int>& v) {
      nb::list l;
      for (int e : v) l.append(e);
      return l;
    };
    nb::dict d;
    d["config"] = plan.config;
    d["family"] = plan.family;
    d["copy"] = plan.copy;
    d["persistent"] = plan.persistent;
    d["spread"] = plan.spread;
    d["wg_skip"] = plan.wg_skip;
    d["q_tile"] = list(plan.q_tile);
    d["kv_tile"] = list(plan.kv_tile);
    d["warps"] = plan.warps;
    d["grid"] = plan.grid;
    d["smem"] = plan.smem;
    d["tuning"] = plan.tuning;
    d["visited_tiles"] = plan.visited_tiles;
    d["unmasked_fraction"] = plan.unmasked_fraction;
    d["needed_fraction"] = plan.needed_fraction;
    d["walk"] = list(plan.walk);
    d["rpb_table"] = plan.rpb_table;
    d["backward_config"] = plan.backward_config;
    d["backward_family"] = plan.backward_family;
    d["backward_copy"] = plan.backward_copy;
    d["backward_deterministic"] = plan.backward_deterministic;
    d["backward_head_dim"] = plan.backward_head_dim;
    d["backward_kv_tile"] = list(plan.backward_kv_tile);
    d["backward_q_tile"] = list(plan.backward_q_tile);
    d["backward_q_steps"] = plan.backward_q_steps;
    d["backward_dq"] = plan.backward_dq;
    d["backward_grid"] = plan.backward_grid;
    d["backward_smem"] = plan.backward_smem;
    d["backward_rpb_sums"] = plan.backward_rpb_sums;
    d["backward_visited_tiles"] = plan.backward_visited_tiles;
    d["backward_needed_fraction"] = plan.backward_needed_fraction;
    d["backward_walk"] = list(plan.backward_walk);
    return d;
  }, nb::arg("query_shape"), nb::arg("dtype"), nb::kw_only(), nb::arg("kernel_size"),
     nb::arg("stride"), nb::arg("dilation"), nb::arg("is_causal"), nb::arg("heads_kv") = 0,
     nb::arg("dim_v") = 0, nb::arg("config") = "", nb::arg("allow_tf32") = false,
     nb::arg("device_index") = 0, nb::arg("backward_config") = "", nb::arg("deterministic") = false,
     nb::arg("tuning") = "", nb::arg("query_offset") = std::vector<int64_t>{},
     nb::arg("grid_shape") = std::vector<int64_t>{}, nb::arg("rpb") = false,
     "The cuda-fused plan for a problem: what runs, forward and backward, and how well it tiles.");
}

}  // namespace fna_py
