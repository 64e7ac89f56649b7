// memory.pressure_file against what an attacker or a careless operator may name there: a FIFO
// (opening it must not wait for a writer), /dev/zero or /dev/urandom (endless: never read), a
// file far longer than PSI (read no further than a PSI file can be), and a FIFO swapped in
// while the cache follows the file. Each call that would block or take memory without end runs in
// a bounded child (testkit/bounded_child.h).
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "store/pressure_monitor.h"
#include "testkit/bounded_child.h"
#include "testkit/table_test_util.h"

namespace engram {
namespace {

using Catch::Contains;
using testing::RunBounded;

std::string Text(const absl::Status& s) {
  return absl::StatusCodeToString(s.code()) + ": " + std::string(s.message());
}

// PressureMonitor::Start on `path`, as the row store starts it, in a bounded child.
testing::ChildOutcome StartOn(const std::string& path) {
  return RunBounded([&] {
    auto cache = RowCache::Create({.max_bytes = 1 << 20}, nullptr);
    if (!cache.ok()) return Text(cache.status());
    PressureMonitor monitor(cache->get(), (*cache)->capacity_slots(), {.path = path},
                            [](const std::string&) {});
    return Text(monitor.Start());
  });
}

void WritePsi(const std::string& path, uint64_t some_us) {
  std::ofstream(path, std::ios::trunc)
      << "some avg10=0.00 avg60=0.00 avg300=0.00 total=" << some_us << "\n"
      << "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
}

TEST_CASE("a FIFO as memory.pressure_file is refused at once, naming the setting", "[pressure]") {
  testing::TempDir dir;
  const std::string fifo = dir / "memory.pressure";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  testing::ChildOutcome r = StartOn(fifo);
  INFO("wait status " << r.wait_status);
  REQUIRE(r.returned);
  REQUIRE(r.text ==
          "FAILED_PRECONDITION: memory.pressure_file " + fifo + " is a FIFO, not a regular file");
  REQUIRE(Text(CheckPressureFile(fifo)) == r.text);
}

TEST_CASE("an endless device as memory.pressure_file is refused, never read", "[pressure]") {
  for (const std::string device : {"/dev/zero", "/dev/urandom"}) {
    testing::ChildOutcome r = StartOn(device);
    INFO(device << ": wait status " << r.wait_status << ", peak RSS " << (r.max_rss_bytes >> 20)
                << " MiB");
    REQUIRE(r.returned);
    REQUIRE(r.text == "FAILED_PRECONDITION: memory.pressure_file " + device +
                          " is a character device, not a regular file");
    REQUIRE(r.max_rss_bytes < (uint64_t{192} << 20));
  }
  // Through a link: what counts is the file it leads to.
  testing::TempDir dir;
  const std::string link = dir / "pressure";
  REQUIRE(symlink("/dev/zero", link.c_str()) == 0);
  REQUIRE_THAT(Text(CheckPressureFile(link)),
               Contains("FAILED_PRECONDITION") && Contains("is a character device"));
  const std::string psi = dir / "psi";
  WritePsi(psi, 5);
  REQUIRE(std::filesystem::remove(link));
  REQUIRE(symlink(psi.c_str(), link.c_str()) == 0);
  REQUIRE(CheckPressureFile(link).ok());
}

TEST_CASE("a file longer than PSI text is read no further than PSI can be", "[pressure]") {
  testing::TempDir dir;
  const std::string big = dir / "big";
  {
    std::ofstream out(big);
    for (int i = 0; i < 100000; ++i) out << "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n";
  }
  absl::Status s = CheckPressureFile(big);
  REQUIRE(absl::IsNotFound(s));  // not PSI: the cache keeps its size, the start goes on
  REQUIRE_THAT(std::string(s.message()),
               Contains("memory.pressure_file cannot be read as a PSI file") &&
                   Contains(big + " holds more than 1024 bytes"));
}

TEST_CASE("a FIFO swapped in after the start is no sample, and does not block", "[pressure]") {
  testing::TempDir dir;
  const std::string psi = dir / "memory.pressure";
  WritePsi(psi, 0);
  testing::ChildOutcome r = RunBounded([&] {
    auto cache = RowCache::Create({.max_bytes = 1 << 20}, nullptr);
    if (!cache.ok()) return Text(cache.status());
    PressureMonitor monitor(cache->get(), (*cache)->capacity_slots(),
                            {.path = psi, .interval_ns = 3'600'000'000'000},
                            [](const std::string&) {});
    if (absl::Status s = monitor.Start(); !s.ok()) return Text(s);
    const std::string fifo = psi + ".fifo";
    if (mkfifo(fifo.c_str(), 0600) != 0 || rename(fifo.c_str(), psi.c_str()) != 0) {
      return std::string("cannot put a FIFO in place");
    }
    return std::string(monitor.Tick(5'000'000'000).has_value() ? "a sample" : "no sample");
  });
  REQUIRE(r.returned);
  REQUIRE(r.text == "no sample");
}

}  // namespace
}  // namespace engram
