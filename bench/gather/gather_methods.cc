// The five gather methods of the gather benchmarks; see gather_methods.h.
#include "bench/gather/gather_methods.h"

#include <errno.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"

namespace engram::bench {
namespace {

absl::Status ReadFully(const TableFile& f, uint8_t* dst, uint32_t len, uint64_t off,
                       std::atomic<uint64_t>& calls) {
  uint32_t done = 0;
  while (done < len) {
    iovec v{dst + done, len - done};
    const ssize_t n = preadv(f.fd, &v, 1, off + done);
    calls.fetch_add(1, std::memory_order_relaxed);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat("preadv ", f.path));
    if (n == 0) return absl::DataLossError(absl::StrCat(f.path, " ended at ", off + done));
    done += n;
  }
  return absl::OkStatus();
}

class MmapMethod final : public GatherMethod {
 public:
  ~MmapMethod() override { Detach(); }
  std::string name() const override { return "mmap+memcpy"; }
  absl::Status Attach(const Table& table) override {
    Detach();
    for (const TableFile& f : table.files()) {
      void* p = mmap(nullptr, f.size, PROT_READ, MAP_SHARED, f.fd, 0);
      if (p == MAP_FAILED) return absl::ErrnoToStatus(errno, absl::StrCat("mmap ", f.path));
      // Random rows: no readahead around each fault.
      madvise(p, f.size, MADV_RANDOM);
      maps_.push_back({static_cast<const uint8_t*>(p), f.size});
    }
    return absl::OkStatus();
  }
  void Detach() override {
    for (auto& m : maps_) munmap(const_cast<uint8_t*>(m.first), m.second);
    maps_.clear();
  }
  absl::Status Gather(const Table& table, std::span<const uint64_t> rows, uint8_t* dest) override {
    const auto parts = table.parts();
    for (size_t i = 0; i < rows.size(); ++i) {
      for (const RowPart& p : parts) {
        std::memcpy(dest + i * kRowBytes + p.dest_offset,
                    maps_[p.file].first + p.FileOffset(rows[i]), p.bytes);
      }
    }
    return absl::OkStatus();
  }
  uint64_t syscalls() const override { return 0; }

 private:
  std::vector<std::pair<const uint8_t*, size_t>> maps_;
};

class RecipePoolMethod : public GatherMethod {
 public:
  RecipePoolMethod(int threads, int chunk) : pool_(threads), chunk_(chunk), threads_(threads) {}
  std::string name() const override { return absl::StrCat("preadv pool (", threads_, " thr)"); }
  absl::Status Attach(const Table&) override { return absl::OkStatus(); }
  absl::Status Gather(const Table& table, std::span<const uint64_t> rows, uint8_t* dest) override {
    std::vector<uint32_t> all(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) all[i] = i;
    return PoolRead(table, rows, all, dest);
  }
  uint64_t syscalls() const override { return calls_.load(); }

 protected:
  // Reads rows[idx[k]] for every k with one task per `chunk_` rows.
  absl::Status PoolRead(const Table& table, std::span<const uint64_t> rows,
                        const std::vector<uint32_t>& idx, uint8_t* dest) {
    std::vector<std::function<void()>> tasks;
    std::mutex mu;
    absl::Status first;
    for (size_t b = 0; b < idx.size(); b += chunk_) {
      const size_t e = std::min(idx.size(), b + chunk_);
      tasks.push_back([&, b, e] {
        for (size_t k = b; k < e; ++k) {
          const uint32_t i = idx[k];
          for (const RowPart& p : table.parts()) {
            absl::Status s = ReadFully(table.files()[p.file], dest + i * kRowBytes + p.dest_offset,
                                       p.bytes, p.FileOffset(rows[i]), calls_);
            if (!s.ok()) {
              std::lock_guard<std::mutex> l(mu);
              if (first.ok()) first = s;
            }
          }
        }
      });
    }
    pool_.Run(tasks);
    return first;
  }
  BlockingPool pool_;
  int chunk_;
  int threads_;
  std::atomic<uint64_t> calls_{0};
};

class NowaitPoolMethod final : public RecipePoolMethod {
 public:
  using RecipePoolMethod::RecipePoolMethod;
  std::string name() const override { return "NOWAIT + pool"; }
  absl::Status Gather(const Table& table, std::span<const uint64_t> rows, uint8_t* dest) override {
    std::vector<uint32_t> residue;
    for (size_t i = 0; i < rows.size(); ++i) {
      bool hit = true;
      for (const RowPart& p : table.parts()) {
        iovec v{dest + i * kRowBytes + p.dest_offset, p.bytes};
        ssize_t n;
        do {
          n = preadv2(table.files()[p.file].fd, &v, 1, p.FileOffset(rows[i]), RWF_NOWAIT);
          calls_.fetch_add(1, std::memory_order_relaxed);
        } while (n < 0 && errno == EINTR);
        if (n != static_cast<ssize_t>(p.bytes)) {  // EAGAIN, 0 (a miss on 5.9/5.10) or short
          hit = false;
          break;
        }
      }
      if (!hit) residue.push_back(i);
    }
    if (residue.empty()) return absl::OkStatus();
    return PoolRead(table, rows, residue, dest);
  }
};

class UringOnlyMethod final : public GatherMethod {
 public:
  explicit UringOnlyMethod(uint32_t depth) : depth_(depth) {}
  ~UringOnlyMethod() override {
    if (ok_) io_uring_queue_exit(&ring_);
  }
  std::string name() const override { return "io_uring only"; }
  absl::Status Attach(const Table&) override {
    if (ok_) return absl::OkStatus();
    const int r = io_uring_queue_init(depth_, &ring_, 0);
    if (r < 0) return absl::ErrnoToStatus(-r, "io_uring_queue_init");
    ok_ = true;
    return absl::OkStatus();
  }
  absl::Status Gather(const Table& table, std::span<const uint64_t> rows, uint8_t* dest) override {
    struct Op {
      uint32_t row, part, done;
    };
    const auto parts = table.parts();
    std::vector<Op> ops;
    ops.reserve(rows.size() * parts.size());
    for (uint32_t i = 0; i < rows.size(); ++i) {
      for (uint32_t k = 0; k < parts.size(); ++k) ops.push_back({i, k, 0});
    }
    std::vector<Op> again;
    size_t next = 0;
    uint32_t inflight = 0;
    absl::Status first;
    while (next < ops.size() || !again.empty() || inflight > 0) {
      while (inflight < depth_ && (next < ops.size() || !again.empty())) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) break;
        Op op;
        if (!again.empty()) {
          op = again.back();
          again.pop_back();
        } else {
          op = ops[next++];
        }
        const RowPart& p = parts[op.part];
        io_uring_prep_read(sqe, table.files()[p.file].fd,
                           dest + op.row * kRowBytes + p.dest_offset + op.done, p.bytes - op.done,
                           p.FileOffset(rows[op.row]) + op.done);
        io_uring_sqe_set_data64(sqe, (uint64_t{op.row} << 32) | (op.part << 16) | op.done);
        inflight++;
      }
      const int r = io_uring_submit_and_wait(&ring_, 1);
      calls_++;
      if (r < 0 && r != -EINTR) return absl::ErrnoToStatus(-r, "io_uring_enter");
      unsigned head, seen = 0;
      io_uring_cqe* cqe;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        --inflight;
        const uint64_t d = io_uring_cqe_get_data64(cqe);
        Op op{static_cast<uint32_t>(d >> 32), static_cast<uint32_t>((d >> 16) & 0xFFFF),
              static_cast<uint32_t>(d & 0xFFFF)};
        const uint32_t want = parts[op.part].bytes - op.done;
        if (cqe->res == static_cast<int>(want)) continue;
        if (cqe->res > 0 || cqe->res == -EINTR || cqe->res == -EAGAIN) {
          if (cqe->res > 0) op.done += cqe->res;
          again.push_back(op);
        } else if (first.ok()) {
          first = cqe->res == 0 ? absl::DataLossError("file ended early")
                                : absl::ErrnoToStatus(-cqe->res, "io_uring read");
        }
      }
      io_uring_cq_advance(&ring_, seen);
    }
    return first;
  }
  uint64_t syscalls() const override { return calls_; }

 private:
  uint32_t depth_;
  io_uring ring_{};
  bool ok_ = false;
  uint64_t calls_ = 0;
};

