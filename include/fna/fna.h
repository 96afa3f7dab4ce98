// fna: neighborhood attention — the public, framework-free C++ API.
//
// A call is (Problem, tensor views, Options). Validation happens once, here at the boundary:
// every entry point returns a Status whose message names the offending argument and its value.
// No torch / Python headers are needed to use this API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fna {

constexpr int kMaxRank = 3;
// The largest number of dimensions any tensor of the API has: [B, L0, L1, L2, H, D].
constexpr int kMaxDims = kMaxRank + 3;

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };
enum class Device : int { cpu = 0, cuda = 1 };

// Backends. `automatic` picks the best compiled-in backend for the tensors' device.
enum class Backend : int {
  automatic = 0,
  reference = 1,   // CPU oracle: loops over all keys, tests membership, float64 accumulation
  cpu = 2,         // production CPU backend: visits only the neighborhood
  cuda_naive = 3,  // CUDA: unfused PN / softmax / NN / IN kernels (paper section 3.1)
  cuda_fused = 4,  // CUDA: fused tensor-core kernels (paper section 3.3)
  cuda_gemm = 5,   // CUDA: unfused operators as tensor-core GEMMs over tiles (paper section 3.2)
};

enum class Code : int {
  ok = 0,
  invalid_argument = 1,  // a bad shape, parameter, pointer, stride
  unsupported = 2,       // valid input this backend / build cannot run (dtype, head dim ...)
  not_compiled = 3,      // the backend asked for is not in this build (e.g. CUDA without nvcc)
  runtime_error = 4,     // a failure while running (CUDA error, out of memory)
};

struct Status {
  Code code = Code::ok;
  std::string message;
  bool ok() const { return code == Code::ok; }
  static Status Ok() { return {}; }
};

// The problem: everything that is not a pointer or a stride.
// Spatial parameters are per axis; entries at index >= rank are ignored.
struct Problem {
  int rank = 2;                        // 1, 2 or 3
  int64_t batch = 1;                   // B
  int64_t shape[kMaxRank] = {1, 1, 1};  // L_0 .. L_{rank-1}
  int64_t heads = 1;                   // H (query heads)
  int64_t heads_kv = 1;                // H_kv; H % H_kv == 0 (GQA / MQA)
  int64_t dim = 1;                     // D  (query / key head dim)
  int64_t dim_v = 1;                   // D_v (value / output head dim)
  int64_t kernel_size[kMaxRank] = {1, 1, 1};
  int64_t dilation[kMaxRank] = {1, 1, 1};
  int64_t stride[kMaxRank] = {1, 1, 1};
  bool is_causal[kMaxRank] = {false, false, false};
  int64_t num_additional = 0;          // N_add: additional (global) keys / values; 0 = none
  DType dtype = DType::f32;            // dtype of Q, K, V, O and gradients (LSE is always f32)
  // The query region (fused attention only: forward / backward): the queries are the box
  // [query_offset_a, query_offset_a + query_shape_a) of the grid `shape`, whose keys and values
  // K / V hold. Windows are those of the whole grid, so the result is the region's rows of the
  // whole-grid call; only the region's queries are computed. Q, O, dO, dQ and LSE have the
  // region's extents, K, V, dK, dV the grid's. query_shape_a = 0 means shape_a -
  // query_offset_a; all zeros (the default) is the whole grid.
  int64_t query_offset[kMaxRank] = {0, 0, 0};
  int64_t query_shape[kMaxRank] = {0, 0, 0};
  // The call adds a relative positional bias (ForwardArgs::rpb). forward / backward set it from
  // their arguments (true without a bias given is an error); fused_plan plans a call with a bias
  // when it is set.
  bool rpb = false;

  int64_t tokens() const;              // prod(shape[0..rank))
  int64_t window() const;              // prod(kernel_size[0..rank)) = W
  int64_t query_extent(int axis) const;  // query_shape[axis], or shape - offset where it is 0
  int64_t query_tokens() const;        // prod(query_extent(a)): the region's tokens
  bool has_query_region() const;       // the region is not the whole grid
};

