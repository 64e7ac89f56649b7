// Connections accepted on engramd's socket that have not finished their handshake yet. They are
// bounded on their own, apart from the established sessions (--max-clients): per uid and in all.
// When a bound is hit the oldest pending connection of the uid holding the most is dropped, so
// a peer that opens connections and never says HELLO crowds out only itself, never a client
// that is established, nor another uid's (an administrator's) connection.
//
//   PendingHandshakes pending(kMaxPending, kMaxPendingPerUid);
//   for (const PendingHandshakes::Dropped& d : pending.Add(fd, uid, deadline)) close(d.fd);
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

namespace engram {

class PendingHandshakes {
 public:
  struct Dropped {
    int fd;
    uid_t uid;
    size_t uid_pending;  // that uid's pending connections when it was dropped
    bool uid_bound;      // dropped for the per-uid bound (else for the total)
  };

  PendingHandshakes(size_t max_total, size_t max_per_uid)
      : max_total_(max_total), max_per_uid_(max_per_uid) {}

  // Records `fd` (from `uid`) as pending until `deadline_ns`. Returns the connections dropped
  // to keep within the bounds, oldest first; the caller closes them. `fd` itself is never
  // among them.
  std::vector<Dropped> Add(int fd, uid_t uid, uint64_t deadline_ns);
  bool Contains(int fd) const { return by_fd_.count(fd) != 0; }
  // Forgets `fd` (its handshake ended one way or the other); no-op if it is not pending.
  void Remove(int fd);
  // Removes and returns the connections whose deadline is not after `now_ns`.
  std::vector<int> TakeExpired(uint64_t now_ns);
  // Removes and returns every pending connection.
  std::vector<int> TakeAll();
  bool empty() const { return by_fd_.empty(); }
  size_t size() const { return by_fd_.size(); }
  size_t CountOf(uid_t uid) const;

 private:
  struct Entry {
    uid_t uid;
    uint64_t deadline_ns;
    uint64_t order;  // arrival order: lower is older
  };
  // Drops the oldest connection of `uid`.
  Dropped DropOldestOf(uid_t uid, bool uid_bound);

  const size_t max_total_;
  const size_t max_per_uid_;
  uint64_t next_order_ = 0;
  std::unordered_map<int, Entry> by_fd_;
  std::unordered_map<uid_t, std::map<uint64_t, int>> by_uid_;  // uid → arrival order → fd
};

}  // namespace engram