class EngineMethod final : public GatherMethod {
 public:
  EngineMethod(std::string name, const GatherEngineOptions& o, const TableGatherOptions& to)
      : name_(std::move(name)), o_(o), to_(to) {}
  std::string name() const override { return name_; }
  absl::Status Attach(const Table& table) override {
    if (engine_ == nullptr) {
      auto e = GatherEngine::Create(o_);
      if (!e.ok()) return e.status();
      engine_ = std::move(*e);
    }
    if (attached_.insert(&table).second) return engine_->AddTable(&table, to_);
    return absl::OkStatus();
  }
  absl::Status Gather(const Table& table, std::span<const uint64_t> rows, uint8_t* dest) override {
    return engine_->Gather({.table = &table, .rows = rows, .dest = dest});
  }
  uint64_t syscalls() const override {
    uint64_t n = 0;
    for (const auto& s : engine_->Stats()) n += s.syscalls;
    return n;
  }
  GatherEngine* engine() { return engine_.get(); }

 private:
  std::string name_;
  GatherEngineOptions o_;
  TableGatherOptions to_;
  std::unique_ptr<GatherEngine> engine_;
  std::set<const Table*> attached_;
};

}  // namespace

BlockingPool::BlockingPool(int threads) {
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] {
      while (true) {
        std::function<void()>* task;
        {
          std::unique_lock<std::mutex> l(mu_);
          cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
          if (queue_.empty()) return;
          task = queue_.front();
          queue_.pop_front();
        }
        (*task)();
        std::lock_guard<std::mutex> l(mu_);
        if (--outstanding_ == 0) done_cv_.notify_all();
      }
    });
  }
}

BlockingPool::~BlockingPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void BlockingPool::Run(std::vector<std::function<void()>>& tasks) {
  if (tasks.empty()) return;
  std::unique_lock<std::mutex> l(mu_);
  for (auto& t : tasks) queue_.push_back(&t);
  outstanding_ += tasks.size();
  cv_.notify_all();
  done_cv_.wait(l, [&] { return outstanding_ == 0; });
}

std::unique_ptr<GatherMethod> MakeMmapMethod() { return std::make_unique<MmapMethod>(); }
std::unique_ptr<GatherMethod> MakeRecipePoolMethod(int threads, int chunk) {
  return std::make_unique<RecipePoolMethod>(threads, chunk);
}
std::unique_ptr<GatherMethod> MakeNowaitPoolMethod(int threads, int chunk) {
  return std::make_unique<NowaitPoolMethod>(threads, chunk);
}
std::unique_ptr<GatherMethod> MakeUringOnlyMethod(uint32_t depth) {
  return std::make_unique<UringOnlyMethod>(depth);
}
std::unique_ptr<GatherMethod> MakeEngineMethod(const std::string& name,
                                               const GatherEngineOptions& options,
                                               const TableGatherOptions& table_options) {
  return std::make_unique<EngineMethod>(name, options, table_options);
}

}  // namespace engram::bench
