// Engram token traces (tools/trace/engram_trace.mjs): one sequence of compressed token ids per
// document, read by every benchmark that replays real text (engram-trace-replay,
// engram-model-step), so that they accept the same files.
//   "ENGTRC01", u32 version (1), u32 documents, u32 compressed vocabulary, u32 pad id,
//   u64 tokens, then per document u32 n and n x i32 compressed ids (little-endian).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace engram::bench {

struct Trace {
  std::vector<std::vector<int32_t>> docs;
  uint32_t compressed_vocab = 0;
  uint32_t pad = 0;
};

inline absl::StatusOr<Trace> ReadTrace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  uint32_t head[4];
  uint64_t tokens = 0;
  if (!in.read(magic, 8) || std::memcmp(magic, "ENGTRC01", 8) != 0 ||
      !in.read(reinterpret_cast<char*>(head), sizeof(head)) ||
      !in.read(reinterpret_cast<char*>(&tokens), 8) || head[0] != 1) {
    return absl::InvalidArgumentError(path + ": not an Engram token trace (ENGTRC01, version 1)");
  }
  Trace t;
  t.compressed_vocab = head[2];
  t.pad = head[3];
  for (uint32_t d = 0; d < head[1]; ++d) {
    uint32_t n = 0;
    if (!in.read(reinterpret_cast<char*>(&n), 4) || n > (1u << 28)) {
      return absl::DataLossError(absl::StrCat(path, ": document ", d, " is cut short"));
    }
    std::vector<int32_t> ids(n);
    if (!in.read(reinterpret_cast<char*>(ids.data()), 4ull * n)) {
      return absl::DataLossError(absl::StrCat(path, ": document ", d, " is cut short"));
    }
    for (int32_t id : ids) {
      if (id < 0 || static_cast<uint32_t>(id) >= t.compressed_vocab) {
        return absl::DataLossError(absl::StrCat(path, ": document ", d, " holds id ", id,
                                                " outside its vocabulary of ", t.compressed_vocab));
      }
    }
    t.docs.push_back(std::move(ids));
  }
  return t;
}

}  // namespace engram::bench
