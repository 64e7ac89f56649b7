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
    rc = engram_table_map_open_any(s, layer, &map);
    if (rc == -EAGAIN) usleep(10000);
  }
  INFO("engram_table_map_open_any(" << layer << "): " << engram_last_error());
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

// Both daemons, their sessions and maps, the GPU queue, the buffers and the captured graphs.
class CacheBench {
 public:
  CacheBench()
      : resident_d_({"--tier", "1=resident", "--tier", "14=resident"}, "bench-resident",
                    BigCheckpoint()),
        cache_d_({"--tier", "1=cache", "--tier", "14=cache", "--cache-bytes", "1G"},
                 "bench-cache", BigCheckpoint()) {
    REQUIRE(resident_d_.alive());
    REQUIRE(cache_d_.alive());
    // The step's rows: kSets working sets per layer, gathered twice so that they are cached.
    for (int l = 0; l < 2; ++l) {
      work_[l].resize(kSets * kSlots);
      testing::FillRows(work_[l].data(), work_[l].size(), kRows / 2, 100 + l);
      engram::testing::WarmRows(cache_d_, kLayers[l], work_[l], kSlots);
    }
    OpenSessions();
    MapTables();
    Buffers();
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CaptureGraphs();
  }
  ~CacheBench() {
    for (cudaGraphExec_t e : {resident_, lookup_, step_}) cudaGraphExecDestroy(e);
    cudaStreamDestroy(stream_);
    engram_gpu_queue_destroy(queue_);
    engram_gpu_unregister(creg_);
    for (int l = 0; l < 2; ++l) {
      engram_gpu_unregister(rreg_[l]);
      engram_table_map_close(rmap_[l]);
      engram_table_map_close(cmap_[l]);
    }
    engram_gpu_unregister(arena_reg_);
    engram_session_close(cs_);
    engram_session_close(rs_);
  }

  // Every method in turn, step by step; then the figures.
  void Run() {
    const int steps = Steps();
    std::vector<double> t[5];  // resident, lookup all hit, step all hit, lookup half, step half
    uint64_t fresh = kRows / 2;  // uncached rows, each used once (the same ids in both layers)
    uint64_t half_misses = 0, all_cached_misses = 0, mismatched = 0;
    for (int i = 0; i < steps + 100; ++i) {
      const bool keep = i >= 100;
      const uint32_t set = static_cast<uint32_t>(i) % kSets;
      for (int l = 0; l < 2; ++l) {
        std::copy_n(work_[l].begin() + set * kSlots, kSlots, ids_[l].begin());
      }
      Upload();
      double took[5];
      took[0] = TimeLaunch(resident_, stream_);
      took[1] = TimeLaunch(lookup_, stream_);
      all_cached_misses += keep ? MissCount() : 0;
      took[2] = TimeLaunch(step_, stream_);
      if (i % 50 == 0) mismatched += !SameOutputs();
      for (uint32_t s = 1; s < kSlots; s += 2, ++fresh) {
        for (int l = 0; l < 2; ++l) ids_[l][s] = fresh;
      }
      REQUIRE(fresh <= kRows);
      Upload();
      took[3] = TimeLaunch(lookup_, stream_);
      half_misses += keep ? MissCount() : 0;
      took[4] = TimeLaunch(step_, stream_);
      REQUIRE(*engram_gpu_queue_error(queue_) == 0);
      for (int m = 0; m < 5 && keep; ++m) t[m].push_back(took[m]);
    }
    CHECK(mismatched == 0);
    Print(steps, t, all_cached_misses, half_misses);
  }

 private:
  void OpenSessions() {
    engram_connect_options ro = resident_d_.Options(1 << 20);
    REQUIRE(engram_session_open(&ro, &rs_) == 0);
    engram_connect_options co = cache_d_.Options(16 << 20, 32);
    co.flags = ENGRAM_CONNECT_DEVICE_SUBMIT;
    REQUIRE(engram_session_open(&co, &cs_) == 0);
    void* arena = nullptr;
    uint64_t arena_bytes = 0;
    REQUIRE(engram_arena(cs_, &arena, &arena_bytes) == 0);
    REQUIRE(engram_gpu_register(arena, arena_bytes, &arena_reg_) == 0);
    ENGRAM_REQUIRE(engram_gpu_queue_create(cs_, arena_reg_, nullptr, &queue_));
  }

