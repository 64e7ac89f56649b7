// The protocol codec on its own: arena layout, HELLO decoding and the request decoder's statuses.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "protocol/codec.h"

using namespace engram::protocol;

TEST_CASE("arena layout is aligned and adds up", "[codec]") {
  ArenaLayout l;
  REQUIRE(ComputeArenaLayout(64, 1000, &l));
  CHECK(l.sq_offset == 4096);
  CHECK(l.cq_offset == 4096 + 64 * 64);
  CHECK(l.status_offset == l.cq_offset + 128 * 16);
  CHECK(l.data_offset % 4096 == 0);
  CHECK(l.data_offset >= l.status_offset + 64 * 256);
  CHECK(l.data_bytes == 4096);
  CHECK(l.arena_bytes == l.data_offset + 4096);
  CHECK_FALSE(ComputeArenaLayout(0, 4096, &l));
  CHECK_FALSE(ComputeArenaLayout(ENGRAM_MAX_SLOTS + 1, 4096, &l));
  CHECK_FALSE(ComputeArenaLayout(8, 0, &l));
}

TEST_CASE("HELLO decoding", "[codec]") {
  engram_msg_hello h{};
  FillHeader(&h.header, ENGRAM_MSG_HELLO, sizeof(h), 0);
  h.version_major = ENGRAM_PROTOCOL_MAJOR;
  memset(h.client_name, 'x', sizeof(h.client_name));
  engram_msg_hello out;
  CodecError e;
  REQUIRE(DecodeHello(reinterpret_cast<uint8_t*>(&h), sizeof(h), &out, &e));
  CHECK(out.client_name[ENGRAM_CLIENT_NAME_BYTES - 1] == '\0');
  h.version_major = 0;
  CHECK_FALSE(DecodeHello(reinterpret_cast<uint8_t*>(&h), sizeof(h), &out, &e));
  CHECK(e.code == ENGRAM_STATUS_FAILED_PRECONDITION);
  CHECK(e.message == "protocol version mismatch: client speaks 0.0, engramd speaks " +
                         std::to_string(ENGRAM_PROTOCOL_MAJOR) + "." +
                         std::to_string(ENGRAM_PROTOCOL_MINOR));
  h.version_major = ENGRAM_PROTOCOL_MAJOR;
  h.header.bytes = 12;
  CHECK_FALSE(DecodeHello(reinterpret_cast<uint8_t*>(&h), sizeof(h), &out, &e));
  CHECK(e.message == "message header says 12 bytes, 80 arrived");
  std::vector<uint8_t> err = EncodeError(ENGRAM_STATUS_NOT_FOUND, "no such thing", 9);
  CHECK_FALSE(DecodeWelcome(err.data(), err.size(), nullptr, &e));
  CHECK(e.code == ENGRAM_STATUS_NOT_FOUND);
  CHECK(e.message == "no such thing");
}

TEST_CASE("request decoder statuses", "[codec]") {
  std::vector<uint64_t> region(1024, 0);
  const TableBounds tables[] = {
      {.layer_id = 1, .num_rows = 100, .covered_begin = 10, .covered_end = 50}};
  RequestContext ctx{.slots = 4,
                     .max_rows = 16,
                     .data = reinterpret_cast<const uint8_t*>(region.data()),
                     .data_bytes = region.size() * 8,
                     .tables = tables};
  engram_sqe sqe{.ticket = (1 << 16) | 2,
                 .opcode = ENGRAM_OP_GATHER,
                 .flags = 0,
                 .table = 1,
                 .num_rows = 4,
                 .rows_offset = 0,
                 .dest_offset = 64};
  for (int i = 0; i < 4; ++i) region[i] = 10 + i;
  DecodedRequest r;
  bool slot_ok;
  CodecError e;
  REQUIRE(DecodeRequest(sqe, ctx, &r, &slot_ok, &e));
  CHECK(r.slot == 2);
  CHECK(r.rows == std::vector<uint64_t>{10, 11, 12, 13});

  auto fails = [&](engram_sqe s, int code, const std::string& text) {
    CodecError err;
    CHECK_FALSE(DecodeRequest(s, ctx, &r, &slot_ok, &err));
    CHECK(err.code == code);
    CHECK(err.message.find(text) != std::string::npos);
  };
  region[2] = 9;
  fails(sqe, ENGRAM_STATUS_OUT_OF_RANGE, "row 9 (index 2) is outside the rows [10, 50)");
  region[2] = 100;
  fails(sqe, ENGRAM_STATUS_OUT_OF_RANGE, "row 100 (index 2) is past the end of layer 1");
  region[2] = 12;
  engram_sqe s = sqe;
  s.table = 2;
  fails(s, ENGRAM_STATUS_NOT_FOUND, "no table for layer 2 (served: 1)");
  s = sqe;
  s.num_rows = 17;
  fails(s, ENGRAM_STATUS_RESOURCE_EXHAUSTED, "17 rows in one request, the limit is 16");
  s = sqe;
  s.ticket = (1 << 16) | 4;
  fails(s, ENGRAM_STATUS_INVALID_ARGUMENT, "slot 4 of 4");
  CHECK_FALSE(slot_ok);
  s = sqe;
  s.dest_offset = ctx.data_bytes - 4 * 264 + 1;
  fails(s, ENGRAM_STATUS_INVALID_ARGUMENT, "run past");
  s = sqe;
  s.rows_offset = ~0ull - 7;
  fails(s, ENGRAM_STATUS_INVALID_ARGUMENT, "outside the");
  s = sqe;
  s.num_rows = 1ull << 62;
  ctx.max_rows = ~0ull;
  fails(s, ENGRAM_STATUS_INVALID_ARGUMENT, "outside the");
  ctx.max_rows = 16;
  s = sqe;
  s.flags = ENGRAM_SQE_DEST_OFFSETS;
  s.dest_offsets_offset = 512;
  region[64] = ~0ull - 100;  // wraps when added to the base
  fails(s, ENGRAM_STATUS_INVALID_ARGUMENT, "destination of row index 0");
  s.flags = 0x80;
  fails(s, ENGRAM_STATUS_INVALID_ARGUMENT, "unknown flags");
  s = sqe;
  s.reserved[1] = 1;
  fails(s, ENGRAM_STATUS_INVALID_ARGUMENT, "reserved[1]");
  s = sqe;
  s.reserved[0] = 7;
  fails(s, ENGRAM_STATUS_INVALID_ARGUMENT, "engram_sqe.reserved[0] is 7, not 0");
}

