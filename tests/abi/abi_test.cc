// A client compiled against an older (smaller structs) or a newer (larger structs) engram.h than
// the library's, against a real engramd: both behave as engram.h's conventions 2-4 say. The
// header copy comes from make_header.py; ENGRAM_ABI_OLDER or ENGRAM_ABI_NEWER says which.
#include ENGRAM_ABI_HEADER

#include <errno.h>
#include <string.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "engram/gpu.h"
#include "testkit/daemon_test_util.h"

#if defined(ENGRAM_ABI_OLDER) == defined(ENGRAM_ABI_NEWER)
#error "define one of ENGRAM_ABI_OLDER and ENGRAM_ABI_NEWER"
#endif

namespace {

using engram::testing::Daemon;
using engram::testing::FillRows;
using engram::testing::FirstBadRow;

// engram_connect_options_init as ENGRAM_0.1 exported it, before it took a size: what a binary
// linked against that release calls.
extern "C" void engram_connect_options_init_old(struct engram_connect_options* ret_options);
__asm__(".symver engram_connect_options_init_old, engram_connect_options_init@ENGRAM_0.1");

Daemon& D() {
  static Daemon daemon;
  return daemon;
}

engram_session* Connect() {
  engram_connect_options o;
  // Guard bytes past the caller's struct must stay untouched.
  unsigned char guard[sizeof(o) + 16];
  memset(guard, 0xAB, sizeof(guard));
  engram_connect_options_init(reinterpret_cast<engram_connect_options*>(guard), sizeof(o));
  CHECK(guard[sizeof(o)] == 0xAB);
  memcpy(&o, guard, sizeof(o));
  CHECK(o.size == sizeof(o));
  CHECK(o.data_bytes == 0);  // the daemon's default
#ifdef ENGRAM_ABI_NEWER
  CHECK(o.future_option == 0);
#endif
  o.socket_path = D().socket().c_str();
  engram_session* s = nullptr;
  INFO(engram_last_error());
  REQUIRE(engram_session_open(&o, &s) == 0);
  return s;
}

}  // namespace

TEST_CASE("options and requests of the caller's size are served") {
  engram_session* s = Connect();
  constexpr uint64_t n = 100;
  uint64_t* rows = nullptr;
  uint8_t* out = nullptr;
  REQUIRE(engram_alloc(s, n * 8, reinterpret_cast<void**>(&rows)) == 0);
  REQUIRE(engram_alloc(s, n * ENGRAM_ROW_BYTES, reinterpret_cast<void**>(&out)) == 0);
  FillRows(rows, n, engram::testing::kRows, 7);
  engram_gather_request r;
  memset(&r, 0, sizeof(r));
  r.size = sizeof(r);
  r.layer = 14;
  r.rows = rows;
  r.num_rows = n;
  r.dest = out;
  INFO(engram_last_error());
  REQUIRE(engram_gather(s, &r, -1) == 0);
  CHECK(FirstBadRow(14, rows, n, out) == -1);
#ifdef ENGRAM_ABI_NEWER
  // A field this library does not know, set: refused rather than ignored.
  r.future_flags = 1;
  CHECK(engram_gather(s, &r, -1) == -E2BIG);
  CHECK(strstr(engram_last_error(), "engram_gather_request") != nullptr);
  engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  o.socket_path = D().socket().c_str();
  o.future_option = 5;
  engram_session* refused = nullptr;
  CHECK(engram_session_open(&o, &refused) == -E2BIG);
  CHECK(refused == nullptr);
#endif
  r.size = 4;  // not even the size field
  CHECK(engram_gather(s, &r, -1) == -EINVAL);
  CHECK(strstr(engram_last_error(), "engram_gather_request has size 4") != nullptr);
  engram_session_close(s);
}

TEST_CASE("output structs are filled to the caller's size") {
  engram_session* s = Connect();
  // Room for three, capacity two: the stride is the caller's struct size.
  std::vector<engram_table_info> tables(3);
  for (auto& t : tables) {
    memset(&t, 0xAB, sizeof(t));
    t.size = sizeof(t);
  }
  size_t count = 0;
  INFO(engram_last_error());
  REQUIRE(engram_list_tables(s, tables.data(), 2, &count) == 0);
  REQUIRE(count == 2);
  CHECK(tables[0].layer == 1);
  CHECK(tables[1].layer == 14);
  CHECK(tables[1].row_bytes == ENGRAM_ROW_BYTES);
  CHECK(tables[1].covered_end == engram::testing::kRows);
  CHECK(tables[1].size == sizeof(engram_table_info));
  CHECK(tables[2].layer == 0xABABABABu);  // past capacity: untouched
#ifdef ENGRAM_ABI_NEWER
  CHECK(tables[0].future_field == 0);  // unknown to the library: zero
  CHECK(tables[1].future_field == 0);
#else
  CHECK(tables[1].layout == ENGRAM_LAYOUT_CHECKPOINT);
  CHECK(tables[1].files >= 1);  // the last field this header has
#endif

  unsigned char buffer[sizeof(engram_session_stats) + 16];
  memset(buffer, 0xAB, sizeof(buffer));
  auto* stats = reinterpret_cast<engram_session_stats*>(buffer);
  stats->size = sizeof(engram_session_stats);
  REQUIRE(engram_get_session_stats(s, stats) == 0);
  CHECK(stats->requests_submitted == 0);
  CHECK(stats->size == sizeof(engram_session_stats));
  CHECK(buffer[sizeof(engram_session_stats)] == 0xAB);  // nothing past the caller's size
#ifdef ENGRAM_ABI_NEWER
  CHECK(stats->future_counter == 0);
#else
  CHECK(stats->latency_max_ns == 0);
#endif
  engram_session_close(s);
}

TEST_CASE("binaries linked against ENGRAM_0.1 keep its engram_connect_options_init") {
  unsigned char buffer[64];
  memset(buffer, 0xAB, sizeof(buffer));
  engram_connect_options_init_old(reinterpret_cast<engram_connect_options*>(buffer));
  size_t size;
  memcpy(&size, buffer, sizeof(size));
  CHECK(size == 48);  // ENGRAM_0.1's struct
  CHECK(buffer[8] == 0);
  CHECK(buffer[48] == 0xAB);  // nothing written past it
}

TEST_CASE("one engram_last_error for every part of the library") {
  engram_hasher* h = nullptr;
  CHECK(engram_hasher_open("/nonexistent-model", nullptr, &h) == -ENOENT);
  const std::string message = engram_last_error();
  CHECK(message.find("/nonexistent-model") != std::string::npos);
  // The deprecated names stay exported for binaries built against them: the same message.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  CHECK(message == engram_hash_last_error());
  CHECK(engram_gpu_register(nullptr, 0, nullptr) == -EINVAL);
  CHECK(std::string(engram_last_error()).find("engram_gpu_register") != std::string::npos);
  CHECK(std::string(engram_gpu_last_error()) == engram_last_error());
#pragma GCC diagnostic pop
  CHECK(engram_row_bytes() == ENGRAM_ROW_BYTES);
}
