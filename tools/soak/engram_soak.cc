// engram-soak: replays decode- and prefill-like gathers from several client processes against a
// running engramd serving a synthetic checkpoint, checks every byte of every row, reconnects
// when the daemon restarts, and reports rows served, errors, wrong bytes and the daemon's
// RSS and fd high-water marks.
//
//   engram-soak --socket /run/engramd/engramd.sock --seed 7 --rows 400000
//               --clients 4 --seconds 3600 [--target-rows 500000000] [--json]
// Exit status: 0 when no byte was wrong and no request failed; 1 otherwise; 2 on bad usage.
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/command_line.h"
#include "engram/engram.h"
#include "tables/table.h"
#include "testkit/synthetic.h"

namespace {

using engram::kRowBytes;

struct Options {
  std::string socket = "/run/engramd/engramd.sock";
  uint64_t seed = 0;
  uint64_t rows = 0;  // rows per table of the synthetic checkpoint
  std::vector<uint32_t> layers = {1, 14};
  int clients = 4;
  int report_every = 0;  // seconds between progress lines; 0: none
  double seconds = 60;
  uint64_t target_rows = 0;  // stop once this many rows were served (0: time only)
  uint32_t decode_rows = 1152;
  uint32_t prefill_rows = 98304;
  uint32_t prefill_every = 16;  // one prefill-like gather per this many decode-like ones
  bool json = false;
};

// Counters shared by the client processes (an anonymous shared mapping).
struct Shared {
  std::atomic<uint64_t> rows;
  std::atomic<uint64_t> requests;
  std::atomic<uint64_t> errors;      // requests that failed (other than a daemon restart)
  std::atomic<uint64_t> wrong_rows;  // rows whose bytes differed from the checkpoint
  std::atomic<uint64_t> reconnects;  // sessions lost (-ENOTCONN) and opened again
  std::atomic<bool> stop;
  char first_error[256];
  std::atomic<bool> error_recorded;
};

void RecordError(Shared* shared, const std::string& what) {
  bool expected = false;
  if (shared->error_recorded.compare_exchange_strong(expected, true)) {
    snprintf(shared->first_error, sizeof(shared->first_error), "%s", what.c_str());
  }
}

uint64_t Next(uint64_t& x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

// One session's worth of buffers in the arena; false when the daemon is not there.
struct Client {
  engram_session* session = nullptr;
  uint64_t* ids = nullptr;
  uint8_t* out = nullptr;
  bool Open(const Options& o) {
    engram_connect_options c;
    engram_connect_options_init(&c, sizeof(c));
    c.socket_path = o.socket.c_str();
    c.client_name = "engram-soak";
    c.data_bytes = uint64_t{o.prefill_rows} * (kRowBytes + 8) + (1 << 20);
    if (engram_session_open(&c, &session) != 0) return false;
    if (engram_alloc(session, uint64_t{o.prefill_rows} * 8, reinterpret_cast<void**>(&ids)) != 0 ||
        engram_alloc(session, uint64_t{o.prefill_rows} * kRowBytes,
                     reinterpret_cast<void**>(&out)) != 0) {
      engram_session_close(session);
      session = nullptr;
      return false;
    }
    return true;
  }
  void Close() {
    if (session != nullptr) engram_session_close(session);
    session = nullptr;
  }
};

// Gathers `n` random rows of `layer` and checks them; returns rows served, or -1 when the
// session was lost.
int64_t GatherAndCheck(const Options& o, Shared* shared, Client& c, uint32_t layer, uint32_t n,
                       uint64_t& rng) {
  for (uint32_t i = 0; i < n; ++i) c.ids[i] = Next(rng) % o.rows;
  // Through engramd whatever the tier: the daemon is what the soak loads.
  engram_gather_request r{.size = sizeof(r),
                          .layer = layer,
                          .flags = ENGRAM_GATHER_VIA_DAEMON,
                          .rows = c.ids,
                          .num_rows = n,
                          .dest = c.out,
                          .dest_offsets = nullptr};
  const int rc = engram_gather(c.session, &r, 60'000'000'000);
  shared->requests.fetch_add(1);
  if (rc == -ENOTCONN || rc == -ECONNRESET || rc == -EPIPE) return -1;
  if (rc != 0) {
    shared->errors.fetch_add(1);
    RecordError(shared, std::string("gather: ") + engram_last_error());
    return 0;
  }
  uint8_t expect[kRowBytes];
  for (uint32_t i = 0; i < n; ++i) {
    engram::SyntheticRow(o.seed, layer, c.ids[i], expect);
    if (memcmp(expect, c.out + uint64_t{i} * kRowBytes, kRowBytes) != 0) {
      shared->wrong_rows.fetch_add(1);
      RecordError(shared, "wrong bytes in row " + std::to_string(c.ids[i]) + " of layer " +
                              std::to_string(layer));
    }
  }
  shared->rows.fetch_add(n);
  return n;
}

void RunClient(const Options& o, Shared* shared, int index) {
  uint64_t rng = (o.seed + 1) * 0x9E3779B97F4A7C15ull + uint64_t(index) * 7919 + 1;
  Client c;
  uint64_t step = 0;
  while (!shared->stop.load()) {
    if (c.session == nullptr && !c.Open(o)) {
      usleep(50'000);  // the daemon is restarting
      continue;
    }
    const uint32_t layer = o.layers[step % o.layers.size()];
    const uint32_t n =
        step % o.prefill_every == o.prefill_every - 1 ? o.prefill_rows : o.decode_rows;
    ++step;
    if (GatherAndCheck(o, shared, c, layer, n, rng) < 0) {
      c.Close();
      shared->reconnects.fetch_add(1);
    }
  }
  c.Close();
}

// The daemon behind the socket (SO_PEERCRED), or -1.
pid_t DaemonPid(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  pid_t pid = -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) pid = cred.pid;
  }
  close(fd);
  return pid;
}

struct Sample {
  uint64_t rss_kb = 0;
  uint64_t fds = 0;
};
Sample SampleOf(pid_t pid) {
  Sample s;
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kb = std::stoull(line.substr(6));
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++s.fds;
  }
  return s;
}

// The daemon's memory and fds: at the start of its current run, now, and their highest.
struct DaemonSamples {
  Sample first, last, high;
  pid_t daemon = -1;

