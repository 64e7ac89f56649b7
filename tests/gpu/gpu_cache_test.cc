// Row cache hits read in place by the GPU (engram_dequant_cache_gather) through a real engramd
// serving layer 1 from its row cache: hits bit-exact against the CPU reference and the misses
// listed exactly; the whole step (engram_gpu_queue_cache_gather) fetching the misses through
// the device-submit ring; a tiny cache evicting under a concurrent client never giving a wrong
// row; and the step captured into a CUDA graph and replayed with new rows.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/gpu_submit.h"
#include "kernels/dequant_ref.h"
#include "testkit/daemon_test_util.h"
#include "testkit/gpu_test_util.h"

namespace engram {
namespace {

using testing::Daemon;
using testing::DeviceBuffer;

constexpr uint32_t kLayer = 1;
constexpr uint32_t kTokens = 96, kHeads = 12;
constexpr uint32_t kSlots = kTokens * kHeads;  // 1,152

// A device-submit session on `d` with its arena registered and a queue, plus layer 1's row
// cache mapped and registered, and the step's buffers.
struct CacheStep {
  engram_session* session = nullptr;
  engram_gpu_registration* arena_reg = nullptr;
  engram_gpu_queue* queue = nullptr;
  engram_table_map* map = nullptr;
  engram_gpu_registration* cache_reg = nullptr;
  engram_gpu_row_cache cache{};
  uint64_t* warm_ids = nullptr;  // kSlots ids in the data region, for host gathers
  uint8_t* warm_rows = nullptr;
  uint64_t* miss_rows = nullptr;  // the miss list, in the data region
  uint8_t* miss_dest = nullptr;
  DeviceBuffer ids_d{kSlots * 8}, out_d{kSlots * 512}, slots_d{kSlots * 4}, count_d{4}, bad_d{4},
      hits_d{kSlots * 16}, hit_count_d{4}, hit_total_d{8};

