// Bounded bookkeeping of connections that have not finished their handshake (see the header).
#include "daemon/server/pending_handshakes.h"

namespace engram {

std::vector<PendingHandshakes::Dropped> PendingHandshakes::Add(int fd, uid_t uid,
                                                               uint64_t deadline_ns) {
  std::vector<Dropped> dropped;
  if (max_per_uid_ > 0 && CountOf(uid) >= max_per_uid_) {
    dropped.push_back(DropOldestOf(uid, /*uid_bound=*/true));
  }
  while (max_total_ > 0 && by_fd_.size() >= max_total_) {
    // The uid that holds the most pays; among equals, the one whose oldest is oldest.
    uid_t victim = 0;
    size_t most = 0;
    uint64_t oldest = UINT64_MAX;
    for (const auto& [u, fds] : by_uid_) {
      const uint64_t first = fds.begin()->first;
      if (fds.size() > most || (fds.size() == most && first < oldest)) {
        victim = u;
        most = fds.size();
        oldest = first;
      }
    }
    dropped.push_back(DropOldestOf(victim, /*uid_bound=*/false));
  }
  const uint64_t order = next_order_++;
  by_fd_[fd] = Entry{uid, deadline_ns, order};
  by_uid_[uid][order] = fd;
  return dropped;
}

PendingHandshakes::Dropped PendingHandshakes::DropOldestOf(uid_t uid, bool uid_bound) {
  std::map<uint64_t, int>& fds = by_uid_.at(uid);
  const size_t count = fds.size();
  const int fd = fds.begin()->second;
  Remove(fd);
  return Dropped{fd, uid, count, uid_bound};
}

void PendingHandshakes::Remove(int fd) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return;
  auto u = by_uid_.find(it->second.uid);
  u->second.erase(it->second.order);
  if (u->second.empty()) by_uid_.erase(u);
  by_fd_.erase(it);
}

std::vector<int> PendingHandshakes::TakeExpired(uint64_t now_ns) {
  std::vector<int> expired;
  for (const auto& [fd, e] : by_fd_) {
    if (e.deadline_ns <= now_ns) expired.push_back(fd);
  }
  for (int fd : expired) Remove(fd);
  return expired;
}

std::vector<int> PendingHandshakes::TakeAll() {
  std::vector<int> all;
  for (const auto& [fd, e] : by_fd_) all.push_back(fd);
  by_fd_.clear();
  by_uid_.clear();
  return all;
}

size_t PendingHandshakes::CountOf(uid_t uid) const {
  auto it = by_uid_.find(uid);
  return it == by_uid_.end() ? 0 : it->second.size();
}

}  // namespace engram
