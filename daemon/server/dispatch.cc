// Dispatch: a submission from the poller admitted within its session's limits, decoded and
// run (inline or on a request thread) or handed to the prefetcher, and finished.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "daemon/server/server.h"

namespace engram {

void Server::Dispatch(const std::shared_ptr<Session>& session, const engram_sqe& sqe) {
  const uint64_t start = NowNs();
  session->counters.requests_submitted.fetch_add(1, std::memory_order_relaxed);
  const uint32_t slot = ENGRAM_TICKET_SLOT(sqe.ticket);
  const uint64_t claimed = std::min<uint64_t>(sqe.num_rows, config_.limits.max_rows_per_request);
  const bool slot_valid = (sqe.ticket >> 16) != 0 && slot < session->arena().layout().slots;
  if (slot_valid && (sqe.opcode == ENGRAM_OP_PREFETCH || sqe.opcode == ENGRAM_OP_ADMIT_DONE)) {
    PostPrefetch(session, sqe, start);
    return;
  }
  if (claimed <= config_.poll.inline_rows || !slot_valid) {
    // Small (or unanswerable): decoding costs the poller little.
    Execute(session, sqe, start, /*admitted_rows=*/0);
    return;
  }
  // A large request is admitted here at O(1) cost and decoded (row ids copied and checked) on a
  // request thread, so that a client sending large requests that fail on their last row
  // cannot stall the poller every other session waits on.
  if (!Admit(*session, sqe.ticket, slot, claimed, start)) return;
  // Requests larger than a decode step have their own pool, so a prefill never queues decode
  // steps behind it.
  RequestPool& pool =
      claimed <= GatherEngineOptions{}.decode_max_rows ? *requests_ : *large_requests_;
  pool.Post(session->id(),
            [this, session, sqe, start, claimed] { Execute(session, sqe, start, claimed); });
}

uint64_t Server::RowBudget(Session& session) const {
  // Queued requests keep 16 bytes per row (ids and offsets): a session may have at most as many
  // rows in flight as its data region could hold row ids, and always one request of the largest
  // size, so the bookkeeping of all sessions stays within twice --max-total-arena-bytes.
  return std::max<uint64_t>(session.arena().data_bytes() / sizeof(uint64_t),
                            config_.limits.max_rows_per_request);
}

bool Server::Admit(Session& session, uint64_t ticket, uint32_t slot, uint64_t rows,
                   uint64_t start) {
  std::string why;
  if (session.inflight.load(std::memory_order_relaxed) >= config_.limits.max_inflight) {
    why = absl::StrFormat(
        "%u requests already in flight on this session, the limit "
        "(--max-inflight)",
        session.inflight.load());
  } else if (session.rows_in_flight.load(std::memory_order_relaxed) + rows > RowBudget(session)) {
    why = absl::StrFormat(
        "%u rows already in flight on this session and %u more asked for; a session may have "
        "%u rows in flight (its data region's bytes / 8, at least --max-rows-per-request)",
        session.rows_in_flight.load(), rows, RowBudget(session));
  }
  if (!why.empty()) {
    session.Complete(ticket, slot, ENGRAM_STATUS_RESOURCE_EXHAUSTED, why.c_str(), 0,
                     NowNs() - start);
    return false;
  }
  session.inflight.fetch_add(1, std::memory_order_relaxed);
  session.rows_in_flight.fetch_add(rows, std::memory_order_relaxed);
  inflight_total_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Server::Finish(Session& session, uint64_t ticket, uint32_t slot, absl::Status status,
                    uint64_t rows, uint64_t admitted_rows, uint64_t start, bool rows_written) {
  // The session's counts drop before the completion is published, so a client that reuses the
  // finished request's place at once is not refused for the limit; the daemon-wide count,
  // which shutdown drains on, only after it.
  session.inflight.fetch_sub(1, std::memory_order_relaxed);
  session.rows_in_flight.fetch_sub(admitted_rows, std::memory_order_relaxed);
  session.Complete(ticket, slot, static_cast<int32_t>(status.code()),
                   status.ok() ? nullptr : std::string(status.message()).c_str(),
                   status.ok() ? rows : 0, NowNs() - start, rows_written);
  if (inflight_total_.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
      draining_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(drain_mutex_);  // not lost between check and wait
    drained_.notify_all();
  }
}

// What a session's entries are decoded against: its arena and the daemon's limits and tables.
protocol::RequestContext Server::RequestContextOf(Session& session) const {
  Arena& arena = session.arena();
  return {.slots = arena.layout().slots,
          .max_rows = config_.limits.max_rows_per_request,
          .data = arena.data(),
          .data_bytes = arena.data_bytes(),
          .tables = bounds_,
          .admit = session.admit()};
}

void Server::Execute(const std::shared_ptr<Session>& session, const engram_sqe& sqe, uint64_t start,
                     uint64_t admitted_rows) {
  const protocol::RequestContext context = RequestContextOf(*session);
  protocol::DecodedRequest request;
  bool slot_valid = false;
  protocol::CodecError error;
  if (!protocol::DecodeRequest(sqe, context, &request, &slot_valid, &error)) {
    if (admitted_rows != 0) {
      Finish(*session, request.ticket, request.slot,
             absl::Status(static_cast<absl::StatusCode>(error.code), error.message), 0,
             admitted_rows, start);
    } else if (slot_valid) {
      session->Complete(request.ticket, request.slot, error.code, error.message.c_str(), 0,
                        NowNs() - start);
    } else {
      Unanswerable(*session, error.message, start);
    }
    return;
  }
  if (request.opcode == ENGRAM_OP_NOP || request.rows.empty()) {
    if (admitted_rows != 0) {
      Finish(*session, request.ticket, request.slot, absl::OkStatus(), 0, admitted_rows, start);
    } else {
      session->Complete(request.ticket, request.slot, ENGRAM_STATUS_OK, nullptr, 0,
                        NowNs() - start);
    }
    return;
  }
  if (admitted_rows == 0) {
    if (!Admit(*session, request.ticket, request.slot, request.rows.size(), start)) return;
    admitted_rows = request.rows.size();
  }
  // A table marked changed fails before and, if the mark came while its rows were read,
  // after the gather: bytes that were never validated are not handed over as good.
  absl::Status status = watch_->Check(request.table_index);
  if (status.ok()) {
    status = Gather(GatherBatch{.table = tables_[request.table_index].get(),
                                .rows = request.rows,
                                .dest = session->arena().data() + request.dest_offset,
                                .dest_offsets = request.dest_offsets});
  }
  if (status.ok()) status = watch_->Check(request.table_index);
  if (status.ok()) HoldPolling(NowNs());
  Finish(*session, request.ticket, request.slot, std::move(status), request.rows.size(),
         admitted_rows, start);
}

// On the poller: O(1) whatever the entry claims. The session's bound is checked against what the
// entry claims (its rows are only read and checked on the intake thread), and the raw entry is
// handed over.
void Server::PostPrefetch(const std::shared_ptr<Session>& session, const engram_sqe& sqe,
                          uint64_t start) {
  const uint32_t slot = ENGRAM_TICKET_SLOT(sqe.ticket);
  // An entry takes at least one row's place; one over the per-entry limit is refused by its
  // check, with that limit's message.
  const uint64_t claimed =
      sqe.num_rows <= ENGRAM_PREFETCH_MAX_ROWS ? std::max<uint64_t>(1, sqe.num_rows) : 1;
  std::atomic<uint64_t>& waiting = *session->prefetch_rows;
  const uint64_t limit = config_.limits.prefetch_session_rows;
  if (waiting.load(std::memory_order_relaxed) + claimed > limit) {
    session->Complete(
        sqe.ticket, slot, ENGRAM_STATUS_RESOURCE_EXHAUSTED,
        absl::StrFormat("%u rows of this session wait for prefetch and %u more were asked for; "
                        "a session may have %u waiting (limits.prefetch_session_rows)",
                        waiting.load(), claimed, limit)
            .c_str(),
        0, NowNs() - start, /*rows_written=*/false);
    return;
  }
  if (!Admit(*session, sqe.ticket, slot, /*rows=*/0, start)) return;
  waiting.fetch_add(claimed, std::memory_order_relaxed);
  prefetcher_->Post(
      [this, session, sqe, start, claimed] { CheckPrefetch(session, sqe, start, claimed); });
}

// On the prefetcher's intake thread: the entry is decoded (row ids copied and checked), its rows
// queued (an admission's after its pins are reserved), and it completes with how many were; an
// ADMIT_DONE releases its request's pins.
void Server::CheckPrefetch(const std::shared_ptr<Session>& session, const engram_sqe& sqe,
                           uint64_t start, uint64_t claimed) {
  const protocol::RequestContext context = RequestContextOf(*session);
  protocol::DecodedRequest request;
  bool slot_valid = false;
  protocol::CodecError error;
  absl::Status status;
  if (!protocol::DecodeRequest(sqe, context, &request, &slot_valid, &error)) {
    status = absl::Status(static_cast<absl::StatusCode>(error.code), error.message);
  } else if (!request.rows.empty()) {
    // A table whose files changed fails the prefetch as it would fail a gather.
    status = watch_->Check(request.table_index);
  }
  Admissions* admissions = store_ != nullptr ? store_->admissions() : nullptr;
  uint64_t queued = 0;
  if (status.ok() && request.opcode == ENGRAM_OP_ADMIT_DONE) {
    session->prefetch_rows->fetch_sub(claimed, std::memory_order_relaxed);
    queued = admissions != nullptr && admissions->Release(session->id(), request.admission_id);
  } else if (status.ok() && request.pin && admissions != nullptr && !request.rows.empty() &&
             store_->Cached(tables_[request.table_index].get())) {
    // Only the row cache pins: another tier's rows are prefetched as hints (below).
    // Pins are bounded by their reservations, not by the hints' queue.
    session->prefetch_rows->fetch_sub(claimed, std::memory_order_relaxed);
    if (session->closing()) {
      // Its admissions are released by a task Disconnect posted after this entry: none is
      // made for it now.
      status = absl::CancelledError("the session is closing");
    } else {
      auto admission = admissions->Reserve(session->id(), request.admission_id,
                                           request.admission_ttl_ns, request.rows.size(), NowNs());
      status = admission.status();
      if (admission.ok()) {
        prefetcher_->EnqueueAdmission(request.table_index, request.rows, std::move(*admission));
        queued = request.rows.size();
      }
    }
  } else if (status.ok() && !request.rows.empty()) {
    session->prefetch_rows->fetch_sub(claimed - request.rows.size(), std::memory_order_relaxed);
    queued = prefetcher_->Enqueue(request.table_index, request.rows, session->prefetch_rows);
  } else {
    session->prefetch_rows->fetch_sub(claimed, std::memory_order_relaxed);
  }
  Finish(*session, sqe.ticket, ENGRAM_TICKET_SLOT(sqe.ticket), std::move(status), queued,
         /*admitted_rows=*/0, start, /*rows_written=*/false);
}

void Server::Unanswerable(Session& session, const std::string& message, uint64_t start) {
  session.counters.requests_failed.fetch_add(1, std::memory_order_relaxed);
  session.counters.garbage.fetch_add(1, std::memory_order_relaxed);
  uint64_t suppressed = 0;
  if (garbage_log_.Allow(start, &suppressed)) {
    log::Warning("{}: unanswerable submission: {} ({} similar messages suppressed)",
                 session.Describe(), message, suppressed);
  }
}

}  // namespace engram
