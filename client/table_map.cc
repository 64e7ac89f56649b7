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

// Rows are read at random: the copy of one waits for its first cache line. Asking for the lines
// of the row kPrefetchAhead places later while copying this one overlaps those misses (a
// 1,152-row gather took 33-36 µs instead of 82 back to back on the development VM).
constexpr uint64_t kPrefetchAhead = 8;

void PrefetchRow(const engram_table_map& map, uint64_t row) {
  const uint8_t* p = map.base + (row - map.covered_begin) * ENGRAM_ROW_BYTES;
  for (uint32_t line = 0; line < ENGRAM_ROW_BYTES; line += 64) __builtin_prefetch(p + line);
}

}  // namespace

void CopyInPlace(const InPlaceTable& table, const protocol::DecodedRequest& request,
                 uint8_t* data) {
  const engram_table_map& map = *table.map;
  uint8_t* dest = data + request.dest_offset;
  const uint64_t n = request.rows.size();
  for (uint64_t i = 0; i < n; ++i) {
    if (i + kPrefetchAhead < n) PrefetchRow(map, request.rows[i + kPrefetchAhead]);
    const uint64_t at =
        request.dest_offsets.empty() ? i * ENGRAM_ROW_BYTES : request.dest_offsets[i];
    memcpy(dest + at, map.base + (request.rows[i] - map.covered_begin) * ENGRAM_ROW_BYTES,
           ENGRAM_ROW_BYTES);
  }
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
  auto* out = static_cast<uint8_t*>(dest);
  for (uint64_t i = 0; i < num_rows; ++i) {
    if (i + engram::client::kPrefetchAhead < num_rows) {
      engram::client::PrefetchRow(*map, rows[i + engram::client::kPrefetchAhead]);
    }
    memcpy(out + i * ENGRAM_ROW_BYTES,
           map->base + (rows[i] - map->covered_begin) * ENGRAM_ROW_BYTES, ENGRAM_ROW_BYTES);
  }
  return 0;
}

void engram_unmap_table(engram_table_map* map) {
  if (map == nullptr) return;
  munmap(const_cast<uint8_t*>(map->base), map->map_bytes);
  delete map;
}

}  // extern "C"
