// engram-model-step: what Engram offload costs a whole DeepSeek-V4.1 step on the GPU, end to end.
//
// One TP4 rank (rank 1: heads [6, 12) of each table) runs a 40-layer step captured in a CUDA
// graph, for a decode step (16 sequences x (1 + 5 speculative tokens) = 96 tokens) and a prefill
// chunk (8,192 tokens of one sequence):
//   - Engram layers 1 and 14: the full data path at the model's sizes. The step's row ids are
//     hashed on the GPU at forward entry (engram_gpu_hash_layers) on a high-priority side stream,
//     the rows gathered and dequantised (the method below), and at the layer the main stream
//     waits for them, projects the rank's memory (6 heads x 256 values) to the value and hc_mult
//     = 4 keys (one GEMM, hidden 5120) and runs the gate and the short convolution
//     (python/examples/engram_layer.py's EngramMixer).
//   - every layer (0..39): a stand-in of measured cost, one bf16 tensor-core GEMM of the step's
//     tokens x 5120 by 5120 x N, N chosen at start-up so that the GEMM takes the time a real
//     layer takes at TP4 on this GPU: a decode layer reads its weights once (the model's
//     per-rank weight bytes at HBM peak), a prefill layer is bound by its FLOPs (per-rank active
//     parameters x 2 x tokens at FP8 dense peak). Both floors are shorter than a real layer, so
//     the overheads printed are upper bounds.
// Methods, run round-robin with the same token ids every step:
//   no engram        the stand-ins alone (what Engram's share is measured against)
//   gpu memory       the rank's tables copied to GPU memory, read by engram_dequant_gather
//   pinned host      a per-process pinned host copy, read by the GPU over PCIe (zero-copy)
//   resident inplace engramd's resident tables mapped read-only (engram_table_map_open),
//                    registered, read in place by the GPU: no request
//   resident arena   engramd resident tier through the session's arena: GPU-submitted requests
//                    (engram_gpu_queue_gather_dequant)
//   cache half       engramd cache tier with a cache of half the rank's rows, through the arena
//   storage          engramd storage tier (buffered reads of the table files), through the arena
//   cache inplace    the same cache tier, its row cache mapped read-only and registered: the GPU
//                    reads the hits in place and only the misses go to engramd, from the GPU
//                    (engram_gpu_queue_cache_gather)
// Token ids: --trace FILE (the ENGTRC01 files engram-trace-replay reads; real text through
// tools/trace) or synthetic Zipf ids. Tables are synthetic (random FP8 rows) with the
// DeepSeek-V4.1 hash and compressed vocabulary but smaller primes (--engram-vocab-size), so the
// tables fit a benchmark; the layout and the row size are the model's.
// Prints per method the step's wall time p50/p99, Engram's share, the overhead against GPU
// memory, the host CPU per step (launch + engramd) and the timeline of one step; --json writes
// the same for bench/model/plot_model_step.py. Exit status: 0, 1 on a failed check, 77 without
// a GPU.
//
// This file is the driver's entry: the options and the run; model_step.h says where the rest of
// the driver and the methods are.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "base/clock.h"
#include "bench/model/model_step.h"
#include "bench/model/model_tokens.h"

