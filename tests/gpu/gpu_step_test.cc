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
#include "testkit/gpu_step_util.h"

namespace engram {
namespace {

using testing::CapturedStep;
using testing::Daemon;
using testing::DeviceBuffer;
using testing::DeviceSession;
using testing::Download;
using testing::Hashers;
using testing::HostPath;
using testing::kLayerIds;
using testing::kTokens;
using testing::ReplayChecked;
using testing::StepInputs;
using testing::StepOptions;

// Replays of the step's main case: ENGRAM_GPU_STEP_REPLAYS, or 10,000; `share` of that for each
// other case.
int Replays(int share = 1) {
  const char* env = std::getenv("ENGRAM_GPU_STEP_REPLAYS");
  return (env != nullptr ? std::atoi(env) : 10000) / share;
}

// A map that reads the layer's rows back to front, with padding and out-of-range slots: every
// slot's piece differs from the one its position would suggest.
std::vector<int32_t> ScrambledMap(uint32_t n, uint32_t* ret_bad) {
  std::vector<int32_t> map(n);
  *ret_bad = 0;
  for (uint32_t i = 0; i < n; ++i) {
    map[i] = static_cast<int32_t>(n - 1 - i);
    if (i % 97 == 5) map[i] = -1;  // padding: +0.0
    if (i % 131 == 7) {
      map[i] = static_cast<int32_t>(n + i);  // past the rows: NaN, counted
      ++*ret_bad;
    }
  }
  return map;
}

}  // namespace

TEST_CASE("a captured GPU step (hash, submit, wait, dequantise) replays bit-exact") {
  Daemon daemon({}, "gpu-step", testing::HashModel());
  REQUIRE(daemon.alive());
  Hashers h;
  StepInputs in;
  DeviceSession ds(daemon, kTokens * h.heads(), 2'000'000'000);
  CapturedStep step(h, in, ds);
  const uint32_t n = kTokens * h.heads();
  const HostPath host(daemon, n);

  // Host submissions on a device session are refused rather than racing the GPU on the ring.
  uint64_t ticket = 0;
  CHECK(engram_submit_nop(ds.session, &ticket) == -EBUSY);

  const int replays = Replays();
  std::mt19937_64 rng(1130);
  ReplayChecked(step, in, h, ds, host, rng, replays);
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
}

TEST_CASE("a fused, pipelined GPU step replays bit-exact for every piece size") {
  Daemon daemon({}, "gpu-step-fused", testing::HashModel());
  REQUIRE(daemon.alive());
  Hashers h;
  StepInputs in;
  const uint32_t n = kTokens * h.heads();
  DeviceSession ds(daemon, n, 2'000'000'000);
  const HostPath host(daemon, n);

  const int replays = Replays(5);
  std::mt19937_64 rng(1201);
  uint64_t steps_before = 0;
  // The default (4 pieces a layer), pieces of 48 rows (12 a layer, 24 in all), one piece a
  // layer, and the default again with a scrambled map (padding, bad indices, reversed order).
  uint32_t bad_per_layer = 0;
  const std::vector<int32_t> scrambled = ScrambledMap(n, &bad_per_layer);
  REQUIRE(bad_per_layer > 0);
  const StepOptions cases[] = {{true, 0, {}}, {true, 48, {}}, {true, n, {}}, {true, 0, scrambled}};
  for (const StepOptions& options : cases) {
    CapturedStep step(h, in, ds, options);
    INFO("piece rows " << options.piece_rows << (options.map.empty() ? "" : ", scrambled map"));
    ReplayChecked(step, in, h, ds, host, rng, replays, options);
    CHECK(step.BadIndices() == (options.map.empty() ? 0 : 2u * bad_per_layer * replays));
    uint64_t steps = 0;
    ENGRAM_REQUIRE(engram_gpu_queue_steps(ds.queue, &steps));
    CHECK(steps - steps_before == static_cast<uint64_t>(replays));
    steps_before = steps;
  }
}

TEST_CASE("a GPU queue launched without overlap replays bit-exact; unknown flags are refused") {
  Daemon daemon({}, "gpu-step-serial", testing::HashModel());
  REQUIRE(daemon.alive());
  Hashers h;
  StepInputs in;
  const uint32_t n = kTokens * h.heads();
  DeviceSession ds(daemon, n, 2'000'000'000, ENGRAM_GPU_QUEUE_NO_OVERLAP);
  const HostPath host(daemon, n);
  const int replays = Replays(5);
  std::mt19937_64 rng(1202);
  for (const bool fused : {false, true}) {
    INFO((fused ? "fused wait and dequantise" : "wait, then dequantise"));
    const StepOptions options{.fused = fused};
    CapturedStep step(h, in, ds, options);
    ReplayChecked(step, in, h, ds, host, rng, replays, options);
  }
  uint64_t steps = 0;
  ENGRAM_REQUIRE(engram_gpu_queue_steps(ds.queue, &steps));
  CHECK(steps == 2u * static_cast<uint64_t>(replays));

  engram_gpu_queue_options qo;
  engram_gpu_queue_options_init(&qo, sizeof(qo));
  qo.flags = 0x6;
  engram_gpu_queue* q = nullptr;
  CHECK(engram_gpu_queue_create(ds.session, ds.reg, &qo, &q) == -EINVAL);
  CHECK(q == nullptr);
  CHECK(std::string(engram_last_error()).find("unknown option flags 0x6") != std::string::npos);
}

TEST_CASE("engram_gpu_queue_gather_dequant refuses what it cannot pipeline, naming it") {
  Daemon daemon({}, "gpu-step-fused-args", testing::HashModel());
  REQUIRE(daemon.alive());
  Hashers h;
  const uint32_t n = kTokens * h.heads();
  DeviceSession ds(daemon, n, 2'000'000'000);
  DeviceBuffer map(n * 4), out(n * 512);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto s = reinterpret_cast<uintptr_t>(stream);
  engram_gpu_request r = {sizeof(engram_gpu_request), kLayerIds[0], 0, ds.ids[0], n, ds.rows[0]};
  engram_gpu_dequant d = {
      sizeof(engram_gpu_dequant), map.get<int32_t>(), kTokens, h.heads(), out.get(), nullptr};
  auto refused = [&](engram_gpu_request rr, engram_gpu_dequant dd, uint32_t piece_rows,
                     const char* says) {
    INFO("expecting: " << says);
    CHECK(engram_gpu_queue_gather_dequant(ds.queue, &rr, &dd, 1, piece_rows, s) == -EINVAL);
    const std::string error = engram_last_error();
    INFO(error);
    CHECK(error.find(says) != std::string::npos);
  };
  refused(r, d, 100, "piece_rows 100 is not a multiple of 16");
  refused(r, d, 16, "at most 32 pieces");  // 576 rows in 36 pieces
  engram_gpu_request misaligned = r;
  misaligned.dest += 8;
  misaligned.num_rows -= 1;
  refused(misaligned, d, 0, "is not 128-byte aligned");
  engram_gpu_dequant no_out = d;
  no_out.out = nullptr;
  refused(r, no_out, 0, "dequant 0: index_map");
  // An older struct of only its size field takes the defaults (zeros) for the rest: refused for
  // what the defaults leave unset, not for its size (engram.h's size policy).
  engram_gpu_dequant small = d;
  small.size = 8;
  refused(r, small, 0, "dequant 0: index_map");
  engram_gpu_request outside = r;
  outside.num_rows = 1ull << 40;
  refused(outside, d, 0, "must lie inside the session's data region");
  CHECK(engram_gpu_queue_gather_dequant(ds.queue, &r, nullptr, 1, 0, s) == -EINVAL);
  // Nothing was queued: the queue still works.
  ENGRAM_REQUIRE(engram_gpu_queue_gather_dequant(ds.queue, &r, &d, 1, 0, s));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(*engram_gpu_queue_error(ds.queue) == 0);

  // 6,000 rows in pieces of 144 would take 42 of the session's 32 slots: refused when asked
  // for, raised to fit by the default.
  constexpr uint32_t kRows = 6000;
  uint64_t* ids = nullptr;
  uint8_t* rows = nullptr;
  REQUIRE(engram_alloc(ds.session, kRows * 8, reinterpret_cast<void**>(&ids)) == 0);
  REQUIRE(engram_alloc(ds.session, kRows * kRowBytes, reinterpret_cast<void**>(&rows)) == 0);
  for (uint32_t i = 0; i < kRows; ++i) ids[i] = (i * 7919ull) % 16000;
  std::vector<int32_t> identity(kRows);
  for (uint32_t i = 0; i < kRows; ++i) identity[i] = static_cast<int32_t>(i);
  DeviceBuffer big_map(kRows * 4), big_out(kRows * 512);
  CUDA_REQUIRE(cudaMemcpy(big_map.get(), identity.data(), kRows * 4, cudaMemcpyHostToDevice));
  const engram_gpu_request big = {sizeof(engram_gpu_request), kLayerIds[0], 0, ids, kRows, rows};
  const engram_gpu_dequant big_d = {
      sizeof(engram_gpu_dequant), big_map.get<int32_t>(), kRows, 1, big_out.get(), nullptr};
  refused(big, big_d, ENGRAM_GPU_PIECE_ROWS_DEFAULT, "at most 32 pieces");
  ENGRAM_REQUIRE(engram_gpu_queue_gather_dequant(ds.queue, &big, &big_d, 1, 0, s));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CHECK(*engram_gpu_queue_error(ds.queue) == 0);
  std::vector<uint16_t> want(kRows * 256);
  DequantScatter({rows, uint64_t{kRows} * kRowBytes}, kRows, identity, want);
  CHECK(Download(big_out) == want);
  cudaStreamDestroy(stream);
}

TEST_CASE("a captured step reads resident tables in place, bit-exact, with no request") {
  Daemon daemon({"--tier", "1=resident", "--tier", "14=resident"}, "gpu-step-resident",
                testing::HashModel());
  REQUIRE(daemon.alive());
  Hashers h;
  StepInputs in;
  const uint32_t n = kTokens * h.heads();
  const HostPath host(daemon, n);
  testing::ResidentTables resident(host.session);
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
      REQUIRE(Download(out[l]) == host.Step(h, in, kLayerIds[l]));
    }
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
}

TEST_CASE("a GPU step whose daemon is gone fails within its deadline and says so") {
  Hashers h;
  StepInputs in;
  std::mt19937_64 rng(5);
  for (const bool fused : {false, true})
    for (int sig : {SIGKILL, SIGTERM}) {
      INFO((fused ? "fused wait and dequantise" : "wait, then dequantise"));
      Daemon daemon({}, "gpu-step-gone", testing::HashModel());
      REQUIRE(daemon.alive());
      DeviceSession ds(daemon, kTokens * h.heads(), 300'000'000);
      CapturedStep step(h, in, ds, {.fused = fused});
      in.Randomise(rng);
      step.Replay();
      step.Sync();
      REQUIRE(*engram_gpu_queue_error(ds.queue) == 0);
      daemon.Stop(sig);
      const auto start = std::chrono::steady_clock::now();
      step.Replay();
      step.Sync();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
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
