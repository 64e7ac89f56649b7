// Resident tables mapped read-only in the client: the mapping, its checks and a CPU gather.
#include "client/table_map.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <new>

#include "client/last_error.h"
#include "protocol/prefetch.h"

namespace engram::client {

int MapSealedTable(int fd, uint32_t layer, uint32_t row_bytes, uint64_t covered_begin,
                   uint64_t covered_end, uint64_t map_bytes, engram_table_map** ret_map) {
  // The memfd must be immutable for as long as we read it: the daemon (or anything holding the
  // fd) must not be able to write, shrink or grow it, or add or remove seals.
  const int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  const int seals = fcntl(fd, F_GET_SEALS);
  struct stat st;
  const bool sized = fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == map_bytes;
  const uint64_t rows = covered_end - covered_begin;
  if (seals < 0 || (seals & want) != want || (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) == 0 ||
      !sized || row_bytes != ENGRAM_ROW_BYTES || covered_end < covered_begin ||
      rows > map_bytes / row_bytes) {
    close(fd);
    return SetError(-EPROTO,
                    "engramd sent layer %u's table as a memfd that is not sealed or not the size "
                    "it claims (seals 0x%x, %llu bytes for rows [%llu, %llu))",
                    layer, seals, static_cast<unsigned long long>(map_bytes),
                    static_cast<unsigned long long>(covered_begin),
                    static_cast<unsigned long long>(covered_end));
  }
  void* p = mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) {
    return SetError(-err, "cannot map layer %u's table (%llu bytes): %s", layer,
                    static_cast<unsigned long long>(map_bytes), strerror(err));
  }
  // Fill the page tables now: rows are read at random, so without this nearly every row read
  // in the first steps takes a page fault (a 1,152-row gather's p99 went from 0.2 to 1-1.8 ms
  // on the H200 host). It costs a few ms per GiB with 4 KiB pages, far less with 2 MiB pages;
  // kernels before 5.14 refuse the advice and the rows fault in as they are read.
  constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ
  madvise(p, map_bytes, kPopulateRead);
  auto* map = new (std::nothrow) engram_table_map;
  if (map == nullptr) {
    munmap(p, map_bytes);
    return SetError(-ENOMEM, "out of memory");
  }
  map->base = static_cast<const uint8_t*>(p);
  map->map_bytes = map_bytes;
  map->layer_id = layer;
  map->row_bytes = row_bytes;
  map->covered_begin = covered_begin;
  map->covered_end = covered_end;
  *ret_map = map;
  return 0;
}

namespace {

// Copies rows[0..n) of the mapped table (checked to lie in its covered range) to dest, row i at
// dest + dest_offsets[i], or at dest + i * 264 where dest_offsets is null.
void CopyRows(const engram_table_map& map, const uint64_t* rows, uint64_t n, uint8_t* dest,
              const uint64_t* dest_offsets) {
  const auto row = [&](uint64_t id) {
    return map.base + (id - map.covered_begin) * ENGRAM_ROW_BYTES;
  };
  for (uint64_t i = 0; i < n; ++i) {
    if (i + kPrefetchRowsAhead < n) {
      PrefetchLines(row(rows[i + kPrefetchRowsAhead]), ENGRAM_ROW_BYTES);
    }
    const uint64_t at = dest_offsets != nullptr ? dest_offsets[i] : i * ENGRAM_ROW_BYTES;
    memcpy(dest + at, row(rows[i]), ENGRAM_ROW_BYTES);
  }
}

}  // namespace

void CopyInPlace(const InPlaceTable& table, const protocol::DecodedRequest& request,
                 uint8_t* data) {
  CopyRows(*table.map, request.rows.data(), request.rows.size(), data + request.dest_offset,
           request.dest_offsets.empty() ? nullptr : request.dest_offsets.data());
}

}  // namespace engram::client

using engram::client::SetError;

extern "C" {

int engram_get_table_map_info(const engram_table_map* map, struct engram_table_map_info* ret_info) {
  if (map == nullptr || ret_info == nullptr) {
    return SetError(-EINVAL, "engram_get_table_map_info needs a map and ret_info");
  }
  const size_t size = ret_info->size;
  if (size < offsetof(struct engram_table_map_info, map_bytes) + sizeof(uint64_t) ||
      size > sizeof(struct engram_table_map_info)) {
    return SetError(-EINVAL, "engram_table_map_info.size is %zu; set it to sizeof (%zu)", size,
                    sizeof(struct engram_table_map_info));
  }
  struct engram_table_map_info out {};
  out.size = size;
  out.layer_id = map->layer_id;
  out.row_bytes = map->row_bytes;
  out.covered_begin = map->covered_begin;
  out.covered_end = map->covered_end;
  out.base = map->base;
  out.map_bytes = map->map_bytes;
  memcpy(ret_info, &out, size);
  return 0;
}

int engram_table_map_gather(const engram_table_map* map, const uint64_t* rows, uint64_t num_rows,
                            void* dest) {
  if (map == nullptr || (num_rows != 0 && (rows == nullptr || dest == nullptr))) {
    return SetError(-EINVAL, "engram_table_map_gather needs a map, rows and dest");
  }
  // Every row is checked before any is copied, so a refused call leaves dest untouched.
  for (uint64_t i = 0; i < num_rows; ++i) {
    if (rows[i] < map->covered_begin || rows[i] >= map->covered_end) {
      return SetError(-ERANGE, "row %llu (index %llu) is outside the rows [%llu, %llu) of layer %u",
                      static_cast<unsigned long long>(rows[i]), static_cast<unsigned long long>(i),
                      static_cast<unsigned long long>(map->covered_begin),
                      static_cast<unsigned long long>(map->covered_end), map->layer_id);
    }
  }
  engram::client::CopyRows(*map, rows, num_rows, static_cast<uint8_t*>(dest), nullptr);
  return 0;
}

void engram_unmap_table(engram_table_map* map) {
  if (map == nullptr) return;
  munmap(const_cast<uint8_t*>(map->base), map->map_bytes);
  delete map;
}

}  // extern "C"
