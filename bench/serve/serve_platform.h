// engram-serve's two platforms: `h200` (the stand-in layers at the H200 TP4 floors
// engram-model-step measures) and `gb10` (stretched to a DGX Spark's step times, the cache tier
// at a Spark's budget, the NVMe emulated), with the defaults each runs with, and what of a GB10
// the H200 host cannot emulate, bounded.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace engram::bench::serve {

// The figures a platform is derived from (options of engram-serve).
struct PlatformInputs {
  // h200, as engram-model-step: a decode layer reads its weights once at HBM peak, a prefill
  // layer is bound by its FLOPs at FP8 dense peak (per TP4 rank and layer).
  double layer_weight_gb = 1.69, hbm_tbs = 4.8, layer_active_mparams = 81, fp8_tflops = 989;
  // gb10: a 16-sequence decode step (96 tokens) of 63-71 ms (field reports, TP4 over four
  // Sparks); prefill at --gb10-prefill-tok-s when a measured rate is given, else the FLOPs floor
  // at GB10's FP8 dense peak (NVIDIA's 1 PFLOP FP4 with sparsity: 250 TFLOPS FP8 dense).
  double gb10_decode_step_ms = 67, gb10_fp8_tflops = 250, gb10_prefill_tok_s = 0;
};

struct Platform {
  std::string name;
  // A stand-in layer of T tokens takes max(decode_layer_us, prefill_layer_us_per_token x T).
  double decode_layer_us = 0, prefill_layer_us_per_token = 0;
  double cache_fraction = 0;  // the cache tier's budget, as a fraction of the rank's rows
  uint64_t emulate_read_latency_us = 0, emulate_read_iops = 0;  // engine.emulate_read_*
  std::string methods, loads;                                   // the default run
  double duration_s = 0, warmup_s = 0, drain_s = 0;
  uint32_t prompt_cap = 0, output_cap = 0;
  std::string stand_in;  // where its layer times come from, printed with the results
};

// `h200` or `gb10`; InvalidArgument for another name.
absl::StatusOr<Platform> PlatformNamed(const std::string& name, const PlatformInputs& in);

// The time a stand-in layer of `tokens` tokens is sized to.
double LayerTargetUs(const Platform& p, uint32_t tokens);

// What the H200 host cannot emulate of a GB10: one LPDDR5X memory (273 GB/s) for the CPU, the
// GPU and the page cache. Engram's rows of an iteration cross it at most three times (the
// device or page cache into the row cache, the row cache into the arena, the arena into the
// GPU's buffer): the time those bytes hold the whole bus bounds what contention can add.
double UnifiedMemoryBoundUs(uint64_t rows);

}  // namespace engram::bench::serve
