// The files engramd's settings name besides the tables (memory.pressure_file, memory.hot_set_path
// and its temporary neighbour), set to what an attacker or a careless operator may put there: a
// FIFO, an endless device, a symbolic link, another file. --check-config and a start refuse them
// alike, at once, with the same message; a file swapped in while serving is left as it is at
// stop, which neither waits on a FIFO nor replaces what is not a hot set; a crafted 1 GiB hot set
// is read at start in bounded memory.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testkit/bounded_child.h"
#include "testkit/daemon_test_util.h"

namespace engram::testing {
namespace {

using Catch::Contains;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs a shell command line, capturing stdout and stderr.
Result Sh(const std::string& command) {
  const std::string err_path = TestDir() + "/stderr.txt";
  FILE* p = popen((command + " 2>" + err_path).c_str(), "r");
  Result r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = Contents(err_path);
  return r;
}

// engramd's flags serving layer 14 from the row cache, so that both files are in use.
std::string CacheArgs(const std::string& name) {
  return " --model " + Checkpoint() + " --socket " + TestDir() + "/" + name +
         ".sock --workers 2 --tier 14=cache --cache-bytes 16M";
}

// A start must come back by itself: a blocked one is stopped (124). Outside the sanitizers, an
// engramd reading an endless file stops at 8 GiB of address space instead of the machine's memory.
std::string Bounded(const std::string& line) {
#ifdef ENGRAM_BOUNDED_CHILD_SANITIZED
  return "timeout -s KILL 20 " + line;
#else
  return "ulimit -v 8388608; timeout -s KILL 20 " + line;
#endif
}

// --check-config and a start of `args` both fail with exit status 1 and the same message, which
// contains `says`.
void BothRefuse(const std::string& args, const std::string& says) {
  Result checked = Sh(Bounded(EngramdPath() + args + " --check-config"));
  INFO("--check-config: " << checked.code << "\n" << checked.out << checked.err);
  CHECK(checked.code == 1);
  REQUIRE_THAT(checked.err, Contains(says));
  Result started = Sh(Bounded(EngramdPath() + args));
  INFO("start: " << started.code << "\n" << started.err);
  CHECK(started.code == 1);
  REQUIRE_THAT(started.err, Contains(says));
  CHECK(started.err.substr(started.err.find("engramd: ")) ==
        checked.err.substr(checked.err.find("engramd: ")));
}

TEST_CASE("a FIFO or an endless device as memory.pressure_file is refused by both, at once") {
  const std::string fifo = TestDir() + "/pressure.fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  BothRefuse(CacheArgs("psi-fifo") + " --pressure-file " + fifo,
             "memory.pressure_file " + fifo + " is a FIFO, not a regular file");
  BothRefuse(CacheArgs("psi-zero") + " --pressure-file /dev/zero",
             "memory.pressure_file /dev/zero is a character device, not a regular file");
  // Without memory.pressure the file is never opened.
  Result r = Sh(Bounded(EngramdPath() + CacheArgs("psi-off") + " --pressure-file " + fifo +
                        " --no-memory-pressure --check-config"));
  CHECK(r.code == 0);
}

TEST_CASE("memory.hot_set_path naming what is not a hot set is refused by both, left intact") {
  // The configuration file itself: a start used to replace it at stop.
  const std::string toml = TestDir() + "/hot.toml";
  const std::string text = "[memory]\nhot_set_path = \"" + toml + "\"\n";
  std::ofstream(toml) << text;
  BothRefuse(CacheArgs("hot-toml") + " --config " + toml,
             "memory.hot_set_path " + toml + " is a regular file of " +
                 std::to_string(text.size()) + " bytes that is not a hot set");
  CHECK(Contents(toml) == text);

  const std::string fifo = TestDir() + "/hot.fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  BothRefuse(CacheArgs("hot-fifo") + " --hot-set-path " + fifo,
             "memory.hot_set_path " + fifo + " is a FIFO, not a regular file");

  const std::string link = TestDir() + "/hot.link";
  REQUIRE(symlink("/dev/null", link.c_str()) == 0);
  BothRefuse(CacheArgs("hot-link") + " --hot-set-path " + link,
             "memory.hot_set_path " + link + " is a symbolic link (to /dev/null)");
  CHECK(std::filesystem::is_symlink(link));

  const std::string hot = TestDir() + "/hot-set";
  REQUIRE(mkfifo((hot + ".tmp").c_str(), 0600) == 0);
  BothRefuse(CacheArgs("hot-tmp") + " --hot-set-path " + hot,
             "memory.hot_set_path's temporary file " + hot + ".tmp is a FIFO");
  REQUIRE(unlink((hot + ".tmp").c_str()) == 0);
}

// Whether `pid` exits within `seconds` (left to be reaped).
bool ExitsWithin(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    siginfo_t info{};
    if (waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) {
      return true;
    }
    usleep(10000);
  }
  return false;
}

