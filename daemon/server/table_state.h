// TableStatePage: the daemon's table state page (struct engram_table_state_page in
// include/engram/protocol.h; docs/protocol.md, "Reading in place"). One sealed memfd that every
// client reading a resident table in place maps read-only: a word per table that the daemon sets
// to WITHDRAWN when it stops standing behind the table's bytes, and a liveness word that the
// kernel marks when the daemon ends, however it ends (a robust futex held by a thread of this
// object: SIGKILL included, where the daemon writes nothing).
//
//   auto page = TableStatePage::Create(tables);  // Internal when the kernel refuses
//   SendWithTable(page->fd(), index);
//   page->Withdraw(index);  // a file of tables[index] changed: mapped clients stop
//   page->WithdrawAll();    // stopping
//   page.reset();           // the liveness thread ends: clients see the daemon gone
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "base/unique_mapping.h"
#include "engram/protocol.h"
#include "tables/table.h"

namespace engram {

class TableStatePage {
 public:
  // A page with one SERVING entry per table (entry i is tables[i]), sealed, and the liveness
  // word held by a thread of its own. Internal naming the step when the kernel refuses one.
  static absl::StatusOr<std::unique_ptr<TableStatePage>> Create(
      const std::vector<std::unique_ptr<Table>>& tables);
  // Withdraws every table, then ends the liveness thread (the kernel marks the word).
  ~TableStatePage();
  TableStatePage(const TableStatePage&) = delete;
  TableStatePage& operator=(const TableStatePage&) = delete;

  // The sealed memfd, to send with TABLE_MAPPED (clients can only map it read-only).
  int fd() const { return fd_.get(); }
  // Marks entry `index` withdrawn (release): clients stop reading the table before their next
  // read and fail a read that the mark overlapped. For good. Thread-safe.
  void Withdraw(size_t index);
  void WithdrawAll();
  bool withdrawn(size_t index) const;

 private:
  TableStatePage() = default;
  engram_table_state_page* header() const {
    return static_cast<engram_table_state_page*>(page_.get());
  }
  engram_table_state_entry* entries() const {
    return reinterpret_cast<engram_table_state_entry*>(static_cast<uint8_t*>(page_.get()) +
                                                       sizeof(engram_table_state_page));
  }
  // The liveness thread: registers the word as its robust futex, publishes its id, then waits
  // for the destructor. Returns (through *ret_error) 0 or the errno of set_robust_list.
  void HoldLiveness(int* ret_error);

  UniqueFd fd_;
  UniqueMapping page_;    // read-write: only this mapping may write the page
  UniqueMapping robust_;  // the robust list head and entry (shared memory: see Create)
  size_t entries_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool stop_ = false;
  std::thread holder_;
};

}  // namespace engram
