// RowCache: a bounded cache of 264-byte rows in daemon-owned shared memory, one per node, shared
// by every table and client. Admission and eviction follow S3-FIFO (a small FIFO for new rows, a
// main FIFO for rows seen again, a ghost queue of recently evicted keys), which resists the
// one-pass scans of prefill. Lookups take no lock and make no syscall; one writer at a time
// (under a mutex of the daemon's, never in shared memory) inserts, evicts and resizes.
//
//   auto cache = engram::RowCache::Create({.max_bytes = 8ull << 30}, &budget);
//   uint8_t row[engram::kRowBytes];
//   if (!(*cache)->Lookup(14, 42, row)) {
//     /* read the row from storage, then */ (*cache)->Insert(14, 42, row);
//   }
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "protocol/row_cache_layout.h"
#include "protocol/row_cache_reader.h"
#include "protocol/store_counters.h"
#include "store/ghost_queue.h"
#include "store/memory_budget.h"
#include "store/shared_region.h"
#include "tables/table.h"

namespace engram {

struct RowCacheOptions {
  // Most bytes the cache may hold (slots and index); the budget may allow less.
  uint64_t max_bytes = 0;
  // Share of the capacity given to the small FIFO (S3-FIFO's 10 %).
  double small_fraction = 0.1;
  // Accesses while in the small FIFO that promote a row to the main FIFO instead of evicting it.
  uint32_t promote_threshold = 1;
  // Slots a shrink evicts, checks or moves per hold of the writer's lock; inserts (a gather's
  // misses) wait at most one such chunk (about 1 µs a slot, so ~1 ms) however large the shrink.
  uint32_t shrink_chunk_slots = 1024;
  // Written into the region's header (tables_identity): what the rows are rows of. Adopt()
  // refuses a region that names another.
  uint64_t tables_identity = 0;
};

// How a row cache of at most `max_bytes` is laid out (RowCache::Size): the rows it holds and
// where the rest of the bytes go, which together never exceed max_bytes.
struct RowCacheSizing {
  uint64_t max_bytes = 0;
  uint64_t slots = 0;              // rows the cache holds at most
  uint64_t row_bytes = 0;          // slots * kRowBytes: the rows themselves
  uint64_t slot_header_bytes = 0;  // the rest of each slot: sequence, key, check, alignment
  uint64_t index_bytes = 0;        // region header and bucket index, to a page boundary
  uint64_t buckets = 0;            // a power of two, at least two per slot
  uint64_t bookkeeping_bytes = 0;  // the daemon's own policy state (BookkeepingBytes)
  uint64_t unused_bytes = 0;       // max_bytes less all the above
};

// What RowCache::Adopt kept of a region handed over and what it dropped.
struct RowCacheAdoption {
  uint64_t kept = 0;            // rows adopted (before any shrink to the budget)
  uint64_t torn = 0;            // slots a writer was changing when the region was let go (odd seq)
  uint64_t not_served = 0;      // rows of a layer not served or outside its rows (keep() false)
  uint64_t duplicates = 0;      // a second slot holding a key already kept
  uint64_t evicted_to_fit = 0;  // rows the shrink to what the budget allows now evicted
  // Slots whose check word does not match their key and row (bytes scribbled on, keys
  // swapped): dropped. In all, and per layer the key names.
  uint64_t bad_check = 0;
  std::map<uint32_t, uint64_t> bad_check_by_layer;
};

// What RowCache::ProveRows compared and dropped.
struct RowCacheProof {
  uint64_t compared = 0;  // rows held and compared with their table file
  uint64_t stale = 0;     // rows that differed from it: dropped
  std::map<uint32_t, uint64_t> stale_by_layer;
  uint64_t unproven = 0;  // rows not compared by the deadline: dropped
};

// One field per entry of ENGRAM_ROW_CACHE_COUNTERS (protocol/store_counters.h): capacity_slots,
// max_slots, used_slots, bytes, resident_bytes, hits, misses, inserts, evictions, ghost_hits,
// promotions, prefetch_inserts, shrink_skipped_inserts, pinned_rows, pinned_evictions.
struct RowCacheStats {
#define ENGRAM_ROW_CACHE_FIELD_(field, json_key, type, metric, help) uint64_t field = 0;
  ENGRAM_ROW_CACHE_COUNTERS(ENGRAM_ROW_CACHE_FIELD_)
#undef ENGRAM_ROW_CACHE_FIELD_
};

class RowCache {
 public:
  // Maps a region for options.max_bytes worth of slots and takes as much of it from `budget`
  // (null: unaccounted) as is available; the capacity is what the budget gave. InvalidArgument
  // when max_bytes holds no slot.
  static absl::StatusOr<std::unique_ptr<RowCache>> Create(const RowCacheOptions& options,
                                                          MemoryBudget* budget);
  // Takes over a row cache region an earlier engramd created (its memfd, handed over through
  // systemd's file-descriptor store): validates the header (magic, version, sizes, the region
  // big enough for its slots) and options.tables_identity against the one recorded, then
  // rebuilds the policy state from the slots. A slot is kept when its seq is even, its key is
  // not 0, keep(layer, row) says the row is served, and its check word matches its key and row
  // (a region written before slots carried checks gets them instead); every other slot is
  // cleared and the bucket index is rebuilt from the kept ones. The rows kept are whole and
  // under their own key, but may be older than their files: the caller proves them with
  // ProveRows before any client maps the region. The rows start in the main FIFO if they were hit
  // since admission, else in the small one; the ghost starts empty. If the budget now allows
  // fewer slots than the region holds, the cache shrinks to that by the normal path (evicting
  // by policy). The region keeps its own size (options.max_bytes only bounds the capacity).
  // InvalidArgument naming what was wrong (a garbage or foreign region),
  // FailedPrecondition when the tables changed, ResourceExhausted when the budget cannot hold
  // the index; the caller then creates a fresh cache.
  using KeepRow = std::function<bool(uint32_t layer, uint64_t row)>;
  static absl::StatusOr<std::unique_ptr<RowCache>> Adopt(UniqueFd fd,
                                                         const RowCacheOptions& options,
                                                         MemoryBudget* budget, const KeepRow& keep,
                                                         RowCacheAdoption* ret_adoption);
  // The bytes of `rows` (ascending) of `layer` as the table files hold them now, kRowBytes each
  // into `dest`.
  using ReadRows =
      std::function<absl::Status(uint32_t layer, std::span<const uint64_t> rows, uint8_t* dest)>;
  // Compares every row held with what `read` returns for it and drops each that differs: after
  // it, every row held is the one its table file holds (a file rewritten in place with its
  // modification time restored keeps the tables' identity, so the identity alone does not prove
  // this). Reads pieces of up to kProvePieceRows rows of one layer, in slot order; once
  // NowNs() passes `deadline_ns` (0: none) the rows not compared yet are dropped unread, so that
  // a start on slow storage stays bounded. Holds the writer's lock throughout: meant for an
  // adopted region before clients map it. The first error of `read` is returned; rows not
  // compared yet are then unproven and the caller discards the cache.
  static constexpr size_t kProvePieceRows = 1024;
  absl::Status ProveRows(const ReadRows& read, uint64_t deadline_ns, RowCacheProof* ret_proof);
  ~RowCache();
  uint64_t tables_identity() const { return header_->tables_identity; }
  // The keys of the rows held now (RowCacheKey), at most max_keys: rows hit since admission
  // first. Lock-free (a slot being written is left out); for the hot-set snapshot.
  std::vector<uint64_t> HotKeys(uint64_t max_keys) const;