// A strided view. `strides` are in elements, one per dimension of the tensor's role:
//   Q, dQ:          [B, L_0 .. L_{r-1}, H,    D  ]  (rank + 3 dims)
//   K, dK:          [B, L_0 .. L_{r-1}, H_kv, D  ]
//   V, dV:          [B, L_0 .. L_{r-1}, H_kv, D_v]
//   O, dO:          [B, L_0 .. L_{r-1}, H,    D_v]
//   LSE, d_LSE:     [B, L_0 .. L_{r-1}, H]          (rank + 2 dims, float32)
//   attn (unfused): [B, L_0 .. L_{r-1}, H, W + N_add]  (rank + 3 dims)
//   additional K:   [B, N_add, H_kv, D  ]           (4 dims)
//   additional V:   [B, N_add, H_kv, D_v]           (4 dims)
// A null `data` means "absent" for optional tensors.
struct TensorRef {
  void* data = nullptr;
  int64_t strides[kMaxDims] = {0, 0, 0, 0, 0, 0};
};

// Dense row-major strides for a tensor with the given extents (helper for C++ users and tests).
TensorRef dense(void* data, const std::vector<int64_t>& extents);

// ---- Tuning: every choice of kernel, schedule and copy engine that a caller may make ---------
// Each field's default (`automatic`, 0 or empty) lets the plan decide from the problem and the
// device; any other value is validated like every other argument and echoed in the plan
// (fna::fused_plan). A field that only concerns a backend other than the one a call runs is an
// error there, so that no setting is silently ignored. Keys for set_tuning / tuning_string are
// the field names.
enum class Switch : int { automatic = 0, off = 1, on = 2 };
enum class CopyEngine : int { automatic = 0, tma = 1, cp_async = 2 };
// Forward schedules: the Hopper ones, `plain` (every warp loads and computes; NATTEN's "non") and
// `warp_specialized` (a producer warpgroup feeds compute warpgroups; NATTEN's "coop"), and
// `mma_sync`: the tiled mma.sync kernels (fna_fwd_sm80_*) on any device, chosen as on a device
// without wgmma (what NATTEN's cutlass-fna backend runs).
enum class FwdSchedule : int { automatic = 0, plain = 1, warp_specialized = 2, mma_sync = 3 };
// Backward kernel families: sm80 (mma.sync, every sm_80+ GPU), sm90 (wgmma dK / dV kernel),
// sm90ws (its warp-specialized variant); the sm90 ones need compute capability 9.0.
enum class BwdKernel : int { automatic = 0, sm80 = 1, sm90 = 2, sm90ws = 3 };
// Where the fused backward's dK / dV kernel sums d rpb (FusedPlan::backward_rpb_sums).
enum class RpbSums : int { automatic = 0, warps = 1, shared = 2, global = 3 };
enum class CpuIsa : int { automatic = 0, generic = 1, avx2 = 2, avx512 = 3 };
enum class CpuPanels : int { automatic = 0, rings = 1, shared = 2 };
// How cuda-fused picks a configuration: `heuristic` (the plan's cost model, never times), or
// `autotune` (the first call of a problem signature times the plan's candidate configurations on
// the device and caches the fastest, in memory and, with autotune_cache_dir, on disk; later calls
// and processes reuse it; inside CUDA graph capture it never times).
enum class TuningMode : int { heuristic = 0, autotune = 1 };

