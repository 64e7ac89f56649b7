// The size rules of every struct that crosses the engram C ABI (include/engram/engram.h,
// conventions 2-5), for both shared libraries: libengram_client and libengram_kernels_* read
// and fill callers' size-prefixed structs only through these functions.
//
// Header-only and plain C++17 (nvcc compiles the kernels' host code with it), with no error
// storage of its own: a refusal returns -errno and a message naming the struct and what was wrong,
// which each library records as its last error.
#pragma once

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "engram/abi.h"

namespace engram::abi {

// No struct of the ABI is, or will grow to be, larger than this (engram/abi.h). A size field
// above it is a bug (an uninitialised field, a count passed as a size) and is refused before any
// byte past the field is read: the struct the caller really has may be far smaller.
inline constexpr size_t kMaxStructBytes = ENGRAM_MAX_STRUCT_BYTES;

inline int Refuse(std::string* ret_error, int neg_errno, const char* format, ...)
    __attribute__((format(printf, 3, 4)));
inline int Refuse(std::string* ret_error, int neg_errno, const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  *ret_error = buffer;
  return neg_errno;
}

// The leading `size` field of a caller's struct.
inline size_t DeclaredSize(const void* theirs) {
  size_t size;
  memcpy(&size, theirs, sizeof(size));
  return size;
}

// Whether a size field is one this ABI can hold at all: the field itself, up to
// kMaxStructBytes. -EINVAL otherwise.
inline int CheckBounds(const char* name, size_t their_size, size_t our_size,
                       std::string* ret_error) {
  if (their_size < sizeof(size_t) || their_size > kMaxStructBytes) {
    return Refuse(ret_error, -EINVAL,
                  "struct %s has size %zu; set it to sizeof(struct %s) (%zu here; a size must lie "
                  "in [%zu, %zu])",
                  name, their_size, name, our_size, sizeof(size_t), kMaxStructBytes);
  }
  return 0;
}

// Checks an input struct of `their_size` bytes against this library's `our_size`: within
// bounds, and, when larger, zero in every byte past ours (fields of a newer header that this
// library does not know, left at their zero default). -EINVAL / -E2BIG otherwise.
inline int CheckInput(const char* name, const void* theirs, size_t their_size, size_t our_size,
                      std::string* ret_error) {
  if (int rc = CheckBounds(name, their_size, our_size, ret_error); rc < 0) return rc;
  const auto* bytes = static_cast<const unsigned char*>(theirs);
  for (size_t i = our_size; i < their_size; ++i) {
    if (bytes[i] != 0) {
      return Refuse(ret_error, -E2BIG,
                    "struct %s has size %zu, this library knows its first %zu bytes, and byte %zu "
                    "is set: the caller uses a field this library does not have (link against a "
                    "newer engram library)",
                    name, their_size, our_size, i);
    }
  }
  return 0;
}

// Reads the caller's input struct into *ours, which holds the defaults: fields past the
// caller's size keep them. ours->size becomes sizeof(T).
template <typename T>
int ReadStruct(const char* name, const void* theirs, T* ours, std::string* ret_error) {
  const size_t their_size = DeclaredSize(theirs);
  if (int rc = CheckInput(name, theirs, their_size, sizeof(T), ret_error); rc < 0) return rc;
  memcpy(static_cast<void*>(ours), theirs, std::min(their_size, sizeof(T)));
  ours->size = sizeof(T);
  return 0;
}

// Writes *ours into the caller's output struct of the size it declared: the fields that fit,
// and zeros past the end of ours. The caller's size field is left as it set it.
template <typename T>
int WriteStruct(const char* name, const T& ours, void* theirs, std::string* ret_error) {
  const size_t their_size = DeclaredSize(theirs);
  if (int rc = CheckBounds(name, their_size, sizeof(T), ret_error); rc < 0) return rc;
  auto* out = static_cast<unsigned char*>(theirs);
  const size_t n = std::min(their_size, sizeof(T));
  memcpy(out + sizeof(size_t), reinterpret_cast<const unsigned char*>(&ours) + sizeof(size_t),
         n - sizeof(size_t));
  if (their_size > sizeof(T)) memset(out + sizeof(T), 0, their_size - sizeof(T));
  return 0;
}

// Fills a caller's struct of `their_size` bytes with `defaults`: the fields that fit, zeros past
// them, and the size field set to their_size. For the *_init functions. A NULL struct or a size
// out of bounds is refused with nothing written.
template <typename T>
int InitStruct(const char* name, const T& defaults, void* theirs, size_t their_size,
               std::string* ret_error) {
  if (theirs == nullptr) return Refuse(ret_error, -EINVAL, "struct %s is NULL", name);
  if (int rc = CheckBounds(name, their_size, sizeof(T), ret_error); rc < 0) return rc;
  auto* out = static_cast<unsigned char*>(theirs);
  memcpy(out, &defaults, std::min(their_size, sizeof(T)));
  if (their_size > sizeof(T)) memset(out + sizeof(T), 0, their_size - sizeof(T));
  memcpy(out, &their_size, sizeof(their_size));
  return 0;
}

// An array of `count` size-prefixed structs: the first element's size is the stride, within
// bounds, and every element declares the same. Sets *ret_stride (0 for an empty array).
inline int CheckArray(const char* name, const void* base, size_t count, size_t our_size,
                      size_t* ret_stride, std::string* ret_error) {
  if (count == 0) {
    *ret_stride = 0;
    return 0;
  }
  const size_t stride = DeclaredSize(base);
  if (int rc = CheckBounds(name, stride, our_size, ret_error); rc < 0) return rc;
  for (size_t i = 1; i < count; ++i) {
    const size_t size = DeclaredSize(static_cast<const unsigned char*>(base) + i * stride);
    if (size != stride) {
      return Refuse(ret_error, -EINVAL,
                    "struct %s %zu of an array has size %zu, element 0 has %zu: the first "
                    "element's size is the array's stride, and every element must declare it",
                    name, i, size, stride);
    }
  }
  *ret_stride = stride;
  return 0;
}

// Element i of an array that CheckArray accepted.
inline const void* ArrayElement(const void* base, size_t stride, size_t i) {
  return static_cast<const unsigned char*>(base) + i * stride;
}
inline void* ArrayElement(void* base, size_t stride, size_t i) {
  return static_cast<unsigned char*>(base) + i * stride;
}

}  // namespace engram::abi
