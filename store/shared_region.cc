// SharedRegion: memfd creation with an optional hugetlb attempt, sealing and page release.
#include "store/shared_region.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/page_size.h"

namespace engram {
namespace {

struct Mapped {
  UniqueFd fd;
  uint8_t* data = nullptr;
  uint64_t size = 0;
};

// One attempt at a memfd of `bytes` with `flags`, mapped read-write. errno-style error.
int TryCreate(const std::string& name, uint64_t bytes, unsigned flags, Mapped* ret) {
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING | flags);
  if (fd < 0) return errno;
  UniqueFd owner(fd);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return errno;
  // MAP_NORESERVE is not passed: for hugetlb the mapping reserves its pages here, so a machine
  // without enough reserved huge pages fails now (ENOMEM) instead of SIGBUS on first touch.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return errno;
  ret->fd = std::move(owner);
  ret->data = static_cast<uint8_t*>(p);
  ret->size = bytes;
  return 0;
}

}  // namespace

absl::StatusOr<SharedRegion> SharedRegion::Create(const std::string& name, uint64_t bytes,
                                                  const SharedRegionOptions& options) {
  if (bytes == 0) return absl::InvalidArgumentError(absl::StrCat(name, ": empty region"));
  SharedRegion region;
  region.name_ = name;
  Mapped mapped;
  const uint64_t page = PageBytes();
  if (options.huge_pages) {
    // No size flag: the kernel's default huge page (HugePageBytes()), the size the hugetlb
    // sysctls (vm.nr_hugepages, vm.nr_overcommit_hugepages) provide.
    const uint64_t huge = HugePageBytes();
    const int err =
        huge == 0 ? ENOSYS : TryCreate(name, RoundUpTo(bytes, huge), MFD_HUGETLB, &mapped);
    if (err == 0) {
      region.huge_pages_ = true;
      region.page_bytes_ = huge;
    } else {
      region.huge_page_notice_ = absl::StrCat(
          name, ": no ", huge == 0 ? "huge" : PageSizeName(huge) + " huge", " pages for ", bytes,
          " bytes (", std::strerror(err),
          "; allow them with vm.nr_overcommit_hugepages, as the package's "
          "sysctl.d/60-engramd.conf does, or reserve them with vm.nr_hugepages); using ",
          PageSizeName(page), " pages");
    }
  }
  if (!region.huge_pages_) {
    region.page_bytes_ = page;
    int err = TryCreate(name, RoundUpTo(bytes, page), 0, &mapped);
    if (err != 0) {
      return absl::ResourceExhaustedError(absl::StrCat(name,
                                                       ": cannot create a shared memory region of ",
                                                       bytes, " bytes: ", std::strerror(err)));
    }
    // Where shmem transparent huge pages are allowed ("advise"), this gets them; harmless where
    // they are off.
    ::madvise(mapped.data, mapped.size, MADV_HUGEPAGE);
  }
  region.fd_ = std::move(mapped.fd);
  region.data_ = mapped.data;
  region.size_ = mapped.size;
  return region;
}

uint64_t SharedRegion::LargestSize(uint64_t bytes, const SharedRegionOptions& options) {
  const uint64_t huge = options.huge_pages ? HugePageBytes() : 0;
  return RoundUpTo(bytes, std::max(PageBytes(), huge));
}

absl::StatusOr<SharedRegion> SharedRegion::Adopt(const std::string& name, UniqueFd fd) {
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": the descriptor handed over is not a memfd (F_GET_SEALS: ", std::strerror(errno),
        ")"));
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": the memfd handed over is write-sealed"));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return absl::InternalError(absl::StrCat(name, ": fstat: ", std::strerror(errno)));
  }
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  // st_blksize is the page size of a hugetlbfs file, the kernel's page size for shmem.
  const bool huge = static_cast<uint64_t>(st.st_blksize) > KernelPageBytes();
  const uint64_t page = huge ? static_cast<uint64_t>(st.st_blksize) : PageBytes();
  if (bytes == 0 || bytes % page != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the memfd handed over has ", bytes,
                                                   " bytes, not a whole number of ", page,
                                                   "-byte pages"));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat(name, ": cannot map the memfd handed over: ", std::strerror(errno)));
  }
  SharedRegion region;
  region.name_ = name;
  region.fd_ = std::move(fd);
  region.data_ = static_cast<uint8_t*>(p);
  region.size_ = bytes;
  region.page_bytes_ = page;
  region.huge_pages_ = huge;
  return region;
}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept { *this = std::move(other); }

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    Unmap();
    fd_ = std::move(other.fd_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    page_bytes_ = other.page_bytes_;
    huge_pages_ = other.huge_pages_;
    sealed_ = other.sealed_;
    name_ = std::move(other.name_);
    huge_page_notice_ = std::move(other.huge_page_notice_);
  }
  return *this;
}

SharedRegion::~SharedRegion() { Unmap(); }

void SharedRegion::Unmap() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
}

absl::Status SharedRegion::Seal() {
  if (sealed_) return absl::OkStatus();
  // F_SEAL_FUTURE_WRITE (not F_SEAL_WRITE) keeps our mapping where it is, so readers holding
  // data() are never invalidated; no new writable mapping or write(2) is possible after it, and
  // our own mapping becomes read-only below.
  if (::fcntl(fd_.get(), F_ADD_SEALS,
              F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return absl::InternalError(absl::StrCat(name_, ": cannot seal: ", std::strerror(errno)));
  }
  if (::mprotect(data_, size_, PROT_READ) != 0) {
    return absl::InternalError(
        absl::StrCat(name_, ": cannot make read-only: ", std::strerror(errno)));
  }
  sealed_ = true;
  return absl::OkStatus();
}

absl::Status SharedRegion::Release(uint64_t offset, uint64_t bytes) {
  if (sealed_) return absl::FailedPreconditionError(absl::StrCat(name_, ": sealed"));
  // Whole pages only: punching part of a page zeroes those bytes and frees nothing.
  const uint64_t begin = RoundUpTo(offset, page_bytes_);
  const uint64_t end = std::min(size_, RoundDownTo(offset + bytes, page_bytes_));
  if (end <= begin) return absl::OkStatus();
  if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(begin),
                  static_cast<off_t>(end - begin)) != 0) {
    return absl::InternalError(
        absl::StrCat(name_, ": cannot release pages: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

uint64_t SharedRegion::ResidentBytes() const {
  struct stat st;
  if (::fstat(fd_.get(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

}  // namespace engram
