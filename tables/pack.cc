// PackTable(): streams one Engram table into the packed layout (docs/table_format.md).
#include "tables/pack.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "tables/packed_format.h"
#include "tables/table_internal.h"

namespace engram {
namespace {

// The temporary output: unlinked on destruction unless committed.
class TempOutput {
 public:
  ~TempOutput() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !path_.empty()) ::unlink(path_.c_str());
  }
  absl::Status Create(const std::string& final_path) {
    final_ = final_path;
    std::string tmpl = final_path + ".tmp-XXXXXX";
    fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd_ < 0) return ErrnoStatus("cannot create a temporary file next to", final_path);
    path_ = tmpl;
    (void)::fchmod(fd_, 0644);
    return absl::OkStatus();
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  absl::Status Commit() {
    if (::fsync(fd_) != 0) return ErrnoStatus("cannot fsync", path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return ErrnoStatus("cannot close", path_);
    if (::rename(path_.c_str(), final_.c_str()) != 0) {
      return ErrnoStatus(absl::StrCat("cannot rename ", path_, " to"), final_);
    }
    committed_ = true;
    const std::filesystem::path parent = std::filesystem::path(final_).parent_path();
    return FsyncDirectory(parent.empty() ? std::string(".") : parent.string());
  }

 private:
  std::string final_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Written output is pushed to disk and dropped from the page cache a window behind, so that
// converting a table larger than memory neither piles up dirty pages nor evicts everything else
// on the machine.
class WriteBehind {
 public:
  WriteBehind(int fd, uint64_t start) : fd_(fd), flushed_to_(start), started_to_(start) {}

  // Bytes up to `written_to` have been written.
  void Wrote(uint64_t written_to) {
    if (written_to - started_to_ < kWindow) return;
    (void)::sync_file_range(fd_, static_cast<off_t>(started_to_),
                            static_cast<off_t>(written_to - started_to_), SYNC_FILE_RANGE_WRITE);
    if (started_to_ > flushed_to_) {
      (void)::sync_file_range(
          fd_, static_cast<off_t>(flushed_to_), static_cast<off_t>(started_to_ - flushed_to_),
          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      (void)::posix_fadvise(fd_, static_cast<off_t>(flushed_to_),
                            static_cast<off_t>(started_to_ - flushed_to_), POSIX_FADV_DONTNEED);
      flushed_to_ = started_to_;
    }
    started_to_ = written_to;
  }

 private:
  static constexpr uint64_t kWindow = 64ull << 20;
  int fd_;
  uint64_t flushed_to_;  // written back and dropped up to here
  uint64_t started_to_;  // write-back started up to here
};

// Sizes the output and writes its header page. Sizing the file first makes a sparse copy's
// leading rows a hole rather than written zeros.
absl::Status WriteHeaderPage(const TempOutput& out, const PackedHeader& header) {
  if (::ftruncate(out.fd(), static_cast<off_t>(header.data_end)) != 0) {
    return ErrnoStatus("cannot size", out.path());
  }
  std::vector<uint8_t> page(kPackedDataOffset, 0);
  std::memcpy(page.data(), &header, sizeof(header));
  return WriteAllAt(out.fd(), out.path(), page.data(), page.size(), 0);
}

// Reads rows [first, first + n) of table into row_buf as whole rows, through part_buf (sized
// for the parts' widest span) when a part is not a run of whole rows.
absl::Status ReadRows(const Table& table, uint64_t first, uint64_t n, std::vector<uint8_t>& row_buf,
                      std::vector<uint8_t>& part_buf) {
  for (const RowPart& p : table.parts()) {
    const TableFile& f = table.files()[p.file];
    const bool direct = p.bytes == kRowBytes && !p.paged();
    uint8_t* dst = direct ? row_buf.data() : part_buf.data();
    const uint64_t begin = p.FileOffset(first);
    if (absl::Status s = PreadFull(f.fd, f.path, dst, p.SpanBytes(first, n), begin); !s.ok()) {
      return s;
    }
    if (!direct) {
      for (uint64_t i = 0; i < n; ++i) {
        std::memcpy(row_buf.data() + i * kRowBytes + p.dest_offset,
                    dst + (p.FileOffset(first + i) - begin), p.bytes);
      }
    }
  }
  return absl::OkStatus();
}

// Copies the table's covered rows into out, a buffer's worth at a time. A paged output gets
// whole pages (rows, then zero padding) assembled in page_buf.
absl::Status CopyRows(const Table& table, const PackedHeader& header, const TempOutput& out,
                      const PackOptions& options) {
  const RowRange rows = table.covered();
  const bool paged = PackedPaged(header);
  uint64_t chunk_rows = std::max<uint64_t>(1, options.buffer_bytes / kRowBytes);
  if (paged)
    chunk_rows = std::max<uint64_t>(1, chunk_rows / kPackedRowsPerPage) * kPackedRowsPerPage;
  std::vector<uint8_t> row_buf(chunk_rows * kRowBytes);
  std::vector<uint8_t> part_buf;
  uint64_t max_span = 0;
  for (const RowPart& p : table.parts()) max_span = std::max(max_span, p.MaxSpanBytes(chunk_rows));
  if (table.parts().size() != 1 || table.parts()[0].paged()) part_buf.resize(max_span);
  std::vector<uint8_t> page_buf;
  if (paged) page_buf.resize((chunk_rows / kPackedRowsPerPage + 1) * kPackedPageBytes);
  const uint64_t total_bytes = rows.size() * kRowBytes;
  WriteBehind write_behind(out.fd(), PackedRowOffset(header, rows.begin));
  const uint64_t first_slot = (header.flags & kPackedFlagSparse) ? 0 : rows.begin;
  for (uint64_t first = rows.begin, n = 0; first < rows.end; first += n) {
    n = std::min(chunk_rows, rows.end - first);
    // A paged chunk ends at a page's end, so that the next chunk's first page is its own.
    if (paged) n = std::min(n, chunk_rows - (first - first_slot) % kPackedRowsPerPage);
    if (absl::Status s = ReadRows(table, first, n, row_buf, part_buf); !s.ok()) return s;
    const uint64_t off = PackedRowOffset(header, first);
    const uint8_t* data = row_buf.data();
    uint64_t bytes = n * kRowBytes;
    if (paged) {
      // Every page this chunk touches is written whole: its rows, then zeros to the page's end
      // (a sparse copy's first page also gets zeros before its first row).
      const uint64_t page0 = off / kPackedPageBytes * kPackedPageBytes;
      const uint64_t end = PackedRowOffset(header, first + n - 1) + kRowBytes;
      bytes = (end - page0 + kPackedPageBytes - 1) / kPackedPageBytes * kPackedPageBytes;
      std::memset(page_buf.data(), 0, bytes);
      for (uint64_t i = 0; i < n; ++i) {
        std::memcpy(page_buf.data() + (PackedRowOffset(header, first + i) - page0),
                    row_buf.data() + i * kRowBytes, kRowBytes);
      }
      if (absl::Status s = WriteAllAt(out.fd(), out.path(), page_buf.data(), bytes, page0);
          !s.ok()) {
        return s;
      }
      write_behind.Wrote(page0 + bytes);
    } else {
      if (absl::Status s = WriteAllAt(out.fd(), out.path(), data, bytes, off); !s.ok()) return s;
      write_behind.Wrote(off + bytes);
    }
    if (options.progress) options.progress((first + n - rows.begin) * kRowBytes, total_bytes);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PackTable(const PackOptions& options, PackStats* ret_stats) {
  if (options.out.empty()) return absl::InvalidArgumentError("no output file given");
  const auto start = std::chrono::steady_clock::now();
  OpenOptions open_options;
  open_options.layers = {options.layer};
  open_options.rows = options.rows;
  open_options.check_holes = options.check_input_holes;
  auto tables = OpenTables(options.input, open_options);
  if (!tables.ok()) return tables.status();
  if (tables->size() != 1) {
    return absl::NotFoundError(
        absl::StrCat("layer ", options.layer, " is not an Engram table of ", options.input));
  }
  const Table& table = *(*tables)[0];
  PackedHeader header = MakePackedHeader(table.layer_id(), table.num_rows(), table.covered(),
                                         options.sparse, options.paged);
  SealPackedHeader(&header);

  TempOutput out;
  if (absl::Status s = out.Create(options.out); !s.ok()) return s;
  if (absl::Status s = WriteHeaderPage(out, header); !s.ok()) return s;
  if (absl::Status s = CopyRows(table, header, out, options); !s.ok()) return s;
  if (absl::Status s = out.Commit(); !s.ok()) return s;

  // What was written must open as what was asked for.
  auto check = OpenPacked(options.out, OpenOptions{});
  if (!check.ok()) {
    return absl::InternalError(absl::StrCat("the packed file written to ", options.out,
                                            " does not open: ", check.status().message()));
  }
  if (ret_stats != nullptr) {
    struct stat st;
    if (::stat(options.out.c_str(), &st) != 0) return ErrnoStatus("cannot stat", options.out);
    ret_stats->rows = table.covered().size();
    ret_stats->row_bytes = ret_stats->rows * kRowBytes;
    ret_stats->file_bytes = static_cast<uint64_t>(st.st_size);
    ret_stats->disk_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
    ret_stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return absl::OkStatus();
}

}  // namespace engram
