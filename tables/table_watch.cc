// Change detection for the files tables are served from: leases, inotify, re-stat (see the
// header).
#include "tables/table_watch.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace engram {
namespace {

constexpr uint32_t kFileEvents = IN_MODIFY | IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF;
constexpr uint32_t kDirEvents = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE;

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool SameTime(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

}  // namespace

std::unique_ptr<TableWatch> TableWatch::Create(const std::vector<std::unique_ptr<Table>>& tables,
                                               std::vector<std::string>* ret_notes) {
  std::unique_ptr<TableWatch> watch(new TableWatch());
  watch->tables_ = &tables;
  watch->states_ = std::make_unique<TableState[]>(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    for (const TableFile& tf : tables[t]->files()) {
      struct stat st;
      if (::fstat(tf.fd, &st) != 0) continue;  // cannot happen on an fd the table holds open
      watch->files_.push_back(File{.table = t,
                                   .file = &tf,
                                   .dev = st.st_dev,
                                   .ino = st.st_ino,
                                   .size = static_cast<uint64_t>(st.st_size),
                                   .mtime = st.st_mtim});
    }
  }
  watch->SetUp(ret_notes);
  return watch;
}

void TableWatch::SetUp(std::vector<std::string>* ret_notes) {
  // Leases: the break is signalled (a real-time signal carrying the fd) to this thread only,
  // where the signal is blocked and read from a signalfd.
  lease_signal_ = SIGRTMIN + 2;
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, lease_signal_);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  lease_fd_ = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  const f_owner_ex owner{.type = F_OWNER_TID, .pid = static_cast<pid_t>(syscall(SYS_gettid))};
  size_t unleased = 0;
  std::string lease_error;
  for (File& f : files_) {
    const int fd = f.file->fd;
    if (lease_fd_ >= 0 && fcntl(fd, F_SETOWN_EX, &owner) == 0 &&
        fcntl(fd, F_SETSIG, lease_signal_) == 0 && fcntl(fd, F_SETLEASE, F_RDLCK) == 0) {
      f.leased = true;
    } else {
      ++unleased;
      if (lease_error.empty()) lease_error = absl::StrCat(f.file->path, ": ", strerror(errno));
    }
  }
  if (unleased != 0) {
    ret_notes->push_back(
        absl::StrCat("no read lease on ", unleased, " of ", files_.size(),
                     " table file(s) (first: ", lease_error,
                     "); a write to them is noticed by inotify and re-stat, after the fact "
                     "(leases need the files' owner or CAP_LEASE)"));
  }
  inotify_fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (inotify_fd_ < 0) {
    ret_notes->push_back(
        absl::StrCat("inotify: ", strerror(errno), "; table files are re-checked by stat only"));
    return;
  }
  for (File& f : files_) {
    f.wd = inotify_add_watch(inotify_fd_, f.file->path.c_str(), kFileEvents);
    const std::string dir = DirOf(f.file->path);
    bool have_dir = false;
    for (const auto& [wd, d] : dir_watches_) have_dir |= d == dir;
    if (have_dir) continue;
    const int wd = inotify_add_watch(inotify_fd_, dir.c_str(), kDirEvents | IN_ONLYDIR);
    if (wd >= 0) dir_watches_.emplace_back(wd, dir);
  }
}

TableWatch::~TableWatch() {
  for (File& f : files_) {
    if (f.leased) fcntl(f.file->fd, F_SETLEASE, F_UNLCK);
  }
  if (inotify_fd_ >= 0) close(inotify_fd_);
  if (lease_fd_ >= 0) close(lease_fd_);
}

void TableWatch::MarkChanged(File& f, const std::string& what, std::vector<std::string>* out) {
  TableState& state = states_[f.table];
  if (!state.changed.load(std::memory_order_relaxed)) {
    state.message = absl::StrCat((*tables_)[f.table]->Describe(), ": ", f.file->path, " ", what,
                                 " after it was validated; the table stops serving until "
                                 "engramd is restarted on the new file");
    state.changed.store(true, std::memory_order_release);
    out->push_back(state.message);
  }
  // Only now may the writer's open(2) or truncate(2) go on: every gather that starts after
  // this fails, and every one running sees the mark when it ends.
  if (f.leased) {
    fcntl(f.file->fd, F_SETLEASE, F_UNLCK);
    f.leased = false;
  }
}

std::vector<std::string> TableWatch::OnLeaseBreak() {
  std::vector<std::string> out;
  signalfd_siginfo info;
  while (read(lease_fd_, &info, sizeof(info)) == sizeof(info)) {
    for (File& f : files_) {
      if (f.file->fd == info.ssi_fd) MarkChanged(f, "was opened for writing or truncated", &out);
    }
  }
  return out;
}

std::vector<std::string> TableWatch::OnInotify() {
  std::vector<std::string> out;
  alignas(inotify_event) char buffer[4096];
  while (true) {
    const ssize_t n = read(inotify_fd_, buffer, sizeof(buffer));
    if (n <= 0) break;
    for (ssize_t at = 0; at < n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buffer + at);
      at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      for (File& f : files_) {
        if (f.wd == e->wd && (e->mask & IN_MODIFY) != 0) {
          MarkChanged(f, "was written to", &out);
        } else if (f.wd == e->wd) {
          RecheckFile(f, &out);
        }
      }
      for (const auto& [wd, dir] : dir_watches_) {
        if (wd != e->wd) continue;
        for (File& f : files_) {
          if (DirOf(f.file->path) == dir) RecheckFile(f, &out);
        }
      }
      if ((e->mask & IN_Q_OVERFLOW) != 0) {
        for (File& f : files_) RecheckFile(f, &out);
      }
    }
  }
  return out;
}

void TableWatch::RecheckFile(File& f, std::vector<std::string>* out) {
  struct stat st;
  if (::fstat(f.file->fd, &st) == 0) {
    if (static_cast<uint64_t>(st.st_size) != f.size) {
      MarkChanged(f, absl::StrCat("changed size from ", f.size, " to ", st.st_size, " bytes"), out);
      return;
    }
    if (!SameTime(st.st_mtim, f.mtime)) {
      MarkChanged(f, "was modified (its mtime changed)", out);
      return;
    }
  }
  if (::stat(f.file->path.c_str(), &st) != 0) {
    MarkChanged(f, absl::StrCat("was removed (", strerror(errno), ")"), out);
  } else if (st.st_dev != f.dev || st.st_ino != f.ino) {
    MarkChanged(f, "was replaced by another file", out);
  }
}

std::vector<std::string> TableWatch::Recheck() {
  std::vector<std::string> out;
  for (File& f : files_) {
    if (!states_[f.table].changed.load(std::memory_order_relaxed)) RecheckFile(f, &out);
  }
  return out;
}

bool TableWatch::Changed(size_t index) const {
  return states_[index].changed.load(std::memory_order_acquire);
}

absl::Status TableWatch::Check(size_t index) const {
  if (!Changed(index)) return absl::OkStatus();
  return absl::DataLossError(states_[index].message);
}

size_t TableWatch::leased_files() const {
  size_t n = 0;
  for (const File& f : files_) n += f.leased ? 1 : 0;
  return n;
}

}  // namespace engram
