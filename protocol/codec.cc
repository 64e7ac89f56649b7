// Decoding and checking of socket messages and submission entries (see protocol_codec.h).
#include "protocol/codec.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace engram::protocol {
namespace {

bool Fail(CodecError* error, int32_t code, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

bool Fail(CodecError* error, int32_t code, const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  error->code = code;
  error->message = buffer;
  return false;
}

uint64_t AlignUp(uint64_t value, uint64_t align) { return (value + align - 1) / align * align; }

// [offset, offset + count * unit) inside [0, limit), without overflow.
bool RangeInside(uint64_t offset, uint64_t count, uint64_t unit, uint64_t limit) {
  if (offset > limit) return false;
  if (count != 0 && unit > (limit - offset) / count) return false;
  return offset + count * unit <= limit;
}

}  // namespace

bool ComputeArenaLayout(uint32_t slots, uint64_t data_bytes, ArenaLayout* ret_layout) {
  if (slots == 0 || slots > ENGRAM_MAX_SLOTS) return false;
  if (data_bytes == 0 || data_bytes > (uint64_t{1} << 46)) return false;
  ArenaLayout layout;
  layout.slots = slots;
  layout.cq_entries = slots * 2;
  layout.sq_offset = sizeof(engram_arena_header);
  layout.cq_offset = layout.sq_offset + uint64_t{slots} * sizeof(engram_sqe);
  layout.status_offset = layout.cq_offset + uint64_t{layout.cq_entries} * sizeof(engram_cqe);
  layout.data_offset = AlignUp(
      layout.status_offset + uint64_t{slots} * sizeof(engram_request_status), ENGRAM_ARENA_ALIGN);
  layout.data_bytes = AlignUp(data_bytes, ENGRAM_ARENA_ALIGN);
  layout.arena_bytes = layout.data_offset + layout.data_bytes;
  *ret_layout = layout;
  return true;
}

bool CheckArenaHeader(const engram_arena_header& header, uint64_t mapped_bytes,
                      CodecError* ret_error) {
  if (header.magic != ENGRAM_ARENA_MAGIC) {
    return Fail(ret_error, ENGRAM_STATUS_DATA_LOSS, "arena magic is 0x%08x, expected 0x%08x",
                header.magic, ENGRAM_ARENA_MAGIC);
  }
  if (header.version_major != ENGRAM_PROTOCOL_MAJOR) {
    return Fail(ret_error, ENGRAM_STATUS_FAILED_PRECONDITION,
                "arena version %u.%u, this library speaks %u.%u", header.version_major,
                header.version_minor, ENGRAM_PROTOCOL_MAJOR, ENGRAM_PROTOCOL_MINOR);
  }
  ArenaLayout layout;
  if (header.header_bytes != sizeof(engram_arena_header) ||
      !ComputeArenaLayout(header.slots, header.data_bytes, &layout) ||
      layout.cq_entries != header.cq_entries || layout.sq_offset != header.sq_offset ||
      layout.cq_offset != header.cq_offset || layout.status_offset != header.status_offset ||
      layout.data_offset != header.data_offset || layout.data_bytes != header.data_bytes ||
      layout.arena_bytes != header.arena_bytes || header.arena_bytes != mapped_bytes) {
    return Fail(ret_error, ENGRAM_STATUS_DATA_LOSS,
                "arena header layout (slots %u, data %llu bytes, arena %llu bytes) does not match "
                "the %llu bytes mapped",
                header.slots, static_cast<unsigned long long>(header.data_bytes),
                static_cast<unsigned long long>(header.arena_bytes),
                static_cast<unsigned long long>(mapped_bytes));
  }
  return true;
}

void FillHeader(engram_msg_header* header, uint16_t type, uint32_t bytes, uint32_t request_id) {
  header->magic = ENGRAM_MSG_MAGIC;
  header->type = type;
  header->reserved = 0;
  header->bytes = bytes;
  header->request_id = request_id;
}

bool DecodeHeader(const uint8_t* data, size_t size, engram_msg_header* ret_header,
                  CodecError* ret_error) {
  if (size < sizeof(engram_msg_header)) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "message of %zu bytes is shorter than the %zu-byte header", size,
                sizeof(engram_msg_header));
  }
  engram_msg_header header;
  memcpy(&header, data, sizeof(header));
  if (header.magic != ENGRAM_MSG_MAGIC) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "message magic is 0x%08x, expected 0x%08x (not an engramd client?)", header.magic,
                ENGRAM_MSG_MAGIC);
  }
  if (header.bytes != size) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "message header says %u bytes, %zu arrived", header.bytes, size);
  }
  // Reserved fields are zero, so that a later minor version can give them a meaning.
  if (header.reserved != 0) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "engram_msg_header.reserved is %u, not 0", header.reserved);
  }
  if (header.type == 0 || header.type > ENGRAM_MSG_TABLE_MAPPED) {
    return Fail(ret_error, ENGRAM_STATUS_UNIMPLEMENTED, "unknown message type %u", header.type);
  }
  *ret_header = header;
  return true;
}