  // Lock-free lookup (see RowCacheReader::Lookup); marks the row as used for the policy. Not
  // counted here: a shared counter bumped per row would bounce one cache line between every
  // request thread, so callers count a batch and add it with CountLookups().
  bool Lookup(uint32_t layer, uint64_t row, uint8_t* dst) {
    return reader_.Lookup(layer, row, dst);
  }
  // Lookup that also tells whether this hit is the first on a row a prefetch admitted
  // (*ret_prefetch_used; each such row is reported once, by the hit that clears its mark).
  bool Lookup(uint32_t layer, uint64_t row, uint8_t* dst, bool* ret_prefetch_used);
  bool Contains(uint32_t layer, uint64_t row) const { return reader_.Contains(layer, row); }
  // A hit another process read in place and reported (a session's cache touch page): a use of
  // the row for the policy, as Lookup's, if `slot` lies below the capacity and still holds
  // `key`; otherwise nothing. Lock-free; nothing it is given is trusted.
  void Touch(uint32_t slot, uint64_t key);
  void CountLookups(uint64_t hits, uint64_t misses) {
    hits_.fetch_add(hits, std::memory_order_relaxed);
    misses_.fetch_add(misses, std::memory_order_relaxed);
  }
  // Admits a row read from storage (a no-op if it is present or the capacity is 0). Evicts as
  // the policy says. Rows must be < 2^40 and layers < 2^23 (InvalidArgument otherwise).
  absl::Status Insert(uint32_t layer, uint64_t row, const uint8_t* data);
  // Insert of a row a prefetch read: the slot is marked so that the first gather that hits it
  // counts as a prefetch used. *ret_inserted (may be null): false when the row was present
  // already (then its mark is left as it was) or the capacity is 0.
  absl::Status InsertPrefetched(uint32_t layer, uint64_t row, const uint8_t* data,
                                bool* ret_inserted);
  // Pins: a row an admission prefetch read for a request's prefill (RowStore's admissions) is
  // pinned until the request is done with it. Eviction passes over a pinned row (it goes round
  // the main FIFO again) as long as some unpinned row is left to evict; only a cache whose every
  // row is pinned evicts one anyway (counted: pinned_evictions), so that a shrink under memory
  // pressure always finishes. Pins count: a row pinned by two admissions stays pinned until both
  // let go. The pin is the daemon's alone (nothing of it is in shared memory).
  //
  // InsertPrefetched that also pins the row, whether this inserted it or it was present.
  // *ret_pinned: false when the row could not be pinned (no capacity, a shrink left no slot, or
  // it is pinned kMaxPins times already). *ret_inserted as for InsertPrefetched.
  static constexpr uint32_t kMaxPins = 0xFFFF;
  absl::Status InsertPinned(uint32_t layer, uint64_t row, const uint8_t* data, bool* ret_inserted,
                            bool* ret_pinned);
  // Pins the row if it is held; false when it is not (or is pinned kMaxPins times already).
  bool Pin(uint32_t layer, uint64_t row);
  // Takes one pin off the row; nothing when it is not held or not pinned (an eviction of a
  // pinned row took its pins with it).
  void Unpin(uint32_t layer, uint64_t row);