struct Tuning {
  // cuda-fused: heuristic (default) or autotune (text: mode=auto), with the autotuner's disk cache
  // directory ("" = memory only; the Python layer defaults it to the platform cache directory) and
  // time budget per signature in ms (0 = 2000).
  TuningMode mode = TuningMode::heuristic;
  std::string autotune_cache_dir;
  int64_t autotune_budget_ms = 0;
  // cuda-fused forward.
  Switch fwd_strip = Switch::automatic;      // strip forward (rank-2 small windows): on = wherever
                                             // it applies, off = never
  Switch fwd_box = Switch::automatic;        // box forward: on = wherever it applies, off = never
  Switch fwd_simt = Switch::automatic;       // SIMT forward (CUDA cores, small windows and head
                                             // dims): on = wherever it applies, off = never
  FwdSchedule fwd_schedule = FwdSchedule::automatic;  // Hopper schedule (sm90 tiles), or mma_sync
  Switch fwd_wg_skip = Switch::automatic;    // warp-specialized forward: each warpgroup visits only
                                             // its own rows' key tiles (automatic: on)
  Switch fwd_spread = Switch::automatic;     // plain Hopper forward: whole-row copies per warp
                                             // instruction (automatic: at padded head dim 64)
  CopyEngine fwd_copy = CopyEngine::automatic;  // Hopper (plain and warp-specialized) and strip
                                                // forwards (automatic: TMA where the device and
                                                // tensors allow; fwd_spread asks for cp.async)
  Switch persistent = Switch::automatic;     // warp-specialized forward: one CTA per SM taking
                                             // tiles from a counter (automatic: off)
  std::string fwd_walk;                      // CTA tile walk, the problem's axes fastest first
                                             // (e.g. "10" at rank 2); empty: the plan's
  Switch fwd_rpb_stage = Switch::automatic;  // with a bias, sm80 / plain sm90 forward: each CTA
                                             // copies its head's table into shared memory (on)
                                             // or reads it in global memory (off; the strip
                                             // forward, which always copies it, then never runs)
  // cuda-fused backward.
  BwdKernel bwd_kernel = BwdKernel::automatic;
  CopyEngine bwd_copy = CopyEngine::automatic;  // sm90ws dK / dV kernel's Q / dO loads, the
                                                // strip backward kernels' bands, or the Hopper
                                                // dQ kernel's tiles
  std::string bwd_walk;                      // as fwd_walk, for the dK / dV (and dQ) kernels
  RpbSums bwd_rpb_sums = RpbSums::automatic;  // with a bias: d rpb summed in a shared-memory
                                              // table per warp, one table, or global memory
  Switch bwd_q_pairs = Switch::automatic;    // Hopper dK / dV kernels at padded head dim 64 with
                                             // 128-key tiles, no bias: two query tiles per step
                                             // (automatic: off)
  Switch bwd_dq_strip = Switch::automatic;   // Hopper backward, rank 2, no bias: dQ by the strip
                                             // dQ kernel instead of atomics in the dK / dV kernel
  Switch bwd_dq_sm90 = Switch::automatic;    // Hopper backward, 16-bit, head dims up to 128, no
                                             // bias: dQ by the Hopper dQ kernel on the plain
                                             // forward's tiles after the dK / dV kernel
                                             // (automatic: deterministic calls the strips do not
                                             // take)
  Switch bwd_strip = Switch::automatic;      // Hopper backward, rank 2, no bias or GQA, head dims
                                             // up to 128: dK / dV by the strip dK / dV kernel
                                             // (with the strip dQ kernel; deterministic too)
  // cuda-naive, cuda-gemm: workspace budget of the composed forward / backward in bytes (0: half
  // the free memory, at most 4 GiB); a small budget makes the kernels run in chunks.
  int64_t naive_workspace_bytes = 0;
  // cpu backend.
  CpuIsa cpu_isa = CpuIsa::automatic;        // kernel set (automatic: the best the CPU has)
  int cpu_band = 0;                          // lines per work band (0: 2 forward, 8 backward)
  Switch cpu_strips = Switch::automatic;     // forward in column strips (rank 2)
  CpuPanels cpu_panels = CpuPanels::automatic;  // converted K / V panels in per-thread rings or
                                                // shared
  Switch cpu_acc_rings = Switch::automatic;  // float32 backward: dK / dV accumulated in rings
                                             // (off: per-thread copies of every panel)
};

// Sets one tuning field from text (`key` a field name above; values: automatic / on / off,
// tma / cp_async, plain / warp_specialized, sm80 / sm90 / sm90ws, generic / avx2 / avx512,
// rings / shared, integers, walk digits). An unknown key or value is invalid_argument, naming it.
Status set_tuning(Tuning* t, const std::string& key, const std::string& value);
// Sets the fields of "key=value,key=value" (tuning_string's form) through set_tuning; an entry
// without '=' is invalid_argument naming it. Fields not named keep their values.
Status parse_tuning(const std::string& text, Tuning* t);
// The fields that differ from their defaults, as "key=value" joined by ","; "" for the defaults.
std::string tuning_string(const Tuning& t);
// Every key set_tuning accepts.
std::vector<std::string> tuning_keys();

