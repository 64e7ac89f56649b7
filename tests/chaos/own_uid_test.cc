// A client running as engramd's own uid owns the row cache's memfd as engramd does: handed the
// read-only descriptor, it could fchmod it, reopen it writable through /proc/self/fd and
// rewrite rows that every other client reads in place. engramd (run here as an unprivileged uid)
// must not hand it the descriptor: the attack is refused, such a client still gathers every row
// through engramd, and a client of another uid reads byte-exact rows in place after it.
// Needs root to run engramd and the attacker as another uid; skips otherwise.
#include <grp.h>
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <functional>
#include <iterator>

#include "protocol/row_cache_layout.h"
#include "tests/chaos/chaos_util.h"
#include "tests/common/skip.h"

namespace engram::testing {
namespace {

constexpr uid_t kOwner = 65534;
constexpr uint32_t kCachedLayer = 1;

// engramd as kOwner, serving layer 1 from a row cache, its socket open to every local user.
class OwnerDaemon {
 public:
  OwnerDaemon() : dir_(TestDir() + "/owner"), socket_(dir_ + "/engramd.sock") {
    chmod(TestDir().c_str(), 0755);
    Checkpoint();
    std::filesystem::create_directories(dir_);
    REQUIRE(chown(dir_.c_str(), kOwner, kOwner) == 0);
    const std::string binary = dir_ + "/engramd";
    std::filesystem::copy_file(EngramdPath(), binary);
    chmod(binary.c_str(), 0755);
    std::vector<std::string> args = {
        binary,          "--model", Checkpoint(),    "--socket", socket_,     "--tier", "1=cache",
        "--cache-bytes", "4M",      "--socket-mode", "0666",     "--workers", "1"};
    const int log = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(log >= 0);
    pid_ = SpawnAsUser(kOwner, args, log);
    REQUIRE(pid_ >= 0);
    close(log);
    for (int i = 0; i < 3000 && !SocketAnswers(socket_) && alive(); ++i) usleep(10'000);
    INFO(Log());
    REQUIRE(SocketAnswers(socket_));
  }
  ~OwnerDaemon() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    if (SanitizerReported(status)) ExitForSanitizerReport(Log());
  }
  OwnerDaemon(const OwnerDaemon&) = delete;
  OwnerDaemon& operator=(const OwnerDaemon&) = delete;
  bool alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  const std::string& socket() const { return socket_; }
  std::string Log() const { return ReadFile(log_); }

 private:
  std::string dir_;
  std::string socket_;
  std::string log_ = TestDir() + "/owner.log";
  pid_t pid_ = -1;
};

// In a child that dropped to kOwner: its exit status (128 + signal if killed).
int AsOwner(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, nullptr) != 0 || setresgid(kOwner, kOwner, kOwner) != 0 ||
        setresuid(kOwner, kOwner, kOwner) != 0) {
      _exit(126);
    }
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Asks for layer 1 mapped as a client that reads the row cache in place would, keeping the
// descriptors that come with the answer. Returns the answer's type; *ret_cache_fd is the row
// cache's descriptor (-1 if none came).
uint32_t MapCachedLayer(int fd, int* ret_cache_fd, int32_t* ret_code) {
  *ret_cache_fd = -1;
  *ret_code = 0;
  engram_msg_map_table m{};
  m.header = {.magic = ENGRAM_MSG_MAGIC,
              .type = ENGRAM_MSG_MAP_TABLE,
              .reserved = 0,
              .bytes = sizeof(m),
              .request_id = 2};
  m.layer_id = kCachedLayer;
  if (send(fd, &m, sizeof(m), MSG_NOSIGNAL) != sizeof(m)) return 0;
  std::vector<char> buf(ENGRAM_MSG_MAX_BYTES);
  iovec iov{buf.data(), buf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  pollfd p{.fd = fd, .events = POLLIN};
  if (poll(&p, 1, 5000) <= 0) return 0;
  const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  if (n < static_cast<ssize_t>(sizeof(engram_msg_header))) return 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && *ret_cache_fd < 0) {
      memcpy(ret_cache_fd, CMSG_DATA(c), sizeof(int));  // the first: the row cache
    }
  }
  engram_msg_header h;
  memcpy(&h, buf.data(), sizeof(h));
  if (h.type == ENGRAM_MSG_ERROR && n >= static_cast<ssize_t>(sizeof(engram_msg_error))) {
    engram_msg_error e;
    memcpy(&e, buf.data(), sizeof(e));
    *ret_code = e.code;
  }
  return h.type;
}

