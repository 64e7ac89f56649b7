// abi/sized_struct.h's struct-size rules with libengram_client's error recording: a refused
// struct's message becomes the thread's engram_last_error().
#pragma once

#include <stddef.h>

#include <string>
#include <utility>

#include "abi/sized_struct.h"
#include "client/last_error.h"

namespace engram::client {

using engram::abi::ArrayElement;
using engram::abi::DeclaredSize;

inline int Recorded(int rc, std::string* error) {
  return rc < 0 ? SetErrorMessage(rc, std::move(*error)) : rc;
}

template <typename T>
int ReadStruct(const char* name, const void* theirs, T* ours) {
  std::string error;
  return Recorded(engram::abi::ReadStruct(name, theirs, ours, &error), &error);
}

template <typename T>
int WriteStruct(const char* name, const T& ours, void* theirs) {
  std::string error;
  return Recorded(engram::abi::WriteStruct(name, ours, theirs, &error), &error);
}

template <typename T>
int InitStruct(const char* name, const T& defaults, void* theirs, size_t their_size) {
  std::string error;
  return Recorded(engram::abi::InitStruct(name, defaults, theirs, their_size, &error), &error);
}

// An output struct's size, checked before the work whose result fills it.
inline int CheckOutput(const char* name, const void* theirs, size_t our_size) {
  std::string error;
  return Recorded(engram::abi::CheckBounds(name, DeclaredSize(theirs), our_size, &error), &error);
}

inline int CheckArray(const char* name, const void* base, size_t count, size_t our_size,
                      size_t* ret_stride) {
  std::string error;
  return Recorded(engram::abi::CheckArray(name, base, count, our_size, ret_stride, &error), &error);
}

}  // namespace engram::client
