// Prefetcher: the bounded queue, the low-priority thread that works it, and its statistics.
#include "daemon/server/prefetcher.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/page_size.h"

namespace engram {
namespace {

using json = nlohmann::json;

// How often a deferred batch looks again whether the gathers in flight finished.
constexpr auto kDeferPoll = std::chrono::microseconds(50);
// How often the idle thread looks for admissions past their deadline.
constexpr auto kExpireEvery = std::chrono::milliseconds(100);

// linux/ioprio.h is not in every libc's headers: the two values needed.
constexpr int kIoprioWhoProcess = 1;
constexpr int kIoprioClassIdle = 3;
constexpr int kIoprioClassShift = 13;

// The calling thread gives way to everything else: SCHED_IDLE for the CPU, the idle class for
// I/O (honoured by the BFQ scheduler; others at least see the lowest priority). Either may be
// refused (a seccomp filter, an old kernel); then it runs at normal priority.
void LowerPriority() {
  sched_param param{};
  if (sched_setscheduler(0, SCHED_IDLE, &param) != 0) {
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  }
  (void)syscall(SYS_ioprio_set, kIoprioWhoProcess, 0, kIoprioClassIdle << kIoprioClassShift);
}

}  // namespace

Prefetcher::Prefetcher(const PrefetcherOptions& options,
                       std::span<const std::unique_ptr<Table>> tables, RowStore* store, BusyFn busy,
                       HealthFn health)
    : options_(options),
      tables_(tables),
      store_(store),
      busy_(std::move(busy)),
      health_(std::move(health)),
      counters_(new Counters[tables.size()]) {}

Prefetcher::~Prefetcher() {
  StopIntake();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Prefetcher::Start() {
  thread_ = std::thread([this] { Run(); });
  intake_thread_ = std::thread([this] { RunIntake(); });
}

void Prefetcher::StopIntake() {
  {
    std::lock_guard<std::mutex> lock(intake_mu_);
    intake_stop_ = true;
  }
  intake_wake_.notify_all();
  if (intake_thread_.joinable()) intake_thread_.join();
}

void Prefetcher::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(intake_mu_);
    intake_.push_back(std::move(task));
  }
  intake_wake_.notify_one();
}

