// Who may run which control request: a peer the socket admits but that is not an administrator
// (an unprivileged uid, run by forking and dropping to it) gathers and reads status, tables,
// stats, clients and metrics, and is refused warm and evict with PermissionDenied, engramctl's
// exit 77 and one warning line; admin_uids and admin_gids added by SIGHUP let it warm; bad
// values are refused with file, line and key. Who may connect: root and engramd's own uid always
// (engramd run as an unprivileged uid for it), whether --allow-uid or --allow-gid names others.
// Needs root to change uid; skips otherwise.
#include <dlfcn.h>
#include <grp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "testkit/daemon_test_util.h"

namespace engram::testing {
namespace {

using nlohmann::json;

// The unprivileged peers: a reader, and one that gets administrator rights through a group.
constexpr uid_t kReader = 65534;
constexpr uid_t kGroupPeer = 65533;
constexpr gid_t kAdminGroup = 4242;

std::string BuiltEngramctl() {
  const char* p = getenv("ENGRAMCTL");
  return p != nullptr ? p : "tools/engramctl/engramctl";
}

// The unprivileged peers run copies of engramctl and the client library it loads, in the test
// directory: the build tree may sit below a directory they cannot enter (a checkout in /root).
std::string Engramctl() { return TestDir() + "/bin/engramctl"; }
std::string PeerLibDir() { return TestDir() + "/lib"; }

void CopyEngramctlForPeers() {
  namespace fs = std::filesystem;
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(&engram_session_open), &info) != 0);
  REQUIRE(info.dli_fname != nullptr);
  fs::create_directories(TestDir() + "/bin");
  fs::create_directories(PeerLibDir());
  fs::copy_file(BuiltEngramctl(), Engramctl(), fs::copy_options::overwrite_existing);
  // Under the soname engramctl asks for.
  fs::copy_file(fs::canonical(info.dli_fname), PeerLibDir() + "/libengram_client.so.0",
                fs::copy_options::overwrite_existing);
  for (const std::string& p :
       {TestDir() + "/bin", PeerLibDir(), Engramctl(), PeerLibDir() + "/libengram_client.so.0"}) {
    chmod(p.c_str(), 0755);
  }
}

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

