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
#include <random>
#include <string>
#include <vector>

#include "bench/common/engramd_process.h"
#include "engram/engram.h"
#include "gather/gather_engine.h"
#include "tables/table.h"
#include "tools/tables/synthetic.h"

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"engramd-bench: gathers through engramd against the same gathers in-process"};
  std::string engramd, dir;
  uint64_t rows = 400000;
  uint32_t workers = 0, spin_us = 0;
  bool smoke = false;
  std::vector<std::string> daemon_args;
  app.add_option("--engramd", engramd, "engramd binary (default: next to this build)");
  app.add_option("--dir", dir, "Work directory for the synthetic checkpoint (default: temporary)");
  app.add_option("--rows", rows, "Rows per Engram table")->capture_default_str();
  app.add_option("--workers", workers,
                 "Gather workers, daemon and in-process (default: the daemon's and the engine's "
                 "own default)");
  app.add_option("--client-spin-us", spin_us, "Client spin before sleeping (0: library default)");
  app.add_option("--daemon-arg", daemon_args, "Extra engramd argument (repeatable)");
  app.add_flag("--smoke", smoke, "Tiny run that only checks the benchmark works");
  CLI11_PARSE(app, argc, argv);
  if (engramd.empty()) {
    engramd = engram::bench::EngramdPath(
        (std::filesystem::canonical("/proc/self/exe").parent_path() / "../../daemon/engramd")
            .string());
  }
  const bool temp_dir = dir.empty();
  if (temp_dir) {
    char tmpl[] = "/tmp/engramd-bench-XXXXXX";
    dir = mkdtemp(tmpl);
  }
  if (smoke) rows = 4000;
  const uint32_t nop_iters = smoke ? 200 : 20000;
  const uint32_t warm_small = smoke ? 5 : 300, warm_large = smoke ? 1 : 10;
  const uint32_t cold_small = smoke ? 2 : 20, cold_large = smoke ? 1 : 3;
  const uint64_t large = smoke ? 3000 : 98304;

  utsname u;
  uname(&u);
  printf("engramd-bench\n  machine: %s, %ld CPUs, kernel %s\n  cpu: %s\n", u.nodename,
         sysconf(_SC_NPROCESSORS_ONLN), u.release,
         FirstLine("/proc/cpuinfo", "model name").c_str());
  printf("  tables: synthetic checkpoint, 2 layers x %" PRIu64 " rows (%.0f MB each), in %s\n",
         rows, rows * 264 / 1e6, dir.c_str());
  printf("  gather workers: %s (daemon and in-process); client spin: %s\n",
         workers ? std::to_string(workers).c_str() : "defaults",
         spin_us ? (std::to_string(spin_us) + " µs").c_str() : "library default");

  const std::string model = dir + "/model";
  if (!std::filesystem::exists(model + "/config.json")) {
    absl::Status s = engram::WriteSyntheticCheckpoint({.out_dir = model, .rows = rows, .seed = 3});
    if (!s.ok()) {
      fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  auto tables = engram::OpenTables(model, {});
  if (!tables.ok()) {
    fprintf(stderr, "%s\n", tables.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> files;
  for (const auto& t : *tables) {
    for (const auto& f : t->files()) files.push_back(f.path);
  }
  const engram::Table* table = (*tables)[0].get();
  auto engine = engram::GatherEngine::Create({.workers = workers});
  if (!engine.ok()) {
    fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  for (const auto& t : *tables) (void)(*engine)->AddTable(t.get(), {});

  const std::string sock = dir + "/engramd.sock";
  std::vector<std::string> args = {engramd, "--model",     model,    "--socket",
                                   sock,    "--log-level", "warning"};
  if (workers != 0) {
    args.push_back("--workers");
    args.push_back(std::to_string(workers));
  }
  args.insert(args.end(), daemon_args.begin(), daemon_args.end());
  printf("  engramd:");
  for (size_t i = 1; i < args.size(); ++i) printf(" %s", args[i].c_str());
  printf("\n\n");
  fflush(stdout);
  const pid_t daemon = engram::bench::StartEngramd(args, sock);
  if (daemon < 0) return 1;

  engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  o.socket_path = sock.c_str();
  o.data_bytes = large * (264 + 8) + (2 << 20);
  o.spin_ns = spin_us * 1000;
  o.client_name = "engramd-bench";
  engram_session* s;
  if (engram_connect(&o, &s) != 0) {
    fprintf(stderr, "connect: %s\n", engram_last_error());
    kill(daemon, SIGKILL);
    return 1;
  }
  uint64_t* ids;
  uint8_t* out;
  engram_alloc(s, large * 8, reinterpret_cast<void**>(&ids));
  engram_alloc(s, large * 264, reinterpret_cast<void**>(&out));
  std::vector<uint8_t> local(large * 264);
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<uint64_t> pick(0, rows - 1);
  bool ok = true;

  auto nop_round_trips = [&](uint32_t iters) {
    std::vector<uint64_t> t;
    for (uint32_t i = 0; i < iters + iters / 10; ++i) {
      uint64_t ticket;
      const uint64_t t0 = NowNs();
      engram_submit_nop(s, &ticket);
      ok &= engram_wait(s, ticket, -1) == 0;
      if (i >= iters / 10) t.push_back(NowNs() - t0);
    }
    return Summarise(t);
  };
  // Alternates daemon and in-process gathers of the same fresh rows; evicts first when cold.
  auto compare = [&](uint64_t n, uint32_t iters, bool cold) {
    std::vector<uint64_t> via_daemon, in_process;
    for (uint32_t i = 0; i < iters; ++i) {
      for (uint64_t k = 0; k < n; ++k) ids[k] = pick(rng);
      std::vector<uint64_t> copy(ids, ids + n);
      if (cold) Evict(files);
      uint64_t t0 = NowNs();
      ok &= (*engine)->Gather({.table = table, .rows = copy, .dest = local.data()}).ok();
      in_process.push_back(NowNs() - t0);
      if (cold) Evict(files);
      engram_gather_request r{.size = sizeof(r),
                              .table = table->layer_id(),
                              .flags = 0,
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
  };

  const Summary idle = nop_round_trips(nop_iters);
  Warm(files);
  auto warm1 = compare(1152, warm_small, false);
  auto warm2 = compare(large, warm_large, false);
  auto cold1 = compare(1152, cold_small, true);
  auto cold2 = compare(large, cold_large, true);
  Warm(files);

  // Busy: another client process keeps the daemon gathering 1,152-row batches meanwhile.
  pid_t busy = fork();
  if (busy == 0) {
    engram_session* b;
    engram_connect_options bo = o;
    bo.client_name = "busy";
    if (engram_connect(&bo, &b) != 0) _exit(1);
    uint64_t* bids;
    uint8_t* bout;
    engram_alloc(b, 1152 * 8, reinterpret_cast<void**>(&bids));
    engram_alloc(b, 1152 * 264, reinterpret_cast<void**>(&bout));
    std::mt19937_64 r2(5);
    while (true) {
      for (int k = 0; k < 1152; ++k) bids[k] = r2() % rows;
      engram_gather_request r{.size = sizeof(r),
                              .table = 1,
                              .flags = 0,
                              .rows = bids,
                              .num_rows = 1152,
                              .dest = bout,
                              .dest_offsets = nullptr};
      if (engram_gather(b, &r, -1) != 0) _exit(2);
    }
  }
  usleep(100000);
  const Summary busy_rt = nop_round_trips(nop_iters);
  kill(busy, SIGKILL);
  waitpid(busy, nullptr, 0);
  struct engram_session_stats st {};
  st.size = sizeof(st);
  engram_get_session_stats(s, &st);
  engram_close(s);
  kill(daemon, SIGTERM);
  int status = 0;
  waitpid(daemon, &status, 0);

  printf("empty request round trip (submit NOP + wait), %u each:\n", nop_iters);
  printf("  idle daemon:  p50 %7.2f µs  p99 %7.2f µs  p99.9 %7.2f µs\n", idle.p50 / 1e3,
         idle.p99 / 1e3, idle.p999 / 1e3);
  printf(
      "  busy daemon:  p50 %7.2f µs  p99 %7.2f µs  p99.9 %7.2f µs   (another client gathering "
      "1,152-row batches)\n\n",
      busy_rt.p50 / 1e3, busy_rt.p99 / 1e3, busy_rt.p999 / 1e3);
  printf("%-20s %5s | %10s %10s %10s | %10s %10s %10s | %6s %6s\n", "gather (µs)", "iters",
         "daemon p50", "p99", "p99.9", "in-proc p50", "p99", "p99.9", "p50 x", "p99 x");
  auto row = [&](const char* name, uint32_t iters, const std::pair<Summary, Summary>& r) {
    printf("%-20s %5u | %10.1f %10.1f %10.1f | %11.1f %10.1f %10.1f | %5.2fx %5.2fx\n", name, iters,
           r.first.p50 / 1e3, r.first.p99 / 1e3, r.first.p999 / 1e3, r.second.p50 / 1e3,
           r.second.p99 / 1e3, r.second.p999 / 1e3,
           double(r.first.p50) / double(std::max<uint64_t>(1, r.second.p50)),
           double(r.first.p99) / double(std::max<uint64_t>(1, r.second.p99)));
  };
  row("1,152 rows warm", warm_small, warm1);
  row((std::to_string(large) + " rows warm").c_str(), warm_large, warm2);
  row("1,152 rows cold", cold_small, cold1);
  row((std::to_string(large) + " rows cold").c_str(), cold_large, cold2);
  const double ratio = double(warm1.first.p50) / double(std::max<uint64_t>(1, warm1.second.p50));
  printf(
      "\ntargets: warm 1,152-row ratio %.2fx (target <= 1.25x): %s; busy empty round trip "
      "p50 %.2f µs (target < 5 µs): %s\n",
      ratio, ratio <= 1.25 ? "met" : "MISSED", busy_rt.p50 / 1e3,
      busy_rt.p50 < 5000 ? "met" : "MISSED");
  printf("session: %" PRIu64 " requests, %" PRIu64 " doorbells, %" PRIu64
         " client futex sleeps; engramd exit status %d\n",
         st.requests_ok, st.doorbells, st.client_sleeps,
         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  printf("bytes: %s\n", ok ? "daemon and in-process gathers identical" : "MISMATCH or error");
  if (temp_dir) std::filesystem::remove_all(dir);
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
