// The row store's misses through a real gather engine: a cache-tier table served from a paged
// file reads one 4 KiB page a missed row; a decode step's gather submitted while a prefill's
// misses are being read goes to the device at once, as one piece, beside at most the reads the
// prefill may have there, however large the prefill (the miss queue's own counters say so, no
// sleeps); the start-up notice for a
// cache-tier table that is not paged; the queue in status and metrics.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/metric_sink.h"
#include "store/row_store.h"
#include "testkit/gather_test_util.h"
#include "testkit/synthetic.h"

namespace engram {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using testing::TempDir;

constexpr uint64_t kSeed = 21;
constexpr uint32_t kLayer = 14;

struct Served {
  std::vector<std::unique_ptr<Table>> tables;
  std::unique_ptr<GatherEngine> engine;
  std::unique_ptr<RowStore> store;
  std::vector<std::string> notices;
};

std::unique_ptr<Served> Serve(const std::string& path, uint32_t miss_depth = 64) {
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
  config.cache_bytes = 64ull << 20;
  config.pressure = false;
  config.miss_depth = miss_depth;
  auto store = RowStore::Create(config, s->tables, s->engine.get(),
                                [p = s.get()](const std::string& n) { p->notices.push_back(n); });
  REQUIRE(store.ok());
  s->store = std::move(*store);
  return s;
}

const MissClassStats& Of(const MissQueueStats& s, MissClass c) {
  return s.classes[static_cast<int>(c)];
}

void Check(const Table& t, const std::vector<uint64_t>& rows, const std::vector<uint8_t>& out) {
  REQUIRE(testing::FirstMismatch(kSeed, t, rows, out.data()) == -1);
}

// The samples the row store reports, by name and labels (the exposition is operations').
class RecordingSink final : public MetricSink {
 public:
  void Gauge(const std::string& name, const std::string&, const MetricLabels& labels,
             double value) override {
    samples_[{name, labels}] = value;
  }
  void Counter(const std::string& name, const std::string&, const MetricLabels& labels,
               double value) override {
    samples_[{name, labels}] = value;
  }
  void Log2Histogram(const std::string& name, const std::string&, const MetricLabels& labels,
                     const uint64_t*, size_t, uint64_t sum_ns) override {
    samples_[{name, labels}] = double(sum_ns);
  }
  // -1 when no such sample was reported.
  double Value(const std::string& name, const MetricLabels& labels) const {
    auto it = samples_.find({name, labels});
    return it == samples_.end() ? -1 : it->second;
  }

