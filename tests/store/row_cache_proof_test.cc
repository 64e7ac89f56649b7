// A kept row cache is proven against the table files before it is served: a table file whose
// rows were rewritten in place with its modification time restored (as cp -p, rsync -t or tar
// leave it) keeps the tables' identity, and the row store must still serve the file's rows, not
// the cached copies; unchanged files keep every row.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "store/cache_handoff.h"
#include "store/row_store.h"
#include "testkit/gather_test_util.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

using Catch::Matchers::Contains;
using testing::TempDir;

constexpr uint64_t kSeed = 31;
constexpr uint32_t kLayer = 14;
constexpr uint64_t kTableRows = 20000;

struct Served {
  std::vector<std::unique_ptr<Table>> tables;
  std::unique_ptr<GatherEngine> engine;
  std::unique_ptr<RowStore> store;
  std::vector<std::string> notices;
  std::string Notices() const {
    std::string all;
    for (const std::string& n : notices) all += n + "\n";
    return all;
  }
};

// The table at `path` served from the cache tier; the cache adopted from `kept` if it is valid.
std::unique_ptr<Served> Serve(const std::string& path, UniqueFd kept, CacheHandoff* ret_handoff) {
  auto s = std::make_unique<Served>();
  OpenOptions o;
  o.layers = {kLayer};
  auto t = OpenTables(path, o);
  REQUIRE(t.ok());
  s->tables = std::move(*t);
  auto e = GatherEngine::Create({.workers = 2});
  REQUIRE(e.ok());
  s->engine = std::move(*e);
  REQUIRE(s->engine->AddTable(s->tables[0].get(), {.mode = ReadMode::kDirect}).ok());
  StoreConfig config;
  config.default_tier = Tier::kCache;
  config.cache_bytes = 16ull << 20;
  config.pressure = false;
  *ret_handoff = CacheHandoff{.fd = std::move(kept), .tables_identity = TablesIdentity(s->tables)};
  auto store = RowStore::Create(
      config, s->tables, s->engine.get(),
      [p = s.get()](const std::string& n) { p->notices.push_back(n); }, ret_handoff);
  REQUIRE(store.ok());
  s->store = std::move(*store);
  return s;
}

// Every 5th row of the table: 4,000 rows, all held by the 16 MiB cache.
std::vector<uint64_t> CachedRows() {
  std::vector<uint64_t> rows;
  for (uint64_t r = 0; r < kTableRows; r += 5) rows.push_back(r);
  return rows;
}

