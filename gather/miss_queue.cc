// MissQueue: class- and due-ordered, depth-bounded grants of device reads for missed rows, shed
// when the device falls behind (miss_queue.h).
#include "gather/miss_queue.h"

#include <algorithm>
#include <numeric>

#include "base/clock.h"
#include "base/metric_sink.h"

namespace engram {
namespace {

constexpr uint64_t kRateWindowNs = 1'000'000'000;

bool IsGather(int c) { return c <= static_cast<int>(MissClass::kPrefill); }

}  // namespace

const char* MissClassName(MissClass c) {
  switch (c) {
    case MissClass::kDecode:
      return "decode";
    case MissClass::kPrefill:
      return "prefill";
    case MissClass::kPrefetch:
      return "prefetch";
    case MissClass::kAdmission:
      return "admission";
  }
  return "?";
}

MissQueue::MissQueue(const MissQueueOptions& options)
    : depth_(std::max<uint32_t>(1, options.depth)),
      reserve_(depth_ / 4),
      max_queued_(std::max<uint64_t>(options.max_queued_reads, depth_)),
      shed_backlog_ns_(options.shed_backlog_ns),
      layer_spacing_ns_(options.layer_spacing_ns),
      clock_(options.clock != nullptr ? options.clock : NowNs) {
  ask_window_start_ns_ = clock_();
}

uint32_t MissQueue::PieceReads(MissClass c) const {
  if (c == MissClass::kDecode) return kMaxDecodePiece;
  return std::max<uint32_t>(1, depth_ - reserve_);
}

bool MissQueue::Fits(int c, uint32_t reads) const {
  // A decode step's misses go to the device at once, beside at most the reads already there.
  if (c == static_cast<int>(MissClass::kDecode)) return true;
  if (in_flight_ + reads > depth_) return false;
  // The other classes leave the reserve to decode steps.
  return in_flight_ - stats_[0].in_flight_reads + reads <= depth_ - reserve_;
}

double MissQueue::RateLocked() const {
  if (rate_measured_) return rate_;
  return total_busy_ns_ > 0 ? double(gather_completed_) * 1e9 / double(total_busy_ns_) : 0;
}

bool MissQueue::BehindLocked(int c, uint32_t reads) const {
  if (shed_backlog_ns_ == 0) return false;
  const double rate = RateLocked();
  if (rate <= 0) return false;  // not measured yet: nothing to judge by
  // The reads the device must finish before this piece's: every read the requests of higher
  // classes under way still need, and the lower classes' reads in flight. Its own class's are
  // not counted: a large admission on an idle device is work to do, not a sign of overload
  // (the queue's bound limits it).
  uint64_t ahead = in_flight_ + reads;
  for (int k = 0; k < c; ++k) {
    const MissClassStats& s = stats_[k];
    ahead += s.pending_reads - std::min(s.pending_reads, s.in_flight_reads);
  }
  return double(ahead) * 1e9 / rate > double(shed_backlog_ns_);
}

void MissQueue::ShedStaleLocked(uint64_t now) {
  if (shed_backlog_ns_ == 0) return;
  for (int c = static_cast<int>(MissClass::kPrefetch); c < kMissClasses; ++c) {
    std::vector<Waiter*>& q = waiting_[c];
    for (auto it = q.begin(); it != q.end();) {
      Waiter* w = *it;
      if (now - std::min(now, w->enqueued_ns) <= shed_backlog_ns_) {
        ++it;
        continue;
      }
      it = q.erase(it);
      stats_[c].waiting_reads -= w->reads;
      stats_[c].shed_reads += w->reads;
      queued_ -= w->reads;
      w->shed = true;
      w->granted = true;
      w->cv.notify_one();
    }
  }
}

void MissQueue::GrantLocked(uint64_t now) {
  // A prefetch or admission piece that waited longer than the device may fall behind is shed:
  // the thread asking (the prefetcher's) goes on to newer work.
  ShedStaleLocked(now);
  for (int c = 0; c < kMissClasses; ++c) {
    std::vector<Waiter*>& q = waiting_[c];
    while (!q.empty() && Fits(c, q.front()->reads)) {
      Waiter* w = q.front();
      q.erase(q.begin());
      MissClassStats& s = stats_[c];
      s.waiting_reads -= w->reads;
      queued_ -= w->reads;
      s.in_flight_reads += w->reads;
      if (IsGather(c)) {
        if (gather_in_flight_ == 0) busy_since_ns_ = now;
        gather_in_flight_ += w->reads;
      }
      in_flight_ += w->reads;
      s.pieces++;
      s.reads += w->reads;
      const uint64_t waited = now - std::min(now, w->enqueued_ns);
      s.wait_ns += waited;
      s.max_wait_ns = std::max(s.max_wait_ns, waited);
      s.wait_buckets[Log2BucketOf(waited, s.wait_buckets.size())]++;
      s.max_reads_waited = std::max(s.max_reads_waited, completed_ - w->completed_at_enqueue);
      w->granted = true;
      w->cv.notify_one();
    }
    // A class that still waits, or will at once, holds every lower class back.
    if (!q.empty() || promised_[c] != 0) return;
  }
}

void MissQueue::Announce(MissClass c, uint64_t reads) {
  std::lock_guard lock(mu_);
  stats_[static_cast<int>(c)].pending_reads += reads;
  const uint64_t now = clock_();
  const uint64_t elapsed = now - std::min(now, ask_window_start_ns_);
  if (elapsed >= kRateWindowNs) {
    demand_ = double(ask_window_reads_) * 1e9 / double(elapsed);
    ask_window_start_ns_ = now;
    ask_window_reads_ = 0;
  }
  ask_window_reads_ += reads;
}

void MissQueue::Retire(MissClass c, uint64_t reads) {
  std::lock_guard lock(mu_);
  MissClassStats& s = stats_[static_cast<int>(c)];
  s.pending_reads -= std::min(reads, s.pending_reads);
}

bool MissQueue::Acquire(MissClass c, uint32_t reads, uint64_t due) {
  const int ci = static_cast<int>(c);
  reads = std::clamp<uint32_t>(reads, 1, PieceReads(c));
  Waiter w;
  w.reads = reads;
  std::unique_lock lock(mu_);
  if (promised_[ci] != 0) promised_[ci]--;  // the piece a Release(more) announced
  w.enqueued_ns = clock_();
  if (MissClassSheddable(c)) {
    uint64_t* refused = nullptr;
    if (queued_ + reads > max_queued_) {
      refused = &stats_[ci].dropped_reads;
    } else if (BehindLocked(ci, reads)) {
      refused = &stats_[ci].shed_reads;
    }
    if (refused != nullptr) {
      *refused += reads;
      GrantLocked(w.enqueued_ns);  // a promise this piece kept no longer holds lower classes
      return false;
    }
  }
  w.due = due != 0 ? due : w.enqueued_ns;
  w.seq = next_seq_++;
  w.completed_at_enqueue = completed_;
  // In due order (a few waiters a class: request threads bound them); no allocation once the
  // vector has grown, unlike a tree's node a piece.
  std::vector<Waiter*>& q = waiting_[ci];
  q.insert(std::upper_bound(q.begin(), q.end(), &w, ByDue{}), &w);
  stats_[ci].waiting_reads += reads;
  queued_ += reads;
  GrantLocked(w.enqueued_ns);
  w.cv.wait(lock, [&] { return w.granted; });
  return !w.shed;
}

void MissQueue::Release(MissClass c, uint32_t reads, bool more) {
  const int ci = static_cast<int>(c);
  reads = std::clamp<uint32_t>(reads, 1, PieceReads(c));
  std::lock_guard lock(mu_);
  if (more) promised_[ci]++;
  const uint64_t now = clock_();
  stats_[ci].in_flight_reads -= std::min<uint64_t>(reads, stats_[ci].in_flight_reads);
  stats_[ci].pending_reads -= std::min<uint64_t>(reads, stats_[ci].pending_reads);
  in_flight_ -= std::min<uint64_t>(reads, in_flight_);
  completed_ += reads;
  if (IsGather(ci)) {
    // The rate counts gathers' reads only: a prefetch or admission is read by a thread of idle
    // priority, which may tell of its reads long after the device finished them.
    if (gather_in_flight_ != 0) {  // the busy stretch up to now, before the reads leave it
      window_busy_ns_ += now - busy_since_ns_;
      total_busy_ns_ += now - busy_since_ns_;
      busy_since_ns_ = now;
    }
    gather_in_flight_ -= std::min<uint64_t>(reads, gather_in_flight_);
    gather_completed_ += reads;
    window_completed_ += reads;
    UpdateRateLocked(now);
  }
  GrantLocked(now);
}

void MissQueue::UpdateRateLocked(uint64_t now) {
  uint64_t busy = window_busy_ns_;
  if (gather_in_flight_ != 0) {  // the current busy stretch counts up to now
    busy += now - busy_since_ns_;
    window_busy_ns_ = busy;
    total_busy_ns_ += now - busy_since_ns_;
    busy_since_ns_ = now;
  }
  if (busy < kRateWindowNs) return;
  rate_ = double(window_completed_) * 1e9 / double(busy);
  rate_measured_ = true;
  window_busy_ns_ = 0;
  window_completed_ = 0;
}

MissQueueStats MissQueue::Stats() const {
  std::lock_guard lock(mu_);
  MissQueueStats out;
  out.depth = depth_;
  out.classes = stats_;
  out.completed_reads = completed_;
  out.read_rate_per_s = RateLocked();
  // The last full window's demand; a window that ran past two without asks is what it holds.
  const uint64_t now = clock_();
  const uint64_t elapsed = now - std::min(now, ask_window_start_ns_);
  out.demand_per_s =
      elapsed >= 2 * kRateWindowNs ? double(ask_window_reads_) * 1e9 / double(elapsed) : demand_;
  if (out.read_rate_per_s > 0) {
    // Reads asked of the queue directly, never announced, count while they wait or are read.
    uint64_t backlog = 0;
    for (const MissClassStats& c : stats_) {
      backlog += std::max(c.pending_reads, c.waiting_reads + c.in_flight_reads);
    }
    out.backlog_s = double(backlog) / out.read_rate_per_s;
    out.load = out.demand_per_s / out.read_rate_per_s;
  }
  return out;
}

MissClass MissClassOfGather(size_t rows) {
  return rows <= GatherEngineOptions{}.decode_max_rows ? MissClass::kDecode : MissClass::kPrefill;
}

absl::Status ReadMisses(GatherEngine* engine, MissQueue* queue, MissClass c, const Table* table,
                        std::span<const uint64_t> rows, std::vector<uint8_t>& bounce,
                        absl::FunctionRef<void(size_t i, const uint8_t* row)> done) {
  const size_t piece = queue->PieceReads(c);
  const uint64_t due = queue->Due(table->layer_id());
  queue->Announce(c, rows.size());
  thread_local std::vector<uint32_t> order;
  thread_local std::vector<uint64_t> piece_rows;
  order.resize(rows.size());
  std::iota(order.begin(), order.end(), 0u);
  if (rows.size() > piece) {
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t b) { return rows[a] < rows[b]; });
  }
  if (bounce.size() < piece * kRowBytes) bounce.resize(piece * kRowBytes);
  for (size_t begin = 0; begin < rows.size(); begin += piece) {
    const uint32_t n = static_cast<uint32_t>(std::min(piece, rows.size() - begin));
    piece_rows.resize(n);
    for (uint32_t k = 0; k < n; ++k) piece_rows[k] = rows[order[begin + k]];
    if (!queue->Acquire(c, n, due)) {  // dropped or shed: the device is behind
      queue->Retire(c, n);
      continue;
    }
    absl::Status s = engine->Gather({.table = table, .rows = piece_rows, .dest = bounce.data()});
    // The next piece follows at once: lower classes wait for it too.
    queue->Release(c, n, /*more=*/s.ok() && begin + piece < rows.size());
    if (!s.ok()) {
      queue->Retire(c, rows.size() - begin - n);  // the pieces that will not be asked
      return s;
    }
    for (uint32_t k = 0; k < n; ++k) done(order[begin + k], bounce.data() + k * kRowBytes);
  }
  return absl::OkStatus();
}

}  // namespace engram
