// engram-serve: what users of a DeepSeek-V4.1 server see (time to first token, time per output
// token, inter-token stutter, output tokens/s) with Engram's rows from each of
// engram-model-step's places, under serving load.
//
// Requests are documents of a real-text token trace (--trace, tools/trace): the prompt is a
// document's prefix and the output its continuation, so the n-gram locality within and across
// requests is the text's. They arrive from N closed-loop clients (cN) or a Poisson process (rX
// requests/s); a continuous-batching scheduler (serve_scheduler.h) forms each iteration from the
// running sequences' decode tokens (1 + k speculative, acceptance drawn per draft) and chunked
// prefill up to a token budget, and the iteration runs as engram-model-step's TP4 rank step
// (bench/model: 40 stand-in layers of measured cost, the Engram layers at the model's sizes, the
// row ids hashed on the GPU at forward entry) captured as a CUDA graph for the smallest bucket
// of tokens that holds it. --platform h200 sizes the stand-ins to the H200 TP4 floors, gb10 to
// a DGX Spark's step times with the cache tier at a Spark's budget and its NVMe emulated.
// Prints per method and load point the requests' figures and the iterations' (Engram's share of
// GPU time, the waits for rows, the slow iterations by cause, engramd's CPU, the SM clock and
// power from NVML); --json writes them for bench/serve/plot_serve.py. --smoke runs the same
// scheduler and figures on a model of the iterations' times, CPU only. Exit status: 0, 1 on a
// failed method or check, 77 without a GPU.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench/common/token_trace.h"
#include "bench/serve/serve_run.h"

namespace engram::bench::serve {
namespace {

constexpr uint32_t kCompressedVocab = 99092;  // DeepSeek-V4.1's

// The documents requests are cut from; a message on stderr and false when the trace is bad.
bool LoadDocuments(const ServeOptions& o, std::vector<std::vector<int32_t>>& docs) {
  if (o.trace.empty()) {
    docs = ZipfDocuments(512, kCompressedVocab, o.requests.seed);
    return true;
  }
  auto t = ReadTrace(o.trace);
  if (!t.ok()) {
    std::fprintf(stderr, "engram-serve: %s\n", std::string(t.status().message()).c_str());
    return false;
  }
  if (t->compressed_vocab > kCompressedVocab) {
    std::fprintf(stderr,
                 "engram-serve: %s: its compressed vocabulary (%u) is larger than "
                 "DeepSeek-V4.1's (%u)\n",
                 o.trace.c_str(), t->compressed_vocab, kCompressedVocab);
    return false;
  }
  docs = std::move(t->docs);
  return true;
}

// The CPU-only run: every load point on iterations of the platform's modelled times (40
// stand-in layers), one method ("modelled"); the figures are the scheduler's, not a GPU's.
int RunModelled(const ServeOptions& o, const Platform& p, RequestSource& requests, Report& report) {
  report = Report(nlohmann::json{{"platform", p.name},
                                 {"device", "none (--smoke: iterations modelled)"},
                                 {"stand_in", p.stand_in}});
  ModelExecutor ex(o.sched.max_num_seqs + 1,
                   [&p](uint32_t bucket) { return 40 * LayerTargetUs(p, bucket); });
  const std::vector<LoadPoint> loads = *ParseLoadPoints(o.loads.empty() ? p.loads : o.loads);
  for (const LoadPoint& load : loads) {
    const LoadRun run = RunLoad(LoadOptions(o, p, load), requests, ex);
    report.Add(Summarize("modelled", load, run, 0, 6, 0));
    if (!report.Write(o.json_out)) {
      std::fprintf(stderr, "engram-serve: cannot write %s\n", o.json_out.c_str());
      return 1;
    }
    if (!run.error.empty()) return 1;
  }
  return 0;
}

// Checks what CLI11 cannot; prints why and returns false when the options do not fit.
bool Validate(ServeOptions& o, const Platform& p) {
  if (o.requests.prompt_cap == 0) o.requests.prompt_cap = p.prompt_cap;
  if (o.requests.output_cap == 0) o.requests.output_cap = p.output_cap;
  const uint64_t decode = uint64_t{o.sched.max_num_seqs} * (1 + o.sched.spec_tokens);
  if (decode > o.sched.max_batched_tokens) {
    std::fprintf(stderr,
                 "engram-serve: --max-batched-tokens %u cannot hold %u sequences' decode "
                 "tokens (%llu)\n",
                 o.sched.max_batched_tokens, o.sched.max_num_seqs,
                 static_cast<unsigned long long>(decode));
    return false;
  }
  if (auto loads = ParseLoadPoints(o.loads.empty() ? p.loads : o.loads); !loads.ok()) {
    std::fprintf(stderr, "engram-serve: %s\n", std::string(loads.status().message()).c_str());
    return false;
  }
  return true;
}

int Main(ServeOptions& o) {
  auto platform = PlatformNamed(o.platform, o.inputs);
  if (!platform.ok()) {
    std::fprintf(stderr, "engram-serve: %s\n", std::string(platform.status().message()).c_str());
    return 2;
  }
  if (o.cache_fraction > 0) platform->cache_fraction = o.cache_fraction;
  std::vector<std::vector<int32_t>> docs;
  if (!Validate(o, *platform) || !LoadDocuments(o, docs)) return 2;
  auto requests = RequestSource::Make(std::move(docs), o.requests);
  if (!requests.ok()) {
    std::fprintf(stderr, "engram-serve: %s\n", std::string(requests.status().message()).c_str());
    return 2;
  }
  Report report(nlohmann::json::object());
  const int rc = o.smoke ? RunModelled(o, *platform, *requests, report)
                         : RunOnGpu(o, *platform, *requests, report);
  if (rc != 77) report.Print(stdout);
  if (rc != 77 && platform->name == "gb10") {
    double bound = 0;
    for (const PointResult& pr : report.points()) bound = std::max(bound, pr.unified_memory_bound);
    std::printf(
        "\nnot emulated here: a GB10's one memory for CPU, GPU and page cache. Engram's\n"
        "rows, crossing it three times, would hold its 273 GB/s for at most %.3f %% of\n"
        "an iteration's time (the largest over the load points).\n",
        100 * bound);
  }
  return rc;
}

}  // namespace
}  // namespace engram::bench::serve

