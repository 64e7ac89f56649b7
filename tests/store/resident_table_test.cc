// Tests of ResidentTable: every row of a checkpoint and a packed table byte-exact against the
// synthetic row function, O_DIRECT and buffered (tmpfs) loads, a cancelled load resumed, the
// seals that keep a loaded table immutable, the memory budget, files that change before or
// during a load (refused, never served) and the rate limit across cancel and resume.
#include "store/resident_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

#include "base/page_size.h"
#include "tables/pack.h"
#include "testkit/synthetic.h"
#include "testkit/table_test_util.h"

namespace engram {
namespace {

using Catch::Matchers::Contains;
using testing::TempDir;

constexpr uint64_t kRows = 20011;
constexpr uint64_t kSeed = 5;

std::vector<std::unique_ptr<Table>> Synth(const std::string& dir) {
  SynthOptions options{.out_dir = dir, .rows = kRows, .seed = kSeed};
  REQUIRE(WriteSyntheticCheckpoint(options).ok());
  auto tables = OpenCheckpoint(dir, {});
  REQUIRE(tables.ok());
  return std::move(*tables);
}

void CheckEveryRow(const ResidentTable& rt) {
  uint8_t got[kRowBytes], want[kRowBytes];
  const RowRange covered = rt.covered();
  for (uint64_t r = covered.begin; r < covered.end; ++r) {
    SyntheticRow(kSeed, rt.table().layer_id(), r, want);
    if (!rt.CopyRow(r, got) || std::memcmp(got, want, kRowBytes) != 0) {
      FAIL("layer " << rt.table().layer_id() << " row " << r << " differs");
    }
  }
  REQUIRE_FALSE(rt.CopyRow(covered.end, got));
  if (covered.begin > 0) REQUIRE_FALSE(rt.CopyRow(covered.begin - 1, got));
}

TEST_CASE("a checkpoint table loads byte-exact with O_DIRECT and is sealed", "[resident]") {
  TempDir dir;
  auto tables = Synth(dir.path());
  MemoryBudget budget(0);
  for (const auto& t : tables) {
    auto rt = ResidentTable::Create(*t, &budget, {.chunk_rows = 1000});
    REQUIRE(rt.ok());
    uint64_t calls = 0, last = 0;
    REQUIRE((*rt)
                ->Load(nullptr,
                       [&](uint64_t done, uint64_t total) {
                         ++calls;
                         REQUIRE(done > last);
                         REQUIRE(total == kRows);
                         last = done;
                       })
                .ok());
    REQUIRE(calls == (kRows + 999) / 1000);
    REQUIRE((*rt)->loaded());
    REQUIRE((*rt)->direct_io());  // /tmp or $TMPDIR must take O_DIRECT for this to hold
    CheckEveryRow(**rt);
    // Sealed: neither a write nor a writable mapping of the memfd is possible.
    const int fd = (*rt)->fd();
    REQUIRE(::pwrite(fd, "x", 1, 0) == -1);
    REQUIRE(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
    void* ro = ::mmap(nullptr, (*rt)->bytes(), PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(ro != MAP_FAILED);
    uint8_t want[kRowBytes];
    SyntheticRow(kSeed, t->layer_id(), 777, want);
    REQUIRE(std::memcmp(static_cast<uint8_t*>(ro) + 777 * kRowBytes, want, kRowBytes) == 0);
    ::munmap(ro, (*rt)->bytes());
  }
}

TEST_CASE("a packed per-rank copy loads its covered range", "[resident]") {
  TempDir dir;
  Synth(dir.path());
  PackOptions pack{.input = dir.path(), .layer = 14, .out = dir / "l14.rank.engram"};
  pack.rows = RowRange{4097, 15013};
  REQUIRE(PackTable(pack).ok());
  auto table = OpenPacked(pack.out, {});
  REQUIRE(table.ok());
  auto rt = ResidentTable::Create(**table, nullptr, {.chunk_rows = 999});
  REQUIRE(rt.ok());
  REQUIRE((*rt)->Load(nullptr, nullptr).ok());
  REQUIRE((*rt)->rows_loaded() == 15013 - 4097);
  CheckEveryRow(**rt);
}

TEST_CASE("a paged packed copy loads byte-exact, O_DIRECT and buffered", "[resident]") {
  TempDir dir;
  Synth(dir.path());
  for (bool sparse : {false, true}) {
    PackOptions pack{.input = dir.path(), .layer = 1, .out = dir / "l1.paged.engram"};
    pack.rows = RowRange{4097, 15013};  // starts and ends mid-page
    pack.sparse = sparse;
    pack.paged = true;
    REQUIRE(PackTable(pack).ok());
    auto table = OpenPacked(pack.out, {});
    REQUIRE(table.ok());
    REQUIRE((*table)->parts()[0].paged());
    for (bool direct : {true, false}) {
      INFO((sparse ? "sparse" : "compacted") << (direct ? " O_DIRECT" : " buffered"));
      // 1,000-row chunks: neither a whole number of pages nor page-aligned.
      auto rt = ResidentTable::Create(**table, nullptr, {.direct_io = direct, .chunk_rows = 1000});
      REQUIRE(rt.ok());
      REQUIRE((*rt)->Load(nullptr, nullptr).ok());
      REQUIRE((*rt)->rows_loaded() == 15013 - 4097);
      CheckEveryRow(**rt);
    }
  }
}

TEST_CASE("a buffered load (direct_io off) is byte-exact too", "[resident]") {
  TempDir dir;
  auto tables = Synth(dir.path());
  auto rt = ResidentTable::Create(*tables[0], nullptr, {.direct_io = false, .chunk_rows = 3000});
  REQUIRE(rt.ok());
  REQUIRE((*rt)->Load(nullptr, nullptr).ok());
  REQUIRE_FALSE((*rt)->direct_io());
  CheckEveryRow(**rt);
}

// Run alone (meson test store_resident_table_tmpfs): it exits 77 where no filesystem at hand
// refuses O_DIRECT (tmpfs takes it since Linux 6.6).
TEST_CASE("a filesystem that refuses O_DIRECT loads with buffered reads and a notice", "[tmpfs]") {
  const char* shm = "/dev/shm";
  int probe = std::filesystem::is_directory(shm)
                  ? ::open(shm, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600)
                  : -1;
  if (probe >= 0 || !std::filesystem::is_directory(shm)) {
    if (probe >= 0) ::close(probe);
    std::fprintf(stderr, "SKIP: /dev/shm %s: the buffered fallback cannot be exercised here\n",
                 probe >= 0 ? "takes O_DIRECT (tmpfs, Linux 6.6+)" : "does not exist");
    std::exit(77);
  }
  const char* old = std::getenv("TMPDIR");
  ::setenv("TMPDIR", shm, 1);
  TempDir dir;
  if (old != nullptr)
    ::setenv("TMPDIR", old, 1);
  else
    ::unsetenv("TMPDIR");
  auto tables = Synth(dir.path());
  auto rt = ResidentTable::Create(*tables[0], nullptr, {.chunk_rows = 4096});
  REQUIRE(rt.ok());
  REQUIRE((*rt)->Load(nullptr, nullptr).ok());
  REQUIRE_FALSE((*rt)->direct_io());
  bool noticed = false;
  for (const std::string& n : (*rt)->notices()) noticed |= n.find("O_DIRECT") != std::string::npos;
  REQUIRE(noticed);
  CheckEveryRow(**rt);
}

TEST_CASE("a cancelled load keeps its rows, serves them, and resumes", "[resident]") {
  TempDir dir;
  auto tables = Synth(dir.path());
  const Table& t = *tables[1];
  auto rt = ResidentTable::Create(t, nullptr, {.chunk_rows = 1024});
  REQUIRE(rt.ok());
  std::atomic<bool> cancel{false};
  absl::Status s = (*rt)->Load(&cancel, [&](uint64_t done, uint64_t) {
    if (done >= 5 * 1024) cancel = true;
  });
  REQUIRE(s.code() == absl::StatusCode::kCancelled);
  REQUIRE_THAT(std::string(s.message()), Contains("layer 14") && Contains("5120 of 20011"));
  REQUIRE((*rt)->rows_loaded() == 5 * 1024);
  uint8_t got[kRowBytes], want[kRowBytes];
  SyntheticRow(kSeed, 14, 5119, want);
  REQUIRE((*rt)->CopyRow(5119, got));
  REQUIRE(std::memcmp(got, want, kRowBytes) == 0);
  REQUIRE_FALSE((*rt)->CopyRow(5120, got));
  // Not sealed yet: the rest is still to be written.
  REQUIRE(::fcntl((*rt)->fd(), F_GET_SEALS) == 0);
  cancel = false;
  uint64_t first = 0;
  REQUIRE((*rt)
              ->Load(&cancel,
                     [&](uint64_t done, uint64_t) {
                       if (first == 0) first = done;
                     })
              .ok());
  REQUIRE(first == 6 * 1024);  // resumed after the rows already in, not from row 0
  CheckEveryRow(**rt);
  REQUIRE((::fcntl((*rt)->fd(), F_GET_SEALS) & F_SEAL_FUTURE_WRITE) != 0);
}

TEST_CASE("a resident table takes its bytes from the budget and gives them back", "[resident]") {
  TempDir dir;
  auto tables = Synth(dir.path());
  MemoryBudget small(kRows * kRowBytes / 2);
  auto refused = ResidentTable::Create(*tables[0], &small, {});
  REQUIRE(refused.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE_THAT(std::string(refused.status().message()),
               Contains("layer 1") && Contains("[memory] budget"));
  REQUIRE(small.used() == 0);

  MemoryBudget budget(64ull << 20);
  {
    auto rt = ResidentTable::Create(*tables[0], &budget, {.huge_pages = false});
    REQUIRE(rt.ok());
    REQUIRE(budget.used() == (*rt)->bytes());
    REQUIRE((*rt)->bytes() >= kRows * kRowBytes);
    REQUIRE((*rt)->bytes() < kRows * kRowBytes + KernelPageBytes());
  }
  REQUIRE(budget.used() == 0);
}

TEST_CASE("a table whose file is cut short fails to load naming the file", "[resident]") {
  TempDir dir;
  Synth(dir.path());
  PackOptions pack{.input = dir.path(), .layer = 1, .out = dir / "l1.engram"};
  REQUIRE(PackTable(pack).ok());
  auto table = OpenPacked(pack.out, {});
  REQUIRE(table.ok());
  // Truncated after it was opened and validated (a file changed under the daemon).
  REQUIRE(::truncate(pack.out.c_str(), 1 << 20) == 0);
  auto rt = ResidentTable::Create(**table, nullptr, {.chunk_rows = 4096});
  REQUIRE(rt.ok());
  absl::Status s = (*rt)->Load(nullptr, nullptr);
  REQUIRE(s.code() == absl::StatusCode::kDataLoss);
  REQUIRE_THAT(std::string(s.message()), Contains("l1.engram"));
  REQUIRE((*rt)->rows_loaded() < kRows);
}

// The shard of `layer` in the synthetic checkpoint at `dir`.
std::string Shard(const std::string& dir, uint32_t layer) {
  return dir + "/" +
         SyntheticShardName(SynthOptions{.out_dir = dir, .rows = kRows, .seed = kSeed}, layer);
}

// A refused table serves nothing from memory, is not sealed, and stays refused.
void ExpectRefused(ResidentTable& rt, const absl::Status& s, const std::string& path,
                   const std::string& what) {
  INFO(s.ToString());
  REQUIRE(s.code() == absl::StatusCode::kDataLoss);
  REQUIRE_THAT(std::string(s.message()), Contains(path) && Contains(what) && Contains("layer 14"));
  REQUIRE(rt.rows_loaded() == 0);
  REQUIRE_FALSE(rt.loaded());
  uint8_t got[kRowBytes];
  REQUIRE_FALSE(rt.CopyRow(0, got));
  REQUIRE(rt.refusal() == s);
  REQUIRE(rt.Load(nullptr, nullptr) == s);
}

TEST_CASE("a shard replaced (mv) before the load refuses the table", "[resident]") {
  TempDir dir;
  auto tables = Synth(dir.path());
  auto rt = ResidentTable::Create(*tables[1], nullptr, {.chunk_rows = 4096});
  REQUIRE(rt.ok());
  // A valid shard with other rows takes the validated one's name.
  TempDir other;
  REQUIRE(
      WriteSyntheticCheckpoint({.out_dir = other.path(), .rows = kRows, .seed = kSeed + 1}).ok());
  REQUIRE(::rename(Shard(other.path(), 14).c_str(), Shard(dir.path(), 14).c_str()) == 0);
  const absl::Status s = (*rt)->Load(nullptr, nullptr);
  ExpectRefused(**rt, s, Shard(dir.path(), 14), "was replaced");
}

TEST_CASE("a shard overwritten in the middle of a load refuses the table", "[resident]") {
  TempDir dir;
  auto tables = Synth(dir.path());
  auto rt = ResidentTable::Create(*tables[1], nullptr, {.chunk_rows = 4096});
  REQUIRE(rt.ok());
  const std::string shard = Shard(dir.path(), 14);
  bool written = false;
  const absl::Status s = (*rt)->Load(nullptr, [&](uint64_t done, uint64_t) {
    if (written || done < 2 * 4096) return;
    // dd conv=notrunc: the same inode, new bytes over rows loaded and rows still to come.
    const int fd = ::open(shard.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    struct stat st;
    REQUIRE(::fstat(fd, &st) == 0);
    std::vector<char> junk(st.st_size - 4096, '\x5a');
    REQUIRE(::pwrite(fd, junk.data(), junk.size(), 4096) == static_cast<ssize_t>(junk.size()));
    ::close(fd);
    written = true;
  });
  REQUIRE(written);
  ExpectRefused(**rt, s, shard, "was written to");
}

TEST_CASE("a FIFO in place of a shard fails the load at once, naming it", "[resident]") {
  TempDir dir;
  auto tables = Synth(dir.path());
  auto rt = ResidentTable::Create(*tables[1], nullptr, {.chunk_rows = 4096});
  REQUIRE(rt.ok());
  const std::string shard = Shard(dir.path(), 14);
  REQUIRE(::unlink(shard.c_str()) == 0);
  REQUIRE(::mkfifo(shard.c_str(), 0644) == 0);
  // On a thread of its own: a loader that opens the path would wait for a writer for good.
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> result = done->get_future();
  std::thread([done, table = rt->get()] {
    done->set_value(table->Load(nullptr, nullptr));
  }).detach();
  REQUIRE(result.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  ExpectRefused(**rt, result.get(), shard, "a FIFO");
}

TEST_CASE("the rate limit holds across cancelled and resumed loads", "[resident]") {
  TempDir dir;
  auto tables = Synth(dir.path());
  constexpr uint64_t kChunk = 1024;
  constexpr uint64_t kRate = 2'000'000;  // bytes a second: a chunk is due every 135 ms
  auto rt =
      ResidentTable::Create(*tables[1], nullptr, {.chunk_rows = kChunk, .rate_bytes_per_s = kRate});
  REQUIRE(rt.ok());
  // Each load is cancelled as soon as its first chunk is in, then resumed at once: the way
  // `engramctl load --cancel` and `load` in a loop would go.
  std::atomic<bool> cancel{false};
  const auto start = std::chrono::steady_clock::now();
  constexpr int kLoads = 8;
  for (int i = 0; i < kLoads; ++i) {
    cancel = false;
    const absl::Status s = (*rt)->Load(&cancel, [&](uint64_t, uint64_t) { cancel = true; });
    REQUIRE(s.code() == absl::StatusCode::kCancelled);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE((*rt)->rows_loaded() == kLoads * kChunk);
  // The first chunk is free; each later one waits for its due time.
  const double due = double((kLoads - 1) * kChunk * kRowBytes) / double(kRate);
  INFO(seconds << " s for " << kLoads << " chunks; the rate allows them in " << due << " s");
  REQUIRE(seconds >= 0.95 * due);
}

}  // namespace
}  // namespace engram