bool DecodeHello(const uint8_t* data, size_t size, engram_msg_hello* ret_hello,
                 CodecError* ret_error) {
  engram_msg_header header;
  if (!DecodeHeader(data, size, &header, ret_error)) return false;
  if (header.type != ENGRAM_MSG_HELLO) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "first message has type %u, expected HELLO (%u)", header.type, ENGRAM_MSG_HELLO);
  }
  // The version fields sit at the same place in every major version: check them before the
  // size, which a future major may change.
  if (size < offsetof(engram_msg_hello, slots)) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT, "HELLO of %zu bytes has no version",
                size);
  }
  engram_msg_hello hello;
  memset(&hello, 0, sizeof(hello));
  memcpy(&hello, data, size < sizeof(hello) ? size : sizeof(hello));
  if (hello.version_major != ENGRAM_PROTOCOL_MAJOR) {
    return Fail(ret_error, ENGRAM_STATUS_FAILED_PRECONDITION,
                "protocol version mismatch: client speaks %u.%u, engramd speaks %u.%u",
                hello.version_major, hello.version_minor, ENGRAM_PROTOCOL_MAJOR,
                ENGRAM_PROTOCOL_MINOR);
  }
  if (size != sizeof(engram_msg_hello)) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "HELLO of %zu bytes, protocol %u.x defines %zu", size, ENGRAM_PROTOCOL_MAJOR,
                sizeof(engram_msg_hello));
  }
  if (hello.reserved != 0) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT, "engram_msg_hello.reserved is %u, not 0",
                hello.reserved);
  }
  hello.client_name[ENGRAM_CLIENT_NAME_BYTES - 1] = '\0';
  *ret_hello = hello;
  return true;
}

bool DecodeMapTable(const uint8_t* data, size_t size, engram_msg_map_table* ret_request,
                    CodecError* ret_error) {
  engram_msg_header header;
  if (!DecodeHeader(data, size, &header, ret_error)) return false;
  if (header.type != ENGRAM_MSG_MAP_TABLE) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT, "message type %u is not MAP_TABLE (%u)",
                header.type, ENGRAM_MSG_MAP_TABLE);
  }
  if (size != sizeof(engram_msg_map_table)) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "MAP_TABLE of %zu bytes, protocol %u.x defines %zu", size, ENGRAM_PROTOCOL_MAJOR,
                sizeof(engram_msg_map_table));
  }
  engram_msg_map_table request;
  memcpy(&request, data, sizeof(request));
  if (request.reserved != 0) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "engram_msg_map_table.reserved is %u, not 0", request.reserved);
  }
  *ret_request = request;
  return true;
}

bool DecodeError(const uint8_t* data, size_t size, CodecError* ret_error) {
  engram_msg_header header;
  if (!DecodeHeader(data, size, &header, ret_error)) return false;
  if (header.type != ENGRAM_MSG_ERROR || size < sizeof(engram_msg_error)) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT, "malformed ERROR message");
  }
  engram_msg_error error;
  memcpy(&error, data, sizeof(error));
  if (error.message_bytes != size - sizeof(engram_msg_error) ||
      error.message_bytes > ENGRAM_ERROR_MESSAGE_MAX) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "ERROR message text of %u bytes in a %zu-byte message", error.message_bytes, size);
  }
  if (error.code <= ENGRAM_STATUS_OK || error.code > ENGRAM_STATUS_DATA_LOSS) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT, "ERROR message with code %d",
                error.code);
  }
  ret_error->code = error.code;
  ret_error->message.assign(reinterpret_cast<const char*>(data) + sizeof(engram_msg_error),
                            error.message_bytes);
  return true;
}