  explicit CacheStep(const Daemon& d, uint32_t flags = ENGRAM_CONNECT_DEVICE_SUBMIT) {
    REQUIRE(d.alive());
    engram_connect_options o = d.Options(8 << 20, 32);
    o.flags = flags;
    INFO(engram_last_error());
    REQUIRE(engram_session_open(&o, &session) == 0);
    void* arena = nullptr;
    uint64_t arena_bytes = 0;
    REQUIRE(engram_arena(session, &arena, &arena_bytes) == 0);
    REQUIRE(engram_gpu_register(arena, arena_bytes, &arena_reg) == 0);
    if ((flags & ENGRAM_CONNECT_DEVICE_SUBMIT) != 0) {
      ENGRAM_REQUIRE(engram_gpu_queue_create(session, arena_reg, nullptr, &queue));
    }
    REQUIRE(engram_alloc(session, kSlots * 8, reinterpret_cast<void**>(&warm_ids)) == 0);
    REQUIRE(engram_alloc(session, kSlots * kRowBytes, reinterpret_cast<void**>(&warm_rows)) == 0);
    REQUIRE(engram_alloc(session, kSlots * 8, reinterpret_cast<void**>(&miss_rows)) == 0);
    REQUIRE(engram_alloc(session, kSlots * kRowBytes, reinterpret_cast<void**>(&miss_dest)) == 0);
    int rc = -EAGAIN;
    for (int i = 0; i < 500 && rc == -EAGAIN; ++i) {
      rc = engram_table_map_open_any(session, kLayer, &map);
      if (rc == -EAGAIN) usleep(10000);
    }
    INFO("engram_table_map_open_any: " << engram_last_error());
    REQUIRE(rc == 0);
    engram_table_map_info info{.size = sizeof(info)};
    REQUIRE(engram_get_table_map_info(map, &info) == 0);
    REQUIRE(info.kind == ENGRAM_TABLE_MAP_ROW_CACHE);
    INFO("engram_gpu_register (row cache): " << engram_last_error());
    REQUIRE(engram_gpu_register(const_cast<void*>(info.base), info.map_bytes, &cache_reg) == 0);
    cache.size = sizeof(cache);
    INFO(engram_last_error());
    REQUIRE(engram_table_map_gpu_cache(map, cache_reg, &cache) == 0);
  }
  ~CacheStep() {
    cudaDeviceSynchronize();
    engram_gpu_queue_destroy(queue);
    engram_gpu_unregister(cache_reg);
    engram_table_map_close(map);
    engram_gpu_unregister(arena_reg);
    engram_session_close(session);
  }
  // Gathers `ids` through engramd (host submit only: a device-submit session's ring is the
  // GPU's), so that they are admitted.
  static void Warm(const Daemon& d, const std::vector<uint64_t>& ids) {
    engram::testing::WarmRows(d, kLayer, ids, kSlots);
  }
  // Warm without Catch2's macros (not thread-safe), for a thread beside the test: false when a
  // gather failed.
  static bool Churn(const Daemon& d, uint64_t round) {
    engram_connect_options o = d.Options(8 << 20, 8);
    engram_session* s = nullptr;
    if (engram_session_open(&o, &s) != 0) return false;
    uint64_t* rows = nullptr;
    uint8_t* dest = nullptr;
    bool ok = engram_alloc(s, kSlots * 8, reinterpret_cast<void**>(&rows)) == 0 &&
              engram_alloc(s, kSlots * kRowBytes, reinterpret_cast<void**>(&dest)) == 0;
    if (ok) {
      testing::FillRows(rows, kSlots, testing::kRows, round);
      engram_gather_request r{
          .size = sizeof(r), .layer = kLayer, .rows = rows, .num_rows = kSlots, .dest = dest};
      ok = engram_gather(s, &r, 10'000'000'000) == 0;
    }
    engram_session_close(s);
    return ok;
  }
  engram_gpu_cache_misses Misses() const {
    engram_gpu_cache_misses m{.size = sizeof(m)};
    m.rows = static_cast<uint64_t*>(engram_gpu_device_ptr(arena_reg, miss_rows));
    m.slots = slots_d.get<uint32_t>();
    m.count = count_d.get<uint32_t>();
    m.hits = hits_d.get<engram_gpu_cache_hit>();
    m.hit_count = hit_count_d.get<uint32_t>();
    m.hit_total = hit_total_d.get<uint64_t>();
    return m;
  }
  void Upload(const std::vector<uint64_t>& ids) {
    CUDA_REQUIRE(cudaMemcpy(ids_d.get(), ids.data(), kSlots * 8, cudaMemcpyHostToDevice));
  }
  std::vector<uint16_t> Out() const {
    std::vector<uint16_t> out(kSlots * 256);
    CUDA_REQUIRE(cudaMemcpy(out.data(), out_d.get(), out_d.bytes(), cudaMemcpyDeviceToHost));
    return out;
  }
  uint32_t Word(const DeviceBuffer& b) const {
    uint32_t v = 0;
    CUDA_REQUIRE(cudaMemcpy(&v, b.get(), 4, cudaMemcpyDeviceToHost));
    return v;
  }
};

// The reference dequantisation of the checkpoint's row `id` of layer 1.
std::vector<uint16_t> Expected(uint64_t id) {
  std::vector<uint8_t> row(kRowBytes);
  SyntheticRow(testing::kSeed, kLayer, id, row.data());
  std::vector<uint16_t> out(256);
  DequantRow(row.data(), out.data());
  return out;
}

bool SlotIs(const std::vector<uint16_t>& out, uint32_t s, const std::vector<uint16_t>& want) {
  return std::equal(want.begin(), want.end(), out.begin() + uint64_t{s} * 256);
}

const Daemon& CacheDaemon() {
  static Daemon d({"--tier", "1=cache", "--cache-bytes", "64M"}, "gpu-cache");
  return d;
}

TEST_CASE("row cache hits dequantise on the GPU bit for bit; misses and bad ids are listed",
          "[gpu][cache]") {
  const Daemon& d = CacheDaemon();
  std::vector<uint64_t> cached(kSlots / 2);
  testing::FillRows(cached.data(), cached.size(), testing::kRows / 2, 7);
  CacheStep::Warm(d, cached);
  CacheStep st(d, 0);
  // Even slots: cached rows; odd slots: rows from the other half, never gathered; slot 5: bad.
  std::vector<uint64_t> ids(kSlots);
  for (uint32_t s = 0; s < kSlots; ++s) {
    ids[s] = s % 2 == 0 ? cached[s / 2] : testing::kRows / 2 + (s * 7919) % (testing::kRows / 2);
  }
  ids[5] = UINT64_MAX;
  st.Upload(ids);
  CUDA_REQUIRE(cudaMemset(st.out_d.get(), 0xAB, st.out_d.bytes()));
  CUDA_REQUIRE(cudaMemset(st.bad_d.get(), 0, 4));
  CUDA_REQUIRE(cudaMemset(st.hit_total_d.get(), 0, 8));
  const engram_gpu_cache_misses m = st.Misses();
  ENGRAM_REQUIRE(engram_dequant_cache_gather(&st.cache, st.ids_d.get<uint64_t>(), kTokens, kHeads,
                                             st.out_d.get(), &m, st.bad_d.get<uint32_t>(), 0));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<uint16_t> out = st.Out();
  const uint32_t misses = st.Word(st.count_d);
  std::vector<uint32_t> miss_slots(misses);
  CUDA_REQUIRE(cudaMemcpy(miss_slots.data(), st.slots_d.get(), misses * 4, cudaMemcpyDeviceToHost));
  std::set<uint32_t> missed(miss_slots.begin(), miss_slots.end());
  REQUIRE(missed.size() == misses);
  CHECK(st.Word(st.bad_d) == 1);
  uint32_t hits = 0;
  const std::vector<uint16_t> nan(256, 0x7FC0), untouched(256, 0xABAB);
  for (uint32_t s = 0; s < kSlots; ++s) {
    INFO("slot " << s << " row " << ids[s]);
    if (s == 5) {
      CHECK(SlotIs(out, s, nan));
    } else if (missed.count(s) != 0) {
      CHECK(SlotIs(out, s, untouched));
      CHECK(st.miss_rows[std::find(miss_slots.begin(), miss_slots.end(), s) - miss_slots.begin()] ==
            ids[s]);
    } else {
      REQUIRE(SlotIs(out, s, Expected(ids[s])));
      ++hits;
    }
  }
  // Every never-gathered row is a miss; every cached one a hit (nothing evicts in 64 MiB).
  CHECK(st.cache.guard_page_bytes == 0);
  CHECK(misses >= kSlots / 2 - 1);
  CHECK(hits + misses == kSlots - 1);
  CHECK(hits >= kSlots / 2);
  uint64_t total = 0;
  CUDA_REQUIRE(cudaMemcpy(&total, st.hit_total_d.get(), 8, cudaMemcpyDeviceToHost));
  CHECK(total == hits);
  // The hits recorded for the policy are reported to the daemon through the touch page.
  const uint32_t recorded = st.Word(st.hit_count_d);
  CHECK(recorded <= hits);
  std::vector<engram_gpu_cache_hit> hit_list(recorded);
  CUDA_REQUIRE(cudaMemcpy(hit_list.data(), st.hits_d.get(), recorded * 16, cudaMemcpyDeviceToHost));
  for (const auto& h : hit_list) CHECK(h.key >> 40 == kLayer + 1);
  CHECK(engram_table_map_report_hits(st.map, hits, 0, hit_list.data(), hit_list.size()) == 0);
}

TEST_CASE("the whole cache step fetches the misses through the GPU queue", "[gpu][cache]") {
  const Daemon& d = CacheDaemon();
  std::vector<uint64_t> cached(kSlots / 2);
  testing::FillRows(cached.data(), cached.size(), testing::kRows / 4, 11);
  CacheStep::Warm(d, cached);
  CacheStep st(d);
  std::vector<uint64_t> ids(kSlots);
  for (uint32_t s = 0; s < kSlots; ++s) {
    ids[s] =
        s % 2 == 0 ? cached[s / 2] : testing::kRows * 3 / 4 + (s * 104729) % (testing::kRows / 4);
  }
  const engram_gpu_cache_misses m = st.Misses();
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);  // round 1 and 2: the misses of round 0 are cached by now
    st.Upload(ids);
    CUDA_REQUIRE(cudaMemset(st.out_d.get(), 0xAB, st.out_d.bytes()));
    ENGRAM_REQUIRE(engram_gpu_queue_cache_gather(
        st.queue, &st.cache, st.ids_d.get<uint64_t>(), kTokens, kHeads, st.out_d.get(), &m,
        engram_gpu_device_ptr(st.arena_reg, st.miss_dest), nullptr, 0));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    REQUIRE(*engram_gpu_queue_error(st.queue) == 0);
    if (round == 0) CHECK(st.Word(st.count_d) >= kSlots / 2 - 8);
    const std::vector<uint16_t> out = st.Out();
    for (uint32_t s = 0; s < kSlots; ++s) {
      INFO("slot " << s << " row " << ids[s]);
      REQUIRE(SlotIs(out, s, Expected(ids[s])));
    }
  }
}

TEST_CASE("a tiny cache evicting under another client never gives the GPU a wrong row",
          "[gpu][cache]") {
  // ~3,600 slots for 20,000 rows: a client gathering at random keeps rewriting them.
  Daemon d({"--tier", "1=cache", "--cache-bytes", "1M"}, "gpu-cache-tiny");
  CacheStep st(d, 0);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> churned{0}, churn_failed{0};
  std::thread churn([&] {
    for (uint64_t round = 1; !stop.load(); ++round) {
      (CacheStep::Churn(d, round) ? churned : churn_failed).fetch_add(1);
    }
  });
  const engram_gpu_cache_misses m = st.Misses();
  uint64_t hits = 0;
  for (int round = 0; round < 200; ++round) {
    std::vector<uint64_t> ids(kSlots);
    testing::FillRows(ids.data(), ids.size(), 4000, 1000 + round % 3);  // the churn's rows too
    st.Upload(ids);
    CUDA_REQUIRE(cudaMemset(st.out_d.get(), 0xAB, st.out_d.bytes()));
    ENGRAM_REQUIRE(engram_dequant_cache_gather(&st.cache, st.ids_d.get<uint64_t>(), kTokens, kHeads,
                                               st.out_d.get(), &m, nullptr, 0));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    const std::vector<uint16_t> out = st.Out();
    const uint32_t misses = st.Word(st.count_d);
    std::vector<uint32_t> miss_slots(misses);
    CUDA_REQUIRE(
        cudaMemcpy(miss_slots.data(), st.slots_d.get(), misses * 4, cudaMemcpyDeviceToHost));
    const std::set<uint32_t> missed(miss_slots.begin(), miss_slots.end());
    const std::vector<uint16_t> untouched(256, 0xABAB);
    for (uint32_t s = 0; s < kSlots; ++s) {
      INFO("round " << round << " slot " << s << " row " << ids[s]);
      if (missed.count(s) != 0) {
        REQUIRE(SlotIs(out, s, untouched));
      } else {
        REQUIRE(SlotIs(out, s, Expected(ids[s])));
        ++hits;
      }
    }
  }
  stop.store(true);
  churn.join();
  INFO("hits " << hits << ", churn gathers " << churned.load());
  CHECK(churn_failed.load() == 0);
  CHECK(churned.load() > 10);  // the cache was rewritten while the GPU read it
  CHECK(hits > 0);             // the test looked at rows read from the cache, not only at misses
}

TEST_CASE("a captured cache step replays with new rows each time", "[gpu][cache]") {
  const Daemon& d = CacheDaemon();
  std::vector<uint64_t> cached(kSlots);
  testing::FillRows(cached.data(), cached.size(), testing::kRows / 2, 23);
  CacheStep::Warm(d, cached);
  CacheStep st(d);
  const engram_gpu_cache_misses m = st.Misses();
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ENGRAM_REQUIRE(engram_gpu_queue_cache_gather(st.queue, &st.cache, st.ids_d.get<uint64_t>(),
                                               kTokens, kHeads, st.out_d.get(), &m,
                                               engram_gpu_device_ptr(st.arena_reg, st.miss_dest),
                                               nullptr, reinterpret_cast<uintptr_t>(stream)));
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 6; ++replay) {
    // All hits, half hits, all misses (rows of the other half), in turn.
    std::vector<uint64_t> ids(kSlots);
    for (uint32_t s = 0; s < kSlots; ++s) {
      const bool hit = replay % 3 == 0 || (replay % 3 == 1 && s % 2 == 0);
      ids[s] = hit ? cached[(s + replay) % kSlots]
                   : testing::kRows / 2 + (s * 31 + replay * 977) % (testing::kRows / 2);
    }
    st.Upload(ids);
    CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    INFO("replay " << replay);
    REQUIRE(*engram_gpu_queue_error(st.queue) == 0);
    if (replay == 0) CHECK(st.Word(st.count_d) == 0);
    const std::vector<uint16_t> out = st.Out();
    for (uint32_t s = 0; s < kSlots; ++s) {
      INFO("slot " << s << " row " << ids[s]);
      REQUIRE(SlotIs(out, s, Expected(ids[s])));
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace engram