struct Options {
  Backend backend = Backend::automatic;
  Device device = Device::cpu;   // where every pointer of the call lives
  int device_index = 0;          // CUDA device ordinal
  void* stream = nullptr;        // cudaStream_t; null = the legacy default stream
  double scale = -1.0;           // attention scale; <= 0 means 1 / sqrt(D)
  int num_threads = 0;           // CPU backends' threads, in [0, kMaxThreads]; 0 = the process-
                                 // wide count (set_num_threads; default: the cores available)
  // Backward in a fixed accumulation order, bitwise reproducible run to run: CUDA without
  // order-dependent atomics; cpu with a fixed task-to-thread assignment (for one num_threads).
  bool deterministic = false;
  std::string config;            // cuda_fused: explicit tile configuration name; empty = heuristic
  // cuda_fused backward: explicit backward tile configuration (fused_backward_configs); empty =
  // the heuristic. Like `config`, an error with any other backend.
  std::string backward_config;
  // cuda_fused, float32 tensors: plain TF32 tensor-core products (about 1e-3 relative error)
  // instead of the default split-TF32 products (three TF32 MMAs per product, float32-class error).
  bool allow_tf32 = false;
  Tuning tuning;                 // kernel choices the plan would otherwise make (see Tuning)
};

// Relative positional bias (NATTEN 0.17's layout): an optional float32 table
// rpb [H, 2 K_0 - 1 (, 2 K_1 - 1 (, 2 K_2 - 1))] (rank + 1 dims, any strides). The logit of query
// q and grid key k of head h is scale * q.k + rpb[h, i_0 .. i_{r-1}] with
// i_a = (k_a - q_a) / dilation_a + K_a - 1 (the two share a dilation group, so the division is
// exact); additional keys get no bias. Odd and even kernels, stride and causal axes alike.
// Backends reference, cpu (any strides) and cuda-fused (dense tables; not with
// Options::deterministic in the backward, whose d rpb sums end in atomics) take it; cuda-naive
// answers `unsupported`.
struct ForwardArgs {
  TensorRef q, k, v, o;
  TensorRef lse;                 // optional output
  TensorRef add_k, add_v;        // required iff problem.num_additional > 0
  TensorRef rpb;                 // optional (see above)
};

struct BackwardArgs {
  TensorRef q, k, v, o, d_o;
  TensorRef lse;                 // required: produced by forward
  // Optional input [B, L.., H], float32 like lse: the gradient that flows into the forward's LSE
  // (a loss that uses it, e.g. through attention merging). Null = zero. Since d LSE_i / d s_ij =
  // P_ij for the scaled logits s_ij, it adds P_ij * d_lse_i to every dS_ij: every backend runs
  // dS = P (dP - (rowsum(dO * O) - d_lse)).
  TensorRef d_lse;
  TensorRef dq, dk, dv;          // outputs (overwritten, not accumulated)
  TensorRef add_k, add_v;        // required iff problem.num_additional > 0
  TensorRef d_add_k, d_add_v;    // outputs, required iff problem.num_additional > 0
  TensorRef rpb;                 // optional: the forward's bias (ForwardArgs::rpb)
  TensorRef d_rpb;               // output like rpb (float32), required iff rpb is given
};

// Fused attention.
Status forward(const Problem& p, const ForwardArgs& a, const Options& opt);
Status backward(const Problem& p, const BackwardArgs& a, const Options& opt);

// ---- Unfused operators (backends reference, cpu, cuda_naive, cuda_gemm) -----------------------
// `automatic` on CUDA runs cuda_gemm, and cuda_naive where cuda_gemm answers `unsupported`
// (compute capability below 8.0, head dim above 256; docs/unfused.md).
// attn[..., w] for w < W is the logit of the w-th neighbor, neighbors numbered row-major over the
// window box [start_0, start_0 + K_0) x .. (last axis fastest); attn[..., W + n] is the logit of
// additional key n. Slots whose key is not a neighbor (only possible with causal windows near the
// start of an axis) hold -inf in qk's output and are ignored by av. qk does not apply `scale`
// unless Options::scale is given (> 0), matching NATTEN's na*d_qk which returns raw dot products.
// With `rpb` (ForwardArgs::rpb's table, float32 [H, 2 K_0 - 1 ..], any strides) each neighbor
// slot gets its bias entry added after the scale, in float32 (every unfused backend; cuda_gemm
// in its QK kernel: for 16-bit attn its full-tile variant adds it to the product rounded to
// attn's dtype, the others before the one rounding); the additional keys' slots get none and
// empty slots stay -inf. Its gradient is the sum of d_attn over the
// slots of each entry (the Python op computes it; qk_backward takes no bias).
struct QKArgs {
  TensorRef q, k, add_k;         // inputs
  TensorRef attn;                // output [B, *shape, H, W + N_add]
  TensorRef rpb;                 // optional bias table
};
struct QKBackwardArgs {
  TensorRef q, k, add_k, d_attn; // inputs
  TensorRef dq, dk, d_add_k;     // outputs
};
struct AVArgs {
  TensorRef attn, v, add_v;      // inputs
  TensorRef o;                   // output [B, *shape, H, D_v]
};
struct AVBackwardArgs {
  TensorRef attn, v, add_v, d_o; // inputs
  TensorRef d_attn, dv, d_add_v; // outputs
};