namespace engram::bench::model_step {
namespace {

// Seconds since `since_ns` (NowNs).
double Seconds(uint64_t since_ns) { return (NowNs() - since_ns) / 1e9; }

int Run(const Options& o) {
  TokenSource source(o);  // a bad trace is refused on any machine, before the GPU is looked for
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const Streams st = MakeStreams();
  CheckGemm(st.main);
  CheckMixer(st.main);
  std::printf("self-check of the GEMM and the Engram mixer against the host: ok\n");

  std::filesystem::create_directories(o.dir);
  const auto primes = HeadPrimes(o.engram_vocab_size);
  const uint64_t t_model = NowNs();
  const std::string model = MakeModel(o, primes);
  std::printf("synthetic checkpoint %s (%.1f s)\n", model.c_str(), Seconds(t_model));
  const Hashing hs(model, primes);
  auto shapes = MakeShapes(o);
  Weights w;
  SizeStandIns(shapes, w, st.main);
  MakeEngramInputs(shapes, w, hs.h.heads(), st.main);

  // engramd: the resident tier (in place and through the arena), the cache tier at half the
  // rank's rows, the storage tier.
  const uint64_t cache_bytes = (hs.rank_rows[0] + hs.rank_rows[1]) / 2 * kRowBytes;
  const uint64_t t_daemons = NowNs();
  Engramd resident(model, o.dir, "resident", 0), cache(model, o.dir, "cache", cache_bytes),
      storage(model, o.dir, "storage", 0);
  const ResidentMaps rm(resident, hs);
  std::printf("engramd x3 started, resident tables mapped (%.1f s)\n", Seconds(t_daemons));
  std::vector<Method> methods = NamedMethods();
  const TableCopies copies(rm, hs, methods);
  methods[3].daemon = &resident;
  uint32_t max_rows = 0;
  for (auto& s : shapes) max_rows = std::max(max_rows, s->tokens * hs.h.heads());
  struct Arenas {  // the arena methods' sessions, closed however Run is left
    std::vector<Method>& m;
    ~Arenas() {
      for (auto& x : m) TearDownArena(x);
    }
  } arenas{methods};
  const Engramd* arena_daemons[3] = {&resident, &cache, &storage};
  for (int i = 0; i < 3; ++i) SetUpArena(methods[4 + i], arena_daemons[i], max_rows);
  SetUpArena(methods[7], &cache, max_rows);
  const CacheInPlace cache_maps(cache, methods[7], max_rows);

  json out = Describe(o, prop, source, hs, rm, cache_bytes);
  int failed = 0;
  for (auto& s : shapes) failed |= RunShape(o, source, *s, methods, hs, w, st, out);
  return failed;
}

}  // namespace

}  // namespace engram::bench::model_step

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run cut short keeps what it printed
  engram::bench::model_step::Options o;
  CLI::App app{
      "engram-model-step: a DeepSeek-V4.1-shaped step on the GPU with Engram's rows "
      "from GPU memory, a pinned host copy and engramd's tiers"};
  app.add_option("--trace", o.trace, "Token trace (ENGTRC01, tools/trace); default: Zipf ids")
      ->check(CLI::ExistingFile);
  app.add_option("--dir", o.dir, "Where the synthetic checkpoint and the sockets go")
      ->capture_default_str();
  app.add_option("--json", o.json_out, "Write the results as JSON here");
  app.add_option("--engram-vocab-size", o.engram_vocab_size,
                 "Start of the head-prime search: each table gets ~24x this many rows")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1000}, uint64_t{16'000'000}));
  app.add_option("--decode-steps", o.decode_steps, "Measured decode steps per method")
      ->capture_default_str()
      ->check(CLI::Range(10u, 100000u));
  app.add_option("--prefill-steps", o.prefill_steps, "Measured prefill chunks per method")
      ->capture_default_str()
      ->check(CLI::Range(5u, 100000u));
  app.add_option("--warmup", o.warmup, "Unmeasured steps first")->capture_default_str();
  app.add_option("--zipf", o.zipf_s, "Zipf exponent of the synthetic ids")->capture_default_str();
  app.add_option("--shapes", o.shapes, "decode, prefill or both")->capture_default_str();
  app.add_option("--layer-weight-gb", o.layer_weight_gb,
                 "Decode stand-in: weight GB a layer reads per TP4 rank")
      ->capture_default_str();
  app.add_option("--layer-active-mparams", o.layer_active_mparams,
                 "Prefill stand-in: active parameters (M) per token, layer and TP4 rank")
      ->capture_default_str();
  app.add_option("--hbm-tbs", o.hbm_tbs, "HBM peak (TB/s) a decode layer's floor is taken at")
      ->capture_default_str();
  app.add_option("--fp8-tflops", o.fp8_tflops, "FP8 dense peak a prefill layer's floor is taken at")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the synthetic ids")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return engram::bench::model_step::Run(o);
  } catch (const engram::bench::model_step::Failure& e) {
    std::fprintf(stderr, "engram-model-step: %s\n", e.what());
    return 1;
  }
}
