// ResidentTable: streaming a table into its memfd with O_DIRECT page runs.
#include "store/resident_table.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/page_size.h"

namespace engram {
namespace {

// O_DIRECT alignment used for offsets, lengths and the buffer: the device's unit, not the page.
constexpr uint64_t kAlign = kDirectIoAlignBytes;

uint64_t AlignDown(uint64_t n) { return n / kAlign * kAlign; }
uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Rows compared with buffered reads once a load's last chunk is in (VerifySample).
constexpr uint64_t kSampleRows = 64;
// The longest a rate limit's wait goes without looking at the cancel flag.
constexpr uint64_t kCancelCheckNs = 50'000'000;

bool SameTime(const timespec& a, const timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

const char* FileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "another file";
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResidentTable>> ResidentTable::Create(
    const Table& table, MemoryBudget* budget, const ResidentOptions& options) {
  if (options.chunk_rows == 0) {
    return absl::InvalidArgumentError(absl::StrCat(table.Describe(), ": chunk_rows is 0"));
  }
  std::unique_ptr<ResidentTable> rt(new ResidentTable(table, budget, options));
  const std::string what = absl::StrCat("resident copy of ", table.Describe());
  // Reserve the largest size the region can take (rounded up to a huge page) so that the
  // budget never undercounts; the excess is given back once the page size is known.
  const uint64_t worst =
      SharedRegion::LargestSize(table.data_bytes(), {.huge_pages = options.huge_pages});
  if (budget != nullptr) {
    if (absl::Status s = budget->Reserve(worst, what); !s.ok()) return s;
    rt->reserved_ = worst;
  }
  auto region = SharedRegion::Create(absl::StrCat("engram-resident-", table.layer_id()),
                                     table.data_bytes(), {.huge_pages = options.huge_pages});
  if (!region.ok()) {
    return absl::Status(region.status().code(),
                        absl::StrCat(table.Describe(), ": ", region.status().message()));
  }
  rt->region_ = std::move(*region);
  if (budget != nullptr && rt->region_.size() < worst) {
    budget->Give(worst - rt->region_.size());
    rt->reserved_ = rt->region_.size();
  }
  if (absl::Status s = rt->RecordFiles(); !s.ok()) return s;
  if (!rt->region_.huge_page_notice().empty()) {
    rt->notices_.push_back(absl::StrCat(table.Describe(), ": ", rt->region_.huge_page_notice()));
  }
  return rt;
}

ResidentTable::~ResidentTable() {
  std::free(buffer_);
  if (budget_ != nullptr) budget_->Give(reserved_);
}

std::vector<std::string> ResidentTable::notices() const {
  std::lock_guard<std::mutex> lock(notices_mu_);
  return notices_;
}

absl::Status ResidentTable::RecordFiles() {
  for (const TableFile& f : table_.files()) {
    struct stat st;
    if (::fstat(f.fd, &st) != 0) {
      return absl::InternalError(
          absl::StrCat(table_.Describe(), ": fstat of ", f.path, ": ", std::strerror(errno)));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          table_.Describe(), ": ", f.path, " is ", FileKind(st.st_mode), ", not a regular file"));
    }
    identities_.push_back({.dev = st.st_dev,
                           .ino = st.st_ino,
                           .size = static_cast<uint64_t>(st.st_size),
                           .mtime = st.st_mtim,
                           .ctime = st.st_ctim});
  }
  return absl::OkStatus();
}

absl::Status ResidentTable::CheckFiles(const std::string& when) const {
  const auto changed = [&](const TableFile& f, const std::string& what) {
    return absl::DataLossError(absl::StrCat(table_.Describe(), ": ", f.path, " ", what, " (", when,
                                            "); the resident copy is refused until engramd is "
                                            "restarted on the new file"));
  };
  for (size_t i = 0; i < identities_.size(); ++i) {
    const TableFile& f = table_.files()[i];
    const FileIdentity& id = identities_[i];
    struct stat st;
    // The path first (a replaced file's own ctime moves too, as its link count drops); stat,
    // not open: a FIFO put in the file's place cannot block it.
    if (::stat(f.path.c_str(), &st) != 0) {
      return changed(f, absl::StrCat("is gone (", std::strerror(errno), ")"));
    }
    if (st.st_dev != id.dev || st.st_ino != id.ino) {
      return changed(f, absl::StrCat("was replaced: the path now names ", FileKind(st.st_mode),
                                     ", not the file engramd validated"));
    }
    if (::fstat(f.fd, &st) != 0) {
      return changed(f, absl::StrCat("cannot be fstat'ed: ", std::strerror(errno)));
    }
    if (static_cast<uint64_t>(st.st_size) != id.size) {
      return changed(f, absl::StrCat("changed size from ", id.size, " to ", st.st_size, " bytes"));
    }
    if (!SameTime(st.st_mtim, id.mtime) || !SameTime(st.st_ctim, id.ctime)) {
      return changed(f, "was written to, or its metadata changed (its mtime or ctime moved)");
    }
  }
  return absl::OkStatus();
}

absl::Status ResidentTable::VerifySample() const {
  const RowRange rows = covered();
  const uint64_t samples = std::min(kSampleRows, rows.size());
  uint64_t x = NowNs() | 1;  // a different sample each load
  uint8_t got[kRowBytes];
  for (uint64_t i = 0; i < samples; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    // One row from each of `samples` equal stretches: the whole table is covered.
    const uint64_t stretch = rows.size() / samples;
    const uint64_t row = rows.begin + i * stretch + x % stretch;
    const uint8_t* loaded = region_.data() + (row - rows.begin) * kRowBytes;
    for (const RowPart& p : table_.parts()) {
      const TableFile& f = table_.files()[p.file];
      const uint64_t at = p.FileOffset(row);
      const ssize_t n = ::pread(f.fd, got, p.bytes, static_cast<off_t>(at));
      if (n != static_cast<ssize_t>(p.bytes) ||
          std::memcmp(got, loaded + p.dest_offset, p.bytes) != 0) {
        return absl::DataLossError(absl::StrCat(
            table_.Describe(), ": row ", row, " as loaded differs from ", f.path, " at byte ", at,
            " read again: the file changed while it was loaded; the resident copy is refused "
            "until engramd is restarted on the new file"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ResidentTable::Refuse(absl::Status why) {
  // Rows loaded from a file that changed are not served from memory any more.
  rows_loaded_.store(0, std::memory_order_release);
  std::lock_guard<std::mutex> lock(notices_mu_);
  refusal_ = why;
  return why;
}

absl::Status ResidentTable::refusal() const {
  std::lock_guard<std::mutex> lock(notices_mu_);
  return refusal_;
}

absl::Status ResidentTable::OpenReaders() {
  if (readers_open_) return absl::OkStatus();
  uint64_t max_span = 0;
  for (const RowPart& p : table_.parts()) {
    max_span = std::max(max_span, p.MaxSpanBytes(options_.chunk_rows));
  }
  buffer_bytes_ = AlignUp(max_span) + 2 * kAlign;
  buffer_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, buffer_bytes_));
  if (buffer_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(table_.Describe(), ": cannot allocate a ", buffer_bytes_, "-byte buffer"));
  }
  direct_fds_.clear();
  for (size_t i = 0; i < table_.files().size(); ++i) {
    const TableFile& f = table_.files()[i];
    int fd = -1;
    if (options_.direct_io) {
      // The validated file itself, whatever its path names now: a new open file description
      // (O_DIRECT is a property of one) of the same inode. O_NONBLOCK: never wait in open.
      const std::string self = absl::StrCat("/proc/self/fd/", f.fd);
      fd = ::open(self.c_str(), O_RDONLY | O_DIRECT | O_NONBLOCK | O_CLOEXEC);
      struct stat st;
      if (fd >= 0 && (::fstat(fd, &st) != 0 || st.st_dev != identities_[i].dev ||
                      st.st_ino != identities_[i].ino)) {
        ::close(fd);
        return absl::DataLossError(absl::StrCat(table_.Describe(), ": ", self, " (", f.path,
                                                ") reopened as another file"));
      }
      if (fd < 0) {
        std::lock_guard<std::mutex> lock(notices_mu_);
        notices_.push_back(absl::StrCat(f.path, ": O_DIRECT refused (", std::strerror(errno),
                                        "); loading with buffered reads"));
      }
    }
    direct_fds_.emplace_back(fd);
  }
  readers_open_ = true;
  return absl::OkStatus();
}

// Reads file bytes [begin, end) into the bounce buffer with aligned reads; *ret_data points at
// byte `begin` inside it. Switches a file to buffered reads, with a notice, if O_DIRECT reads
// are refused (EINVAL) after the open succeeded.
absl::Status ResidentTable::ReadRange(uint32_t file, uint64_t begin, uint64_t end,
                                      uint8_t** ret_data) {
  const TableFile& f = table_.files()[file];
  const uint64_t abegin = AlignDown(begin);
  const uint64_t aend = AlignUp(end);
  uint64_t done = 0;
  while (abegin + done < end) {
    const bool direct = direct_fds_[file].valid();
    const int fd = direct ? direct_fds_[file].get() : f.fd;
    ssize_t n =
        ::pread(fd, buffer_ + done, aend - abegin - done, static_cast<off_t>(abegin + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && direct && errno == EINVAL) {
      std::lock_guard<std::mutex> lock(notices_mu_);
      notices_.push_back(absl::StrCat(f.path, ": O_DIRECT reads refused (", std::strerror(errno),
                                      "); loading with buffered reads"));
      direct_fds_[file].Reset();
      continue;
    }
    if (n < 0) {
      return absl::DataLossError(absl::StrCat(table_.Describe(), ": reading ", f.path, " at ",
                                              abegin + done, ": ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(table_.Describe(), ": ", f.path, " ends at ",
                                              abegin + done, ", before byte ", end));
    }
    done += static_cast<uint64_t>(n);
    // A short O_DIRECT read that is not at EOF leaves `done` unaligned; continuing from there
    // would be refused, so finish this range with buffered reads.
    if (direct && done % kAlign != 0 && abegin + done < end) direct_fds_[file].Reset();
  }
  *ret_data = buffer_ + (begin - abegin);
  return absl::OkStatus();
}

absl::Status ResidentTable::LoadChunk(uint64_t first, uint64_t count) {
  uint8_t* dst = region_.data() + (first - covered().begin) * kRowBytes;
  for (const RowPart& p : table_.parts()) {
    uint8_t* src = nullptr;
    const uint64_t begin = p.FileOffset(first);
    if (absl::Status s = ReadRange(p.file, begin, begin + p.SpanBytes(first, count), &src);
        !s.ok()) {
      return s;
    }
    if (p.bytes == kRowBytes && !p.paged()) {
      std::memcpy(dst, src, count * kRowBytes);
      continue;
    }
    for (uint64_t i = 0; i < count; ++i) {
      std::memcpy(dst + i * kRowBytes + p.dest_offset, src + (p.FileOffset(first + i) - begin),
                  p.bytes);
    }
  }
  return absl::OkStatus();
}

bool ResidentTable::WaitForRate(const std::atomic<bool>* cancel) const {
  const auto cancelled = [&] {
    return cancel != nullptr && cancel->load(std::memory_order_relaxed);
  };
  for (uint64_t now = NowNs(); now < rate_due_ns_; now = NowNs()) {
    if (cancelled()) return false;
    std::this_thread::sleep_for(
        std::chrono::nanoseconds(std::min(rate_due_ns_ - now, kCancelCheckNs)));
  }
  return !cancelled();
}

absl::Status ResidentTable::Load(const std::atomic<bool>* cancel, const Progress& progress) {
  if (loading_.exchange(true)) {
    return absl::FailedPreconditionError(
        absl::StrCat(table_.Describe(), ": a load is already running"));
  }
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag.store(false); }
  } done{loading_};
  if (absl::Status s = refusal(); !s.ok()) return s;
  if (absl::Status s = OpenReaders(); !s.ok()) return s;
  const uint64_t total = covered().size();
  uint64_t loaded = rows_loaded();
  while (loaded < total) {
    if (!WaitForRate(cancel)) {
      return absl::CancelledError(absl::StrCat(table_.Describe(), ": load cancelled with ", loaded,
                                               " of ", total, " rows resident"));
    }
    if (absl::Status s = CheckFiles(absl::StrCat("before loading row ", covered().begin + loaded));
        !s.ok()) {
      return Refuse(s);
    }
    const uint64_t count = std::min(options_.chunk_rows, total - loaded);
    const uint64_t chunk_start = NowNs();
    if (absl::Status s = LoadChunk(covered().begin + loaded, count); !s.ok()) return s;
    if (options_.rate_bytes_per_s != 0) {
      // A token bucket without a burst: each chunk moves the due time on by its bytes' worth.
      rate_due_ns_ = std::max(rate_due_ns_, chunk_start) +
                     static_cast<uint64_t>(double(count * kRowBytes) * 1e9 /
                                           double(options_.rate_bytes_per_s));
    }
    loaded += count;
    rows_loaded_.store(loaded, std::memory_order_release);
    if (progress) progress(loaded, total);
  }
  return Finish();
}

// Every row is in: checks the files once more and a sample of rows against them, then seals.
absl::Status ResidentTable::Finish() {
  for (const UniqueFd& fd : direct_fds_) direct_io_used_ = direct_io_used_ || fd.valid();
  direct_fds_.clear();
  readers_open_ = false;
  std::free(buffer_);
  buffer_ = nullptr;
  if (absl::Status s = CheckFiles("after the last row was loaded"); !s.ok()) return Refuse(s);
  if (absl::Status s = VerifySample(); !s.ok()) return Refuse(s);
  if (absl::Status s = region_.Seal(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(table_.Describe(), ": ", s.message()));
  }
  sealed_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace engram
