// The tables' identity (cache_handoff.h).
#include "store/cache_handoff.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace engram {
namespace {

// FNV-1a over 64-bit words and strings: stable across builds and machines' endianness of the
// same kind, which is all a handover from one engramd to the next on one host needs.
struct Hasher {
  uint64_t h = 0xcbf29ce484222325ull;
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 0x100000001b3ull;
    }
  }
  void Word(uint64_t w) { Bytes(&w, sizeof(w)); }
  void String(const std::string& s) {
    Word(s.size());
    Bytes(s.data(), s.size());
  }
};

}  // namespace

uint64_t TablesIdentity(const std::vector<std::unique_ptr<Table>>& tables) {
  Hasher hash;
  hash.Word(tables.size());
  for (const auto& t : tables) {
    hash.Word(t->layer_id());
    hash.Word(t->num_rows());
    hash.Word(t->covered().begin);
    hash.Word(t->covered().end);
    hash.Word(static_cast<uint64_t>(t->layout()));
    for (const RowPart& p : t->parts()) {
      hash.Word(p.file);
      hash.Word(p.dest_offset);
      hash.Word(p.bytes);
      hash.Word(p.base);
      hash.Word(p.base_row);
    }
    for (const TableFile& f : t->files()) {
      hash.String(f.path);
      hash.Word(f.size);
      struct stat st {};
      if (fstat(f.fd, &st) == 0) {
        hash.Word(st.st_dev);
        hash.Word(st.st_ino);
        hash.Word(static_cast<uint64_t>(st.st_size));
        hash.Word(static_cast<uint64_t>(st.st_mtim.tv_sec));
        hash.Word(static_cast<uint64_t>(st.st_mtim.tv_nsec));
      } else {
        hash.Word(~uint64_t{0});
      }
    }
  }
  return hash.h != 0 ? hash.h : 1;
}

}  // namespace engram
