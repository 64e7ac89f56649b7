// TableStatePage: creating and sealing the page, withdrawing tables, and the robust futex that
// tells clients the daemon is gone.
#include "daemon/server/table_state.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/page_size.h"

namespace engram {
namespace {

absl::Status Refused(const char* step) {
  return absl::InternalError(absl::StrCat("table state page: ", step, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TableStatePage>> TableStatePage::Create(
    const std::vector<std::unique_ptr<Table>>& tables) {
  std::unique_ptr<TableStatePage> page(new TableStatePage());
  const uint64_t page_size = PageBytes();
  const uint64_t bytes =
      RoundUpTo(sizeof(engram_table_state_page) + tables.size() * sizeof(engram_table_state_entry),
                page_size);
  page->fd_.Reset(memfd_create("engram-table-state", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!page->fd_.valid()) return Refused("memfd_create");
  if (ftruncate(page->fd_.get(), static_cast<off_t>(bytes)) != 0) return Refused("ftruncate");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, page->fd_.get(), 0);
  if (p == MAP_FAILED) return Refused("mmap");
  page->page_.Reset(p, bytes);
  // The robust list lives in shared memory too: the OOM reaper may strip a killed process's
  // private memory before its threads' robust lists are walked, but leaves shared mappings.
  void* r = mmap(nullptr, page_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (r == MAP_FAILED) return Refused("mmap of the robust list");
  page->robust_.Reset(r, page_size);
  page->entries_ = tables.size();
  engram_table_state_page* h = page->header();
  h->magic = ENGRAM_TABLE_STATE_MAGIC;
  h->version_major = ENGRAM_PROTOCOL_MAJOR;
  h->version_minor = ENGRAM_PROTOCOL_MINOR;
  h->header_bytes = sizeof(engram_table_state_page);
  h->entries = static_cast<uint32_t>(tables.size());
  h->page_bytes = bytes;
  for (size_t i = 0; i < tables.size(); ++i) {
    page->entries()[i] = {.layer_id = tables[i]->layer_id(), .state = ENGRAM_TABLE_SERVING};
  }
  // The daemon's mapping stays writable; no other can be made (F_SEAL_FUTURE_WRITE).
  if (fcntl(page->fd_.get(), F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    return Refused("sealing");
  }
  int error = 0;
  page->holder_ = std::thread([raw = page.get(), &error] { raw->HoldLiveness(&error); });
  {
    std::unique_lock lock(page->mu_);
    page->cv_.wait(lock, [&] { return page->started_; });
  }
  if (error != 0) {
    errno = error;
    return Refused("set_robust_list (the liveness word clients read)");
  }
  return page;
}

void TableStatePage::HoldLiveness(int* ret_error) {
  auto* head = static_cast<robust_list_head*>(robust_.get());
  auto* entry = reinterpret_cast<robust_list*>(static_cast<uint8_t*>(robust_.get()) + 64);
  uint32_t* word = &header()->daemon_alive;
  entry->next = &head->list;
  head->list.next = entry;
  head->futex_offset = reinterpret_cast<uint8_t*>(word) - reinterpret_cast<uint8_t*>(entry);
  head->list_op_pending = nullptr;
  // This thread's robust list is ours alone: it never locks a robust pthread mutex.
  int error = 0;
  if (syscall(SYS_set_robust_list, head, sizeof(*head)) != 0) {
    error = errno;
  } else {
    std::atomic_ref<uint32_t>(*word).store(static_cast<uint32_t>(gettid()) & ENGRAM_DAEMON_TID_MASK,
                                           std::memory_order_release);
  }
  std::unique_lock lock(mu_);
  *ret_error = error;
  started_ = true;
  cv_.notify_all();
  if (error != 0) return;
  cv_.wait(lock, [&] { return stop_; });
  // Returning ends the thread: the kernel sets ENGRAM_DAEMON_OWNER_DIED in the word.
}

TableStatePage::~TableStatePage() {
  if (page_.valid()) WithdrawAll();
  if (holder_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    holder_.join();
  }
}

void TableStatePage::Withdraw(size_t index) {
  if (index >= entries_) return;
  std::atomic_ref<uint32_t>(entries()[index].state)
      .store(ENGRAM_TABLE_WITHDRAWN, std::memory_order_release);
}

void TableStatePage::WithdrawAll() {
  for (size_t i = 0; i < entries_; ++i) Withdraw(i);
}

bool TableStatePage::withdrawn(size_t index) const {
  return index >= entries_ ||
         std::atomic_ref<uint32_t>(entries()[index].state).load(std::memory_order_acquire) !=
             ENGRAM_TABLE_SERVING;
}

}  // namespace engram