  void Take(const std::string& socket) {
    const pid_t now = DaemonPid(socket);
    if (now <= 0) return;
    const Sample s = SampleOf(now);
    if (now != daemon) first = s;  // a restarted daemon starts a new baseline
    daemon = now;
    last = s;
    high.rss_kb = std::max(high.rss_kb, s.rss_kb);
    high.fds = std::max(high.fds, s.fds);
  }
};

void AddOptions(CLI::App& app, Options& o) {
  app.add_option("--socket", o.socket, "engramd's socket");
  app.add_option("--seed", o.seed, "seed of the synthetic checkpoint engramd serves")->required();
  app.add_option("--rows", o.rows, "rows per table of that checkpoint")->required();
  app.add_option("--layers", o.layers, "layers to gather from");
  app.add_option("--clients", o.clients, "client processes")->check(CLI::Range(1, 256));
  app.add_option("--seconds", o.seconds, "how long to run");
  app.add_option("--target-rows", o.target_rows, "stop once this many rows were served");
  app.add_option("--decode-rows", o.decode_rows, "rows of a decode-like gather");
  app.add_option("--prefill-rows", o.prefill_rows, "rows of a prefill-like gather");
  app.add_option("--prefill-every", o.prefill_every, "one prefill-like gather per N")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option(
         "--report-every", o.report_every,
         "print a progress line (rows, errors, daemon RSS and fds) every S seconds; 0: none")
      ->check(CLI::Range(0, 86400));
  app.add_flag("--json", o.json, "print the report as JSON");
}

// Forks the client processes; they run until shared->stop.
std::vector<pid_t> StartClients(const Options& o, Shared* shared) {
  std::vector<pid_t> children;
  for (int i = 0; i < o.clients; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      RunClient(o, shared, i);
      _exit(0);
    }
    children.push_back(pid);
  }
  return children;
}