  void MapTables() {
    for (int l = 0; l < 2; ++l) {
      rmap_[l] = OpenMap(rs_, kLayers[l]);
      rinfo_[l] = Info(rmap_[l]);
      rreg_[l] = Register(rinfo_[l]);
      cmap_[l] = OpenMap(cs_, kLayers[l]);
      REQUIRE(Info(cmap_[l]).kind == ENGRAM_TABLE_MAP_ROW_CACHE);
    }
    // Every cache-tier table's map is the same region: registered once, through layer 1's map.
    const auto t0 = Clock::now();
    creg_ = Register(Info(cmap_[0]));
    reg_ms_ = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    cache_[0].size = sizeof(cache_[0]);
    REQUIRE(engram_table_map_gpu_cache(cmap_[0], creg_, &cache_[0]) == 0);
    cache_[1] = cache_[0];
    cache_[1].layer = kLayers[1];
    cache_[1].covered_begin = Info(cmap_[1]).covered_begin;
    cache_[1].covered_end = Info(cmap_[1]).covered_end;
  }

  void Buffers() {
    REQUIRE(engram_alloc(cs_, 2 * kSlots * 8, reinterpret_cast<void**>(&miss_rows_)) == 0);
    REQUIRE(engram_alloc(cs_, 2 * kSlots * 264, reinterpret_cast<void**>(&miss_dest_)) == 0);
    for (int l = 0; l < 2; ++l) {
      ids_[l].resize(kSlots);
      misses_[l] = {.size = sizeof(misses_[l])};
      misses_[l].rows =
          static_cast<uint64_t*>(engram_gpu_device_ptr(arena_reg_, miss_rows_ + l * kSlots));
      misses_[l].slots = slots_d_.get<uint32_t>() + l * kSlots;
      misses_[l].count = count_d_.get<uint32_t>() + l;
    }
  }

  static char* OutAt(const DeviceBuffer& b, int l) {
    return static_cast<char*>(b.get()) + static_cast<size_t>(l) * kSlots * 512;
  }

  void CaptureGraphs() {
    resident_ = Capture(stream_, [&](uintptr_t s) {
      for (int l = 0; l < 2; ++l) {
        ENGRAM_REQUIRE(engram_dequant_gather(
            engram_gpu_device_ptr(rreg_[l], rinfo_[l].base), rinfo_[l].covered_begin,
            rinfo_[l].covered_end - rinfo_[l].covered_begin, ids_d_[l].get<uint64_t>(), kTokens,
            kHeads, OutAt(out_r_, l), nullptr, s));
      }
    });
    lookup_ = Capture(stream_, [&](uintptr_t s) {
      for (int l = 0; l < 2; ++l) {
        ENGRAM_REQUIRE(engram_dequant_cache_gather(&cache_[l], ids_d_[l].get<uint64_t>(),
                                                   kTokens, kHeads, OutAt(out_c_, l),
                                                   &misses_[l], nullptr, s));
      }
    });
    step_ = Capture(stream_, [&](uintptr_t s) {
      for (int l = 0; l < 2; ++l) {
        ENGRAM_REQUIRE(engram_gpu_queue_cache_gather(
            queue_, &cache_[l], ids_d_[l].get<uint64_t>(), kTokens, kHeads, OutAt(out_c_, l),
            &misses_[l], engram_gpu_device_ptr(arena_reg_, miss_dest_ + l * kSlots * 264),
            nullptr, s));
      }
    });
  }

