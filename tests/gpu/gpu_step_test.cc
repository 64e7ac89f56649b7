// A whole decode step driven by the GPU against a real engramd: hash the step's tokens on the
// GPU straight into the session's arena, publish the gather requests from a kernel, wait for
// them on the GPU, dequantise both layers; captured once in a CUDA graph and replayed with new
// tokens, every replay bit-exact with the host path (engram_hash + engram_gather + the CPU
// dequantisation reference). Also: what the step does when the daemon is gone.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engram/protocol.h"
#include "tests/gpu/gpu_step_util.h"

namespace engram {
namespace {

using testing::Daemon;
using testing::DeviceBuffer;

using testing::CapturedStep;
using testing::Daemon;
using testing::DeviceSession;
using testing::Download;
using testing::Hashers;
using testing::HostStep;
using testing::kLayerIds;
using testing::kTokens;
using testing::StepInputs;

}  // namespace

TEST_CASE("a captured GPU step (hash, submit, wait, dequantise) replays bit-exact") {
  Daemon daemon({}, "gpu-step", testing::HashModel());
  REQUIRE(daemon.alive());
  Hashers h;
  StepInputs in;
  DeviceSession ds(daemon, kTokens * h.heads(), 2'000'000'000);
  CapturedStep step(h, in, ds);

  engram_connect_options o = daemon.Options(16 << 20);
  engram_session* host = nullptr;
  REQUIRE(engram_connect(&o, &host) == 0);
  uint64_t* ids = nullptr;
  uint8_t* rows = nullptr;
  const uint32_t n = kTokens * h.heads();
  REQUIRE(engram_alloc(host, n * 8, reinterpret_cast<void**>(&ids)) == 0);
  REQUIRE(engram_alloc(host, n * kRowBytes, reinterpret_cast<void**>(&rows)) == 0);

  // Host submissions on a device session are refused rather than racing the GPU on the ring.
  uint64_t ticket = 0;
  CHECK(engram_submit_nop(ds.session, &ticket) == -EBUSY);

  const char* env = std::getenv("ENGRAM_GPU_STEP_REPLAYS");
  const int replays = env != nullptr ? std::atoi(env) : 10000;
  std::mt19937_64 rng(1130);
  for (int i = 0; i < replays; ++i) {
    in.Randomise(rng);
    step.Replay();
    step.Sync();
    INFO("replay " << i);
    REQUIRE(*engram_gpu_queue_error(ds.queue) == 0);
    for (int l = 0; l < 2; ++l) {
      REQUIRE(Download(step.out[l]) == HostStep(h, host, ids, rows, in, kLayerIds[l]));
    }
  }
  uint64_t steps = 0;
  ENGRAM_REQUIRE(engram_gpu_queue_steps(ds.queue, &steps));
  CHECK(steps == static_cast<uint64_t>(replays));

  // GPU time of a step with nothing on the host between replays (reported, not asserted: the
  // benchmark in bench/gpu measures it against the host-driven step).
  cudaEvent_t t0, t1;
  CUDA_REQUIRE(cudaEventCreate(&t0));
  CUDA_REQUIRE(cudaEventCreate(&t1));
  CUDA_REQUIRE(cudaEventRecord(t0, step.stream));
  for (int i = 0; i < 1000; ++i) step.Replay();
  CUDA_REQUIRE(cudaEventRecord(t1, step.stream));
  step.Sync();
  float ms = 0;
  CUDA_REQUIRE(cudaEventElapsedTime(&ms, t0, t1));
  WARN("captured step, 2 layers x " << n << " rows: " << ms << " us per step (1,000 replays)");
  CHECK(*engram_gpu_queue_error(ds.queue) == 0);
  engram_close(host);
}

TEST_CASE("a captured step reads resident tables in place, bit-exact, with no request") {
  Daemon daemon({"--tier", "1=resident", "--tier", "14=resident"}, "gpu-step-resident",
                testing::HashModel());
  REQUIRE(daemon.alive());
  Hashers h;
  StepInputs in;
  engram_connect_options o = daemon.Options(16 << 20);
  engram_session* host = nullptr;
  REQUIRE(engram_connect(&o, &host) == 0);
  const uint32_t n = kTokens * h.heads();
  uint64_t* ids = nullptr;
  uint8_t* rows = nullptr;
  REQUIRE(engram_alloc(host, n * 8, reinterpret_cast<void**>(&ids)) == 0);
  REQUIRE(engram_alloc(host, n * kRowBytes, reinterpret_cast<void**>(&rows)) == 0);
  testing::ResidentTables resident(host);
  DeviceBuffer ids_d[2] = {DeviceBuffer(n * 8), DeviceBuffer(n * 8)};
  DeviceBuffer out[2] = {DeviceBuffer(n * 512), DeviceBuffer(n * 512)};
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraphExec_t exec = resident.Capture(h, in, ids_d, out, stream);
  std::mt19937_64 rng(31);
  for (int replay = 0; replay < 1000; ++replay) {
    in.Randomise(rng);
    CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    INFO("replay " << replay);
    for (int l = 0; l < 2; ++l) {
      REQUIRE(Download(out[l]) == HostStep(h, host, ids, rows, in, kLayerIds[l]));
    }
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
  engram_close(host);
}

TEST_CASE("a GPU step whose daemon is gone fails within its deadline and says so") {
  Hashers h;
  StepInputs in;
  std::mt19937_64 rng(5);
  for (int sig : {SIGKILL, SIGTERM}) {
    Daemon daemon({}, "gpu-step-gone", testing::HashModel());
    REQUIRE(daemon.alive());
    DeviceSession ds(daemon, kTokens * h.heads(), 300'000'000);
    CapturedStep step(h, in, ds);
    in.Randomise(rng);
    step.Replay();
    step.Sync();
    REQUIRE(*engram_gpu_queue_error(ds.queue) == 0);
    daemon.Stop(sig);
    const auto start = std::chrono::steady_clock::now();
    step.Replay();
    step.Sync();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    INFO("signal " << sig << ": the step took " << ms << " ms");
    // SIGTERM marks the arena stopped (UNAVAILABLE at once); SIGKILL leaves it to the deadline.
    const int32_t expected =
        sig == SIGTERM ? ENGRAM_STATUS_UNAVAILABLE : ENGRAM_STATUS_DEADLINE_EXCEEDED;
    CHECK(*engram_gpu_queue_error(ds.queue) == expected);
    CHECK(ms < 2000);
    // The error is sticky: the next step submits nothing and returns at once.
    const auto again = std::chrono::steady_clock::now();
    step.Replay();
    step.Sync();
    CHECK(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - again)
              .count() < 100);
    CHECK(*engram_gpu_queue_error(ds.queue) == expected);
  }
}

}  // namespace engram
