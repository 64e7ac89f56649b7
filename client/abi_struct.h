// The struct-size rules of the C ABI (include/engram/engram.h, conventions 2-4), in one place
// for every call that takes or fills a struct with a leading `size` field.
#pragma once

#include <errno.h>
#include <stddef.h>
#include <string.h>

#include <algorithm>

#include "client/last_error.h"

namespace engram::client {

// Every size-prefixed struct of the ABI begins with this field.
inline size_t DeclaredSize(const void* s) {
  size_t size;
  memcpy(&size, s, sizeof(size));
  return size;
}

// Checks a caller's struct of `their_size` bytes against this library's `our_size`: at least
// the size field itself; a larger one only when every byte past ours is zero (fields of a newer
// header this library does not know, left at their zero default). -EINVAL / -E2BIG otherwise.
inline int CheckSize(const char* name, const void* theirs, size_t their_size, size_t our_size) {
  if (their_size < sizeof(size_t)) {
    return SetError(-EINVAL, "struct %s has size %zu; set it to sizeof(struct %s) (%zu here)", name,
                    their_size, name, our_size);
  }
  if (their_size > our_size) {
    const auto* extra = static_cast<const unsigned char*>(theirs) + our_size;
    for (size_t i = 0; i < their_size - our_size; ++i) {
      if (extra[i] != 0) {
        return SetError(-E2BIG,
                        "struct %s has size %zu, this libengram_client knows %zu bytes of it, and "
                        "byte %zu is set: the caller uses a field this library does not have "
                        "(link against a newer libengram_client)",
                        name, their_size, our_size, our_size + i);
      }
    }
  }
  return 0;
}

// Reads the caller's input struct into *ours, which holds the defaults: fields past the
// caller's size keep them. ours->size becomes sizeof(T).
template <typename T>
int ReadStruct(const char* name, const void* theirs, T* ours) {
  const size_t their_size = DeclaredSize(theirs);
  if (int rc = CheckSize(name, theirs, their_size, sizeof(T)); rc < 0) return rc;
  memcpy(static_cast<void*>(ours), theirs, std::min(their_size, sizeof(T)));
  ours->size = sizeof(T);
  return 0;
}

// Writes *ours into the caller's output struct of the size it declared: the fields that fit,
// and zeros past the end of ours. The caller's size field is left as it set it.
template <typename T>
int WriteStruct(const char* name, const T& ours, void* theirs) {
  const size_t their_size = DeclaredSize(theirs);
  if (their_size < sizeof(size_t)) {
    return SetError(-EINVAL, "struct %s has size %zu; set it to sizeof(struct %s) (%zu here)", name,
                    their_size, name, sizeof(T));
  }
  auto* out = static_cast<unsigned char*>(theirs);
  const size_t n = std::min(their_size, sizeof(T));
  memcpy(out + sizeof(size_t), reinterpret_cast<const unsigned char*>(&ours) + sizeof(size_t),
         n - sizeof(size_t));
  if (their_size > sizeof(T)) memset(out + sizeof(T), 0, their_size - sizeof(T));
  return 0;
}

// Fills a caller's struct of `their_size` bytes with the defaults in `defaults`: the fields that
// fit, zeros past them, and the size field set to their_size. For *_options_init.
template <typename T>
void InitStruct(const T& defaults, void* theirs, size_t their_size) {
  if (theirs == nullptr || their_size < sizeof(size_t)) return;
  auto* out = static_cast<unsigned char*>(theirs);
  const size_t n = std::min(their_size, sizeof(T));
  memcpy(out, &defaults, n);
  if (their_size > sizeof(T)) memset(out + sizeof(T), 0, their_size - sizeof(T));
  memcpy(out, &their_size, sizeof(their_size));
}

// Element i of a caller's array of size-prefixed structs. The first element's size is the
// array's stride; every element must declare the same.
inline const void* ArrayElement(const void* base, size_t stride, size_t i) {
  return static_cast<const unsigned char*>(base) + i * stride;
}

}  // namespace engram::client
