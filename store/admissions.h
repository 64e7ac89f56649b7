// Admissions: the rows of a request's prompt, read into the row cache when an engine admits the
// request and pinned there until its prefill has gathered them: until the engine says the
// request is done with them (Release), its deadline passes (Expire) or its session ends
// (ReleaseOwner). Pins are reserved before any row is read, per owner (a session) and in all,
// so that no client can pin the cache away from decode steps and other requests, and a pin
// never evicts another request's pinned row (RowCache's pins). docs/row-store.md, "Admission".
//
//   Admissions admissions({.max_owner_rows = 262144}, cache);
//   auto a = admissions.Reserve(session_id, request_id, ttl_ns, rows.size(), NowNs());
//   if (a.ok()) store->Prefetch(table, rows, &outcome, a->get());  // reads, pins, records
//   admissions.Release(session_id, request_id);                       // the prefill is done
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "store/row_cache.h"

namespace engram {

struct AdmissionLimits {
  // Rows pinned (reserved) at most, every owner together; 0: a quarter of the row cache's
  // capacity. Never more than half the capacity at the time of the reservation, so that at
  // least half the cache is always left to the policy.
  uint64_t max_rows = 0;
  // Rows one owner (a session) may have reserved at once.
  uint64_t max_owner_rows = 262144;
  // The longest an admission lives without being released; a request asking for longer (or
  // for 0) gets this.
  uint64_t max_ttl_ns = 30'000'000'000;
};

// Counters and gauges of the admissions (status "store"."admissions", metrics).
struct AdmissionStats {
  uint64_t active = 0;         // gauge: admissions not yet released or expired
  uint64_t reserved_rows = 0;  // gauge: rows reserved by them
  uint64_t pinned_rows = 0;    // gauge: rows they have pinned (a row two pin counts twice)
  uint64_t max_rows = 0;       // gauge: the bound in all, at the cache's present capacity
  uint64_t admitted_rows = 0;  // rows reserved, ever
  uint64_t refused_rows = 0;   // rows refused at a bound
  uint64_t released = 0;       // admissions their owner released
  uint64_t expired = 0;        // admissions whose deadline passed
  uint64_t ended = 0;          // admissions released because their owner went away
};

// One request's admission. Shared by the table and the prefetch queue's entries for it.
class Admission {
 public:
  Admission(RowCache* cache, uint64_t owner, uint64_t id) : cache_(cache), owner_(owner), id_(id) {}
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  uint64_t owner() const { return owner_; }
  uint64_t id() const { return id_; }
  // Records a row the cache pinned for this admission (RowCache::InsertPinned or Pin); if the
  // admission was released meanwhile the pin is taken off again at once. Thread-safe.
  void Pinned(uint32_t layer, uint64_t row);
  // True once released or expired: its rows still queued are not read. Thread-safe.
  bool released() const;

 private:
  friend class Admissions;
  // Marks it released and takes every pin it holds off. Returns the rows unpinned.
  uint64_t Release();

  RowCache* const cache_;
  const uint64_t owner_;
  const uint64_t id_;
  // Under Admissions::mu_.
  uint64_t deadline_ns_ = 0;
  uint64_t reserved_ = 0;

  mutable std::mutex mu_;
  bool released_ = false;
  std::vector<std::pair<uint32_t, uint64_t>> pinned_;  // (layer, row)
};

class Admissions {
 public:
  // `cache` (not null) must outlive the admissions.
  Admissions(const AdmissionLimits& limits, RowCache* cache);
  ~Admissions();  // takes every pin off
  Admissions(const Admissions&) = delete;
  Admissions& operator=(const Admissions&) = delete;

  // Reserves `rows` more pins for request `id` of `owner`, making its admission if it has none
  // (its deadline now + ttl_ns, ttl_ns 0 or past the limit meaning the limit; a later
  // reservation of the same request moves the deadline out to its own). ResourceExhausted when
  // the owner's or the whole bound would be passed, naming the bound's setting; nothing is
  // reserved then. Thread-safe.
  absl::StatusOr<std::shared_ptr<Admission>> Reserve(uint64_t owner, uint64_t id, uint64_t ttl_ns,
                                                     uint64_t rows, uint64_t now_ns);
  // The engine is done with request `id`: its pins are taken off. False when it has no
  // admission (never made, released already, or expired). Thread-safe.
  bool Release(uint64_t owner, uint64_t id);
  // The owner went away: every admission of it is released. Returns how many. Thread-safe.
  uint64_t ReleaseOwner(uint64_t owner);
  // Releases the admissions whose deadline is at or before now_ns. Returns how many.
  uint64_t Expire(uint64_t now_ns);

  // The bound in all at the cache's present capacity.
  uint64_t MaxRows() const;
  AdmissionStats Stats() const;
  const AdmissionLimits& limits() const { return limits_; }

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // (owner, id)
  // With mu_ held: forgets `a` and its reservation; the caller releases it after unlocking.
  void ForgetLocked(const std::shared_ptr<Admission>& a);

  const AdmissionLimits limits_;
  RowCache* const cache_;
  mutable std::mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<Admission>> admissions_;
  absl::flat_hash_map<uint64_t, uint64_t> owner_rows_;
  uint64_t reserved_ = 0;
  uint64_t admitted_rows_ = 0;
  uint64_t refused_rows_ = 0;
  uint64_t released_ = 0;
  uint64_t expired_ = 0;
  uint64_t ended_ = 0;
};

}  // namespace engram
