// Dequantise-and-scatter throughput from registered host memory (zero-copy) against after one H2D
// copy, for a decode step and a prefill chunk; and a token step whose Engram layer waits on the
// GPU (stream wait on the completion counter) against one where the host waits.
// Usage: gpu_dequant_bench [--quick] [--socket PATH --table LAYER --table-rows N]
// (with --socket, the token step is also run with a running engramd as the producer)
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engram/engram.h"
#include "engram/gpu.h"

namespace {

constexpr size_t kRow = ENGRAM_GPU_ROW_BYTES;
// Measured ceilings on this H200 machine (docs/platform-facts.md).
constexpr double kH2dCeilingGBs = 55.0;
constexpr double kZeroCopyCeilingGBs = 51.0;

void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}
void CheckEngram(int rc, const char* what) {
  if (rc != 0) {
    std::fprintf(stderr, "%s: %d %s\n", what, rc, engram_last_error());
    std::exit(1);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over trials of the per-call time (µs) of `enqueue`, timed with events around `reps`
// back-to-back calls on `stream`.
template <typename Fn>
double TimeUs(cudaStream_t stream, int reps, int trials, Fn enqueue) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "event");
  Check(cudaEventCreate(&stop), "event");
  for (int i = 0; i < 3; ++i) enqueue();  // warm-up
  std::vector<double> samples;
  for (int t = 0; t < trials; ++t) {
    Check(cudaEventRecord(start, stream), "record");
    for (int i = 0; i < reps; ++i) enqueue();
    Check(cudaEventRecord(stop, stream), "record");
    Check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    samples.push_back(1000.0 * ms / reps);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return Median(samples);
}

void BusySpinUs(double us) {
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(us * 1000));
  while (std::chrono::steady_clock::now() < end) {
  }
}

// What every token-step variant shares: the stream, the stand-in layers' inputs, the outputs.
struct StepSetup {
  cudaStream_t stream;
  const void* busy_rows;  // device-resident rows for the stand-in layers
  const int32_t* busy_map;
  uint32_t busy_n;
  void* busy_out;
  void* engram_out;
  int steps;
};

// One token step as two shapes of graph: `whole` (layers, stream wait, Engram layer, layers) and
// `before` / `after` around a host-side wait.
class TokenStep {
 public:
  static constexpr uint32_t kEngramRows = 1152;
  static constexpr int kBusyLaunches = 4;

  TokenStep(const StepSetup& setup, const void* counter_d, const void* engram_rows_d)
      : setup_(setup), engram_rows_d_(engram_rows_d) {
    std::vector<int32_t> map(kEngramRows);
    std::iota(map.begin(), map.end(), 0);
    Check(cudaMalloc(&engram_map_d_, kEngramRows * 4), "malloc");
    Check(cudaMemcpy(engram_map_d_, map.data(), kEngramRows * 4, cudaMemcpyHostToDevice), "copy");
    const auto s = reinterpret_cast<uintptr_t>(setup.stream);
    whole_ = Capture([&] {
      EnqueueBusy();
      CheckEngram(engram_stream_wait_value64(s, counter_d, 0, &wait_node_), "wait");
      EnqueueEngram();
      EnqueueBusy();
    });
    before_ = Capture([&] { EnqueueBusy(); });
    after_ = Capture([&] {
      EnqueueEngram();
      EnqueueBusy();
    });
    // GPU busy time: the whole step with a target already reached.
    CheckEngram(engram_graph_set_wait_value64(reinterpret_cast<uintptr_t>(whole_), wait_node_, 0),
                "set");
    busy_us_ = TimeUs(setup.stream, 20, 9,
                      [&] { Check(cudaGraphLaunch(whole_, setup.stream), "launch"); });
  }
  ~TokenStep() { cudaFree(engram_map_d_); }
  double busy_us() const { return busy_us_; }

