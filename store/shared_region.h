// SharedRegion: one memfd and its mapping, owned together. The row store keeps every byte it
// holds in such regions so that the memory is the daemon's, counted against its budget, and can
// be passed to other processes (SCM_RIGHTS) and sealed.
//
//   auto region = engram::SharedRegion::Create("engram-resident-14", bytes, {.huge_pages = true});
//   if (!region.ok()) { /* ResourceExhausted / Internal naming the region */ }
//   uint8_t* p = region->data();   // read-write until Seal()
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"

namespace engram {

struct SharedRegionOptions {
  // Try MFD_HUGETLB (the kernel's default huge page, HugePageBytes(): 2 MiB on x86-64, 512 MiB
  // on a 64 KiB-page arm64 kernel; reserved in vm.nr_hugepages, or surplus ones up to
  // vm.nr_overcommit_hugepages) first; fall back to normal pages (with a notice in
  // huge_page_notice()) when there are none to have or the kernel refuses.
  bool huge_pages = false;
};

class SharedRegion {
 public:
  // Creates a memfd of at least `bytes` (rounded up to the page size in use: the huge page, or
  // PageBytes()) and maps it
  // read-write, shared. The pages are allocated on first write. ResourceExhausted when the
  // kernel refuses the memory, naming `name`.
  static absl::StatusOr<SharedRegion> Create(const std::string& name, uint64_t bytes,
                                             const SharedRegionOptions& options);
  // Maps an existing memfd read-write, shared, whole (its size from fstat): a region another
  // process (an earlier engramd) created and handed over. InvalidArgument naming `name` when the
  // fd is not a memfd (no seals to read), is write-sealed, is empty, or its size is not a
  // multiple of its page size; Internal when the mapping fails.
  static absl::StatusOr<SharedRegion> Adopt(const std::string& name, UniqueFd fd);

  // The most bytes Create(_, bytes, options) can map: `bytes` rounded up to the largest page it
  // may use. What a budget reserves before the region exists.
  static uint64_t LargestSize(uint64_t bytes, const SharedRegionOptions& options);

  SharedRegion() = default;
  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  uint8_t* data() const { return data_; }
  // Bytes mapped (the requested size rounded up to page_bytes()).
  uint64_t size() const { return size_; }
  uint64_t page_bytes() const { return page_bytes_; }
  bool huge_pages() const { return huge_pages_; }
  // Why huge pages were asked for and not used; empty when they were used or not asked for.
  const std::string& huge_page_notice() const { return huge_page_notice_; }
  int fd() const { return fd_.get(); }
  bool sealed() const { return sealed_; }

  // Makes the contents immutable for every holder of the fd: adds F_SEAL_FUTURE_WRITE |
  // F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL and makes our mapping read-only. data() stays.
  absl::Status Seal();

  // Gives the pages of [offset, offset + bytes) back to the kernel (they read as zeros after);
  // the range is narrowed inwards to whole pages of page_bytes(), so bytes outside it never
  // change. Only before Seal().
  absl::Status Release(uint64_t offset, uint64_t bytes);

  // Bytes of the region that currently hold pages (from fstat's st_blocks).
  uint64_t ResidentBytes() const;

 private:
  void Unmap();

  UniqueFd fd_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t page_bytes_ = 0;  // set by Create and Adopt
  bool huge_pages_ = false;
  bool sealed_ = false;
  std::string name_;
  std::string huge_page_notice_;
};

}  // namespace engram
