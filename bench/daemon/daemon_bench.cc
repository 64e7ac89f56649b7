// engramd-bench: the cost of going through engramd, in one run. Empty-request round trips
// (idle and busy daemon) and 1,152- / 98,304-row gathers warm and cold, through the daemon and
// in-process by the same gather engine, side by side with their ratios.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/common/engramd_process.h"
#include "engram/engram.h"
#include "gather/gather_engine.h"
#include "tables/table.h"
#include "testkit/synthetic.h"

namespace {

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

std::string FirstLine(const char* path, const char* key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "?";
}

struct Summary {
  uint64_t p50 = 0, p99 = 0, p999 = 0, mean = 0;
};
Summary Summarise(std::vector<uint64_t> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.p50 = v[(v.size() - 1) / 2];
  s.p99 = v[static_cast<size_t>(0.99 * static_cast<double>(v.size() - 1))];
  s.p999 = v[static_cast<size_t>(0.999 * static_cast<double>(v.size() - 1))];
  uint64_t sum = 0;
  for (uint64_t x : v) sum += x;
  s.mean = sum / v.size();
  return s;
}

void Evict(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      close(fd);
    }
  }
}

void Warm(const std::vector<std::string>& files) {
  std::vector<char> buf(1 << 20);
  for (const auto& f : files) {
    int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && read(fd, buf.data(), buf.size()) > 0) {
    }
    if (fd >= 0) close(fd);
  }
}

struct Options {
  std::string engramd, dir;
  uint64_t rows = 400000;
  uint32_t workers = 0, spin_us = 0;
  bool smoke = false;
  std::vector<std::string> daemon_args;
  bool temp_dir = false;  // dir was made for this run and is removed at the end
};

// How much each measurement repeats: a full run, or a --smoke run that only checks it works.
struct Sizes {
  explicit Sizes(bool smoke)
      : nop_iters(smoke ? 200 : 20000),
        warm_small(smoke ? 5 : 300),
        warm_large(smoke ? 1 : 10),
        cold_small(smoke ? 2 : 20),
        cold_large(smoke ? 1 : 3),
        large(smoke ? 3000 : 98304) {}
  const uint32_t nop_iters;
  const uint32_t warm_small, warm_large;
  const uint32_t cold_small, cold_large;
  const uint64_t large;  // rows of the large gather (the small one is 1,152)
};

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("--engramd", o.engramd, "engramd binary (default: next to this build)");
  app.add_option("--dir", o.dir,
                 "Work directory for the synthetic checkpoint (default: temporary)");
  app.add_option("--rows", o.rows, "Rows per Engram table")->capture_default_str();
  app.add_option("--workers", o.workers,
                 "Gather workers, daemon and in-process (default: the daemon's and the engine's "
                 "own default)");
  app.add_option("--client-spin-us", o.spin_us, "Client spin before sleeping (0: library default)");
  app.add_option("--daemon-arg", o.daemon_args, "Extra engramd argument (repeatable)");
  app.add_flag("--smoke", o.smoke, "Tiny run that only checks the benchmark works");
}

// Fills in what the options left to defaults: engramd's path, a work directory, smoke sizes.
void ResolveDefaults(Options& o) {
  if (o.engramd.empty()) {
    o.engramd = engram::bench::EngramdPath(
        (std::filesystem::canonical("/proc/self/exe").parent_path() / "../../daemon/engramd")
            .string());
  }
  o.temp_dir = o.dir.empty();
  if (o.temp_dir) {
    char tmpl[] = "/tmp/engramd-bench-XXXXXX";
    o.dir = mkdtemp(tmpl);
  }
  if (o.smoke) o.rows = 4000;
}