  // Changes the capacity (clamped to [0, max_slots]): growing takes bytes from the budget (as
  // many as it gives), shrinking evicts by policy, moves rows out of the released range and gives
  // the pages back to the kernel and the bytes to the budget. Returns the new capacity in slots.
  // A shrink works in chunks of options.shrink_chunk_slots slots and lets the writer's lock go
  // between them, so inserts and lock-free lookups go on; until it returns, a row is admitted
  // only into a free slot below the new capacity while fewer rows than that are held (else it
  // is skipped: counted in shrink_skipped_inserts). One resize runs at a time.
  uint64_t SetCapacitySlots(uint64_t slots);
  uint64_t SetCapacityBytes(uint64_t bytes) { return SetCapacitySlots(SlotsForBytes(bytes)); }
  uint64_t capacity_slots() const;
  uint64_t max_slots() const { return max_slots_; }
  // Gives back the pages of the slots at and above the capacity again: a reader in another
  // process that followed a bucket just before a shrink moved its row may have faulted such a
  // page back in (it reads zeros: a miss). Does nothing (returns 0) while a resize runs, so a
  // caller never waits for one. Returns the bytes the region held before minus after.
  uint64_t ReleaseAboveCapacity();
  // The largest cache whose region (header, index, slots) and bookkeeping fit `max_bytes`, as
  // Create sizes itself: for --check-config and the start's log to say what a size holds.
  static RowCacheSizing Size(uint64_t max_bytes);
  // The slot array's bytes the budget is charged at a capacity of `capacity` slots: whole pages,
  // up to the first slot at or above `capacity` that starts a page (the pages below it are
  // kept: kRowCacheFlagAlignedRelease), or to the end of the region. A shrink gives back the
  // difference, a grow takes it.
  uint64_t ChargedSlotBytes(uint64_t capacity) const;
  // Bytes of `slots` slots, unrounded (a size in a message or a configuration), and the inverse.
  static uint64_t BytesForSlots(uint64_t slots);
  static uint64_t SlotsForBytes(uint64_t bytes);
  // The daemon's private memory for a cache of `max_slots` slots (policy state, free list, FIFO
  // entries, ghost), sized at creation and taken from the budget with the index.
  static uint64_t BookkeepingBytes(uint64_t max_slots);

  RowCacheStats Stats() const;
  const RowCacheReader& reader() const { return reader_; }
  int fd() const { return region_.fd(); }
  uint64_t region_bytes() const { return region_.size(); }

 private:
  enum Queue : uint8_t { kFree, kSmall, kMain };
  struct SlotMeta {
    uint64_t key = 0;
    uint32_t generation = 0;
    // The slot's `seq` as last written. Shrinking gives the slot's page back and its `seq`
    // reads 0 afterwards: writes go on from here instead, so that `seq` never returns to a
    // value a preempted reader may have read before (it would take a torn row as good).
    uint32_t seq = 0;
    Queue queue = kFree;
    uint16_t pins = 0;  // admissions holding the row (Pin)
  };
  struct QueueEntry {
    uint32_t slot;
    uint32_t generation;
  };

