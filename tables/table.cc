// Table: the open, validated form of an Engram table, shared by both on-disk layouts; plus the
// file helpers the layout readers use and the path-sniffing OpenTables().
#include "tables/table.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/page_size.h"
#include "tables/table_internal.h"

namespace engram {

const char* TableLayoutName(TableLayout layout) {
  switch (layout) {
    case TableLayout::kCheckpoint:
      return "checkpoint";
    case TableLayout::kPacked:
      return "packed";
  }
  return "unknown";
}

Table::~Table() {
  for (TableFile& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
    f.fd = -1;
  }
}

uint32_t Table::max_pages_per_row() const {
  uint32_t pages = 0;
  for (const RowPart& p : parts_) {
    // A part inside one page costs one page; one that may start anywhere can straddle two.
    // These are the device's O_DIRECT blocks, the same on any kernel page size.
    const uint64_t block = kDirectIoAlignBytes;
    pages += p.paged() || p.bytes == 0
                 ? 1
                 : static_cast<uint32_t>(RoundUpTo(p.bytes, block) / block + 1);
  }
  return pages;
}

absl::Status Table::CheckRow(uint64_t row) const {
  if (covered_.contains(row)) return absl::OkStatus();
  if (row >= num_rows_) {
    return absl::OutOfRangeError(absl::StrCat("row ", row, " is past the end of ", Describe(),
                                              ", which has ", num_rows_, " rows"));
  }
  return absl::OutOfRangeError(absl::StrCat("row ", row, " is not held by ", Describe(),
                                            ": this copy covers rows [", covered_.begin, ", ",
                                            covered_.end, ")"));
}

std::string Table::Describe() const {
  const std::string& where =
      parts_.empty() || files_.empty() ? source_ : files_[parts_[0].file].path;
  return absl::StrCat("layer ", layer_id_, " (", where, ")");
}

absl::StatusOr<OpenedFile> OpenTableFile(const std::string& path) {
  // O_NONBLOCK: a FIFO (or a device) in a table file's place must not hang start-up in open(2);
  // it is refused below as not a regular file. Then the flag is cleared again: io_uring would
  // hand EAGAIN back for reads of a regular file opened O_NONBLOCK instead of waiting for them.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    std::string msg = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    return absl::UnavailableError(msg);
  }
  OpenedFile file{path, UniqueFd(fd), 0};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a regular file (",
                     S_ISFIFO(st.st_mode)  ? "a FIFO"
                     : S_ISDIR(st.st_mode) ? "a directory"
                                           : "a device or socket",
                     "); table files and checkpoint metadata must be regular files"));
  }
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot clear O_NONBLOCK on ", path, ": ", std::strerror(errno)));
  }
  file.size = static_cast<uint64_t>(st.st_size);
  // Engram reads are random 264-byte rows: readahead would only evict useful pages.
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  return file;
}

absl::Status PreadFull(int fd, const std::string& path, void* buf, uint64_t len, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(buf);
  uint64_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, p + done, len - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("read of ", len, " bytes at offset ", offset,
                                                 " of ", path, " failed: ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("unexpected end of file reading ", len,
                                              " bytes at offset ", offset, " of ", path, " (got ",
                                              done, ")"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status CheckNoHoles(int fd, const std::string& path, uint64_t begin, uint64_t end,
                          const std::string& what) {
  if (begin >= end) return absl::OkStatus();
  off_t hole = ::lseek(fd, static_cast<off_t>(begin), SEEK_HOLE);
  if (hole < 0) {
    if (errno == ENXIO) {  // begin is at or past EOF: the whole range is missing
      return absl::DataLossError(absl::StrCat(path, ": ", what, " bytes [", begin, ", ", end,
                                              ") lie past the end of the file"));
    }
    if (errno == EINVAL) return absl::OkStatus();  // no SEEK_HOLE support: all data
    return absl::UnavailableError(
        absl::StrCat("lseek(SEEK_HOLE) on ", path, " failed: ", std::strerror(errno)));
  }
  if (static_cast<uint64_t>(hole) < end) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", what, " bytes [", begin, ", ", end, ") contain a hole at offset ", hole,
        ": the file does not hold every row it claims (a sparse copy of another range?)"));
  }
  return absl::OkStatus();
}

TableBuilder::TableBuilder(uint32_t layer_id, uint64_t num_rows, RowRange covered,
                           TableLayout layout, std::string source)
    : table_(new Table()) {
  table_->layer_id_ = layer_id;
  table_->num_rows_ = num_rows;
  table_->covered_ = covered;
  table_->layout_ = layout;
  table_->source_ = std::move(source);
}

