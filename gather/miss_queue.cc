// MissQueue: class-ordered, depth-bounded grants of device reads for missed rows (miss_queue.h).
#include "gather/miss_queue.h"

#include <algorithm>
#include <numeric>

#include "base/clock.h"

namespace engram {
namespace {

constexpr uint64_t kRateWindowNs = 1'000'000'000;

}  // namespace

const char* MissClassName(MissClass c) {
  switch (c) {
    case MissClass::kDecode:
      return "decode";
    case MissClass::kPrefill:
      return "prefill";
    case MissClass::kPrefetch:
      return "prefetch";
  }
  return "?";
}

MissQueue::MissQueue(const MissQueueOptions& options)
    : depth_(std::max<uint32_t>(1, options.depth)),
      reserve_(depth_ / 4),
      max_queued_(std::max<uint64_t>(options.max_queued_reads, depth_)) {}

uint32_t MissQueue::PieceReads(MissClass c) const {
  if (c == MissClass::kDecode) return kMaxDecodePiece;
  return std::max<uint32_t>(1, (depth_ - reserve_) / 3);
}

bool MissQueue::Fits(int c, uint32_t reads) const {
  // A decode step's misses go to the device at once, beside at most the prefill and prefetch
  // reads already there.
  if (c == static_cast<int>(MissClass::kDecode)) return true;
  if (in_flight_ + reads > depth_) return false;
  // Prefill and prefetch leave the reserve to decode steps.
  const uint64_t others = stats_[1].in_flight_reads + stats_[2].in_flight_reads;
  return others + reads <= depth_ - reserve_;
}

void MissQueue::GrantLocked(uint64_t now) {
  for (int c = 0; c < kMissClasses; ++c) {
    std::deque<Waiter*>& q = waiting_[c];
    while (!q.empty() && Fits(c, q.front()->reads)) {
      Waiter* w = q.front();
      q.pop_front();
      MissClassStats& s = stats_[c];
      s.waiting_reads -= w->reads;
      queued_ -= w->reads;
      s.in_flight_reads += w->reads;
      if (in_flight_ == 0) busy_since_ns_ = now;
      in_flight_ += w->reads;
      s.pieces++;
      s.reads += w->reads;
      const uint64_t waited = now - w->enqueued_ns;
      s.wait_ns += waited;
      s.max_wait_ns = std::max(s.max_wait_ns, waited);
      s.max_reads_waited = std::max(s.max_reads_waited, completed_ - w->completed_at_enqueue);
      w->granted = true;
      w->cv.notify_one();
    }
    // A class that still waits, or will at once, holds every lower class back.
    if (!q.empty() || promised_[c] != 0) return;
  }
}

bool MissQueue::Acquire(MissClass c, uint32_t reads) {
  const int ci = static_cast<int>(c);
  reads = std::clamp<uint32_t>(reads, 1, PieceReads(c));
  Waiter w;
  w.reads = reads;
  std::unique_lock lock(mu_);
  if (promised_[ci] != 0) promised_[ci]--;  // the piece a Release(more) announced
  if (c == MissClass::kPrefetch && queued_ + reads > max_queued_) {
    stats_[ci].dropped_reads += reads;
    GrantLocked(NowNs());
    return false;
  }
  w.enqueued_ns = NowNs();
  w.completed_at_enqueue = completed_;
  waiting_[ci].push_back(&w);
  stats_[ci].waiting_reads += reads;
  queued_ += reads;
  GrantLocked(w.enqueued_ns);
  w.cv.wait(lock, [&] { return w.granted; });
  return true;
}

void MissQueue::Release(MissClass c, uint32_t reads, bool more) {
  const int ci = static_cast<int>(c);
  reads = std::clamp<uint32_t>(reads, 1, PieceReads(c));
  std::lock_guard lock(mu_);
  if (more) promised_[ci]++;
  const uint64_t now = NowNs();
  stats_[ci].in_flight_reads -= std::min<uint64_t>(reads, stats_[ci].in_flight_reads);
  in_flight_ -= std::min<uint64_t>(reads, in_flight_);
  completed_ += reads;
  window_completed_ += reads;
  if (in_flight_ == 0) {
    window_busy_ns_ += now - busy_since_ns_;
    total_busy_ns_ += now - busy_since_ns_;
    busy_since_ns_ = now;
  }
  UpdateRateLocked(now);
  GrantLocked(now);
}

void MissQueue::UpdateRateLocked(uint64_t now) {
  uint64_t busy = window_busy_ns_;
  if (in_flight_ != 0) {  // the current busy stretch counts up to now
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
  if (rate_measured_) {
    out.read_rate_per_s = rate_;
  } else if (total_busy_ns_ > 0) {
    out.read_rate_per_s = double(completed_) * 1e9 / double(total_busy_ns_);
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
    if (!queue->Acquire(c, n)) continue;  // a prefetch past the queue's bound
    absl::Status s = engine->Gather({.table = table, .rows = piece_rows, .dest = bounce.data()});
    // The next piece follows at once: lower classes wait for it too.
    queue->Release(c, n, /*more=*/s.ok() && begin + piece < rows.size());
    if (!s.ok()) return s;
    for (uint32_t k = 0; k < n; ++k) done(order[begin + k], bounce.data() + k * kRowBytes);
  }
  return absl::OkStatus();
}

}  // namespace engram
