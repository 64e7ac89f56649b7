// engram-miss-cpu: the CPU engramd's miss path spends per missed row of a cache-tier table,
// side by side with a plain io_uring O_DIRECT loop reading the same pages.
//
//   engram-miss-cpu --dir /nvme/tmp --rows 400000 --batch 768 --batches 400 --rounds 4
//
// Both read a paged packed table (one 4 KiB page a row) written into --dir. Each batch is
// `--batch` distinct random rows, the same rows for both contenders:
//   engramd   RowStore::Gather on the table served from the cache tier with a small row cache
//             (so nearly every row misses): lookups, the miss queue, the gather engine's O_DIRECT
//             pass (registered bounce buffer and files, batched submission), the copy to the
//             destination and the cache inserts; the engine's workers count too;
//   plain     one io_uring ring with the table's O_DIRECT fd registered and one registered
//             buffer, each batch's pages submitted with one io_uring_enter, waited for, and each
//             row's 264 bytes copied out.
// Rounds alternate (engramd, plain, engramd, plain, ...) so that both see the same device and
// host state. CPU is the process's (CLOCK_PROCESS_CPUTIME_ID) over each phase, divided by the
// rows that went to the device (engramd: the cache's misses). Reports per contender CPU per row,
// batch wall time p50/p99, and the ratio engramd / plain (the target is at most 1.5).
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "base/clock.h"
#include "bench/common/row_ids.h"
#include "bench/common/stats.h"
#include "bench/store/paged_cache_store.h"
#include "gather/gather_engine.h"
#include "store/row_store.h"
#include "tables/packed_format.h"
#include "tables/table.h"

namespace engram {
namespace {

using bench::PagedCacheStore;
using bench::Quantile;

uint64_t ProcessCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

struct Phase {
  uint64_t cpu_ns = 0;
  uint64_t rows = 0;  // rows that went to the device
  std::vector<uint64_t> batch_ns;
};

// The plain loop: registered file and buffer, a batch's pages in one submission.
class PlainLoop {
 public:
  absl::Status Init(const Table& table, uint32_t max_batch) {
    const TableFile& f = table.files()[0];
    part_ = table.parts()[0];
    fd_ = ::open(f.path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd_ < 0) return absl::ErrnoToStatus(errno, "O_DIRECT open of " + f.path);
    if (int r = io_uring_queue_init(std::max<uint32_t>(max_batch, 64), &ring_, 0); r < 0) {
      return absl::ErrnoToStatus(-r, "io_uring_queue_init");
    }
    if (int r = io_uring_register_files(&ring_, &fd_, 1); r < 0) {
      return absl::ErrnoToStatus(-r, "io_uring_register_files");
    }
    buf_bytes_ = size_t{max_batch} * 4096;
    buf_ = static_cast<uint8_t*>(std::aligned_alloc(4096, buf_bytes_));
    iovec v{buf_, buf_bytes_};
    if (int r = io_uring_register_buffers(&ring_, &v, 1); r < 0) {
      return absl::ErrnoToStatus(-r, "io_uring_register_buffers");
    }
    return absl::OkStatus();
  }
  // Reads the page of each row (one read a page, as engramd's planner makes them) into the
  // buffer and copies each row to dest.
  absl::Status Read(const std::vector<uint64_t>& rows, uint8_t* dest) {
    pages_.clear();
    for (uint64_t r : rows) pages_.push_back(part_.FileOffset(r) / 4096 * 4096);
    std::sort(pages_.begin(), pages_.end());
    pages_.erase(std::unique(pages_.begin(), pages_.end()), pages_.end());
    for (size_t i = 0; i < pages_.size(); ++i) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_read_fixed(sqe, 0, buf_ + i * 4096, 4096, pages_[i], 0);
      sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, i);
    }
    size_t done = 0;
    io_uring_submit_and_wait(&ring_, static_cast<unsigned>(pages_.size()));
    while (done < pages_.size()) {
      io_uring_cqe* cqe;
      if (int r = io_uring_wait_cqe(&ring_, &cqe); r < 0) return absl::ErrnoToStatus(-r, "wait");
      if (cqe->res != 4096) return absl::DataLossError("short O_DIRECT read");
      io_uring_cqe_seen(&ring_, cqe);
      ++done;
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      const uint64_t off = part_.FileOffset(rows[i]);
      const size_t p =
          std::lower_bound(pages_.begin(), pages_.end(), off / 4096 * 4096) - pages_.begin();
      std::memcpy(dest + i * kRowBytes, buf_ + p * 4096 + off % 4096, kRowBytes);
    }
    return absl::OkStatus();
  }
  ~PlainLoop() {
    if (buf_ != nullptr) {
      io_uring_queue_exit(&ring_);
      std::free(buf_);
    }
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  RowPart part_;
  int fd_ = -1;
  io_uring ring_{};
  uint8_t* buf_ = nullptr;
  size_t buf_bytes_ = 0;
  std::vector<uint64_t> pages_;
};

struct Options {
  std::string dir = "/var/tmp";
  uint64_t rows = 400'000, batch = 768, batches = 300, rounds = 4, seed = 1;
  uint32_t workers = 0, depth = 64;
};

// The contenders and the table they read.
struct Bench {
  PagedCacheStore paged;
  RowStore* store = nullptr;
  PlainLoop plain;
};

// A synthetic checkpoint packed paged in --dir, served from the cache tier with a small cache
// (nearly every row misses), and the plain loop on the same file.
absl::Status SetUp(const Options& o, Bench& b) {
  StoreConfig config;
  config.cache_bytes = 4ull << 20;  // a few thousand rows
  config.miss_depth = o.depth;
  if (absl::Status s = b.paged.Open(o.dir, "engram-miss-cpu", o.rows, o.workers, config); !s.ok()) {
    return s;
  }
  b.store = b.paged.store.get();
  return b.plain.Init(*b.paged.table(), static_cast<uint32_t>(o.batch));
}

// `batches` batches of `batch` distinct random rows.
std::vector<std::vector<uint64_t>> MakeBatches(const Options& o, std::mt19937_64& rng) {
  std::vector<std::vector<uint64_t>> out(o.batches);
  for (auto& b : out) b = bench::DistinctRows(rng, o.rows, o.batch);
  return out;
}

// One phase: every batch through `read`; CPU of the whole process over it.
template <typename Read>
absl::Status RunPhase(const std::vector<std::vector<uint64_t>>& batches, Read&& read, Phase& p) {
  const uint64_t cpu0 = ProcessCpuNs();
  for (const auto& b : batches) {
    const uint64_t t0 = NowNs();
    absl::Status s = read(b);
    p.batch_ns.push_back(NowNs() - t0);
    if (!s.ok()) return s;
  }
  p.cpu_ns += ProcessCpuNs() - cpu0;
  return absl::OkStatus();
}

double PerRow(const Phase& p) { return double(p.cpu_ns) / double(std::max<uint64_t>(1, p.rows)); }

void Report(const Phase& e, const Phase& p, const std::vector<double>& ratios, const Bench& b) {
  std::printf("\n%-8s %14s %12s %14s %14s\n", "", "cpu us/row", "rows", "batch p50 us",
              "batch p99 us");
  for (const auto& [name, ph] : {std::pair<const char*, const Phase*>{"engramd", &e},
                                 std::pair<const char*, const Phase*>{"plain", &p}}) {
    std::printf("%-8s %14.2f %12lu %14.1f %14.1f\n", name, PerRow(*ph) / 1e3, ph->rows,
                Quantile(ph->batch_ns, 0.5) / 1e3, Quantile(ph->batch_ns, 0.99) / 1e3);
  }
  std::printf("ratio engramd / plain: %.2f (rounds: min %.2f, max %.2f); target <= 1.5\n",
              PerRow(e) / PerRow(p), *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()));
  const MissQueueStats q = b.store->miss_queue()->Stats();
  std::printf("miss queue: depth %u, %lu rows read, device read rate %.0f rows/s\n", q.depth,
              q.completed_reads, q.read_rate_per_s);
}