  RowCache(const RowCacheOptions& options, MemoryBudget* budget)
      : options_(options), budget_(budget) {}
  RowCacheSlot& slot(uint32_t i) { return slots_[i]; }
  int64_t FindBucket(uint64_t key) const;  // the bucket holding `key`, or -1
  int64_t FindSlot(uint64_t key) const;    // the slot holding `key`, or -1
  void InsertBucket(uint64_t key, uint32_t slot);
  void EraseBucket(uint64_t bucket);
  void WriteSlot(uint32_t slot, uint64_t key, const uint8_t* data);
  absl::Status InsertWith(uint32_t layer, uint64_t row, const uint8_t* data, bool prefetched,
                          bool pin, bool* ret_inserted, bool* ret_pinned);
  // With mu_ held: pins slot `s` once more; false at kMaxPins.
  bool PinSlot(uint32_t s);
  void ClearSlot(uint32_t slot);
  void RemoveSlot(uint32_t slot, bool to_ghost);
  void Push(Queue queue, uint32_t slot);
  bool PopLive(std::deque<QueueEntry>& queue, Queue which, uint32_t* ret_slot);
  uint32_t EvictOne();
  void AddGhost(uint64_t key);
  void MoveDown(uint32_t from, uint32_t to);
  uint64_t SmallTarget() const;
  // The slot a new row goes into (a free one, or one evicted for it); false while a shrink
  // leaves no place for it.
  bool TakeSlot(uint32_t* ret_slot);
  uint64_t Grow(uint64_t slots, uint64_t old);  // with mu_ held
  void Shrink(uint64_t slots, uint64_t old);    // with resize_mu_ held, takes mu_ per chunk
  void ShrinkFreeList(uint64_t slots);
  void ReleaseSlots(uint64_t slots, uint64_t old);
  // The first slot at or above `from` that starts on a page boundary of the region.
  uint64_t FirstPageAlignedSlot(uint64_t from) const;
  // The largest capacity in [from, to] whose charge exceeds ChargedSlotBytes(from) by at most
  // `bytes`.
  uint64_t SlotsFitting(uint64_t from, uint64_t to, uint64_t bytes) const;
  // Between a shrink's chunks, with mu_ released: lets the inserts that wait for mu_ have it.
  void LetWritersIn();
  // Adopt's second half (row_cache_restart.cc): the policy state from the slots; with
  // write_checks, each kept slot's check too (a region written before slots carried one),
  // else each kept slot's check is verified and a slot that fails it is dropped.
  void RebuildFromSlots(uint64_t usable_slots, const KeepRow& keep, bool write_checks,
                        RowCacheAdoption* ret);
  // Whether slot `i`, whose seq and key were read, keeps its row at adoption: keep() says it is
  // served, no slot kept before holds its key, and its check word matches (unless checks are
  // being written). Counts why not in *ret.
  bool KeepsAdoptedSlot(uint32_t i, uint64_t key, const KeepRow& keep, bool write_checks,
                        RowCacheAdoption* ret);
  // ProveRows' piece: the rows of `slots` (of one layer) read and compared, each that differs
  // dropped. With mu_ held.
  absl::Status ProvePiece(uint32_t layer, std::vector<uint32_t>& slots, const ReadRows& read,
                          uint64_t deadline_ns, RowCacheProof* ret);

  const RowCacheOptions options_;
  MemoryBudget* budget_;
  SharedRegion region_;
  RowCacheHeader* header_ = nullptr;
  RowCacheBucket* buckets_ = nullptr;
  RowCacheSlot* slots_ = nullptr;
  uint32_t bucket_mask_ = 0;
  uint32_t max_slots_ = 0;
  RowCacheReader reader_;
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};

  std::mutex resize_mu_;  // one SetCapacitySlots at a time; taken before mu_
  // Inserts waiting for mu_, and inserts that got it (LetWritersIn).
  std::atomic<uint32_t> insert_waiters_{0};
  std::atomic<uint64_t> insert_entries_{0};
  mutable std::mutex mu_;   // the writer's; everything below
  bool shrinking_ = false;  // a shrink is between its chunks (capacity_slots() is its target)
  uint64_t shrink_skipped_inserts_ = 0;
  uint64_t reserved_bytes_ = 0;
  std::vector<SlotMeta> meta_;
  std::vector<uint32_t> free_;
  std::deque<QueueEntry> small_;
  std::deque<QueueEntry> main_;
  uint64_t small_count_ = 0;
  uint64_t main_count_ = 0;
  GhostQueue ghost_;  // sized for max_slots_ keys at creation
  uint64_t inserts_ = 0;
  uint64_t evictions_ = 0;
  uint64_t ghost_hits_ = 0;
  uint64_t promotions_ = 0;
  uint64_t prefetch_inserts_ = 0;
  uint64_t pinned_rows_ = 0;  // slots with pins > 0
  uint64_t pinned_evictions_ = 0;
};

}  // namespace engram
