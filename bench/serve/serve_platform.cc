// engram-serve's platforms (serve_platform.h).
#include "bench/serve/serve_platform.h"

#include <algorithm>
#include <cstdio>

namespace engram::bench::serve {
namespace {

constexpr double kLayers = 40;
constexpr double kRowBytes = 264;
constexpr double kGb10MemoryGbs = 273;

}  // namespace

absl::StatusOr<Platform> PlatformNamed(const std::string& name, const PlatformInputs& in) {
  Platform p;
  p.name = name;
  char buf[256];
  if (name == "h200") {
    p.decode_layer_us = in.layer_weight_gb * 1e9 / (in.hbm_tbs * 1e12) * 1e6;
    p.prefill_layer_us_per_token = 2 * in.layer_active_mparams * 1e6 / (in.fp8_tflops * 1e12) * 1e6;
    p.cache_fraction = 0.5;  // half the rank's rows, as engram-model-step's cache half
    p.methods =
        "no engram,gpu memory,pinned host,resident inplace,resident arena,cache arena,storage,"
        "cache inplace";
    p.loads = "c1,c4,c16";
    p.duration_s = 4, p.warmup_s = 0.5, p.drain_s = 2;
    p.prompt_cap = 2048, p.output_cap = 128;
    std::snprintf(buf, sizeof(buf),
                  "H200 TP4 floors: decode %.1f GB a layer at %.1f TB/s, prefill %.0f M active "
                  "parameters a token at %.0f TFLOPS",
                  in.layer_weight_gb, in.hbm_tbs, in.layer_active_mparams, in.fp8_tflops);
  } else if (name == "gb10") {
    p.decode_layer_us = in.gb10_decode_step_ms * 1e3 / kLayers;
    p.prefill_layer_us_per_token =
        in.gb10_prefill_tok_s > 0
            ? 1e6 / (in.gb10_prefill_tok_s * kLayers)
            : 2 * in.layer_active_mparams * 1e6 / (in.gb10_fp8_tflops * 1e12) * 1e6;
    // A Spark's row store: 2 GiB a layer per rank (field report, TP4) of a rank's 47.2 GiB.
    p.cache_fraction = 4.0 / 47.2;
    // The Spark's NVMe: ~3.5k random 4 KiB reads/s at depth 1 (286 us each), ~112k at depth 64.
    p.emulate_read_latency_us = 286, p.emulate_read_iops = 112'000;
    p.methods = "no engram,gpu memory,cache arena,cache inplace";
    p.loads = "c1,c4,c16";
    p.duration_s = 8, p.warmup_s = 1, p.drain_s = 3;
    p.prompt_cap = 1024, p.output_cap = 64;
    if (in.gb10_prefill_tok_s > 0) {
      std::snprintf(buf, sizeof(buf),
                    "GB10: decode step %.0f ms (16 x 6 tokens), prefill %.0f tok/s",
                    in.gb10_decode_step_ms, in.gb10_prefill_tok_s);
    } else {
      std::snprintf(buf, sizeof(buf),
                    "GB10: decode step %.0f ms (16 x 6 tokens), prefill at the FLOPs floor "
                    "(%.0f TFLOPS FP8: a lower bound, no measured rate given)",
                    in.gb10_decode_step_ms, in.gb10_fp8_tflops);
    }
  } else {
    return absl::InvalidArgumentError("--platform: '" + name + "' is neither h200 nor gb10");
  }
  p.stand_in = buf;
  return p;
}

double LayerTargetUs(const Platform& p, uint32_t tokens) {
  return std::max(p.decode_layer_us, p.prefill_layer_us_per_token * tokens);
}

double UnifiedMemoryBoundUs(uint64_t rows) {
  return 3 * kRowBytes * static_cast<double>(rows) / (kGb10MemoryGbs * 1e9) * 1e6;
}

}  // namespace engram::bench::serve
