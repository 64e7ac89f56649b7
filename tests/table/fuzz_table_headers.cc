// libFuzzer target: arbitrary bytes as a safetensors shard and as a packed table file. The
// readers must refuse or accept them without crashing, overreading or allocating absurdly, and
// whatever they accept must keep every covered row inside the file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tables/packed_format.h"
#include "tables/safetensors.h"
#include "tables/table.h"

namespace {

void CheckFile(const uint8_t* data, size_t size) {
  int fd = ::memfd_create("fuzz-table", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  if (size > 0 && ::write(fd, data, size) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  auto header = engram::ReadSafetensorsHeader(path, fd, size);
  if (header.ok()) {
    if (header->data_start > size) std::abort();
    for (const auto& [name, t] : header->tensors) {
      if (t.begin > t.end || header->data_start + t.end > size) std::abort();
    }
  }

  auto table = engram::OpenPacked(path, {});
  if (table.ok()) {
    const engram::Table& t = **table;
    const engram::RowPart& p = t.parts()[0];
    if (p.FileOffset(t.covered().end - 1) + p.bytes > size) std::abort();
    uint8_t row[engram::kRowBytes];
    if (!engram::ReadRowBlocking(t, t.covered().begin, row).ok()) std::abort();
    if (t.CheckRow(t.covered().end).ok()) std::abort();
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CheckFile(data, size);
  // The checksum stops almost every mutation of a packed header at the first check; resealing
  // a copy lets the fuzzer reach the geometry checks behind it.
  if (size >= sizeof(engram::PackedHeader) && size <= (1u << 20)) {
    std::string copy(reinterpret_cast<const char*>(data), size);
    engram::PackedHeader h;
    std::memcpy(&h, copy.data(), sizeof(h));
    engram::SealPackedHeader(&h);
    std::memcpy(copy.data(), &h, sizeof(h));
    CheckFile(reinterpret_cast<const uint8_t*>(copy.data()), copy.size());
  }
  return 0;
}
