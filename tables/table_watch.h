// Notices when a file that a table is served from changes under the daemon, so that the table
// stops serving with an error naming the file instead of serving bytes that were never
// validated. Three layers, each cheaper to trust than the next:
//   - a read lease on every file (where the daemon owns the file or holds CAP_LEASE): the kernel
//     tells the daemon before any other process's open for writing, or truncate, returns, so the
//     table is marked changed before the first byte can change;
//   - inotify on every file and its directory: writes, truncation, replacement and removal;
//   - Recheck(): fstat of every open file (size, mtime) and stat of its path (same inode), run
//     periodically, for what the others cannot see (a remote filesystem, a lost event).
// A changed table stays refused until engramd is restarted on the new files.
//
//   auto watch = TableWatch::Create(tables);           // on the thread that will poll it
//   for (std::string& m : watch->OnLeaseBreak()) log(m);   // when lease_fd() is readable
//   absl::Status s = watch->Check(table_index);          // any thread, before and after a gather
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tables/table.h"

namespace engram {

class TableWatch {
 public:
  // Watches the files of `tables` (table i of the result is tables[i]); the tables must outlive
  // the watch. Must be created on the thread that reads lease_fd(): lease breaks are signalled
  // to that thread only (the signal is blocked there and read through a signalfd).
  // `ret_notes` receives what could not be set up (no lease on a file, no inotify), for the log.
  static std::unique_ptr<TableWatch> Create(const std::vector<std::unique_ptr<Table>>& tables,
                                            std::vector<std::string>* ret_notes);
  ~TableWatch();
  TableWatch(const TableWatch&) = delete;
  TableWatch& operator=(const TableWatch&) = delete;

  // Readable when a lease was broken / an inotify event arrived; -1 when unavailable.
  int lease_fd() const { return lease_fd_; }
  int inotify_fd() const { return inotify_fd_; }
  // Each consumes what is readable and returns one message per file newly found changed
  // ("layer 14 (PATH): PATH was opened for writing; the table stops serving").
  std::vector<std::string> OnLeaseBreak();
  std::vector<std::string> OnInotify();
  std::vector<std::string> Recheck();

  // OK while every file of table `index` is as it was validated; DataLoss naming the file and
  // what happened to it otherwise. Thread-safe: one atomic load on the good path.
  absl::Status Check(size_t index) const;
  bool Changed(size_t index) const;
  // Files under a read lease.
  size_t leased_files() const;

 private:
  struct File {
    size_t table;
    const TableFile* file;
    dev_t dev;
    ino_t ino;
    uint64_t size;
    struct timespec mtime;
    int wd = -1;  // inotify watch on the file
    bool leased = false;
  };
  struct TableState {
    std::atomic<bool> changed{false};
    std::string message;  // written once, before `changed` is set
  };
  TableWatch() = default;
  void SetUp(std::vector<std::string>* ret_notes);
  // Marks the table of `f` changed (once) and releases the file's lease; appends the message.
  void MarkChanged(File& f, const std::string& what, std::vector<std::string>* out);
  void RecheckFile(File& f, std::vector<std::string>* out);

  const std::vector<std::unique_ptr<Table>>* tables_ = nullptr;
  std::vector<File> files_;
  std::unique_ptr<TableState[]> states_;
  std::vector<std::pair<int, std::string>> dir_watches_;  // wd → directory
  int lease_fd_ = -1;
  int inotify_fd_ = -1;
  int lease_signal_ = 0;
};

}  // namespace engram
