// Resident tables mapped read-only in the client: the mapping, its checks and a CPU gather.
#include "client/table_map.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "base/prefetch.h"
#include "base/unique_fd.h"
#include "client/abi_struct.h"
#include "client/last_error.h"

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

// The touch page's layout is the daemon's: checked once, before anything of it is trusted.
int CheckTouchPage(const engram_cache_touch_page& touch, uint64_t touch_bytes,
                   const MappedTable& t) {
  const uint64_t counters_end =
      touch.counters_offset + uint64_t{touch.tables} * sizeof(engram_cache_touch_counters);
  if (touch.magic != ENGRAM_CACHE_TOUCH_MAGIC || touch.entries != ENGRAM_CACHE_TOUCH_ENTRIES ||
      touch.page_bytes != touch_bytes || touch.counters_offset < sizeof(engram_cache_touch_page) ||
      touch.counters_offset % 8 != 0 || counters_end > touch.ring_offset ||
      touch.ring_offset % 8 != 0 ||
      touch.ring_offset + uint64_t{touch.entries} * sizeof(engram_cache_touch_entry) >
          touch_bytes ||
      t.state_index >= touch.tables) {
    return SetError(-EPROTO,
                    "engramd's cache touch page does not describe table entry %u (magic 0x%x, %u "
                    "tables, %llu bytes)",
                    t.state_index, touch.magic, touch.tables,
                    static_cast<unsigned long long>(touch_bytes));
  }
  return 0;
}