// Samples the daemon twice a second until the time or the row target is reached, with a
// progress line every --report-every seconds.
DaemonSamples WatchDaemon(const Options& o, const Shared* shared,
                          std::chrono::steady_clock::time_point start) {
  DaemonSamples samples;
  double next_report = o.report_every;
  while (true) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed >= o.seconds || (o.target_rows != 0 && shared->rows.load() >= o.target_rows)) break;
    samples.Take(o.socket);
    if (o.report_every > 0 && elapsed >= next_report) {
      // One line per period on stderr, so that a long run shows whether memory and fds stay
      // flat, not only where they ended.
      fprintf(stderr,
              "engram-soak: %6.0f s: %llu rows, %llu errors, %llu wrong rows, %llu reconnects; "
              "daemon RSS %llu kB, fds %llu\n",
              elapsed, (unsigned long long)shared->rows.load(),
              (unsigned long long)shared->errors.load(),
              (unsigned long long)shared->wrong_rows.load(),
              (unsigned long long)shared->reconnects.load(),
              (unsigned long long)samples.last.rss_kb, (unsigned long long)samples.last.fds);
      next_report += o.report_every;
    }
    usleep(500'000);
  }
  return samples;
}

void PrintReport(const Options& o, const Shared* shared, double seconds, const DaemonSamples& d) {
  const char* fmt =
      o.json
          ? "{\"seconds\": %.1f, \"clients\": %d, \"rows\": %llu, \"requests\": %llu, "
            "\"rows_per_second\": %.0f, \"errors\": %llu, \"wrong_rows\": %llu, "
            "\"reconnects\": %llu, \"rss_kb_first\": %llu, \"rss_kb_last\": %llu, "
            "\"rss_kb_high\": %llu, \"fds_first\": %llu, \"fds_last\": %llu, \"fds_high\": %llu}\n"
          : "engram-soak: %.1f s, %d clients: %llu rows in %llu requests (%.0f rows/s); "
            "%llu errors, %llu wrong rows, %llu reconnects; daemon RSS %llu -> %llu kB (high "
            "%llu), fds %llu -> %llu (high %llu)\n";
  printf(fmt, seconds, o.clients, (unsigned long long)shared->rows.load(),
         (unsigned long long)shared->requests.load(), double(shared->rows.load()) / seconds,
         (unsigned long long)shared->errors.load(), (unsigned long long)shared->wrong_rows.load(),
         (unsigned long long)shared->reconnects.load(), (unsigned long long)d.first.rss_kb,
         (unsigned long long)d.last.rss_kb, (unsigned long long)d.high.rss_kb,
         (unsigned long long)d.first.fds, (unsigned long long)d.last.fds,
         (unsigned long long)d.high.fds);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Replays decode- and prefill-like gathers against engramd, checking every byte"};
  AddOptions(app, o);
  if (std::optional<int> done = engram::cli::Parse(app, argc, argv)) return *done;

  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (shared) Shared{};
  const std::vector<pid_t> children = StartClients(o, shared);
  const auto start = std::chrono::steady_clock::now();
  const DaemonSamples samples = WatchDaemon(o, shared, start);
  shared->stop.store(true);
  for (pid_t c : children) waitpid(c, nullptr, 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool clean = shared->errors.load() == 0 && shared->wrong_rows.load() == 0;
  PrintReport(o, shared, seconds, samples);
  if (shared->error_recorded.load()) fprintf(stderr, "first error: %s\n", shared->first_error);
  return clean ? 0 : 1;
}
