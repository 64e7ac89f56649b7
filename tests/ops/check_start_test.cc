// `engramd --check-config` and a start run on the same configurations agree: what a start refuses
// (socket.group naming no group, a socket directory that cannot be made) the check refuses, exit
// 1, with the same message, and a socket another engramd serves it names as a warning; what a start
// warns of and serves anyway (the metrics port in use, metrics.textfile_dir missing,
// memory.hot_set_path in a missing directory, a memory.pressure_file that cannot be read,
// memory.cache with no cache-tier table) the check warns of in the same words and exits 0.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

// The text of each log line of `level` ("warning", "error") in `log`, without the timestamp.
std::vector<std::string> Lines(const std::string& log, const std::string& level) {
  std::vector<std::string> lines;
  std::istringstream in(log);
  const std::string marker = " " + level + ": ";
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(marker);
    if (at != std::string::npos) lines.push_back(line.substr(at + marker.size()));
  }
  return lines;
}

// The first of `lines` that contains `says`, or "".
std::string Naming(const std::vector<std::string>& lines, const std::string& says) {
  for (const std::string& l : lines) {
    if (l.find(says) != std::string::npos) return l;
  }
  return "";
}

// engramd's flags serving the synthetic checkpoint on TestDir()/`name`.sock.
std::string Args(const std::string& name) {
  return " --model " + Checkpoint() + " --socket " + TestDir() + "/" + name + ".sock --workers 2";
}

// The same with layer 14 served from the row cache, so that its files are in use.
std::string CacheArgs(const std::string& name) {
  return Args(name) + " --tier 14=cache --cache-bytes 16M --no-huge-pages";
}

// --check-config and a start of `args` both exit 1 with the same error, which contains `says`.
void BothRefuse(const std::string& args, const std::string& says) {
  Result checked = Sh(EngramdPath() + args + " --check-config");
  INFO("--check-config: " << checked.code << "\n" << checked.out << checked.err);
  CHECK(checked.code == 1);
  const std::string check_error = Naming(Lines(checked.err, "error"), says);
  CHECK(!check_error.empty());
  // A start that served instead would run until `timeout` stops it (exit 124).
  Result started = Sh("timeout -s KILL 30 " + EngramdPath() + args);
  INFO("start: " << started.code << "\n" << started.err);
  CHECK(started.code == 1);
  CHECK(Naming(Lines(started.err, "error"), says) == check_error);
}

// Starts engramd with `args` until it serves (its "serving" line), stops it with SIGTERM and
// returns what it logged; "" when it exited or did not serve within 30 s.
std::string StartUntilServing(const std::string& args, const std::string& name) {
  const std::string log = TestDir() + "/" + name + ".log";
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + EngramdPath() + args + " 2>" + log).c_str(), nullptr);
    _exit(127);
  }
  bool served = false;
  for (int i = 0; i < 3000 && !served; ++i) {
    served = Contents(log).find(" serving, pid ") != std::string::npos;
    int status;
    if (!served && waitpid(pid, &status, WNOHANG) == pid) return "";
    if (!served) usleep(10000);
  }
  kill(pid, served ? SIGTERM : SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (SanitizerReported(status)) ExitForSanitizerReport(Contents(log));
  return served ? Contents(log) : "";
}

// --check-config of `args` exits 0 warning of `says`, and a start of `args` serves after the same
// warning, word for word.
void BothWarn(const std::string& args, const std::string& says, const std::string& name) {
  Result checked = Sh(EngramdPath() + args + " --check-config");
  INFO("--check-config: " << checked.code << "\n" << checked.out << checked.err);
  CHECK(checked.code == 0);
  const std::string check_warning = Naming(Lines(checked.err, "warning"), says);
  REQUIRE(!check_warning.empty());
  const std::string started = StartUntilServing(args, name);
  INFO("start:\n" << started);
  REQUIRE(!started.empty());
  const std::vector<std::string> warnings = Lines(started, "warning");
  CHECK(std::find(warnings.begin(), warnings.end(), check_warning) != warnings.end());
}

TEST_CASE("socket.group naming no group is refused by both") {
  BothRefuse(Args("group") + " --socket-group no-such-engram-group",
             "socket group 'no-such-engram-group' does not exist");
}