  // Median wall time of a step. start() begins the producer's work and returns the counter
  // value that means "this step's rows are in place"; host_wait(target) blocks until then.
  template <typename Start, typename HostWait>
  double Run(bool gpu_wait, Start start, HostWait host_wait) {
    std::vector<double> walls;
    for (int i = 0; i < setup_.steps + 5; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      uint64_t target;
      if (gpu_wait) {
        target = start();
        CheckEngram(
            engram_graph_set_wait_value64(reinterpret_cast<uintptr_t>(whole_), wait_node_, target),
            "set");
        Check(cudaGraphLaunch(whole_, setup_.stream), "launch");
      } else {
        Check(cudaGraphLaunch(before_, setup_.stream), "launch");
        target = start();
        host_wait(target);
        Check(cudaGraphLaunch(after_, setup_.stream), "launch");
      }
      Check(cudaStreamSynchronize(setup_.stream), "sync");
      if (gpu_wait) host_wait(target);  // already reached; consumes the producer's completion
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 5) walls.push_back(us);
    }
    return Median(walls);
  }

 private:
  template <typename Body>
  cudaGraphExec_t Capture(Body body) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    Check(cudaStreamBeginCapture(setup_.stream, cudaStreamCaptureModeThreadLocal), "capture");
    body();
    Check(cudaStreamEndCapture(setup_.stream, &graph), "capture end");
    Check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    return exec;
  }
  void EnqueueBusy() {
    for (int i = 0; i < kBusyLaunches; ++i) {
      CheckEngram(engram_dequant_scatter(setup_.busy_rows, setup_.busy_n, setup_.busy_map,
                                         setup_.busy_n / 12, 12, setup_.busy_out, nullptr, 0,
                                         nullptr, reinterpret_cast<uintptr_t>(setup_.stream)),
                  "busy");
    }
  }
  void EnqueueEngram() {
    CheckEngram(
        engram_dequant_scatter(engram_rows_d_, kEngramRows, static_cast<int32_t*>(engram_map_d_),
                               kEngramRows / 12, 12, setup_.engram_out, nullptr, 0, nullptr,
                               reinterpret_cast<uintptr_t>(setup_.stream)),
        "engram layer");
  }

  StepSetup setup_;
  const void* engram_rows_d_;
  void* engram_map_d_ = nullptr;
  uintptr_t wait_node_ = 0;
  cudaGraphExec_t whole_, before_, after_;
  double busy_us_ = 0;
};

// The same token step with engramd as the producer: each step submits a gather of 1,152 rows
// (uniform over the table) into the session's registered arena.
void RunEngramdSteps(const StepSetup& setup, const char* socket_path, uint32_t table,
                     uint64_t table_rows) {
  engram_connect_options options;
  engram_connect_options_init(&options, sizeof(options));
  options.socket_path = socket_path;
  engram_session* session = nullptr;
  if (engram_session_open(&options, &session) != 0) {
    std::fprintf(stderr, "engram_session_open(%s): %s\n", socket_path, engram_last_error());
    std::exit(1);
  }
  void* arena;
  uint64_t arena_bytes;
  const volatile uint64_t* counter;
  engram_gpu_registration* reg = nullptr;
  uint64_t* ids;
  uint8_t* dest;
  const uint32_t n = TokenStep::kEngramRows;
  if (engram_arena(session, &arena, &arena_bytes) != 0 ||
      engram_completion_counter(session, &counter) != 0 ||
      engram_alloc(session, n * 8, reinterpret_cast<void**>(&ids)) != 0 ||
      engram_alloc(session, n * kRow, reinterpret_cast<void**>(&dest)) != 0) {
    std::fprintf(stderr, "engram session setup: %s\n", engram_last_error());
    std::exit(1);
  }
  if (engram_gpu_register(arena, arena_bytes, &reg) != 0) {
    std::fprintf(stderr, "register: %s\n", engram_last_error());
    std::exit(1);
  }
  TokenStep token(setup, engram_gpu_device_ptr(reg, const_cast<const uint64_t*>(counter)),
                  engram_gpu_device_ptr(reg, dest));
  std::mt19937_64 rng(7);
  uint64_t submitted = *counter;
  uint64_t ticket = 0;
  std::vector<double> gather_us;
  std::chrono::steady_clock::time_point submit_time;
  auto start = [&] {
    for (uint32_t i = 0; i < n; ++i) ids[i] = rng() % table_rows;
    engram_gather_request request{};
    request.size = sizeof(request);
    request.layer = table;
    request.rows = ids;
    request.num_rows = n;
    request.dest = dest;
    submit_time = std::chrono::steady_clock::now();
    if (engram_submit(session, &request, &ticket) != 0) {
      std::fprintf(stderr, "engram_submit: %s\n", engram_last_error());
      std::exit(1);
    }
    return ++submitted;
  };
  auto host_wait = [&](uint64_t) {
    const int rc = engram_wait(session, ticket, 10'000'000'000);
    if (rc != 0) {
      std::fprintf(stderr, "engram_wait: %d %s\n", rc, engram_last_error());
      std::exit(1);
    }
    gather_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - submit_time)
            .count());
  };
  std::printf(
      "\nproducer: engramd (%s), table %u, %llu rows, 1,152 uniform random rows per step; "
      "GPU busy %.1f us/step\n",
      socket_path, table, static_cast<unsigned long long>(table_rows), token.busy_us());
  std::printf("%-34s %12s %12s %16s\n", "Engram wait", "step us", "GPU idle us",
              "gather us (host)");
  for (bool gpu_wait : {true, false}) {
    gather_us.clear();
    const double wall = token.Run(gpu_wait, start, host_wait);
    // Submit-to-completion as the host sees it; in the GPU variant the host only looks after the
    // step, so that column says nothing there.
    char gather[32] = "-";
    if (!gpu_wait) std::snprintf(gather, sizeof(gather), "%.1f", Median(gather_us));
    std::printf("%-34s %12.1f %12.1f %16s\n",
                gpu_wait ? "GPU (stream wait in one graph)" : "host (engram_wait, then 2nd graph)",
                wall, wall - token.busy_us(), gather);
  }
  engram_gpu_unregister(reg);
  engram_session_close(session);
}

