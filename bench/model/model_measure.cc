// engram-model-step's measurement of one shape: every method's step captured, replayed
// round-robin on the same token ids with its wall time, CPU and GPU timestamps taken, and the
// rows each method produced checked against the GPU-memory copy's.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/clocks.h"
#include "bench/model/model_step.h"
#include "bench/model/model_tokens.h"
#include "engram/gpu_submit.h"

namespace engram::bench::model_step {
namespace {

void CaptureAll(const std::vector<Method>& methods, const HashCtx& h, const Shape& s,
                const Weights& w, const Streams& st, ShapeRun& run) {
  run.broken.assign(methods.size(), "");
  run.samples.assign(methods.size(), Sample());
  for (size_t mi = 0; mi < methods.size(); ++mi) {
    run.graphs.push_back(std::make_unique<Graph>());
    try {
      Capture(methods[mi], h, s, w, *run.graphs.back(), st);
    } catch (const Failure& e) {
      if (mi <= 1) throw;  // the baselines every ratio needs
      run.broken[mi] = std::string("capture: ") + e.what();
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(st.main, &partial);
      if (partial != nullptr) cudaGraphDestroy(partial);
      cudaGetLastError();
    }
  }
}

// One replay of a method's step: wall time, the launch's CPU, engramd's CPU, the stamps.
void TimeStep(const Method& m, const Graph& g, const Streams& st, bool keep, uint32_t step,
              Sample& sm, std::string& broken) {
  const uint64_t d0 = m.daemon != nullptr ? m.daemon->CpuNs() : 0;
  const double c0 = ThreadCpuNs() / 1e3;
  const uint64_t t0 = NowNs();
  CUDA_CHECK(cudaGraphLaunch(g.exec, st.main));
  const double c1 = ThreadCpuNs() / 1e3;
  CUDA_CHECK(cudaStreamSynchronize(st.main));
  const uint64_t t1 = NowNs();
  const uint64_t d1 = m.daemon != nullptr ? m.daemon->CpuNs() : 0;
  if (m.queue != nullptr && *engram_gpu_queue_error(m.queue) != 0) {
    // Reported and left out from here on; the other methods go on.
    broken = "the GPU queue reported error " + std::to_string(*engram_gpu_queue_error(m.queue)) +
             " at step " + std::to_string(step);
    return;
  }
  if (!keep) return;
  uint64_t stamps[kStamps];
  CUDA_CHECK(cudaMemcpy(stamps, g.stamps.p, sizeof(stamps), cudaMemcpyDeviceToHost));
  sm.wall_us.push_back((t1 - t0) / 1e3);
  sm.span_us.push_back((stamps[kStepEnd] - stamps[kStepStart]) / 1e3);
  sm.launch_cpu_us.push_back(c1 - c0);
  sm.daemon_cpu_us.push_back((d1 - d0) / 1e3);
  for (int k = 0; k < kStamps; ++k) {
    sm.stamps_us[k].push_back((double(stamps[k]) - double(stamps[kStepStart])) / 1e3);
  }
}

// Every step's tokens once, then each method's replay of them in turn (which goes first rotates).
void MeasureShape(const Options& o, TokenSource& source, Shape& s,
                  const std::vector<Method>& methods, const Streams& st, ShapeRun& run) {
  const uint32_t steps = s.name == "decode" ? o.decode_steps : o.prefill_steps;
  for (uint32_t i = 0; i < steps + o.warmup; ++i) {
    const StepTokens t =
        s.name == "decode" ? source.Decode(s.seqs, s.per_seq) : source.Prefill(s.tokens);
    Upload(s.tokens_d, t.tokens);
    Upload(s.history_d, t.history);
    for (size_t k = 0; k < methods.size(); ++k) {
      const size_t mi = (i + k) % methods.size();
      if (!run.broken[mi].empty()) continue;
      TimeStep(methods[mi], *run.graphs[mi], st, i >= o.warmup, i, run.samples[mi], run.broken[mi]);
    }
  }
}

// Every method's rows of the last step equal the GPU-memory copy's, bit for bit; 1 if not, or
// if a method failed.
int CheckRows(const std::vector<Method>& methods, const ShapeRun& run) {
  int failed = 0;
  std::vector<uint8_t> want[2];
  for (int l = 0; l < 2; ++l) {
    want[l].resize(run.graphs[1]->mem[l].bytes);
    CUDA_CHECK(cudaMemcpy(want[l].data(), run.graphs[1]->mem[l].p, want[l].size(),
                          cudaMemcpyDeviceToHost));
  }
  for (size_t mi = 2; mi < methods.size(); ++mi) {
    if (!run.broken[mi].empty()) {
      std::printf("FAILED: %s: %s\n", methods[mi].name.c_str(), run.broken[mi].c_str());
      failed = 1;
      continue;
    }
    uint32_t bad = 0;
    CUDA_CHECK(cudaMemcpy(&bad, run.graphs[mi]->bad.p, 4, cudaMemcpyDeviceToHost));
    for (int l = 0; l < 2; ++l) {
      std::vector<uint8_t> got(want[l].size());
      CUDA_CHECK(
          cudaMemcpy(got.data(), run.graphs[mi]->mem[l].p, got.size(), cudaMemcpyDeviceToHost));
      if (got != want[l] || bad != 0) {
        std::printf(
            "CHECK FAILED: %s's layer-%u rows differ from the GPU-memory copy's (%u bad "
            "row ids)\n",
            methods[mi].name.c_str(), kEngramLayers[l], bad);
        failed = 1;
      }
    }
  }
  return failed;
}

}  // namespace

int RunShape(const Options& o, TokenSource& source, Shape& s, const std::vector<Method>& methods,
             const Hashing& hs, const Weights& w, const Streams& st, json& out) {
  std::printf(
      "\n== %s: %u tokens (%u x %u), %u rows per layer for the rank; stand-in layer: GEMM %u x "
      "%u x %u, %.1f us measured (floor of a real layer: %.1f us)\n",
      s.name.c_str(), s.tokens, s.seqs, s.per_seq, s.tokens * hs.h.heads(), s.tokens, kHidden,
      s.stand_n, s.layer_us, s.target_us);
  ShapeRun run;
  CaptureAll(methods, hs.h, s, w, st, run);
  MeasureShape(o, source, s, methods, st, run);
  const int failed = CheckRows(methods, run);
  json jm = ReportMethods(methods, run);
  PrintTimelines(methods, run);
  out["shapes"].push_back({{"name", s.name},
                           {"tokens", s.tokens},
                           {"seqs", s.seqs},
                           {"per_seq", s.per_seq},
                           {"rows_per_layer", s.tokens * hs.h.heads()},
                           {"stand_in_n", s.stand_n},
                           {"stand_in_us", s.layer_us},
                           {"layer_floor_us", s.target_us},
                           {"methods", jm}});
  if (!o.json_out.empty()) {  // after each shape: a run cut short keeps what it measured
    std::ofstream f(o.json_out, std::ios::trunc);
    f << out.dump(1) << "\n";
    if (!f) throw Failure("cannot write " + o.json_out);
  }
  return failed;
}

}  // namespace engram::bench::model_step
