// engram-model-step's shared driver: the model's shape, the options, the GPU state of a step, the
// methods' state, and the calls the run is built from. Its pieces (everything but the token
// source, the measurement and the report) are the library engram-serve (bench/serve) links too.
//
// The benchmark is its methods (model_methods.cc: where each reads the Engram rows from) over
// this driver: model_step_bench.cc (options and the run), model_tokens.cc (token ids),
// model_checkpoint.cc (the synthetic tables and the hashers), model_self_check.cc (the kernels
// against the host), model_graph.cc (a step captured in a CUDA graph), model_measure.cc (replays
// timed and checked) and model_report.cc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/common/engramd_process.h"
#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/gpu_hash.h"
#include "engram/gpu_submit.h"
#include "engram/hash.h"
#include "nlohmann/json.hpp"

namespace engram::bench::model_step {

using nlohmann::json;

// DeepSeek-V4.1's shape, one TP4 rank.
constexpr uint32_t kHidden = 5120, kHc = 4, kLayers = 40, kTp = 4, kRank = 1;
constexpr uint32_t kEngramLayers[2] = {1, 14};
constexpr uint32_t kHeadsPerTable = 24, kRowValues = 256, kRowBytes = 264;
constexpr uint32_t kCompressedVocab = 99092, kPadId = 2;
constexpr uint32_t kProjCols = (1 + kHc) * kHidden;  // value + hc keys

// A failed check: the message names what failed.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void CudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Failure(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void EngramCheck(int rc, const char* what) {
  if (rc != 0) {
    throw Failure(std::string(what) + " = " + std::to_string(rc) + ": " + engram_last_error());
  }
}
#define CUDA_CHECK(x) CudaCheck((x), #x)
#define ENGRAM_CHECK(x) EngramCheck((x), #x)

struct Options {
  std::string trace, dir = "/var/tmp/engram-model-step", json_out;
  uint64_t engram_vocab_size = 600'000;  // start of the prime search: tables of ~24x rows
  uint32_t decode_steps = 400, prefill_steps = 30, warmup = 20;
  double zipf_s = 1.0;
  // The stand-in's sizing (per TP4 rank, per layer); see model_step_bench.cc's header comment.
  double layer_weight_gb = 1.69;     // weights a 96-token decode step reads per layer and rank
  double layer_active_mparams = 81;  // active parameters per token per layer and rank
  double hbm_tbs = 4.8, fp8_tflops = 989;
  std::string shapes = "decode,prefill";
  uint64_t seed = 1;
};

// ---- GPU buffers ----

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  Dev() = default;
  explicit Dev(size_t n) : bytes(n) {
    CUDA_CHECK(cudaMalloc(&p, n));
    CUDA_CHECK(cudaMemset(p, 0, n));
  }
  ~Dev() { cudaFree(p); }
  Dev(Dev&& o) noexcept : p(std::exchange(o.p, nullptr)), bytes(std::exchange(o.bytes, 0)) {}
  Dev& operator=(Dev&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(p);
  }
};

