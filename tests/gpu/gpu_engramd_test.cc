// The GPU path through a real engramd: rows gathered into the client's registered arena are
// dequantised on the GPU exactly as the CPU reference does; the stream waits on the session's
// completion counter while the daemon is held stopped; a captured graph replayed step after step
// follows the counter with a new target each step.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "engram/engram.h"
#include "engram/gpu.h"
#include "kernels/dequant_ref.h"
#include "testkit/daemon_test_util.h"
#include "testkit/gpu_test_util.h"

namespace engram {
namespace {

using testing::Daemon;
using testing::DeviceBuffer;
using namespace std::chrono_literals;

constexpr uint32_t kLayer = 14;
constexpr uint32_t kTokens = 96, kHeads = 12;
constexpr uint32_t kStepRows = kTokens * kHeads;  // 1,152: one decode step of one TP4 rank

// A connected session whose whole arena is registered with the GPU.
struct GpuSession {
  engram_session* session = nullptr;
  engram_gpu_registration* reg = nullptr;
  const volatile uint64_t* counter = nullptr;
  uint64_t* ids = nullptr;  // kStepRows row ids, in the data region
  uint8_t* dest = nullptr;  // kStepRows * 264 bytes, in the data region

  explicit GpuSession(const Daemon& daemon) {
    REQUIRE(daemon.alive());
    engram_connect_options options = daemon.Options(16 << 20);
    INFO("engram_session_open: " << engram_last_error());
    REQUIRE(engram_session_open(&options, &session) == 0);
    void* arena = nullptr;
    uint64_t arena_bytes = 0;
    REQUIRE(engram_arena(session, &arena, &arena_bytes) == 0);
    INFO("engram_gpu_register: " << engram_last_error());
    REQUIRE(engram_gpu_register(arena, arena_bytes, &reg) == 0);
    REQUIRE(engram_completion_counter(session, &counter) == 0);
    REQUIRE(engram_alloc(session, kStepRows * sizeof(uint64_t), reinterpret_cast<void**>(&ids)) ==
            0);
    REQUIRE(engram_alloc(session, kStepRows * kRowBytes, reinterpret_cast<void**>(&dest)) == 0);
  }
  ~GpuSession() {
    engram_gpu_unregister(reg);
    engram_session_close(session);
  }
  const void* counter_d() const {
    return engram_gpu_device_ptr(reg, const_cast<const uint64_t*>(counter));
  }
  const void* dest_d() const { return engram_gpu_device_ptr(reg, dest); }
  engram_gather_request Request() const {
    engram_gather_request request{};
    request.size = sizeof(request);
    request.layer = kLayer;
    request.rows = ids;
    request.num_rows = kStepRows;
    request.dest = dest;
    return request;
  }
};

std::vector<int32_t> StepMap(uint64_t step) {
  std::vector<int32_t> map(kTokens * kHeads);
  std::mt19937 rng{static_cast<uint32_t>(step)};
  for (auto& m : map) m = int32_t(rng() % kStepRows);
  return map;
}

// Output of the GPU equals the reference dequantisation of the checkpoint's rows `ids`.
void CheckOutput(const DeviceBuffer& out_d, const uint64_t* ids, const std::vector<int32_t>& map) {
  std::vector<uint8_t> rows(kStepRows * kRowBytes);
  for (uint32_t i = 0; i < kStepRows; ++i) {
    SyntheticRow(testing::kSeed, kLayer, ids[i], rows.data() + i * kRowBytes);
  }
  std::vector<uint16_t> want(map.size() * 256), got(want.size());
  DequantScatter(rows, kStepRows, map, want);
  CUDA_REQUIRE(cudaMemcpy(got.data(), out_d.get(), out_d.bytes(), cudaMemcpyDeviceToHost));
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i];
  REQUIRE(mismatches == 0);
}

// Waits for `event` up to `limit`; false if it did not complete.
bool EventDoneWithin(cudaEvent_t event, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cudaEventQuery(event) == cudaSuccess) return true;
    std::this_thread::sleep_for(200us);
  }
  return false;
}

