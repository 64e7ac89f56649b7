// A decode step's Engram lookups (one TP4 rank: 16 sequences x 6 tokens, heads [6, 12), both
// layers, 1,152 rows) several ways, side by side against one engramd:
//   host gather  the rows' round trip alone: host-hashed ids, engram_submit x2, engram_wait x2;
//   host step    what an engine does today: hash on the host, submit, make the stream wait on
//                the completion counter, dequantise on the GPU, synchronise;
//   GPU step     the captured graph of testkit/gpu_step_util.h: GPU hash into the arena, GPU
//                submit, GPU wait, dequantise; the host only launches it;
//   fused step   the same with engram_gpu_queue_gather_dequant: each layer's request goes out in
//                pieces of P rows and one kernel dequantises every piece as it lands (P = the
//                default, 48, 96, 288 and a whole layer), against the host gather of the same
//                pieces;
//   hash/layer,  the default pipelined step with a hash launch per layer instead of one for both
//   no hash      (engram_gpu_hash_layers), and with the GPU hash left out of the graph (it gathers
//                the ids the arena holds): what hashing adds;
//   serial,      the default pipelined step and the GPU step on a queue whose kernels are not
//   serial GPU   launched after-prior (ENGRAM_GPU_QUEUE_NO_OVERLAP): what the overlap saves;
//   paired       rounds of host hash + host gather of the default pieces, the pipelined step
//                and its serial twin, one after another with the same tokens: the differences
//                round by round, without the daemon's drift between parts of the run;
//   (and the host step and every GPU step again, watched from the host: when the requests are
//    published, when their rows are in the arena, and how long the stream takes after that)
//   in place     a captured graph of GPU hash + engram_dequant_gather reading the rows in place
//                from each layer's resident table, mapped read-only from engramd
//                (engram_table_map_open) and registered: no daemon request at all.
// Prints p50/p99 wall time per step, the host thread's time per step, and the ratios, and for the
// captured steps their time on the GPU (CUDA events around the graph, without the host's launch
// call and stream wait); checks that the two steps' outputs agree. Needs $ENGRAMD (the bundle's
// run.sh --bench sets it).
// Usage: [ENGRAM_BENCH_STEPS=N] gpu_step_bench   (N steps per method after 200 of warm-up; 2000)
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
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
using testing::kHistory;
using testing::kLayerIds;
using testing::kPerSeq;
using testing::kSeqs;
using testing::kTokens;
using testing::StepInputs;
using Clock = std::chrono::steady_clock;

struct Stats {
  double p50 = 0, p99 = 0, host_us = 0;
};

Stats Summarise(std::vector<double> wall_us, double host_total_us) {
  std::sort(wall_us.begin(), wall_us.end());
  return {wall_us[wall_us.size() / 2], wall_us[wall_us.size() * 99 / 100],
          host_total_us / wall_us.size()};
}

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

int Steps() {
  const char* env = std::getenv("ENGRAM_BENCH_STEPS");
  return env != nullptr ? std::max(100, std::atoi(env)) : 2000;
}