void PrintMachine(const Options& o) {
  utsname u;
  uname(&u);
  printf("engramd-bench\n  machine: %s, %ld CPUs, kernel %s\n  cpu: %s\n", u.nodename,
         sysconf(_SC_NPROCESSORS_ONLN), u.release,
         FirstLine("/proc/cpuinfo", "model name").c_str());
  printf("  tables: synthetic checkpoint, 2 layers x %" PRIu64 " rows (%.0f MB each), in %s\n",
         o.rows, o.rows * 264 / 1e6, o.dir.c_str());
  printf("  gather workers: %s (daemon and in-process); client spin: %s\n",
         o.workers ? std::to_string(o.workers).c_str() : "defaults",
         o.spin_us ? (std::to_string(o.spin_us) + " µs").c_str() : "library default");
}

// The synthetic checkpoint, opened for the in-process gathers, and the engine that does them.
struct InProcess {
  std::vector<std::unique_ptr<engram::Table>> tables;
  std::vector<std::string> files;  // every table file, to evict or warm
  const engram::Table* table = nullptr;
  std::unique_ptr<engram::GatherEngine> engine;
};

// Writes the checkpoint (unless it is there) and opens it; false after saying why.
bool SetUpInProcess(const Options& o, const std::string& model, InProcess& ip) {
  if (!std::filesystem::exists(model + "/config.json")) {
    absl::Status s =
        engram::WriteSyntheticCheckpoint({.out_dir = model, .rows = o.rows, .seed = 3});
    if (!s.ok()) {
      fprintf(stderr, "%s\n", s.ToString().c_str());
      return false;
    }
  }
  auto tables = engram::OpenTables(model, {});
  if (!tables.ok()) {
    fprintf(stderr, "%s\n", tables.status().ToString().c_str());
    return false;
  }
  ip.tables = *std::move(tables);
  for (const auto& t : ip.tables) {
    for (const auto& f : t->files()) ip.files.push_back(f.path);
  }
  ip.table = ip.tables[0].get();
  auto engine = engram::GatherEngine::Create({.workers = o.workers});
  if (!engine.ok()) {
    fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return false;
  }
  ip.engine = *std::move(engine);
  for (const auto& t : ip.tables) (void)ip.engine->AddTable(t.get(), {});
  return true;
}

// Starts engramd on `sock` serving `model` and prints its arguments; -1 on failure.
pid_t StartDaemon(const Options& o, const std::string& model, const std::string& sock) {
  std::vector<std::string> args = {o.engramd, "--model",     model,    "--socket",
                                   sock,      "--log-level", "warning"};
  if (o.workers != 0) {
    args.push_back("--workers");
    args.push_back(std::to_string(o.workers));
  }
  args.insert(args.end(), o.daemon_args.begin(), o.daemon_args.end());
  printf("  engramd:");
  for (size_t i = 1; i < args.size(); ++i) printf(" %s", args[i].c_str());
  printf("\n\n");
  fflush(stdout);
  return engram::bench::StartEngramd(args, sock);
}

// The measuring client: a session with room for the large gather, and the same gathers done
// in-process to compare with.
struct Bench {
  InProcess& ip;
  engram_session* s = nullptr;
  uint64_t* ids = nullptr;
  uint8_t* out = nullptr;
  std::vector<uint8_t> local;
  std::mt19937_64 rng{11};
  std::uniform_int_distribution<uint64_t> pick;
  bool ok = true;

  // Empty requests (submit NOP + wait); the first tenth warms up and is not counted.
  Summary NopRoundTrips(uint32_t iters) {
    std::vector<uint64_t> t;
    for (uint32_t i = 0; i < iters + iters / 10; ++i) {
      uint64_t ticket;
      const uint64_t t0 = NowNs();
      engram_submit_nop(s, &ticket);
      ok &= engram_wait(s, ticket, -1) == 0;
      if (i >= iters / 10) t.push_back(NowNs() - t0);
    }
    return Summarise(t);
  }

