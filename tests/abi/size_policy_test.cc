// engram.h's struct-size policy (conventions 3-5) at every entry point of libengram_client that
// takes or fills a size-prefixed struct, against a real engramd: older structs get the defaults,
// newer ones with a zero tail are served, a set tail is -E2BIG, sizes out of bounds are -EINVAL,
// and no call reads or writes past the caller's size (tests/abi/size_policy.h).
#include "tests/abi/size_policy.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "engram/engram.h"
#include "engram/hash.h"
#include "testkit/daemon_test_util.h"
#include "testkit/hash_model.h"

namespace {

using engram::testing::CheckInitStruct;
using engram::testing::CheckInputStruct;
using engram::testing::CheckOutputStruct;
using engram::testing::Daemon;
using engram::testing::GuardedStruct;
using engram::testing::LastErrorHas;

// The hash model's tables, layer 14 resident (for engram_table_map_open).
const Daemon& D() {
  static Daemon d({"--tier", "14=resident"}, "abi-policy", engram::testing::HashModel());
  REQUIRE(d.alive());
  return d;
}

engram_session* Open(uint32_t flags = 0) {
  engram_connect_options o = D().Options(1 << 20, 8);
  o.flags = flags;
  engram_session* s = nullptr;
  INFO(engram_last_error());
  REQUIRE(engram_session_open(&o, &s) == 0);
  return s;
}

engram_hasher_opts HasherOpts() {
  engram_hasher_opts o;
  engram_hasher_opts_init(&o, sizeof(o));
  o.flags = ENGRAM_HASHER_COMPRESSED_ONLY;
  o.compressed_pad_id = engram::testing::kPadId;
  return o;
}

engram_hasher* OpenHasher() {
  const engram_hasher_opts o = HasherOpts();
  engram_hasher* h = nullptr;
  INFO(engram_last_error());
  REQUIRE(engram_hasher_open(engram::testing::HashModel().c_str(), &o, &h) == 0);
  return h;
}

}  // namespace

TEST_CASE("engram_connect_options: init and engram_session_open", "[abi]") {
  constexpr size_t kOlder = offsetof(engram_connect_options, flags);  // ENGRAM_0.1's struct
  CheckInitStruct("engram_connect_options", sizeof(engram_connect_options), kOlder,
                  [](void* p, size_t size) {
                    engram_connect_options_init(static_cast<engram_connect_options*>(p), size);
                  });
  const engram_connect_options o = D().Options();
  // engram_connect, deprecated, stays exported for binaries built against it: the same policy.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  for (auto open : {engram_session_open, engram_connect}) {
#pragma GCC diagnostic pop
    CheckInputStruct("engram_connect_options", &o, sizeof(o), kOlder, [open](const void* p) {
      engram_session* s = nullptr;
      const int rc = open(static_cast<const engram_connect_options*>(p), &s);
      if (rc == 0) engram_session_close(s);
      return rc;
    });
  }
  // An older struct's missing fields take their defaults: flags past its size are not read.
  engram_connect_options older = D().Options();
  older.size = kOlder;
  older.flags = 0xF0;  // unknown flags: refused if read
  engram_session* s = nullptr;
  INFO(engram_last_error());
  REQUIRE(engram_session_open(&older, &s) == 0);
  engram_session_close(s);
}

TEST_CASE("engram_gather_request: engram_submit and engram_gather", "[abi]") {
  engram_session* s = Open();
  uint64_t* rows = nullptr;
  uint8_t* out = nullptr;
  REQUIRE(engram_alloc(s, 4 * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, 4 * ENGRAM_ROW_BYTES, reinterpret_cast<void**>(&out)) == 0);
  for (uint64_t i = 0; i < 4; ++i) rows[i] = i * 3;
  engram_gather_request r{};
  r.size = sizeof(r);
  r.layer = 14;
  r.rows = rows;
  r.num_rows = 4;
  r.dest = out;
  constexpr size_t kOlder = offsetof(engram_gather_request, dest_offsets);
  CheckInputStruct("engram_gather_request", &r, sizeof(r), kOlder, [s](const void* p) {
    return engram_gather(s, static_cast<const engram_gather_request*>(p), -1);
  });
  CheckInputStruct("engram_gather_request", &r, sizeof(r), kOlder, [s](const void* p) {
    uint64_t ticket = 0;
    const int rc = engram_submit(s, static_cast<const engram_gather_request*>(p), &ticket);
    return rc == 0 ? engram_wait(s, ticket, -1) : rc;
  });
  // An older struct has no dest_offsets: rows land at dest + i * 264, not at a stale pointer.
  engram_gather_request older = r;
  older.size = kOlder;
  older.dest_offsets = reinterpret_cast<const uint64_t*>(uintptr_t{8});
  INFO(engram_last_error());
  CHECK(engram_gather(s, &older, -1) == 0);
  engram_session_close(s);
}