// The host path's session: row ids and rows per layer in its arena, the arena registered.
struct HostSession {
  engram_session* s = nullptr;
  engram_gpu_registration* reg = nullptr;
  const volatile uint64_t* counter = nullptr;
  uint64_t* ids[2] = {};
  uint8_t* rows[2] = {};
  explicit HostSession(const Daemon& daemon, uint32_t n) {
    engram_connect_options o = daemon.Options(16 << 20);
    REQUIRE(engram_session_open(&o, &s) == 0);
    void* arena = nullptr;
    uint64_t bytes = 0;
    REQUIRE(engram_arena(s, &arena, &bytes) == 0);
    REQUIRE(engram_gpu_register(arena, bytes, &reg) == 0);
    REQUIRE(engram_completion_counter(s, &counter) == 0);
    for (int l = 0; l < 2; ++l) {
      REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&ids[l])) == 0);
      REQUIRE(engram_alloc(s, n * kRowBytes, reinterpret_cast<void**>(&rows[l])) == 0);
    }
  }
  ~HostSession() {
    engram_gpu_unregister(reg);
    engram_session_close(s);
  }
  // Hashes the step's tokens for both layers into the arena.
  void Hash(const Hashers& h, const StepInputs& in) {
    std::vector<engram_hash_seq> seqs;
    for (uint32_t q = 0; q < kSeqs; ++q) {
      seqs.push_back({sizeof(engram_hash_seq), in.tokens.data() + q * kPerSeq, kPerSeq,
                      in.history.data() + q * kHistory, kHistory});
    }
    const uint32_t n = kTokens * h.heads();
    for (int l = 0; l < 2; ++l) {
      REQUIRE(engram_hash(h.host, kLayerIds[l], seqs.data(), kSeqs, h.head_begin, h.head_end,
                          ENGRAM_HASH_COMPRESSED_IDS, ids[l], n) == 0);
    }
  }
  // Submits both layers' n rows, each as requests of at most piece_rows rows; returns the
  // tickets.
  std::vector<uint64_t> Submit(uint32_t n, uint32_t piece_rows) {
    std::vector<uint64_t> tickets;
    for (int l = 0; l < 2; ++l) {
      for (uint32_t first = 0; first < n; first += piece_rows) {
        engram_gather_request r{};
        r.size = sizeof(r);
        r.layer = kLayerIds[l];
        r.rows = ids[l] + first;
        r.num_rows = std::min(piece_rows, n - first);
        r.dest = rows[l] + uint64_t{first} * kRowBytes;
        tickets.push_back(0);
        REQUIRE(engram_submit(s, &r, &tickets.back()) == 0);
      }
    }
    return tickets;
  }
};

// A GPU step watched from the host: launch to the requests published, published to all
// completed, completed to the stream done, and the daemon's service time of the slowest request.
struct Watched {
  Stats publish, daemon, tail, service;
};

// One captured GPU step's results: wall time, time on the GPU's clock, and watched.
struct GpuResult {
  Stats wall, span;
  Watched watched;
};

// Rounds of host hash + gather of the default pieces, the pipelined step and its serial twin.
struct Paired {
  Stats host, fused, serial, fused_minus_host, serial_minus_host;
};

// The piece sizes the fused step is run with: the default, 48, 96, 288 and a whole layer.
constexpr int kPieceSizes = 5;

// Everything the bench measures, in the order it is measured.
struct Results {
  Stats gather, hash, gather_pieces, host_step, watched_rows, watched_gpu;
  GpuResult gpu_step;
  uint32_t piece_sizes[kPieceSizes];
  GpuResult fused[kPieceSizes];
  GpuResult per_layer, unhashed, serial, serial_gpu;
  Paired paired;
  Stats in_place;
  uint64_t resident_rows[2] = {};  // rows of each layer's resident table
};

// The state every method shares: the daemon's host session, the step's inputs and outputs, the
// stream, and the gate that holds a stream so a graph can be timed on the GPU's clock.
class StepBench {
 public:
  explicit StepBench(const Daemon& daemon)
      : n_(kTokens * h_.heads()),
        host_(daemon, n_),
        map_(n_ * 4),
        out_{DeviceBuffer(n_ * 512), DeviceBuffer(n_ * 512)} {
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    std::vector<int32_t> identity(n_);
    for (uint32_t i = 0; i < n_; ++i) identity[i] = static_cast<int32_t>(i);
    CUDA_REQUIRE(cudaMemcpy(map_.get(), identity.data(), n_ * 4, cudaMemcpyHostToDevice));
    counter_d_ = engram_gpu_device_ptr(host_.reg, const_cast<const uint64_t*>(host_.counter));
  }
  ~StepBench() {
    if (gate_ != nullptr) {
      cudaEventDestroy(span_begin_);
      cudaEventDestroy(span_end_);
      cudaFreeHost(gate_);
    }
    cudaStreamDestroy(stream_);
  }

  uint32_t n() const { return n_; }
  int steps() const { return steps_; }
  uint32_t heads() const { return h_.heads(); }