// engramd serving layer 14 from the cache with the hot set at `hot` (written only at stop), its
// standard error in `log`, a few hundred rows gathered so that the hot set has keys.
std::unique_ptr<Daemon> ServeLogged(const std::string& name, const std::string& hot,
                                    const std::string& log) {
  const int saved = dup(2);
  const int f = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  dup2(f, 2);  // the child inherits it
  auto d = std::make_unique<Daemon>(
      std::vector<std::string>{"--tier", "14=cache", "--cache-bytes", "16M", "--hot-set-path", hot,
                               "--hot-set-interval", "0"},
      name);
  dup2(saved, 2);
  close(saved);
  close(f);
  REQUIRE(d->alive());
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 300; ++i) ids.push_back(i * 7);
  WarmRows(*d, 14, ids, 100);
  return d;
}

TEST_CASE("what replaces the hot set while serving is left intact at stop, which does not wait") {
  const std::string hot = TestDir() + "/serving-hot-set";
  const std::string log = TestDir() + "/serving.log";
  // Absent: written at stop, and --check-config then names it.
  auto d = ServeLogged("serving-1", hot, log);
  CHECK(d->Stop() == 0);
  const uint64_t rows = (std::filesystem::file_size(hot) - 32) / 8;
  REQUIRE(rows > 0);
  Result r =
      Sh(EngramdPath() + CacheArgs("serving-check") + " --hot-set-path " + hot + " --check-config");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Contains("hot set: " + std::to_string(rows) + " rows in " + hot));

  // Replaced by another file while serving: kept as it is, the stop says why.
  d = ServeLogged("serving-2", hot, log);
  const std::string other = "not a hot set\n";
  std::ofstream(hot, std::ios::trunc) << other;
  kill(d->pid(), SIGTERM);
  REQUIRE(ExitsWithin(d->pid(), 15));
  CHECK(d->Stop() == 0);
  CHECK(Contents(hot) == other);
  const std::string why = "hot set of the row cache not written at stop: memory.hot_set_path ";
  CHECK_THAT(Contents(log), Contains(why + hot) && Contains("not a hot set"));

  // A FIFO as the temporary file while serving: the stop neither waits for a reader nor
  // replaces anything.
  REQUIRE(std::filesystem::remove(hot));
  d = ServeLogged("serving-3", hot, log);
  REQUIRE(mkfifo((hot + ".tmp").c_str(), 0600) == 0);
  kill(d->pid(), SIGTERM);
  const bool exited = ExitsWithin(d->pid(), 15);
  if (!exited) kill(d->pid(), SIGKILL);
  REQUIRE(exited);
  CHECK(d->Stop() == 0);
  CHECK_FALSE(std::filesystem::exists(hot));
  CHECK_THAT(Contents(log), Contains(hot + ".tmp is a FIFO"));
}

// The peak resident memory of `pid` (VmHWM), in bytes.
uint64_t PeakRss(pid_t pid) {
  std::istringstream status(Contents("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

TEST_CASE("an oversized hot set is not read whole at start") {
  // A crafted file: a hot set's header saying 2^27 keys, 1 GiB of them (a hole), a wrong sum.
  const std::string hot = TestDir() + "/oversized-hot-set";
  const uint64_t count = uint64_t{1} << 27;
  {
    const int fd = open(hot.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    uint8_t header[24] = {'E', 'G', 'R', 'M', 'H', 'O', 'T', '1', 1};
    std::memcpy(header + 16, &count, 8);
    REQUIRE(pwrite(fd, header, sizeof(header), 0) == sizeof(header));
    REQUIRE(ftruncate(fd, static_cast<off_t>(24 + count * 8 + 8)) == 0);
    close(fd);
  }
  const std::string log = TestDir() + "/oversized.log";
  const int saved = dup(2);
  const int f = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  dup2(f, 2);
  Daemon d({"--tier", "14=cache", "--cache-bytes", "16M", "--hot-set-path", hot}, "oversized");
  dup2(saved, 2);
  close(saved);
  close(f);
  REQUIRE(d.alive());
  // The start reads it (a chunk at a time) before it serves, then warns.
  const std::string warned = "hot set not warmed: " + hot + ": checksum mismatch";
  for (int i = 0; i < 3000 && Contents(log).find(warned) == std::string::npos; ++i) usleep(10000);
  REQUIRE_THAT(Contents(log), Contains(warned));
  const uint64_t peak = PeakRss(d.pid());
  INFO("engramd's peak RSS " << (peak >> 20) << " MiB");
  CHECK(peak > 0);
  CHECK(peak < (uint64_t{512} << 20));
  CHECK(d.Stop() == 0);
}

TEST_CASE("a damaged hot set is a warning to both, as it is to a start") {
  const std::string hot = TestDir() + "/damaged-hot-set";
  auto d = ServeLogged("damaged", hot, TestDir() + "/damaged.log");
  CHECK(d->Stop() == 0);
  const int fd = open(hot.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(pwrite(fd, "x", 1, 24 + 8 * 10) == 1);
  close(fd);
  Result r =
      Sh(EngramdPath() + CacheArgs("damaged-check") + " --hot-set-path " + hot + " --check-config");
  CHECK(r.code == 0);
  CHECK_THAT(r.err, Contains("hot set not warmed: " + hot + ": checksum mismatch"));
}

}  // namespace
}  // namespace engram::testing
