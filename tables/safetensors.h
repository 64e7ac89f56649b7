// Reading and validating safetensors headers: the 8-byte length, the JSON tensor directory and
// the byte range of every tensor, checked against each other and against the file size.
//
//   auto header = engram::ReadSafetensorsHeader(path, fd, file_size);
//   if (!header.ok()) { /* names the file, the tensor and the problem */ }
//   const engram::SafetensorsTensor* t = header->Find("layers.1.engram.embed.weight");
//   uint64_t file_offset = header->data_start + t->begin;
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace engram {

// Largest JSON header accepted. The safetensors reference implementation refuses headers over
// 100 MB; a length beyond that is corruption, and refusing it before allocating keeps a
// damaged file from costing gigabytes of memory.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as written: "F8_E4M3", "F8_E8M0", "BF16", ...
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the end of the JSON header
  uint64_t end = 0;
  uint64_t bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::string path;
  uint64_t header_bytes = 0;  // the JSON length, as the first 8 bytes say
  uint64_t data_start = 0;    // 8 + header_bytes: file offset of data offset 0
  uint64_t file_size = 0;
  std::map<std::string, SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;

  const SafetensorsTensor* Find(const std::string& name) const;
  // Bytes the header says the file must hold: data_start + the largest end offset.
  uint64_t RequiredFileSize() const;
};

// Element size of a safetensors dtype name, or 0 if the name is unknown.
uint32_t SafetensorsDtypeBytes(const std::string& dtype);

struct SafetensorsReadOptions {
  // Refuse tensors whose bytes lie beyond the end of the file. A per-rank copy written sparse at
  // the original offsets may legitimately end early; its caller checks the rows it serves.
  bool require_complete_file = true;
};

// Reads and validates the header of the safetensors file open at `fd` (`file_size` bytes).
// Refuses: a file shorter than 8 bytes (DataLoss), a header length that is zero, absurd or past
// the end of the file (DataLoss), JSON that does not parse or is not an object of tensor
// entries (DataLoss), a shape whose size disagrees with data_offsets (DataLoss), offsets that
// are reversed, overlap another tensor or lie outside the file (DataLoss).
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path, int fd,
                                                        uint64_t file_size,
                                                        const SafetensorsReadOptions& options = {});

}  // namespace engram