// Every reserved field of a message a client sends is refused when not zero, with an error
// naming the field, so that a later minor version can give it a meaning.
TEST_CASE("reserved fields of client messages must be zero", "[codec]") {
  CodecError e;
  engram_msg_hello h{};
  FillHeader(&h.header, ENGRAM_MSG_HELLO, sizeof(h), 0);
  h.version_major = ENGRAM_PROTOCOL_MAJOR;
  h.reserved = 3;
  engram_msg_hello hello_out;
  CHECK_FALSE(DecodeHello(reinterpret_cast<uint8_t*>(&h), sizeof(h), &hello_out, &e));
  CHECK(e.code == ENGRAM_STATUS_INVALID_ARGUMENT);
  CHECK(e.message == "engram_msg_hello.reserved is 3, not 0");
  h.reserved = 0;
  h.header.reserved = 1;
  CHECK_FALSE(DecodeHello(reinterpret_cast<uint8_t*>(&h), sizeof(h), &hello_out, &e));
  CHECK(e.message == "engram_msg_header.reserved is 1, not 0");

  engram_msg_map_table m{};
  FillHeader(&m.header, ENGRAM_MSG_MAP_TABLE, sizeof(m), 5);
  m.layer_id = 14;
  engram_msg_map_table map_out{};
  REQUIRE(DecodeMapTable(reinterpret_cast<uint8_t*>(&m), sizeof(m), &map_out, &e));
  CHECK(map_out.layer_id == 14);
  m.reserved = 0x10;
  CHECK_FALSE(DecodeMapTable(reinterpret_cast<uint8_t*>(&m), sizeof(m), &map_out, &e));
  CHECK(e.code == ENGRAM_STATUS_INVALID_ARGUMENT);
  CHECK(e.message == "engram_msg_map_table.reserved is 16, not 0");
  m.reserved = 0;
  m.header.bytes = sizeof(m) - 4;
  CHECK_FALSE(DecodeMapTable(reinterpret_cast<uint8_t*>(&m), sizeof(m) - 4, &map_out, &e));
  CHECK(e.message == "MAP_TABLE of 20 bytes, protocol 1.x defines 24");
  m.header.bytes = sizeof(m);
  m.header.type = ENGRAM_MSG_LIST_TABLES;
  CHECK_FALSE(DecodeMapTable(reinterpret_cast<uint8_t*>(&m), sizeof(m), &map_out, &e));
  CHECK(e.message == "message type 4 is not MAP_TABLE (10)");
}