// The attack: fchmod the read-only descriptor, reopen it writable and rewrite every row held
// (with a matching check word, as a careful attacker would). 0: engramd refused the descriptor
// (PermissionDenied); 1: the rows were rewritten; 2 and up: something else went wrong.
int RewriteCacheAsOwner(const std::string& socket) {
  const int fd = ConnectRaw(socket);
  if (fd < 0) return 2;
  engram_msg_hello hello = MakeHello("own-uid");
  hello.version_minor = ENGRAM_PROTOCOL_MINOR;
  hello.features = ENGRAM_FEATURES_V1_0 | ENGRAM_FEATURE_TABLE_STATE | ENGRAM_FEATURE_ROW_CACHE_MAP;
  send(fd, &hello, sizeof(hello), MSG_NOSIGNAL);
  const std::string welcome = RecvMessage(fd);
  engram_msg_header wh{};
  if (welcome.size() >= sizeof(wh)) memcpy(&wh, welcome.data(), sizeof(wh));
  if (wh.type != ENGRAM_MSG_WELCOME) return 3;
  int cache_fd = -1;
  int32_t code = 0;
  const uint32_t type = MapCachedLayer(fd, &cache_fd, &code);
  if (type == ENGRAM_MSG_ERROR) return code == ENGRAM_STATUS_PERMISSION_DENIED ? 0 : 4;
  if (type != ENGRAM_MSG_TABLE_MAPPED || cache_fd < 0) return 5;
  if (fchmod(cache_fd, 0600) != 0) return 6;
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", cache_fd);
  const int rw = open(path, O_RDWR | O_CLOEXEC);
  if (rw < 0) return 7;
  struct stat st {};
  fstat(rw, &st);
  auto* base =
      static_cast<uint8_t*>(mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0));
  if (base == MAP_FAILED) return 8;
  auto* h = reinterpret_cast<RowCacheHeader*>(base);
  auto* slots = reinterpret_cast<RowCacheSlot*>(base + h->slots_offset);
  uint64_t rewritten = 0;
  for (uint32_t i = 0; i < h->capacity_slots.load(); ++i) {
    const uint64_t key = slots[i].key.load();
    if (key == 0) continue;
    uint8_t row[kRowBytes];
    LoadRowCacheRow(slots[i], row);
    row[0] ^= 0xff;
    StoreRowCacheRow(slots[i], row);
    slots[i].check.store(RowCacheCheck(key, row));
    ++rewritten;
  }
  return rewritten > 0 ? 1 : 9;
}

// Gathers layer 1 in place (ENGRAM_GATHER_IN_PLACE) through the client library, twice (the
// second time from the cache); 0: every byte right, 1: a gather failed, 2: wrong bytes, 3: the
// row cache was mapped when it should not have been, or the other way round.
int GatherInPlace(const std::string& socket, uint64_t seed, bool expect_mapped) {
  engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  o.socket_path = socket.c_str();
  o.data_bytes = 4 << 20;
  engram_session* s = nullptr;
  if (engram_session_open(&o, &s) != 0) return 1;
  constexpr uint64_t kN = 512;
  uint64_t* rows = nullptr;
  uint8_t* out = nullptr;
  engram_alloc(s, kN * 8, reinterpret_cast<void**>(&rows));
  engram_alloc(s, kN * kRowBytes, reinterpret_cast<void**>(&out));
  FillRows(rows, kN, kRows, seed);
  engram_gather_request r{.size = sizeof(r),
                          .layer = kCachedLayer,
                          .flags = ENGRAM_GATHER_IN_PLACE,
                          .rows = rows,
                          .num_rows = kN,
                          .dest = out,
                          .dest_offsets = nullptr};
  int rc = 0;
  for (int round = 0; round < 2 && rc == 0; ++round) {  // the second round hits the cache
    if (engram_gather(s, &r, 10'000'000'000) != 0) rc = 1;
    if (rc == 0 && FirstBadRow(kCachedLayer, rows, kN, out) >= 0) rc = 2;
  }
  std::ifstream maps("/proc/self/maps");
  const std::string text((std::istreambuf_iterator<char>(maps)), {});
  const bool mapped = text.find("memfd:engram-row-cache") != std::string::npos;
  engram_session_close(s);
  if (rc == 0 && mapped != expect_mapped) rc = 3;
  return rc;
}

TEST_CASE("a client of engramd's own uid cannot make the row cache writable", "[chaos][root]") {
  if (geteuid() != 0) ENGRAM_SKIP("needs root, to run engramd and its client as uid 65534");
  OwnerDaemon d;
  // A client of another uid (root) fills the cache and reads it in place.
  REQUIRE(GatherInPlace(d.socket(), 1, /*expect_mapped=*/true) == 0);
  // The attacker, of engramd's own uid: refused the descriptor.
  const int attack = AsOwner([&] { return RewriteCacheAsOwner(d.socket()); });
  INFO("engramd log:\n" << d.Log());
  CHECK(attack == 0);  // 1: it rewrote the rows every client reads
  // The rows read in place by the other uid are still the files'.
  CHECK(GatherInPlace(d.socket(), 1, /*expect_mapped=*/true) == 0);
  // A plain client of engramd's uid still gets every row, gathered by engramd.
  CHECK(AsOwner([&] { return GatherInPlace(d.socket(), 2, /*expect_mapped=*/false); }) == 0);
  const std::string log = d.Log();
  CHECK(log.find("runs as engramd's own uid 65534") != std::string::npos);
  CHECK(d.alive());
}

}  // namespace
}  // namespace engram::testing
