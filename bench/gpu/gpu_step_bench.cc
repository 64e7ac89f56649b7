// A decode step's Engram lookups (one TP4 rank: 16 sequences x 6 tokens, heads [6, 12), both
// layers, 1,152 rows) several ways, side by side against one engramd:
//   host gather  the rows' round trip alone: host-hashed ids, engram_submit x2, engram_wait x2;
//   host step    what an engine does today: hash on the host, submit, make the stream wait on
//                the completion counter, dequantise on the GPU, synchronise;
//   GPU step     the captured graph of tests/gpu/gpu_step_util.h: GPU hash into the arena, GPU
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
//                (engram_map_table) and registered: no daemon request at all.
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
#include "tests/gpu/gpu_step_util.h"

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
    REQUIRE(engram_connect(&o, &s) == 0);
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
    engram_close(s);
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
        r.table = kLayerIds[l];
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

}  // namespace

TEST_CASE("decode step: host-driven against GPU-driven") {
  Daemon daemon({}, "gpu-step-bench", testing::HashModel());
  REQUIRE(daemon.alive());
  Hashers h;
  StepInputs in;
  const uint32_t n = kTokens * h.heads();
  const int steps = Steps();
  std::mt19937_64 rng(2026);
  HostSession host(daemon, n);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer map(n * 4), out[2] = {DeviceBuffer(n * 512), DeviceBuffer(n * 512)};
  std::vector<int32_t> identity(n);
  for (uint32_t i = 0; i < n; ++i) identity[i] = static_cast<int32_t>(i);
  CUDA_REQUIRE(cudaMemcpy(map.get(), identity.data(), n * 4, cudaMemcpyHostToDevice));

  // Host gather: the rows' round trip through engramd (the host hash timed on its own), one
  // request per layer, and in the fused step's default pieces.
  std::vector<double> wall, hash_us;
  auto host_gather = [&](uint32_t piece_rows) {
    wall.clear();
    hash_us.clear();
    for (int i = 0; i < steps + 200; ++i) {
      in.Randomise(rng);
      const auto th = Clock::now();
      host.Hash(h, in);
      const auto t0 = Clock::now();
      if (i >= 200) hash_us.push_back(Us(th, t0));
      for (uint64_t t : host.Submit(n, piece_rows)) REQUIRE(engram_wait(host.s, t, -1) == 0);
      if (i >= 200) wall.push_back(Us(t0, Clock::now()));
    }
    return Summarise(wall, 0);
  };
  const Stats gather = host_gather(n);
  const Stats hash = Summarise(hash_us, 0);
  const Stats gather_pieces = host_gather(ENGRAM_GPU_PIECE_ROWS_DEFAULT);

  // Host step: hash on the host, submit, the stream waits on the counter, dequantise.
  wall.clear();
  double host_busy = 0;
  uint64_t expected = *host.counter;
  const void* counter_d =
      engram_gpu_device_ptr(host.reg, const_cast<const uint64_t*>(host.counter));
  // Hash on the host, submit both layers, and queue the stream's wait and the dequantisation.
  auto launch_host_step = [&](std::vector<uint64_t>* tickets) {
    host.Hash(h, in);
    *tickets = host.Submit(n, n);
    expected += tickets->size();
    ENGRAM_REQUIRE(engram_stream_wait_value64(reinterpret_cast<uintptr_t>(stream), counter_d,
                                              expected, nullptr));
    for (int l = 0; l < 2; ++l) {
      ENGRAM_REQUIRE(engram_dequant_scatter(
          engram_gpu_device_ptr(host.reg, host.rows[l]), n, map.get<int32_t>(), kTokens, h.heads(),
          out[l].get(), nullptr, 0, nullptr, reinterpret_cast<uintptr_t>(stream)));
    }
  };
  for (int i = 0; i < steps + 200; ++i) {
    in.Randomise(rng);
    const auto t0 = Clock::now();
    std::vector<uint64_t> tickets;
    launch_host_step(&tickets);
    const auto t1 = Clock::now();
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    for (uint64_t t : tickets) REQUIRE(engram_wait(host.s, t, -1) == 0);  // frees the slots
    if (i >= 200) {
      wall.push_back(Us(t0, Clock::now()));
      host_busy += Us(t0, t1);
    }
  }
  const Stats host_step = Summarise(wall, host_busy);

  // The host step again, its host thread watching the counter after the launch: when the rows
  // are in the arena (the daemon's part) and how long the stream takes after that (the GPU's).
  std::vector<double> until_rows, after_rows;
  for (int i = 0; i < steps + 200; ++i) {
    in.Randomise(rng);
    const auto t0 = Clock::now();
    std::vector<uint64_t> tickets;
    launch_host_step(&tickets);
    while (__atomic_load_n(host.counter, __ATOMIC_ACQUIRE) < expected) {
    }
    const auto t1 = Clock::now();
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    const auto t2 = Clock::now();
    for (uint64_t t : tickets) REQUIRE(engram_wait(host.s, t, -1) == 0);
    if (i >= 200) {
      until_rows.push_back(Us(t0, t1));
      after_rows.push_back(Us(t1, t2));
    }
  }
  const Stats watched_rows = Summarise(until_rows, 0), watched_gpu = Summarise(after_rows, 0);
  const std::vector<uint16_t> host_out = Download(out[1]);
  const std::vector<int32_t> last_tokens = in.tokens, last_history = in.history;

  // GPU steps: the captured graphs; the host writes the step's tokens (as a sampler kernel
  // would) and launches them. Every graph's output for the host step's last tokens must agree
  // with the host step's bit for bit.
  DeviceSession ds(daemon, n, 2'000'000'000);
  // The same steps with the queue's kernels launched one after the other, each once the kernel
  // ahead of it has finished: what the overlapped launches save.
  DeviceSession serial_ds(daemon, n, 2'000'000'000, ENGRAM_GPU_QUEUE_NO_OVERLAP);
  struct Watched {
    Stats publish, daemon, tail, service;
  };
  // The step's time on the GPU: the stream waits on a host word (`gate`), records an event,
  // runs the graph and records another; the host opens the gate once all of it is queued, so
  // the first event is taken just before the graph starts, without the host's launch call, and
  // the second when its last node is done, without the host's wait for the stream.
  uint64_t* gate = nullptr;
  CUDA_REQUIRE(
      cudaHostAlloc(reinterpret_cast<void**>(&gate), sizeof(uint64_t), cudaHostAllocMapped));
  *gate = 0;
  void* gate_d = nullptr;
  CUDA_REQUIRE(cudaHostGetDevicePointer(&gate_d, gate, 0));
  cudaEvent_t span_begin, span_end;
  CUDA_REQUIRE(cudaEventCreate(&span_begin));
  CUDA_REQUIRE(cudaEventCreate(&span_end));
  // One replay of `step` timed on the GPU's clock, in µs.
  auto replay_on_gpu_clock = [&](CapturedStep& step) {
    const uint64_t open = __atomic_load_n(gate, __ATOMIC_RELAXED) + 1;
    {
      // Opened however this block is left: a failed check must not leave the stream held.
      struct OpenGate {
        uint64_t* word;
        uint64_t value;
        ~OpenGate() { __atomic_store_n(word, value, __ATOMIC_RELEASE); }
      } opens{gate, open};
      ENGRAM_REQUIRE(engram_stream_wait_value64(reinterpret_cast<uintptr_t>(step.stream), gate_d,
                                                open, nullptr));
      CUDA_REQUIRE(cudaEventRecord(span_begin, step.stream));
      step.Replay();
      CUDA_REQUIRE(cudaEventRecord(span_end, step.stream));
    }
    step.Sync();
    float ms = 0;
    CUDA_REQUIRE(cudaEventElapsedTime(&ms, span_begin, span_end));
    return ms * 1000.0;
  };
  auto run_gpu_step = [&](const testing::StepOptions& options, Watched* watched, Stats* span,
                          const DeviceSession& session) {
    struct engram_device_ring ring {};
    ring.size = sizeof(ring);
    REQUIRE(engram_device_ring(session.session, &ring) == 0);
    CapturedStep step(h, in, session, options);
    wall.clear();
    double busy = 0;
    for (int i = 0; i < steps + 200; ++i) {
      in.Randomise(rng);  // new tokens in the device buffers, as the sampler leaves them
      const auto t0 = Clock::now();
      step.Replay();
      const auto t1 = Clock::now();
      step.Sync();
      if (i >= 200) {
        wall.push_back(Us(t0, Clock::now()));
        busy += Us(t0, t1);
      }
    }
    std::vector<double> gpu_us;
    for (int i = 0; i < steps / 2 + 100; ++i) {
      in.Randomise(rng);
      const double us = replay_on_gpu_clock(step);
      if (i >= 100) gpu_us.push_back(us);
    }
    *span = Summarise(gpu_us, 0);
    // Watched from the host: when the GPU publishes the step's requests (the ring's tail
    // moves), when the daemon has completed them all, and when the stream is done; with the
    // daemon's own service time of the slowest request (its status slot).
    const uint32_t per_layer =
        options.fused
            ? (options.piece_rows == 0 ? ENGRAM_GPU_PIECE_ROWS_DEFAULT : options.piece_rows)
            : n;
    const uint32_t requests = 2 * ((n + per_layer - 1) / per_layer);
    std::vector<double> publish, daemon_us, tail, service;
    for (int i = 0; i < steps / 2 + 100; ++i) {
      in.Randomise(rng);
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
    *watched = {Summarise(publish, 0), Summarise(daemon_us, 0), Summarise(tail, 0),
                Summarise(service, 0)};
    REQUIRE(*engram_gpu_queue_error(session.queue) == 0);
    in.tokens = last_tokens;
    in.history = last_history;
    in.Upload();
    step.Replay();
    step.Sync();
    if (options.hash != testing::StepHash::kNone) REQUIRE(Download(step.out[1]) == host_out);
    return Summarise(wall, busy);
  };
  Watched gpu_watched;
  Stats gpu_span;
  const Stats gpu_step = run_gpu_step({}, &gpu_watched, &gpu_span, ds);
  const uint32_t piece_sizes[] = {ENGRAM_GPU_PIECE_ROWS_DEFAULT, 48, 96, 288, n};
  constexpr int kPieceSizes = std::size(piece_sizes);
  Stats fused[kPieceSizes];
  Watched fused_watched[kPieceSizes];
  Stats fused_span[kPieceSizes];
  for (int i = 0; i < kPieceSizes; ++i) {
    fused[i] = run_gpu_step({.fused = true, .piece_rows = piece_sizes[i]}, &fused_watched[i],
                            &fused_span[i], ds);
  }
  // The default pipelined step with each layer hashed by a launch of its own, and without the
  // GPU hash (the ids the arena holds are gathered again): what hashing adds before the requests
  // go out, and what hashing both layers in one launch saves.
  Watched per_layer_watched, unhashed_watched, serial_watched, serial_gpu_watched;
  Stats per_layer_span, unhashed_span, serial_span, serial_gpu_span;
  const Stats per_layer = run_gpu_step({.fused = true, .hash = testing::StepHash::kPerLayer},
                                       &per_layer_watched, &per_layer_span, ds);
  const Stats unhashed = run_gpu_step({.fused = true, .hash = testing::StepHash::kNone},
                                      &unhashed_watched, &unhashed_span, ds);
  const Stats serial = run_gpu_step({.fused = true}, &serial_watched, &serial_span, serial_ds);
  const Stats serial_gpu = run_gpu_step({}, &serial_gpu_watched, &serial_gpu_span, serial_ds);

  // The +15 us comparison with the daemon's drift taken out: each round runs the host's hash
  // and gather of the default pieces, the default pipelined step and the same without
  // overlapped launches (both on the GPU's clock), one right after the other, with the same
  // tokens; the differences are taken round by round.
  std::vector<double> paired_host, paired_fused, paired_serial, fused_minus_host, serial_minus_host;
  {
    const testing::StepOptions pipelined{.fused = true};
    CapturedStep fused_step(h, in, ds, pipelined), serial_step(h, in, serial_ds, pipelined);
    for (int i = 0; i < steps + 100; ++i) {
      in.Randomise(rng);
      const auto t0 = Clock::now();
      host.Hash(h, in);
      for (uint64_t t : host.Submit(n, ENGRAM_GPU_PIECE_ROWS_DEFAULT)) {
        REQUIRE(engram_wait(host.s, t, -1) == 0);
      }
      const double host_us = Us(t0, Clock::now());
      // Alternate which GPU step goes first, so that neither always follows the host's gather.
      double fused_us, serial_us;
      if (i % 2 == 0) {
        fused_us = replay_on_gpu_clock(fused_step);
        serial_us = replay_on_gpu_clock(serial_step);
      } else {
        serial_us = replay_on_gpu_clock(serial_step);
        fused_us = replay_on_gpu_clock(fused_step);
      }
      if (i >= 100) {
        paired_host.push_back(host_us);
        paired_fused.push_back(fused_us);
        paired_serial.push_back(serial_us);
        fused_minus_host.push_back(fused_us - host_us);
        serial_minus_host.push_back(serial_us - host_us);
      }
    }
    REQUIRE(*engram_gpu_queue_error(ds.queue) == 0);
    REQUIRE(*engram_gpu_queue_error(serial_ds.queue) == 0);
  }

  // In place: both layers' resident tables, mapped read-only from engramd and registered; the
  // graph is GPU hash + dequant-gather from the mappings, with no request.
  Daemon resident_daemon({"--tier", "1=resident", "--tier", "14=resident"},
                         "gpu-step-bench-resident", testing::HashModel());
  REQUIRE(resident_daemon.alive());
  engram_connect_options ro = resident_daemon.Options(1 << 20);
  engram_session* resident_session = nullptr;
  REQUIRE(engram_connect(&ro, &resident_session) == 0);
  testing::ResidentTables resident(resident_session);
  DeviceBuffer ids_d[2] = {DeviceBuffer(n * 8), DeviceBuffer(n * 8)};
  cudaGraphExec_t inplace_exec = resident.Capture(h, in, ids_d, out, stream);
  wall.clear();
  host_busy = 0;
  for (int i = 0; i < steps + 200; ++i) {
    in.Randomise(rng);
    const auto t0 = Clock::now();
    CUDA_REQUIRE(cudaGraphLaunch(inplace_exec, stream));
    const auto t1 = Clock::now();
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    if (i >= 200) {
      wall.push_back(Us(t0, Clock::now()));
      host_busy += Us(t0, t1);
    }
  }
  const Stats in_place = Summarise(wall, host_busy);
  in.tokens = last_tokens;
  in.history = last_history;
  in.Upload();
  CUDA_REQUIRE(cudaGraphLaunch(inplace_exec, stream));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  REQUIRE(Download(out[1]) == host_out);
  cudaGraphExecDestroy(inplace_exec);

  std::printf(
      "\ndecode step, TP4 rank 1: %u sequences x %u tokens, %u heads, 2 layers = %u rows; "
      "%d steps each, back to back\n",
      kSeqs, kPerSeq, h.heads(), 2 * n, steps);
  std::printf("%-13s %10s %10s %16s\n", "method", "p50 us", "p99 us", "host us/step");
  std::printf("%-13s %10.1f %10.1f %16s\n", "host gather", gather.p50, gather.p99, "(all)");
  std::printf("%-13s %10.1f %10.1f %16.1f\n", "host step", host_step.p50, host_step.p99,
              host_step.host_us);
  std::printf("%-13s %10.1f %10.1f %16.1f\n", "GPU step", gpu_step.p50, gpu_step.p99,
              gpu_step.host_us);
  for (int i = 0; i < kPieceSizes; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "fused/%u", piece_sizes[i]);
    std::printf("%-13s %10.1f %10.1f %16.1f   (pieces of %u rows)\n", name, fused[i].p50,
                fused[i].p99, fused[i].host_us, piece_sizes[i]);
  }
  std::printf("%-13s %10.1f %10.1f %16s   (requests of %u rows)\n", "host gather/p",
              gather_pieces.p50, gather_pieces.p99, "(all)", ENGRAM_GPU_PIECE_ROWS_DEFAULT);
  std::printf("%-13s %10.1f %10.1f %16.1f   (resident tables of %llu + %llu rows, mapped)\n",
              "in place", in_place.p50, in_place.p99, in_place.host_us,
              static_cast<unsigned long long>(resident.info[0].covered_end -
                                              resident.info[0].covered_begin),
              static_cast<unsigned long long>(resident.info[1].covered_end -
                                              resident.info[1].covered_begin));
  std::printf("GPU step / host step: p50 %.2fx, p99 %.2fx; GPU step - host gather: p50 %+.1f us\n",
              gpu_step.p50 / host_step.p50, gpu_step.p99 / host_step.p99,
              gpu_step.p50 - gather.p50);
  std::printf(
      "fused step - host gather of the same requests: p50 %+.1f us (pieces of %u), %+.1f us "
      "(one request a layer); fused step (default pieces) / host step: p50 %.2fx, p99 %.2fx\n",
      fused[0].p50 - gather_pieces.p50, ENGRAM_GPU_PIECE_ROWS_DEFAULT,
      fused[kPieceSizes - 1].p50 - gather.p50, fused[0].p50 / host_step.p50,
      fused[0].p99 / host_step.p99);
  std::printf(
      "host hash alone: p50 %.1f us; host step watched from the host: hash, submit and launch to "
      "the rows in the arena p50 %.1f us (p99 %.1f), from there to the stream done p50 %.1f us "
      "(p99 %.1f)\n",
      hash.p50, watched_rows.p50, watched_rows.p99, watched_gpu.p50, watched_gpu.p99);
  std::printf(
      "GPU steps watched from the host, p50 (p99) us: launch to the requests published | "
      "published to all completed | completed to the stream done | the daemon's service time "
      "of the slowest request\n");
  auto print_watched = [](const char* name, const Watched& w) {
    std::printf("  %-11s %6.1f (%6.1f) | %6.1f (%6.1f) | %6.1f (%6.1f) | %6.1f (%6.1f)\n", name,
                w.publish.p50, w.publish.p99, w.daemon.p50, w.daemon.p99, w.tail.p50, w.tail.p99,
                w.service.p50, w.service.p99);
  };
  print_watched("GPU step", gpu_watched);
  for (int i = 0; i < kPieceSizes; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "fused/%u", piece_sizes[i]);
    print_watched(name, fused_watched[i]);
  }
  print_watched("hash/layer", per_layer_watched);
  print_watched("no hash", unhashed_watched);
  print_watched("serial", serial_watched);
  print_watched("serial GPU", serial_gpu_watched);
  std::printf(
      "GPU steps' time on the GPU (CUDA events just before and after the graph, the stream "
      "held until both were queued), p50 (p99) us:\n");
  std::printf("  %-11s %6.1f (%6.1f)\n", "GPU step", gpu_span.p50, gpu_span.p99);
  for (int i = 0; i < kPieceSizes; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "fused/%u", piece_sizes[i]);
    std::printf("  %-11s %6.1f (%6.1f)\n", name, fused_span[i].p50, fused_span[i].p99);
  }
  std::printf(
      "  %-11s %6.1f (%6.1f)   (fused/%u, a hash launch per layer; wall p50 %.1f, p99 %.1f)\n",
      "hash/layer", per_layer_span.p50, per_layer_span.p99, ENGRAM_GPU_PIECE_ROWS_DEFAULT,
      per_layer.p50, per_layer.p99);
  std::printf("  %-11s %6.1f (%6.1f)   (fused/%u without the GPU hash; wall p50 %.1f, p99 %.1f)\n",
              "no hash", unhashed_span.p50, unhashed_span.p99, ENGRAM_GPU_PIECE_ROWS_DEFAULT,
              unhashed.p50, unhashed.p99);
  std::printf(
      "  %-11s %6.1f (%6.1f)   (fused/%u, the queue's kernels not overlapped; wall p50 %.1f, p99 "
      "%.1f)\n",
      "serial", serial_span.p50, serial_span.p99, ENGRAM_GPU_PIECE_ROWS_DEFAULT, serial.p50,
      serial.p99);
  std::printf(
      "  %-11s %6.1f (%6.1f)   (GPU step, the queue's kernels not overlapped; wall p50 %.1f, p99 "
      "%.1f)\n",
      "serial GPU", serial_gpu_span.p50, serial_gpu_span.p99, serial_gpu.p50, serial_gpu.p99);
  std::printf(
      "fused step (default pieces) on the GPU - host hash and gather of the same requests: p50 "
      "%+.1f us (%.1f - %.1f - %.1f)\n",
      fused_span[0].p50 - hash.p50 - gather_pieces.p50, fused_span[0].p50, hash.p50,
      gather_pieces.p50);
  // Differences can be negative: Summarise sorts them like any sample.
  const Stats ph = Summarise(paired_host, 0), pf = Summarise(paired_fused, 0),
              ps = Summarise(paired_serial, 0), dfh = Summarise(fused_minus_host, 0),
              dsh = Summarise(serial_minus_host, 0);
  std::printf(
      "paired rounds (%d): host hash + gather of the same pieces p50 %.1f (p99 %.1f) us; on the "
      "GPU: pipelined step %.1f (%.1f), not overlapped %.1f (%.1f); pipelined - host, round by "
      "round: p50 %+.1f us (p99 %+.1f); not overlapped - host: p50 %+.1f us (p99 %+.1f)\n",
      steps, ph.p50, ph.p99, pf.p50, pf.p99, ps.p50, ps.p99, dfh.p50, dfh.p99, dsh.p50, dsh.p99);
  cudaEventDestroy(span_begin);
  cudaEventDestroy(span_end);
  cudaFreeHost(gate);
  cudaStreamDestroy(stream);
  engram_close(resident_session);
}

}  // namespace engram
