// A decode step's lookups (1,152 rows per layer, layers 1 and 14) read in place by the GPU from
// two engramds serving the same 1 M-row synthetic checkpoint, side by side in one run, step by
// step in turn:
//   resident         engram_dequant_gather x2 from the resident tables' registered mappings;
//   cache, all hit   engram_dequant_cache_gather x2 from the registered row cache, every row a
//                    hit (the step's rows are from a working set gathered twice beforehand);
//   step, all hit    engram_gpu_queue_cache_gather x2 on the same rows: the lookup plus the
//                    miss kernels with no miss (nothing published, nothing awaited);
//   cache, half hit  engram_dequant_cache_gather x2 where half the rows are not cached: the
//                    hits' time (the misses only listed);
//   step, half hit   engram_gpu_queue_cache_gather x2 on the same rows: the misses fetched
//                    through the device-submit ring and scattered; step minus lookup is the
//                    misses' time.
// Each method is a captured graph; wall time is the launch to the end of a stream synchronise.
// Prints p50/p99 and the ratios to the resident step. Needs $ENGRAMD (run.sh --bench sets it).
// Usage: [ENGRAM_BENCH_STEPS=N] gpu_cache_bench   (N steps after 100 of warm-up; 800, at most 800)
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/gpu_submit.h"
#include "testkit/daemon_test_util.h"
#include "testkit/gpu_test_util.h"