bool DecodeWelcome(const uint8_t* data, size_t size, engram_msg_welcome* ret_welcome,
                   CodecError* ret_error) {
  engram_msg_header header;
  if (!DecodeHeader(data, size, &header, ret_error)) return false;
  if (header.type == ENGRAM_MSG_ERROR) {
    DecodeError(data, size, ret_error);  // either the refusal it carries or why it is garbage
    return false;
  }
  if (header.type != ENGRAM_MSG_WELCOME || size < offsetof(engram_msg_welcome, slots)) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "engramd answered HELLO with message type %u, expected WELCOME", header.type);
  }
  engram_msg_welcome welcome;
  memset(&welcome, 0, sizeof(welcome));
  memcpy(&welcome, data, size < sizeof(welcome) ? size : sizeof(welcome));
  if (welcome.version_major != ENGRAM_PROTOCOL_MAJOR) {
    return Fail(ret_error, ENGRAM_STATUS_FAILED_PRECONDITION,
                "protocol version mismatch: client speaks %u.%u, engramd speaks %u.%u",
                ENGRAM_PROTOCOL_MAJOR, ENGRAM_PROTOCOL_MINOR, welcome.version_major,
                welcome.version_minor);
  }
  if (size != sizeof(engram_msg_welcome)) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT, "WELCOME of %zu bytes, expected %zu",
                size, sizeof(engram_msg_welcome));
  }
  if (welcome.slots == 0 || welcome.slots > ENGRAM_MAX_SLOTS) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT, "WELCOME grants %u slots",
                welcome.slots);
  }
  *ret_welcome = welcome;
  return true;
}

std::vector<uint8_t> EncodeError(int32_t code, const std::string& message, uint32_t request_id) {
  size_t text =
      message.size() < ENGRAM_ERROR_MESSAGE_MAX ? message.size() : ENGRAM_ERROR_MESSAGE_MAX;
  std::vector<uint8_t> out(sizeof(engram_msg_error) + text);
  engram_msg_error error;
  FillHeader(&error.header, ENGRAM_MSG_ERROR, static_cast<uint32_t>(out.size()), request_id);
  error.code = code;
  error.message_bytes = static_cast<uint32_t>(text);
  memcpy(out.data(), &error, sizeof(error));
  memcpy(out.data() + sizeof(error), message.data(), text);
  return out;
}

namespace {

// DecodeRequest's steps, in the order it takes them; each fails naming what was wrong.

// The entry's opcode, flags and reserved words. Sets *ret_nop for a valid NOP or ADMIT_DONE,
// which have nothing more to check.
bool CheckEntryKind(const engram_sqe& sqe, const RequestContext& context, bool* ret_nop,
                    CodecError* ret_error) {
  *ret_nop = false;
  const bool pin = sqe.opcode == ENGRAM_OP_PREFETCH && (sqe.flags & ENGRAM_SQE_PIN) != 0;
  const bool admit_done = sqe.opcode == ENGRAM_OP_ADMIT_DONE;
  if ((pin || admit_done) && !context.admit) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "%s on a session that was not granted admission prefetch "
                "(ENGRAM_FEATURE_ADMIT, protocol 1.6)",
                pin ? "PREFETCH with ENGRAM_SQE_PIN" : "ADMIT_DONE");
  }
  for (int i = 0; i < 2; ++i) {
    // A pinning PREFETCH carries its request's id and deadline there, ADMIT_DONE the id.
    if (pin || (admit_done && i == 0)) continue;
    if (sqe.reserved[i] != 0) {
      return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                  "engram_sqe.reserved[%d] is %llu, not 0", i,
                  static_cast<unsigned long long>(sqe.reserved[i]));
    }
  }
  if (sqe.opcode == ENGRAM_OP_NOP) {
    if (sqe.flags != 0 || sqe.num_rows != 0 || sqe.table != 0) {
      return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT, "NOP with flags, rows or a table set");
    }
    *ret_nop = true;
    return true;
  }
  if (admit_done) {
    if (sqe.flags != 0 || sqe.num_rows != 0 || sqe.table != 0 || sqe.rows_offset != 0 ||
        sqe.dest_offset != 0 || sqe.dest_offsets_offset != 0) {
      return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                  "ADMIT_DONE with flags, rows, a table or offsets set");
    }
    *ret_nop = true;
    return true;
  }
  if (sqe.opcode != ENGRAM_OP_GATHER && sqe.opcode != ENGRAM_OP_PREFETCH) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT, "unknown opcode %u", sqe.opcode);
  }
  if (sqe.opcode == ENGRAM_OP_PREFETCH && ((sqe.flags & ~ENGRAM_SQE_PIN) != 0 ||
                                           sqe.dest_offset != 0 || sqe.dest_offsets_offset != 0)) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "PREFETCH with flags 0x%x or a destination set (it has none)", sqe.flags);
  }
  if (sqe.opcode == ENGRAM_OP_GATHER && (sqe.flags & ~ENGRAM_SQE_DEST_OFFSETS) != 0) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT, "unknown flags 0x%x", sqe.flags);
  }
  return true;
}

