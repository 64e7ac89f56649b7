// A shrink storm through engramd: client processes gather from a cache-tier table, reading the
// row cache in place, while the test drives the daemon's pressure monitor (a PSI file the test
// writes, sampled every 20 ms) through repeated shrinks to the floor and grows back. The cache
// is much smaller than the table, so rows are evicted all the time. Every row is checked
// against the synthetic row function, every gather must succeed, no client may die (SIGBUS
// above all), and the pages the row cache's memfd holds (its st_blocks, read through
// /proc/PID/fd) stay within the cache's budget throughout and within its capacity (plus a
// stated slack) once a shrink has settled.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "base/page_size.h"
#include "engram/engram.h"
#include "protocol/row_cache_layout.h"
#include "testkit/daemon_test_util.h"

using engram::kRowBytes;
using namespace engram::testing;

namespace {

constexpr uint64_t kCacheBytes = 2 << 20;  // about 5,500 of the table's 20,000 rows
constexpr int kClients = 3;
constexpr uint64_t kRowsPerGather = 256;
constexpr int kCycles = 24;
constexpr int kHoldEvery = 4;  // every 4th cycle holds the floor until its pages are given back
// Above the capacity's bytes once a shrink has settled, in kernel pages: the slots below the
// first one that starts a page keep theirs (at most page / 32 - 1 slots of 288 bytes, under 9
// pages: 36 KiB with 4 KiB pages, 576 KiB with 64 KiB ones), and a few pages a reader may have
// faulted back in and the daemon not yet given back again.
const uint64_t kSettledSlack = 16 * engram::KernelPageBytes();

// Runs `fn` at the end of the scope.
struct Cleanup {
  std::function<void()> fn;
  ~Cleanup() { fn(); }
};

// What one client process did, in memory shared with the test.
struct ClientReport {
  std::atomic<uint64_t> gathers;
  std::atomic<uint64_t> rows_in_place;
  std::atomic<uint64_t> rows_through_daemon;
  std::atomic<int> failed_gather;  // 0, or the first failing gather's -errno
  std::atomic<int> bad_rows;       // gathers with a row that did not match
  char error[256];
};
struct Shared {
  std::atomic<bool> stop;
  std::atomic<int> ready;
  ClientReport clients[kClients];
};

// A client: plain engram_gather (the cache tier's hits read in place, misses through engramd) of
// random rows of layer 1 until told to stop. Exit code 0 unless it could not connect.
int Client(const Daemon& d, Shared* shared, int index) {
  ClientReport& r = shared->clients[index];
  engram_connect_options o = d.Options(kRowsPerGather * (kRowBytes + 32) + (1 << 20), 8);
  engram_session* s = nullptr;
  if (engram_session_open(&o, &s) != 0) return 10;
  uint64_t* rows = nullptr;
  uint8_t* out = nullptr;
  if (engram_alloc(s, kRowsPerGather * 8, reinterpret_cast<void**>(&rows)) != 0 ||
      engram_alloc(s, kRowsPerGather * kRowBytes, reinterpret_cast<void**>(&out)) != 0) {
    return 11;
  }
  shared->ready.fetch_add(1);
  for (uint64_t b = 0; !shared->stop.load(std::memory_order_relaxed); ++b) {
    // Half of each gather from a hot range the full cache holds, so that there are hits to
    // read in place at every size; the rest from the whole table.
    FillRows(rows, kRowsPerGather / 2, 2000, index * 1'000'003 + b);
    FillRows(rows + kRowsPerGather / 2, kRowsPerGather / 2, kRows, index * 1'000'003 + b + 7);
    std::memset(out, 0xEE, kRowsPerGather * kRowBytes);
    engram_gather_request req{
        .size = sizeof(req), .layer = 1, .rows = rows, .num_rows = kRowsPerGather, .dest = out};
    const int rc = engram_gather(s, &req, 30'000'000'000);
    if (rc != 0) {
      int none = 0;
      if (r.failed_gather.compare_exchange_strong(none, rc)) {
        snprintf(r.error, sizeof(r.error), "%s", engram_last_error());
      }
      break;
    }
    if (FirstBadRow(1, rows, kRowsPerGather, out) >= 0) r.bad_rows.fetch_add(1);
    r.gathers.fetch_add(1, std::memory_order_relaxed);
  }
  engram_session_stats stats{.size = sizeof(stats)};
  if (engram_get_session_stats(s, &stats) == 0) {
    r.rows_in_place = stats.rows_in_place;
    r.rows_through_daemon = stats.rows;
  }
  engram_session_close(s);
  return 0;
}

// The daemon's descriptor of its row cache memfd, as /proc/PID/fd/N (stat follows it to the
// memfd itself), or "".
std::string RowCacheFdPath(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(e.path(), link_ec).string();
    if (target.find("memfd:engram-row-cache") != std::string::npos) return e.path().string();
  }
  return "";
}

// The PSI file the daemon samples, written whole and renamed into place (a sample never reads
// half a file). Pressure: the stall total grows by the wall time since the last write (100 %
// stalled); calm: it stays.
class PsiFile {
 public:
  explicit PsiFile(std::string path) : path_(std::move(path)) { Write(); }
  void Pressure() {
    const auto now = std::chrono::steady_clock::now();
    total_us_ += std::chrono::duration_cast<std::chrono::microseconds>(now - last_).count() + 1000;
    last_ = now;
    Write();
  }
  void Calm() {
    last_ = std::chrono::steady_clock::now();
    Write();
  }
  const std::string& path() const { return path_; }