uint32_t TableBuilder::AddFile(OpenedFile file) {
  // A checkpoint shard usually holds both tensors of a layer: one entry (and one fd) per path,
  // so that per-file state (NOWAIT support, residency, notices) is kept once.
  for (size_t i = 0; i < table_->files_.size(); ++i) {
    if (table_->files_[i].path == file.path) return static_cast<uint32_t>(i);
  }
  table_->files_.push_back(TableFile{file.path, file.fd.Release(), file.size});
  return static_cast<uint32_t>(table_->files_.size() - 1);
}

void TableBuilder::AddPart(const RowPart& part) { table_->parts_.push_back(part); }

absl::StatusOr<std::unique_ptr<Table>> TableBuilder::Finish(bool check_holes) {
  const Table& t = *table_;
  if (t.covered_.begin >= t.covered_.end || t.covered_.end > t.num_rows_) {
    return absl::InvalidArgumentError(
        absl::StrCat("covered rows [", t.covered_.begin, ", ", t.covered_.end, ") of ",
                     t.Describe(), " are empty or outside its ", t.num_rows_, " rows"));
  }
  uint32_t dest_bytes = 0;
  for (const RowPart& p : t.parts_) {
    const TableFile& f = t.files_[p.file];
    const std::string what = absl::StrCat("layer ", t.layer_id_, " row bytes [", p.dest_offset,
                                          ", ", p.dest_offset + p.bytes, ")");
    dest_bytes += p.bytes;
    // Rows are laid out at a fixed stride, so the first and last covered rows bound them all.
    const uint64_t first = p.FileOffset(t.covered_.begin);
    const uint64_t last_end = p.FileOffset(t.covered_.end - 1) + p.bytes;
    if (last_end > f.size) {
      return absl::DataLossError(absl::StrCat(
          f.path, ": file is ", f.size, " bytes but ", what, " of covered rows [", t.covered_.begin,
          ", ", t.covered_.end, ") extend to offset ", last_end, " (truncated?)"));
    }
    if (check_holes) {
      if (absl::Status s = CheckNoHoles(f.fd, f.path, first, last_end, what); !s.ok()) return s;
    }
  }
  if (dest_bytes != kRowBytes) {
    return absl::InternalError(absl::StrCat(t.Describe(), ": row parts add up to ", dest_bytes,
                                            " bytes, not ", kRowBytes));
  }
  return std::move(table_);
}

absl::StatusOr<std::vector<std::unique_ptr<Table>>> OpenTables(const std::string& path,
                                                               const OpenOptions& options) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    std::string msg = absl::StrCat("cannot open table path ", path, ": ", std::strerror(errno));
    return errno == ENOENT ? absl::NotFoundError(msg) : absl::UnavailableError(msg);
  }
  if (S_ISDIR(st.st_mode)) return OpenCheckpoint(path, options);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is neither a checkpoint directory nor a packed table file"));
  }
  auto table = OpenPacked(path, options);
  if (!table.ok()) return table.status();
  std::vector<std::unique_ptr<Table>> tables;
  tables.push_back(*std::move(table));
  return tables;
}

std::string PagedLayoutAdvice(const Table& table) {
  if (table.max_pages_per_row() <= 1) return "";
  const std::string rows =
      table.covered() == RowRange{0, table.num_rows()}
          ? ""
          : absl::StrCat(" --rows ", table.covered().begin, ":", table.covered().end);
  const std::string cost =
      table.layout() == TableLayout::kCheckpoint
          ? "the checkpoint layout: each missed row is two device reads (its values and scales "
            "lie in distant regions of the shards)"
          : "a packed file of format version 1, in which about one row in 16 straddles a 4 KiB "
            "page boundary: such a missed row is two page reads";
  return absl::StrCat("cache-tier ", table.Describe(), " is served from ", cost, "; `engram-pack ",
                      table.source(), " --layer ", table.layer_id(), rows,
                      " --paged --out FILE` writes a copy (format version 2) in which each missed "
                      "row is one 4 KiB page read; serve FILE instead");
}

absl::Status ReadRowBlocking(const Table& table, uint64_t row, uint8_t* ret_row) {
  if (absl::Status s = table.CheckRow(row); !s.ok()) return s;
  uint8_t buf[kRowBytes];
  for (const RowPart& p : table.parts()) {
    const TableFile& f = table.files()[p.file];
    if (absl::Status s = PreadFull(f.fd, f.path, buf + p.dest_offset, p.bytes, p.FileOffset(row));
        !s.ok()) {
      return s;
    }
  }
  std::memcpy(ret_row, buf, kRowBytes);
  return absl::OkStatus();
}

}  // namespace engram