// Maps the session's touch page read-write after checking its layout against `t`; *ret_page and
// *ret_bytes, or -errno. Does not take `fd`.
int MapTouchPage(int fd, const MappedTable& t, engram_cache_touch_page** ret_page,
                 uint64_t* ret_bytes) {
  struct stat st;
  const uint64_t bytes =
      fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
  if (bytes < sizeof(engram_cache_touch_page)) {
    return SetError(-EPROTO, "engramd sent layer %u's cache touch page of %llu bytes", t.layer,
                    static_cast<unsigned long long>(bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return SetError(-err, "cannot map engramd's cache touch page: %s", strerror(err));
  }
  auto* page = static_cast<engram_cache_touch_page*>(p);
  if (int rc = CheckTouchPage(*page, bytes, t); rc < 0) {
    munmap(p, bytes);
    return rc;
  }
  *ret_page = page;
  *ret_bytes = bytes;
  return 0;
}

}  // namespace

int MapSealedTable(int fd, int state_fd, int touch_fd, const MappedTable& t,
                   engram_table_map** ret_map) {
  // The mappings keep the memory.
  UniqueFd table_fd(fd), page_fd(state_fd), touch_file(touch_fd);
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
  engram_cache_touch_page* touch = nullptr;
  uint64_t touch_bytes = 0;
  if (touch_fd >= 0) {
    if (int rc = MapTouchPage(touch_fd, t, &touch, &touch_bytes); rc < 0) return rc;
  }
  const auto unmap_touch = [&] {
    if (touch != nullptr) munmap(touch, touch_bytes);
  };
  const engram_table_state_page* page = nullptr;
  uint64_t page_bytes = 0;
  if (int rc = MapStatePage(state_fd, t, &page, &page_bytes); rc < 0) {
    unmap_touch();
    return rc;
  }
  void* p = mmap(nullptr, t.map_bytes, PROT_READ, MAP_SHARED, fd, 0);
  auto* map = p != MAP_FAILED ? new (std::nothrow) engram_table_map : nullptr;
  if (map == nullptr) {
    const int err = p == MAP_FAILED ? errno : ENOMEM;
    if (p != MAP_FAILED) munmap(p, t.map_bytes);
    munmap(const_cast<engram_table_state_page*>(page), page_bytes);
    unmap_touch();
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
  if (touch != nullptr) {
    map->touch = touch;
    map->touch_bytes = touch_bytes;
    map->touch_counters = reinterpret_cast<engram_cache_touch_counters*>(
                              reinterpret_cast<uint8_t*>(touch) + touch->counters_offset) +
                          t.state_index;
  }
  *ret_map = map;
  return 0;
}

int MapRowCache(int cache_fd, int state_fd, int touch_fd, const MappedTable& t,
                engram_table_map** ret_map) {
  UniqueFd cache_file(cache_fd), page_fd(state_fd), touch_file(touch_fd);
  struct stat st;
  const uint64_t bytes =
      fstat(cache_fd, &st) == 0 && S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
  if (bytes == 0 || bytes != t.map_bytes || t.row_bytes != ENGRAM_ROW_BYTES ||
      t.covered_end < t.covered_begin) {
    return SetError(-EPROTO,
                    "engramd sent layer %u's row cache as a memfd of %llu bytes, not the %llu it "
                    "claims",
                    t.layer, static_cast<unsigned long long>(bytes),
                    static_cast<unsigned long long>(t.map_bytes));
  }
  engram_cache_touch_page* touch = nullptr;
  uint64_t touch_bytes = 0;
  if (int rc = MapTouchPage(touch_fd, t, &touch, &touch_bytes); rc < 0) return rc;
  const engram_table_state_page* page = nullptr;
  uint64_t page_bytes = 0;
  if (int rc = MapStatePage(state_fd, t, &page, &page_bytes); rc < 0) {
    munmap(touch, touch_bytes);
    return rc;
  }
  const auto unmap_pages = [&] {
    munmap(const_cast<engram_table_state_page*>(page), page_bytes);
    munmap(touch, touch_bytes);
  };
  // Read-only, and the descriptor allows nothing else: no write, no mprotect to write.
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, cache_fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    unmap_pages();
    return SetError(-err, "cannot map engramd's row cache (%llu bytes) for layer %u: %s",
                    static_cast<unsigned long long>(bytes), t.layer, strerror(err));
  }
  auto reader = RowCacheReader::Attach(static_cast<const uint8_t*>(p), bytes);
  const auto fail = [&](int rc) {
    munmap(p, bytes);
    unmap_pages();
    return rc;
  };
  if (!reader.ok()) {
    return fail(SetError(-EPROTO, "engramd's row cache for layer %u: %s", t.layer,
                         std::string(reader.status().message()).c_str()));
  }
  auto* map = new (std::nothrow) engram_table_map;
  if (map == nullptr) return fail(SetError(-ENOMEM, "no memory for a table map"));
  map->base = static_cast<const uint8_t*>(p);
  map->map_bytes = bytes;
  map->layer_id = t.layer;
  map->row_bytes = t.row_bytes;
  map->covered_begin = t.covered_begin;
  map->covered_end = t.covered_end;
  map->state_page = page;
  map->state_bytes = page_bytes;
  const auto* entries = reinterpret_cast<const engram_table_state_entry*>(
      reinterpret_cast<const uint8_t*>(page) + page->header_bytes);
  map->table_state = &entries[t.state_index].state;
  map->row_cache = true;
  map->cache = *reader;
  map->touch = touch;
  map->touch_bytes = touch_bytes;
  auto* touch_base = reinterpret_cast<uint8_t*>(touch);
  map->touch_counters =
      reinterpret_cast<engram_cache_touch_counters*>(touch_base + touch->counters_offset) +
      t.state_index;
  map->touch_ring = reinterpret_cast<engram_cache_touch_entry*>(touch_base + touch->ring_offset);
  *ret_map = map;
  return 0;
}

int MapError(const engram_table_map& map) {
  if (MapUsable(map)) return 0;
  const uint32_t alive =
      std::atomic_ref<uint32_t>(const_cast<uint32_t&>(map.state_page->daemon_alive))
          .load(std::memory_order_acquire);
  if ((alive & ENGRAM_DAEMON_TID_MASK) == 0 || (alive & ENGRAM_DAEMON_OWNER_DIED) != 0) {
    return SetError(-ENOTCONN,
                    "engramd, which served layer %u's resident table, is gone (it stopped or "
                    "died): its rows are not read in place any more; map the table again from a "
                    "new session",
                    map.layer_id);
  }
  if (map.row_cache) {
    return SetError(-ESTALE,
                    "engramd withdrew layer %u's table (a file it is read from changed, or "
                    "engramd is stopping): its rows are not read from the row cache in place any "
                    "more; a gather through engramd names the file",
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

int CopyInPlace(const InPlaceTable& table, const protocol::DecodedRequest& request, uint8_t* data) {
  if (!MapUsable(*table.map)) return MapError(*table.map);
  CopyRows(*table.map, request.rows.data(), request.rows.size(), data + request.dest_offset,
           request.dest_offsets.empty() ? nullptr : request.dest_offsets.data());
  if (!MapUsableAfterRead(*table.map)) return MapError(*table.map);
  return 0;
}

int CopyCached(const InPlaceTable& table, const protocol::DecodedRequest& request, uint8_t* data,
               CachedCopy* ret_copy) {
  const engram_table_map& map = *table.map;
  ret_copy->miss_rows.clear();
  ret_copy->miss_offsets.clear();
  ret_copy->touches.clear();
  ret_copy->hits = 0;
  if (!MapUsable(map)) return MapError(map);
  const uint64_t n = request.rows.size();
  const uint64_t* rows = request.rows.data();
  const bool offsets = !request.dest_offsets.empty();
  uint8_t* dest = data + request.dest_offset;
  const uint32_t layer = map.layer_id;
  for (uint64_t i = 0; i < n; ++i) {
    // Two stages ahead, as the daemon's own gather: the bucket's line, then the slot it names.
    if (i + kPrefetchRowsAhead < n) map.cache.PrefetchBucket(layer, rows[i + kPrefetchRowsAhead]);
    if (i + kPrefetchRowsAhead / 2 < n) {
      map.cache.PrefetchSlot(layer, rows[i + kPrefetchRowsAhead / 2]);
    }
    const uint64_t at = offsets ? request.dest_offsets[i] : i * ENGRAM_ROW_BYTES;
    uint8_t freq = 0;
    const int64_t slot = map.cache.LookupSlot(layer, rows[i], dest + at, &freq);
    if (slot < 0) {
      ret_copy->miss_rows.push_back(rows[i]);
      ret_copy->miss_offsets.push_back(at);
      continue;
    }
    ++ret_copy->hits;
    if (freq < 3) {
      ret_copy->touches.push_back(
          {.key = RowCacheKey(layer, rows[i]), .slot = static_cast<uint32_t>(slot), .reserved = 0});
    }
  }
  // Rows read while the table was withdrawn or the daemon died are not handed over as good.
  if (!MapUsableAfterRead(map)) return MapError(map);
  return 0;
}

void ReportCached(const engram_table_map& map, const CachedCopy& copy, bool all_hit) {
  ReportHits(map, copy, all_hit ? 1 : 0);
}

void ReportResident(const engram_table_map& map, uint64_t rows) {
  if (map.touch_counters == nullptr) return;
  // The daemon reads them at its next fold (before it reports statistics); relaxed adds, as the
  // counters order nothing else.
  std::atomic_ref<uint64_t>(map.touch_counters->rows).fetch_add(rows, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(map.touch_counters->requests).fetch_add(1, std::memory_order_relaxed);
}

void ReportHits(const engram_table_map& map, const CachedCopy& copy, uint64_t all_hit_requests) {
  // The ring has one producer per session; a session's maps (engram_gather's own and those
  // engram_table_map_open returned, e.g. for engram_table_map_report_hits) share its touch page,
  // so every report of this process is serialised here.
  static std::mutex producer;
  std::lock_guard<std::mutex> lock(producer);
  const auto add = [](uint64_t& word, uint64_t n) {
    if (n != 0) std::atomic_ref<uint64_t>(word).fetch_add(n, std::memory_order_relaxed);
  };
  add(map.touch_counters->rows, copy.hits);
  add(map.touch_counters->requests, all_hit_requests);
  if (copy.touches.empty()) return;
  engram_cache_touch_page& page = *map.touch;
  // One producer (the caller serialises): head is ours; the daemon's tail says which entries
  // it has read (acquire: its reads of them are done before we write them again).
  const uint64_t head = std::atomic_ref<uint64_t>(page.head).load(std::memory_order_relaxed);
  const uint64_t tail = std::atomic_ref<uint64_t>(page.tail).load(std::memory_order_acquire);
  const uint64_t used = head - tail;
  const uint64_t room = used < ENGRAM_CACHE_TOUCH_ENTRIES ? ENGRAM_CACHE_TOUCH_ENTRIES - used : 0;
  const uint64_t n = std::min<uint64_t>(room, copy.touches.size());
  for (uint64_t i = 0; i < n; ++i) {
    engram_cache_touch_entry& e = map.touch_ring[(head + i) % ENGRAM_CACHE_TOUCH_ENTRIES];
    std::atomic_ref<uint64_t>(e.key).store(copy.touches[i].key, std::memory_order_relaxed);
    std::atomic_ref<uint32_t>(e.slot).store(copy.touches[i].slot, std::memory_order_relaxed);
  }
  // The entries are written before the daemon can see them under head.
  if (n != 0) std::atomic_ref<uint64_t>(page.head).store(head + n, std::memory_order_release);
  add(page.dropped, copy.touches.size() - n);
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
  out.kind = map->row_cache ? ENGRAM_TABLE_MAP_ROW_CACHE : ENGRAM_TABLE_MAP_RESIDENT;
  return engram::client::WriteStruct("engram_table_map_info", out, ret_info);
}

int engram_table_map_gather(const engram_table_map* map, const uint64_t* rows, uint64_t num_rows,
                            void* dest) {
  if (map == nullptr || (num_rows != 0 && (rows == nullptr || dest == nullptr))) {
    return SetError(-EINVAL, "engram_table_map_gather needs a map, rows and dest");
  }
  if (map->row_cache) {
    return SetError(-EOPNOTSUPP,
                    "layer %u's map is engramd's row cache (the cache tier), which may miss any "
                    "row: engram_table_map_gather copies only resident tables; use engram_gather "
                    "with ENGRAM_GATHER_IN_PLACE (hits copied in place, misses through engramd) "
                    "or, on a GPU, engram_dequant_cache_gather",
                    map->layer_id);
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
  if (map->touch != nullptr) munmap(map->touch, map->touch_bytes);
  delete map;
}

}  // extern "C"
