// ResidentTable: streaming a table into its memfd with O_DIRECT page runs.
#include "store/resident_table.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace engram {
namespace {

// O_DIRECT alignment used for offsets, lengths and the buffer: the page size covers every
// logical block size in use (512 B and 4 KiB).
constexpr uint64_t kAlign = 4096;

uint64_t AlignDown(uint64_t n) { return n / kAlign * kAlign; }
uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

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
  const uint64_t worst = (table.data_bytes() + (2ull << 20) - 1) / (2ull << 20) * (2ull << 20);
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

absl::Status ResidentTable::OpenReaders() {
  if (readers_open_) return absl::OkStatus();
  uint32_t max_part = 0;
  for (const RowPart& p : table_.parts()) max_part = std::max(max_part, p.bytes);
  buffer_bytes_ = AlignUp(options_.chunk_rows * max_part) + 2 * kAlign;
  buffer_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, buffer_bytes_));
  if (buffer_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(table_.Describe(), ": cannot allocate a ", buffer_bytes_, "-byte buffer"));
  }
  direct_fds_.clear();
  for (const TableFile& f : table_.files()) {
    int fd = -1;
    if (options_.direct_io) {
      fd = ::open(f.path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
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
    if (absl::Status s = ReadRange(p.file, begin, begin + count * p.bytes, &src); !s.ok()) {
      return s;
    }
    if (p.bytes == kRowBytes) {
      std::memcpy(dst, src, count * kRowBytes);
      continue;
    }
    for (uint64_t i = 0; i < count; ++i) {
      std::memcpy(dst + i * kRowBytes + p.dest_offset, src + i * p.bytes, p.bytes);
    }
  }
  return absl::OkStatus();
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
  if (absl::Status s = OpenReaders(); !s.ok()) return s;
  const uint64_t total = covered().size();
  uint64_t loaded = rows_loaded();
  const uint64_t first = loaded;
  const auto start = std::chrono::steady_clock::now();
  const auto cancelled = [&] {
    return cancel != nullptr && cancel->load(std::memory_order_relaxed);
  };
  while (loaded < total) {
    if (cancelled()) {
      return absl::CancelledError(absl::StrCat(table_.Describe(), ": load cancelled with ", loaded,
                                               " of ", total, " rows resident"));
    }
    const uint64_t count = std::min(options_.chunk_rows, total - loaded);
    if (absl::Status s = LoadChunk(covered().begin + loaded, count); !s.ok()) return s;
    loaded += count;
    rows_loaded_.store(loaded, std::memory_order_release);
    if (progress) progress(loaded, total);
    if (options_.rate_bytes_per_s != 0 && loaded < total) {
      // Hold the average at the rate: wait until the bytes read so far are due, in short
      // steps so that a cancel is seen within 50 ms.
      const auto due = start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::duration<double>(
                                       double((loaded - first) * kRowBytes) /
                                       double(options_.rate_bytes_per_s)));
      for (auto now = std::chrono::steady_clock::now(); !cancelled() && now < due;
           now = std::chrono::steady_clock::now()) {
        std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(
            due - now, std::chrono::milliseconds(50)));
      }
    }
  }
  for (const UniqueFd& fd : direct_fds_) direct_io_used_ = direct_io_used_ || fd.valid();
  direct_fds_.clear();
  readers_open_ = false;
  std::free(buffer_);
  buffer_ = nullptr;
  if (absl::Status s = region_.Seal(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(table_.Describe(), ": ", s.message()));
  }
  sealed_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace engram
