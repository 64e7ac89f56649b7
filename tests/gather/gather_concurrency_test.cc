// The gather engine's concurrency: callers gathering and submitting at once, batches split over
// the workers, the blocking pool, and Stats() read meanwhile, every row checked. The TSan run
// (tools/sanitize.sh) runs it with the engine and the tables instrumented.
#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "gather/gather_engine.h"
#include "testkit/gather_test_util.h"

namespace engram {
namespace {

constexpr uint64_t kSeed = 3;
constexpr uint64_t kRows = 6000;
constexpr uint32_t kLayer = 1;

TEST_CASE("concurrent Gather, Submit and Stats are race-free", "[gather][tsan]") {
  testing::TempDir dir;
  REQUIRE(dir.ok());
  const std::string ckpt = dir.path() + "/ckpt";
  REQUIRE(
      WriteSyntheticCheckpoint({.out_dir = ckpt, .rows = kRows, .seed = kSeed, .layers = {kLayer}})
          .ok());
  auto table = testing::OpenOne(ckpt, kLayer);
  REQUIRE(table.ok());
  for (bool uring : {true, false}) {
    GatherEngineOptions o{
        .workers = 2, .use_io_uring = uring, .blocking_threads = 3, .split_reads = 128};
    o.probe_interval = 2;
    // Every batch over split_reads fans out, and the 900-row batches count as prefill: their
    // helpers step aside while the 60-row decode batches run and come back after.
    o.helper_min_work_ns = 1;
    o.decode_max_rows = 100;
    auto engine = GatherEngine::Create(o);
    REQUIRE(engine.ok());
    REQUIRE((*engine)->AddTable(table->get(), {}).ok());
    std::atomic<int> bad{0};
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(t);
        for (int b = 0; b < 4; ++b) {
          std::vector<uint64_t> rows(b % 2 ? 900 : 60);
          for (auto& r : rows) r = rng() % kRows;
          std::vector<uint8_t> out(rows.size() * kRowBytes);
          if (t == 0 && b == 1) testing::Evict(**table);
          if (t == 2) {
            // Submit, and wait for the worker's answer.
            bool done = false;
            absl::Status result;
            (*engine)->Submit({.table = table->get(), .rows = rows, .dest = out.data()},
                              [&](absl::Status s) {
                                std::lock_guard<std::mutex> l(mu);
                                result = s;
                                done = true;
                                cv.notify_all();
                              });
            std::unique_lock<std::mutex> l(mu);
            cv.wait(l, [&] { return done; });
            if (!result.ok()) bad++;
          } else if (!(*engine)
                          ->Gather({.table = table->get(), .rows = rows, .dest = out.data()})
                          .ok()) {
            bad++;
          }
          if (testing::FirstMismatch(kSeed, **table, rows, out.data()) != -1) bad++;
          (void)(*engine)->Stats();
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(bad == 0);
  }
}

}  // namespace
}  // namespace engram