 private:
  void Write() {
    const std::string tmp = path_ + ".new";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << "some avg10=0.00 avg60=0.00 avg300=0.00 total=" << total_us_ << "\n"
          << "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    }
    std::filesystem::rename(tmp, path_);
  }
  std::string path_;
  uint64_t total_us_ = 0;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

TEST_CASE("a shrink storm with clients reading the row cache in place", "[store][storm]") {
  const std::string dir = TestDir() + "/storm";
  std::filesystem::create_directories(dir);
  PsiFile psi(dir + "/memory.pressure");
  Daemon d({"--tier", "1=cache", "--cache-bytes", std::to_string(kCacheBytes), "--pressure-file",
            psi.path(), "--pressure-interval", "20"},
           "storm");
  REQUIRE(d.alive());
  const std::string memfd = RowCacheFdPath(d.pid());
  INFO("the row cache memfd of engramd " << d.pid() << ": " << memfd);
  REQUIRE(!memfd.empty());

  // The test's own read-only view of the cache, for its capacity (the header's word).
  engram_connect_options o = d.Options(1 << 20, 4);
  engram_session* view = nullptr;
  REQUIRE(engram_session_open(&o, &view) == 0);
  engram_table_map* map = nullptr;
  REQUIRE(engram_table_map_open_any(view, 1, &map) == 0);
  engram_table_map_info info{.size = sizeof(info)};
  REQUIRE(engram_get_table_map_info(map, &info) == 0);
  REQUIRE(info.kind == ENGRAM_TABLE_MAP_ROW_CACHE);
  const auto* header = static_cast<const engram::RowCacheHeader*>(info.base);
  const auto capacity = [&] {
    return uint64_t{header->capacity_slots.load(std::memory_order_acquire)};
  };
  const auto bytes_at = [&](uint64_t slots) {
    return header->slots_offset + slots * header->slot_bytes;
  };
  const uint64_t full = capacity();
  const uint64_t floor = static_cast<uint64_t>(full * 0.0625);  // PressureOptions' floor
  REQUIRE(full == header->max_slots);
  REQUIRE(info.map_bytes <= kCacheBytes);
  const auto allocated = [&] {
    struct stat st;
    return stat(memfd.c_str(), &st) == 0 ? uint64_t(st.st_blocks) * 512 : UINT64_MAX;
  };

  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(shared != MAP_FAILED);
  new (shared) Shared{};
  std::vector<pid_t> clients;
  std::atomic<bool> sampling{true};
  std::thread sampler;
  // A failed REQUIRE leaves no client gathering and no thread running behind it.
  const Cleanup cleanup{[&] {
    shared->stop = true;
    sampling = false;
    if (sampler.joinable()) sampler.join();
    for (pid_t pid : clients) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    munmap(shared, sizeof(Shared));
  }};
  for (int i = 0; i < kClients; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      _exit(Client(d, shared, i));
    }
    clients.push_back(pid);
  }
  for (int i = 0; i < 1000 && shared->ready.load() < kClients; ++i) usleep(10000);
  REQUIRE(shared->ready.load() == kClients);

  // Every millisecond: the memfd's allocated bytes, which must never pass the cache's budget.
  // Also, for the record, the most it held above the floor's bytes while the capacity was at
  // the floor, settled or not (pages a reader faulted back in wait up to a second or so).
  std::atomic<uint64_t> max_allocated{0}, max_above_floor{0}, samples{0};
  sampler = std::thread([&] {
    while (sampling.load()) {
      const uint64_t before = capacity();
      const uint64_t a = allocated();
      if (a > max_allocated.load()) max_allocated = a;
      if (before == floor && capacity() == floor && a > bytes_at(floor) &&
          a - bytes_at(floor) > max_above_floor.load()) {
        max_above_floor = a - bytes_at(floor);
      }
      samples.fetch_add(1);
      usleep(1000);
    }
  });

