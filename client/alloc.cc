// The session's data region and its allocator (engram_alloc / engram_free): where requests, row
// ids and gathered rows lie, since the daemon reads and writes only there.
#include <errno.h>

#include <cstdint>
#include <iterator>
#include <mutex>

#include "client/last_error.h"
#include "client/session.h"
#include "engram/engram.h"
#include "engram/protocol.h"

using engram::client::InData;
using engram::client::SetError;

extern "C" {

int engram_data_region(engram_session* s, void** ret_base, uint64_t* ret_bytes) {
  if (s == nullptr || ret_base == nullptr || ret_bytes == nullptr) {
    return SetError(-EINVAL, "NULL argument to engram_data_region");
  }
  *ret_base = s->data;
  *ret_bytes = s->data_bytes;
  return 0;
}

int engram_arena(engram_session* s, void** ret_base, uint64_t* ret_bytes) {
  if (s == nullptr || ret_base == nullptr || ret_bytes == nullptr) {
    return SetError(-EINVAL, "NULL argument to engram_arena");
  }
  *ret_base = s->arena;
  *ret_bytes = s->arena_bytes;
  return 0;
}

int engram_alloc(engram_session* s, uint64_t bytes, void** ret_ptr) {
  if (s == nullptr || ret_ptr == nullptr || bytes == 0) {
    return SetError(-EINVAL, "engram_alloc needs a session, a size above 0 and ret_ptr");
  }
  if (bytes > s->data_bytes) {
    return SetError(-ENOSPC, "%llu bytes asked from a %llu-byte data region",
                    static_cast<unsigned long long>(bytes),
                    static_cast<unsigned long long>(s->data_bytes));
  }
  const uint64_t size = (bytes + ENGRAM_ARENA_ALIGN - 1) / ENGRAM_ARENA_ALIGN * ENGRAM_ARENA_ALIGN;
  std::lock_guard<std::mutex> lock(s->alloc_mutex);
  for (auto it = s->free_ranges.begin(); it != s->free_ranges.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t offset = it->first;
    const uint64_t left = it->second - size;
    s->free_ranges.erase(it);
    if (left != 0) s->free_ranges[offset + size] = left;
    s->allocations[offset] = size;
    *ret_ptr = s->data + offset;
    return 0;
  }
  uint64_t largest = 0;
  for (const auto& [offset, free] : s->free_ranges) largest = free > largest ? free : largest;
  return SetError(-ENOSPC,
                  "no free range of %llu bytes in the %llu-byte data region (largest free: %llu); "
                  "free buffers or connect with a larger data_bytes",
                  static_cast<unsigned long long>(size),
                  static_cast<unsigned long long>(s->data_bytes),
                  static_cast<unsigned long long>(largest));
}

int engram_free(engram_session* s, void* ptr) {
  if (s == nullptr) return SetError(-EINVAL, "NULL session");
  uint64_t offset;
  if (!InData(s, ptr, 0, &offset)) {
    return SetError(-EINVAL, "%p is not in this session's data region", ptr);
  }
  std::lock_guard<std::mutex> lock(s->alloc_mutex);
  auto it = s->allocations.find(offset);
  if (it == s->allocations.end()) {
    return SetError(-EINVAL, "%p is not an allocation of this session", ptr);
  }
  uint64_t begin = offset;
  uint64_t size = it->second;
  s->allocations.erase(it);
  auto next = s->free_ranges.lower_bound(begin);
  if (next != s->free_ranges.end() && next->first == begin + size) {
    size += next->second;
    next = s->free_ranges.erase(next);
  }
  if (next != s->free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      size += prev->second;
      s->free_ranges.erase(prev);
    }
  }
  s->free_ranges[begin] = size;
  return 0;
}

}  // extern "C"