TEST_CASE("a socket directory that cannot be made is refused by both") {
  const std::string dir = TestDir() + "/missing/run";  // mkdir makes one level, not two
  BothRefuse(" --model " + Checkpoint() + " --socket " + dir + "/engramd.sock --workers 2",
             "socket directory '" + dir + "' does not exist and cannot be created");
  struct stat st;
  CHECK(stat((TestDir() + "/missing").c_str(), &st) != 0);  // neither made anything
}

// The start refuses it; the check says the same words as a warning and exits 0, so that a
// configuration can be checked before the restart that stops the running engramd.
TEST_CASE("a socket another engramd serves is refused by a start, warned of by the check") {
  Daemon serving({}, "served");
  REQUIRE(serving.alive());
  const std::string says = "another engramd (pid " + std::to_string(serving.pid()) +
                           ") is serving on '" + serving.socket() + "'; stop it first";
  Result checked = Sh(EngramdPath() + Args("served") + " --check-config");
  INFO("--check-config: " << checked.code << "\n" << checked.out << checked.err);
  CHECK(checked.code == 0);
  CHECK(!Naming(Lines(checked.err, "warning"), says).empty());
  Result started = Sh("timeout -s KILL 30 " + EngramdPath() + Args("served"));
  INFO("start: " << started.code << "\n" << started.err);
  CHECK(started.code == 1);
  CHECK(!Naming(Lines(started.err, "error"), says).empty());
  CHECK(serving.alive());
}

TEST_CASE("a metrics port in use is warned of by both") {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(fd, 1) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  BothWarn(Args("port") + " --metrics-port " + port,
           "cannot listen for metrics on 127.0.0.1 port " + port +
               ": Address already in use; serving without the metrics port",
           "port");
  close(fd);
}

TEST_CASE("a missing metrics.textfile_dir is warned of by both") {
  const std::string dir = TestDir() + "/no-textfile-dir";
  BothWarn(Args("textfile") + " --metrics-textfile-dir " + dir,
           "metrics.textfile_dir " + dir + ": No such file or directory", "textfile");
}

TEST_CASE("memory.hot_set_path in a missing directory is warned of by both") {
  const std::string dir = TestDir() + "/no-state-dir";
  BothWarn(CacheArgs("hot") + " --hot-set-path " + dir + "/hot-set",
           "memory.hot_set_path " + dir + "/hot-set: its directory " + dir +
               ": No such file or directory",
           "hot");
}

TEST_CASE("a memory.pressure_file that cannot be read is warned of by both") {
  const std::string missing = TestDir() + "/no-psi-dir/memory.pressure";
  BothWarn(CacheArgs("psi") + " --pressure-file " + missing,
           "row cache keeps its size under memory pressure: memory.pressure_file cannot be read "
           "as a PSI file",
           "psi");
  if (geteuid() != 0) {  // root reads a file of mode 000
    const std::string closed = TestDir() + "/closed.pressure";
    std::ofstream(closed) << "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    REQUIRE(chmod(closed.c_str(), 0) == 0);
    BothWarn(CacheArgs("psi-closed") + " --pressure-file " + closed, "Permission denied",
             "psi-closed");
  }
}

TEST_CASE("memory.cache with no table of the cache tier is warned of by both") {
  BothWarn(Args("cache") + " --cache-bytes 16M",
           "memory.cache is set (16777216 bytes) but no table is of the cache tier", "cache");
}

TEST_CASE("--check-config says how many rows memory.cache holds, as the start does") {
  Result checked = Sh(EngramdPath() + CacheArgs("plan") + " --check-config");
  INFO(checked.out << checked.err);
  REQUIRE(checked.code == 0);
  // The listing wraps it; the start logs it on one line.
  std::string plan = checked.out.substr(checked.out.find("  row cache: 16.0 MiB ([memory] cache)"));
  plan = plan.substr(0, plan.find("unused") + 6);
  std::string joined;
  std::istringstream lines(plan);
  for (std::string l; std::getline(lines, l);) {
    joined += (joined.empty() ? "" : " ") + l.substr(l.find_first_not_of(' '));
  }
  CHECK_THAT(joined, Contains("rows (") && Contains("of layer 14's") &&
                         Contains("of slot headers (24 bytes a row") && Contains("of index ("));
  const std::string started = StartUntilServing(CacheArgs("plan"), "plan");
  REQUIRE(!started.empty());
  CHECK_THAT(started, Contains(joined));
}

}  // namespace
}  // namespace engram::testing