  // Alternates daemon and in-process gathers of the same fresh rows; evicts first when cold.
  // Returns (through the daemon, in-process).
  std::pair<Summary, Summary> Compare(uint64_t n, uint32_t iters, bool cold) {
    std::vector<uint64_t> via_daemon, in_process;
    for (uint32_t i = 0; i < iters; ++i) {
      for (uint64_t k = 0; k < n; ++k) ids[k] = pick(rng);
      std::vector<uint64_t> copy(ids, ids + n);
      if (cold) Evict(ip.files);
      uint64_t t0 = NowNs();
      ok &= ip.engine->Gather({.table = ip.table, .rows = copy, .dest = local.data()}).ok();
      in_process.push_back(NowNs() - t0);
      if (cold) Evict(ip.files);
      engram_gather_request r{.size = sizeof(r),
                              .layer = ip.table->layer_id(),
                              .flags = ENGRAM_GATHER_VIA_DAEMON,
                              .rows = ids,
                              .num_rows = n,
                              .dest = out,
                              .dest_offsets = nullptr};
      t0 = NowNs();
      ok &= engram_gather(s, &r, -1) == 0;
      via_daemon.push_back(NowNs() - t0);
      ok &= memcmp(out, local.data(), n * 264) == 0;
    }
    return std::make_pair(Summarise(via_daemon), Summarise(in_process));
  }
};

engram_connect_options ConnectOptions(const Options& o, const std::string& sock, uint64_t large) {
  engram_connect_options c;
  engram_connect_options_init(&c, sizeof(c));
  c.socket_path = sock.c_str();
  c.data_bytes = large * (264 + 8) + (2 << 20);
  c.spin_ns = o.spin_us * 1000;
  c.client_name = "engramd-bench";
  return c;
}

// Another client process that keeps the daemon gathering 1,152-row batches until killed.
pid_t StartBusyClient(const engram_connect_options& o, uint64_t rows) {
  pid_t busy = fork();
  if (busy != 0) return busy;
  engram_session* b;
  engram_connect_options bo = o;
  bo.client_name = "busy";
  if (engram_session_open(&bo, &b) != 0) _exit(1);
  uint64_t* bids;
  uint8_t* bout;
  engram_alloc(b, 1152 * 8, reinterpret_cast<void**>(&bids));
  engram_alloc(b, 1152 * 264, reinterpret_cast<void**>(&bout));
  std::mt19937_64 r2(5);
  while (true) {
    for (int k = 0; k < 1152; ++k) bids[k] = r2() % rows;
    engram_gather_request r{.size = sizeof(r),
                            .layer = 1,
                            .flags = ENGRAM_GATHER_VIA_DAEMON,
                            .rows = bids,
                            .num_rows = 1152,
                            .dest = bout,
                            .dest_offsets = nullptr};
    if (engram_gather(b, &r, -1) != 0) _exit(2);
  }
}

// Everything the run measured.
struct Results {
  Summary idle, busy;
  std::pair<Summary, Summary> warm_small, warm_large, cold_small, cold_large;
  engram_session_stats stats{};
  int daemon_status = 0;
};

// Round trips idle, the four gather comparisons, then round trips under a busy client.
void Measure(Bench& b, const Sizes& z, const engram_connect_options& o, uint64_t rows, Results& r) {
  r.idle = b.NopRoundTrips(z.nop_iters);
  Warm(b.ip.files);
  r.warm_small = b.Compare(1152, z.warm_small, false);
  r.warm_large = b.Compare(z.large, z.warm_large, false);
  r.cold_small = b.Compare(1152, z.cold_small, true);
  r.cold_large = b.Compare(z.large, z.cold_large, true);
  Warm(b.ip.files);

  const pid_t busy = StartBusyClient(o, rows);
  usleep(100000);
  r.busy = b.NopRoundTrips(z.nop_iters);
  kill(busy, SIGKILL);
  waitpid(busy, nullptr, 0);
}