  // Host gather: the rows' round trip through engramd in requests of piece_rows rows; the host
  // hash, timed on its own, goes to *hash.
  Stats HostGather(uint32_t piece_rows, Stats* hash) {
    std::vector<double> wall, hash_us;
    for (int i = 0; i < steps_ + 200; ++i) {
      in_.Randomise(rng_);
      const auto th = Clock::now();
      host_.Hash(h_, in_);
      const auto t0 = Clock::now();
      if (i >= 200) hash_us.push_back(Us(th, t0));
      for (uint64_t t : host_.Submit(n_, piece_rows)) REQUIRE(engram_wait(host_.s, t, -1) == 0);
      if (i >= 200) wall.push_back(Us(t0, Clock::now()));
    }
    if (hash != nullptr) *hash = Summarise(hash_us, 0);
    return Summarise(wall, 0);
  }

  // Host step: hash on the host, submit, the stream waits on the counter, dequantise.
  Stats HostStep() {
    expected_ = *host_.counter;
    std::vector<double> wall;
    double host_busy = 0;
    for (int i = 0; i < steps_ + 200; ++i) {
      in_.Randomise(rng_);
      const auto t0 = Clock::now();
      std::vector<uint64_t> tickets;
      LaunchHostStep(&tickets);
      const auto t1 = Clock::now();
      CUDA_REQUIRE(cudaStreamSynchronize(stream_));
      for (uint64_t t : tickets) REQUIRE(engram_wait(host_.s, t, -1) == 0);  // frees the slots
      if (i >= 200) {
        wall.push_back(Us(t0, Clock::now()));
        host_busy += Us(t0, t1);
      }
    }
    return Summarise(wall, host_busy);
  }

  // The host step again, its host thread watching the counter after the launch: when the rows
  // are in the arena (the daemon's part, *rows) and how long the stream takes after that (the
  // GPU's, *gpu). Its last output is what every GPU step must reproduce.
  void WatchedHostStep(Stats* rows, Stats* gpu) {
    std::vector<double> until_rows, after_rows;
    for (int i = 0; i < steps_ + 200; ++i) {
      in_.Randomise(rng_);
      const auto t0 = Clock::now();
      std::vector<uint64_t> tickets;
      LaunchHostStep(&tickets);
      while (__atomic_load_n(host_.counter, __ATOMIC_ACQUIRE) < expected_) {
      }
      const auto t1 = Clock::now();
      CUDA_REQUIRE(cudaStreamSynchronize(stream_));
      const auto t2 = Clock::now();
      for (uint64_t t : tickets) REQUIRE(engram_wait(host_.s, t, -1) == 0);
      if (i >= 200) {
        until_rows.push_back(Us(t0, t1));
        after_rows.push_back(Us(t1, t2));
      }
    }
    *rows = Summarise(until_rows, 0);
    *gpu = Summarise(after_rows, 0);
    host_out_ = Download(out_[1]);
    last_tokens_ = in_.tokens;
    last_history_ = in_.history;
  }

  // GPU steps: a captured graph; the host writes the step's tokens (as a sampler kernel would)
  // and launches it. Its output for the host step's last tokens must agree with the host
  // step's bit for bit.
  GpuResult GpuStep(const testing::StepOptions& options, const DeviceSession& session) {
    struct engram_device_ring ring {};
    ring.size = sizeof(ring);
    REQUIRE(engram_device_ring(session.session, &ring) == 0);
    CapturedStep step(h_, in_, session, options);
    GpuResult r;
    r.wall = TimeReplays(step);
    std::vector<double> gpu_us;
    for (int i = 0; i < steps_ / 2 + 100; ++i) {
      in_.Randomise(rng_);
      const double us = ReplayOnGpuClock(step);
      if (i >= 100) gpu_us.push_back(us);
    }
    r.span = Summarise(gpu_us, 0);
    const uint32_t per_layer =
        options.fused
            ? (options.piece_rows == 0 ? ENGRAM_GPU_PIECE_ROWS_DEFAULT : options.piece_rows)
            : n_;
    r.watched = Watch(step, ring, 2 * ((n_ + per_layer - 1) / per_layer));
    REQUIRE(*engram_gpu_queue_error(session.queue) == 0);
    RestoreLastTokens();
    step.Replay();
    step.Sync();
    if (options.hash != testing::StepHash::kNone) REQUIRE(Download(step.out[1]) == host_out_);
    return r;
  }

