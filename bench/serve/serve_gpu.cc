// engram-serve on the GPU: engram-model-step's DeepSeek-V4.1-shaped TP4 rank (bench/model's
// library: stand-in layers, the Engram layers at the model's sizes, every method), captured as
// one CUDA graph per bucket of tokens and method, serving the scheduler's iterations.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "bench/common/clocks.h"
#include "bench/model/model_step.h"
#include "bench/serve/serve_driver.h"
#include "bench/serve/serve_nvml.h"
#include "bench/serve/serve_run.h"

namespace engram::bench::serve {

namespace ms = engram::bench::model_step;

namespace {

// The methods by name: engram-model-step's, its cache half at the platform's budget.
enum MethodIndex {
  kNoEngram,
  kGpuMemory,
  kResidentArena = 4,
  kCacheArena,
  kStorage,
  kCacheInPlace
};

// Everything the methods' graphs read: the rank's hashing, the buckets' shapes and weights, the
// daemons and the methods' state; torn down in the reverse order.
struct Rank {
  ms::Streams st;
  std::unique_ptr<ms::Hashing> hs;
  std::vector<std::unique_ptr<ms::Shape>> shapes;  // one a bucket, ascending
  ms::Weights w;
  std::unique_ptr<ms::Engramd> resident, cache, storage;
  std::unique_ptr<ms::ResidentMaps> rm;
  std::vector<ms::Method> methods;
  std::unique_ptr<ms::TableCopies> copies;
  std::unique_ptr<ms::CacheInPlace> cache_maps;
  uint64_t cache_bytes = 0;
  ~Rank() {
    cache_maps.reset();
    for (auto& m : methods) ms::TearDownArena(m);
  }
};

bool Wanted(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The shapes of the buckets, their stand-ins sized to the platform's layer times.
void MakeBuckets(const ServeOptions& o, const Platform& p, Rank& r) {
  const uint32_t seqs = o.sched.max_num_seqs + 1;  // and the padding sequence
  for (uint32_t t : Buckets(o.sched.max_batched_tokens)) {
    r.shapes.push_back(std::make_unique<ms::Shape>("b" + std::to_string(t), seqs, t, t));
    r.shapes.back()->target_us = LayerTargetUs(p, t);
  }
  ms::SizeStandIns(r.shapes, r.w, r.st.main);
  ms::MakeEngramInputs(r.shapes, r.w, r.hs->h.heads(), r.st.main);
}

// The daemons the wanted methods read from, and each method's state.
void SetUpMethods(const Platform& p, const std::string& model, const std::string& dir,
                  const std::vector<std::string>& wanted, Rank& r) {
  r.methods = ms::NamedMethods();
  r.methods[kCacheArena].name = "cache arena";
  uint32_t max_rows = 0;
  for (auto& s : r.shapes) max_rows = std::max(max_rows, s->tokens * r.hs->h.heads());
  r.resident = std::make_unique<ms::Engramd>(model, dir, "resident", 0);
  r.rm = std::make_unique<ms::ResidentMaps>(*r.resident, *r.hs);
  r.copies = std::make_unique<ms::TableCopies>(*r.rm, *r.hs, r.methods);
  r.methods[3].daemon = r.resident.get();
  if (Wanted(wanted, r.methods[kResidentArena].name)) {
    ms::SetUpArena(r.methods[kResidentArena], r.resident.get(), max_rows);
  }
  const bool cache_arena = Wanted(wanted, r.methods[kCacheArena].name);
  const bool cache_inplace = Wanted(wanted, r.methods[kCacheInPlace].name);
  if (cache_arena || cache_inplace) {
    r.cache_bytes =
        static_cast<uint64_t>(p.cache_fraction * (r.hs->rank_rows[0] + r.hs->rank_rows[1])) *
        ms::kRowBytes;
    std::vector<std::string> extra;
    if (p.emulate_read_latency_us != 0 || p.emulate_read_iops != 0) {
      extra = {"--emulate-read-latency-us", std::to_string(p.emulate_read_latency_us),
               "--emulate-read-iops", std::to_string(p.emulate_read_iops)};
    }
    r.cache = std::make_unique<ms::Engramd>(model, dir, "cache", r.cache_bytes, extra);
    if (cache_arena) ms::SetUpArena(r.methods[kCacheArena], r.cache.get(), max_rows);
    if (cache_inplace) {
      ms::SetUpArena(r.methods[kCacheInPlace], r.cache.get(), max_rows);
      r.cache_maps =
          std::make_unique<ms::CacheInPlace>(*r.cache, r.methods[kCacheInPlace], max_rows);
    }
  }
  if (Wanted(wanted, r.methods[kStorage].name)) {
    r.storage = std::make_unique<ms::Engramd>(model, dir, "storage", 0);
    ms::SetUpArena(r.methods[kStorage], r.storage.get(), max_rows);
  }
}

// One method's graphs, a bucket each; empty with `why` set when a capture failed.
std::vector<std::unique_ptr<ms::Graph>> CaptureMethod(const ms::Method& m, Rank& r,
                                                      std::string& why) {
  std::vector<std::unique_ptr<ms::Graph>> graphs;
  for (auto& s : r.shapes) {
    graphs.push_back(std::make_unique<ms::Graph>());
    try {
      ms::Capture(m, r.hs->h, *s, r.w, *graphs.back(), r.st);
    } catch (const ms::Failure& e) {
      why = "capture of " + s->name + ": " + e.what();
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(r.st.main, &partial);
      if (partial != nullptr) cudaGraphDestroy(partial);
      cudaGetLastError();
      graphs.clear();
      break;
    }
  }
  return graphs;
}

// Iterations on the GPU: the bucket's graph of one method replayed on the iteration's ids.
class GpuExecutor : public Executor {
 public:
  GpuExecutor(const ms::Method& m, std::vector<std::unique_ptr<ms::Graph>>& graphs, Rank& r,
              const std::vector<double>& base_us, const GpuSampler* sampler)
      : m_(m), graphs_(graphs), r_(r), base_us_(base_us), sampler_(sampler) {}
  uint64_t Now() override { return NowNs(); }
  void WaitUntil(uint64_t ns) override { SleepUntil(ns); }
  uint32_t Seqs() const override { return r_.shapes.front()->seqs; }
  std::string Run(const Iteration& it, const Batch& b, IterationRecord& rec) override;
  // Replays the last iteration's bucket on `other`'s graph; the rows both produced equal.
  std::string CheckAgainst(GpuExecutor& other);

 private:
  size_t Index(uint32_t bucket) const {
    size_t i = 0;
    while (r_.shapes[i]->tokens != bucket) ++i;
    return i;
  }
  uint32_t Misses() const;

  const ms::Method& m_;
  std::vector<std::unique_ptr<ms::Graph>>& graphs_;
  Rank& r_;
  const std::vector<double>& base_us_;
  const GpuSampler* sampler_;
  Iteration last_it_;
  Batch last_batch_;
};

uint32_t GpuExecutor::Misses() const {
  if (m_.lookup != ms::Lookup::kCache) return 0;
  uint32_t total = 0;
  for (int l = 0; l < 2; ++l) {
    uint32_t n = 0;
    ms::CudaCheck(cudaMemcpy(&n, m_.misses[l].count, 4, cudaMemcpyDeviceToHost), "misses");
    total += n;
  }
  return total;
}

std::string GpuExecutor::Run(const Iteration& it, const Batch& b, IterationRecord& rec) {
  const size_t i = Index(it.bucket);
  ms::Shape& s = *r_.shapes[i];
  const ms::Graph& g = *graphs_[i];
  ms::Upload(s.tokens_d, b.tokens);
  ms::Upload(s.starts_d, b.starts);
  ms::Upload(s.history_d, b.history);
  const uint64_t c0 = ThreadCpuNs(), t0 = NowNs();
  ms::CudaCheck(cudaGraphLaunch(g.exec, r_.st.main), "cudaGraphLaunch");
  const uint64_t c1 = ThreadCpuNs();
  ms::CudaCheck(cudaStreamSynchronize(r_.st.main), "cudaStreamSynchronize");
  const uint64_t t1 = NowNs();
  if (m_.queue != nullptr && *engram_gpu_queue_error(m_.queue) != 0) {
    return "the GPU queue reported error " + std::to_string(*engram_gpu_queue_error(m_.queue));
  }
  uint64_t stamps[ms::kStamps];
  ms::CudaCheck(cudaMemcpy(stamps, g.stamps.p, sizeof(stamps), cudaMemcpyDeviceToHost), "stamps");
  rec.wall_us = (t1 - t0) / 1e3;
  rec.span_us = (stamps[ms::kStepEnd] - stamps[ms::kStepStart]) / 1e3;
  rec.base_us = base_us_[i];
  rec.launch_cpu_us = (c1 - c0) / 1e3;
  if (m_.lookup != ms::Lookup::kNone && stamps[ms::kMix1Start] > stamps[ms::kLayer0End]) {
    rec.wait_us = (stamps[ms::kMix1Start] - stamps[ms::kLayer0End]) / 1e3;
  }
  rec.misses = Misses();
  if (sampler_ != nullptr) {
    const GpuReading reading = sampler_->Latest();
    rec.sm_mhz = reading.sm_mhz;
    rec.power_w = reading.power_w;
  }
  last_it_ = it;
  last_batch_ = b;
  return "";
}

std::string GpuExecutor::CheckAgainst(GpuExecutor& other) {
  if (last_batch_.tokens.empty() || m_.lookup == ms::Lookup::kNone) return "";
  const size_t i = Index(last_it_.bucket);
  IterationRecord ignored;
  if (std::string e = Run(last_it_, last_batch_, ignored); !e.empty()) return e;
  if (std::string e = other.Run(last_it_, last_batch_, ignored); !e.empty()) return e;
  const ms::Graph& mine = *graphs_[i];
  const ms::Graph& want = *other.graphs_[i];
  uint32_t bad = 0;
  ms::CudaCheck(cudaMemcpy(&bad, mine.bad.p, 4, cudaMemcpyDeviceToHost), "bad rows");
  for (int l = 0; l < 2; ++l) {
    std::vector<uint8_t> a(mine.mem[l].bytes), w(want.mem[l].bytes);
    ms::CudaCheck(cudaMemcpy(a.data(), mine.mem[l].p, a.size(), cudaMemcpyDeviceToHost), "rows");
    ms::CudaCheck(cudaMemcpy(w.data(), want.mem[l].p, w.size(), cudaMemcpyDeviceToHost), "rows");
    if (a != w || bad != 0) {
      return "layer-" + std::to_string(ms::kEngramLayers[l]) +
             " rows differ from the GPU-memory copy's (" + std::to_string(bad) + " bad row ids)";
    }
  }
  return "";
}

// The median span of each bucket's step without Engram (what Engram's share is taken against).
std::vector<double> BaseSpans(std::vector<std::unique_ptr<ms::Graph>>& none, const Rank& r) {
  std::vector<double> base;
  for (auto& g : none) {
    std::vector<double> us;
    for (int k = 0; k < 7; ++k) {
      ms::CudaCheck(cudaGraphLaunch(g->exec, r.st.main), "cudaGraphLaunch");
      ms::CudaCheck(cudaStreamSynchronize(r.st.main), "cudaStreamSynchronize");
      uint64_t stamps[ms::kStamps];
      ms::CudaCheck(cudaMemcpy(stamps, g->stamps.p, sizeof(stamps), cudaMemcpyDeviceToHost),
                    "stamps");
      if (k >= 2) us.push_back((stamps[ms::kStepEnd] - stamps[ms::kStepStart]) / 1e3);
    }
    std::sort(us.begin(), us.end());
    base.push_back(us[us.size() / 2]);
  }
  return base;
}

std::vector<std::string> SplitNames(const std::string& list) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= list.size()) {
    const size_t e = std::min(list.find(',', b), list.size());
    if (e > b) out.push_back(list.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

}  // namespace

namespace {

// The run's header: device, platform, model, buckets (printed and as JSON).
nlohmann::json Describe(const ServeOptions& o, const Platform& p, const cudaDeviceProp& prop,
                        const Rank& r, const GpuSensor& sensor, const RequestSource& requests) {
  nlohmann::json h;
  h["device"] = prop.name;
  h["platform"] = p.name;
  h["stand_in"] = p.stand_in;
  h["tokens"] = o.trace.empty() ? "synthetic Zipf ids" : "trace " + o.trace;
  h["documents"] = requests.documents();
  h["requests"] = {{"prompt_cap", o.requests.prompt_cap}, {"output_cap", o.requests.output_cap}};
  h["scheduler"] = {{"max_num_seqs", o.sched.max_num_seqs},
                    {"max_batched_tokens", o.sched.max_batched_tokens},
                    {"spec_tokens", o.sched.spec_tokens},
                    {"acceptance", o.sched.acceptance}};
  h["model"] = {{"layers", ms::kLayers},
                {"tp", ms::kTp},
                {"rank", ms::kRank},
                {"rank_rows", {r.hs->rank_rows[0], r.hs->rank_rows[1]}},
                {"cache_bytes", r.cache_bytes},
                {"cache_fraction", p.cache_fraction},
                {"emulate_read_latency_us", p.emulate_read_latency_us},
                {"emulate_read_iops", p.emulate_read_iops}};
  h["nvml"] = sensor.available() ? "ok" : sensor.why();
  h["max_sm_mhz"] = sensor.MaxSmMhz();
  std::printf(
      "%s, platform %s (%s)\n%s; %zu documents; cache tier %.1f MiB (%.1f %% of the "
      "rank's rows)%s\n",
      prop.name, p.name.c_str(), p.stand_in.c_str(), h["tokens"].get<std::string>().c_str(),
      requests.documents(), r.cache_bytes / 1048576.0, 100 * p.cache_fraction,
      p.emulate_read_latency_us != 0 ? ", NVMe emulated" : "");
  std::printf(
      "GPU clock and power: %s (max SM clock %u MHz)\nbuckets (tokens: stand-in layer "
      "us / target us):",
      sensor.available() ? "NVML" : sensor.why().c_str(), sensor.MaxSmMhz());
  for (auto& s : r.shapes) {
    h["buckets"].push_back({{"tokens", s->tokens},
                            {"stand_in_n", s->stand_n},
                            {"layer_us", s->layer_us},
                            {"target_us", s->target_us}});
    std::printf(" %u: %.0f/%.0f", s->tokens, s->layer_us, s->target_us);
  }
  std::printf("\n");
  return h;
}

// Serves every load point with every wanted method, in that order (the cache tier's cache
// carries from one to the next, as a server's does); returns 1 when a method failed.
int ServeAll(const ServeOptions& o, const Platform& p, const std::vector<std::string>& wanted,
             Rank& r, RequestSource& requests, const GpuSensor& sensor, Report& report) {
  std::vector<std::vector<std::unique_ptr<ms::Graph>>> graphs(r.methods.size());
  std::vector<std::string> broken(r.methods.size());
  for (size_t mi = 0; mi < r.methods.size(); ++mi) {
    if (mi > kGpuMemory && !Wanted(wanted, r.methods[mi].name)) continue;
    graphs[mi] = CaptureMethod(r.methods[mi], r, broken[mi]);
    if (mi <= kGpuMemory && graphs[mi].empty()) throw ms::Failure(broken[mi]);
  }
  const std::vector<double> base = BaseSpans(graphs[kNoEngram], r);
  const GpuSampler sampler(sensor);
  std::vector<double> no_base(base.size(), 0);
  GpuExecutor reference(r.methods[kGpuMemory], graphs[kGpuMemory], r, no_base, nullptr);
  int failed = 0;
  const auto loads = *ParseLoadPoints(o.loads.empty() ? p.loads : o.loads);
  const DriverOptions d = LoadOptions(o, p, loads.front());
  std::printf(
      "%zu methods x %zu load points, each %.1f s and at most %.1f s more to drain: "
      "%.0f s at most\n",
      wanted.size(), loads.size(), d.duration_ns / 1e9, d.drain_ns / 1e9,
      wanted.size() * loads.size() * (d.duration_ns + d.drain_ns) / 1e9);
  for (const LoadPoint& load : loads) {
    for (size_t mi = 0; mi < r.methods.size(); ++mi) {
      const ms::Method& m = r.methods[mi];
      if (!Wanted(wanted, m.name)) continue;
      PointResult pr;
      if (graphs[mi].empty()) {
        pr.method = m.name, pr.load = load, pr.error = broken[mi];
      } else {
        GpuExecutor ex(m, graphs[mi], r, base, &sampler);
        const uint64_t d0 = m.daemon != nullptr ? m.daemon->CpuNs() : 0;
        const LoadRun run = RunLoad(LoadOptions(o, p, load), requests, ex);
        const uint64_t d1 = m.daemon != nullptr ? m.daemon->CpuNs() : 0;
        pr = Summarize(m.name, load, run, d1 - d0, r.hs->h.heads(), sensor.MaxSmMhz());
        if (pr.error.empty() && mi > kGpuMemory) pr.error = ex.CheckAgainst(reference);
      }
      failed |= pr.error.empty() ? 0 : 1;
      std::printf("%-16s %-5s ttft p99 %8.1f ms  tpot p99 %6.2f ms  stutters %4llu  %s\n",
                  m.name.c_str(), load.Name().c_str(), pr.req.ttft_p99_ms, pr.req.tpot_p99_ms,
                  static_cast<unsigned long long>(pr.req.stutters),
                  pr.error.empty() ? "" : ("FAILED: " + pr.error).c_str());
      report.Add(pr);
      if (!report.Write(o.json_out)) throw ms::Failure("cannot write " + o.json_out);
    }
  }
  return failed;
}

}  // namespace

int RunOnGpu(const ServeOptions& o, const Platform& p, RequestSource& requests, Report& report) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  const std::vector<std::string> wanted = SplitNames(o.methods.empty() ? p.methods : o.methods);
  std::vector<ms::Method> names = ms::NamedMethods();
  names[kCacheArena].name = "cache arena";
  for (const std::string& w : wanted) {
    if (std::none_of(names.begin(), names.end(),
                     [&](const ms::Method& m) { return m.name == w; })) {
      throw ms::Failure("--methods: no method '" + w + "'");
    }
  }
  cudaDeviceProp prop;
  ms::CudaCheck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  Rank r;
  r.st = ms::MakeStreams();
  ms::CheckGemm(r.st.main);
  ms::CheckMixer(r.st.main);
  std::filesystem::create_directories(o.dir);
  ms::Options mo;
  mo.dir = o.dir;
  mo.engram_vocab_size = o.engram_vocab_size;
  const auto primes = ms::HeadPrimes(o.engram_vocab_size);
  const uint64_t t0 = NowNs();
  const std::string model = ms::MakeModel(mo, primes);
  r.hs = std::make_unique<ms::Hashing>(model, primes);
  MakeBuckets(o, p, r);
  SetUpMethods(p, model, o.dir, wanted, r);
  std::printf("set up in %.1f s (checkpoint %s, stand-ins sized, engramd started)\n",
              (NowNs() - t0) / 1e9, model.c_str());
  const GpuSensor sensor;
  report = Report(Describe(o, p, prop, r, sensor, requests));
  return ServeAll(o, p, wanted, r, requests, sensor, report);
}

}  // namespace engram::bench::serve
