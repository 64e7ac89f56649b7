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

#include "client/abi_struct.h"
#include "client/last_error.h"
#include "protocol/prefetch.h"
#include "protocol/unique_fd.h"

namespace engram::client {

namespace {

// The memfd must be immutable for as long as we read it: the daemon (or anything holding the
// fd) must not be able to write it through a new mapping, shrink or grow it, or change seals.
bool Sealed(int fd, uint64_t bytes, int* ret_seals) {
  const int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  const int seals = fcntl(fd, F_GET_SEALS);
  *ret_seals = seals;
  struct stat st;
  return seals >= 0 && (seals & want) == want &&
         (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0 && fstat(fd, &st) == 0 &&
         static_cast<uint64_t>(st.st_size) == bytes;
}

// Maps the table state page read-only after checking it; *ret_page and *ret_bytes, or -errno.
int MapStatePage(int fd, const MappedTable& t, const engram_table_state_page** ret_page,
                 uint64_t* ret_bytes) {
  struct stat st;
  int seals = 0;
  const uint64_t bytes = fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  if (bytes < sizeof(engram_table_state_page) || !Sealed(fd, bytes, &seals)) {
    return SetError(-EPROTO,
                    "engramd sent layer %u's table state page as a memfd that is not sealed or "
                    "too small (seals 0x%x, %llu bytes)",
                    t.layer, seals, static_cast<unsigned long long>(bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return SetError(-err, "cannot map engramd's table state page: %s", strerror(err));
  }
  const auto* page = static_cast<const engram_table_state_page*>(p);
  const uint64_t entries_end =
      uint64_t{page->header_bytes} + uint64_t{page->entries} * sizeof(engram_table_state_entry);
  const auto* entry = reinterpret_cast<const engram_table_state_entry*>(
      static_cast<const uint8_t*>(p) + page->header_bytes);
  if (page->magic != ENGRAM_TABLE_STATE_MAGIC || page->version_major != ENGRAM_PROTOCOL_MAJOR ||
      page->header_bytes != sizeof(engram_table_state_page) || page->page_bytes != bytes ||
      entries_end > bytes || t.state_index >= page->entries ||
      entry[t.state_index].layer_id != t.layer) {
    munmap(p, bytes);
    return SetError(-EPROTO,
                    "engramd's table state page does not describe layer %u at entry %u (magic "
                    "0x%x, %u entries)",
                    t.layer, t.state_index, page->magic, page->entries);
  }
  *ret_page = page;
  *ret_bytes = bytes;
  return 0;
}

}  // namespace

int MapSealedTable(int fd, int state_fd, const MappedTable& t, engram_table_map** ret_map) {
  UniqueFd table_fd(fd), page_fd(state_fd);  // the mappings keep the memory
  const uint64_t rows = t.covered_end - t.covered_begin;
  int seals = 0;
  if (!Sealed(fd, t.map_bytes, &seals) || t.row_bytes != ENGRAM_ROW_BYTES ||
      t.covered_end < t.covered_begin || rows > t.map_bytes / t.row_bytes) {
    return SetError(-EPROTO,
                    "engramd sent layer %u's table as a memfd that is not sealed or not the size "
                    "it claims (seals 0x%x, %llu bytes for rows [%llu, %llu))",
                    t.layer, seals, static_cast<unsigned long long>(t.map_bytes),
                    static_cast<unsigned long long>(t.covered_begin),
                    static_cast<unsigned long long>(t.covered_end));
  }
  const engram_table_state_page* page = nullptr;
  uint64_t page_bytes = 0;
  if (int rc = MapStatePage(state_fd, t, &page, &page_bytes); rc < 0) return rc;
  void* p = mmap(nullptr, t.map_bytes, PROT_READ, MAP_SHARED, fd, 0);
  auto* map = p != MAP_FAILED ? new (std::nothrow) engram_table_map : nullptr;
  if (map == nullptr) {
    const int err = p == MAP_FAILED ? errno : ENOMEM;
    if (p != MAP_FAILED) munmap(p, t.map_bytes);
    munmap(const_cast<engram_table_state_page*>(page), page_bytes);
    return SetError(-err, "cannot map layer %u's table (%llu bytes): %s", t.layer,
                    static_cast<unsigned long long>(t.map_bytes), strerror(err));
  }
  // Fill the page tables now: rows are read at random, so without this nearly every row read
  // in the first steps takes a page fault (a 1,152-row gather's p99 went from 0.2 to 1-1.8 ms
  // on the H200 host). It costs a few ms per GiB with 4 KiB pages, far less with 2 MiB pages;
  // kernels before 5.14 refuse the advice and the rows fault in as they are read.
  constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ
  madvise(p, t.map_bytes, kPopulateRead);
  // The map owns both mappings from here (engram_table_map_close).
  map->base = static_cast<const uint8_t*>(p);
  map->map_bytes = t.map_bytes;
  map->layer_id = t.layer;
  map->row_bytes = t.row_bytes;
  map->covered_begin = t.covered_begin;
  map->covered_end = t.covered_end;
  map->state_page = page;
  map->state_bytes = page_bytes;
  const auto* entries = reinterpret_cast<const engram_table_state_entry*>(
      reinterpret_cast<const uint8_t*>(map->state_page) + map->state_page->header_bytes);
  map->table_state = &entries[t.state_index].state;
  *ret_map = map;
  return 0;
}

int MapError(const engram_table_map& map) {
  if (MapUsable(map)) return 0;
  const uint32_t alive = std::atomic_ref<uint32_t>(
      const_cast<uint32_t&>(map.state_page->daemon_alive)).load(std::memory_order_acquire);
  if ((alive & ENGRAM_DAEMON_TID_MASK) == 0 || (alive & ENGRAM_DAEMON_OWNER_DIED) != 0) {
    return SetError(-ENOTCONN,
                    "engramd, which served layer %u's resident table, is gone (it stopped or "
                    "died): its rows are not read in place any more; map the table again from a "
                    "new session",
                    map.layer_id);
  }
  return SetError(-ESTALE,
                  "engramd withdrew layer %u's resident table (a file it was loaded from "
                  "changed, or engramd is stopping): its rows are not read in place any more; a "
                  "gather through engramd names the file",
                  map.layer_id);
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

int CopyInPlace(const InPlaceTable& table, const protocol::DecodedRequest& request,
                uint8_t* data) {
  if (!MapUsable(*table.map)) return MapError(*table.map);
  CopyRows(*table.map, request.rows.data(), request.rows.size(), data + request.dest_offset,
           request.dest_offsets.empty() ? nullptr : request.dest_offsets.data());
  if (!MapUsableAfterRead(*table.map)) return MapError(*table.map);
  return 0;
}

}  // namespace engram::client

using engram::client::SetError;

extern "C" {

int engram_get_table_map_info(const engram_table_map* map, struct engram_table_map_info* ret_info) {
  if (map == nullptr || ret_info == nullptr) {
    return SetError(-EINVAL, "engram_get_table_map_info needs a map and ret_info");
  }
  struct engram_table_map_info out {};
  out.size = sizeof(out);
  out.layer = map->layer_id;
  out.row_bytes = map->row_bytes;
  out.covered_begin = map->covered_begin;
  out.covered_end = map->covered_end;
  out.base = map->base;
  out.map_bytes = map->map_bytes;
  return engram::client::WriteStruct("engram_table_map_info", out, ret_info);
}

int engram_table_map_gather(const engram_table_map* map, const uint64_t* rows, uint64_t num_rows,
                            void* dest) {
  if (map == nullptr || (num_rows != 0 && (rows == nullptr || dest == nullptr))) {
    return SetError(-EINVAL, "engram_table_map_gather needs a map, rows and dest");
  }
  if (!engram::client::MapUsable(*map)) return engram::client::MapError(*map);
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
  // Rows read while the table was withdrawn or the daemon died are not handed over as good.
  if (!engram::client::MapUsableAfterRead(*map)) return engram::client::MapError(*map);
  return 0;
}

int engram_table_map_check(const engram_table_map* map) {
  if (map == nullptr) return SetError(-EINVAL, "engram_table_map_check needs a map");
  return engram::client::MapError(*map);
}

void engram_table_map_close(engram_table_map* map) {
  if (map == nullptr) return;
  munmap(const_cast<uint8_t*>(map->base), map->map_bytes);
  munmap(const_cast<engram_table_state_page*>(map->state_page), map->state_bytes);
  delete map;
}

// The deprecated name (engram.h, convention 8).
void engram_unmap_table(engram_table_map* map) { engram_table_map_close(map); }

}  // extern "C"