  // The +15 us comparison with the daemon's drift taken out: each round runs the host's hash
  // and gather of the default pieces, the default pipelined step and the same without
  // overlapped launches (both on the GPU's clock), one right after the other, with the same
  // tokens; the differences are taken round by round.
  Paired PairedRounds(const DeviceSession& ds, const DeviceSession& serial_ds) {
    std::vector<double> host, fused, serial, fused_minus_host, serial_minus_host;
    const testing::StepOptions pipelined{.fused = true};
    CapturedStep fused_step(h_, in_, ds, pipelined), serial_step(h_, in_, serial_ds, pipelined);
    for (int i = 0; i < steps_ + 100; ++i) {
      in_.Randomise(rng_);
      const auto t0 = Clock::now();
      host_.Hash(h_, in_);
      for (uint64_t t : host_.Submit(n_, ENGRAM_GPU_PIECE_ROWS_DEFAULT)) {
        REQUIRE(engram_wait(host_.s, t, -1) == 0);
      }
      const double host_us = Us(t0, Clock::now());
      // Alternate which GPU step goes first, so that neither always follows the host's gather.
      double fused_us, serial_us;
      if (i % 2 == 0) {
        fused_us = ReplayOnGpuClock(fused_step);
        serial_us = ReplayOnGpuClock(serial_step);
      } else {
        serial_us = ReplayOnGpuClock(serial_step);
        fused_us = ReplayOnGpuClock(fused_step);
      }
      if (i >= 100) {
        host.push_back(host_us);
        fused.push_back(fused_us);
        serial.push_back(serial_us);
        fused_minus_host.push_back(fused_us - host_us);
        serial_minus_host.push_back(serial_us - host_us);
      }
    }
    REQUIRE(*engram_gpu_queue_error(ds.queue) == 0);
    REQUIRE(*engram_gpu_queue_error(serial_ds.queue) == 0);
    // Differences can be negative: Summarise sorts them like any sample.
    return {Summarise(host, 0), Summarise(fused, 0), Summarise(serial, 0),
            Summarise(fused_minus_host, 0), Summarise(serial_minus_host, 0)};
  }

  // In place: both layers' resident tables, mapped read-only from engramd and registered; the
  // graph is GPU hash + dequant-gather from the mappings, with no request. The tables' rows go
  // to resident_rows.
  Stats InPlace(uint64_t (&resident_rows)[2]) {
    Daemon resident_daemon({"--tier", "1=resident", "--tier", "14=resident"},
                           "gpu-step-bench-resident", testing::HashModel());
    REQUIRE(resident_daemon.alive());
    engram_connect_options ro = resident_daemon.Options(1 << 20);
    engram_session* resident_session = nullptr;
    REQUIRE(engram_session_open(&ro, &resident_session) == 0);
    Stats in_place;
    {
      testing::ResidentTables resident(resident_session);
      for (int l = 0; l < 2; ++l) {
        resident_rows[l] = resident.info[l].covered_end - resident.info[l].covered_begin;
      }
      DeviceBuffer ids_d[2] = {DeviceBuffer(n_ * 8), DeviceBuffer(n_ * 8)};
      cudaGraphExec_t inplace_exec = resident.Capture(h_, in_, ids_d, out_, stream_);
      in_place = TimeGraph(inplace_exec);
      RestoreLastTokens();
      CUDA_REQUIRE(cudaGraphLaunch(inplace_exec, stream_));
      CUDA_REQUIRE(cudaStreamSynchronize(stream_));
      REQUIRE(Download(out_[1]) == host_out_);
      cudaGraphExecDestroy(inplace_exec);
    }
    engram_session_close(resident_session);
    return in_place;
  }

