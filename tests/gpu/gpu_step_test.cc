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

#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/gpu_hash.h"
#include "engram/gpu_submit.h"
#include "engram/hash.h"
#include "engram/protocol.h"
#include "kernels/dequant_ref.h"
#include "tests/common/daemon_test_util.h"
#include "tests/common/hash_model.h"
#include "tests/gpu/gpu_test_util.h"

namespace engram {
namespace {

using testing::Daemon;
using testing::DeviceBuffer;

// One TP4 rank of the H200 reference setup: 16 sequences x (1 + 5 speculative tokens), heads
// [6, 12): 576 rows per layer, 1,152 for the step.
constexpr uint32_t kSeqs = 16, kPerSeq = 6, kTokens = kSeqs * kPerSeq, kHistory = 3;
constexpr uint32_t kLayerIds[2] = {1, 14};

struct Hashers {
  engram_hasher* host = nullptr;
  engram_gpu_hasher* gpu = nullptr;
  uint32_t head_begin = 0, head_end = 0;
  Hashers() {
    engram_hasher_opts o;
    engram_hasher_opts_init(&o);
    o.flags = ENGRAM_HASHER_COMPRESSED_ONLY;
    o.compressed_pad_id = testing::kPadId;
    REQUIRE(engram_hasher_open(testing::HashModel().c_str(), &o, &host) == 0);
    ENGRAM_REQUIRE(engram_gpu_hasher_create(host, &gpu));
    REQUIRE(engram_hasher_rank_heads(host, 4, 1, &head_begin, &head_end) == 0);
  }
  ~Hashers() {
    engram_gpu_hasher_destroy(gpu);
    engram_hasher_close(host);
  }
  uint32_t heads() const { return head_end - head_begin; }
};

// The step's inputs as the engine's sampler would leave them: device buffers, fixed addresses.
struct StepInputs {
  std::vector<int32_t> tokens = std::vector<int32_t>(kTokens);
  std::vector<int32_t> history = std::vector<int32_t>(kSeqs * kHistory);
  DeviceBuffer tokens_d{kTokens * 4}, starts_d{(kSeqs + 1) * 4}, history_d{kSeqs * kHistory * 4};
  StepInputs() {
    std::vector<int32_t> starts(kSeqs + 1);
    for (uint32_t s = 0; s <= kSeqs; ++s) starts[s] = static_cast<int32_t>(s * kPerSeq);
    CUDA_REQUIRE(
        cudaMemcpy(starts_d.get(), starts.data(), starts.size() * 4, cudaMemcpyHostToDevice));
  }
  void Randomise(std::mt19937_64& rng) {
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % testing::kCompressedVocab);
    for (auto& h : history) h = static_cast<int32_t>(rng() % testing::kCompressedVocab);
    CUDA_REQUIRE(cudaMemcpy(tokens_d.get(), tokens.data(), kTokens * 4, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(
        cudaMemcpy(history_d.get(), history.data(), history.size() * 4, cudaMemcpyHostToDevice));
  }
};

// A session whose ring belongs to the GPU, its arena registered, and per layer the row ids and
// rows of one step inside its data region.
struct DeviceSession {
  engram_session* session = nullptr;
  engram_gpu_registration* reg = nullptr;
  engram_gpu_queue* queue = nullptr;
  uint64_t* ids[2] = {};
  uint8_t* rows[2] = {};
  DeviceSession(const Daemon& daemon, uint32_t step_rows, uint64_t timeout_ns) {
    engram_connect_options o = daemon.Options(16 << 20, 8);
    o.flags = ENGRAM_CONNECT_DEVICE_SUBMIT;
    INFO(engram_last_error());
    REQUIRE(engram_connect(&o, &session) == 0);
    void* arena = nullptr;
    uint64_t arena_bytes = 0;
    REQUIRE(engram_arena(session, &arena, &arena_bytes) == 0);
    REQUIRE(engram_gpu_register(arena, arena_bytes, &reg) == 0);
    for (int l = 0; l < 2; ++l) {
      REQUIRE(engram_alloc(session, step_rows * 8, reinterpret_cast<void**>(&ids[l])) == 0);
      REQUIRE(engram_alloc(session, step_rows * kRowBytes, reinterpret_cast<void**>(&rows[l])) ==
              0);
    }
    engram_gpu_queue_options qo;
    engram_gpu_queue_options_init(&qo, sizeof(qo));
    qo.timeout_ns = timeout_ns;
    ENGRAM_REQUIRE(engram_gpu_queue_create(session, reg, &qo, &queue));
  }
  ~DeviceSession() {
    engram_gpu_queue_destroy(queue);
    engram_gpu_unregister(reg);
    engram_close(session);
  }
  template <typename T>
  T* dev(const void* host) const {
    return static_cast<T*>(engram_gpu_device_ptr(reg, host));
  }
};

// The captured step: hash both layers into the arena, gather them, dequantise them.
struct CapturedStep {
  cudaStream_t stream{};
  cudaGraphExec_t exec{};
  DeviceBuffer map, out[2];
  CapturedStep(const Hashers& h, const StepInputs& in, const DeviceSession& ds)
      : map(kTokens * h.heads() * 4),
        out{DeviceBuffer(kTokens * h.heads() * 256 * 2),
            DeviceBuffer(kTokens * h.heads() * 256 * 2)} {
    const uint32_t step_rows = kTokens * h.heads();
    std::vector<int32_t> identity(step_rows);
    for (uint32_t i = 0; i < step_rows; ++i) identity[i] = static_cast<int32_t>(i);
    CUDA_REQUIRE(cudaMemcpy(map.get(), identity.data(), step_rows * 4, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    engram_gpu_request reqs[2];
    cudaGraph_t graph;
    CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = 0;
    for (int l = 0; l < 2 && rc == 0; ++l) {
      engram_gpu_hash_args a;
      engram_gpu_hash_args_init(&a, sizeof(a));
      a.layer_id = kLayerIds[l];
      a.flags = ENGRAM_HASH_COMPRESSED_IDS;
      a.head_begin = h.head_begin;
      a.head_end = h.head_end;
      a.tokens = in.tokens_d.get<int32_t>();
      a.n_tokens = kTokens;
      a.n_seqs = kSeqs;
      a.seq_starts = in.starts_d.get<int32_t>();
      a.history = in.history_d.get<int32_t>();
      a.rows = ds.dev<uint64_t>(ds.ids[l]);
      rc = engram_gpu_hash(h.gpu, &a, reinterpret_cast<uintptr_t>(stream));
      reqs[l] = {sizeof(engram_gpu_request), kLayerIds[l], 0, ds.ids[l], step_rows, ds.rows[l]};
    }
    if (rc == 0) {
      rc = engram_gpu_queue_gather(ds.queue, reqs, 2, reinterpret_cast<uintptr_t>(stream));
    }
    for (int l = 0; l < 2 && rc == 0; ++l) {
      rc = engram_dequant_scatter(ds.dev<void>(ds.rows[l]), step_rows, map.get<int32_t>(), kTokens,
                                  h.heads(), out[l].get(), nullptr, 0, nullptr,
                                  reinterpret_cast<uintptr_t>(stream));
    }
    CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
    INFO(engram_kernels_last_error());
    REQUIRE(rc == 0);
    CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
  }
  ~CapturedStep() {
    cudaGraphExecDestroy(exec);
    cudaStreamDestroy(stream);
  }
  void Replay() { CUDA_REQUIRE(cudaGraphLaunch(exec, stream)); }
  void Sync() { CUDA_REQUIRE(cudaStreamSynchronize(stream)); }
};

// The host path for the same step and layer: hash, gather through a host session, dequantise.
std::vector<uint16_t> HostStep(const Hashers& h, engram_session* host, uint64_t* ids, uint8_t* rows,
                               const StepInputs& in, uint32_t layer) {
  std::vector<engram_hash_seq> seqs;
  for (uint32_t s = 0; s < kSeqs; ++s) {
    seqs.push_back({sizeof(engram_hash_seq), in.tokens.data() + s * kPerSeq, kPerSeq,
                    in.history.data() + s * kHistory, kHistory});
  }
  const uint32_t n = kTokens * h.heads();
  REQUIRE(engram_hash(h.host, layer, seqs.data(), kSeqs, h.head_begin, h.head_end,
                      ENGRAM_HASH_COMPRESSED_IDS, ids, n) == 0);
  engram_gather_request r{};
  r.size = sizeof(r);
  r.table = layer;
  r.rows = ids;
  r.num_rows = n;
  r.dest = rows;
  INFO(engram_last_error());
  REQUIRE(engram_gather(host, &r, -1) == 0);
  std::vector<int32_t> identity(n);
  for (uint32_t i = 0; i < n; ++i) identity[i] = static_cast<int32_t>(i);
  std::vector<uint16_t> out(n * 256);
  REQUIRE(DequantScatter({rows, n * kRowBytes}, n, identity, out) == 0);
  return out;
}

std::vector<uint16_t> Download(const DeviceBuffer& b) {
  std::vector<uint16_t> v(b.bytes() / 2);
  CUDA_REQUIRE(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  return v;
}

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
