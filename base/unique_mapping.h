// UniqueMapping: the one owner of an mmap()ed region, the companion of UniqueFd.
#pragma once

#include <stddef.h>
#include <sys/mman.h>

#include <utility>

namespace engram {

// Owns one mapping; unmaps it on destruction. Move-only.
class UniqueMapping {
 public:
  UniqueMapping() = default;
  UniqueMapping(void* addr, size_t bytes) : addr_(addr), bytes_(bytes) {}
  UniqueMapping(UniqueMapping&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  UniqueMapping& operator=(UniqueMapping&& other) noexcept {
    if (this != &other) {
      Reset();
      addr_ = std::exchange(other.addr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  UniqueMapping(const UniqueMapping&) = delete;
  UniqueMapping& operator=(const UniqueMapping&) = delete;
  ~UniqueMapping() { Reset(); }

  void* get() const { return addr_; }
  size_t size() const { return bytes_; }
  bool valid() const { return addr_ != nullptr; }
  // Unmaps the region held (if any) and takes [addr, addr + bytes) instead.
  void Reset(void* addr = nullptr, size_t bytes = 0) {
    if (addr_ != nullptr) ::munmap(addr_, bytes_);
    addr_ = addr;
    bytes_ = bytes;
  }

 private:
  void* addr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace engram