 private:
  // Hash on the host, submit both layers, and queue the stream's wait and the dequantisation.
  void LaunchHostStep(std::vector<uint64_t>* tickets) {
    host_.Hash(h_, in_);
    *tickets = host_.Submit(n_, n_);
    expected_ += tickets->size();
    ENGRAM_REQUIRE(engram_stream_wait_value64(reinterpret_cast<uintptr_t>(stream_), counter_d_,
                                              expected_, nullptr));
    for (int l = 0; l < 2; ++l) {
      ENGRAM_REQUIRE(engram_dequant_scatter(
          engram_gpu_device_ptr(host_.reg, host_.rows[l]), n_, map_.get<int32_t>(), kTokens,
          h_.heads(), out_[l].get(), nullptr, 0, nullptr, reinterpret_cast<uintptr_t>(stream_)));
    }
  }

  // Wall time of replays of step, and the host's time launching them.
  Stats TimeReplays(CapturedStep& step) {
    std::vector<double> wall;
    double busy = 0;
    for (int i = 0; i < steps_ + 200; ++i) {
      in_.Randomise(rng_);  // new tokens in the device buffers, as the sampler leaves them
      const auto t0 = Clock::now();
      step.Replay();
      const auto t1 = Clock::now();
      step.Sync();
      if (i >= 200) {
        wall.push_back(Us(t0, Clock::now()));
        busy += Us(t0, t1);
      }
    }
    return Summarise(wall, busy);
  }

  // Wall time of launches of a graph on the bench's stream, and the host's time launching them.
  Stats TimeGraph(cudaGraphExec_t exec) {
    std::vector<double> wall;
    double host_busy = 0;
    for (int i = 0; i < steps_ + 200; ++i) {
      in_.Randomise(rng_);
      const auto t0 = Clock::now();
      CUDA_REQUIRE(cudaGraphLaunch(exec, stream_));
      const auto t1 = Clock::now();
      CUDA_REQUIRE(cudaStreamSynchronize(stream_));
      if (i >= 200) {
        wall.push_back(Us(t0, Clock::now()));
        host_busy += Us(t0, t1);
      }
    }
    return Summarise(wall, host_busy);
  }

  // Watched from the host: when the GPU publishes the step's requests (the ring's tail moves),
  // when the daemon has completed them all, and when the stream is done; with the daemon's own
  // service time of the slowest request (its status slot).
  Watched Watch(CapturedStep& step, const struct engram_device_ring& ring, uint32_t requests) {
    std::vector<double> publish, daemon_us, tail, service;
    for (int i = 0; i < steps_ / 2 + 100; ++i) {
      in_.Randomise(rng_);
      const uint32_t tail_before = __atomic_load_n(&ring.header->sq_tail, __ATOMIC_ACQUIRE);
      const uint64_t done_before = __atomic_load_n(&ring.header->completions, __ATOMIC_ACQUIRE);
      const auto t0 = Clock::now();
      step.Replay();
      while (__atomic_load_n(&ring.header->sq_tail, __ATOMIC_ACQUIRE) == tail_before) {
      }
      const auto t1 = Clock::now();
      while (__atomic_load_n(&ring.header->completions, __ATOMIC_ACQUIRE) <
             done_before + requests) {
      }
      const auto t2 = Clock::now();
      step.Sync();
      const auto t3 = Clock::now();
      uint64_t slowest = 0;
      for (uint32_t r = 0; r < requests; ++r) {
        slowest = std::max(slowest, ring.status[r].service_ns);
      }
      if (i >= 100) {
        publish.push_back(Us(t0, t1));
        daemon_us.push_back(Us(t1, t2));
        tail.push_back(Us(t2, t3));
        service.push_back(slowest / 1000.0);
      }
    }
    return {Summarise(publish, 0), Summarise(daemon_us, 0), Summarise(tail, 0),
            Summarise(service, 0)};
  }