// The served table the entry names, or nullptr (naming the layers served).
const TableBounds* FindTable(const engram_sqe& sqe, const RequestContext& context,
                             CodecError* ret_error) {
  for (const TableBounds& t : context.tables) {
    if (t.layer_id == sqe.table) return &t;
  }
  std::string served;
  for (const TableBounds& t : context.tables) {
    served += (served.empty() ? "" : ", ") + std::to_string(t.layer_id);
  }
  Fail(ret_error, ENGRAM_STATUS_NOT_FOUND, "no table for layer %u (served: %s)", sqe.table,
       served.empty() ? "none" : served.c_str());
  return nullptr;
}

// The number of rows against the session's limit and PREFETCH's.
bool CheckRowCount(const engram_sqe& sqe, const RequestContext& context, CodecError* ret_error) {
  if (sqe.num_rows > context.max_rows) {
    return Fail(ret_error, ENGRAM_STATUS_RESOURCE_EXHAUSTED,
                "%llu rows in one request, the limit is %llu (--max-rows-per-request)",
                static_cast<unsigned long long>(sqe.num_rows),
                static_cast<unsigned long long>(context.max_rows));
  }
  if (sqe.opcode == ENGRAM_OP_PREFETCH && sqe.num_rows > ENGRAM_PREFETCH_MAX_ROWS) {
    return Fail(ret_error, ENGRAM_STATUS_RESOURCE_EXHAUSTED,
                "%llu rows in one PREFETCH entry, the limit is %u (ENGRAM_PREFETCH_MAX_ROWS)",
                static_cast<unsigned long long>(sqe.num_rows), ENGRAM_PREFETCH_MAX_ROWS);
  }
  return true;
}

// The row ids, the destination offsets and the destination rows lie inside the data region.
bool CheckRegions(const engram_sqe& sqe, const RequestContext& context, CodecError* ret_error) {
  const uint64_t n = sqe.num_rows;
  if (sqe.rows_offset % 8 != 0 || !RangeInside(sqe.rows_offset, n, 8, context.data_bytes)) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "row ids at data offset %llu (%llu × 8 bytes) are unaligned or outside the "
                "%llu-byte data region",
                static_cast<unsigned long long>(sqe.rows_offset),
                static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(context.data_bytes));
  }
  if ((sqe.flags & ENGRAM_SQE_DEST_OFFSETS) != 0) {
    if (sqe.dest_offsets_offset % 8 != 0 ||
        !RangeInside(sqe.dest_offsets_offset, n, 8, context.data_bytes)) {
      return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                  "destination offsets at data offset %llu (%llu × 8 bytes) are unaligned or "
                  "outside the %llu-byte data region",
                  static_cast<unsigned long long>(sqe.dest_offsets_offset),
                  static_cast<unsigned long long>(n),
                  static_cast<unsigned long long>(context.data_bytes));
    }
    if (sqe.dest_offset > context.data_bytes) {
      return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                  "destination base %llu is outside the %llu-byte data region",
                  static_cast<unsigned long long>(sqe.dest_offset),
                  static_cast<unsigned long long>(context.data_bytes));
    }
  } else if (sqe.opcode != ENGRAM_OP_PREFETCH &&
             !RangeInside(sqe.dest_offset, n, ENGRAM_ROW_BYTES, context.data_bytes)) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "%llu rows at data offset %llu run past the %llu-byte data region",
                static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(sqe.dest_offset),
                static_cast<unsigned long long>(context.data_bytes));
  }
  return true;
}

// Copies the row ids and (scattered) the destination offsets out of shared memory, then checks
// the copies: the client may rewrite its arena at any moment.
bool CopyRows(const engram_sqe& sqe, const RequestContext& context, DecodedRequest* request,
              CodecError* ret_error) {
  const uint64_t n = sqe.num_rows;
  request->rows.resize(n);
  if (n != 0) memcpy(request->rows.data(), context.data + sqe.rows_offset, n * 8);
  if ((sqe.flags & ENGRAM_SQE_DEST_OFFSETS) == 0) return true;
  request->dest_offsets.resize(n);
  if (n != 0) memcpy(request->dest_offsets.data(), context.data + sqe.dest_offsets_offset, n * 8);
  const uint64_t room = context.data_bytes - sqe.dest_offset;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t off = request->dest_offsets[i];
    if (off > room || room - off < ENGRAM_ROW_BYTES) {
      return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                  "destination of row index %llu (base %llu + offset %llu) runs past the "
                  "%llu-byte data region",
                  static_cast<unsigned long long>(i),
                  static_cast<unsigned long long>(sqe.dest_offset),
                  static_cast<unsigned long long>(off),
                  static_cast<unsigned long long>(context.data_bytes));
    }
  }
  return true;
}

