// engram-ranks' tables: the synthetic tables written and opened, a --trace file read, the page
// cache warmed or emptied, and one device read measured.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <unordered_set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/clock.h"
#include "bench/common/stats.h"
#include "bench/daemon/ranks.h"
#include "testkit/gather_test_util.h"
#include "testkit/synthetic.h"

namespace engram::bench::ranks {

absl::StatusOr<StepTrace> ReadStepTrace(const std::string& path, uint64_t rows) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace ", path));
  StepTrace trace;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::array<std::vector<uint64_t>, 2> step;
    std::istringstream groups(line);
    std::string g;
    while (groups >> g) {
      const size_t colon = g.find(':');
      uint32_t layer = 0;
      if (colon == std::string::npos || !absl::SimpleAtoi(g.substr(0, colon), &layer) ||
          (layer != kLayers[0] && layer != kLayers[1])) {
        return absl::InvalidArgumentError(absl::StrCat(path, " line ", n, ": '", g.substr(0, 40),
                                                       "' is not LAYER:ID,... with layer 1 or 14"));
      }
      for (absl::string_view id : absl::StrSplit(g.substr(colon + 1), ',', absl::SkipEmpty())) {
        uint64_t v;
        if (!absl::SimpleAtoi(id, &v) || v >= rows) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, " line ", n, ": row id '", id.substr(0, 24), "' is not in [0, ", rows, ")"));
        }
        step[layer == kLayers[0] ? 0 : 1].push_back(v);
      }
    }
    trace.push_back(std::move(step));
  }
  if (trace.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no steps"));
  return trace;
}

absl::Status PrepareTables(const Config& cfg, std::vector<std::unique_ptr<Table>>* tables,
                           std::vector<std::string>* args) {
  const std::string tag = absl::StrCat(cfg.rows);
  if (cfg.layout == "packed") {
    for (uint32_t layer : kLayers) {
      const std::string path = absl::StrCat(cfg.dir, "/packed-", layer, "-", tag, ".engram");
      auto t = testing::OpenOne(path, layer);
      if (!t.ok()) {
        fprintf(stderr, "writing %s...\n", path.c_str());
        if (absl::Status s = testing::WriteSyntheticPacked(path, layer, cfg.rows, kSeed); !s.ok()) {
          return s;
        }
        t = testing::OpenOne(path, layer);
      }
      if (!t.ok()) return t.status();
      args->insert(args->end(), {"--table", path});
      tables->push_back(std::move(*t));
    }
    return absl::OkStatus();
  }
  if (cfg.layout != "checkpoint") {
    return absl::InvalidArgumentError(
        absl::StrCat("--layout must be checkpoint or packed, not '", cfg.layout, "'"));
  }
  const std::string model = absl::StrCat(cfg.dir, "/model-", tag);
  auto opened = OpenTables(model, {});
  if (!opened.ok() || opened->size() != 2) {
    fprintf(stderr, "writing a synthetic checkpoint of 2 x %" PRIu64 " rows in %s...\n", cfg.rows,
            model.c_str());
    std::error_code ec;
    std::filesystem::remove_all(model, ec);
    absl::Status s = WriteSyntheticCheckpoint(
        {.out_dir = model, .rows = cfg.rows, .seed = kSeed, .layers = {1, 14}});
    if (!s.ok()) return s;
    opened = OpenTables(model, {});
  }
  if (!opened.ok()) return opened.status();
  *tables = std::move(*opened);
  std::sort(tables->begin(), tables->end(),
            [](const auto& a, const auto& b) { return a->layer_id() < b->layer_id(); });
  args->insert(args->end(), {"--model", model});
  return absl::OkStatus();
}

void WarmTables(const std::vector<const Table*>& tables) {
  std::vector<uint8_t> buf(1 << 20);
  for (const Table* t : tables) {
    for (const TableFile& f : t->files()) {
      for (uint64_t off = 0; off < f.size; off += buf.size()) {
        if (pread(f.fd, buf.data(), buf.size(), off) <= 0) break;
      }
    }
  }
}

void EvictRows(const Table& table, const uint64_t* rows, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    for (const RowPart& p : table.parts()) {
      const uint64_t off = p.FileOffset(rows[i]) & ~uint64_t{4095};
      posix_fadvise(table.files()[p.file].fd, off, 4096, POSIX_FADV_DONTNEED);
    }
  }
}

absl::StatusOr<OneRead> MeasureOneRead(const std::vector<const Table*>& tables, uint32_t reads) {
  const TableFile* f = nullptr;
  for (const Table* t : tables) {
    for (const TableFile& tf : t->files()) {
      if (f == nullptr || tf.size > f->size) f = &tf;
    }
  }
  if (f == nullptr || f->size < 4096) return absl::FailedPreconditionError("no table file");
  const int fd = open(f->path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "open ", f->path, " with O_DIRECT: ", strerror(errno), " (--dir must be on a device)"));
  }
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, 4096) != 0) raw = nullptr;
  std::unique_ptr<void, decltype(&free)> buf(raw, &free);
  OneRead r{.reads = reads, .file = f->path};
  std::mt19937_64 rng(99);
  std::vector<uint64_t> ns;
  for (uint32_t i = 0; i < reads && buf != nullptr; ++i) {
    const uint64_t off = rng() % (f->size / 4096) * 4096;
    const uint64_t t0 = NowNs();
    if (pread(fd, buf.get(), 4096, static_cast<off_t>(off)) != 4096) {
      const std::string why = strerror(errno);
      close(fd);
      return absl::DataLossError(
          absl::StrCat("O_DIRECT read of ", f->path, " at ", off, ": ", why));
    }
    ns.push_back(NowNs() - t0);
  }
  close(fd);
  if (buf == nullptr) return absl::ResourceExhaustedError("no aligned buffer");
  r.p50 = Quantile(ns, 0.5);
  r.p99 = Quantile(ns, 0.99);
  return r;
}

uint64_t DistinctRows(const StepTrace& trace) {
  std::unordered_set<uint64_t> keys;
  for (const auto& step : trace) {
    for (int l = 0; l < 2; ++l) {
      for (uint64_t id : step[l]) keys.insert(uint64_t(l) << 56 | id);
    }
  }
  return keys.size();
}

uint64_t TablePagesCached(const std::vector<const Table*>& tables, bool drop, uint64_t* ret_pages) {
  uint64_t cached = 0, pages = 0;
  const long page = sysconf(_SC_PAGESIZE);
  for (const Table* t : tables) {
    for (const TableFile& f : t->files()) {
      if (drop) posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
      void* m = mmap(nullptr, f.size, PROT_READ, MAP_SHARED, f.fd, 0);
      if (m == MAP_FAILED) continue;
      std::vector<unsigned char> vec((f.size + page - 1) / page);
      if (mincore(m, f.size, vec.data()) == 0) {
        for (unsigned char v : vec) cached += v & 1;
      }
      pages += vec.size();
      munmap(m, f.size);
    }
  }
  *ret_pages = pages;
  return cached;
}

}  // namespace engram::bench::ranks
