// The kernel library's error reporting, shared by its translation units. Failures are recorded
// where engram_last_error() finds them, through libengram_client's engram_internal_set_last_error
// (engram/engram.h): the library keeps no message of its own.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <string>

#include "abi/sized_struct.h"
#include "kernels/gpu_compat.h"

namespace engram::kernels {

// Records the message for the calling thread and returns -err.
int Fail(int err, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Fail() for a runtime call that returned `status`: -ENODEV (no device or driver), -ENOTSUP,
// or -EIO, with the call and the runtime's error named.
int FailRuntime(const char* call, gpuError_t status);

// abi/sized_struct.h's rules for a struct the entry point `fn` takes; a refusal is recorded as
// "fn: message".
template <typename T>
int ReadStruct(const char* fn, const char* name, const void* theirs, T* ours) {
  std::string error;
  const int rc = engram::abi::ReadStruct(name, theirs, ours, &error);
  return rc < 0 ? Fail(-rc, "%s: %s", fn, error.c_str()) : 0;
}

template <typename T>
void InitStruct(const char* fn, const char* name, const T& defaults, void* theirs, size_t size) {
  std::string error;
  if (engram::abi::InitStruct(name, defaults, theirs, size, &error) < 0) {
    Fail(EINVAL, "%s: %s", fn, error.c_str());
  }
}

// An array of n size-prefixed structs (the first one's size is the stride), read into ours[0..n).
template <typename T>
int ReadArray(const char* fn, const char* name, const void* theirs, uint32_t n, T* ours) {
  std::string error;
  size_t stride = 0;
  if (int rc = engram::abi::CheckArray(name, theirs, n, sizeof(T), &stride, &error); rc < 0) {
    return Fail(-rc, "%s: %s", fn, error.c_str());
  }
  for (uint32_t i = 0; i < n; ++i) {
    ours[i] = T{};
    if (int rc = ReadStruct(fn, name, engram::abi::ArrayElement(theirs, stride, i), &ours[i]);
        rc < 0) {
      return rc;
    }
  }
  return 0;
}

}  // namespace engram::kernels