// Checking a PREFETCH entry costs in proportion to its rows: it runs here, below the request
// threads (nice 10, not SCHED_IDLE: a busy daemon still answers prefetches), never on the poller.
void Prefetcher::RunIntake() {
  if (options_.idle_priority) {
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  }
  std::unique_lock<std::mutex> lock(intake_mu_);
  while (true) {
    intake_wake_.wait(lock, [this] { return intake_stop_ || !intake_.empty(); });
    if (intake_.empty()) return;  // stopping, and every task posted has run
    std::function<void()> task = std::move(intake_.front());
    intake_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

uint32_t Prefetcher::OwnerOf(const std::shared_ptr<PrefetchAccount>& account) {
  if (account == nullptr) return kNoOwner;
  auto [it, added] = owner_index_.try_emplace(account.get(), 0);
  if (!added) return it->second;
  if (free_owners_.empty()) {
    free_owners_.push_back(static_cast<uint32_t>(owners_.size()));
    owners_.emplace_back();
  }
  it->second = free_owners_.back();
  free_owners_.pop_back();
  owners_[it->second] = Owner{.account = account, .rows = 0};
  return it->second;
}

void Prefetcher::Leave(uint32_t owner, uint64_t rows) {
  if (owner == kNoOwner || rows == 0) return;
  Owner& o = owners_[owner];
  o.account->fetch_sub(rows, std::memory_order_relaxed);
  o.rows -= rows;
  if (o.rows != 0) return;
  owner_index_.erase(o.account.get());
  o.account.reset();
  free_owners_.push_back(owner);
}

// Hints go stale: the rows of drafts a later step rejected are worth less than the newest ones.
// So a full queue makes room by dropping its oldest rows, and the thread works the newest first.
uint64_t Prefetcher::Enqueue(size_t table_index, std::span<const uint64_t> rows,
                             const std::shared_ptr<PrefetchAccount>& account) {
  Counters& c = counters_[table_index];
  // Of one entry larger than the whole queue, its last rows are kept.
  const uint64_t queued = std::min<uint64_t>(options_.queue_rows, rows.size());
  if (account != nullptr && queued < rows.size()) {
    account->fetch_sub(rows.size() - queued, std::memory_order_relaxed);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!queue_.empty() && queue_.size() + queued > options_.queue_rows) {
      counters_[queue_.front().table].dropped.fetch_add(1, std::memory_order_relaxed);
      Leave(queue_.front().owner, 1);
      queue_.pop_front();
      pending_.fetch_sub(1, std::memory_order_relaxed);
    }
    const uint32_t owner = queued != 0 ? OwnerOf(account) : kNoOwner;
    if (owner != kNoOwner) owners_[owner].rows += queued;
    for (uint64_t row : rows.subspan(rows.size() - queued)) {
      queue_.push_back({static_cast<uint32_t>(table_index), owner, row});
    }
    pending_.fetch_add(queued, std::memory_order_relaxed);
  }
  c.requested.fetch_add(queued, std::memory_order_relaxed);
  if (queued < rows.size()) c.dropped.fetch_add(rows.size() - queued, std::memory_order_relaxed);
  if (queued != 0) wake_.notify_one();
  return queued;
}

void Prefetcher::EnqueueAdmission(size_t table_index, std::span<const uint64_t> rows,
                                  std::shared_ptr<Admission> admission) {
  if (rows.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    admit_queue_.push_back({.table = static_cast<uint32_t>(table_index),
                            .admission = std::move(admission),
                            .rows = {rows.begin(), rows.end()}});
    pending_.fetch_add(rows.size(), std::memory_order_relaxed);
  }
  counters_[table_index].requested.fetch_add(rows.size(), std::memory_order_relaxed);
  wake_.notify_one();
}

bool Prefetcher::WaitIdle(uint64_t timeout_ns) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_for(lock, std::chrono::nanoseconds(timeout_ns),
                        [this] { return pending_.load(std::memory_order_relaxed) == 0; });
}

void Prefetcher::Run() {
  if (options_.idle_priority) LowerPriority();
  uint32_t table = 0;
  std::vector<uint64_t> rows;
  std::shared_ptr<Admission> admission;
  while (Take(&table, &rows, &admission)) {
    if (rows.empty()) continue;
    Process(table, rows, admission.get());
    admission.reset();
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.fetch_sub(rows.size(), std::memory_order_relaxed) == rows.size()) {
      idle_.notify_all();
    }
  }
}

bool Prefetcher::Take(uint32_t* ret_table, std::vector<uint64_t>* ret_rows,
                      std::shared_ptr<Admission>* ret_admission) {
  Admissions* admissions = store_ != nullptr ? store_->admissions() : nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [this] { return stop_ || !queue_.empty() || !admit_queue_.empty(); };
    // Without a row cache there is nothing to expire: no wake-ups while idle.
    if (admissions == nullptr) wake_.wait(lock, ready);
    while (!wake_.wait_for(lock, kExpireEvery, ready)) {
      lock.unlock();
      admissions->Expire(NowNs());
      lock.lock();
    }
    if (stop_) return false;
  }
  if (admissions != nullptr) admissions->Expire(NowNs());
  // Decode steps first: the batch waits (bounded) for the gathers in flight, outside the lock
  // so that Enqueue never waits on it.
  Defer();
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return false;
  ret_rows->clear();
  if (queue_.empty()) {  // admissions' rows, or hints dropped while this batch deferred
    *ret_table = 0;
    if (!admit_queue_.empty()) TakeAdmitted(ret_table, ret_rows, ret_admission);
    return true;
  }
  // Newest first (see Enqueue).
  *ret_table = queue_.back().table;
  while (!queue_.empty() && queue_.back().table == *ret_table &&
         ret_rows->size() < options_.batch_rows) {
    ret_rows->push_back(queue_.back().row);
    Leave(queue_.back().owner, 1);
    queue_.pop_back();
  }
  return true;
}

