// Tests of TableStatePage: the page as a client maps it (sealed, read-only, an entry per table),
// withdrawing tables, and the liveness word the kernel marks when the daemon's thread ends,
// whether the daemon stops or is SIGKILLed.
#include "daemon/server/table_state.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "protocol/codec.h"
#include "tests/common/skip.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

// Two tables (layers 1 and 14) of a small synthetic checkpoint in a private directory.
std::vector<std::unique_ptr<Table>> Tables() {
  char tmpl[] = "/tmp/engram-table-state-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  REQUIRE(WriteSyntheticCheckpoint({.out_dir = dir, .rows = 100, .seed = 3}).ok());
  auto tables = OpenCheckpoint(dir, {});
  REQUIRE(tables.ok());
  std::filesystem::remove_all(dir);  // the tables keep their fds
  return std::move(*tables);
}

// The page as a client sees it: mapped read-only from a duplicate of the fd.
struct ClientView {
  explicit ClientView(int fd) {
    bytes = static_cast<size_t>(lseek(fd, 0, SEEK_END));
    void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    page = static_cast<const engram_table_state_page*>(p);
  }
  ~ClientView() { munmap(const_cast<engram_table_state_page*>(page), bytes); }
  uint32_t Alive() const {
    return __atomic_load_n(&page->daemon_alive, __ATOMIC_ACQUIRE);
  }
  uint32_t State(size_t i) const {
    const auto* e = reinterpret_cast<const engram_table_state_entry*>(
        reinterpret_cast<const uint8_t*>(page) + page->header_bytes);
    return __atomic_load_n(&e[i].state, __ATOMIC_ACQUIRE);
  }
  const engram_table_state_page* page = nullptr;
  size_t bytes = 0;
};

// Under qemu-user the page cannot be made (the emulator gives its guest no robust futex list, and
// not every seal): engramd then serves without in-place reads, saying so, and this test skips,
// naming what the page refused. Anywhere else a refusal is a failure.
bool EmulatorRefuses(const absl::Status& status, std::string* ret_reason) {
  if (status.ok() || std::getenv("MESON_EXE_WRAPPER") == nullptr) return false;
  *ret_reason = "under an emulator (qemu-user): " + std::string(status.message());
  return true;
}

TEST_CASE("the table state page is sealed and withdraws tables for good", "[daemon]") {
  auto tables = Tables();
  auto page = TableStatePage::Create(tables);
  if (std::string why; EmulatorRefuses(page.status(), &why)) ENGRAM_SKIP(why);
  REQUIRE(page.ok());
  const int fd = (*page)->fd();
  ClientView view(fd);
  CHECK(view.page->magic == ENGRAM_TABLE_STATE_MAGIC);
  CHECK(view.page->header_bytes == sizeof(engram_table_state_page));
  CHECK(view.page->entries == 2);
  CHECK(view.page->page_bytes == view.bytes);
  const auto* entries = reinterpret_cast<const engram_table_state_entry*>(
      reinterpret_cast<const uint8_t*>(view.page) + view.page->header_bytes);
  CHECK(entries[0].layer_id == 1);
  CHECK(entries[1].layer_id == 14);
  CHECK(view.State(0) == ENGRAM_TABLE_SERVING);
  CHECK(view.State(1) == ENGRAM_TABLE_SERVING);
  const uint32_t alive = view.Alive();
  CHECK((alive & ENGRAM_DAEMON_TID_MASK) != 0);
  CHECK((alive & ENGRAM_DAEMON_OWNER_DIED) == 0);
  // Nobody but the daemon's own mapping writes it.
  CHECK(mmap(nullptr, view.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
  CHECK(pwrite(fd, "x", 1, 0) == -1);
  CHECK(ftruncate(fd, 0) == -1);

  (*page)->Withdraw(1);
  CHECK(view.State(0) == ENGRAM_TABLE_SERVING);
  CHECK(view.State(1) == ENGRAM_TABLE_WITHDRAWN);
  CHECK((*page)->withdrawn(1));
  CHECK_FALSE((*page)->withdrawn(0));
  // The client keeps its own mapping (a dup of the fd keeps the memfd) past the daemon's end.
  const int kept = dup(fd);
  ClientView after(kept);
  close(kept);
  page->reset();  // engramd stopping: every table withdrawn, the liveness thread ended
  CHECK(after.State(0) == ENGRAM_TABLE_WITHDRAWN);
  CHECK((after.Alive() & ENGRAM_DAEMON_OWNER_DIED) != 0);
}

TEST_CASE("the kernel marks the liveness word of a SIGKILLed daemon", "[daemon]") {
  auto tables = Tables();
  if (std::string why; EmulatorRefuses(TableStatePage::Create(tables).status(), &why)) {
    ENGRAM_SKIP(why);
  }
  int pair[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
  const pid_t pid = fork();
  if (pid == 0) {
    auto page = TableStatePage::Create(tables);
    if (!page.ok()) _exit(1);
    const int fd = (*page)->fd();
    const char byte = 1;
    if (protocol::SendMessage(pair[1], &byte, 1, &fd, 1) < 0) _exit(2);
    pause();  // until SIGKILL: the page's destructor never runs
    _exit(3);
  }
  close(pair[1]);
  uint8_t byte = 0;
  int fd = -1, nfds = 0;
  REQUIRE(protocol::ReceiveMessage(pair[0], &byte, 1, &fd, 1, &nfds) == 1);
  REQUIRE(nfds == 1);
  ClientView view(fd);
  close(fd);
  CHECK((view.Alive() & ENGRAM_DAEMON_TID_MASK) != 0);
  CHECK((view.Alive() & ENGRAM_DAEMON_OWNER_DIED) == 0);
  CHECK(view.State(1) == ENGRAM_TABLE_SERVING);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  // Nothing of the daemon wrote this: the kernel did, walking the dead thread's robust list.
  CHECK((view.Alive() & ENGRAM_DAEMON_OWNER_DIED) != 0);
  CHECK(view.State(1) == ENGRAM_TABLE_SERVING);
  close(pair[0]);
}

}  // namespace
}  // namespace engram