  // One replay of `step` timed on the GPU's clock, in µs. The stream waits on a host word (the
  // gate), records an event, runs the graph and records another; the host opens the gate once
  // all of it is queued, so the first event is taken just before the graph starts, without the
  // host's launch call, and the second when its last node is done, without the host's wait for
  // the stream.
  double ReplayOnGpuClock(CapturedStep& step) {
    if (gate_ == nullptr) CreateGate();
    const uint64_t open = __atomic_load_n(gate_, __ATOMIC_RELAXED) + 1;
    {
      // Opened however this block is left: a failed check must not leave the stream held.
      struct OpenGate {
        uint64_t* word;
        uint64_t value;
        ~OpenGate() { __atomic_store_n(word, value, __ATOMIC_RELEASE); }
      } opens{gate_, open};
      ENGRAM_REQUIRE(engram_stream_wait_value64(reinterpret_cast<uintptr_t>(step.stream), gate_d_,
                                                open, nullptr));
      CUDA_REQUIRE(cudaEventRecord(span_begin_, step.stream));
      step.Replay();
      CUDA_REQUIRE(cudaEventRecord(span_end_, step.stream));
    }
    step.Sync();
    float ms = 0;
    CUDA_REQUIRE(cudaEventElapsedTime(&ms, span_begin_, span_end_));
    return ms * 1000.0;
  }

  void CreateGate() {
    CUDA_REQUIRE(
        cudaHostAlloc(reinterpret_cast<void**>(&gate_), sizeof(uint64_t), cudaHostAllocMapped));
    *gate_ = 0;
    CUDA_REQUIRE(cudaHostGetDevicePointer(&gate_d_, gate_, 0));
    CUDA_REQUIRE(cudaEventCreate(&span_begin_));
    CUDA_REQUIRE(cudaEventCreate(&span_end_));
  }

  // The device buffers hold the watched host step's last tokens again.
  void RestoreLastTokens() {
    in_.tokens = last_tokens_;
    in_.history = last_history_;
    in_.Upload();
  }

  Hashers h_;
  StepInputs in_;
  const uint32_t n_;
  const int steps_ = Steps();
  std::mt19937_64 rng_{2026};
  HostSession host_;
  cudaStream_t stream_;
  DeviceBuffer map_, out_[2];
  const void* counter_d_ = nullptr;
  uint64_t expected_ = 0;           // the counter value the host step waits for
  std::vector<uint16_t> host_out_;  // the watched host step's last output
  std::vector<int32_t> last_tokens_, last_history_;
  uint64_t* gate_ = nullptr;
  void* gate_d_ = nullptr;
  cudaEvent_t span_begin_, span_end_;
};

