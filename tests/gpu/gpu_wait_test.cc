// Stream-side waits on a completion counter in registered host memory: the GPU holds back the
// dequantisation until a host producer (standing in for engramd) publishes rows and bumps the
// counter, eagerly and inside a CUDA graph replayed step after step with a new target each step.
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engram/engram.h"  // engram_last_error
#include "engram/gpu.h"
#include "kernels/dequant_ref.h"
#include "testkit/gpu_test_util.h"

namespace engram {
namespace {

using testing::DeviceBuffer;
using testing::RegisteredHostBuffer;
using namespace std::chrono_literals;

constexpr size_t kRow = ENGRAM_GPU_ROW_BYTES;
constexpr uint32_t kRows = 1152;  // one decode step of one rank
constexpr uint32_t kTokens = 96, kHeads = 12;
constexpr size_t kCounterOffset = 0;
constexpr size_t kTicketsOffset = 64;
constexpr size_t kRowsOffset = 4096;

// The arena stand-in: completion counter, ticket ring and row region in one registered mapping.
struct Arena {
  RegisteredHostBuffer mem{kRowsOffset + kRows * kRow};
  uint64_t* counter() const { return mem.host<uint64_t>() + kCounterOffset / 8; }
  const void* counter_d() const { return mem.device(kCounterOffset); }
  uint64_t* tickets() const { return mem.host<uint64_t>() + kTicketsOffset / 8; }
  const uint64_t* tickets_d() const { return mem.device<uint64_t>(kTicketsOffset); }
  uint8_t* rows() const { return mem.host<uint8_t>() + kRowsOffset; }
  const void* rows_d() const { return mem.device(kRowsOffset); }
  void Publish(uint64_t value) {
    std::atomic_ref<uint64_t>(*counter()).store(value, std::memory_order_release);
  }
};

std::vector<uint8_t> StepRows(uint64_t step) {
  std::vector<uint8_t> rows(kRows * kRow);
  std::mt19937_64 rng(step * 7919 + 1);
  for (auto& b : rows) b = uint8_t(rng());
  return rows;
}

std::vector<int32_t> StepMap(uint64_t step) {
  std::vector<int32_t> map(kTokens * kHeads);
  std::mt19937 rng{static_cast<uint32_t>(step)};
  for (auto& m : map) m = int32_t(rng() % kRows);
  return map;
}

// The producer: once `go` is ready, writes the step's rows into the arena, then publishes
// `value`.
std::thread Produce(Arena& arena, uint64_t step, uint64_t value, std::shared_future<void> go) {
  return std::thread([&arena, step, value, go] {
    go.wait();
    const std::vector<uint8_t> rows = StepRows(step);
    std::memcpy(arena.rows(), rows.data(), rows.size());
    arena.Publish(value);
  });
}

std::shared_future<void> Now() {
  std::promise<void> ready;
  ready.set_value();
  return ready.get_future().share();
}

void CheckStepOutput(const DeviceBuffer& out_d, uint64_t step) {
  std::vector<uint16_t> got(kTokens * kHeads * 256), want(got.size());
  CUDA_REQUIRE(cudaMemcpy(got.data(), out_d.get(), out_d.bytes(), cudaMemcpyDeviceToHost));
  const std::vector<int32_t> map = StepMap(step);
  DequantScatter(StepRows(step), kRows, map, want);
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i];
  INFO("step " << step);
  REQUIRE(mismatches == 0);
}

TEST_CASE("the stream waits on the GPU until the producer publishes", "[gpu][wait]") {
  const bool staged = GENERATE(false, true);
  INFO((staged ? "staged" : "zero-copy"));
  Arena arena;
  std::memset(arena.rows(), 0xFF, kRows * kRow);  // NaN rows: reading early would show
  arena.Publish(0);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t done;
  CUDA_REQUIRE(cudaEventCreate(&done));
  DeviceBuffer map_d(kTokens * kHeads * 4), out_d(kTokens * kHeads * 512), staging(kRows * kRow);
  const std::vector<int32_t> map = StepMap(1);
  CUDA_REQUIRE(cudaMemcpy(map_d.get(), map.data(), map_d.bytes(), cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemset(out_d.get(), 0xAB, out_d.bytes()));

  const auto s = reinterpret_cast<uintptr_t>(stream);
  uintptr_t node = 123;
  ENGRAM_REQUIRE(engram_stream_wait_value64(s, arena.counter_d(), 1, &node));
  CHECK(node == 0);  // not capturing
  ENGRAM_REQUIRE(engram_dequant_scatter(arena.rows_d(), kRows, map_d.get<int32_t>(), kTokens,
                                        kHeads, out_d.get(), staged ? staging.get() : nullptr,
                                        staging.bytes(), nullptr, s));
  CUDA_REQUIRE(cudaEventRecord(done, stream));
  // Nothing has published 1, so the stream must still wait however long this thread takes: the
  // pauses only give a wait that does not hold a chance to show (the output check catches it
  // too, as the rows are NaN until published).
  std::this_thread::sleep_for(150ms);
  CHECK(cudaEventQuery(done) == cudaErrorNotReady);  // still waiting on the counter
  arena.Publish(0);                                  // a store below the target must not release it
  std::this_thread::sleep_for(20ms);
  CHECK(cudaEventQuery(done) == cudaErrorNotReady);

  const auto released = std::chrono::steady_clock::now();
  std::thread producer = Produce(arena, 1, 1, Now());
  producer.join();
  CUDA_REQUIRE(cudaEventSynchronize(done));
  const auto latency = std::chrono::steady_clock::now() - released;
  const double latency_us = std::chrono::duration<double, std::micro>(latency).count();
  INFO("released after " << latency_us << " us");
  // The GPU's front end polls the counter: release takes microseconds. The bound is generous
  // (a thread start, a 300 KB copy and a join on a loaded CI host fit in it many times over)
  // and still fails a wait released by anything but the store, such as a timeout or a slow
  // fallback poll.
  CHECK(latency < 2s);
  CheckStepOutput(out_d, 1);
  CUDA_REQUIRE(cudaEventDestroy(done));
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

// One graph: [wait for the step's completion] -> [dequantise-scatter the arena's rows].
struct StepGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  uintptr_t wait_node = 0;
  ~StepGraph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

TEST_CASE("a captured graph replayed with a new wait value per step gives each step's rows",
          "[gpu][wait][graph]") {
  const bool staged = GENERATE(false, true);
  const bool ticket = GENERATE(false, true);
  INFO((staged ? "staged" : "zero-copy") << ", " << (ticket ? "ticket ring" : "updated node"));
  constexpr uint32_t kRing = 3;
  constexpr uint64_t kSteps = 40;
  Arena arena;
  arena.Publish(0);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto s = reinterpret_cast<uintptr_t>(stream);
  DeviceBuffer map_d(kTokens * kHeads * 4), out_d(kTokens * kHeads * 512), staging(kRows * kRow);
  DeviceBuffer step_d(sizeof(uint32_t));
  CUDA_REQUIRE(cudaMemset(step_d.get(), 0, sizeof(uint32_t)));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));

  StepGraph g;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  if (ticket) {
    ENGRAM_REQUIRE(engram_stream_wait_ticket(s, arena.counter_d(), arena.tickets_d(), kRing,
                                             step_d.get<uint32_t>()));
  } else {
    ENGRAM_REQUIRE(engram_stream_wait_value64(s, arena.counter_d(), ~uint64_t{0}, &g.wait_node));
  }
  ENGRAM_REQUIRE(engram_dequant_scatter(arena.rows_d(), kRows, map_d.get<int32_t>(), kTokens,
                                        kHeads, out_d.get(), staged ? staging.get() : nullptr,
                                        staging.bytes(), nullptr, s));
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &g.graph));
  CUDA_REQUIRE(cudaGraphInstantiate(&g.exec, g.graph, 0));
  if (!ticket) REQUIRE(g.wait_node != 0);

  cudaEvent_t done;
  CUDA_REQUIRE(cudaEventCreate(&done));
  for (uint64_t step = 1; step <= kSteps; ++step) {
    const std::vector<int32_t> map = StepMap(step);
    CUDA_REQUIRE(
        cudaMemcpyAsync(map_d.get(), map.data(), map_d.bytes(), cudaMemcpyHostToDevice, stream));
    CUDA_REQUIRE(cudaMemsetAsync(out_d.get(), 0xAB, out_d.bytes(), stream));
    if (ticket) {
      arena.tickets()[(step - 1) % kRing] = step;
    } else {
      ENGRAM_REQUIRE(
          engram_graph_set_wait_value64(reinterpret_cast<uintptr_t>(g.exec), g.wait_node, step));
    }
    CUDA_REQUIRE(cudaGraphLaunch(g.exec, stream));
    CUDA_REQUIRE(cudaEventRecord(done, stream));
    // The counter still holds step - 1: a graph that kept an old target would run now, on the
    // previous step's rows, and the output check below would catch it. Every fifth step the
    // producer holds back until the stream was seen waiting (the pause only gives a graph that
    // does not wait the time to finish early; nothing else depends on it).
    std::promise<void> go;
    const bool hold = step % 5 == 0;
    std::thread producer = Produce(arena, step, step, hold ? go.get_future().share() : Now());
    if (hold) {
      std::this_thread::sleep_for(5ms);
      CHECK(cudaEventQuery(done) == cudaErrorNotReady);
    }
    go.set_value();
    producer.join();
    CUDA_REQUIRE(cudaEventSynchronize(done));
    CheckStepOutput(out_d, step);
  }
  if (ticket) {
    uint32_t steps_seen = 0;
    CUDA_REQUIRE(cudaMemcpy(&steps_seen, step_d.get(), 4, cudaMemcpyDeviceToHost));
    CHECK(steps_seen == kSteps);
  }
  CUDA_REQUIRE(cudaEventDestroy(done));
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("wait entry points refuse bad arguments", "[gpu][wait]") {
  DeviceBuffer word(16);
  CHECK(engram_stream_wait_value64(0, nullptr, 1, nullptr) == -EINVAL);
  CHECK(engram_stream_wait_value64(0, word.get<char>() + 4, 1, nullptr) == -EINVAL);
  CHECK(std::string(engram_last_error()).find("8-byte aligned") != std::string::npos);
  CHECK(engram_graph_set_wait_value64(0, 0, 1) == -EINVAL);
  CHECK(engram_stream_wait_ticket(0, word.get(), word.get<uint64_t>(), 0, word.get<uint32_t>()) ==
        -EINVAL);
  CHECK(engram_stream_wait_ticket(0, word.get(), nullptr, 2, word.get<uint32_t>()) == -EINVAL);
}

}  // namespace
}  // namespace engram