void PrintResults(const Sizes& z, const Results& r, bool ok) {
  printf("empty request round trip (submit NOP + wait), %u each:\n", z.nop_iters);
  printf("  idle daemon:  p50 %7.2f µs  p99 %7.2f µs  p99.9 %7.2f µs\n", r.idle.p50 / 1e3,
         r.idle.p99 / 1e3, r.idle.p999 / 1e3);
  printf(
      "  busy daemon:  p50 %7.2f µs  p99 %7.2f µs  p99.9 %7.2f µs   (another client gathering "
      "1,152-row batches)\n\n",
      r.busy.p50 / 1e3, r.busy.p99 / 1e3, r.busy.p999 / 1e3);
  printf("%-20s %5s | %10s %10s %10s | %10s %10s %10s | %6s %6s\n", "gather (µs)", "iters",
         "daemon p50", "p99", "p99.9", "in-proc p50", "p99", "p99.9", "p50 x", "p99 x");
  auto row = [&](const char* name, uint32_t iters, const std::pair<Summary, Summary>& c) {
    printf("%-20s %5u | %10.1f %10.1f %10.1f | %11.1f %10.1f %10.1f | %5.2fx %5.2fx\n", name, iters,
           c.first.p50 / 1e3, c.first.p99 / 1e3, c.first.p999 / 1e3, c.second.p50 / 1e3,
           c.second.p99 / 1e3, c.second.p999 / 1e3,
           double(c.first.p50) / double(std::max<uint64_t>(1, c.second.p50)),
           double(c.first.p99) / double(std::max<uint64_t>(1, c.second.p99)));
  };
  row("1,152 rows warm", z.warm_small, r.warm_small);
  row((std::to_string(z.large) + " rows warm").c_str(), z.warm_large, r.warm_large);
  row("1,152 rows cold", z.cold_small, r.cold_small);
  row((std::to_string(z.large) + " rows cold").c_str(), z.cold_large, r.cold_large);
  const double ratio =
      double(r.warm_small.first.p50) / double(std::max<uint64_t>(1, r.warm_small.second.p50));
  printf(
      "\ntargets: warm 1,152-row ratio %.2fx (target <= 1.25x): %s; busy empty round trip "
      "p50 %.2f µs (target < 5 µs): %s\n",
      ratio, ratio <= 1.25 ? "met" : "MISSED", r.busy.p50 / 1e3,
      r.busy.p50 < 5000 ? "met" : "MISSED");
  const int status = r.daemon_status;
  printf("session: %" PRIu64 " requests, %" PRIu64 " doorbells, %" PRIu64
         " client futex sleeps; engramd exit status %d\n",
         r.stats.requests_ok, r.stats.doorbells, r.stats.client_sleeps,
         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  printf("bytes: %s\n", ok ? "daemon and in-process gathers identical" : "MISMATCH or error");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"engramd-bench: gathers through engramd against the same gathers in-process"};
  Options opts;
  AddOptions(app, opts);
  CLI11_PARSE(app, argc, argv);
  ResolveDefaults(opts);
  const Sizes sizes(opts.smoke);
  PrintMachine(opts);

  const std::string model = opts.dir + "/model";
  InProcess ip;
  if (!SetUpInProcess(opts, model, ip)) return 1;
  const std::string sock = opts.dir + "/engramd.sock";
  const pid_t daemon = StartDaemon(opts, model, sock);
  if (daemon < 0) return 1;

  const engram_connect_options o = ConnectOptions(opts, sock, sizes.large);
  Bench b{.ip = ip,
          .local = std::vector<uint8_t>(sizes.large * 264),
          .pick = std::uniform_int_distribution<uint64_t>(0, opts.rows - 1)};
  if (engram_session_open(&o, &b.s) != 0) {
    fprintf(stderr, "connect: %s\n", engram_last_error());
    kill(daemon, SIGKILL);
    return 1;
  }
  engram_alloc(b.s, sizes.large * 8, reinterpret_cast<void**>(&b.ids));
  engram_alloc(b.s, sizes.large * 264, reinterpret_cast<void**>(&b.out));
  Results r;
  Measure(b, sizes, o, opts.rows, r);
  r.stats.size = sizeof(r.stats);
  engram_get_session_stats(b.s, &r.stats);
  engram_session_close(b.s);
  kill(daemon, SIGTERM);
  waitpid(daemon, &r.daemon_status, 0);

  PrintResults(sizes, r, b.ok);
  if (opts.temp_dir) std::filesystem::remove_all(opts.dir);
  const int status = r.daemon_status;
  return b.ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