TEST_CASE("rows gathered by engramd dequantise on the GPU exactly like the reference",
          "[gpu][engramd]") {
  Daemon daemon;
  GpuSession gs(daemon);
  testing::FillRows(gs.ids, kStepRows, testing::kRows, 1);
  const engram_gather_request request = gs.Request();
  INFO("engram_gather: " << engram_last_error());
  REQUIRE(engram_gather(gs.session, &request, 10'000'000'000) == 0);
  REQUIRE(testing::FirstBadRow(kLayer, gs.ids, kStepRows, gs.dest) == -1);

  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer map_d(kStepRows * 4), out_d(kStepRows * 512), staging(kStepRows * kRowBytes);
  const std::vector<int32_t> map = StepMap(1);
  CUDA_REQUIRE(cudaMemcpy(map_d.get(), map.data(), map_d.bytes(), cudaMemcpyHostToDevice));
  for (bool staged : {false, true}) {
    INFO((staged ? "staged" : "zero-copy"));
    CUDA_REQUIRE(cudaMemset(out_d.get(), 0xAB, out_d.bytes()));
    ENGRAM_REQUIRE(engram_dequant_scatter(gs.dest_d(), kStepRows, map_d.get<int32_t>(), kTokens,
                                          kHeads, out_d.get(), staged ? staging.get() : nullptr,
                                          staging.bytes(), nullptr,
                                          reinterpret_cast<uintptr_t>(stream)));
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CheckOutput(out_d, gs.ids, map);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("the stream waits on the GPU while engramd is stopped, and runs once it completes",
          "[gpu][engramd]") {
  Daemon daemon;
  GpuSession gs(daemon);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t done;
  CUDA_REQUIRE(cudaEventCreate(&done));
  DeviceBuffer map_d(kStepRows * 4), out_d(kStepRows * 512);
  const std::vector<int32_t> map = StepMap(2);
  CUDA_REQUIRE(cudaMemcpy(map_d.get(), map.data(), map_d.bytes(), cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemset(out_d.get(), 0xAB, out_d.bytes()));

  const uint64_t base = *gs.counter;
  REQUIRE(kill(daemon.pid(), SIGSTOP) == 0);
  testing::FillRows(gs.ids, kStepRows, testing::kRows, 2);
  const engram_gather_request request = gs.Request();
  uint64_t ticket = 0;
  INFO("engram_submit: " << engram_last_error());
  REQUIRE(engram_submit(gs.session, &request, &ticket) == 0);
  const auto s = reinterpret_cast<uintptr_t>(stream);
  ENGRAM_REQUIRE(engram_stream_wait_value64(s, gs.counter_d(), base + 1, nullptr));
  ENGRAM_REQUIRE(engram_dequant_scatter(gs.dest_d(), kStepRows, map_d.get<int32_t>(), kTokens,
                                        kHeads, out_d.get(), nullptr, 0, nullptr, s));
  CUDA_REQUIRE(cudaEventRecord(done, stream));
  std::this_thread::sleep_for(300ms);
  CHECK(cudaEventQuery(done) == cudaErrorNotReady);  // the GPU is parked on the counter
  CHECK(*gs.counter == base);
  REQUIRE(kill(daemon.pid(), SIGCONT) == 0);
  const bool finished = EventDoneWithin(done, 20s);
  if (!finished) {
    // Free the parked stream before failing, so the process can exit.
    *const_cast<volatile uint64_t*>(gs.counter) = base + 1;
    cudaEventSynchronize(done);
  }
  REQUIRE(finished);
  REQUIRE(engram_wait(gs.session, ticket, 5'000'000'000) == 0);
  CheckOutput(out_d, gs.ids, map);
  CUDA_REQUIRE(cudaEventDestroy(done));
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("a captured graph replayed per step waits for each step's gather from engramd",
          "[gpu][engramd][graph]") {
  Daemon daemon;
  GpuSession gs(daemon);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto s = reinterpret_cast<uintptr_t>(stream);
  DeviceBuffer map_d(kStepRows * 4), out_d(kStepRows * 512);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  uintptr_t wait_node = 0;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ENGRAM_REQUIRE(engram_stream_wait_value64(s, gs.counter_d(), 0, &wait_node));
  ENGRAM_REQUIRE(engram_dequant_scatter(gs.dest_d(), kStepRows, map_d.get<int32_t>(), kTokens,
                                        kHeads, out_d.get(), nullptr, 0, nullptr, s));
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  REQUIRE(wait_node != 0);
  cudaEvent_t done;
  CUDA_REQUIRE(cudaEventCreate(&done));

  // One request per step, so the step's rows are in place once the counter reaches the number
  // of requests this session has submitted.
  uint64_t submitted = *gs.counter;
  for (uint64_t step = 1; step <= 30; ++step) {
    INFO("step " << step);
    const bool hold_daemon = step % 10 == 0;
    if (hold_daemon) REQUIRE(kill(daemon.pid(), SIGSTOP) == 0);
    testing::FillRows(gs.ids, kStepRows, testing::kRows, 100 + step);
    const std::vector<int32_t> map = StepMap(step);
    CUDA_REQUIRE(
        cudaMemcpyAsync(map_d.get(), map.data(), map_d.bytes(), cudaMemcpyHostToDevice, stream));
    CUDA_REQUIRE(cudaMemsetAsync(out_d.get(), 0xAB, out_d.bytes(), stream));
    const engram_gather_request request = gs.Request();
    uint64_t ticket = 0;
    REQUIRE(engram_submit(gs.session, &request, &ticket) == 0);
    ++submitted;
    ENGRAM_REQUIRE(
        engram_graph_set_wait_value64(reinterpret_cast<uintptr_t>(exec), wait_node, submitted));
    CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
    CUDA_REQUIRE(cudaEventRecord(done, stream));
    if (hold_daemon) {
      std::this_thread::sleep_for(50ms);
      CHECK(cudaEventQuery(done) == cudaErrorNotReady);
      REQUIRE(kill(daemon.pid(), SIGCONT) == 0);
    }
    const bool finished = EventDoneWithin(done, 20s);
    if (!finished) {
      *const_cast<volatile uint64_t*>(gs.counter) = submitted;
      cudaEventSynchronize(done);
    }
    REQUIRE(finished);
    REQUIRE(engram_wait(gs.session, ticket, 5'000'000'000) == 0);
    CheckOutput(out_d, gs.ids, map);
  }
  CUDA_REQUIRE(cudaEventDestroy(done));
  CUDA_REQUIRE(cudaGraphExecDestroy(exec));
  CUDA_REQUIRE(cudaGraphDestroy(graph));
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace engram