// Every method in turn, on the same daemon and the same stream of random tokens.
void Measure(const Daemon& daemon, StepBench& b, Results& r) {
  r.gather = b.HostGather(b.n(), &r.hash);
  r.gather_pieces = b.HostGather(ENGRAM_GPU_PIECE_ROWS_DEFAULT, nullptr);
  r.host_step = b.HostStep();
  b.WatchedHostStep(&r.watched_rows, &r.watched_gpu);

  DeviceSession ds(daemon, b.n(), 2'000'000'000);
  // The same steps with the queue's kernels launched one after the other, each once the kernel
  // ahead of it has finished: what the overlapped launches save.
  DeviceSession serial_ds(daemon, b.n(), 2'000'000'000, ENGRAM_GPU_QUEUE_NO_OVERLAP);
  r.gpu_step = b.GpuStep({}, ds);
  const uint32_t piece_sizes[kPieceSizes] = {ENGRAM_GPU_PIECE_ROWS_DEFAULT, 48, 96, 288, b.n()};
  for (int i = 0; i < kPieceSizes; ++i) {
    r.piece_sizes[i] = piece_sizes[i];
    r.fused[i] = b.GpuStep({.fused = true, .piece_rows = piece_sizes[i]}, ds);
  }
  // The default pipelined step with each layer hashed by a launch of its own, and without the
  // GPU hash (the ids the arena holds are gathered again): what hashing adds before the requests
  // go out, and what hashing both layers in one launch saves.
  r.per_layer = b.GpuStep({.fused = true, .hash = testing::StepHash::kPerLayer}, ds);
  r.unhashed = b.GpuStep({.fused = true, .hash = testing::StepHash::kNone}, ds);
  r.serial = b.GpuStep({.fused = true}, serial_ds);
  r.serial_gpu = b.GpuStep({}, serial_ds);
  r.paired = b.PairedRounds(ds, serial_ds);
  r.in_place = b.InPlace(r.resident_rows);
}

void PrintWallTimes(const StepBench& b, const Results& r) {
  std::printf(
      "\ndecode step, TP4 rank 1: %u sequences x %u tokens, %u heads, 2 layers = %u rows; "
      "%d steps each, back to back\n",
      kSeqs, kPerSeq, b.heads(), 2 * b.n(), b.steps());
  std::printf("%-13s %10s %10s %16s\n", "method", "p50 us", "p99 us", "host us/step");
  std::printf("%-13s %10.1f %10.1f %16s\n", "host gather", r.gather.p50, r.gather.p99, "(all)");
  std::printf("%-13s %10.1f %10.1f %16.1f\n", "host step", r.host_step.p50, r.host_step.p99,
              r.host_step.host_us);
  std::printf("%-13s %10.1f %10.1f %16.1f\n", "GPU step", r.gpu_step.wall.p50, r.gpu_step.wall.p99,
              r.gpu_step.wall.host_us);
  for (int i = 0; i < kPieceSizes; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "fused/%u", r.piece_sizes[i]);
    std::printf("%-13s %10.1f %10.1f %16.1f   (pieces of %u rows)\n", name, r.fused[i].wall.p50,
                r.fused[i].wall.p99, r.fused[i].wall.host_us, r.piece_sizes[i]);
  }
  std::printf("%-13s %10.1f %10.1f %16s   (requests of %u rows)\n", "host gather/p",
              r.gather_pieces.p50, r.gather_pieces.p99, "(all)", ENGRAM_GPU_PIECE_ROWS_DEFAULT);
  std::printf("%-13s %10.1f %10.1f %16.1f   (resident tables of %llu + %llu rows, mapped)\n",
              "in place", r.in_place.p50, r.in_place.p99, r.in_place.host_us,
              static_cast<unsigned long long>(r.resident_rows[0]),
              static_cast<unsigned long long>(r.resident_rows[1]));
  const Stats& gpu = r.gpu_step.wall;
  std::printf("GPU step / host step: p50 %.2fx, p99 %.2fx; GPU step - host gather: p50 %+.1f us\n",
              gpu.p50 / r.host_step.p50, gpu.p99 / r.host_step.p99, gpu.p50 - r.gather.p50);
  std::printf(
      "fused step - host gather of the same requests: p50 %+.1f us (pieces of %u), %+.1f us "
      "(one request a layer); fused step (default pieces) / host step: p50 %.2fx, p99 %.2fx\n",
      r.fused[0].wall.p50 - r.gather_pieces.p50, ENGRAM_GPU_PIECE_ROWS_DEFAULT,
      r.fused[kPieceSizes - 1].wall.p50 - r.gather.p50, r.fused[0].wall.p50 / r.host_step.p50,
      r.fused[0].wall.p99 / r.host_step.p99);
  std::printf(
      "host hash alone: p50 %.1f us; host step watched from the host: hash, submit and launch to "
      "the rows in the arena p50 %.1f us (p99 %.1f), from there to the stream done p50 %.1f us "
      "(p99 %.1f)\n",
      r.hash.p50, r.watched_rows.p50, r.watched_rows.p99, r.watched_gpu.p50, r.watched_gpu.p99);
}

void PrintWatched(const Results& r) {
  std::printf(
      "GPU steps watched from the host, p50 (p99) us: launch to the requests published | "
      "published to all completed | completed to the stream done | the daemon's service time "
      "of the slowest request\n");
  auto print_watched = [](const char* name, const Watched& w) {
    std::printf("  %-11s %6.1f (%6.1f) | %6.1f (%6.1f) | %6.1f (%6.1f) | %6.1f (%6.1f)\n", name,
                w.publish.p50, w.publish.p99, w.daemon.p50, w.daemon.p99, w.tail.p50, w.tail.p99,
                w.service.p50, w.service.p99);
  };
  print_watched("GPU step", r.gpu_step.watched);
  for (int i = 0; i < kPieceSizes; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "fused/%u", r.piece_sizes[i]);
    print_watched(name, r.fused[i].watched);
  }
  print_watched("hash/layer", r.per_layer.watched);
  print_watched("no hash", r.unhashed.watched);
  print_watched("serial", r.serial.watched);
  print_watched("serial GPU", r.serial_gpu.watched);
}

