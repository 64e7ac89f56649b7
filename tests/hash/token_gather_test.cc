// engram_submit_tokens / engram_gather_tokens against a real engramd: the rows gathered are
// exactly those of the ids engram_hash computes, with the checkpoint's bytes, for batches,
// chunks with history and head selections; and every bad request is refused before anything
// is submitted, with a message naming what was wrong.
#include <errno.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engram/engram.h"
#include "engram/engram.hpp"
#include "testkit/daemon_test_util.h"
#include "testkit/hash_model.h"
#include "tests/common/skip.h"

namespace {

using engram::testing::TestDir;

using engram::testing::HashModel;
using engram::testing::kCompressedVocab;
using engram::testing::kHashSeed;
using engram::testing::kHeads;
using engram::testing::kLayers;
using engram::testing::kPadId;
using engram::testing::LayerRows;

const std::string& Model() { return HashModel(); }

// One daemon for the whole binary (Catch2 runs a test case once per SECTION).
const engram::testing::Daemon& Daemon() {
  static engram::testing::Daemon d({}, "hash", Model());
  REQUIRE(d.alive());
  return d;
}

engram_session* Connect(const engram::testing::Daemon& d) {
  engram_connect_options o = d.Options(32 << 20);
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  return s;
}

engram_hasher* OpenHasher() {
  engram_hasher_opts o;
  engram_hasher_opts_init(&o, sizeof(o));
  o.flags = ENGRAM_HASHER_COMPRESSED_ONLY;
  o.compressed_pad_id = kPadId;
  engram_hasher* h = nullptr;
  INFO(engram_last_error());
  REQUIRE(engram_hasher_open(Model().c_str(), &o, &h) == 0);
  return h;
}

// Zipf-ish ids with repeats (so n-grams recur), the pad and both ends of the vocabulary.
std::vector<int32_t> Tokens(size_t n, uint64_t seed) {
  std::vector<int32_t> t(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const uint32_t r = static_cast<uint32_t>(x >> 40);
    t[i] = static_cast<int32_t>((r % 7 == 0) ? r % 40 : r % kCompressedVocab);
  }
  t[0] = kPadId;
  t[n / 2] = kCompressedVocab - 1;
  t[n / 3] = 0;
  return t;
}

engram_hash_seq Seq(const int32_t* tokens, size_t n, const int32_t* history, size_t n_history) {
  return engram_hash_seq{sizeof(engram_hash_seq), tokens, n, history, n_history};
}

// Session buffers for one request: row ids, then rows.
struct Buffers {
  engram_session* s;
  uint64_t* rows = nullptr;
  uint8_t* dest = nullptr;
  uint64_t cap;
  Buffers(engram_session* session, uint64_t cap) : s(session), cap(cap) {
    REQUIRE(engram_alloc(s, cap * 8, reinterpret_cast<void**>(&rows)) == 0);
    REQUIRE(engram_alloc(s, cap * ENGRAM_ROW_BYTES, reinterpret_cast<void**>(&dest)) == 0);
  }
  ~Buffers() {
    engram_free(s, rows);
    engram_free(s, dest);
  }
  engram_token_request Request(uint32_t table, const engram_hash_seq* seqs, size_t n) const {
    engram_token_request r{};
    r.size = sizeof(r);
    r.layer = table;
    r.flags = ENGRAM_HASH_COMPRESSED_IDS;
    r.seqs = seqs;
    r.n_seqs = n;
    r.rows = rows;
    r.rows_cap = cap;
    r.dest = dest;
    return r;
  }
};

// Every gathered row holds the checkpoint's bytes of the row id next to it.
void CheckRowsLanded(uint32_t layer, const uint64_t* rows, uint64_t n, const uint8_t* dest,
                     uint64_t table_rows) {
  uint8_t expect[engram::kRowBytes];
  for (uint64_t i = 0; i < n; ++i) {
    REQUIRE(rows[i] < table_rows);
    engram::SyntheticRow(kHashSeed, layer, rows[i], expect);
    INFO("layer " << layer << " entry " << i << " row " << rows[i]);
    REQUIRE(memcmp(expect, dest + i * ENGRAM_ROW_BYTES, ENGRAM_ROW_BYTES) == 0);
  }
}

uint64_t Submitted(engram_session* s) {
  engram_session_stats st{};
  st.size = sizeof(st);
  REQUIRE(engram_get_session_stats(s, &st) == 0);
  return st.requests_submitted;
}

}  // namespace