void Prefetcher::TakeAdmitted(uint32_t* ret_table, std::vector<uint64_t>* ret_rows,
                              std::shared_ptr<Admission>* ret_admission) {
  AdmitBatch& b = admit_queue_.front();
  *ret_table = b.table;
  *ret_admission = b.admission;
  const size_t n = std::min<size_t>(options_.batch_rows, b.rows.size() - b.next);
  ret_rows->assign(b.rows.begin() + b.next, b.rows.begin() + b.next + n);
  b.next += n;
  if (b.next == b.rows.size()) admit_queue_.pop_front();
}

void Prefetcher::Defer() {
  if (!busy_) return;
  const uint64_t deadline = NowNs() + options_.max_defer_ns;
  while (busy_() && NowNs() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    std::this_thread::sleep_for(kDeferPoll);
  }
}

void Prefetcher::Process(uint32_t table_index, std::span<const uint64_t> rows,
                         Admission* admission) {
  Counters& c = counters_[table_index];
  const Table& table = *tables_[table_index];
  // A request done (or expired) before its rows were read: they are no longer wanted.
  if (admission != nullptr && admission->released()) {
    c.dropped.fetch_add(rows.size(), std::memory_order_relaxed);
    return;
  }
  // Bytes read from a file that changed since it was validated are never admitted.
  if (health_) {
    if (absl::Status s = health_(table_index); !s.ok()) {
      c.failed.fetch_add(rows.size(), std::memory_order_relaxed);
      return;
    }
  }
  uint64_t fetched = 0, held = 0;
  if (store_ != nullptr && store_->Handles(&table)) {
    PrefetchOutcome outcome;
    absl::Status s = store_->Prefetch(&table, rows, &outcome, admission);
    if (s.ok() && health_) s = health_(table_index);
    if (!s.ok()) {
      c.failed.fetch_add(rows.size() - outcome.held, std::memory_order_relaxed);
      c.held.fetch_add(outcome.held, std::memory_order_relaxed);
      return;
    }
    fetched = outcome.fetched;
    held = outcome.held;
    // The miss queue was full (decode steps and prefills ahead of it).
    c.dropped.fetch_add(outcome.dropped, std::memory_order_relaxed);
  } else if (options_.storage_readahead) {
    ReadAhead(table, rows, &fetched, &held);
  } else {
    // Read with O_DIRECT from storage: there is no cache to bring the rows into.
    c.dropped.fetch_add(rows.size(), std::memory_order_relaxed);
    return;
  }
  c.fetched.fetch_add(fetched, std::memory_order_relaxed);
  c.held.fetch_add(held, std::memory_order_relaxed);
}

// A part whose bytes a RWF_NOWAIT read gets is in the page cache; the others have their pages
// read ahead. posix_fadvise(WILLNEED) starts the reads and returns without waiting for them
// (the same kernel path as readahead(2), on any filesystem), and the pages land in the page
// cache with nothing copied to user space.
void Prefetcher::ReadAhead(const Table& table, std::span<const uint64_t> rows,
                           uint64_t* ret_fetched, uint64_t* ret_held) {
  uint8_t scratch[kRowBytes];
  const uint64_t page = PageBytes();
  const std::span<const TableFile> files = table.files();
  for (uint64_t row : rows) {
    bool all_resident = true;
    for (const RowPart& part : table.parts()) {
      const int fd = files[part.file].fd;
      const uint64_t offset = part.FileOffset(row);
      iovec iov{.iov_base = scratch, .iov_len = part.bytes};
      const ssize_t n = preadv2(fd, &iov, 1, static_cast<off_t>(offset), RWF_NOWAIT);
      if (n == static_cast<ssize_t>(part.bytes)) continue;
      all_resident = false;
      const uint64_t begin = RoundDownTo(offset, page);
      const uint64_t end = RoundUpTo(offset + part.bytes, page);
      (void)posix_fadvise(fd, static_cast<off_t>(begin), static_cast<off_t>(end - begin),
                          POSIX_FADV_WILLNEED);
    }
    ++(all_resident ? *ret_held : *ret_fetched);
  }
}

