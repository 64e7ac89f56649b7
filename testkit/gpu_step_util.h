// A decode step driven by the GPU, as the GPU step test and benchmark build it: the hashers,
// the step's device inputs, a session whose ring belongs to the GPU, the captured step (hash,
// submit, wait, dequantise) and the host path it must equal.
#pragma once

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/gpu_hash.h"
#include "engram/gpu_submit.h"
#include "engram/hash.h"
#include "kernels/dequant_ref.h"
#include "testkit/daemon_test_util.h"
#include "testkit/gpu_test_util.h"
#include "testkit/hash_model.h"

namespace engram::testing {

// One TP4 rank of the H200 reference setup: 16 sequences x (1 + 5 speculative tokens), heads
// [6, 12): 576 rows per layer, 1,152 for the step.
inline constexpr uint32_t kSeqs = 16, kPerSeq = 6, kTokens = kSeqs * kPerSeq, kHistory = 3;
inline constexpr uint32_t kLayerIds[2] = {1, 14};

struct Hashers {
  engram_hasher* host = nullptr;
  engram_gpu_hasher* gpu = nullptr;
  uint32_t head_begin = 0, head_end = 0;
  Hashers() {
    engram_hasher_opts o;
    engram_hasher_opts_init(&o, sizeof(o));
    o.flags = ENGRAM_HASHER_COMPRESSED_ONLY;
    o.compressed_pad_id = kPadId;
    REQUIRE(engram_hasher_open(HashModel().c_str(), &o, &host) == 0);
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
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % kCompressedVocab);
    for (auto& h : history) h = static_cast<int32_t>(rng() % kCompressedVocab);
    Upload();
  }
  // The GPU hash of these inputs for `layer`, the rank's heads, into `rows_d`.
  engram_gpu_hash_args HashArgs(const Hashers& h, uint32_t layer, uint64_t* rows_d) const {
    engram_gpu_hash_args a;
    engram_gpu_hash_args_init(&a, sizeof(a));
    a.layer = layer;
    a.flags = ENGRAM_HASH_COMPRESSED_IDS;
    a.head_begin = h.head_begin;
    a.head_end = h.head_end;
    a.tokens = tokens_d.get<int32_t>();
    a.n_tokens = kTokens;
    a.n_seqs = kSeqs;
    a.seq_starts = starts_d.get<int32_t>();
    a.history = history_d.get<int32_t>();
    a.rows = rows_d;
    return a;
  }
  void Upload() {
    CUDA_REQUIRE(cudaMemcpy(tokens_d.get(), tokens.data(), kTokens * 4, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(
        cudaMemcpy(history_d.get(), history.data(), history.size() * 4, cudaMemcpyHostToDevice));
  }
};

// A session whose ring belongs to the GPU, its arena registered, and per layer the row ids and
// rows of one step inside its data region. queue_flags: ENGRAM_GPU_QUEUE_*.
struct DeviceSession {
  engram_session* session = nullptr;
  engram_gpu_registration* reg = nullptr;
  engram_gpu_queue* queue = nullptr;
  uint64_t* ids[2] = {};
  uint8_t* rows[2] = {};
  DeviceSession(const Daemon& daemon, uint32_t step_rows, uint64_t timeout_ns,
                uint32_t queue_flags = 0) {
    // 32 slots: the pieces of a fused step at its smallest piece size take up to 32.
    engram_connect_options o = daemon.Options(16 << 20, 32);
    o.flags = ENGRAM_CONNECT_DEVICE_SUBMIT;
    INFO(engram_last_error());
    REQUIRE(engram_session_open(&o, &session) == 0);
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
    qo.flags = queue_flags;
    ENGRAM_REQUIRE(engram_gpu_queue_create(session, reg, &qo, &queue));
  }
  ~DeviceSession() {
    engram_gpu_queue_destroy(queue);
    engram_gpu_unregister(reg);
    engram_session_close(session);
  }
  template <typename T>
  T* dev(const void* host) const {
    return static_cast<T*>(engram_gpu_device_ptr(reg, host));
  }
};

// How the captured step hashes both layers' row ids.
enum class StepHash {
  kOneLaunch,  // engram_gpu_hash_layers: both layers in one launch (what an engine should do)
  kPerLayer,   // engram_gpu_hash once a layer, one launch after the other
  // None: the graph leaves the GPU hash out and gathers the ids the arena holds (a benchmark's
  // measure of what hashing adds to a step; the output then follows those ids, not the tokens).
  kNone,
};

// How the captured step hashes, waits and dequantises.
struct StepOptions {
  // engram_gpu_queue_gather_dequant (one pipelined kernel) instead of engram_gpu_queue_gather
  // followed by one engram_dequant_scatter per layer.
  bool fused = false;
  uint32_t piece_rows = 0;   // fused: rows per piece (0: the library's default)
  std::vector<int32_t> map;  // slot -> row of the layer's rows; empty: the identity
  StepHash hash = StepHash::kOneLaunch;
};

// The identity map of `n` slots, or options.map.
inline std::vector<int32_t> StepMap(const StepOptions& options, uint32_t n) {
  if (!options.map.empty()) return options.map;
  std::vector<int32_t> identity(n);
  for (uint32_t i = 0; i < n; ++i) identity[i] = static_cast<int32_t>(i);
  return identity;
}

// The captured step: hash both layers into the arena, gather them, dequantise them.
struct CapturedStep {
  cudaStream_t stream{};
  cudaGraphExec_t exec{};
  DeviceBuffer map, out[2], bad{4};  // bad: slots whose index was out of range, both layers
  CapturedStep(const Hashers& h, const StepInputs& in, const DeviceSession& ds,
               const StepOptions& options = {})
      : map(kTokens * h.heads() * 4),
        out{DeviceBuffer(kTokens * h.heads() * 256 * 2),
            DeviceBuffer(kTokens * h.heads() * 256 * 2)} {
    const uint32_t step_rows = kTokens * h.heads();
    const std::vector<int32_t> slots = StepMap(options, step_rows);
    REQUIRE(slots.size() == step_rows);
    CUDA_REQUIRE(cudaMemcpy(map.get(), slots.data(), step_rows * 4, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaMemset(bad.get(), 0, 4));
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    engram_gpu_request reqs[2];
    engram_gpu_dequant dequants[2];
    cudaGraph_t graph;
    CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    int rc = 0;
    engram_gpu_hash_args hash_args[2];
    for (int l = 0; l < 2 && rc == 0; ++l) {
      hash_args[l] = in.HashArgs(h, kLayerIds[l], ds.dev<uint64_t>(ds.ids[l]));
      if (options.hash == StepHash::kPerLayer) {
        rc = engram_gpu_hash(h.gpu, &hash_args[l], reinterpret_cast<uintptr_t>(stream));
      }
      reqs[l] = {sizeof(engram_gpu_request), kLayerIds[l], 0, ds.ids[l], step_rows, ds.rows[l]};
      dequants[l] = {
          sizeof(engram_gpu_dequant), map.get<int32_t>(), kTokens, h.heads(), out[l].get(),
          bad.get<uint32_t>()};
    }
    if (rc == 0 && options.hash == StepHash::kOneLaunch) {
      const engram_gpu_hash_args* both[2] = {&hash_args[0], &hash_args[1]};
      rc = engram_gpu_hash_layers(h.gpu, both, 2, reinterpret_cast<uintptr_t>(stream));
    }
    if (rc == 0 && options.fused) {
      rc = engram_gpu_queue_gather_dequant(ds.queue, reqs, dequants, 2, options.piece_rows,
                                           reinterpret_cast<uintptr_t>(stream));
    } else if (rc == 0) {
      rc = engram_gpu_queue_gather(ds.queue, reqs, 2, reinterpret_cast<uintptr_t>(stream));
      for (int l = 0; l < 2 && rc == 0; ++l) {
        rc = engram_dequant_scatter(ds.dev<void>(ds.rows[l]), step_rows, map.get<int32_t>(),
                                    kTokens, h.heads(), out[l].get(), nullptr, 0,
                                    bad.get<uint32_t>(), reinterpret_cast<uintptr_t>(stream));
      }
    }
    CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
    INFO(engram_last_error());
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
  uint32_t BadIndices() const {
    uint32_t n = 0;
    CUDA_REQUIRE(cudaMemcpy(&n, bad.get(), 4, cudaMemcpyDeviceToHost));
    return n;
  }
};

// The host path for the same step: hash, gather through a host session, dequantise.
struct HostPath {
  engram_session* session = nullptr;
  uint64_t* ids = nullptr;
  uint8_t* rows = nullptr;
  HostPath(const Daemon& daemon, uint32_t step_rows) {
    engram_connect_options o = daemon.Options(16 << 20);
    REQUIRE(engram_session_open(&o, &session) == 0);
    REQUIRE(engram_alloc(session, step_rows * 8, reinterpret_cast<void**>(&ids)) == 0);
    REQUIRE(engram_alloc(session, step_rows * kRowBytes, reinterpret_cast<void**>(&rows)) == 0);
  }
  ~HostPath() { engram_session_close(session); }
  HostPath(const HostPath&) = delete;
  HostPath& operator=(const HostPath&) = delete;

  // Layer `layer`'s output for the step's inputs, through `options`' index map.
  std::vector<uint16_t> Step(const Hashers& h, const StepInputs& in, uint32_t layer,
                             const StepOptions& options = {}) const {
    std::vector<engram_hash_seq> seqs;
    for (uint32_t s = 0; s < kSeqs; ++s) {
      seqs.push_back({sizeof(engram_hash_seq), in.tokens.data() + s * kPerSeq, kPerSeq,
                      in.history.data() + s * kHistory, kHistory});
    }
    const uint32_t n = kTokens * h.heads();
    REQUIRE(engram_hash(h.host, layer, seqs.data(), kSeqs, h.head_begin, h.head_end,
                        ENGRAM_HASH_COMPRESSED_IDS, ids, n) == 0);
    const engram_gather_request r{
        .size = sizeof(r), .layer = layer, .rows = ids, .num_rows = n, .dest = rows};
    const int rc = engram_gather(session, &r, -1);
    INFO(engram_last_error());
    REQUIRE(rc == 0);
    std::vector<uint16_t> out(n * 256);
    DequantScatter({rows, n * kRowBytes}, n, StepMap(options, n), out);
    return out;
  }
};

inline std::vector<uint16_t> Download(const DeviceBuffer& b) {
  std::vector<uint16_t> v(b.bytes() / 2);
  CUDA_REQUIRE(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  return v;
}

// Replays `step` `replays` times with random tokens from `rng`, each replay's two layers bit for
// bit against the host path.
inline void ReplayChecked(CapturedStep& step, StepInputs& in, const Hashers& h,
                          const DeviceSession& ds, const HostPath& host, std::mt19937_64& rng,
                          int replays, const StepOptions& options = {}) {
  for (int i = 0; i < replays; ++i) {
    in.Randomise(rng);
    step.Replay();
    step.Sync();
    INFO("replay " << i);
    REQUIRE(*engram_gpu_queue_error(ds.queue) == 0);
    for (int l = 0; l < 2; ++l) {
      REQUIRE(Download(step.out[l]) == host.Step(h, in, kLayerIds[l], options));
    }
  }
}

}  // namespace engram::testing

namespace engram::testing {

// Both layers' resident tables mapped read-only from the daemon (engram_table_map_open) and
// registered with the GPU: what a step reads in place, with no request.
struct ResidentTables {
  engram_table_map* map[2] = {};
  engram_gpu_registration* reg[2] = {};
  engram_table_map_info info[2] = {};
  explicit ResidentTables(engram_session* s) {
    for (int l = 0; l < 2; ++l) {
      int rc = -EAGAIN;
      for (int tries = 0; rc == -EAGAIN && tries < 500; ++tries) {  // loading at start-up
        rc = engram_table_map_open(s, kLayerIds[l], &map[l]);
        if (rc == -EAGAIN) usleep(10'000);
      }
      const std::string why = rc == 0 ? "" : engram_last_error();
      INFO("engram_table_map_open(layer " << kLayerIds[l] << ") = " << rc << ": " << why);
      REQUIRE(rc == 0);
      info[l].size = sizeof(info[l]);
      REQUIRE(engram_get_table_map_info(map[l], &info[l]) == 0);
      INFO(engram_last_error());
      REQUIRE(engram_gpu_register(const_cast<void*>(info[l].base), info[l].map_bytes, &reg[l]) ==
              0);
    }
  }
  ~ResidentTables() {
    for (int l = 0; l < 2; ++l) {
      engram_gpu_unregister(reg[l]);
      engram_table_map_close(map[l]);
    }
  }
  // Queues the in-place step: both layers' GPU hash into ids_d in one launch, then each layer's
  // dequant-gather from its mapping into out.
  int Enqueue(const Hashers& h, const StepInputs& in, const DeviceBuffer (&ids_d)[2],
              const DeviceBuffer (&out)[2], cudaStream_t stream) const {
    const engram_gpu_hash_args a[2] = {in.HashArgs(h, kLayerIds[0], ids_d[0].get<uint64_t>()),
                                       in.HashArgs(h, kLayerIds[1], ids_d[1].get<uint64_t>())};
    const engram_gpu_hash_args* both[2] = {&a[0], &a[1]};
    int rc = engram_gpu_hash_layers(h.gpu, both, 2, reinterpret_cast<uintptr_t>(stream));
    for (int l = 0; l < 2 && rc == 0; ++l) {
      rc = engram_dequant_gather(engram_gpu_device_ptr(reg[l], info[l].base), info[l].covered_begin,
                                 info[l].covered_end - info[l].covered_begin,
                                 ids_d[l].get<uint64_t>(), kTokens, h.heads(), out[l].get(),
                                 nullptr, reinterpret_cast<uintptr_t>(stream));
    }
    return rc;
  }
  // Captures both layers' in-place steps on `stream` into an instantiated graph.
  cudaGraphExec_t Capture(const Hashers& h, const StepInputs& in, const DeviceBuffer (&ids_d)[2],
                          const DeviceBuffer (&out)[2], cudaStream_t stream) const {
    cudaGraph_t graph;
    CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const int rc = Enqueue(h, in, ids_d, out, stream);
    CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
    INFO(engram_last_error());
    REQUIRE(rc == 0);
    cudaGraphExec_t exec;
    CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    return exec;
  }
};

}  // namespace engram::testing