  void Upload() {
    for (int l = 0; l < 2; ++l) {
      CUDA_REQUIRE(
          cudaMemcpy(ids_d_[l].get(), ids_[l].data(), kSlots * 8, cudaMemcpyHostToDevice));
    }
  }
  uint64_t MissCount() const {
    uint32_t c[2];
    CUDA_REQUIRE(cudaMemcpy(c, count_d_.get(), 8, cudaMemcpyDeviceToHost));
    return uint64_t{c[0]} + c[1];
  }
  // The two tiers' outputs of the same rows agree.
  bool SameOutputs() const {
    std::vector<char> a(out_r_.bytes()), b(out_c_.bytes());
    CUDA_REQUIRE(cudaMemcpy(a.data(), out_r_.get(), a.size(), cudaMemcpyDeviceToHost));
    CUDA_REQUIRE(cudaMemcpy(b.data(), out_c_.get(), b.size(), cudaMemcpyDeviceToHost));
    return a == b;
  }

  void Print(int steps, const std::vector<double> (&t)[5], uint64_t all_cached_misses,
             uint64_t half_misses) const {
    Pct p[5];
    for (int m = 0; m < 5; ++m) p[m] = Summarise(t[m]);
    std::printf("gpu_cache_bench: %d steps of 2 layers x %u rows, 1 M-row tables, working set "
                "%u rows per layer\n",
                steps, kSlots, kSets * kSlots);
    std::printf("row cache registration (pinning %.0f MiB): %.1f ms\n",
                Info(cmap_[0]).map_bytes / 1048576.0, reg_ms_);
    std::printf("%-34s %9s %9s %9s %9s\n", "method", "p50 us", "p99 us", "p50 x", "p99 x");
    const char* names[5] = {"resident in place (dequant_gather)", "cache all hit (cache_gather)",
                            "cache all hit, whole step", "cache half hit (hits only)",
                            "cache half hit, whole step"};
    for (int m = 0; m < 5; ++m) {
      std::printf("%-34s %9.1f %9.1f %9.2f %9.2f\n", names[m], p[m].p50, p[m].p99,
                  p[m].p50 / p[0].p50, p[m].p99 / p[0].p99);
    }
    // Where the registration pinned the cache, slots across a page boundary are misses (the
    // guard, docs/gpu.md): those rows are cached but not read in place.
    std::printf("all cached: %.1f of %u rows per step not read in place (page guard %u bytes)\n",
                double(all_cached_misses) / steps, 2 * kSlots, cache_[0].guard_page_bytes);
    std::printf("half hit: %.1f misses per step; misses' time (step - hits) p50 %.1f us\n",
                double(half_misses) / steps, p[4].p50 - p[3].p50);
  }

  Daemon resident_d_, cache_d_;
  std::vector<uint64_t> work_[2], ids_[2];
  engram_session *rs_ = nullptr, *cs_ = nullptr;
  engram_gpu_registration* arena_reg_ = nullptr;
  engram_gpu_queue* queue_ = nullptr;
  engram_table_map *rmap_[2] = {}, *cmap_[2] = {};
  engram_table_map_info rinfo_[2] = {};
  engram_gpu_registration *rreg_[2] = {}, *creg_ = nullptr;
  engram_gpu_row_cache cache_[2] = {};
  double reg_ms_ = 0;
  DeviceBuffer ids_d_[2] = {DeviceBuffer(kSlots * 8), DeviceBuffer(kSlots * 8)};
  DeviceBuffer out_r_{2 * kSlots * 512}, out_c_{2 * kSlots * 512};
  DeviceBuffer slots_d_{2 * kSlots * 4}, count_d_{2 * 4};
  uint64_t* miss_rows_ = nullptr;
  uint8_t* miss_dest_ = nullptr;
  engram_gpu_cache_misses misses_[2] = {};
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t resident_ = nullptr, lookup_ = nullptr, step_ = nullptr;
};

TEST_CASE("cache tier read in place by the GPU against the resident tier") {
  CacheBench bench;
  bench.Run();
}

}  // namespace
}  // namespace engram
