// Checks of engram.h's struct-size policy (conventions 3-5) that apply to any entry point: a
// caller's struct is placed so that it ends right before an inaccessible page, so that a library
// reading or writing one byte past the caller's size crashes the test instead of passing it.
#pragma once

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "engram/engram.h"

namespace engram::testing {

// A size no struct may have: reading that many bytes would run far past any caller's struct.
inline constexpr size_t kHugeSize = size_t{1} << 40;

// Memory whose last bytes before an inaccessible page hold a caller's struct.
class GuardedStruct {
 public:
  GuardedStruct() {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    base_ = static_cast<unsigned char*>(p);
    REQUIRE(mprotect(base_ + page_, page_, PROT_NONE) == 0);
  }
  ~GuardedStruct() { munmap(base_, 2 * page_); }
  GuardedStruct(const GuardedStruct&) = delete;
  GuardedStruct& operator=(const GuardedStruct&) = delete;

  // `bytes` bytes ending at the guard page: the first `copy` from `image`, the rest `fill`; the
  // size field set to `size`.
  void* Place(size_t bytes, const void* image, size_t copy, unsigned char fill, size_t size) {
    unsigned char* at = base_ + page_ - bytes;
    memset(at, fill, bytes);
    if (image != nullptr) memcpy(at, image, copy < bytes ? copy : bytes);
    memcpy(at, &size, sizeof(size));
    return at;
  }

