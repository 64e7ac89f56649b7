// Fixtures for the gather engine's tests and benchmarks: synthetic checkpoints and packed table
// files with known row contents, page-cache eviction, and row checks.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tables/packed_format.h"
#include "tables/table.h"
#include "testkit/synthetic.h"

namespace engram::testing {

// A directory removed with everything in it when the object goes away.
class TempDir {
 public:
  explicit TempDir(const std::string& parent = "/tmp") {
    std::string tmpl = parent + "/engram-gather-XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writes a packed table file holding rows [0, rows) of synthetic layer `layer` and syncs it, so
// that its pages are clean and posix_fadvise(DONTNEED) can evict them. `paged`: format version 2
// (15 rows to a 4 KiB page).
inline absl::Status WriteSyntheticPacked(const std::string& path, uint32_t layer, uint64_t rows,
                                         uint64_t seed, bool paged = false) {
  PackedHeader h = MakePackedHeader(layer, rows, {0, rows}, /*sparse=*/false, paged);
  SealPackedHeader(&h);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("creating ", path));
  auto write_all = [&](const void* p, size_t n, uint64_t off) {
    const auto* b = static_cast<const uint8_t*>(p);
    while (n > 0) {
      const ssize_t w = pwrite(fd, b, n, off);
      if (w <= 0) return false;
      b += w;
      n -= w;
      off += w;
    }
    return true;
  };
  bool ok = ftruncate(fd, static_cast<off_t>(h.data_end)) == 0 && write_all(&h, sizeof(h), 0);
  constexpr uint64_t kChunkRows = 8190;  // whole pages of a paged file
  std::vector<uint8_t> buf(kChunkRows * kRowBytes);
  for (uint64_t r = 0; ok && r < rows; r += kChunkRows) {
    const uint64_t n = std::min(kChunkRows, rows - r);
    SyntheticRows(seed, layer, r, n, buf.data());
    if (!paged) {
      ok = write_all(buf.data(), n * kRowBytes, PackedRowOffset(h, r));
      continue;
    }
    for (uint64_t i = 0; ok && i < n; i += kPackedRowsPerPage) {
      const uint64_t k = std::min<uint64_t>(kPackedRowsPerPage, n - i);
      ok = write_all(buf.data() + i * kRowBytes, k * kRowBytes, PackedRowOffset(h, r + i));
    }
  }
  ok = ok && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!ok) return absl::ErrnoToStatus(err, absl::StrCat("writing ", path));
  return absl::OkStatus();
}

// Opens the packed file, or the checkpoint directory's table of `layer`.
inline absl::StatusOr<std::unique_ptr<Table>> OpenOne(const std::string& path, uint32_t layer) {
  OpenOptions opts;
  opts.layers = {layer};
  auto tables = OpenTables(path, opts);
  if (!tables.ok()) return tables.status();
  for (auto& t : *tables) {
    if (t->layer_id() == layer) return std::move(t);
  }
  return absl::NotFoundError(absl::StrCat("no table of layer ", layer, " in ", path));
}

// Drops every clean page of the table's files from the page cache.
inline void Evict(const Table& table) {
  for (const TableFile& f : table.files()) {
    fdatasync(f.fd);
    posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  }
}

// Reads every byte of the table's files once so they are resident.
inline void Warm(const Table& table) {
  std::vector<uint8_t> buf(1 << 20);
  for (const TableFile& f : table.files()) {
    for (uint64_t off = 0; off < f.size; off += buf.size()) {
      if (pread(f.fd, buf.data(), buf.size(), off) <= 0) break;
    }
  }
}

// Index of the first of `count` rows in `dest` (row i at dest + i * 264 unless offsets are
// given) that differs from the synthetic row, or -1 if all match.
inline int64_t FirstMismatch(uint64_t seed, const Table& table, const std::vector<uint64_t>& rows,
                             const uint8_t* dest, const std::vector<uint64_t>& offsets = {}) {
  uint8_t want[kRowBytes];
  for (size_t i = 0; i < rows.size(); ++i) {
    SyntheticRow(seed, table.layer_id(), rows[i], want);
    const uint8_t* got = dest + (offsets.empty() ? i * kRowBytes : offsets[i]);
    if (std::memcmp(want, got, kRowBytes) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace engram::testing
