// The kernel's page size and huge page size, each asked once, and the one alignment that is not
// a page: the O_DIRECT unit. Every page-granular decision (rounding a mapping, giving memory
// back, grouping reads by page, charging a budget) asks PageBytes(); nothing writes 4096 for it.
//
//   const uint64_t page = engram::PageBytes();           // 4 KiB, 16 KiB or 64 KiB
//   const uint64_t end = engram::RoundDownTo(offset + bytes, page);
//   engram::TestPageGranule granule(64 << 10);            // tests: decide as if pages were 64 KiB
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace engram {

// The O_DIRECT unit: offsets, lengths and buffers of direct reads are multiples of it. It covers
// the logical block sizes in use (512 B and 4 KiB) and is a property of the device, not of the
// kernel's pages: a direct read of one row fetches its 4 KiB-aligned block on any kernel, never
// a whole 64 KiB page.
inline constexpr uint64_t kDirectIoAlignBytes = 4096;

// The kernel's page size (sysconf(_SC_PAGESIZE)), read once. Only for interfaces that count in
// the kernel's own pages (mincore's vector, cachestat, /proc's page counts); everything that
// decides by page asks PageBytes().
uint64_t KernelPageBytes();

// The page granule every page-granular decision uses: KernelPageBytes(), or the granule of a
// live TestPageGranule. Thread-safe.
uint64_t PageBytes();

// The kernel's default huge page size (/proc/meminfo "Hugepagesize"), read once: 2 MiB on x86-64
// and on arm64 with 4 KiB pages, 32 MiB with 16 KiB pages, 512 MiB with 64 KiB pages. 0 when the
// kernel has no hugetlb support. MFD_HUGETLB with no size flag gets pages of this size.
uint64_t HugePageBytes();

// The "Hugepagesize:" line of /proc/meminfo text, in bytes; 0 when absent or malformed.
uint64_t ParseHugepagesize(std::string_view meminfo);

// "4 KiB", "64 KiB", "2 MiB", "512 MiB": a page size as messages and the CLI say it.
std::string PageSizeName(uint64_t bytes);

inline constexpr uint64_t RoundUpTo(uint64_t n, uint64_t unit) {
  return (n + unit - 1) / unit * unit;
}
inline constexpr uint64_t RoundDownTo(uint64_t n, uint64_t unit) { return n / unit * unit; }

// For tests: while one lives, PageBytes() answers `granule_bytes` instead of the kernel's size,
// so that code written for 4 KiB pages fails on a 4 KiB kernel the way it would on a 16 or 64 KiB
// one. The granule must be a power of two and a multiple of KernelPageBytes() (so every range the
// code gives back is still whole kernel pages); anything else aborts. One at a time, not nested.
class TestPageGranule {
 public:
  explicit TestPageGranule(uint64_t granule_bytes);
  ~TestPageGranule();
  TestPageGranule(const TestPageGranule&) = delete;
  TestPageGranule& operator=(const TestPageGranule&) = delete;
};

}  // namespace engram