template <typename T>
void Upload(const Dev& d, const std::vector<T>& v) {
  CUDA_CHECK(cudaMemcpy(d.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// `n` floats uniform in [lo, hi), the same for the same seed.
std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo, float hi);

// ---- engramd ----

// An engramd child serving the model with both tables in one tier; stopped at destruction.
class Engramd {
 public:
  // `extra` flags go after the tier's (engram-serve's emulated device).
  Engramd(const std::string& model, const std::string& dir, const std::string& tier,
          uint64_t cache_bytes, const std::vector<std::string>& extra = {});
  Engramd(const Engramd&) = delete;
  Engramd& operator=(const Engramd&) = delete;
  const std::string& socket() const { return process_.socket(); }
  // CPU time of all its threads so far (ns), from /proc/PID/task/*/schedstat.
  uint64_t CpuNs() const;
  // A session with `data_bytes` of arena, submitting from the GPU when `device_submit`.
  engram_session* Connect(uint64_t data_bytes, bool device_submit) const;

 private:
  // Both tables in `tier`, requests as large as a prefill; a cache of `cache_bytes` (0: the
  // daemon's default).
  static std::vector<std::string> Flags(const std::string& tier, uint64_t cache_bytes,
                                        const std::vector<std::string>& extra);

  EngramdProcess process_;
};

// ---- The methods' state ----

enum class Lookup { kNone, kTable, kArena, kCache };

struct Method {
  std::string name;
  Lookup lookup = Lookup::kNone;
  const Engramd* daemon = nullptr;  // whose CPU the method's steps cost
  const void* table[2] = {};        // kTable: device-readable rank-range tables
  uint64_t row_begin[2] = {}, rows[2] = {};
  // kArena: a device-submit session, its registered arena, queue, and ids/rows per layer.
  engram_session* session = nullptr;
  engram_gpu_registration* reg = nullptr;
  engram_gpu_queue* queue = nullptr;
  uint64_t* ids[2] = {};
  uint8_t* arena_rows[2] = {};
  // kCache (an arena method too, for the misses): the row cache as a kernel reads it, and where
  // the lookup lists the misses (rows in the arena's ids, output slots and count on the GPU).
  engram_gpu_row_cache cache[2] = {};
  engram_gpu_cache_misses misses[2] = {};
};

// ---- A step on the GPU ----

// The step's timestamps (globaltimer), slot by slot.
enum StampAt : int {
  kStepStart,
  kLookupStart,
  kLookup1End,
  kLookup14End,
  kMix1Start,
  kLayer0End,
  kLayer1End,
  kLayer2End,
  kStepEnd,
  kStamps
};

// One shape's device state shared by its graphs.
struct Shape {
  std::string name;
  uint32_t seqs, per_seq, tokens;
  double target_us = 0, layer_us = 0;  // a real layer's floor; the stand-in's measured time
  uint32_t stand_n = 0;
  Dev tokens_d, starts_d, history_d, x_d, y_d, hidden_d, proj_d, gated_d, normed_d, map_d;
  Shape(std::string n, uint32_t s, uint32_t p) : Shape(std::move(n), s, p, s * p) {}
  // `t` tokens in `s` sequences (engram-serve's buckets: the sequences' lengths change every
  // iteration, the starts uploaded with the tokens); the convolution's span `p` divides t.
  Shape(std::string n, uint32_t s, uint32_t p, uint32_t t)
      : name(std::move(n)),
        seqs(s),
        per_seq(p),
        tokens(t),
        tokens_d(tokens * 4),
        starts_d((s + 1) * 4),
        history_d(s * 3 * 4),
        x_d(size_t{tokens} * kHidden * 2),
        hidden_d(size_t{tokens} * kHc * kHidden * 2),
        proj_d(size_t{tokens} * kProjCols * 2),
        gated_d(size_t{tokens} * kHc * kHidden * 2),
        normed_d(size_t{tokens} * kHc * kHidden * 2),
        map_d(size_t{tokens} * 6 * 4) {}
};

// Model weights shared by all graphs.
struct Weights {
  Dev stand, kv[2], key_norm, query_norm, conv_norm, conv_w;
};

// A method's captured step for one shape.
struct Graph {
  cudaGraphExec_t exec = nullptr;
  Dev stamps{kStamps * 8};
  Dev mem[2], ids[2], bad{4};
  ~Graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

struct Streams {
  cudaStream_t main, side;
  cudaEvent_t fork, ready[2];
};

struct HashCtx {
  engram_hasher* host = nullptr;
  engram_gpu_hasher* gpu = nullptr;
  uint32_t head_begin = 0, head_end = 0;
  uint32_t heads() const { return head_end - head_begin; }
};

// ---- The synthetic checkpoint (model_checkpoint.cc) ----

// The 24 head primes of each table: consecutive primes from engram_vocab_size, in layer order.
std::vector<std::vector<uint64_t>> HeadPrimes(uint64_t start);

// A checkpoint engramd serves and the hasher reads: tables of exactly the rows the primes
// imply, the DeepSeek-V4.1 compressed vocabulary and pad id. Reused when it is already there.
std::string MakeModel(const Options& o, const std::vector<std::vector<uint64_t>>& primes);

// The hashers, and the rank's row range of each table (its heads' sub-tables).
struct Hashing {
  HashCtx h;
  uint64_t rank_begin[2] = {}, rank_rows[2] = {};
  Hashing(const std::string& model, const std::vector<std::vector<uint64_t>>& primes);
  ~Hashing();
};

// ---- The self-check (model_self_check.cc): a Failure when a kernel is wrong ----

void CheckGemm(cudaStream_t stream);
void CheckMixer(cudaStream_t stream);

// ---- The step (model_graph.cc) ----

// The main stream (low priority) and the lookup's side stream (high priority), with the events
// that fork the lookup off and join each layer's rows back.
Streams MakeStreams();

// The shapes --shapes names, each with its real layer's floor time.
std::vector<std::unique_ptr<Shape>> MakeShapes(const Options& o);

// Sizes each shape's stand-in GEMM to its target time: a calibration GEMM first, then once
// more at the chosen width (several waves of blocks run faster per column than one). Each
// shape's output holds its own width (and half again for the second sizing), not the widest's.
void SizeStandIns(std::vector<std::unique_ptr<Shape>>& shapes, Weights& w, cudaStream_t stream);

// The Engram layers' weights, and each shape's fixed inputs (sequence starts, slot map, hidden).
void MakeEngramInputs(std::vector<std::unique_ptr<Shape>>& shapes, Weights& w, uint32_t heads,
                      cudaStream_t stream);

// Captures the method's whole step for the shape into `g`.
void Capture(const Method& m, const HashCtx& h, const Shape& s, const Weights& w, Graph& g,
             const Streams& st);

// ---- The methods (model_methods.cc) ----

// Both resident tables mapped read-only from engramd (waiting while it loads them).
struct ResidentMaps {
  engram_session* session = nullptr;
  engram_table_map* maps[2] = {};
  engram_table_map_info info[2] = {};
  ResidentMaps(const Engramd& d, const Hashing& hs);
  ~ResidentMaps();
  uint64_t Rows(int l) const { return info[l].covered_end - info[l].covered_begin; }
};

// The table methods' memory: the rank's rows in GPU memory and in pinned host memory, and
// engramd's mappings registered; methods[1..3] read them.
struct TableCopies {
  Dev gpu[2];
  void* pinned[2] = {};
  engram_gpu_registration* reg[2] = {};
  TableCopies(const ResidentMaps& rm, const Hashing& hs, std::vector<Method>& methods);
  ~TableCopies();
};

// An arena method: a device-submit session of `d`, its arena registered, row ids and rows of
// max_rows per layer, a GPU queue; torn down by TearDownArena.
void SetUpArena(Method& m, const Engramd* d, uint32_t max_rows);
void TearDownArena(Method& m);

// The cache-inplace method's row cache: mapped (from a host session of the cache-tier engramd:
// the method's own session submits from the GPU), registered, and the misses' device lists.
struct CacheInPlace {
  engram_session* session = nullptr;
  engram_table_map* maps[2] = {};
  engram_gpu_registration* reg[2] = {};
  Dev slots[2], count[2];
  CacheInPlace(const Engramd& d, Method& m, uint32_t max_rows);
  ~CacheInPlace();
};

// The eight methods by name, in the order of the report; no engram and gpu memory first (the
// baselines every ratio needs).
std::vector<Method> NamedMethods();

// ---- One shape measured (model_measure.cc) and reported (model_report.cc) ----

struct Sample {
  std::vector<double> wall_us, span_us, launch_cpu_us, daemon_cpu_us;
  std::vector<std::vector<double>> stamps_us;  // per stamp, relative to step start
  Sample() : stamps_us(kStamps) {}
};

struct ShapeRun {
  std::vector<std::unique_ptr<Graph>> graphs;
  std::vector<std::string> broken;  // why a method stopped, if it did
  std::vector<Sample> samples;
};

class TokenSource;  // model_tokens.h

// Captures, measures, checks and reports one shape; adds it to `out`. Returns 1 on a failure.
int RunShape(const Options& o, TokenSource& source, Shape& s, const std::vector<Method>& methods,
             const Hashing& hs, const Weights& w, const Streams& st, json& out);

// The per-method table (printed) and its JSON.
json ReportMethods(const std::vector<Method>& methods, const ShapeRun& run);

// The median timeline of a step of each method, printed.
void PrintTimelines(const std::vector<Method>& methods, const ShapeRun& run);

// The run's header: device, tokens, the rank's rows, the cache budget (printed and as JSON).
json Describe(const Options& o, const cudaDeviceProp& prop, const TokenSource& source,
              const Hashing& hs, const ResidentMaps& rm, uint64_t cache_bytes);

}  // namespace engram::bench::model_step