 private:
  std::map<std::pair<std::string, MetricLabels>, double> samples_;
};

TEST_CASE("cache-tier misses of a paged table are one page read a row", "[misses]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string path = dir.path() + "/paged.engram";
  REQUIRE(testing::WriteSyntheticPacked(path, kLayer, 30000, kSeed, /*paged=*/true).ok());
  auto s = Serve(path);
  // Paged: nothing to advise; the one line is the row cache's size.
  REQUIRE(s->notices.size() == 1);
  CHECK_THAT(s->notices[0], StartsWith("row cache: 64.0 MiB ([memory] cache) holds "));
  const Table* t = s->tables[0].get();
  // 200 rows on pages four apart, and a second row on every fifth of those pages.
  std::vector<uint64_t> rows;
  for (uint64_t page = 0; page < 800; page += 4) rows.push_back(page * 15 + (page * 7) % 15);
  for (uint64_t page = 0; page < 800; page += 20) rows.push_back(page * 15 + 14);
  std::vector<uint8_t> out(rows.size() * kRowBytes);
  REQUIRE(s->store->Gather({.table = t, .rows = rows, .dest = out.data()}).ok());
  Check(*t, rows, out);
  const TableGatherStats e = s->engine->Stats()[0];
  CHECK(e.direct_reads == 200);
  CHECK(e.bytes_read == 200 * 4096);
  // Again: every row hits the cache, no read.
  REQUIRE(s->store->Gather({.table = t, .rows = rows, .dest = out.data()}).ok());
  Check(*t, rows, out);
  CHECK(s->engine->Stats()[0].direct_reads == 200);
  const MissQueueStats q = s->store->miss_queue()->Stats();
  CHECK(Of(q, MissClass::kDecode).reads == rows.size());
  CHECK(Of(q, MissClass::kPrefill).reads == 0);

  nlohmann::json status;
  s->store->AddControlFields("status", &status);
  const nlohmann::json& m = status["store"]["misses"];
  CHECK(m["depth"] == 64);
  CHECK(m["completed_reads"] == rows.size());
  CHECK(m["read_rate_per_s"].get<double>() > 0);
  CHECK(m["classes"]["decode"]["reads"] == rows.size());
  CHECK(m["classes"]["prefetch"]["dropped_reads"] == 0);
  RecordingSink sink;
  s->store->AddMetrics(&sink);
  CHECK(sink.Value("engram_miss_queue_depth", {}) == 64);
  CHECK(sink.Value("engram_miss_queue_reads_total", {{"class", "decode"}}) == 240);
}

TEST_CASE("a cache-tier table that is not paged is named at start with the command to pack it",
          "[misses]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string ckpt = dir.path() + "/ckpt";
  REQUIRE(
      WriteSyntheticCheckpoint({.out_dir = ckpt, .rows = 3000, .seed = kSeed, .layers = {kLayer}})
          .ok());
  auto s = Serve(ckpt);
  // The advice, then the row cache's size.
  REQUIRE(s->notices.size() == 2);
  CHECK_THAT(s->notices[0], Contains("cache-tier layer 14"));
  CHECK_THAT(s->notices[0], Contains("two device reads"));
  CHECK_THAT(s->notices[0], Contains("engram-pack " + ckpt + " --layer 14 --paged --out FILE"));
  CHECK_THAT(s->notices[1], StartsWith("row cache: "));
}

// A prefill of `prefill_rows` rows, all misses, on one thread; once its reads are at the device,
// a decode step of 768 rows (misses too) on this one. Returns the queue's stats after both.
MissQueueStats DecodeBesidePrefill(Served& s, uint64_t prefill_rows, uint64_t first) {
  const Table* t = s.tables[0].get();
  std::vector<uint64_t> prefill(prefill_rows);
  for (uint64_t i = 0; i < prefill_rows; ++i) prefill[i] = first + i;  // all distinct
  std::vector<uint8_t> prefill_out(prefill_rows * kRowBytes);
  std::atomic<bool> prefill_ok{false};
  const uint64_t pieces_before = Of(s.store->miss_queue()->Stats(), MissClass::kPrefill).pieces;
  std::thread th([&] {
    prefill_ok = s.store->Gather({.table = t, .rows = prefill, .dest = prefill_out.data()}).ok();
  });
  // Wait until the prefill has pieces at the device (the queue's counters, not a sleep).
  const uint64_t deadline = NowNs() + 60'000'000'000ull;
  while (Of(s.store->miss_queue()->Stats(), MissClass::kPrefill).pieces < pieces_before + 4) {
    REQUIRE(NowNs() < deadline);
    std::this_thread::yield();
  }
  std::mt19937_64 rng(prefill_rows);
  std::vector<uint64_t> decode(768);
  for (auto& r : decode) r = rng() % first;  // rows the prefill does not read
  std::vector<uint8_t> decode_out(decode.size() * kRowBytes);
  REQUIRE(s.store->Gather({.table = t, .rows = decode, .dest = decode_out.data()}).ok());
  Check(*t, decode, decode_out);
  const MissQueueStats q = s.store->miss_queue()->Stats();
  th.join();
  REQUIRE(prefill_ok);
  Check(*t, prefill, prefill_out);
  return q;
}

TEST_CASE("a decode step behind a prefill's misses waits for its reads in flight only",
          "[misses]") {
  TempDir dir;
  REQUIRE(dir.ok());
  const std::string path = dir.path() + "/paged.engram";
  constexpr uint64_t kRows = 200000;
  REQUIRE(testing::WriteSyntheticPacked(path, kLayer, kRows, kSeed, /*paged=*/true).ok());
  auto s = Serve(path, /*miss_depth=*/32);
  // Prefills of 20,000 and 120,000 rows (larger than a decode step's 16,384): the decode step's
  // misses go to the device as one piece at once, beside at most the 24 reads prefills may have
  // there (three quarters of 32), not behind the prefill's thousands of queued rows.
  uint64_t decode_pieces = 0;
  for (uint64_t rows : {20000, 120000}) {
    INFO("prefill of " << rows << " rows");
    const MissQueueStats q = DecodeBesidePrefill(*s, rows, kRows - rows);
    CHECK(Of(q, MissClass::kDecode).pieces == decode_pieces + 1);
    decode_pieces = Of(q, MissClass::kDecode).pieces;
    CHECK(Of(q, MissClass::kDecode).max_reads_waited == 0);
    CHECK(Of(q, MissClass::kPrefill).pieces > 0);
    CHECK(Of(q, MissClass::kPrefill).in_flight_reads <= 24);
  }
}

}  // namespace
}  // namespace engram