TEST_CASE("pinning PREFETCH and ADMIT_DONE entries carry their request and need the feature",
          "[codec]") {
  std::vector<uint64_t> region(64, 20);
  const TableBounds tables[] = {{.layer_id = 14, .num_rows = 100, .covered_end = 100}};
  RequestContext ctx{.slots = 4,
                     .max_rows = 1 << 20,
                     .data = reinterpret_cast<const uint8_t*>(region.data()),
                     .data_bytes = region.size() * 8,
                     .tables = tables,
                     .admit = true};
  const engram_sqe pin{.ticket = (3 << 16) | 1,
                       .opcode = ENGRAM_OP_PREFETCH,
                       .flags = ENGRAM_SQE_PIN,
                       .table = 14,
                       .num_rows = 2,
                       .reserved = {77, 5'000'000}};
  const engram_sqe done{
      .ticket = (3 << 16) | 2, .opcode = ENGRAM_OP_ADMIT_DONE, .reserved = {77, 0}};
  DecodedRequest r;
  bool slot_ok;
  CodecError e;
  REQUIRE(DecodeRequest(pin, ctx, &r, &slot_ok, &e));
  CHECK(r.pin);
  CHECK(r.admission_id == 77);
  CHECK(r.admission_ttl_ns == 5'000'000);
  CHECK(r.rows == std::vector<uint64_t>{20, 20});
  REQUIRE(DecodeRequest(done, ctx, &r, &slot_ok, &e));
  CHECK(r.opcode == ENGRAM_OP_ADMIT_DONE);
  CHECK(r.admission_id == 77);
  CHECK(r.rows.empty());
  auto fails = [&](engram_sqe s, const RequestContext& c, const std::string& text) {
    CodecError err;
    CHECK_FALSE(DecodeRequest(s, c, &r, &slot_ok, &err));
    CHECK(err.code == ENGRAM_STATUS_INVALID_ARGUMENT);
    INFO(err.message);
    CHECK(err.message.find(text) != std::string::npos);
  };
  RequestContext without = ctx;
  without.admit = false;
  fails(pin, without, "PREFETCH with ENGRAM_SQE_PIN on a session that was not granted");
  fails(done, without, "ADMIT_DONE on a session that was not granted");
  engram_sqe s = done;
  s.reserved[1] = 1;
  fails(s, ctx, "engram_sqe.reserved[1] is 1");
  s = done;
  s.num_rows = 1;
  fails(s, ctx, "ADMIT_DONE with flags, rows, a table or offsets set");
  s = pin;
  s.flags = ENGRAM_SQE_PIN | ENGRAM_SQE_DEST_OFFSETS;
  fails(s, ctx, "PREFETCH with flags 0x3");
  // A plain PREFETCH still has no reserved words; a gather no pin.
  s = pin;
  s.flags = 0;
  fails(s, ctx, "engram_sqe.reserved[0] is 77");
  s = pin;
  s.opcode = ENGRAM_OP_GATHER;
  s.reserved[0] = s.reserved[1] = 0;
  fails(s, ctx, "unknown flags 0x2");
}

TEST_CASE("PREFETCH entries are checked like gathers and carry no destination", "[codec]") {
  std::vector<uint64_t> region(ENGRAM_PREFETCH_MAX_ROWS + 8, 20);
  const TableBounds tables[] = {
      {.layer_id = 14, .num_rows = 100, .covered_begin = 10, .covered_end = 50}};
  RequestContext ctx{.slots = 4,
                     .max_rows = 1 << 20,
                     .data = reinterpret_cast<const uint8_t*>(region.data()),
                     .data_bytes = region.size() * 8,
                     .tables = tables};
  // Three rows at the very end of the data region: no room for three destination rows there,
  // which a prefetch does not need.
  const engram_sqe sqe{.ticket = (3 << 16) | 1,
                       .opcode = ENGRAM_OP_PREFETCH,
                       .table = 14,
                       .num_rows = 3,
                       .rows_offset = ctx.data_bytes - 24};
  DecodedRequest r;
  bool slot_ok;
  CodecError e;
  REQUIRE(DecodeRequest(sqe, ctx, &r, &slot_ok, &e));
  CHECK(r.opcode == ENGRAM_OP_PREFETCH);
  CHECK(r.rows == std::vector<uint64_t>{20, 20, 20});
  auto fails = [&](engram_sqe s, int code, const std::string& text) {
    CodecError err;
    CHECK_FALSE(DecodeRequest(s, ctx, &r, &slot_ok, &err));
    CHECK(err.code == code);
    INFO(err.message);
    CHECK(err.message.find(text) != std::string::npos);
  };
  engram_sqe s = sqe;
  s.flags = ENGRAM_SQE_DEST_OFFSETS;
  fails(s, ENGRAM_STATUS_INVALID_ARGUMENT, "PREFETCH with flags 0x1 or a destination set");
  s = sqe;
  s.dest_offset = 64;
  fails(s, ENGRAM_STATUS_INVALID_ARGUMENT, "a destination set");
  s = sqe;
  s.rows_offset = 0;
  s.num_rows = ENGRAM_PREFETCH_MAX_ROWS + 1;
  fails(s, ENGRAM_STATUS_RESOURCE_EXHAUSTED, "limit is 8192 (ENGRAM_PREFETCH_MAX_ROWS)");
  region[region.size() - 2] = 50;
  fails(sqe, ENGRAM_STATUS_OUT_OF_RANGE, "row 50 (index 1) is outside the rows [10, 50)");
  s = sqe;
  s.table = 1;
  fails(s, ENGRAM_STATUS_NOT_FOUND, "no table for layer 1 (served: 14)");
}
