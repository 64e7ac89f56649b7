// Google Benchmark micro-benchmarks of the gather engine on warm (page-cache resident) synthetic
// tables: planning alone, and each gather method per batch size and layout. engram-bench covers
// cold and half-resident caches; this one tracks the hot path between commits.
//   gather_benchmark --benchmark_filter=Warm
#include <benchmark/benchmark.h>

#include <memory>
#include <random>

#include "bench/gather/gather_methods.h"
#include "gather/gather_planner.h"
#include "testkit/gather_test_util.h"

namespace engram::bench {
namespace {

constexpr uint64_t kRows = 400'000;  // ~106 MB per layout
constexpr uint64_t kSeed = 9;
constexpr uint32_t kLayer = 1;

struct Tables {
  testing::TempDir dir{"/var/tmp"};
  std::unique_ptr<Table> ckpt, packed;
  Tables() {
    const std::string c = dir.path() + "/ckpt", p = dir.path() + "/packed.engram";
    if (!WriteSyntheticCheckpoint({.out_dir = c, .rows = kRows, .seed = kSeed, .layers = {kLayer}})
             .ok() ||
        !testing::WriteSyntheticPacked(p, kLayer, kRows, kSeed).ok()) {
      return;
    }
    ckpt = std::move(*testing::OpenOne(c, kLayer));
    packed = std::move(*testing::OpenOne(p, kLayer));
    testing::Warm(*ckpt);
    testing::Warm(*packed);
  }
};

Tables& Shared() {
  static Tables t;
  return t;
}

std::vector<uint64_t> Rows(size_t n) {
  std::mt19937_64 rng(n);
  std::vector<uint64_t> rows(n);
  for (auto& r : rows) r = rng() % kRows;
  return rows;
}

const Table* TableFor(benchmark::State& state) {
  const Table* t = state.range(1) == 0 ? Shared().ckpt.get() : Shared().packed.get();
  if (t == nullptr) state.SkipWithError("could not write the synthetic tables");
  state.SetLabel(state.range(1) == 0 ? "checkpoint" : "packed");
  return t;
}

void BM_Plan(benchmark::State& state) {
  const Table* t = TableFor(state);
  if (t == nullptr) return;
  const auto rows = Rows(state.range(0));
  std::vector<uint8_t> dest(rows.size() * kRowBytes);
  GatherPlanner planner({});
  GatherPlan plan;
  for (auto _ : state) {
    benchmark::DoNotOptimize(planner.Plan({.table = t, .rows = rows, .dest = dest.data()}, &plan));
  }
  state.SetItemsProcessed(state.iterations() * rows.size());
}

template <int kMethod>
void BM_Warm(benchmark::State& state) {
  const Table* t = TableFor(state);
  if (t == nullptr) return;
  std::unique_ptr<GatherMethod> m;
  switch (kMethod) {
    case 0:
      m = MakeMmapMethod();
      break;
    case 1:
      m = MakeNowaitPoolMethod();
      break;
    case 2:
      m = MakeUringOnlyMethod();
      break;
    case 3:
      m = MakeEngineMethod("engine", {});
      break;
    case 4:
      m = MakeEngineMethod("engine serial", {.nowait_pass = NowaitPass::kSerial});
      break;
    default:
      m = MakeEngineMethod("engine 1 worker", {.workers = 1});
      break;
  }
  if (!m->Attach(*t).ok()) {
    state.SkipWithError("attach failed");
    return;
  }
  const auto rows = Rows(state.range(0));
  std::vector<uint8_t> dest(rows.size() * kRowBytes);
  (void)m->Gather(*t, rows, dest.data());
  const uint64_t calls0 = m->syscalls();
  for (auto _ : state) {
    if (!m->Gather(*t, rows, dest.data()).ok()) state.SkipWithError("gather failed");
  }
  state.SetItemsProcessed(state.iterations() * rows.size());
  state.counters["syscalls/row"] = benchmark::Counter(double(m->syscalls() - calls0) /
                                                      (double(state.iterations()) * rows.size()));
}

#define GATHER_ARGS ArgsProduct({{1152, 98304}, {0, 1}})->UseRealTime()
BENCHMARK(BM_Plan)->GATHER_ARGS;
BENCHMARK(BM_Warm<0>)->Name("BM_WarmMmap")->GATHER_ARGS;
BENCHMARK(BM_Warm<1>)->Name("BM_WarmNowaitPool")->GATHER_ARGS;
BENCHMARK(BM_Warm<2>)->Name("BM_WarmUringOnly")->GATHER_ARGS;
BENCHMARK(BM_Warm<3>)->Name("BM_WarmEngine")->GATHER_ARGS;
BENCHMARK(BM_Warm<4>)->Name("BM_WarmEngineSerial")->GATHER_ARGS;
BENCHMARK(BM_Warm<5>)->Name("BM_WarmEngineOneWorker")->GATHER_ARGS;

}  // namespace
}  // namespace engram::bench

BENCHMARK_MAIN();
