// How much of one batch's pages is in the page cache, measured with mincore(2) over a mapping that
// lives only for the call (the mapping never touches a page, so it faults nothing in and pins
// nothing). The benchmarks check it before every cold or half-resident case: a method that kept
// pages mapped (mmap) would otherwise leave them resident through POSIX_FADV_DONTNEED.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "tables/table.h"

namespace engram::bench {

struct BatchResidency {
  uint64_t pages = 0;     // distinct pages the batch's row parts lie on
  uint64_t resident = 0;  // of those, in the page cache
  double fraction() const { return pages == 0 ? 0.0 : double(resident) / double(pages); }
};

// Pages are counted once however many rows share them. A file that cannot be mapped counts its
// pages as resident, so a failed measurement never passes for a cold cache.
inline BatchResidency MeasureBatchResidency(const Table& table, std::span<const uint64_t> rows) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  BatchResidency out;
  for (uint32_t fi = 0; fi < table.files().size(); ++fi) {
    const TableFile& f = table.files()[fi];
    std::vector<uint64_t> pages;
    for (const RowPart& p : table.parts()) {
      if (p.file != fi) continue;
      for (uint64_t r : rows) {
        const uint64_t off = p.FileOffset(r);
        for (uint64_t pg = off / page; pg <= (off + p.bytes - 1) / page; ++pg) pages.push_back(pg);
      }
    }
    std::sort(pages.begin(), pages.end());
    pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
    out.pages += pages.size();
    if (pages.empty()) continue;
    void* map = f.size == 0 ? MAP_FAILED : mmap(nullptr, f.size, PROT_READ, MAP_SHARED, f.fd, 0);
    std::vector<unsigned char> vec((f.size + page - 1) / page);
    if (map == MAP_FAILED || mincore(map, f.size, vec.data()) != 0) {
      out.resident += pages.size();
    } else {
      for (uint64_t pg : pages) out.resident += pg < vec.size() && (vec[pg] & 1);
    }
    if (map != MAP_FAILED) munmap(map, f.size);
  }
  return out;
}

}  // namespace engram::bench