  // Drives PSI until `done` or `seconds` pass; whether `done` came.
  const auto drive = [&](bool pressure, double seconds, const std::function<bool()>& done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      if (done()) return true;
      pressure ? psi.Pressure() : psi.Calm();
      usleep(5000);
    }
    return done();
  };
  uint64_t settled_max = 0, settled_capacity_bytes = 0;
  int cycles = 0;
  const auto started = std::chrono::steady_clock::now();
  for (; cycles < kCycles; ++cycles) {
    INFO("cycle " << cycles << ": capacity " << capacity() << " of " << full << ", floor "
                  << floor);
    REQUIRE(drive(true, 15, [&] { return capacity() <= floor; }));
    if (cycles % kHoldEvery == kHoldEvery - 1) {
      // Held at the floor for more than the second between two give-backs of pages readers
      // faulted back in: what the memfd holds is the capacity's bytes and the slack. A test
      // thread kept off the CPU for five samples reads as calm and the cache grows a step: the
      // hold then starts again (at most three times).
      bool held = false;
      for (int attempt = 0; attempt < 3 && !held; ++attempt) {
        REQUIRE(drive(true, 15, [&] { return capacity() <= floor; }));
        if (drive(true, 1.5, [&] { return capacity() != floor; })) continue;
        uint64_t most = 0;
        for (int i = 0; i < 40; ++i) {
          psi.Pressure();  // still under pressure: at the floor, nothing moves
          const uint64_t a = allocated();
          most = std::max(most, a - std::min(a, bytes_at(floor)));
          usleep(5000);
        }
        if (capacity() != floor) continue;
        settled_max = std::max(settled_max, most);
        held = true;
      }
      CHECK(held);
      settled_capacity_bytes = bytes_at(floor);
    }
    REQUIRE(drive(false, 15, [&] { return capacity() == full; }));
  }
  const double storm_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  shared->stop = true;
  for (pid_t pid : clients) {
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    INFO("client " << pid << " wait status " << status);
    CHECK(WIFEXITED(status));  // not killed: no SIGBUS, no SIGSEGV
    if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) != SIGBUS);
    CHECK(WEXITSTATUS(status) == 0);
  }
  clients.clear();
  sampling = false;
  sampler.join();

  uint64_t gathers = 0, in_place = 0, through_daemon = 0;
  for (int i = 0; i < kClients; ++i) {
    const ClientReport& r = shared->clients[i];
    INFO("client " << i << ": " << r.error);
    CHECK(r.failed_gather.load() == 0);
    CHECK(r.bad_rows.load() == 0);
    CHECK(r.gathers.load() > 0);
    CHECK(r.rows_in_place.load() > 0);  // hits were read in place, at every size
    CHECK(r.rows_in_place.load() + r.rows_through_daemon.load() ==
          r.gathers.load() * kRowsPerGather);
    gathers += r.gathers;
    in_place += r.rows_in_place;
    through_daemon += r.rows_through_daemon;
  }
  const nlohmann::json cache = Ctl(d, "status")["store"]["cache"];
  fprintf(stderr,
          "storm: %d cycles (floor %lu, full %lu slots) in %.1f s; %lu gathers of %lu rows by %d "
          "clients, %lu rows read in place, %lu through engramd, %lu evictions; memfd allocated "
          "at most %lu bytes (budget %lu, region %lu) over %lu samples; at the floor at most %lu "
          "bytes above the capacity's %lu, settled %lu\n",
          cycles, floor, full, storm_seconds, gathers, kRowsPerGather, kClients, in_place,
          through_daemon, cache["evictions"].get<uint64_t>(), max_allocated.load(), kCacheBytes,
          info.map_bytes, samples.load(), max_above_floor.load(), settled_capacity_bytes,
          settled_max);
  CHECK(cycles == kCycles);
  CHECK(max_allocated.load() <= kCacheBytes);
  CHECK(settled_max <= kSettledSlack);
  CHECK(cache["evictions"].get<uint64_t>() > 0);
  CHECK(cache["resident_bytes"].get<uint64_t>() <= kCacheBytes);
  CHECK(d.alive());
  engram_table_map_close(map);
  engram_session_close(view);
}

}  // namespace