Status qk_forward(const Problem& p, const QKArgs& a, const Options& opt);
Status qk_backward(const Problem& p, const QKBackwardArgs& a, const Options& opt);
Status av_forward(const Problem& p, const AVArgs& a, const Options& opt);
Status av_backward(const Problem& p, const AVBackwardArgs& a, const Options& opt);

// ---- Introspection ------------------------------------------------------------------------------
const char* backend_name(Backend b);  // "auto", "reference", "cpu", "cuda-naive", "cuda-fused",
                                      // "cuda-gemm"
Status parse_backend(const std::string& name, Backend* out);
const char* dtype_name(DType t);           // "float32", "float16", "bfloat16"
bool backend_compiled(Backend b);          // is this backend in this build?
bool cuda_available();                     // compiled with CUDA and a device is visible
bool takes_rpb(Backend b);                 // does b's forward / backward take ForwardArgs::rpb?
// Resolve `automatic` for a device; returns the backend that would run.
Backend resolve_backend(Backend requested, Device device);
// Validation alone (what every entry point runs first). Exposed for bindings and tests.
// Sizes are bounded for every backend: batch, heads, heads_kv, dim, dim_v, num_additional and each
// shape[i] at most 2^30 (the kernels hold them in 32-bit ints), kernel_size[i] * dilation[i] <=
// shape[i] (checked without forming the product), and the largest tensor within 2^62 bytes.
Status validate_problem(const Problem& p);
// validate_problem, then the limits of backend `b`'s kernels beyond it: `unsupported`, naming the
// size, its value and the limit (cuda-naive: window + num_additional <= 2^31 - 1, one attention
// row's index is 32-bit; cuda-fused: the product of the dilations <= 2^31 - 1, the dilation
// groups are counted in 32 bits). Every entry point checks the backend that runs the call before
// any kernel runs; needs neither a device nor `b` compiled in, so every backend's limits can be
// checked anywhere. `automatic`: validate_problem alone.
Status validate_backend_limits(const Problem& p, Backend b);

// Names of the cuda_fused tile configurations valid for (rank, dtype, head dim); empty without CUDA.
// fna_fwd_sm80_* run on every sm_80+ device; fna_fwd_sm90_* (wgmma) only on compute capability 9.0.
std::vector<std::string> fused_configs(int rank, DType dtype, int64_t dim);
// Names of the cuda_fused backward tile configurations (Options::backward_config) for (rank,
// dtype, max(D, D_v)); empty without CUDA or above head dim 256.
std::vector<std::string> fused_backward_configs(int rank, DType dtype, int64_t dim);