// Runs `argv` as `uid` (primary group `gid`, supplementary `groups`), capturing its output.
Result RunAs(uid_t uid, gid_t gid, const std::vector<gid_t>& groups,
             std::vector<std::string> argv) {
  int out[2], err[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(pipe2(err, O_CLOEXEC) == 0);
  // The child's environment, made before fork: LD_LIBRARY_PATH finds the copied library first.
  std::vector<std::string> env_text = {"LD_LIBRARY_PATH=" + PeerLibDir(), "LANG=C.UTF-8"};
  std::vector<char*> env;
  for (auto& e : env_text) env.push_back(e.data());
  env.push_back(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    if (setgroups(groups.size(), groups.data()) != 0 || setresgid(gid, gid, gid) != 0 ||
        setresuid(uid, uid, uid) != 0) {
      fprintf(stderr, "cannot become uid %u gid %u: %s\n", uid, gid, strerror(errno));
      _exit(126);
    }
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execve(args[0], args.data(), env.data());
    fprintf(stderr, "exec %s as uid %u: %s\n", args[0], uid, strerror(errno));
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  Result r;
  pollfd p[2] = {{.fd = out[0], .events = POLLIN}, {.fd = err[0], .events = POLLIN}};
  std::string* sink[2] = {&r.out, &r.err};
  int open_pipes = 2;
  while (open_pipes > 0) {
    if (poll(p, 2, 30'000) <= 0) break;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || p[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(p[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sink[i]->append(buf, static_cast<size_t>(n));
      } else {
        close(p[i].fd);
        p[i].fd = -1;
        --open_pipes;
      }
    }
  }
  for (const pollfd& x : p) {
    if (x.fd >= 0) close(x.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string ConfigPath() { return TestDir() + "/access.toml"; }
std::string LogPath() { return TestDir() + "/engramd.log"; }

// The configuration: the socket open to every local user, the test's peers admitted, and
// `admin` appended to [access].
void WriteConfig(const std::string& admin) {
  std::ofstream(ConfigPath()) << "[socket]\nmode = \"0666\"\n[access]\nallow_users = [\"0\", \""
                              << kReader << "\", \"" << kGroupPeer << "\"]\n"
                              << admin;
}

std::string ReadLog() {
  std::ifstream f(LogPath());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// One daemon for the cases below (they run in order), its log in LogPath().
struct Fixture {
  std::unique_ptr<Daemon> daemon;
  Fixture() {
    if (geteuid() != 0) {
      fprintf(stderr, "SKIP: changing to an unprivileged uid needs root\n");
      exit(77);
    }
    // The unprivileged peers must reach the socket in the test directory (mkdtemp: 0700).
    chmod(TestDir().c_str(), 0755);
    CopyEngramctlForPeers();
    Checkpoint();
    WriteConfig("");
    // engramd inherits stderr: point it at the log file while the daemon is started.
    const int saved = dup(STDERR_FILENO);
    const int log = open(LogPath().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    dup2(log, STDERR_FILENO);
    daemon = std::make_unique<Daemon>(std::vector<std::string>{"--config", ConfigPath()});
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(log);
  }
};
Fixture& F() {
  static Fixture f;
  return f;
}

Result Ctl(uid_t uid, const std::vector<std::string>& args, std::vector<gid_t> groups = {}) {
  std::vector<std::string> argv = {Engramctl()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--socket");
  argv.push_back(F().daemon->socket());
  return RunAs(uid, uid, groups, argv);
}

json CtlJson(uid_t uid, std::vector<std::string> args, std::vector<gid_t> groups = {}) {
  args.push_back("--json");
  Result r = Ctl(uid, args, groups);
  INFO(absl::StrJoin(args, " ") << " as uid " << uid << ": " << r.err);
  REQUIRE(r.code == 0);
  return json::parse(r.out);
}

// Sends SIGHUP and waits until the daemon reports `uids` as its administrators.
void ReloadUntil(const std::vector<uid_t>& admin_uids, const std::vector<gid_t>& admin_gids) {
  kill(F().daemon->pid(), SIGHUP);
  json access;
  for (int i = 0; i < 300; ++i) {
    access = CtlJson(0, {"status"})["access"];
    if (access["admin_gids"] == admin_gids) {
      bool all = true;
      for (uid_t u : admin_uids) {
        bool found = false;
        for (const json& a : access["admin_uids"]) found |= a == u;
        all &= found;
      }
      if (all) return;
    }
    usleep(10'000);
  }
  FAIL("the reload never showed the administrators: " << access.dump());
}

TEST_CASE("a peer that is not an administrator gathers and reads everything") {
  REQUIRE(F().daemon->alive());
  json status = CtlJson(kReader, {"status"});
  CHECK(status["state"] == "serving");
  const json& access = status["access"];
  CHECK(access["peer_uid"] == kReader);
  CHECK(access["peer_is_administrator"] == false);
  // The default: root and the daemon's own uid (root here) only.
  CHECK(access["admin_uids"] == json::array({0}));
  CHECK(access["admin_gids"] == json::array());
  CHECK(access["admin_commands"] == json::array({"warm", "evict", "load"}));
  CHECK(access["allow_uids"] == json::array({0, kGroupPeer, kReader}));  // sorted, root in it
  CHECK(CtlJson(0, {"status"})["access"]["peer_is_administrator"] == true);

  Result human = Ctl(kReader, {"status"});
  CHECK(human.code == 0);
  CHECK(human.out.find("administrators (warm, evict, load): root (engramd's own uid)") !=
        std::string::npos);
  CHECK(human.out.find("you (uid 65534): read and gather only") != std::string::npos);

  CHECK(CtlJson(kReader, {"tables"})["tables"].size() == 2);
  CHECK(CtlJson(kReader, {"stats"})["tables"].size() == 2);
  CHECK(CtlJson(kReader, {"clients"}).contains("clients"));
  CHECK(CtlJson(kReader, {"metrics"})["text"].get<std::string>().find("engram_up 1") !=
        std::string::npos);
  // A gather through the client library, as an inference process of that uid does.
  json rows = CtlJson(kReader, {"rows", "14", "3", "19999"});
  REQUIRE(rows["rows"].size() == 2);
  uint8_t expect[kRowBytes];
  SyntheticRow(kSeed, 14, 19999, expect);
  std::string hex;
  for (uint8_t b : expect) hex += absl::StrFormat("%02x", b);
  CHECK(rows["rows"][1]["hex"] == hex);
}

TEST_CASE(
    "warm, evict and load are refused to a non-administrator, naming command, uid and setting") {
  Result warm = Ctl(kReader, {"warm", "14"});
  INFO(warm.err);
  CHECK(warm.code == 77);
  CHECK(warm.out.empty());
  CHECK(warm.err.find("permission denied: ") != std::string::npos);
  CHECK(warm.err.find("'warm' needs an engramd administrator") != std::string::npos);
  CHECK(warm.err.find("uid 65534") != std::string::npos);
  CHECK(warm.err.find("admin_uids") != std::string::npos);
  CHECK(warm.err.find("administrators: root") != std::string::npos);

  Result evict = Ctl(kReader, {"evict", "14", "--rows", "0:10", "--json"});
  CHECK(evict.code == 77);
  json e = json::parse(evict.out);
  CHECK(e["exit_code"] == 77);
  CHECK(e["error"].get<std::string>().find("'evict' needs an engramd administrator") !=
        std::string::npos);

  Result load = Ctl(kReader, {"load", "14"});
  CHECK(load.code == 77);
  CHECK(load.err.find("'load' needs an engramd administrator") != std::string::npos);

  // Several refusals within a minute: one warning line for the uid.
  CHECK(Ctl(kReader, {"warm", "1", "--rows", "0:10"}).code == 77);
  const std::string log = ReadLog();
  INFO(log);
  CHECK(Count(log, "is not an engramd administrator") == 1);
  CHECK(Count(log, "Z warning: session ") == 1);
  CHECK(log.find("refused 'warm': uid 65534 is not an engramd administrator") != std::string::npos);

  // Root still may, on the same daemon.
  CHECK(CtlJson(0, {"warm", "14", "--rows", "0:10"})["done_to"] == 10);
  // A refused peer is not disconnected: the gathers of its next session still work.
  CHECK(CtlJson(kReader, {"rows", "1", "0"})["rows"].size() == 1);
}

TEST_CASE("admin_uids added by SIGHUP lets that uid warm and evict") {
  WriteConfig("admin_uids = [" + std::to_string(kReader) + "]\n");
  ReloadUntil({0, kReader}, {});
  json status = CtlJson(kReader, {"status"});
  CHECK(status["access"]["peer_is_administrator"] == true);
  CHECK(status["access"]["admin_uids"] == json::array({0, kReader}));
  json w = CtlJson(kReader, {"warm", "14", "--rows", "0:1000"});
  CHECK(w["done_to"] == 1000);
  CHECK(w["bytes"].get<uint64_t>() >= 1000 * 264);
  CHECK(CtlJson(kReader, {"evict", "14", "--rows", "0:1000"})["done_to"] == 1000);
  // Others still may not.
  CHECK(Ctl(kGroupPeer, {"warm", "14"}).code == 77);
}

TEST_CASE("admin_gids makes members of the group administrators, supplementary groups too") {
  WriteConfig("admin_gids = [" + std::to_string(kAdminGroup) + "]\n");
  ReloadUntil({0}, {kAdminGroup});
  // The uid of the last case is an administrator no more.
  CHECK(Ctl(kReader, {"warm", "14", "--rows", "0:10"}).code == 77);
  CHECK(Ctl(kGroupPeer, {"warm", "14", "--rows", "0:10"}).code == 77);
  json w = CtlJson(kGroupPeer, {"warm", "14", "--rows", "0:10"}, {kAdminGroup});
  CHECK(w["done_to"] == 10);
  CHECK(CtlJson(kGroupPeer, {"status"}, {kAdminGroup})["access"]["peer_is_administrator"] == true);
  // As the primary group.
  Result primary =
      RunAs(kGroupPeer, kAdminGroup, {},
            {Engramctl(), "evict", "14", "--rows", "0:10", "--socket", F().daemon->socket()});
  INFO(primary.err);
  CHECK(primary.code == 0);
}

TEST_CASE("a reload with a bad administrator value is refused and keeps the running set") {
  std::ofstream(ConfigPath()) << "[socket]\nmode = \"0666\"\n[access]\nallow_users = [\"0\", \""
                              << kReader << "\"]\nadmin_gids = [" << kAdminGroup
                              << "]\nadmin_uids = [-7]\n";
  kill(F().daemon->pid(), SIGHUP);
  const std::string want =
      ConfigPath() + ":6: key 'access.admin_uids': element 0, -7, is not a uid";
  std::string log;
  for (int i = 0; i < 300 && log.find(want) == std::string::npos; ++i) {
    usleep(10'000);
    log = ReadLog();
  }
  INFO(log);
  CHECK(log.find("SIGHUP: configuration refused, keeping the running one: " + want) !=
        std::string::npos);
  json access = CtlJson(0, {"status"})["access"];
  CHECK(access["admin_gids"] == json::array({kAdminGroup}));
  CHECK(access["admin_uids"] == json::array({0}));
  // The peer the refused file would have dropped may still connect.
  CHECK(Ctl(kGroupPeer, {"status"}).code == 0);
}

// A session of `uid` in a child process that gathers every 20 ms: it writes 'o' to `report`
// once its first gather succeeded, then 'x' and its error once a gather fails (or 't' after
// 20 s of gathers that all succeeded).
pid_t GatherAs(uid_t uid, int report) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) _exit(126);
  engram_connect_options o = F().daemon->Options(1 << 20, 8);
  engram_session* s = nullptr;
  if (engram_session_open(&o, &s) != 0) _exit(2);
  uint64_t* rows = nullptr;
  uint8_t* out = nullptr;
  if (engram_alloc(s, 8 * 8, reinterpret_cast<void**>(&rows)) != 0 ||
      engram_alloc(s, 8 * kRowBytes, reinterpret_cast<void**>(&out)) != 0) {
    _exit(3);
  }
  for (int i = 0; i < 1000; ++i) {
    FillRows(rows, 8, kRows, i + 1);
    engram_gather_request r{
        .size = sizeof(r), .layer = 14, .rows = rows, .num_rows = 8, .dest = out};
    if (engram_gather(s, &r, 5'000'000'000) != 0) {
      const std::string why = std::string("x") + engram_last_error();
      (void)!write(report, why.data(), why.size());
      _exit(0);
    }
    if (i == 0) (void)!write(report, "o", 1);
    usleep(20'000);
  }
  (void)!write(report, "t", 1);
  _exit(0);
}

std::string ReadReport(int fd, int timeout_ms) {
  pollfd p{.fd = fd, .events = POLLIN};
  if (poll(&p, 1, timeout_ms) <= 0) return "";
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

TEST_CASE("a reload that narrows the allow list closes the sessions of uids it drops") {
  WriteConfig("");
  ReloadUntil({0}, {});
  int dropped[2], kept[2];
  REQUIRE(pipe2(dropped, O_CLOEXEC) == 0);
  REQUIRE(pipe2(kept, O_CLOEXEC) == 0);
  const pid_t dropped_peer = GatherAs(kGroupPeer, dropped[1]);
  const pid_t kept_peer = GatherAs(kReader, kept[1]);
  REQUIRE(ReadReport(dropped[0], 10'000) == "o");
  REQUIRE(ReadReport(kept[0], 10'000) == "o");
  // uid kGroupPeer leaves the allow list: its open session stops within the reload.
  std::ofstream(ConfigPath()) << "[socket]\nmode = \"0666\"\n[access]\nallow_users = [\"0\", \""
                              << kReader << "\"]\n";
  kill(F().daemon->pid(), SIGHUP);
  const std::string report = ReadReport(dropped[0], 10'000);
  INFO("the dropped peer's report: " << report);
  CHECK(report.rfind("x", 0) == 0);
  // The log names the client and why.
  std::string log;
  const std::string want = absl::StrFormat("uid %u is no longer admitted", kGroupPeer);
  for (int i = 0; i < 300 && log.find(want) == std::string::npos; ++i) {
    usleep(10'000);
    log = ReadLog();
  }
  INFO(log);
  CHECK(log.find(want) != std::string::npos);
  CHECK(log.find(absl::StrFormat("pid %d, uid %u", dropped_peer, kGroupPeer)) != std::string::npos);
  // The uid still admitted gathers on; the dropped one cannot connect again.
  CHECK(ReadReport(kept[0], 300) == "");
  CHECK(Ctl(kGroupPeer, {"status"}).code != 0);
  kill(kept_peer, SIGKILL);
  for (pid_t p : {dropped_peer, kept_peer}) waitpid(p, nullptr, 0);
  for (int fd : {dropped[0], dropped[1], kept[0], kept[1]}) close(fd);
  WriteConfig("");
  ReloadUntil({0}, {});
}

TEST_CASE("--check-config prints the administrators and refuses bad values") {
  const std::string base = "[tables]\nmodels = [\"" + Checkpoint() + "\"]\n[access]\n";
  const std::string good = TestDir() + "/check-admin.toml";
  std::ofstream(good) << base << "admin_uids = [1000, 1001]\nadmin_gids = [27]\n";
  Result r = RunAs(0, 0, {}, {EngramdPath(), "--config", good, "--check-config"});
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("administrators (warm, evict, load): root (engramd's own uid), uids 1000,1001, "
                   "members of gids 27") != std::string::npos);
  CHECK(r.out.find("may connect: root (engramd's own uid)\n") != std::string::npos);
  // Flags replace the file's lists.
  r = RunAs(
      0, 0, {},
      {EngramdPath(), "--config", good, "--admin-uid", "5", "--admin-uid", "6", "--check-config"});
  CHECK(r.code == 0);
  CHECK(r.out.find("uids 5,6, members of gids 27") != std::string::npos);
  r = RunAs(0, 0, {}, {EngramdPath(), "--config", good, "--admin-gid", "x", "--check-config"});
  CHECK(r.code != 0);
  CHECK(r.err.find("--admin-gid") != std::string::npos);
  r = RunAs(0, 0, {},
            {EngramdPath(), "--config", good, "--admin-uid", "4294967295", "--check-config"});
  CHECK(r.code != 0);
  CHECK(r.err.find("--admin-uid") != std::string::npos);

  const std::string bad = TestDir() + "/check-admin-bad.toml";
  std::ofstream(bad) << base << "admin_gids = [\"wheel\"]\n";
  r = RunAs(0, 0, {}, {EngramdPath(), "--config", bad, "--check-config"});
  CHECK(r.code == 1);
  CHECK(r.err.find(bad + ":4: key 'access.admin_gids': element 0, 'wheel', is not a gid") !=
        std::string::npos);
}

// engramd run as an unprivileged uid (kOwner), so that root and engramd's own uid are two
// different peers. Its log goes to TestDir()/owner-NAME.log.
constexpr uid_t kOwner = 65532;
constexpr uid_t kStranger = 65531;

class OwnedDaemon {
 public:
  OwnedDaemon(const std::string& name, const std::vector<std::string>& access_flags)
      : dir_(TestDir() + "/owner-" + name), socket_(dir_ + "/engramd.sock") {
    // The daemon creates its socket in a directory it owns; the peers reach it through 0666.
    std::filesystem::create_directories(dir_);
    REQUIRE(chown(dir_.c_str(), kOwner, kOwner) == 0);
    chmod(dir_.c_str(), 0755);
    std::vector<std::string> args = {EngramdBinary(), "--model",   Checkpoint(), "--socket",
                                     socket_,         "--workers", "1",          "--socket-mode",
                                     "0666"};
    args.insert(args.end(), access_flags.begin(), access_flags.end());
    const int log = open((dir_ + ".log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(log >= 0);
    pid_ = SpawnAsUser(kOwner, args, log);
    REQUIRE(pid_ >= 0);
    close(log);
    for (int i = 0; i < 1000 && !SocketAnswers(socket_); ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("engramd as uid " << kOwner << " exited during startup: " << Log());
      }
      usleep(10'000);
    }
    REQUIRE(SocketAnswers(socket_));
  }
  ~OwnedDaemon() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    if (SanitizerReported(status)) ExitForSanitizerReport(Log());
  }
  OwnedDaemon(const OwnedDaemon&) = delete;
  OwnedDaemon& operator=(const OwnedDaemon&) = delete;

  Result Ctl(uid_t uid, const std::vector<std::string>& args, std::vector<gid_t> groups = {}) {
    std::vector<std::string> argv = {Engramctl()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--socket", socket_});
    return RunAs(uid, uid, groups, argv);
  }
  std::string Log() const {
    std::ifstream f(dir_ + ".log");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  // engramd, copied where the unprivileged owner can run it (see CopyEngramctlForPeers).
  static std::string EngramdBinary() {
    const std::string copy = TestDir() + "/bin/engramd";
    if (!std::filesystem::exists(copy)) {
      std::filesystem::copy_file(EngramdPath(), copy);
      chmod(copy.c_str(), 0755);
    }
    return copy;
  }

 private:
  std::string dir_;
  std::string socket_;
  pid_t pid_ = -1;
};

// Connects as `uid` (with `groups`) and reads status: exit 0, or the refusal's exit 4.
void CheckAdmitted(OwnedDaemon& d, uid_t uid, bool admitted, std::vector<gid_t> groups = {}) {
  Result r = d.Ctl(uid, {"status"}, groups);
  INFO("uid " << uid << ": exit " << r.code << ", " << r.err << "\nengramd log:\n" << d.Log());
  if (admitted) {
    CHECK(r.code == 0);
    CHECK(r.out.find("engramd serving") != std::string::npos);
  } else {
    CHECK(r.code == 4);
    CHECK(r.err.find(absl::StrFormat("uid %u", uid)) != std::string::npos);
    CHECK(r.err.find("may not use engramd") != std::string::npos);
  }
}

TEST_CASE("root and engramd's own uid are admitted whatever --allow-uid names") {
  F();  // the peers' copies of engramctl, and a test directory they can enter
  OwnedDaemon d("uid", {"--allow-uid", std::to_string(kReader)});
  CheckAdmitted(d, 0, true);
  CheckAdmitted(d, kOwner, true);
  CheckAdmitted(d, kReader, true);
  CheckAdmitted(d, kStranger, false);
  Result refused = d.Ctl(kStranger, {"status"});
  CHECK(refused.err.find(absl::StrFormat("allowed: root, uid %u (engramd's own), uids %u", kOwner,
                                         kReader)) != std::string::npos);

  Result root = d.Ctl(0, {"status", "--json"});
  REQUIRE(root.code == 0);
  const json access = json::parse(root.out)["access"];
  CHECK(access["allow_uids"] == json::array({0, kOwner, kReader}));
  CHECK(access["allow_gids"] == json::array());
  CHECK(access["may_connect"] ==
        absl::StrFormat("root, uid %u (engramd's own), uids %u", kOwner, kReader));
  CHECK(access["admin_uids"] == json::array({0, kOwner}));
  Result human = d.Ctl(kOwner, {"status"});
  CHECK(human.out.find(absl::StrFormat("may connect: root, uid %u (engramd's own), uids %u", kOwner,
                                       kReader)) != std::string::npos);

  // --check-config, run as the same uid, names the same rule (on a socket path that uid may
  // bind: it refuses one whose directory the uid cannot write, as a start would).
  Result check = RunAs(kOwner, kOwner, {},
                       {OwnedDaemon::EngramdBinary(), "--model", Checkpoint(), "--socket",
                        TestDir() + "/owner-uid/check.sock", "--allow-uid", std::to_string(kReader),
                        "--check-config"});
  INFO(check.err);
  CHECK(check.code == 0);
  CHECK(check.out.find(absl::StrFormat("may connect: root, uid %u (engramd's own), uids %u", kOwner,
                                       kReader)) != std::string::npos);
}

TEST_CASE("root and engramd's own uid are admitted whatever --allow-gid names") {
  F();
  OwnedDaemon d("gid", {"--allow-gid", std::to_string(kAdminGroup)});
  CheckAdmitted(d, 0, true);
  CheckAdmitted(d, kOwner, true);
  CheckAdmitted(d, kReader, false);
  CheckAdmitted(d, kReader, true, {kAdminGroup});

  Result root = d.Ctl(0, {"status", "--json"});
  REQUIRE(root.code == 0);
  const json access = json::parse(root.out)["access"];
  CHECK(access["allow_uids"] == json::array({0, kOwner}));
  CHECK(access["allow_gids"] == json::array({kAdminGroup}));
  CHECK(access["may_connect"] ==
        absl::StrFormat("root, uid %u (engramd's own), members of gids %u", kOwner, kAdminGroup));
}

}  // namespace
}  // namespace engram::testing