 private:
  size_t page_ = 0;
  unsigned char* base_ = nullptr;
};

inline bool LastErrorHas(const std::string& text) {
  return std::string(engram_last_error()).find(text) != std::string::npos;
}

// An entry point taking an input struct: call(p) runs it on the struct at p (cleaning up after
// a success) and returns its result. `image` is a valid struct of this header's size; `smaller`
// a size an older header's struct may have. The size policy's cases, the same for every input:
// an older struct, a newer one with a zero tail (served as the exact one), a newer one with a
// field set (-E2BIG naming the struct and the byte), and sizes out of bounds (-EINVAL, with
// nothing read past the size field). Returns the exact struct's result.
inline int CheckInputStruct(const char* name, const void* image, size_t our_size, size_t smaller,
                            const std::function<int(const void*)>& call) {
  GuardedStruct g;
  INFO(name);
  const int exact = call(g.Place(our_size, image, our_size, 0, our_size));
  INFO("exact size: " << exact << " " << engram_last_error());
  CHECK(exact != -E2BIG);
  // An older header's struct, at the end of the caller's memory: never refused for its size.
  engram_internal_set_last_error("");
  const int older = call(g.Place(smaller, image, smaller, 0, smaller));
  CHECK(older != -E2BIG);
  if (older < 0) CHECK_FALSE(LastErrorHas("has size"));
  // A newer header's struct with its new fields 0: served as the exact one.
  CHECK(call(g.Place(our_size + 16, image, our_size, 0, our_size + 16)) == exact);
  // ... and with one of them set.
  void* newer = g.Place(our_size + 16, image, our_size, 0, our_size + 16);
  static_cast<unsigned char*>(newer)[our_size + 5] = 1;
  CHECK(call(newer) == -E2BIG);
  CHECK(LastErrorHas(name));
  CHECK(LastErrorHas("byte " + std::to_string(our_size + 5)));
  // Sizes out of bounds: only the size field exists.
  CHECK(call(g.Place(sizeof(size_t), nullptr, 0, 0, kHugeSize)) == -EINVAL);
  CHECK(LastErrorHas(name));
  CHECK(LastErrorHas(std::to_string(kHugeSize)));
  CHECK(call(g.Place(sizeof(size_t), nullptr, 0, 0, ENGRAM_MAX_STRUCT_BYTES + 1)) == -EINVAL);
  CHECK(call(g.Place(sizeof(size_t), nullptr, 0, 0, 4)) == -EINVAL);
  return exact;
}

// An entry point filling an output struct: call(p) fills the struct at p. The struct is filled
// up to the caller's size (an older header's smaller struct: nothing written past it), zeroed
// past this library's (a newer header's), with the caller's size field left as it was; a size
// out of bounds is -EINVAL with nothing written. Returns the exact-size result's bytes.
inline std::string CheckOutputStruct(const char* name, size_t our_size, size_t smaller,
                                     const std::function<int(void*)>& call) {
  GuardedStruct g;
  INFO(name);
  auto* exact = static_cast<unsigned char*>(g.Place(our_size, nullptr, 0, 0xAB, our_size));
  REQUIRE(call(exact) == 0);
  const std::string filled(reinterpret_cast<const char*>(exact), our_size);
  auto* older = static_cast<unsigned char*>(g.Place(smaller, nullptr, 0, 0xAB, smaller));
  REQUIRE(call(older) == 0);
  size_t size;
  memcpy(&size, older, sizeof(size));
  CHECK(size == smaller);  // left as the caller set it
  CHECK(memcmp(older + sizeof(size_t), filled.data() + sizeof(size_t), smaller - sizeof(size_t)) ==
        0);
  auto* newer =
      static_cast<unsigned char*>(g.Place(our_size + 16, nullptr, 0, 0xAB, our_size + 16));
  REQUIRE(call(newer) == 0);
  memcpy(&size, newer, sizeof(size));
  CHECK(size == our_size + 16);
  CHECK(memcmp(newer + sizeof(size_t), filled.data() + sizeof(size_t), our_size - sizeof(size_t)) ==
        0);
  for (size_t i = our_size; i < our_size + 16; ++i) CHECK(newer[i] == 0);
  auto* huge = static_cast<unsigned char*>(g.Place(sizeof(size_t), nullptr, 0, 0, kHugeSize));
  CHECK(call(huge) == -EINVAL);
  CHECK(LastErrorHas(name));
  CHECK(call(g.Place(sizeof(size_t), nullptr, 0, 0, 4)) == -EINVAL);
  return filled;
}

// A *_init function: init(p, size). Fills the caller's size (zeros past this library's
// struct), sets the size field, and writes nothing for a size out of bounds. Returns the bytes
// the exact size gets.
inline std::string CheckInitStruct(const char* name, size_t our_size, size_t smaller,
                                   const std::function<void(void*, size_t)>& init) {
  GuardedStruct g;
  INFO(name);
  auto* exact = static_cast<unsigned char*>(g.Place(our_size, nullptr, 0, 0xAB, 0));
  init(exact, our_size);
  const std::string filled(reinterpret_cast<const char*>(exact), our_size);
  size_t size;
  memcpy(&size, exact, sizeof(size));
  CHECK(size == our_size);
  auto* older = static_cast<unsigned char*>(g.Place(smaller, nullptr, 0, 0xAB, 0));
  init(older, smaller);
  memcpy(&size, older, sizeof(size));
  CHECK(size == smaller);
  CHECK(memcmp(older + sizeof(size_t), filled.data() + sizeof(size_t), smaller - sizeof(size_t)) ==
        0);
  auto* newer = static_cast<unsigned char*>(g.Place(our_size + 16, nullptr, 0, 0xAB, 0));
  init(newer, our_size + 16);
  memcpy(&size, newer, sizeof(size));
  CHECK(size == our_size + 16);
  for (size_t i = our_size; i < our_size + 16; ++i) CHECK(newer[i] == 0);
  // Out of bounds: nothing written, the reason recorded.
  auto* huge = static_cast<unsigned char*>(g.Place(sizeof(size_t), nullptr, 0, 0xAB, 0xABAB));
  init(huge, kHugeSize);
  memcpy(&size, huge, sizeof(size));
  CHECK(size == 0xABAB);
  CHECK(LastErrorHas(name));
  init(nullptr, our_size);  // no crash
  return filled;
}

}  // namespace engram::testing