void PrintGpuSpans(const StepBench& b, const Results& r) {
  std::printf(
      "GPU steps' time on the GPU (CUDA events just before and after the graph, the stream "
      "held until both were queued), p50 (p99) us:\n");
  std::printf("  %-11s %6.1f (%6.1f)\n", "GPU step", r.gpu_step.span.p50, r.gpu_step.span.p99);
  for (int i = 0; i < kPieceSizes; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "fused/%u", r.piece_sizes[i]);
    std::printf("  %-11s %6.1f (%6.1f)\n", name, r.fused[i].span.p50, r.fused[i].span.p99);
  }
  std::printf(
      "  %-11s %6.1f (%6.1f)   (fused/%u, a hash launch per layer; wall p50 %.1f, p99 %.1f)\n",
      "hash/layer", r.per_layer.span.p50, r.per_layer.span.p99, ENGRAM_GPU_PIECE_ROWS_DEFAULT,
      r.per_layer.wall.p50, r.per_layer.wall.p99);
  std::printf("  %-11s %6.1f (%6.1f)   (fused/%u without the GPU hash; wall p50 %.1f, p99 %.1f)\n",
              "no hash", r.unhashed.span.p50, r.unhashed.span.p99, ENGRAM_GPU_PIECE_ROWS_DEFAULT,
              r.unhashed.wall.p50, r.unhashed.wall.p99);
  std::printf(
      "  %-11s %6.1f (%6.1f)   (fused/%u, the queue's kernels not overlapped; wall p50 %.1f, p99 "
      "%.1f)\n",
      "serial", r.serial.span.p50, r.serial.span.p99, ENGRAM_GPU_PIECE_ROWS_DEFAULT,
      r.serial.wall.p50, r.serial.wall.p99);
  std::printf(
      "  %-11s %6.1f (%6.1f)   (GPU step, the queue's kernels not overlapped; wall p50 %.1f, p99 "
      "%.1f)\n",
      "serial GPU", r.serial_gpu.span.p50, r.serial_gpu.span.p99, r.serial_gpu.wall.p50,
      r.serial_gpu.wall.p99);
  std::printf(
      "fused step (default pieces) on the GPU - host hash and gather of the same requests: p50 "
      "%+.1f us (%.1f - %.1f - %.1f)\n",
      r.fused[0].span.p50 - r.hash.p50 - r.gather_pieces.p50, r.fused[0].span.p50, r.hash.p50,
      r.gather_pieces.p50);
  const Paired& p = r.paired;
  std::printf(
      "paired rounds (%d): host hash + gather of the same pieces p50 %.1f (p99 %.1f) us; on the "
      "GPU: pipelined step %.1f (%.1f), not overlapped %.1f (%.1f); pipelined - host, round by "
      "round: p50 %+.1f us (p99 %+.1f); not overlapped - host: p50 %+.1f us (p99 %+.1f)\n",
      b.steps(), p.host.p50, p.host.p99, p.fused.p50, p.fused.p99, p.serial.p50, p.serial.p99,
      p.fused_minus_host.p50, p.fused_minus_host.p99, p.serial_minus_host.p50,
      p.serial_minus_host.p99);
}

}  // namespace

TEST_CASE("decode step: host-driven against GPU-driven") {
  Daemon daemon({}, "gpu-step-bench", testing::HashModel());
  REQUIRE(daemon.alive());
  StepBench bench(daemon);
  Results results;
  Measure(daemon, bench, results);
  PrintWallTimes(bench, results);
  PrintWatched(results);
  PrintGpuSpans(bench, results);
}

}  // namespace engram
