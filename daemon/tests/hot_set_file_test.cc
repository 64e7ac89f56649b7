// The hot-set file against what an attacker or a careless operator puts at memory.hot_set_path or
// beside it: a FIFO (never blocks), a symbolic link, another file or a device node (never
// replaced, never written through), a file far larger than a hot set (never read whole). Each
// call that would block or take memory without end runs in a bounded child (bounded_child.h).
// The [device] case makes device nodes and needs root: it skips (exit 77) elsewhere.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/server/hot_set.h"
#include "testkit/bounded_child.h"
#include "tests/common/skip.h"

namespace engram {
namespace {

using Catch::Contains;
using testing::RunBounded;

struct Dir {
  std::string path;
  Dir() {
    char tmpl[] = "/tmp/engram-hot-set-file-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~Dir() { std::filesystem::remove_all(path); }
};

std::string Text(const absl::Status& s) {
  return absl::StatusCodeToString(s.code()) + ": " + std::string(s.message());
}

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

constexpr unsigned kChildSecondsForWriter = 10;

const std::vector<uint64_t> kKeys = {RowCacheKey(14, 1), RowCacheKey(14, 2), RowCacheKey(1, 7)};

// WriteHotSet, CheckHotSetPath and ReadHotSet of `path`, each in a bounded child; every one must
// return (not block) and refuse, naming the setting, the path and `what`.
void AllRefuse(const std::string& path, const std::string& named, const std::string& what) {
  for (auto call : {+[](const std::string& p) { return WriteHotSet(p, kKeys); },
                    +[](const std::string& p) { return CheckHotSetPath(p); },
                    +[](const std::string& p) { return ReadHotSet(p, 100).status(); }}) {
    testing::ChildOutcome r = RunBounded([&] { return Text(call(path)); });
    INFO("wait status " << r.wait_status);
    REQUIRE(r.returned);
    REQUIRE_THAT(r.text, Contains("FAILED_PRECONDITION") && Contains(named) && Contains(what));
  }
}

TEST_CASE("a FIFO at the hot set's path or its temporary neighbour is refused without blocking") {
  Dir dir;
  const std::string path = dir.path + "/hot-set";
  REQUIRE(mkfifo(path.c_str(), 0600) == 0);
  AllRefuse(path, "memory.hot_set_path " + path, "is a FIFO, not a regular file");
  struct stat st {};
  REQUIRE(lstat(path.c_str(), &st) == 0);
  REQUIRE(S_ISFIFO(st.st_mode));

  // The temporary neighbour a write opens for writing: a FIFO there would wait for a reader.
  REQUIRE(unlink(path.c_str()) == 0);
  const std::string tmp = path + ".tmp";
  REQUIRE(mkfifo(tmp.c_str(), 0600) == 0);
  testing::ChildOutcome r = RunBounded([&] { return Text(WriteHotSet(path, kKeys)); });
  REQUIRE(r.returned);
  REQUIRE_THAT(r.text, Contains("temporary file " + tmp + " is a FIFO"));
  REQUIRE(Text(CheckHotSetPath(path)) == r.text);
  REQUIRE(lstat(tmp.c_str(), &st) == 0);
  REQUIRE(S_ISFIFO(st.st_mode));
  REQUIRE_FALSE(std::filesystem::exists(path));
}

TEST_CASE("what is not a regular file is not even opened") {
  // Opening a device can act on it; a FIFO shows it: a writer waiting in open() would go on.
  Dir dir;
  const std::string path = dir.path + "/hot-set";
  REQUIRE(mkfifo(path.c_str(), 0600) == 0);
  const pid_t writer = fork();
  if (writer == 0) {
    alarm(kChildSecondsForWriter);
    _exit(open(path.c_str(), O_WRONLY | O_CLOEXEC) >= 0 ? 0 : 1);
  }
  usleep(100000);
  REQUIRE(absl::IsFailedPrecondition(CheckHotSetPath(path)));
  REQUIRE(absl::IsFailedPrecondition(ReadHotSet(path, 100).status()));
  REQUIRE(absl::IsFailedPrecondition(WriteHotSet(path, kKeys)));
  usleep(200000);
  int status = 0;
  CHECK(waitpid(writer, &status, WNOHANG) == 0);  // still waiting for a reader
  const int reader = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // lets it go
  REQUIRE(waitpid(writer, &status, 0) == writer);
  close(reader);
  CHECK(WIFEXITED(status));
}

TEST_CASE("a file that is not a hot set is never replaced, and stays as it was") {
  Dir dir;
  const std::string path = dir.path + "/engramd.toml";
  const std::string toml = "[memory]\nhot_set_path = \"" + path + "\"\n";
  std::ofstream(path) << toml;
  absl::Status s = WriteHotSet(path, kKeys);
  REQUIRE(absl::IsFailedPrecondition(s));
  REQUIRE_THAT(std::string(s.message()),
               Contains("memory.hot_set_path " + path) && Contains("not a hot set"));
  REQUIRE(Text(CheckHotSetPath(path)) == Text(s));
  REQUIRE(Contents(path) == toml);
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
  // An empty file is no hot set either.
  const std::string empty = dir.path + "/empty";
  std::ofstream(empty).flush();
  REQUIRE(absl::IsFailedPrecondition(WriteHotSet(empty, kKeys)));
  REQUIRE(std::filesystem::file_size(empty) == 0);
  // Nor is another file where the temporary one goes.
  const std::string hot = dir.path + "/hot-set";
  std::ofstream(hot + ".tmp") << toml;
  s = WriteHotSet(hot, kKeys);
  REQUIRE_THAT(std::string(s.message()), Contains("temporary file " + hot + ".tmp"));
  REQUIRE(Contents(hot + ".tmp") == toml);
  REQUIRE_FALSE(std::filesystem::exists(hot));
}

TEST_CASE(
    "a symbolic link at the path or its temporary neighbour is neither followed nor replaced") {
  Dir dir;
  const std::string path = dir.path + "/hot-set";
  REQUIRE(symlink("/dev/null", path.c_str()) == 0);
  AllRefuse(path, "memory.hot_set_path " + path, "is a symbolic link (to /dev/null)");
  REQUIRE(std::filesystem::is_symlink(path));

  // A link at PATH.tmp to a file of someone else's: a write through it would truncate that file.
  REQUIRE(unlink(path.c_str()) == 0);
  const std::string victim = dir.path + "/passwd";
  std::ofstream(victim) << "root:x:0:0:root:/root:/bin/bash\n";
  REQUIRE(symlink(victim.c_str(), (path + ".tmp").c_str()) == 0);
  absl::Status s = WriteHotSet(path, kKeys);
  REQUIRE(absl::IsFailedPrecondition(s));
  REQUIRE_THAT(std::string(s.message()), Contains("is a symbolic link (to " + victim + ")"));
  REQUIRE(Contents(victim) == "root:x:0:0:root:/root:/bin/bash\n");
  REQUIRE(std::filesystem::is_symlink(path + ".tmp"));
  REQUIRE_FALSE(std::filesystem::exists(path));
}

TEST_CASE("a hot set is replaced, and a temporary file a write left behind is removed first") {
  Dir dir;
  const std::string path = dir.path + "/hot-set";
  REQUIRE(WriteHotSet(path, kKeys).ok());
  REQUIRE(CheckHotSetPath(path).ok());
  // Left empty (stopped before the header) or whole (stopped before the rename).
  std::ofstream(path + ".tmp").flush();
  REQUIRE(CheckHotSetPath(path).ok());
  REQUIRE(WriteHotSet(path, std::span<const uint64_t>(kKeys).first(2)).ok());
  REQUIRE(ReadHotSet(path, 100)->size() == 2);
  REQUIRE(std::filesystem::copy_file(path, path + ".tmp"));
  REQUIRE(WriteHotSet(path, kKeys).ok());
  REQUIRE(*ReadHotSet(path, 100) == kKeys);
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
  // A hot set of another layout (the magic's last byte) is still a hot set: replaced.
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(pwrite(fd, "EGRMHOT2", 8, 0) == 8);
  close(fd);
  REQUIRE(WriteHotSet(path, kKeys).ok());
  REQUIRE(*ReadHotSet(path, 100) == kKeys);
}

// A file whose header says `count` keys, of the size that count makes, its keys a hole.
void WriteSparseHotSet(const std::string& path, uint64_t count) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  uint8_t header[24] = {'E', 'G', 'R', 'M', 'H', 'O', 'T', '1', 1};
  std::memcpy(header + 16, &count, 8);
  REQUIRE(pwrite(fd, header, sizeof(header), 0) == sizeof(header));
  REQUIRE(ftruncate(fd, static_cast<off_t>(24 + count * 8 + 8)) == 0);
  close(fd);
}

TEST_CASE("an oversized hot set is never read whole: memory follows memory.hot_set_rows") {
  Dir dir;
  const std::string path = dir.path + "/hot-set";
  // 512 MiB of keys, consistent with its size, its sum wrong: read a chunk at a time, only the
  // first 1,000 kept, then refused.
  WriteSparseHotSet(path, uint64_t{1} << 26);
  testing::ChildOutcome r = RunBounded([&] { return Text(ReadHotSet(path, 1000).status()); });
  INFO("wait status " << r.wait_status);
  REQUIRE(r.returned);
  REQUIRE_THAT(r.text, Contains("INVALID_ARGUMENT") && Contains("checksum"));
  INFO("peak RSS " << (r.max_rss_bytes >> 20) << " MiB");
  REQUIRE(r.max_rss_bytes < (uint64_t{192} << 20));

  // More keys than a hot set holds: refused from the header, before a key is read.
  WriteSparseHotSet(path, kMaxHotSetRows + 1);
  r = RunBounded([&] { return Text(ReadHotSet(path, 1000).status()); });
  REQUIRE(r.returned);
  REQUIRE_THAT(r.text, Contains("INVALID_ARGUMENT") && Contains("more than a hot set holds"));
  REQUIRE(r.max_rss_bytes < (uint64_t{192} << 20));
}

TEST_CASE(
    "a hot set longer than memory.hot_set_rows reads back its first rows, every sum checked") {
  Dir dir;
  const std::string path = dir.path + "/hot-set";
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 20000; ++i) keys.push_back(RowCacheKey(i % 2, i));  // 3 chunks
  REQUIRE(WriteHotSet(path, keys).ok());
  absl::StatusOr<std::vector<uint64_t>> some = ReadHotSet(path, 10000);
  REQUIRE(some.ok());
  REQUIRE(*some == std::vector<uint64_t>(keys.begin(), keys.begin() + 10000));
  // A key flipped past the rows kept still fails the sum.
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  const uint8_t x = 0x5a;
  REQUIRE(pwrite(fd, &x, 1, 24 + 8 * 19000) == 1);
  close(fd);
  REQUIRE_THAT(std::string(ReadHotSet(path, 10000).status().message()), Contains("checksum"));
}

TEST_CASE("a device node at the path or its temporary neighbour is never replaced", "[device]") {
  if (geteuid() != 0) ENGRAM_SKIP("making device nodes (mknod) needs root");
  Dir dir;
  const std::string path = dir.path + "/hot-set";
  const dev_t null_dev = makedev(1, 3);  // /dev/null's numbers: reading it is harmless
  if (mknod(path.c_str(), S_IFCHR | 0600, null_dev) != 0) {
    ENGRAM_SKIP("mknod " + path + ": " + std::strerror(errno) + " (no CAP_MKNOD here)");
  }
  AllRefuse(path, "memory.hot_set_path " + path, "is a character device, not a regular file");
  struct stat st {};
  REQUIRE(lstat(path.c_str(), &st) == 0);
  REQUIRE(S_ISCHR(st.st_mode));
  REQUIRE(st.st_rdev == null_dev);

  REQUIRE(unlink(path.c_str()) == 0);
  const std::string tmp = path + ".tmp";
  REQUIRE(mknod(tmp.c_str(), S_IFCHR | 0600, null_dev) == 0);
  testing::ChildOutcome r = RunBounded([&] { return Text(WriteHotSet(path, kKeys)); });
  REQUIRE(r.returned);
  REQUIRE_THAT(r.text, Contains("temporary file " + tmp + " is a character device"));
  REQUIRE(lstat(tmp.c_str(), &st) == 0);
  REQUIRE(S_ISCHR(st.st_mode));
  REQUIRE_FALSE(std::filesystem::exists(path));

  // A link to a device node is refused as the link it is.
  REQUIRE(unlink(tmp.c_str()) == 0);
  REQUIRE(symlink("/dev/zero", path.c_str()) == 0);
  AllRefuse(path, "memory.hot_set_path " + path, "is a symbolic link (to /dev/zero)");
}

}  // namespace
}  // namespace engram
