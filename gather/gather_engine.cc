// The gather engine: plans each batch, serves page-cache-resident rows with an RWF_NOWAIT pass
// on the calling thread, and finishes the residue with io_uring (one ring per thread) or a
// blocking pool; large batches are split between the caller and the workers.
#include "gather/gather_engine.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/metric_sink.h"
#include "base/page_size.h"
#include "gather/gather_planner.h"
#include "gather/gather_reader.h"
#include "gather/thread_pool.h"

namespace engram {

uint64_t TableGatherStats::LatencyPercentileNs(double q) const {
  return Log2QuantileNs(latency_buckets, q);
}

uint64_t DefaultWorkerSpinNs(uint32_t cpus) { return cpus >= 8 ? 10'000 : 0; }

namespace {

constexpr size_t kLatencyBuckets = 64;
// Residue reads per task when the blocking pool shares them out.
constexpr size_t kPoolTaskReads = 16;
// What a planned read is assumed to cost before a table's first batch was measured.
constexpr double kInitialNsPerRead = 1000.0;

struct TableState {
  const Table* table = nullptr;
  TableGatherOptions options;
  std::vector<std::unique_ptr<GatherFile>> files;

#define ENGRAM_TABLE_COUNTER(field, json_key, metric, help) std::atomic<uint64_t> field{0};
  ENGRAM_GATHER_COUNTERS(ENGRAM_TABLE_COUNTER)
#undef ENGRAM_TABLE_COUNTER
  std::atomic<double> hit_rate{1.0};
  // Measured thread time per planned read (recent batches): the scheduler's cost estimate.
  std::atomic<double> ns_per_read{kInitialNsPerRead};
  std::atomic<bool> nowait_enabled{true};
  std::atomic<uint64_t> since_probe{0};
  std::array<std::atomic<uint64_t>, kLatencyBuckets> latency{};
  std::atomic<uint64_t> latency_sum_ns{0};

  ~TableState() {
    for (auto& f : files) {
      if (f->direct_fd >= 0) close(f->direct_fd);
    }
  }
};

class GatherEngineImpl final : public GatherEngine {
 public:
  explicit GatherEngineImpl(const GatherEngineOptions& options)
      : options_(options),
        planner_(
            PlannerOptions{.merge = options.merge_reads, .max_batch_rows = options.max_batch_rows}),
        direct_planner_(PlannerOptions{.merge = options.merge_reads,
                                       .max_batch_rows = options.max_batch_rows,
                                       .page_bytes = kDirectIoAlignBytes}) {
    reader_shared_.enter_fault = options.uring_enter_fault;
    reader_shared_.notice = options.notice;
    reader_shared_.emulated = options.emulated_device;
  }

  absl::Status Start() {
    if (options_.workers == 0) options_.workers = std::max(1u, std::thread::hardware_concurrency());
    if (options_.ring_entries == 0 || options_.ring_entries > 32768) {
      return absl::InvalidArgumentError(
          absl::StrCat("ring_entries must be in [1, 32768], not ", options_.ring_entries));
    }
    if (options_.blocking_threads == 0) options_.blocking_threads = 1;
    if (options_.split_reads == 0) options_.split_reads = 1;
    if (options_.worker_spin_ns == GatherEngineOptions::kAutoSpin) {
      options_.worker_spin_ns = DefaultWorkerSpinNs(std::thread::hardware_concurrency());
    }
    workers_ = std::make_unique<ThreadPool>(options_.workers, options_.worker_spin_ns,
                                            [this] { return MakeContext(true); });
    return absl::OkStatus();
  }

  ~GatherEngineImpl() override {
    workers_.reset();  // runs what was submitted
    pool_.reset();
  }

  absl::Status AddTable(const Table* table, const TableGatherOptions& options) override {
    if (table == nullptr) return absl::InvalidArgumentError("AddTable: no table");
    auto state = std::make_unique<TableState>();
    state->table = table;
    state->options = options;
    for (const TableFile& tf : table->files()) {
      auto f = std::make_unique<GatherFile>();
      f->file = &tf;
      f->fd = tf.fd;
      // Stops the kernel from reading 128 KiB ahead of every 264-byte row.
      posix_fadvise(tf.fd, 0, 0, POSIX_FADV_RANDOM);
      if (options.mode == ReadMode::kDirect) {
        f->direct_fd = open(tf.path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (f->direct_fd < 0) {
          return absl::ErrnoToStatus(
              errno,
              absl::StrCat("opening ", tf.path, " with O_DIRECT for table ", table->Describe()));
        }
      }
      state->files.push_back(std::move(f));
    }
    std::unique_lock<std::shared_mutex> l(tables_mu_);
    if (tables_.contains(table)) {
      return absl::AlreadyExistsError(
          absl::StrCat("table ", table->Describe(), " was already added to the gather engine"));
    }
    {
      std::lock_guard<std::mutex> fl(files_mu_);
      // A fixed-file slot for `fd`: a freed one, or a new one while under the limit.
      auto slot_for = [&](int fd) {
        for (size_t i = 0; i < fixed_fds_.size(); ++i) {
          if (fixed_fds_[i] == -1) {
            fixed_fds_[i] = fd;
            fixed_versions_[i] = ++fixed_version_counter_;
            return static_cast<int>(i);
          }
        }
        if (fixed_fds_.size() >= options_.max_fixed_files) return -1;
        fixed_fds_.push_back(fd);
        fixed_versions_.push_back(++fixed_version_counter_);
        return static_cast<int>(fixed_fds_.size() - 1);
      };
      for (auto& f : state->files) {
        f->fixed_index = slot_for(f->fd);
        if (f->direct_fd >= 0) f->direct_fixed_index = slot_for(f->direct_fd);
      }
      files_generation_.fetch_add(1, std::memory_order_release);
    }
    tables_.emplace(table, std::move(state));
    return absl::OkStatus();
  }

  absl::Status RemoveTable(const Table* table) override {
    std::unique_ptr<TableState> state;
    {
      std::unique_lock<std::shared_mutex> l(tables_mu_);
      auto it = tables_.find(table);
      if (it == tables_.end()) {
        return absl::NotFoundError(
            absl::StrCat("table ", table == nullptr ? std::string("(null)") : table->Describe(),
                         " is not in the gather engine"));
      }
      state = std::move(it->second);
      tables_.erase(it);
      std::lock_guard<std::mutex> fl(files_mu_);
      for (auto& f : state->files) {
        for (int i : {f->fixed_index, f->direct_fixed_index}) {
          if (i < 0) continue;
          fixed_fds_[i] = -1;
          fixed_versions_[i] = ++fixed_version_counter_;
        }
      }
      files_generation_.fetch_add(1, std::memory_order_release);
    }
    return absl::OkStatus();  // `state` closes the O_DIRECT fds here
  }

  absl::Status Gather(const GatherBatch& batch) override {
    std::unique_ptr<ReaderContext> ctx = AcquireContext();
    absl::Status s = RunBatch(batch, *ctx);
    ReleaseContext(std::move(ctx));
    return s;
  }

  void Submit(const GatherBatch& batch, Done done) override {
    workers_->Post([this, batch, done = std::move(done)](ReaderContext& ctx) mutable {
      absl::Status s = RunBatch(batch, ctx);
      std::move(done)(std::move(s));
    });
  }

  std::vector<TableGatherStats> Stats() const override {
    std::shared_lock<std::shared_mutex> l(tables_mu_);
    std::vector<TableGatherStats> out;
    for (const auto& [table, ts] : tables_) {
      TableGatherStats s;
      s.layer_id = table->layer_id();
#define ENGRAM_LOAD_COUNTER(field, json_key, metric, help) s.field = ts->field.load();
      ENGRAM_GATHER_COUNTERS(ENGRAM_LOAD_COUNTER)
#undef ENGRAM_LOAD_COUNTER
      s.nowait_supported = true;
      for (const auto& f : ts->files) {
        if (!f->nowait_ok.load()) s.nowait_supported = false;
      }
      s.nowait_enabled = ts->nowait_enabled.load() && s.nowait_supported &&
                         options_.nowait_pass != NowaitPass::kOff;
      s.recent_hit_rate = ts->hit_rate.load();
      s.mode = ts->options.mode;
      const bool uring = options_.use_io_uring && ring_works_.load();
      s.residue_path = absl::StrCat(ts->options.mode == ReadMode::kDirect ? "O_DIRECT " : "",
                                    uring ? "io_uring" : "blocking pool");
      if (const uint32_t given_up = reader_shared_.rings_given_up.load(); uring && given_up > 0) {
        absl::StrAppend(&s.residue_path, " (", given_up,
                        " thread(s) on blocking reads after their rings kept failing)");
      }
      s.latency_buckets.resize(kLatencyBuckets);
      for (size_t i = 0; i < kLatencyBuckets; ++i) s.latency_buckets[i] = ts->latency[i].load();
      s.latency_sum_ns = ts->latency_sum_ns.load();
      out.push_back(std::move(s));
    }
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.layer_id < b.layer_id; });
    return out;
  }

 private:
  std::unique_ptr<ReaderContext> MakeContext(bool want_ring) {
    auto ctx = std::make_unique<ReaderContext>(&reader_shared_);
    ctx->direct_bounce_target = options_.direct_bounce_bytes;
    ctx->want_fixed_buffers = options_.register_direct_buffers;
    if (want_ring && options_.use_io_uring) {
      absl::Status s = ctx->InitRing(options_.ring_entries, options_.max_fixed_files);
      if (!s.ok()) {
        ring_works_.store(false);
        if (!uring_notice_sent_.exchange(true) && options_.notice) {
          options_.notice(absl::StrCat("io_uring is unavailable (", s.message(),
                                       "): residue reads go to the blocking pool"));
        }
      }
    }
    return ctx;
  }

  std::unique_ptr<ReaderContext> AcquireContext() {
    {
      std::lock_guard<std::mutex> l(ctx_mu_);
      if (!free_contexts_.empty()) {
        auto ctx = std::move(free_contexts_.back());
        free_contexts_.pop_back();
        return ctx;
      }
    }
    return MakeContext(true);
  }

  void ReleaseContext(std::unique_ptr<ReaderContext> ctx) {
    std::lock_guard<std::mutex> l(ctx_mu_);
    free_contexts_.push_back(std::move(ctx));
  }

  void SyncFiles(ReaderContext& ctx) {
    if (!ctx.has_ring()) return;
    const uint64_t gen = files_generation_.load(std::memory_order_acquire);
    if (ctx.fixed_generation() == gen) return;
    std::lock_guard<std::mutex> l(files_mu_);
    ctx.SyncFixedFiles(fixed_fds_, fixed_versions_, files_generation_.load());
  }

  ThreadPool* BlockingPool() {
    std::call_once(pool_once_, [this] {
      pool_ = std::make_unique<ThreadPool>(options_.blocking_threads, /*spin_ns=*/0,
                                           [this] { return MakeContext(false); });
    });
    return pool_.get();
  }

  TableState* Lookup(const Table* table) const {
    std::shared_lock<std::shared_mutex> l(tables_mu_);
    auto it = tables_.find(table);
    return it == tables_.end() ? nullptr : it->second.get();
  }

  // Finishes `residue` with blocking reads, shared with the blocking pool when there are many.
  absl::Status BlockingResidue(const ReadTarget& t, const std::vector<PendingRead>& residue,
                               ReaderContext& ctx, ReadCounters& c) {
    if (residue.size() <= kPoolTaskReads) {
      for (const PendingRead& p : residue) {
        if (absl::Status s = BlockingRead(t, p, c); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    ThreadPool* pool = BlockingPool();
    const size_t tasks = (residue.size() + kPoolTaskReads - 1) / kPoolTaskReads;
    std::mutex mu;
    absl::Status first_error;
    ParallelFor(pool, tasks, pool->size(), ctx, [&](size_t i, ReaderContext&) {
      ReadCounters local;
      absl::Status s;
      const size_t end = std::min(residue.size(), (i + 1) * kPoolTaskReads);
      for (size_t k = i * kPoolTaskReads; k < end && s.ok(); ++k)
        s = BlockingRead(t, residue[k], local);
      std::lock_guard<std::mutex> l(mu);
      c.Add(local);
      if (!s.ok() && first_error.ok()) first_error = std::move(s);
    });
    return first_error;
  }

  struct Schedule {
    size_t chunks = 1;
    size_t helpers = 0;
  };

  // What the threads working on one batch share.
  struct BatchRun {
    TableState* ts = nullptr;
    GatherPlan* plan = nullptr;
    ReadTarget target;
    size_t nowait_limit = 0;  // reads of each range's front tried with NOWAIT (SIZE_MAX: all)
    bool first_wave = true;   // whether a long NOWAIT range starts with a wave of probe_reads
    // Per unique row: bit 0 = a NOWAIT read of it was tried, bit 1 = one would have blocked.
    std::unique_ptr<std::atomic<uint8_t>[]> marks;
    std::atomic<uint64_t> range_ns{0};       // thread time spent on the batch's reads
    std::atomic<uint64_t> nowait_misses{0};  // NOWAIT reads that would have blocked
    std::mutex mu;
    absl::Status first_error;
    ReadCounters total;
  };

  absl::Status RunBatch(const GatherBatch& batch, ReaderContext& ctx) {
    const uint64_t t0 = NowNs();
    active_batches_.fetch_add(1, std::memory_order_relaxed);
    struct Leave {
      std::atomic<uint32_t>& n;
      ~Leave() { n.fetch_sub(1, std::memory_order_relaxed); }
    } leave{active_batches_};
    TableState* ts = batch.table == nullptr ? nullptr : Lookup(batch.table);
    if (ts == nullptr) {
      return absl::FailedPreconditionError(
          batch.table == nullptr ? std::string("gather batch names no table")
                                 : absl::StrCat("table ", batch.table->Describe(),
                                                " was not added to the gather engine"));
    }
    // The caller's plan; helper threads reach it through this reference, not their own copy.
    thread_local GatherPlan thread_plan;
    const GatherPlanner& planner =
        ts->options.mode == ReadMode::kDirect ? direct_planner_ : planner_;
    if (absl::Status s = planner.Plan(batch, &thread_plan); !s.ok()) {
      ts->errors.fetch_add(1, std::memory_order_relaxed);
      return s;
    }
    SyncFiles(ctx);
    BatchRun run;
    run.ts = ts;
    run.plan = &thread_plan;
    run.target = {.plan = &thread_plan,
                  .files = &ts->files,
                  .read_fn = &options_.read_fn,
                  .notice = &options_.notice};
    run.nowait_limit = NowaitLimit(*ts);
    if (run.nowait_limit > 0) {
      run.marks.reset(new std::atomic<uint8_t>[thread_plan.unique_rows.size()]());
    }
    const size_t num_reads = thread_plan.reads.size();
    const bool probe_only = run.nowait_limit != SIZE_MAX && run.nowait_limit > 0;
    const bool decode = batch.rows.size() <= options_.decode_max_rows;
    const Schedule sched = ScheduleBatch(*ts, num_reads, probe_only, decode);
    size_t begin = 0;
    if (sched.helpers > 0) begin = FirstWave(run, ctx);
    const size_t rest = num_reads - begin;
    const size_t chunks = std::max<size_t>(1, std::min(sched.chunks, rest));
    const size_t per_chunk = (rest + chunks - 1) / chunks;
    // Decode steps run ahead of larger batches: those give up their helpers while one runs.
    std::function<bool()> step_aside;
    if (!decode)
      step_aside = [this] { return decode_batches_.load(std::memory_order_relaxed) > 0; };
    if (decode) decode_batches_.fetch_add(1, std::memory_order_relaxed);
    ParallelFor(
        workers_.get(), chunks, sched.helpers, ctx,
        [&](size_t ci, ReaderContext& cx) {
          const size_t b = begin + ci * per_chunk;
          RunRange(run, b, std::min(num_reads, b + per_chunk), cx);
        },
        step_aside);
    if (decode) decode_batches_.fetch_sub(1, std::memory_order_relaxed);
    if (run.first_error.ok()) {
      for (const SlotCopy& copy : thread_plan.copies) {
        std::memcpy(copy.slot, thread_plan.unique_dest[copy.unique], kRowBytes);
      }
    }
    Account(run, sched, NowNs() - t0);
    return run.first_error;
  }

  // The adaptive policy: the NOWAIT pass runs while the table's recent hit rate is high;
  // otherwise every probe_interval-th batch tries a few reads with it. Returns how many reads of
  // each range's front are tried with NOWAIT (SIZE_MAX: all, 0: none).
  size_t NowaitLimit(TableState& ts) {
    bool any_nowait_file = false;
    for (const auto& f : ts.files) any_nowait_file |= f->nowait_ok.load(std::memory_order_relaxed);
    if (ts.options.mode != ReadMode::kBuffered || options_.nowait_pass == NowaitPass::kOff ||
        !any_nowait_file) {
      return 0;
    }
    if (ts.nowait_enabled.load(std::memory_order_relaxed)) return SIZE_MAX;
    if (ts.since_probe.fetch_add(1, std::memory_order_relaxed) + 1 < options_.probe_interval) {
      return 0;
    }
    ts.since_probe.store(0, std::memory_order_relaxed);
    ts.probes.fetch_add(1, std::memory_order_relaxed);
    return options_.probe_reads;
  }

  // Before a batch fans out, its caller reads the first probe_reads reads (the first wave) on its
  // own: when the cache went cold since the policy last looked, most of them miss and no thread
  // tries the NOWAIT pass on the rest, so a sudden eviction costs one wave of misses per batch,
  // not one per chunk (a NOWAIT miss still starts the device read: tens of µs of CPU). Returns
  // where the rest of the batch starts.
  size_t FirstWave(BatchRun& run, ReaderContext& ctx) {
    const size_t wave = options_.probe_reads;
    if (run.nowait_limit != SIZE_MAX || wave == 0 || run.plan->reads.size() <= 2 * wave) return 0;
    RunRange(run, 0, wave, ctx);
    const uint64_t misses = run.nowait_misses.load(std::memory_order_relaxed);
    run.first_wave = false;  // the rest of the batch follows this wave's verdict
    if (static_cast<double>(wave - std::min<uint64_t>(wave, misses)) <
        options_.nowait_min_hit_rate * static_cast<double>(wave)) {
      run.nowait_limit = 0;
    }
    return wave;
  }

  // Reads [b, e) of the batch's plan on the thread owning `cx`.
  void RunRange(BatchRun& run, size_t b, size_t e, ReaderContext& cx) {
    const uint64_t start = NowNs();
    SyncFiles(cx);
    ReadCounters c;
    absl::Status s;
    thread_local std::vector<PendingRead> input, residue;
    input.clear();
    residue.clear();
    if (run.ts->options.mode == ReadMode::kDirect) {
      for (size_t r = b; r < e; ++r) input.push_back({static_cast<uint32_t>(r), 0});
      s = DirectPass(cx, run.target, input, c);
    } else {
      const size_t nowait_end = NowaitRange(run, b, e, cx, input, residue, c, s);
      for (size_t r = nowait_end; r < e; ++r) residue.push_back({static_cast<uint32_t>(r), 0});
      if (s.ok() && !residue.empty()) {
        s = cx.has_ring() ? UringPass(cx, run.target, residue, /*nowait=*/false, nullptr, c)
                          : BlockingResidue(run.target, residue, cx, c);
      }
    }
    run.range_ns.fetch_add(NowNs() - start, std::memory_order_relaxed);
    std::lock_guard<std::mutex> l(run.mu);
    run.total.Add(c);
    if (!s.ok() && run.first_error.ok()) run.first_error = std::move(s);
  }

  // The NOWAIT pass over the front of [b, e): reads that would block go to `residue`. Returns
  // where the reads not tried start.
  size_t NowaitRange(BatchRun& run, size_t b, size_t e, ReaderContext& cx,
                     std::vector<PendingRead>& input, std::vector<PendingRead>& residue,
                     ReadCounters& c, absl::Status& s) {
    size_t nowait_end = run.nowait_limit == SIZE_MAX ? e : std::min(e, b + run.nowait_limit);
    if (nowait_end <= b) return b;
    const bool uring_nowait =
        cx.has_ring() && (options_.nowait_pass == NowaitPass::kUring ||
                          (options_.nowait_pass == NowaitPass::kAuto && !options_.read_fn));
    // Tries reads [from, to) with RWF_NOWAIT; returns how many would have blocked.
    auto try_range = [&](size_t from, size_t to) -> size_t {
      input.clear();
      for (size_t r = from; r < to; ++r) input.push_back({static_cast<uint32_t>(r), 0});
      const size_t before = residue.size();
      s = uring_nowait ? UringPass(cx, run.target, input, /*nowait=*/true, &residue, c)
                       : NowaitPassSerial(run.target, input, residue, c);
      for (size_t r = from; r < to && s.ok(); ++r) MarkRows(*run.plan, r, 1, run.marks.get());
      for (size_t k = before; k < residue.size(); ++k) {
        MarkRows(*run.plan, residue[k].read, 2, run.marks.get());
      }
      run.nowait_misses.fetch_add(residue.size() - before, std::memory_order_relaxed);
      return residue.size() - before;
    };
    // A long pass on one thread starts with a first wave, with the same purpose as FirstWave.
    size_t first_end = nowait_end;
    if (run.first_wave && run.nowait_limit == SIZE_MAX && options_.probe_reads > 0 &&
        e - b > 2 * size_t{options_.probe_reads}) {
      first_end = b + options_.probe_reads;
    }
    const size_t misses = try_range(b, first_end);
    const size_t tried = first_end - b;
    if (s.ok() && first_end < nowait_end) {
      if (static_cast<double>(tried - misses) >= options_.nowait_min_hit_rate * tried) {
        try_range(first_end, nowait_end);
      } else {
        nowait_end = first_end;
      }
    }
    return nowait_end;
  }

  // The batch's statistics, the NOWAIT policy's input and the scheduler's cost estimate.
  void Account(BatchRun& run, const Schedule& sched, uint64_t ns) {
    TableState* ts = run.ts;
    const GatherPlan& plan = *run.plan;
    const size_t num_reads = plan.reads.size();
    if (num_reads > 0 && run.first_error.ok()) {
      // Thread time per read, so that fanning out does not hide the cost.
      const double sample = static_cast<double>(run.range_ns.load()) / num_reads;
      const double old = ts->ns_per_read.load(std::memory_order_relaxed);
      ts->ns_per_read.store(old + 0.25 * (sample - old), std::memory_order_relaxed);
    }
    uint64_t hits = 0, eagain = 0;
    if (run.marks != nullptr) {
      for (size_t i = 0; i < plan.unique_rows.size(); ++i) {
        const uint8_t m = run.marks[i].load(std::memory_order_relaxed);
        if (m == 1) ++hits;
        if (m & 2) ++eagain;
      }
      UpdateHitRate(*ts, hits, eagain);
    }
    ts->batches.fetch_add(1, std::memory_order_relaxed);
    ts->rows_requested.fetch_add(plan.rows_requested, std::memory_order_relaxed);
    ts->rows_unique.fetch_add(plan.unique_rows.size(), std::memory_order_relaxed);
    ts->dedup_copies.fetch_add(plan.copies.size(), std::memory_order_relaxed);
    ts->nowait_hits.fetch_add(hits, std::memory_order_relaxed);
    ts->nowait_eagain.fetch_add(eagain, std::memory_order_relaxed);
    if (sched.helpers > 0) {
      ts->fanout_batches.fetch_add(1, std::memory_order_relaxed);
      ts->helper_tasks.fetch_add(sched.helpers, std::memory_order_relaxed);
    }
#define ENGRAM_ADD_READER_COUNTER(field, json_key, metric, help) \
  ts->field.fetch_add(run.total.field, std::memory_order_relaxed);
    ENGRAM_GATHER_READER_COUNTERS(ENGRAM_ADD_READER_COUNTER)
#undef ENGRAM_ADD_READER_COUNTER
    if (!run.first_error.ok()) ts->errors.fetch_add(1, std::memory_order_relaxed);
    ts->latency[Log2BucketOf(ns, kLatencyBuckets)].fetch_add(1, std::memory_order_relaxed);
    ts->latency_sum_ns.fetch_add(ns, std::memory_order_relaxed);
  }

  void UpdateHitRate(TableState& ts, uint64_t hits, uint64_t eagain) {
    const uint64_t tried = hits + eagain;
    if (tried == 0) return;
    const double rate = static_cast<double>(hits) / tried;
    // A few reads move the rate a little, a wave of them decisively.
    const double w = static_cast<double>(tried) / (tried + 8.0);
    const double old = ts.hit_rate.load(std::memory_order_relaxed);
    const double now = old + w * (rate - old);
    ts.hit_rate.store(now, std::memory_order_relaxed);
    ts.nowait_enabled.store(now >= options_.nowait_min_hit_rate, std::memory_order_relaxed);
  }

  // How a batch of `num_reads` planned reads is run: on the calling thread alone unless its
  // estimated work (reads x the table's measured time per read) gives every helper at least
  // helper_min_work_ns, and with no more helpers than the batch's share of the workers while
  // other batches run (independent requests run side by side instead of each fanning out over
  // every worker; a decode step counts only the other decode steps).
  Schedule ScheduleBatch(const TableState& ts, size_t num_reads, bool probe_only,
                         bool decode) const {
    Schedule out;
    const size_t workers = workers_->size();
    if (probe_only || workers == 0 || num_reads <= options_.split_reads) return out;
    const double work_ns = static_cast<double>(num_reads) * ts.ns_per_read.load();
    const size_t worth =
        static_cast<size_t>(work_ns / std::max<double>(1.0, options_.helper_min_work_ns));
    // A decode step shares the workers with the other decode steps only: larger batches step
    // aside while it runs.
    const size_t active =
        decode ? decode_batches_.load(std::memory_order_relaxed) + 1
               : std::max<uint32_t>(1, active_batches_.load(std::memory_order_relaxed));
    // Every running batch's calling thread takes one of the workers + 1 threads' worth of cores.
    const size_t threads = (workers + 1) / active;
    const size_t share = threads > 0 ? threads - 1 : 0;
    const size_t max_chunks = (num_reads + options_.split_reads / 2 - 1) /
                              std::max<uint32_t>(1, options_.split_reads / 2);
    out.helpers = std::min({worth > 0 ? worth - 1 : 0, share, max_chunks - 1});
    if (ts.options.mode == ReadMode::kDirect) {
      out.helpers = std::min<size_t>(out.helpers, options_.direct_max_helpers);
    }
    if (out.helpers == 0) return out;
    out.chunks = std::min(max_chunks, (out.helpers + 1) * 4);
    return out;
  }

  static void MarkRows(const GatherPlan& plan, size_t read, uint8_t bit,
                       std::atomic<uint8_t>* marks) {
    if (marks == nullptr) return;
    const PlannedRead& rd = plan.reads[read];
    for (uint32_t k = 0; k < rd.iov_count; ++k) {
      const uint32_t u = plan.iov_unique[rd.iov_begin + k];
      if (u != kGapIov) marks[u].fetch_or(bit, std::memory_order_relaxed);
    }
  }

  GatherEngineOptions options_;
  // Buffered reads merge by the kernel's page (the page cache's unit); O_DIRECT reads by the
  // device's block, so a row read directly is one 4 KiB block on any kernel.
  GatherPlanner planner_;
  GatherPlanner direct_planner_;
  ReaderShared reader_shared_;  // every ReaderContext points here: declared before the pools
  std::unique_ptr<ThreadPool> workers_;
  std::once_flag pool_once_;
  std::unique_ptr<ThreadPool> pool_;

  mutable std::shared_mutex tables_mu_;
  std::unordered_map<const Table*, std::unique_ptr<TableState>> tables_;

  std::mutex files_mu_;
  std::vector<int> fixed_fds_;  // fixed-file slot -> fd, -1 when free
  std::vector<uint64_t> fixed_versions_;
  uint64_t fixed_version_counter_ = 0;
  std::atomic<uint64_t> files_generation_{0};

  std::mutex ctx_mu_;
  std::vector<std::unique_ptr<ReaderContext>> free_contexts_;

  std::atomic<uint32_t> active_batches_{0};  // RunBatch calls in progress
  std::atomic<uint32_t> decode_batches_{0};  // of those, decode steps reading their rows
  std::atomic<bool> ring_works_{true};
  std::atomic<bool> uring_notice_sent_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<GatherEngine>> GatherEngine::Create(
    const GatherEngineOptions& options) {
  auto engine = std::make_unique<GatherEngineImpl>(options);
  if (absl::Status s = engine->Start(); !s.ok()) return s;
  return std::unique_ptr<GatherEngine>(std::move(engine));
}

}  // namespace engram
