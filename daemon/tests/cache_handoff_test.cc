// The pieces of keeping the row cache across restarts that need no daemon: the hot-set file
// (round trip, and every damage named), the passed descriptors split by name (the row cache's
// memfd and socket activation's socket together), and the tables' identity (stable for the same
// files, another for a touched file).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/ops/fd_store.h"
#include "store/cache_handoff.h"
#include "daemon/server/hot_set.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/engram-handoff-unit-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}

TEST_CASE("a hot set reads back as written, at most max_keys of it") {
  const std::string dir = TempDir();
  const std::string path = dir + "/hot";
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 5000; ++i) keys.push_back(RowCacheKey(i % 3, i * 7));
  REQUIRE(WriteHotSet(path, keys).ok());
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
  auto back = ReadHotSet(path, 1 << 20);
  REQUIRE(back.ok());
  REQUIRE(*back == keys);
  auto some = ReadHotSet(path, 10);
  REQUIRE(some.ok());
  REQUIRE(some->size() == 10);
  REQUIRE(std::equal(some->begin(), some->end(), keys.begin()));
  // Rewritten: replaced whole.
  REQUIRE(WriteHotSet(path, std::span<const uint64_t>(keys).first(3)).ok());
  REQUIRE(ReadHotSet(path, 100)->size() == 3);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a damaged or missing hot set is refused, naming the file and what is wrong") {
  const std::string dir = TempDir();
  const std::string path = dir + "/hot";
  std::vector<uint64_t> keys(100, RowCacheKey(14, 9));
  REQUIRE(WriteHotSet(path, keys).ok());
  auto refused = [&](const char* what) {
    absl::StatusOr<std::vector<uint64_t>> r = ReadHotSet(path, 1000);
    REQUIRE_FALSE(r.ok());
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(r.status().message()), Catch::Contains(path));
    REQUIRE_THAT(std::string(r.status().message()), Catch::Contains(what));
  };
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  SECTION("a flipped key") {
    const uint8_t x = 0x55;
    REQUIRE(pwrite(fd, &x, 1, 24 + 8 * 50 + 3) == 1);
    refused("checksum");
  }
  SECTION("cut short") {
    REQUIRE(ftruncate(fd, 24 + 8 * 60) == 0);
    refused("says 100 rows");
  }
  SECTION("another magic") {
    REQUIRE(pwrite(fd, "EGRMHOT9", 8, 0) == 8);
    refused("magic");
  }
  SECTION("too short for a header") {
    REQUIRE(ftruncate(fd, 10) == 0);
    refused("too short");
  }
  close(fd);
  REQUIRE(ReadHotSet(dir + "/none", 10).status().code() == absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST_CASE("passed descriptors: the row cache by name, the socket as the first other one") {
  // systemd passes them from fd 3 on (opened above 100 first: open() may return 3 itself).
  for (int fd = 3; fd <= 5; ++fd) {
    const int n = open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(n >= 0);
    const int high = fcntl(n, F_DUPFD_CLOEXEC, 100);
    close(n);
    REQUIRE(dup2(high, fd) == fd);
    close(high);
  }
  setenv("LISTEN_PID", std::to_string(getpid()).c_str(), 1);
  setenv("LISTEN_FDS", "3", 1);
  setenv("LISTEN_FDNAMES", "engramd.socket:row-cache:row-cache", 1);
  PassedFds passed = TakePassedFds();
  CHECK(passed.socket_fd == 3);
  CHECK(passed.row_cache.get() == 4);
  REQUIRE(passed.notes.size() == 1);  // the second row-cache fd, closed
  CHECK_THAT(passed.notes[0], Catch::Contains("second descriptor named row-cache"));
  CHECK(fcntl(5, F_GETFD) < 0);
  CHECK(getenv("LISTEN_FDS") == nullptr);
  CHECK((fcntl(3, F_GETFD) & FD_CLOEXEC) != 0);
  close(3);
  // A restart without socket activation: the row cache alone, no socket taken.
  REQUIRE(dup2(passed.row_cache.get(), 3) == 3);
  passed.row_cache.Reset();
  setenv("LISTEN_PID", std::to_string(getpid()).c_str(), 1);
  setenv("LISTEN_FDS", "1", 1);
  setenv("LISTEN_FDNAMES", "row-cache", 1);
  PassedFds alone = TakePassedFds();
  CHECK(alone.socket_fd == -1);
  CHECK(alone.row_cache.get() == 3);
}

TEST_CASE("the tables' identity is stable for the same files and changes with them") {
  const std::string dir = TempDir();
  const SynthOptions synth{.out_dir = dir + "/model", .rows = 1000, .seed = 2};
  REQUIRE(WriteSyntheticCheckpoint(synth).ok());
  auto open_all = [&] {
    auto t = OpenTables(dir + "/model", {});
    REQUIRE(t.ok());
    return std::move(*t);
  };
  const uint64_t first = TablesIdentity(open_all());
  CHECK(first != 0);
  CHECK(TablesIdentity(open_all()) == first);
  // One layer fewer: another identity.
  auto tables = open_all();
  tables.pop_back();
  CHECK(TablesIdentity(tables) != first);
  // The file of layer 14 touched: another identity.
  const std::filesystem::path shard = dir + "/model/" + SyntheticShardName(synth, 14);
  std::filesystem::last_write_time(shard, std::filesystem::last_write_time(shard) +
                                              std::chrono::seconds(1));
  CHECK(TablesIdentity(open_all()) != first);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace engram