// What cuda_fused runs for a problem under Options (config, backward_config, allow_tf32,
// deterministic, tuning, device_index): exactly the plan the launch consumes, and how well its
// tiles fit the neighborhoods.
struct FusedPlan {
  // Forward.
  std::string config;              // the configuration (Options::config or the plan's pick)
  std::string family;              // sm80, sm90 (plain wgmma), sm90ws (warp-specialized), box, strip,
                                   // simt (CUDA cores)
  std::string copy;                // copy engine: "tma" or "cp_async"
  bool persistent = false;         // sm90ws: persistent CTAs
  bool spread = false;             // sm90: whole-row copies per warp instruction
  bool wg_skip = false;            // sm90ws: warpgroups visit only their own rows' key tiles
  std::vector<int> q_tile, kv_tile;  // over the problem's axes (box / strip: CTA rows, warp box)
  int warps = 0;                   // per CTA
  int64_t grid = 0;                // CTAs launched
  int64_t smem = 0;                // dynamic shared memory per CTA (bytes)
  std::string tuning;              // Options::tuning as given (tuning_string)
  double visited_tiles = 0;        // (query tile, key/value tile) pairs visited, all heads; where
                                   // the warp-specialized Hopper kernel's warpgroups (64 rows
                                   // each) visit only their own rows' tiles, each counts its share
  double unmasked_fraction = 0;    // of those, tiles wholly inside every query's window (no mask)
  double needed_fraction = 0;      // needed score pairs / score pairs computed (tiling efficiency)
  // The order in which the CTAs take their tiles: the problem's axes, fastest first.
  std::vector<int> walk;
  // With Problem::rpb: where the forward reads the bias table, "shared" (each CTA copies its
  // head's table into shared memory), "tiles" (the warp-specialized forward, and the plain
  // Hopper one at rank 3, copy each key tile's part of the table into shared memory) or
  // "global"; empty without a bias.
  std::string rpb_table;
  // Backward (empty / zero when the fused backward does not take the problem): its configuration
  // name, dK / dV kernel family (sm80, sm90, sm90ws, strip), copy engine of its query tiles (the
  // strip kernel's bands), whether the call is deterministic, the dK / dV kernel's key tile and
  // the query tiles it visits (strip: its key box and 4 x 16-query chunk), the (key tile, query
  // tile) pairs it visits (all heads; strip: its chunks), its needed score pairs / score pairs
  // computed, and its walk.
  std::string backward_config, backward_family, backward_copy;
  bool backward_deterministic = false;
  // The head-dim columns the dK / dV kernel's products cover: the padded head dim (64, 128,
  // 256), or 32 where max(D, D_v) <= 32 on the sm90 kernel with 64-key tiles or the strip one.
  int backward_head_dim = 0;
  std::vector<int> backward_kv_tile, backward_q_tile;
  // Query tiles the dK / dV kernel takes per step: 2 where the sm90 kernel pairs consecutive
  // tiles of its walk (Tuning::bwd_q_pairs), else 1.
  int backward_q_steps = 0;
  // How dQ is made: "atomic" (float32 atomics in the dK / dV kernel, then converted), "kernel"
  // (deterministic: the sm80 dQ kernel), the strip dQ kernel's name and copy engine
  // ("fna_dq_strip_bf16_d64_b2x8_w8 (tma)"; Tuning::bwd_dq_strip), or the Hopper dQ kernel's
  // name ("fna_dq_sm90_bf16_d64_q64_kv64_w4"; Tuning::bwd_dq_sm90).
  std::string backward_dq;
  int64_t backward_grid = 0;       // dK / dV CTAs over the neighborhood
  int64_t backward_smem = 0;       // the most dynamic shared memory one of its kernels takes
  // With Problem::rpb: where the dK / dV kernel sums d rpb, "warps" (a table per warp in shared
  // memory, plain adds), "shared" (one table, shared atomics, only where tuning asks; both
  // flushed per head with one global atomic per entry, or in deterministic calls stored per CTA
  // and summed in a fixed order) or "global" (tables whose per-warp copies do not fit: the warps' sums go straight to
  // d rpb with global atomics); empty without a bias (Tuning::bwd_rpb_sums).
  std::string backward_rpb_sums;
  double backward_visited_tiles = 0;
  double backward_needed_fraction = 0;
  std::vector<int> backward_walk;
};
// Needs a CUDA device (the heuristic reads its shared-memory size); `unsupported` where the fused
// forward would answer so; not_compiled without the fused backend.
Status fused_plan(const Problem& p, const Options& opt, FusedPlan* out);

const char* version();

// ---- CPU threads --------------------------------------------------------------------------------
// The CPU backends run on a persistent thread pool, created on first use and grown when a call
// asks for more threads; the calling thread is one of a call's workers. A call uses
// Options::num_threads threads, or, where that is 0, the process-wide count below (never more
// than its tasks). Concurrent calls from several host threads are safe: while one call holds
// the pool, another starts threads of its own.
constexpr int kMaxThreads = 1024;  // the most threads Options::num_threads / set_num_threads take
// Sets the process-wide thread count for calls with Options::num_threads = 0; 0 restores the
// default, the cores available to the process (its CPU affinity mask on Linux, else
// std::thread::hardware_concurrency). Outside [0, kMaxThreads]: invalid_argument naming it.
Status set_num_threads(int num_threads);
// The thread count a call with Options::num_threads = 0 uses now (set_num_threads's value, or the
// cores available to the process).
int get_num_threads();

}  // namespace fna
