// Admissions: pin reservations of admitted requests, their release, deadlines and owners.
#include "store/admissions.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace engram {

void Admission::Pinned(uint32_t layer, uint64_t row) {
  std::lock_guard<std::mutex> lock(mu_);
  if (released_) {
    cache_->Unpin(layer, row);
    return;
  }
  pinned_.emplace_back(layer, row);
}

bool Admission::released() const {
  std::lock_guard<std::mutex> lock(mu_);
  return released_;
}

uint64_t Admission::Release() {
  std::vector<std::pair<uint32_t, uint64_t>> pinned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    pinned.swap(pinned_);
  }
  for (const auto& [layer, row] : pinned) cache_->Unpin(layer, row);
  return pinned.size();
}

Admissions::Admissions(const AdmissionLimits& limits, RowCache* cache)
    : limits_(limits), cache_(cache) {}

Admissions::~Admissions() {
  for (auto& [key, a] : admissions_) a->Release();
}

uint64_t Admissions::MaxRows() const {
  const uint64_t capacity = cache_->capacity_slots();
  const uint64_t wanted = limits_.max_rows != 0 ? limits_.max_rows : capacity / 4;
  return std::min(wanted, capacity / 2);
}

absl::StatusOr<std::shared_ptr<Admission>> Admissions::Reserve(uint64_t owner, uint64_t id,
                                                               uint64_t ttl_ns, uint64_t rows,
                                                               uint64_t now_ns) {
  const uint64_t ttl = ttl_ns == 0 ? limits_.max_ttl_ns : std::min(ttl_ns, limits_.max_ttl_ns);
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& owned = owner_rows_[owner];
  std::string why;
  if (owned + rows > limits_.max_owner_rows) {
    why = absl::StrFormat(
        "%u rows of this session are pinned for admitted requests and %u more were asked for; a "
        "session may pin %u (memory.admit_session_rows)",
        owned, rows, limits_.max_owner_rows);
  } else if (const uint64_t max = MaxRows(); reserved_ + rows > max) {
    why = absl::StrFormat(
        "%u rows are pinned for admitted requests and %u more were asked for; at most %u may "
        "be (memory.admit_rows, never more than half the row cache's %u rows)",
        reserved_, rows, max, cache_->capacity_slots());
  }
  if (!why.empty()) {
    if (owned == 0) owner_rows_.erase(owner);
    refused_rows_ += rows;
    return absl::ResourceExhaustedError(why);
  }
  std::shared_ptr<Admission>& a = admissions_[Key{owner, id}];
  if (a == nullptr) a = std::make_shared<Admission>(cache_, owner, id);
  a->deadline_ns_ = std::max(a->deadline_ns_, now_ns + ttl);
  a->reserved_ += rows;
  owned += rows;
  reserved_ += rows;
  admitted_rows_ += rows;
  return a;
}

void Admissions::ForgetLocked(const std::shared_ptr<Admission>& a) {
  reserved_ -= a->reserved_;
  auto it = owner_rows_.find(a->owner());
  it->second -= a->reserved_;
  if (it->second == 0) owner_rows_.erase(it);
  admissions_.erase(Key{a->owner(), a->id()});
}

bool Admissions::Release(uint64_t owner, uint64_t id) {
  std::shared_ptr<Admission> a;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = admissions_.find(Key{owner, id});
    if (it == admissions_.end()) return false;
    a = it->second;
    ForgetLocked(a);
    ++released_;
  }
  a->Release();
  return true;
}

uint64_t Admissions::ReleaseOwner(uint64_t owner) {
  std::vector<std::shared_ptr<Admission>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, a] : admissions_) {
      if (key.first == owner) gone.push_back(a);
    }
    for (const auto& a : gone) ForgetLocked(a);
    ended_ += gone.size();
  }
  for (const auto& a : gone) a->Release();
  return gone.size();
}

uint64_t Admissions::Expire(uint64_t now_ns) {
  std::vector<std::shared_ptr<Admission>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, a] : admissions_) {
      if (a->deadline_ns_ <= now_ns) gone.push_back(a);
    }
    for (const auto& a : gone) ForgetLocked(a);
    expired_ += gone.size();
  }
  for (const auto& a : gone) a->Release();
  return gone.size();
}

AdmissionStats Admissions::Stats() const {
  AdmissionStats st;
  std::vector<std::shared_ptr<Admission>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    st.active = admissions_.size();
    st.reserved_rows = reserved_;
    st.admitted_rows = admitted_rows_;
    st.refused_rows = refused_rows_;
    st.released = released_;
    st.expired = expired_;
    st.ended = ended_;
    for (const auto& [key, a] : admissions_) all.push_back(a);
  }
  st.max_rows = MaxRows();
  for (const auto& a : all) {
    std::lock_guard<std::mutex> lock(a->mu_);
    st.pinned_rows += a->pinned_.size();
  }
  return st;
}

}  // namespace engram
