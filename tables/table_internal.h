// Helpers shared by the table format readers (table*.cc, safetensors.cc, packed_format.cc):
// an owning fd, full positioned reads, and the builder that assembles a Table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "tables/table.h"

namespace engram {

// A file opened read-only for serving: O_CLOEXEC, fstat'ed, regular, FADV_RANDOM applied.
struct OpenedFile {
  std::string path;
  UniqueFd fd;
  uint64_t size = 0;
};
absl::StatusOr<OpenedFile> OpenTableFile(const std::string& path);

// Reads exactly `len` bytes at `offset`, retrying short reads and EINTR. A read that ends
// early is DataLoss naming the file and offset.
absl::Status PreadFull(int fd, const std::string& path, void* buf, uint64_t len, uint64_t offset);

// Checks with SEEK_HOLE that [begin, end) of the file holds no hole; DataLoss naming the file
// and the first hole offset if it does.
absl::Status CheckNoHoles(int fd, const std::string& path, uint64_t begin, uint64_t end,
                          const std::string& what);

// Assembles a Table; the only code allowed to touch its private fields.
class TableBuilder {
 public:
  TableBuilder(uint32_t layer_id, uint64_t num_rows, RowRange covered, TableLayout layout,
               std::string source);
  // Takes ownership of the fd; returns the file's index for RowPart::file.
  uint32_t AddFile(OpenedFile file);
  void AddPart(const RowPart& part);
  // Validates that every covered row's every part lies inside its file, and optionally that
  // none of it is a hole, then hands the table over.
  absl::StatusOr<std::unique_ptr<Table>> Finish(bool check_holes);

 private:
  std::unique_ptr<Table> table_;
};

}  // namespace engram
