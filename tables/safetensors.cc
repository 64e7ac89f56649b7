// safetensors header parsing and validation (see safetensors.h and docs/table_format.md).
#include "tables/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "tables/table_internal.h"

namespace engram {
namespace {

using json = nlohmann::json;

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

absl::Status ParseTensor(const std::string& path, const std::string& name, const json& entry,
                         SafetensorsTensor* ret) {
  const std::string where = absl::StrCat("tensor '", name, "'");
  if (!entry.is_object()) return Corrupt(path, absl::StrCat(where, " is not a JSON object"));
  auto dtype = entry.find("dtype");
  auto shape = entry.find("shape");
  auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || !dtype->is_string()) {
    return Corrupt(path, absl::StrCat(where, " has no string 'dtype'"));
  }
  if (shape == entry.end() || !shape->is_array()) {
    return Corrupt(path, absl::StrCat(where, " has no 'shape' array"));
  }
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return Corrupt(path, absl::StrCat(where, " has no 'data_offsets' pair of unsigned integers"));
  }
  ret->name = name;
  ret->dtype = dtype->get<std::string>();
  uint64_t elements = 1;
  bool overflow = false;
  for (const json& dim : *shape) {
    if (!dim.is_number_unsigned()) {
      return Corrupt(
          path,
          absl::StrCat(where, " has a shape entry that is not an unsigned integer: ", dim.dump()));
    }
    uint64_t d = dim.get<uint64_t>();
    ret->shape.push_back(d);
    overflow |= __builtin_mul_overflow(elements, d, &elements);
  }
  ret->begin = (*offsets)[0].get<uint64_t>();
  ret->end = (*offsets)[1].get<uint64_t>();
  if (ret->end < ret->begin) {
    return Corrupt(
        path, absl::StrCat(where, " has reversed data_offsets [", ret->begin, ", ", ret->end, "]"));
  }
  const uint32_t element_bytes = SafetensorsDtypeBytes(ret->dtype);
  if (element_bytes != 0) {
    uint64_t bytes = 0;
    overflow |= __builtin_mul_overflow(elements, uint64_t{element_bytes}, &bytes);
    if (overflow || bytes != ret->bytes()) {
      return Corrupt(
          path, absl::StrCat(where, " (", ret->dtype, " [", absl::StrJoin(ret->shape, ", "),
                             "]) needs ", overflow ? "more than 2^64" : absl::StrCat(bytes),
                             " bytes but data_offsets [", ret->begin, ", ", ret->end, ") span ",
                             ret->bytes()));
    }
  }
  return absl::OkStatus();
}

// The 8-byte little-endian header length at the start of the file, checked against the limit
// and the file's size.
absl::StatusOr<uint64_t> ReadHeaderLength(const std::string& path, int fd, uint64_t file_size) {
  if (file_size < 8) {
    return Corrupt(path,
                   absl::StrCat("file is ", file_size,
                                " bytes, too short for the 8-byte safetensors header length"));
  }
  uint8_t length_bytes[8];
  if (absl::Status s = PreadFull(fd, path, length_bytes, 8, 0); !s.ok()) return s;
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | length_bytes[i];  // little-endian
  if (length == 0) return Corrupt(path, "safetensors header length is 0");
  if (length > kMaxSafetensorsHeaderBytes) {
    return Corrupt(path, absl::StrCat("safetensors header length ", length, " exceeds the ",
                                      kMaxSafetensorsHeaderBytes, "-byte limit (corrupt length?)"));
  }
  if (length > file_size - 8) {
    return Corrupt(path,
                   absl::StrCat("safetensors header length ", length, " runs past the end of the ",
                                file_size, "-byte file (truncated?)"));
  }
  return length;
}

// Fills header's metadata and tensors from the header's JSON text.
absl::Status ParseHeaderJson(const std::string& path, const std::string& text,
                             SafetensorsHeader& header) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return Corrupt(path,
                   absl::StrCat("safetensors header (", text.size(), " bytes) is not valid JSON"));
  }
  if (!doc.is_object()) return Corrupt(path, "safetensors header is not a JSON object");

  for (const auto& [name, entry] : doc.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Corrupt(path, "'__metadata__' is not a JSON object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return Corrupt(path, absl::StrCat("'__metadata__' entry '", key, "' is not a string"));
        }
        header.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    SafetensorsTensor tensor;
    if (absl::Status s = ParseTensor(path, name, entry, &tensor); !s.ok()) return s;
    header.tensors.emplace(name, std::move(tensor));
  }
  return absl::OkStatus();
}

// Sorts by start and compares neighbours; empty tensors cannot overlap anything.
absl::Status CheckNoOverlaps(const SafetensorsHeader& header) {
  std::vector<const SafetensorsTensor*> by_offset;
  for (const auto& [name, t] : header.tensors) {
    if (t.bytes() > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return Corrupt(
          header.path,
          absl::StrCat("tensor '", by_offset[i]->name, "' data_offsets [", by_offset[i]->begin,
                       ", ", by_offset[i]->end, ") overlap tensor '", by_offset[i - 1]->name, "' [",
                       by_offset[i - 1]->begin, ", ", by_offset[i - 1]->end, ")"));
    }
  }
  return absl::OkStatus();
}

// Every tensor's end fits a file offset and, if the options ask, lies inside the file.
absl::Status CheckInsideFile(const SafetensorsHeader& header,
                             const SafetensorsReadOptions& options) {
  const std::string& path = header.path;
  const uint64_t file_size = header.file_size;
  const uint64_t data_bytes = file_size - header.data_start;
  for (const auto& [name, t] : header.tensors) {
    if (t.end > std::numeric_limits<uint64_t>::max() - header.data_start) {
      return Corrupt(path, absl::StrCat("tensor '", name, "' data_offsets end ", t.end,
                                        " overflows a 64-bit file offset"));
    }
    if (options.require_complete_file && t.end > data_bytes) {
      return Corrupt(path, absl::StrCat("tensor '", name, "' data_offsets [", t.begin, ", ", t.end,
                                        ") lie outside the file: it holds ", data_bytes,
                                        " data bytes after the header, the header says at least ",
                                        t.end, " (file is ", file_size, " bytes, needs ",
                                        header.data_start + t.end, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint32_t SafetensorsDtypeBytes(const std::string& dtype) {
  static const std::pair<const char*, uint32_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},     {"C64", 8},
  };
  for (const auto& [name, bytes] : kSizes) {
    if (dtype == name) return bytes;
  }
  return 0;
}

const SafetensorsTensor* SafetensorsHeader::Find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

uint64_t SafetensorsHeader::RequiredFileSize() const {
  uint64_t end = 0;
  for (const auto& [name, t] : tensors) end = std::max(end, t.end);
  return data_start + end;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path, int fd,
                                                        uint64_t file_size,
                                                        const SafetensorsReadOptions& options) {
  SafetensorsHeader header;
  header.path = path;
  header.file_size = file_size;
  absl::StatusOr<uint64_t> length = ReadHeaderLength(path, fd, file_size);
  if (!length.ok()) return length.status();
  header.header_bytes = *length;
  header.data_start = 8 + *length;

  std::string text(*length, '\0');
  if (absl::Status s = PreadFull(fd, path, text.data(), *length, 8); !s.ok()) return s;
  if (absl::Status s = ParseHeaderJson(path, text, header); !s.ok()) return s;
  if (absl::Status s = CheckNoOverlaps(header); !s.ok()) return s;
  if (absl::Status s = CheckInsideFile(header, options); !s.ok()) return s;
  return header;
}

}  // namespace engram