std::vector<TablePrefetchStats> Prefetcher::Stats() const {
  std::vector<TablePrefetchStats> out;
  for (size_t i = 0; i < tables_.size(); ++i) {
    const Counters& c = counters_[i];
    out.push_back({.layer_id = tables_[i]->layer_id(),
                   .requested = c.requested.load(std::memory_order_relaxed),
                   .dropped = c.dropped.load(std::memory_order_relaxed),
                   .fetched = c.fetched.load(std::memory_order_relaxed),
                   .held = c.held.load(std::memory_order_relaxed),
                   .failed = c.failed.load(std::memory_order_relaxed)});
  }
  return out;
}

namespace {

// Hits on prefetched rows, per layer, from the row store (cache tier only).
uint64_t UsedRows(const RowStore* store, uint32_t layer) {
  if (store == nullptr) return 0;
  for (const TableStoreStats& s : store->Stats()) {
    if (s.layer_id == layer) return s.prefetch_used_rows;
  }
  return 0;
}

}  // namespace

void Prefetcher::AddControlFields(const std::string& command, json* out) const {
  const std::vector<TablePrefetchStats> stats = Stats();
  if (command == "status") {
    uint64_t requested = 0, dropped = 0, fetched = 0, held = 0, failed = 0, used = 0;
    for (const TablePrefetchStats& s : stats) {
      requested += s.requested;
      dropped += s.dropped;
      fetched += s.fetched;
      held += s.held;
      failed += s.failed;
      used += UsedRows(store_, s.layer_id);
    }
    (*out)["prefetch"] = {{"queue_rows", pending_rows()},
                          {"queue_limit_rows", options_.queue_rows},
                          {"requested_rows", requested},
                          {"fetched_rows", fetched},
                          {"held_rows", held},
                          {"dropped_rows", dropped},
                          {"failed_rows", failed},
                          {"used_rows", used}};
    return;
  }
  if (command != "stats") return;
  json* tables = out->contains("tables") ? &(*out)["tables"] : nullptr;
  for (const TablePrefetchStats& s : stats) {
    json* t = ControlTableEntry(tables, s.layer_id);
    if (t == nullptr) continue;
    (*t)["prefetch_requested_rows"] = s.requested;
    (*t)["prefetch_fetched_rows"] = s.fetched;
    (*t)["prefetch_held_rows"] = s.held;
    (*t)["prefetch_dropped_rows"] = s.dropped;
    (*t)["prefetch_failed_rows"] = s.failed;
    // prefetch_used_rows is the row store's (protocol/store_counters.h).
  }
}

void Prefetcher::AddMetrics(MetricSink* e) const {
  e->Gauge("engram_prefetch_queue_rows", "Rows waiting on the prefetch queue", {},
           double(pending_rows()));
  for (const TablePrefetchStats& s : Stats()) {
    const MetricLabels t = {{"table", std::to_string(s.layer_id)}};
    e->Counter("engram_prefetch_requested_rows_total", "Rows queued by prefetch requests", t,
               double(s.requested));
    e->Counter("engram_prefetch_fetched_rows_total",
               "Prefetched rows read into the row cache or the page cache", t, double(s.fetched));
    e->Counter("engram_prefetch_held_rows_total", "Prefetched rows that were in memory already", t,
               double(s.held));
    e->Counter("engram_prefetch_dropped_rows_total",
               "Prefetched rows dropped (queue full, or nothing to bring them into)", t,
               double(s.dropped));
    e->Counter("engram_prefetch_failed_rows_total", "Prefetched rows whose read failed", t,
               double(s.failed));
  }
}

}  // namespace engram