TEST_CASE("engram_device_ring is filled to the caller's size", "[abi]") {
  engram_session* s = Open(ENGRAM_CONNECT_DEVICE_SUBMIT);
  const std::string ring = CheckOutputStruct(
      "engram_device_ring", sizeof(struct engram_device_ring),
      offsetof(struct engram_device_ring, reserved),
      [s](void* p) { return engram_device_ring(s, static_cast<struct engram_device_ring*>(p)); });
  struct engram_device_ring r;
  memcpy(&r, ring.data(), sizeof(r));
  CHECK(r.slots == 8);
  CHECK(r.data_bytes == (1u << 20));
  engram_session_close(s);
}

TEST_CASE("engram_table_info: engram_list_tables fills an array of the caller's stride", "[abi]") {
  engram_session* s = Open();
  size_t count = 0;
  const std::string first = CheckOutputStruct(
      "engram_table_info", sizeof(engram_table_info), offsetof(engram_table_info, data_bytes),
      [s, &count](void* p) {
        return engram_list_tables(s, static_cast<engram_table_info*>(p), 1, &count);
      });
  CHECK(count == 2);
  engram_table_info t;
  memcpy(&t, first.data(), sizeof(t));
  CHECK(t.layer == 1);
  // The deprecated name stays an alias of the same field for programs built against it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  CHECK(t.layer_id == 1);
#pragma GCC diagnostic pop
  // Two entries of an older, smaller struct: the first one's size is the stride.
  constexpr size_t kOlder = offsetof(engram_table_info, data_bytes);
  std::vector<unsigned char> array(2 * kOlder, 0xAB);
  for (size_t i = 0; i < 2; ++i) memcpy(array.data() + i * kOlder, &kOlder, sizeof(size_t));
  REQUIRE(engram_list_tables(s, reinterpret_cast<engram_table_info*>(array.data()), 2, &count) ==
          0);
  uint32_t second_layer;
  memcpy(&second_layer, array.data() + kOlder + offsetof(engram_table_info, layer), 4);
  CHECK(second_layer == 14);
  // Entries that disagree on the stride are refused, naming the entry.
  const size_t other = sizeof(engram_table_info);
  memcpy(array.data() + kOlder, &other, sizeof(size_t));
  CHECK(engram_list_tables(s, reinterpret_cast<engram_table_info*>(array.data()), 2, &count) ==
        -EINVAL);
  CHECK(LastErrorHas("engram_table_info 1"));
  engram_session_close(s);
}

TEST_CASE("engram_session_stats is filled to the caller's size", "[abi]") {
  engram_session* s = Open();  // idle: its statistics do not move between the calls
  const std::string stats = CheckOutputStruct(
      "engram_session_stats", sizeof(engram_session_stats),
      offsetof(engram_session_stats, rows_in_place),
      [s](void* p) { return engram_get_session_stats(s, static_cast<engram_session_stats*>(p)); });
  engram_session_stats st;
  memcpy(&st, stats.data(), sizeof(st));
  CHECK(st.session_id != 0);
  CHECK(st.requests_submitted == 0);
  engram_session_close(s);
}

TEST_CASE("engram_table_map_info is filled to the caller's size", "[abi]") {
  engram_session* s = Open();
  engram_table_map* map = nullptr;
  int rc = -EAGAIN;
  for (int i = 0; i < 500 && rc == -EAGAIN; ++i) {
    rc = engram_table_map_open(s, 14, &map);
    if (rc == -EAGAIN) usleep(10000);
  }
  INFO(engram_last_error());
  REQUIRE(rc == 0);
  const std::string info = CheckOutputStruct(
      "engram_table_map_info", sizeof(engram_table_map_info),
      offsetof(engram_table_map_info, reserved), [map](void* p) {
        return engram_get_table_map_info(map, static_cast<engram_table_map_info*>(p));
      });
  engram_table_map_info i;
  memcpy(&i, info.data(), sizeof(i));
  CHECK(i.layer == 14);
  CHECK(i.row_bytes == ENGRAM_ROW_BYTES);
  engram_table_map_close(map);
  engram_session_close(s);
}