// Rewrites `rows` of the table in place (other bytes, same offsets: same inode and size) and
// puts the file's access and modification times back as they were.
void RewriteInPlace(const Table& table, const std::vector<uint64_t>& rows) {
  REQUIRE(table.files().size() == 1);
  const std::string& path = table.files()[0].path;
  struct stat before {};
  REQUIRE(stat(path.c_str(), &before) == 0);
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  uint8_t other[kRowBytes];
  for (const uint64_t row : rows) {
    SyntheticRow(kSeed + 1, kLayer, row, other);
    for (const RowPart& p : table.parts()) {
      REQUIRE(pwrite(fd, other + p.dest_offset, p.bytes, p.FileOffset(row)) ==
              static_cast<ssize_t>(p.bytes));
    }
  }
  REQUIRE(fsync(fd) == 0);
  close(fd);
  const timespec times[2] = {before.st_atim, before.st_mtim};
  REQUIRE(utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
  struct stat after {};
  REQUIRE(stat(path.c_str(), &after) == 0);
  REQUIRE(after.st_ino == before.st_ino);
  REQUIRE(after.st_size == before.st_size);
  REQUIRE(after.st_mtim.tv_sec == before.st_mtim.tv_sec);
  REQUIRE(after.st_mtim.tv_nsec == before.st_mtim.tv_nsec);
}

// The first of `rows` whose bytes in `out` differ from the table file's now, or -1.
int64_t FirstDifferentFromFile(const Table& table, const std::vector<uint64_t>& rows,
                               const std::vector<uint8_t>& out) {
  uint8_t want[kRowBytes];
  for (size_t i = 0; i < rows.size(); ++i) {
    REQUIRE(ReadRowBlocking(table, rows[i], want).ok());
    if (std::memcmp(out.data() + i * kRowBytes, want, kRowBytes) != 0) {
      return static_cast<int64_t>(rows[i]);
    }
  }
  return -1;
}

// Fills a cache from `path` and returns a descriptor of its memfd, as systemd's store keeps it.
UniqueFd FillAndKeep(const std::string& path, const std::vector<uint64_t>& rows) {
  CacheHandoff fresh;
  auto s = Serve(path, UniqueFd(), &fresh);
  REQUIRE_FALSE(fresh.adopted);
  std::vector<uint8_t> out(rows.size() * kRowBytes);
  const Table* t = s->tables[0].get();
  REQUIRE(s->store->Gather({.table = t, .rows = rows, .dest = out.data()}).ok());
  REQUIRE(s->store->cache()->Stats().used_slots == rows.size());
  return UniqueFd(fcntl(s->store->cache()->fd(), F_DUPFD_CLOEXEC, 3));
}

TEST_CASE(
    "rows of a file rewritten in place with its mtime restored are not served from a kept "
    "cache",
    "[proof]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string path = dir.path() + "/paged.engram";
  REQUIRE(testing::WriteSyntheticPacked(path, kLayer, kTableRows, kSeed, /*paged=*/true).ok());
  const std::vector<uint64_t> rows = CachedRows();
  UniqueFd kept = FillAndKeep(path, rows);
  uint64_t identity_before = 0;
  {
    OpenOptions o;
    o.layers = {kLayer};
    auto t = OpenTables(path, o);
    REQUIRE(t.ok());
    identity_before = TablesIdentity(*t);
    // 1 % of the cached rows, spread over the table.
    std::vector<uint64_t> rewritten;
    for (size_t i = 0; i < rows.size(); i += 100) rewritten.push_back(rows[i]);
    REQUIRE(rewritten.size() == rows.size() / 100);
    RewriteInPlace(*(*t)[0], rewritten);
  }
  CacheHandoff handoff;
  auto s = Serve(path, std::move(kept), &handoff);
  // What the attack relies on: the identity (path, inode, size, mtime) did not change.
  REQUIRE(handoff.tables_identity == identity_before);
  INFO(s->Notices());
  REQUIRE(handoff.adopted);
  const Table* t = s->tables[0].get();
  const uint64_t held = s->store->cache()->Stats().used_slots;
  // Every row served is the file's now (the cached copies of the 40 are not served).
  std::vector<uint8_t> out(rows.size() * kRowBytes);
  REQUIRE(s->store->Gather({.table = t, .rows = rows, .dest = out.data()}).ok());
  CHECK(FirstDifferentFromFile(*t, rows, out) == -1);
  CHECK(held == rows.size() - 40);
  CHECK_THAT(handoff.outcome,
             Contains("4000 rows compared with the table files") && Contains("40 differed"));
  CHECK_THAT(s->Notices(), Contains("row cache: 40 rows of layer 14") &&
                               Contains("differ from the table file now"));
  // The rows not rewritten were kept and hit; the 40 were read from the file.
  const RowCacheStats st = s->store->cache()->Stats();
  CHECK(st.misses == 40);
  CHECK(st.hits == rows.size() - 40);
}

TEST_CASE("a kept cache of unchanged files keeps every row, each compared", "[proof]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string path = dir.path() + "/paged.engram";
  REQUIRE(testing::WriteSyntheticPacked(path, kLayer, kTableRows, kSeed, /*paged=*/true).ok());
  const std::vector<uint64_t> rows = CachedRows();
  UniqueFd kept = FillAndKeep(path, rows);
  CacheHandoff handoff;
  auto s = Serve(path, std::move(kept), &handoff);
  INFO(s->Notices());
  REQUIRE(handoff.adopted);
  CHECK_THAT(handoff.outcome, Contains("4000 rows compared") && Contains("0 differed"));
  CHECK(s->store->cache()->Stats().used_slots == rows.size());
  const Table* t = s->tables[0].get();
  std::vector<uint8_t> out(rows.size() * kRowBytes);
  REQUIRE(s->store->Gather({.table = t, .rows = rows, .dest = out.data()}).ok());
  CHECK(FirstDifferentFromFile(*t, rows, out) == -1);
  CHECK(s->store->cache()->Stats().hits == rows.size());
}

}  // namespace
}  // namespace engram