struct Options {
  bool quick = false;
  const char* socket_path = nullptr;
  uint32_t table = 14;
  uint64_t table_rows = 0;
};

// Reads the command line into o; an exit status when it is wrong (said on stderr).
std::optional<int> ParseArgs(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--socket" && i + 1 < argc) {
      o.socket_path = argv[++i];
    } else if (arg == "--table" && i + 1 < argc) {
      o.table = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (arg == "--table-rows" && i + 1 < argc) {
      o.table_rows = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr,
                   "usage: gpu_dequant_bench [--quick] [--socket PATH --table LAYER "
                   "--table-rows N]\n  unknown or incomplete argument '%s'\n",
                   arg.c_str());
      return 2;
    }
  }
  if (o.socket_path != nullptr && o.table_rows == 0) {
    std::fprintf(stderr, "gpu_dequant_bench: --socket needs --table-rows (rows of the table)\n");
    return 2;
  }
  return std::nullopt;
}

void PrintMachine() {
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "properties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  utsname host{};
  uname(&host);
  std::printf("machine: %s, kernel %s, %ld cores\n", host.nodename, host.release,
              sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("GPU: %s, %d SMs, L2 %d MB, driver %d, runtime %d, kernels backend %s\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, driver, runtime,
              engram_kernels_backend());
  std::printf(
      "rows: 264 B (256 e4m3 + 8 e8m0) -> 512 B bf16 each; one slot per row, slots in a "
      "random permutation; ceilings: H2D %.0f GB/s, zero-copy %.0f GB/s\n\n",
      kH2dCeilingGBs, kZeroCopyCeilingGBs);
}

constexpr uint32_t kMaxRows = 98304;

// The arena stand-in: a memfd mapping, like the client's shared-memory arena, registered once.
// A completion counter in its first page, then kMaxRows random (finite) rows.
struct Arena {
  uint8_t* base = nullptr;
  size_t rows_bytes = kMaxRows * kRow;
  size_t bytes = 4096 + rows_bytes;
  engram_gpu_registration* reg = nullptr;
  const void* counter_d = nullptr;    // the counter, as the GPU sees it
  const void* rows_mapped = nullptr;  // the rows, as the GPU sees them

  uint8_t* rows() const { return base + 4096; }
  uint64_t* counter() const { return reinterpret_cast<uint64_t*>(base); }
};

// Maps, fills and registers the arena, printing how long registering took; false after saying
// why.
bool SetUpArena(std::mt19937_64& rng, Arena& a) {
  const int fd = memfd_create("engram-bench-arena", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(a.bytes)) != 0) {
    std::perror("memfd");
    return false;
  }
  a.base = static_cast<uint8_t*>(mmap(nullptr, a.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (a.base == MAP_FAILED) {
    std::perror("mmap");
    return false;
  }
  for (size_t i = 0; i < a.rows_bytes; ++i) a.rows()[i] = uint8_t(rng() & 0x77);  // finite
  const auto t_reg = std::chrono::steady_clock::now();
  if (engram_gpu_register(a.base, a.bytes, &a.reg) != 0) {
    std::fprintf(stderr, "register: %s\n", engram_last_error());
    return false;
  }
  const double reg_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_reg).count();
  std::printf("engram_gpu_register of %.1f MB: %.2f ms\n\n", a.bytes / 1e6, reg_ms);
  a.counter_d = engram_gpu_device_ptr(a.reg, a.base);
  a.rows_mapped = engram_gpu_device_ptr(a.reg, a.rows());
  return true;
}

// Device memory: the rows copied to HBM, an H2D staging area, the slot map and the output.
struct DeviceBuffers {
  void *rows_dev, *staging, *map_d, *out_d;
};

// Dequantise-scatter of a decode step and a prefill chunk: zero-copy, after an H2D copy, the
// copy alone and from HBM.
void RunDequantBaselines(cudaStream_t stream, const Arena& a, const DeviceBuffers& d,
                         std::mt19937_64& rng, int trials) {
  const auto s = reinterpret_cast<uintptr_t>(stream);
  auto* map_d = static_cast<int32_t*>(d.map_d);
  std::printf("%-8s %-26s %10s %10s %12s %10s\n", "rows", "path", "us/step", "Mrows/s",
              "GB/s (264B)", "of ceiling");
  for (uint32_t n : {1152u, 98304u}) {
    std::vector<int32_t> map(n);
    std::iota(map.begin(), map.end(), 0);
    std::shuffle(map.begin(), map.end(), rng);
    Check(cudaMemcpy(d.map_d, map.data(), n * 4, cudaMemcpyHostToDevice), "copy");
    const uint32_t heads = 12, tokens = n / heads;
    const int reps = n < 10000 ? 200 : 20;
    auto report = [&](const char* path, double us, double ceiling) {
      const double gbs = n * double(kRow) / (us * 1e3);
      char of[16] = "-";
      if (ceiling > 0) std::snprintf(of, sizeof(of), "%.0f%%", 100 * gbs / ceiling);
      std::printf("%-8u %-26s %10.2f %10.1f %12.1f %10s\n", n, path, us, n / us, gbs, of);
    };
    const double zero_copy = TimeUs(stream, reps, trials, [&] {
      CheckEngram(engram_dequant_scatter(a.rows_mapped, n, map_d, tokens, heads, d.out_d, nullptr,
                                         0, nullptr, s),
                  "zero-copy");
    });
    const double staged = TimeUs(stream, reps, trials, [&] {
      CheckEngram(engram_dequant_scatter(a.rows_mapped, n, map_d, tokens, heads, d.out_d, d.staging,
                                         a.rows_bytes, nullptr, s),
                  "staged");
    });
    const double copy_only = TimeUs(stream, reps, trials, [&] {
      Check(cudaMemcpyAsync(d.staging, a.rows(), n * kRow, cudaMemcpyHostToDevice, stream), "copy");
    });
    const double resident = TimeUs(stream, reps, trials, [&] {
      CheckEngram(engram_dequant_scatter(d.rows_dev, n, map_d, tokens, heads, d.out_d, nullptr, 0,
                                         nullptr, s),
                  "resident");
    });
    report("zero-copy kernel", zero_copy, kZeroCopyCeilingGBs);
    report("H2D copy + kernel", staged, kH2dCeilingGBs);
    report("  H2D copy alone", copy_only, kH2dCeilingGBs);
    report("  kernel, rows in HBM", resident, 0);
  }
}

// Producer 1: a host thread publishing the arena's counter D µs after the step is launched;
// the token step with the GPU waiting against the host waiting, for several D.
void RunHostProducerSteps(const StepSetup& setup, const Arena& a) {
  std::atomic_ref<uint64_t> published(*a.counter());
  published.store(0);
  std::atomic<uint64_t> go{0};
  std::atomic<bool> stop{false};
  std::atomic<double> delay_us{0};
  std::thread producer([&] {
    uint64_t seen = 0;
    while (!stop.load()) {
      const uint64_t step = go.load(std::memory_order_acquire);
      if (step == seen) continue;
      seen = step;
      BusySpinUs(delay_us.load());
      published.store(step, std::memory_order_release);
    }
  });
  TokenStep synthetic(setup, a.counter_d, a.rows_mapped);
  std::printf(
      "\ntoken step: 4 x 98,304-row resident dequant (before) + Engram layer (1,152 "
      "rows zero-copy) + the same after; GPU busy %.1f us/step\n",
      synthetic.busy_us());
  std::printf(
      "GPU idle = step wall time (launch to stream synchronised) - GPU busy; median of "
      "%d steps\n\n",
      setup.steps);
  std::printf("producer: a host thread publishes the counter D us after the step starts\n");
  std::printf("%-10s %-34s %12s %12s\n", "D (us)", "Engram wait", "step us", "GPU idle us");
  uint64_t step = 0;
  for (double d :
       {50.0, 0.5 * synthetic.busy_us(), synthetic.busy_us(), 2.0 * synthetic.busy_us()}) {
    delay_us = d;
    for (bool gpu_wait : {true, false}) {
      const double wall = synthetic.Run(
          gpu_wait,
          [&] {
            go.store(++step, std::memory_order_release);
            return step;
          },
          [&](uint64_t target) {
            while (published.load(std::memory_order_acquire) < target) {
            }
          });
      std::printf("%-10.0f %-34s %12.1f %12.1f\n", d,
                  gpu_wait ? "GPU (stream wait in one graph)" : "host (spin, then 2nd graph)", wall,
                  wall - synthetic.busy_us());
    }
  }
  stop = true;
  producer.join();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (std::optional<int> bad_usage = ParseArgs(argc, argv, o)) return *bad_usage;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA GPU on this machine\n");
    return 77;
  }
  PrintMachine();

  std::mt19937_64 rng(42);
  Arena arena;
  if (!SetUpArena(rng, arena)) return 1;
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  DeviceBuffers d;
  Check(cudaMalloc(&d.rows_dev, arena.rows_bytes), "malloc");
  Check(cudaMalloc(&d.staging, arena.rows_bytes), "malloc");
  Check(cudaMalloc(&d.map_d, kMaxRows * 4), "malloc");
  Check(cudaMalloc(&d.out_d, size_t{kMaxRows} * 512), "malloc");
  Check(cudaMemcpy(d.rows_dev, arena.rows(), arena.rows_bytes, cudaMemcpyHostToDevice), "copy");
  RunDequantBaselines(stream, arena, d, rng, o.quick ? 3 : 9);

  // ---- token step: GPU-side wait against host-side wait ------------------------------------
  // Stand-in for the layers around the Engram layer: a device-resident dequantise of 98,304
  // rows, repeated. The Engram layer itself: 1,152 rows read zero-copy from registered memory.
  std::vector<int32_t> big_map(kMaxRows);
  std::iota(big_map.begin(), big_map.end(), 0);
  Check(cudaMemcpy(d.map_d, big_map.data(), kMaxRows * 4, cudaMemcpyHostToDevice), "copy");
  void* busy_out;
  Check(cudaMalloc(&busy_out, size_t{kMaxRows} * 512), "malloc");
  StepSetup setup{stream,  d.rows_dev,        static_cast<int32_t*>(d.map_d), kMaxRows, busy_out,
                  d.out_d, o.quick ? 50 : 300};
  RunHostProducerSteps(setup, arena);

  // Producer 2: engramd gathering the step's rows into the session's registered arena.
  if (o.socket_path != nullptr) {
    RunEngramdSteps(setup, o.socket_path, o.table, o.table_rows);
  }
  engram_gpu_unregister(arena.reg);
  return 0;
}