TEST_CASE("submit_tokens gathers the rows engram_hash computes, for batches and head ranges",
          "[hash][daemon]") {
  const auto& d = Daemon();
  engram_session* s = Connect(d);
  engram_hasher* h = OpenHasher();
  const std::vector<uint64_t> table_rows = LayerRows();
  // A decode step: 16 sequences of 1 token + 5 drafts, each with 3 ids of history (some with
  // fewer: sequences that just started).
  const std::vector<int32_t> tokens = Tokens(16 * 9, 5);
  std::vector<engram_hash_seq> seqs;
  for (size_t i = 0; i < 16; ++i) {
    const size_t history = i % 4 == 0 ? i % 3 : 3;
    seqs.push_back(Seq(&tokens[i * 9 + 3], 6, &tokens[i * 9 + 3 - history], history));
  }
  struct Selection {
    uint32_t head_begin, head_end, tp_size, tp_rank, first, count;
  };
  const Selection selections[] = {
      {0, 0, 0, 0, 0, kHeads},  // all heads
      {0, 0, 4, 1, 6, 6},       // TP4 rank 1
      {0, 0, 3, 2, 16, 8},      // TP3 rank 2: order 4
      {5, 19, 0, 0, 5, 14},     // an explicit range across orders
  };
  for (uint32_t layer_index = 0; layer_index < 2; ++layer_index) {
    const uint32_t layer = kLayers[layer_index];
    for (const Selection& sel : selections) {
      INFO("layer " << layer << " heads from " << sel.first << ", tp " << sel.tp_size);
      const uint64_t n = 96 * sel.count;
      Buffers b(s, n);
      engram_token_request r = b.Request(layer, seqs.data(), seqs.size());
      r.head_begin = sel.head_begin;
      r.head_end = sel.head_end;
      r.tp_size = sel.tp_size;
      r.tp_rank = sel.tp_rank;
      uint64_t ticket = 0, num_rows = 0;
      INFO(engram_last_error());
      REQUIRE(engram_submit_tokens(s, h, &r, &ticket, &num_rows) == 0);
      REQUIRE(num_rows == n);
      REQUIRE(engram_wait(s, ticket, 10'000'000'000) == 0);
      std::vector<uint64_t> expect(n);
      REQUIRE(engram_hash(h, layer, seqs.data(), seqs.size(), sel.first, sel.first + sel.count,
                          ENGRAM_HASH_COMPRESSED_IDS, expect.data(), n) == 0);
      REQUIRE(std::vector<uint64_t>(b.rows, b.rows + n) == expect);
      CheckRowsLanded(layer, b.rows, n, b.dest, table_rows[layer_index]);
      // The rows lie in the heads' own row range.
      uint64_t row_begin, row_end;
      REQUIRE(engram_hasher_head_rows(h, layer, sel.first, sel.first + sel.count, &row_begin,
                                      &row_end) == 0);
      for (uint64_t i = 0; i < n; ++i) REQUIRE((b.rows[i] >= row_begin && b.rows[i] < row_end));
    }
  }
  engram_hasher_close(h);
  engram_session_close(s);
}

TEST_CASE("chunks submitted with history gather the rows of the whole sequence", "[hash][daemon]") {
  const auto& d = Daemon();
  engram_session* s = Connect(d);
  engram_hasher* h = OpenHasher();
  const std::vector<uint64_t> table_rows = LayerRows();
  const std::vector<int32_t> tokens = Tokens(700, 11);
  for (uint32_t layer_index = 0; layer_index < 2; ++layer_index) {
    const uint32_t layer = kLayers[layer_index];
    std::vector<uint64_t> whole(tokens.size() * kHeads);
    const engram_hash_seq all = Seq(tokens.data(), tokens.size(), nullptr, 0);
    REQUIRE(engram_hash(h, layer, &all, 1, 0, kHeads, ENGRAM_HASH_COMPRESSED_IDS, whole.data(),
                        whole.size()) == 0);
    for (size_t chunk : {1, 2, 3, 5, 64, 333, 700}) {
      INFO("layer " << layer << " chunk " << chunk);
      Buffers b(s, tokens.size() * kHeads);
      std::vector<uint64_t> tickets;
      for (size_t at = 0; at < tokens.size(); at += chunk) {
        const size_t len = std::min(chunk, tokens.size() - at);
        const size_t history = std::min<size_t>(at, 3);
        const engram_hash_seq seq = Seq(&tokens[at], len, &tokens[at - history], history);
        engram_token_request r = b.Request(layer, &seq, 1);
        r.rows = b.rows + at * kHeads;
        r.rows_cap = b.cap - at * kHeads;
        r.dest = b.dest + at * kHeads * ENGRAM_ROW_BYTES;
        if (chunk < 64) {
          // Many small chunks: the synchronous call, one at a time.
          INFO(engram_last_error());
          REQUIRE(engram_gather_tokens(s, h, &r, 10'000'000'000) == 0);
        } else {
          uint64_t ticket;
          INFO(engram_last_error());
          REQUIRE(engram_submit_tokens(s, h, &r, &ticket, nullptr) == 0);
          tickets.push_back(ticket);
        }
      }
      for (uint64_t t : tickets) REQUIRE(engram_wait(s, t, 10'000'000'000) == 0);
      REQUIRE(std::vector<uint64_t>(b.rows, b.rows + whole.size()) == whole);
      CheckRowsLanded(layer, b.rows, whole.size(), b.dest, table_rows[layer_index]);
    }
  }
  engram_hasher_close(h);
  engram_session_close(s);
}

TEST_CASE("bad token requests are refused, naming what was wrong, and submit nothing",
          "[hash][daemon]") {
  const auto& d = Daemon();
  engram_session* s = Connect(d);
  engram_hasher* h = OpenHasher();
  const std::vector<int32_t> tokens = Tokens(10, 3);
  const engram_hash_seq seq = Seq(tokens.data(), tokens.size(), nullptr, 0);
  auto buffers = std::make_unique<Buffers>(s, tokens.size() * kHeads);
  const Buffers& b = *buffers;
  const uint64_t before = Submitted(s);
  uint64_t ticket = 77;
  auto refused = [&](const engram_token_request& r, int expected_rc, const char* needle) {
    const int rc = engram_submit_tokens(s, h, &r, &ticket, nullptr);
    INFO("message: " << engram_last_error());
    CHECK(rc == expected_rc);
    CHECK(strstr(engram_last_error(), needle) != nullptr);
    CHECK(ticket == 77);
  };

  SECTION("a layer the hasher does not know") {
    refused(b.Request(7, &seq, 1), -ENOENT, "layer 7 is not an Engram layer");
  }
  SECTION("a token outside the compressed vocabulary") {
    std::vector<int32_t> bad = tokens;
    bad[4] = kCompressedVocab;
    const engram_hash_seq bad_seq = Seq(bad.data(), bad.size(), nullptr, 0);
    refused(b.Request(14, &bad_seq, 1), -EINVAL, "position 4: compressed id 5000 is outside");
    bad[4] = -1;
    refused(b.Request(14, &bad_seq, 1), -EINVAL, "compressed id -1 is outside");
  }
  SECTION("a history id outside the vocabulary") {
    const int32_t history[3] = {1, 99999, 2};
    const engram_hash_seq bad_seq = Seq(tokens.data(), tokens.size(), history, 3);
    refused(b.Request(1, &bad_seq, 1), -EINVAL, "history entry at position 1: compressed id 99999");
  }
  SECTION("tokenizer ids without a compressed vocabulary") {
    engram_token_request r = b.Request(1, &seq, 1);
    r.flags = 0;
    refused(r, -EOPNOTSUPP, "engram_vocab.py");
  }
  SECTION("a bad request size") {
    engram_token_request r = b.Request(1, &seq, 1);
    r.size = 4;  // not even the size field
    refused(r, -EINVAL, "engram_token_request has size 4");
  }
  SECTION("a bad sequence size") {
    engram_hash_seq bad_seq = seq;
    bad_seq.size = 4;
    refused(b.Request(1, &bad_seq, 1), -EINVAL, "engram_hash_seq has size 4");
  }
  SECTION("unknown flags") {
    engram_token_request r = b.Request(1, &seq, 1);
    r.flags |= 0x80;
    refused(r, -EINVAL, "flags 0x81");
  }
  SECTION("a head range and a TP rank at once") {
    engram_token_request r = b.Request(1, &seq, 1);
    r.head_begin = 0;
    r.head_end = 6;
    r.tp_size = 4;
    refused(r, -EINVAL, "give one");
  }
  SECTION("a TP size that does not divide the heads") {
    engram_token_request r = b.Request(1, &seq, 1);
    r.tp_size = 5;
    refused(r, -EINVAL, "tensor-parallel size 5 does not divide the 24 heads");
  }
  SECTION("a head range past the layer") {
    engram_token_request r = b.Request(1, &seq, 1);
    r.head_begin = 20;
    r.head_end = 25;
    refused(r, -EINVAL, "head range [20, 25)");
  }
  SECTION("too little room for the row ids") {
    engram_token_request r = b.Request(1, &seq, 1);
    r.rows_cap = tokens.size() * kHeads - 1;
    refused(r, -ENOSPC, "rows_cap is 239");
  }
  SECTION("row ids outside the data region") {
    std::vector<uint64_t> heap(tokens.size() * kHeads);
    engram_token_request r = b.Request(1, &seq, 1);
    r.rows = heap.data();
    refused(r, -EINVAL, "data region");
  }
  SECTION("a destination outside the data region") {
    std::vector<uint8_t> heap(tokens.size() * kHeads * ENGRAM_ROW_BYTES);
    engram_token_request r = b.Request(1, &seq, 1);
    r.dest = heap.data();
    refused(r, -EINVAL, "destination");
  }
  SECTION("NULL arguments") {
    const engram_token_request r = b.Request(1, &seq, 1);
    CHECK(engram_submit_tokens(s, nullptr, &r, &ticket, nullptr) == -EINVAL);
    CHECK(strstr(engram_last_error(), "hasher") != nullptr);
    CHECK(engram_submit_tokens(s, h, nullptr, &ticket, nullptr) == -EINVAL);
    CHECK(engram_gather_tokens(s, h, nullptr, -1) == -EINVAL);
  }
  CHECK(Submitted(s) == before);
  buffers.reset();  // before the session goes
  engram_hasher_close(h);
  engram_session_close(s);
}

TEST_CASE("the C++ wrapper: Hasher and Session::GatherTokens", "[hash][daemon]") {
  const auto& d = Daemon();
  engram::Session session;
  engram::ConnectOptions options;
  options.socket_path = d.socket();
  REQUIRE(engram::Session::Connect(options, &session).ok());
  engram::Hasher hasher;
  engram::Status st = engram::Hasher::Open("/nonexistent-model", {}, &hasher);
  CHECK(st.code() == -ENOENT);
  CHECK(st.message().find("/nonexistent-model") != std::string::npos);
  st = engram::Hasher::Open(Model(), {.compressed_only = true, .compressed_pad_id = kPadId},
                            &hasher);
  INFO(st.message());
  REQUIRE(st.ok());
  engram_hasher_info info;
  REQUIRE(hasher.Info(&info).ok());
  CHECK(info.heads_per_layer == kHeads);

  const std::vector<int32_t> tokens = Tokens(50, 9);
  const int32_t history[3] = {11, 12, 13};
  const engram_hash_seq seqs[2] = {engram::Hasher::Sequence({tokens.data(), 20}, history),
                                   engram::Hasher::Sequence({tokens.data() + 20, 30})};
  uint32_t hb, he;
  REQUIRE(hasher.RankHeads(2, 1, &hb, &he).ok());
  const uint64_t n = 50 * (he - hb);
  engram::Buffer rows, dest;
  REQUIRE(session.Alloc(n * 8, &rows).ok());
  REQUIRE(session.Alloc(n * ENGRAM_ROW_BYTES, &dest).ok());
  engram::TokenRequest request{.layer = 14,
                               .seqs = seqs,
                               .compressed = true,
                               .tp_size = 2,
                               .tp_rank = 1,
                               .rows = rows.as<uint64_t>(),
                               .rows_cap = n,
                               .dest = dest.data()};
  st = session.GatherTokens(hasher, request);
  INFO(st.message());
  REQUIRE(st.ok());
  std::vector<uint64_t> expect(n);
  REQUIRE(hasher.Hash(14, seqs, hb, he, ENGRAM_HASH_COMPRESSED_IDS, expect).ok());
  REQUIRE(std::vector<uint64_t>(rows.as<uint64_t>(), rows.as<uint64_t>() + n) == expect);
  CheckRowsLanded(14, rows.as<uint64_t>(), n, dest.as<uint8_t>(), LayerRows()[1]);

  request.layer = 3;
  st = session.GatherTokens(hasher, request);
  CHECK(st.code() == -ENOENT);
  CHECK(st.message().find("table 3") != std::string::npos);
}

// Whether engramd serves `layer` in place: once the table has loaded, yes, except under an
// emulator (qemu-user gives its guest no robust futex list and not every seal, so engramd cannot
// make the table state page and serves nothing in place, saying why); there the reason is
// returned, anywhere else a refusal fails the test.
namespace {

std::string InPlaceRefusedUnderEmulator(const engram::testing::Daemon& d, uint32_t layer) {
  engram_connect_options o = d.Options(1 << 20);
  engram_session* s = nullptr;
  REQUIRE(engram_session_open(&o, &s) == 0);
  const bool emulator = std::getenv("MESON_EXE_WRAPPER") != nullptr;
  engram_table_map* map = nullptr;
  int rc = -EAGAIN;
  std::string why;
  for (int i = 0; i < 3000 && (rc = engram_table_map_open(s, layer, &map)) == -EAGAIN; ++i) {
    why = engram_last_error();
    if (emulator && why.find("cannot be read in place") != std::string::npos) break;
    usleep(10000);
  }
  engram_table_map_close(map);
  engram_session_close(s);
  if (rc != 0 && emulator && why.find("cannot be read in place") != std::string::npos) return why;
  INFO(why);
  REQUIRE(rc == 0);
  return "";
}

}  // namespace

TEST_CASE("engram_gather_tokens reads a resident table in place unless the session says otherwise",
          "[hash][daemon][inplace]") {
  const uint32_t layer = kLayers[0];
  const std::string tier = std::to_string(layer) + "=resident";
  engram::testing::Daemon d({"--tier", tier}, "hash-resident", Model());
  REQUIRE(d.alive());
  if (const std::string why = InPlaceRefusedUnderEmulator(d, layer); !why.empty()) {
    ENGRAM_SKIP("under an emulator (qemu-user): " + why);
  }
  engram_hasher* h = OpenHasher();
  const std::vector<int32_t> tokens = Tokens(64, 9);
  const engram_hash_seq seq = Seq(tokens.data(), tokens.size(), nullptr, 0);
  const uint64_t n = tokens.size() * kHeads;
  // (rows in place, rows through engramd) that one engram_gather_tokens adds; the rows in `out`.
  const auto gather = [&](uint32_t connect_flags, std::vector<uint8_t>* out) {
    engram_connect_options o = d.Options(32 << 20);
    o.flags = connect_flags;
    engram_session* s = nullptr;
    REQUIRE(engram_session_open(&o, &s) == 0);
    // The table is read in place once it has loaded: wait for that.
    engram_table_map* map = nullptr;
    int rc = -EAGAIN;
    for (int i = 0; i < 3000 && (rc = engram_table_map_open(s, layer, &map)) == -EAGAIN; ++i) {
      usleep(10000);
    }
    REQUIRE(rc == 0);
    engram_table_map_close(map);
    {
      Buffers b(s, n);
      const engram_token_request r = b.Request(layer, &seq, 1);
      INFO(engram_last_error());
      REQUIRE(engram_gather_tokens(s, h, &r, 10'000'000'000) == 0);
      CheckRowsLanded(layer, b.rows, n, b.dest, LayerRows()[0]);
      out->assign(b.dest, b.dest + n * ENGRAM_ROW_BYTES);
    }
    engram_session_stats st{.size = sizeof(st)};
    REQUIRE(engram_get_session_stats(s, &st) == 0);
    engram_session_close(s);
    return std::pair<uint64_t, uint64_t>{st.rows_in_place, st.rows};
  };
  std::vector<uint8_t> in_place, via_daemon;
  CHECK(gather(0, &in_place) == std::pair<uint64_t, uint64_t>{n, 0});
  CHECK(gather(ENGRAM_CONNECT_GATHER_VIA_DAEMON, &via_daemon) ==
        std::pair<uint64_t, uint64_t>{0, n});
  CHECK(in_place == via_daemon);
  engram_hasher_close(h);
}
