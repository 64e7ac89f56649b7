// Helpers for the table tests: temporary directories, whole-file I/O, and crafting broken
// safetensors shards and checkpoints byte by byte.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace engram::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/engram-table-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string LengthPrefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A safetensors file: 8-byte length, `header` verbatim, then `data_bytes` bytes of 0x11.
inline std::string Safetensors(const std::string& header, uint64_t data_bytes) {
  return LengthPrefix(header.size()) + header + std::string(data_bytes, '\x11');
}

// Rewrites the JSON header of a safetensors shard through `edit`, keeping the data bytes.
inline void EditShardHeader(const std::string& path,
                            const std::function<void(nlohmann::json&)>& edit) {
  std::string bytes = ReadFile(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  edit(header);
  WriteFile(path, LengthPrefix(header.dump().size()) + header.dump() + bytes.substr(8 + n));
}

inline void EditJsonFile(const std::string& path,
                         const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json doc = nlohmann::json::parse(ReadFile(path));
  edit(doc);
  WriteFile(path, doc.dump(2));
}

// True if files under `dir` can have holes that SEEK_HOLE reports.
inline bool SupportsHoles(const std::string& dir) {
  const std::string path = dir + "/.hole-probe";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = ::ftruncate(fd, 1 << 20) == 0 && ::pwrite(fd, "x", 1, 512 << 10) == 1 &&
            ::lseek(fd, 0, SEEK_HOLE) == 0;
  ::close(fd);
  ::unlink(path.c_str());
  return ok;
}

inline std::string StatusText(const absl::Status& s) { return s.ToString(); }

}  // namespace engram::testing