namespace engram::bench::serve {
namespace {

void AddPlatformOptions(CLI::App& app, PlatformInputs& in);

void AddOptions(CLI::App& app, ServeOptions& o) {
  app.add_option("--platform", o.platform,
                 "h200 (the H200 floors) or gb10 (a DGX Spark's step "
                 "times, cache budget and NVMe)")
      ->capture_default_str();
  app.add_option("--trace", o.trace, "Token trace (ENGTRC01, tools/trace); default: Zipf ids")
      ->check(CLI::ExistingFile);
  app.add_option("--dir", o.dir, "Where the synthetic checkpoint and the sockets go")
      ->capture_default_str();
  app.add_option("--json", o.json_out, "Write the results as JSON here");
  app.add_option("--methods", o.methods, "Comma-separated methods (default: the platform's)");
  app.add_option("--loads", o.loads,
                 "Load points: cN (N clients), rX (X requests/s); default "
                 "c1,c4,c16");
  app.add_option("--duration-s", o.duration_s,
                 "Seconds requests are sent per load point "
                 "(default: h200 4, gb10 8)");
  app.add_option("--warmup-s", o.warmup_s,
                 "Requests arriving earlier are not measured "
                 "(default: h200 0.5, gb10 1)");
  app.add_option("--drain-s", o.drain_s,
                 "Longest the requests in flight may finish in after "
                 "that (default: h200 2, gb10 3)");
  app.add_option("--prompt-cap", o.requests.prompt_cap,
                 "Prompt tokens at most (default: h200 "
                 "2048, gb10 1024)");
  app.add_option("--output-cap", o.requests.output_cap,
                 "Output tokens at most (default: h200 "
                 "128, gb10 64)");
  app.add_option("--max-num-seqs", o.sched.max_num_seqs, "Sequences running at once")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  app.add_option("--max-batched-tokens", o.sched.max_batched_tokens,
                 "Tokens an iteration "
                 "carries (vLLM's default)")
      ->capture_default_str()
      ->check(CLI::Range(8u, 32768u));
  app.add_option("--spec-tokens", o.sched.spec_tokens, "Draft tokens verified per decode")
      ->capture_default_str()
      ->check(CLI::Range(0u, 15u));
  app.add_option("--acceptance", o.sched.acceptance, "Probability each draft is accepted")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", o.sched.seed, "Seed of the arrivals and acceptance draws")
      ->capture_default_str();
  app.add_option("--engram-vocab-size", o.engram_vocab_size,
                 "Start of the head-prime search: "
                 "each table gets ~24x this many rows")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1000}, uint64_t{16'000'000}));
  app.add_option("--cache-fraction", o.cache_fraction,
                 "The cache tier's budget as a fraction of the rank's rows (default: h200 0.5, "
                 "gb10 a Spark's 0.085)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--smoke", o.smoke,
               "CPU only: the scheduler and figures on modelled iteration "
               "times");
  AddPlatformOptions(app, o.inputs);
}

// The figures the platforms' stand-in layers are derived from.
void AddPlatformOptions(CLI::App& app, PlatformInputs& in) {
  app.add_option("--layer-weight-gb", in.layer_weight_gb,
                 "h200: weight GB a decode "
                 "layer reads per TP4 rank")
      ->capture_default_str();
  app.add_option("--hbm-tbs", in.hbm_tbs, "h200: HBM peak (TB/s)")->capture_default_str();
  app.add_option("--layer-active-mparams", in.layer_active_mparams,
                 "Active parameters "
                 "(M) per token, layer and TP4 rank")
      ->capture_default_str();
  app.add_option("--fp8-tflops", in.fp8_tflops, "h200: FP8 dense peak")->capture_default_str();
  app.add_option("--gb10-decode-step-ms", in.gb10_decode_step_ms,
                 "gb10: a 16-sequence "
                 "decode step (field: 63-71 ms)")
      ->capture_default_str();
  app.add_option("--gb10-fp8-tflops", in.gb10_fp8_tflops,
                 "gb10: FP8 dense peak of the "
                 "prefill floor")
      ->capture_default_str();
  app.add_option("--gb10-prefill-tok-s", in.gb10_prefill_tok_s,
                 "gb10: a measured "
                 "prefill rate instead of the floor (tokens/s)")
      ->capture_default_str();
}

}  // namespace
}  // namespace engram::bench::serve

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run cut short keeps what it printed
  engram::bench::serve::ServeOptions o;
  CLI::App app{
      "engram-serve: TTFT, TPOT and inter-token stutter of a DeepSeek-V4.1 TP4 rank "
      "under serving load, per place Engram's rows come from"};
  engram::bench::serve::AddOptions(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    return engram::bench::serve::Main(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engram-serve: %s\n", e.what());
    return 1;
  }
}