namespace engram {
namespace {

using testing::Daemon;
using testing::DeviceBuffer;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kLayers[2] = {1, 14};
constexpr uint32_t kTokens = 96, kHeads = 12;
constexpr uint32_t kSlots = kTokens * kHeads;
constexpr uint64_t kRows = 1 << 20;
constexpr uint32_t kSets = 8;  // working set: kSets x kSlots rows per layer

int Steps() {
  const char* env = std::getenv("ENGRAM_BENCH_STEPS");
  // Each step's uncached rows are new: (steps + 100) x 576 must stay within kRows / 2.
  return std::min(800, env != nullptr ? std::max(100, std::atoi(env)) : 800);
}

const std::string& BigCheckpoint() {
  static std::string dir = [] {
    std::string d = testing::TestDir() + "/big";
    SynthOptions o{.out_dir = d, .rows = kRows, .seed = testing::kSeed};
    REQUIRE(WriteSyntheticCheckpoint(o).ok());
    return d;
  }();
  return dir;
}

engram_table_map* OpenMap(engram_session* s, uint32_t layer) {
  engram_table_map* map = nullptr;
  int rc = -EAGAIN;
  for (int i = 0; i < 3000 && rc == -EAGAIN; ++i) {
    rc = engram_table_map_open(s, layer, &map);
    if (rc == -EAGAIN) usleep(10000);
  }
  INFO("engram_table_map_open(" << layer << "): " << engram_last_error());
  REQUIRE(rc == 0);
  return map;
}

engram_table_map_info Info(const engram_table_map* map) {
  engram_table_map_info info{.size = sizeof(info)};
  REQUIRE(engram_get_table_map_info(map, &info) == 0);
  return info;
}

engram_gpu_registration* Register(const engram_table_map_info& info) {
  engram_gpu_registration* reg = nullptr;
  INFO("engram_gpu_register: " << engram_last_error());
  REQUIRE(engram_gpu_register(const_cast<void*>(info.base), info.map_bytes, &reg) == 0);
  return reg;
}

// Gathers every row of ids for `layer` through engramd twice, so that the cache admits them.
void Warm(const Daemon& d, uint32_t layer, const std::vector<uint64_t>& ids) {
  engram_connect_options o = d.Options(8 << 20, 8);
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  uint64_t* rows = nullptr;
  uint8_t* dest = nullptr;
  REQUIRE(engram_alloc(s, kSlots * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, kSlots * 264, reinterpret_cast<void**>(&dest)) == 0);
  for (size_t at = 0; at < ids.size(); at += kSlots) {
    std::copy_n(ids.begin() + at, kSlots, rows);
    engram_gather_request r{.size = sizeof(r), .table = layer, .rows = rows, .num_rows = kSlots,
                            .dest = dest};
    for (int i = 0; i < 2; ++i) REQUIRE(engram_gather(s, &r, 10'000'000'000) == 0);
  }
  engram_session_close(s);
}

cudaGraphExec_t Capture(cudaStream_t stream, const std::function<void(uintptr_t)>& body) {
  cudaGraph_t graph;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body(reinterpret_cast<uintptr_t>(stream));
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  return exec;
}

double TimeLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  const auto t0 = Clock::now();
  CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct Pct {
  double p50, p99;
};
Pct Summarise(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[v.size() * 99 / 100]};
}

TEST_CASE("cache tier read in place by the GPU against the resident tier") {
  const std::string& model = BigCheckpoint();
  Daemon resident_d({"--tier", "1=resident", "--tier", "14=resident"}, "bench-resident", model);
  Daemon cache_d({"--tier", "1=cache", "--tier", "14=cache", "--cache-bytes", "1G"},
                 "bench-cache", model);
  REQUIRE(resident_d.alive());
  REQUIRE(cache_d.alive());
  // The step's rows: kSets working sets per layer (cached), and a pool of uncached rows.
  std::vector<uint64_t> work[2];
  for (int l = 0; l < 2; ++l) {
    work[l].resize(kSets * kSlots);
    testing::FillRows(work[l].data(), work[l].size(), kRows / 2, 100 + l);
    Warm(cache_d, kLayers[l], work[l]);
  }

  engram_connect_options ro = resident_d.Options(1 << 20);
  engram_session* rs = nullptr;
  REQUIRE(engram_session_open(&ro, &rs) == 0);
  engram_connect_options co = cache_d.Options(16 << 20, 32);
  co.flags = ENGRAM_CONNECT_DEVICE_SUBMIT;
  engram_session* cs = nullptr;
  REQUIRE(engram_session_open(&co, &cs) == 0);
  void* arena = nullptr;
  uint64_t arena_bytes = 0;
  REQUIRE(engram_arena(cs, &arena, &arena_bytes) == 0);
  engram_gpu_registration* arena_reg = nullptr;
  REQUIRE(engram_gpu_register(arena, arena_bytes, &arena_reg) == 0);
  engram_gpu_queue* queue = nullptr;
  ENGRAM_REQUIRE(engram_gpu_queue_create(cs, arena_reg, nullptr, &queue));

  engram_table_map *rmap[2], *cmap[2];
  engram_table_map_info rinfo[2];
  engram_gpu_registration* rreg[2];
  engram_gpu_row_cache cache[2];
  for (int l = 0; l < 2; ++l) {
    rmap[l] = OpenMap(rs, kLayers[l]);
    rinfo[l] = Info(rmap[l]);
    rreg[l] = Register(rinfo[l]);
    cmap[l] = OpenMap(cs, kLayers[l]);
    REQUIRE(Info(cmap[l]).kind == ENGRAM_TABLE_MAP_ROW_CACHE);
  }
  // Every cache-tier table's map is the same region: registered once, through layer 1's map.
  const auto t_reg = Clock::now();
  engram_gpu_registration* creg = Register(Info(cmap[0]));
  const double reg_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_reg).count();
  cache[0].size = sizeof(cache[0]);
  REQUIRE(engram_table_map_gpu_cache(cmap[0], creg, &cache[0]) == 0);
  cache[1] = cache[0];
  cache[1].layer = kLayers[1];
  cache[1].covered_begin = Info(cmap[1]).covered_begin;
  cache[1].covered_end = Info(cmap[1]).covered_end;

  DeviceBuffer ids_d[2] = {DeviceBuffer(kSlots * 8), DeviceBuffer(kSlots * 8)};
  DeviceBuffer out_r(2 * kSlots * 512), out_c(2 * kSlots * 512);
  DeviceBuffer slots_d(2 * kSlots * 4), count_d(2 * 4);
  uint64_t* miss_rows = nullptr;
  uint8_t* miss_dest = nullptr;
  REQUIRE(engram_alloc(cs, 2 * kSlots * 8, reinterpret_cast<void**>(&miss_rows)) == 0);
  REQUIRE(engram_alloc(cs, 2 * kSlots * 264, reinterpret_cast<void**>(&miss_dest)) == 0);
  engram_gpu_cache_misses misses[2];
  for (int l = 0; l < 2; ++l) {
    misses[l] = {.size = sizeof(misses[l])};
    misses[l].rows =
        static_cast<uint64_t*>(engram_gpu_device_ptr(arena_reg, miss_rows + l * kSlots));
    misses[l].slots = slots_d.get<uint32_t>() + l * kSlots;
    misses[l].count = count_d.get<uint32_t>() + l;
  }
  const auto out_at = [](const DeviceBuffer& b, int l) {
    return static_cast<char*>(b.get()) + size_t{l} * kSlots * 512;
  };
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const cudaGraphExec_t resident = Capture(stream, [&](uintptr_t s) {
    for (int l = 0; l < 2; ++l) {
      ENGRAM_REQUIRE(engram_dequant_gather(rinfo[l].base == nullptr ? nullptr
                                               : engram_gpu_device_ptr(rreg[l], rinfo[l].base),
                                           rinfo[l].covered_begin,
                                           rinfo[l].covered_end - rinfo[l].covered_begin,
                                           ids_d[l].get<uint64_t>(), kTokens, kHeads,
                                           out_at(out_r, l), nullptr, s));
    }
  });
  const cudaGraphExec_t lookup = Capture(stream, [&](uintptr_t s) {
    for (int l = 0; l < 2; ++l) {
      ENGRAM_REQUIRE(engram_dequant_cache_gather(&cache[l], ids_d[l].get<uint64_t>(), kTokens,
                                                 kHeads, out_at(out_c, l), &misses[l], nullptr,
                                                 s));
    }
  });
  const cudaGraphExec_t step = Capture(stream, [&](uintptr_t s) {
    for (int l = 0; l < 2; ++l) {
      ENGRAM_REQUIRE(engram_gpu_queue_cache_gather(
          queue, &cache[l], ids_d[l].get<uint64_t>(), kTokens, kHeads, out_at(out_c, l),
          &misses[l], engram_gpu_device_ptr(arena_reg, miss_dest + l * kSlots * 264), nullptr,
          s));
    }
  });

  const int steps = Steps();
  std::vector<double> t_res, t_hit, t_step_hit, t_half, t_step_half;
  std::vector<uint64_t> ids[2] = {std::vector<uint64_t>(kSlots), std::vector<uint64_t>(kSlots)};
  uint64_t fresh = kRows / 2;  // uncached rows, each used once (the same ids in both layers)
  uint64_t half_misses = 0, all_hit_misses = 0, mismatched_steps = 0;
  const auto upload = [&] {
    for (int l = 0; l < 2; ++l) {
      CUDA_REQUIRE(cudaMemcpy(ids_d[l].get(), ids[l].data(), kSlots * 8, cudaMemcpyHostToDevice));
    }
  };
  const auto miss_count = [&] {
    uint32_t c[2];
    CUDA_REQUIRE(cudaMemcpy(c, count_d.get(), 8, cudaMemcpyDeviceToHost));
    return uint64_t{c[0]} + c[1];
  };
  std::vector<char> a(out_r.bytes()), b(out_c.bytes());
  for (int i = 0; i < steps + 100; ++i) {
    const bool keep = i >= 100;
    const uint32_t set = static_cast<uint32_t>(i) % kSets;
    for (int l = 0; l < 2; ++l) {
      std::copy_n(work[l].begin() + set * kSlots, kSlots, ids[l].begin());
    }
    upload();
    const double r = TimeLaunch(resident, stream);
    const double h = TimeLaunch(lookup, stream);
    all_hit_misses += keep ? miss_count() : 0;
    const double sh = TimeLaunch(step, stream);
    if (i % 50 == 0) {  // the two tiers' outputs of the same rows agree
      CUDA_REQUIRE(cudaMemcpy(a.data(), out_r.get(), a.size(), cudaMemcpyDeviceToHost));
      CUDA_REQUIRE(cudaMemcpy(b.data(), out_c.get(), b.size(), cudaMemcpyDeviceToHost));
      mismatched_steps += a != b;
    }
    for (uint32_t s = 1; s < kSlots; s += 2, ++fresh) {
      for (int l = 0; l < 2; ++l) ids[l][s] = fresh;
    }
    REQUIRE(fresh <= kRows);
    upload();
    const double hh = TimeLaunch(lookup, stream);
    half_misses += keep ? miss_count() : 0;
    const double sh2 = TimeLaunch(step, stream);
    REQUIRE(*engram_gpu_queue_error(queue) == 0);
    if (keep) {
      t_res.push_back(r);
      t_hit.push_back(h);
      t_step_hit.push_back(sh);
      t_half.push_back(hh);
      t_step_half.push_back(sh2);
    }
  }
  CHECK(mismatched_steps == 0);
  const Pct res = Summarise(t_res), hit = Summarise(t_hit), step_hit = Summarise(t_step_hit),
            half = Summarise(t_half), step_half = Summarise(t_step_half);
  std::printf("gpu_cache_bench: %d steps of 2 layers x %u rows, 1 M-row tables, working set %u "
              "rows per layer\n",
              steps, kSlots, kSets * kSlots);
  std::printf("row cache registration (pinning %.0f MiB): %.1f ms\n",
              Info(cmap[0]).map_bytes / 1048576.0, reg_ms);
  std::printf("%-34s %9s %9s %9s %9s\n", "method", "p50 us", "p99 us", "p50 x", "p99 x");
  const auto row = [&](const char* name, Pct p) {
    std::printf("%-34s %9.1f %9.1f %9.2f %9.2f\n", name, p.p50, p.p99, p.p50 / res.p50,
                p.p99 / res.p99);
  };
  row("resident in place (dequant_gather)", res);
  row("cache all hit (cache_gather)", hit);
  row("cache all hit, whole step", step_hit);
  row("cache half hit (hits only)", half);
  row("cache half hit, whole step", step_half);
  // Where the registration pinned the cache, slots across a page boundary are misses (the
  // guard, docs/gpu.md): those rows are cached but not read in place.
  std::printf("all cached: %.1f of %u rows per step not read in place (page guard %u bytes)\n",
              double(all_hit_misses) / steps, 2 * kSlots, cache[0].guard_page_bytes);
  std::printf("half hit: %.1f misses per step; misses' time (step - hits) p50 %.1f us\n",
              double(half_misses) / steps, step_half.p50 - half.p50);

  for (cudaGraphExec_t e : {resident, lookup, step}) cudaGraphExecDestroy(e);
  cudaStreamDestroy(stream);
  engram_gpu_queue_destroy(queue);
  engram_gpu_unregister(creg);
  for (int l = 0; l < 2; ++l) {
    engram_gpu_unregister(rreg[l]);
    engram_table_map_close(rmap[l]);
    engram_table_map_close(cmap[l]);
  }
  engram_gpu_unregister(arena_reg);
  engram_session_close(cs);
  engram_session_close(rs);
}

}  // namespace
}  // namespace engram