TEST_CASE("engram_hasher_opts: init and engram_hasher_open", "[abi][hash]") {
  constexpr size_t kOlder = offsetof(engram_hasher_opts, compressed_pad_id);
  const std::string defaults = CheckInitStruct(
      "engram_hasher_opts", sizeof(engram_hasher_opts), kOlder, [](void* p, size_t size) {
        engram_hasher_opts_init(static_cast<engram_hasher_opts*>(p), size);
      });
  engram_hasher_opts o;
  memcpy(&o, defaults.data(), sizeof(o));
  CHECK(o.compressed_pad_id == -1);
  const engram_hasher_opts image = HasherOpts();
  CheckInputStruct("engram_hasher_opts", &image, sizeof(image), kOlder, [](const void* p) {
    engram_hasher* h = nullptr;
    const int rc = engram_hasher_open(engram::testing::HashModel().c_str(),
                                      static_cast<const engram_hasher_opts*>(p), &h);
    engram_hasher_close(h);
    return rc;
  });
}

TEST_CASE("engram_hasher_info and engram_hash_layer_info are filled to the caller's size",
          "[abi][hash]") {
  engram_hasher* h = OpenHasher();
  const std::string info = CheckOutputStruct(
      "engram_hasher_info", sizeof(engram_hasher_info),
      offsetof(engram_hasher_info, compressed_pad_id),
      [h](void* p) { return engram_hasher_get_info(h, static_cast<engram_hasher_info*>(p)); });
  engram_hasher_info i;
  memcpy(&i, info.data(), sizeof(i));
  CHECK(i.num_layers == 2);
  const std::string layer = CheckOutputStruct(
      "engram_hash_layer_info", sizeof(engram_hash_layer_info),
      offsetof(engram_hash_layer_info, num_rows), [h](void* p) {
        return engram_hasher_get_layer(h, 1, static_cast<engram_hash_layer_info*>(p));
      });
  engram_hash_layer_info l;
  memcpy(&l, layer.data(), sizeof(l));
  CHECK(l.layer == 14);
  engram_hasher_close(h);
}

TEST_CASE("engram_hash_seq arrays and engram_token_request", "[abi][hash]") {
  engram_hasher* h = OpenHasher();
  engram_session* s = Open();
  const int32_t tokens[3] = {5, 6, 7};
  const engram_hash_seq seq{sizeof(engram_hash_seq), tokens, 3, nullptr, 0};
  constexpr size_t kOlderSeq = offsetof(engram_hash_seq, history);  // no history: none read
  uint64_t out[3 * engram::testing::kHeads];
  CheckInputStruct("engram_hash_seq", &seq, sizeof(seq), kOlderSeq, [h, &out](const void* p) {
    return engram_hash(h, 14, static_cast<const engram_hash_seq*>(p), 1, 0,
                       engram::testing::kHeads, ENGRAM_HASH_COMPRESSED_IDS, out,
                       3 * engram::testing::kHeads);
  });
  engram_hash_seq two[2] = {seq, seq};
  two[1].size = sizeof(engram_hash_seq) + 8;
  CHECK(engram_hash(h, 14, two, 2, 0, engram::testing::kHeads, ENGRAM_HASH_COMPRESSED_IDS, out,
                    3 * engram::testing::kHeads) == -EINVAL);
  CHECK(LastErrorHas("engram_hash_seq 1"));

  uint64_t* rows = nullptr;
  uint8_t* dest = nullptr;
  constexpr uint64_t kCap = 3 * engram::testing::kHeads;
  REQUIRE(engram_alloc(s, kCap * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, kCap * ENGRAM_ROW_BYTES, reinterpret_cast<void**>(&dest)) == 0);
  engram_token_request r{};
  r.size = sizeof(r);
  r.layer = 14;
  r.flags = ENGRAM_HASH_COMPRESSED_IDS;
  r.seqs = &seq;
  r.n_seqs = 1;
  r.rows = rows;
  r.rows_cap = kCap;
  r.dest = dest;
  CheckInputStruct("engram_token_request", &r, sizeof(r), offsetof(engram_token_request, dest),
                   [s, h](const void* p) {
                     return engram_gather_tokens(s, h, static_cast<const engram_token_request*>(p),
                                                 -1);
                   });
  // The request's sequences go through the same checks.
  r.seqs = two;
  r.n_seqs = 2;
  CHECK(engram_gather_tokens(s, h, &r, -1) == -EINVAL);
  CHECK(LastErrorHas("engram_hash_seq 1"));
  engram_session_close(s);
  engram_hasher_close(h);
}