// Every copied row id is inside the table and inside the rows this copy of it holds.
bool CheckRowIds(const std::vector<uint64_t>& rows, const TableBounds& table,
                 CodecError* ret_error) {
  for (uint64_t i = 0; i < rows.size(); ++i) {
    const uint64_t row = rows[i];
    if (row >= table.num_rows) {
      return Fail(ret_error, ENGRAM_STATUS_OUT_OF_RANGE,
                  "row %llu (index %llu) is past the end of layer %u (%llu rows)",
                  static_cast<unsigned long long>(row), static_cast<unsigned long long>(i),
                  table.layer_id, static_cast<unsigned long long>(table.num_rows));
    }
    if (row < table.covered_begin || row >= table.covered_end) {
      return Fail(ret_error, ENGRAM_STATUS_OUT_OF_RANGE,
                  "row %llu (index %llu) is outside the rows [%llu, %llu) this copy of layer %u "
                  "holds",
                  static_cast<unsigned long long>(row), static_cast<unsigned long long>(i),
                  static_cast<unsigned long long>(table.covered_begin),
                  static_cast<unsigned long long>(table.covered_end), table.layer_id);
    }
  }
  return true;
}

}  // namespace

bool DecodeRequest(const engram_sqe& sqe, const RequestContext& context,
                   DecodedRequest* ret_request, bool* ret_slot_valid, CodecError* ret_error) {
  *ret_slot_valid = false;
  const uint32_t slot = ENGRAM_TICKET_SLOT(sqe.ticket);
  if ((sqe.ticket >> 16) == 0 || slot >= context.slots) {
    return Fail(ret_error, ENGRAM_STATUS_INVALID_ARGUMENT,
                "ticket 0x%llx names slot %u of %u (or generation 0)",
                static_cast<unsigned long long>(sqe.ticket), slot, context.slots);
  }
  *ret_slot_valid = true;
  DecodedRequest& request = *ret_request;
  request.ticket = sqe.ticket;
  request.slot = slot;
  request.opcode = sqe.opcode;
  request.rows.clear();
  request.dest_offsets.clear();
  request.pin = sqe.opcode == ENGRAM_OP_PREFETCH && (sqe.flags & ENGRAM_SQE_PIN) != 0;
  request.admission_id = sqe.reserved[0];
  request.admission_ttl_ns = sqe.opcode == ENGRAM_OP_PREFETCH ? sqe.reserved[1] : 0;
  bool nop = false;
  if (!CheckEntryKind(sqe, context, &nop, ret_error)) return false;
  if (nop) return true;
  const TableBounds* table = FindTable(sqe, context, ret_error);
  if (table == nullptr) return false;
  request.table_index = static_cast<uint32_t>(table - context.tables.data());
  if (!CheckRowCount(sqe, context, ret_error) || !CheckRegions(sqe, context, ret_error)) {
    return false;
  }
  request.dest_offset = sqe.dest_offset;
  return CopyRows(sqe, context, &request, ret_error) &&
         CheckRowIds(request.rows, *table, ret_error);
}

const char* StatusCodeName(int32_t code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS"};
  if (code < 0 || code > ENGRAM_STATUS_DATA_LOSS) return "UNKNOWN";
  return kNames[code];
}

ssize_t ReceiveMessage(int fd, uint8_t* buffer, size_t capacity, int* ret_fds, int max_fds,
                       int* ret_nfds) {
  constexpr int kMaxFds = 4;
  iovec iov{.iov_base = buffer, .iov_len = capacity};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  int nfds = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int passed;
      std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (ret_fds != nullptr && nfds < max_fds) {
        ret_fds[nfds++] = passed;
      } else {
        close(passed);
      }
    }
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    for (int i = 0; i < nfds; ++i) close(ret_fds[i]);
    nfds = 0;
    n = -EMSGSIZE;
  }
  if (ret_nfds != nullptr) *ret_nfds = nfds;
  return n;
}

ssize_t SendMessage(int fd, const void* data, size_t size, const int* fds, int nfds) {
  constexpr int kMaxFds = 4;
  if (nfds < 0 || nfds > kMaxFds) return -EINVAL;
  iovec iov{.iov_base = const_cast<void*>(data), .iov_len = size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))];
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t n;
  do {
    n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return n < 0 ? -errno : n;
}

}  // namespace engram::protocol