int Main(int argc, char** argv) {
  CLI::App app{
      "CPU per missed row: engramd's cache-tier miss path against a plain io_uring "
      "O_DIRECT loop reading the same pages",
      "engram-miss-cpu"};
  Options o;
  app.add_option("--dir", o.dir, "Where the paged table is written (the device to measure)")
      ->capture_default_str();
  app.add_option("--rows", o.rows, "Rows of the table")->capture_default_str();
  app.add_option("--batch", o.batch, "Rows a batch (a decode step's misses)")
      ->capture_default_str();
  app.add_option("--batches", o.batches, "Batches a phase")->capture_default_str();
  app.add_option("--rounds", o.rounds, "Rounds of (engramd, plain)")->capture_default_str();
  app.add_option("--workers", o.workers, "Gather engine workers (0: online CPUs, as engramd)")
      ->capture_default_str();
  app.add_option("--depth", o.depth, "miss_depth of engramd's miss queue")->capture_default_str();
  app.add_option("--seed", o.seed, "Row ids' random seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.batch == 0 || o.batch > 4096 || o.rows < o.batch * 4 || o.rounds == 0) {
    std::fprintf(stderr,
                 "engram-miss-cpu: --batch must be 1..4096, --rows at least 4x it and "
                 "--rounds at least 1\n");
    return 2;
  }
  Bench b;
  if (absl::Status s = SetUp(o, b); !s.ok()) {
    std::fprintf(stderr, "engram-miss-cpu: %s\n", s.ToString().c_str());
    return 1;
  }
  const Table* table = b.paged.table();
  std::mt19937_64 rng(o.seed);
  std::vector<uint8_t> dest(o.batch * kRowBytes);
  Phase all_e, all_p;
  std::vector<double> ratios;
  for (uint64_t round = 0; round < o.rounds; ++round) {
    const auto batches = MakeBatches(o, rng);  // the same batches for both
    Phase e, p;
    const uint64_t misses_before = b.store->cache()->Stats().misses;
    absl::Status s = RunPhase(
        batches,
        [&](const std::vector<uint64_t>& rows) {
          return b.store->Gather({.table = table, .rows = rows, .dest = dest.data()});
        },
        e);
    e.rows = b.store->cache()->Stats().misses - misses_before;
    if (s.ok()) {
      s = RunPhase(
          batches,
          [&](const std::vector<uint64_t>& rows) {
            p.rows += rows.size();
            return b.plain.Read(rows, dest.data());
          },
          p);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "engram-miss-cpu: %s\n", s.ToString().c_str());
      return 1;
    }
    ratios.push_back(PerRow(e) / PerRow(p));
    std::printf(
        "round %lu: engramd %.2f us/row (%lu misses), plain %.2f us/row (%lu rows), "
        "ratio %.2f\n",
        round, PerRow(e) / 1e3, e.rows, PerRow(p) / 1e3, p.rows, ratios.back());
    for (auto [from, to] : {std::pair{&e, &all_e}, std::pair{&p, &all_p}}) {
      to->cpu_ns += from->cpu_ns;
      to->rows += from->rows;
      to->batch_ns.insert(to->batch_ns.end(), from->batch_ns.begin(), from->batch_ns.end());
    }
  }
  Report(all_e, all_p, ratios, b);
  return 0;
}

}  // namespace
}  // namespace engram

int main(int argc, char** argv) { return engram::Main(argc, argv); }
