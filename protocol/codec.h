// Decoding and checking of what crosses the process boundary: socket messages and submission
// entries. Dependency-light on purpose (standard library and include/engram/protocol.h only), so
// that the fuzz targets build standalone with clang and the client library can share it.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engram/protocol.h"

namespace engram::protocol {

// Receives one message from a SOCK_SEQPACKET socket with up to `max_fds` descriptors passed
// alongside (received O_CLOEXEC; any beyond `max_fds` are closed). Retries EINTR. Returns the
// message size (0: the peer closed the connection) or -errno; -EMSGSIZE when the message did
// not fit `capacity`, in which case every passed descriptor is closed and *ret_nfds is 0.
ssize_t ReceiveMessage(int fd, uint8_t* buffer, size_t capacity, int* ret_fds, int max_fds,
                       int* ret_nfds);

// Sends one message with `nfds` (at most 4) descriptors passed alongside (SCM_RIGHTS), without
// blocking and without SIGPIPE; retries EINTR. Returns the bytes sent or -errno (-EAGAIN when
// the peer's receive queue is full: the daemon never waits on a client that does not read).
ssize_t SendMessage(int fd, const void* data, size_t size, const int* fds, int nfds);

// Why something was refused: a wire status code and a message naming what was wrong.
struct CodecError {
  int32_t code = ENGRAM_STATUS_OK;
  std::string message;
};

// Where each part of an arena lies, derived from its slot count and data size alone.
struct ArenaLayout {
  uint32_t slots = 0;
  uint32_t cq_entries = 0;
  uint64_t sq_offset = 0;
  uint64_t cq_offset = 0;
  uint64_t status_offset = 0;
  uint64_t data_offset = 0;
  uint64_t data_bytes = 0;
  uint64_t arena_bytes = 0;
};
// `data_bytes` is rounded up to ENGRAM_ARENA_ALIGN. Returns false when slots is 0 or above
// ENGRAM_MAX_SLOTS or the sizes overflow.
bool ComputeArenaLayout(uint32_t slots, uint64_t data_bytes, ArenaLayout* ret_layout);

// Checks that a header (as read by a client) is one this code can use and matches the layout
// computed from its slots and data size.
bool CheckArenaHeader(const engram_arena_header& header, uint64_t mapped_bytes,
                      CodecError* ret_error);

// Fills a message header.
void FillHeader(engram_msg_header* header, uint16_t type, uint32_t bytes, uint32_t request_id);

// Checks the common header of a received message of `size` bytes: magic, a size that matches
// the datagram, a known type. Does not look at the body.
bool DecodeHeader(const uint8_t* data, size_t size, engram_msg_header* ret_header,
                  CodecError* ret_error);

// Decodes HELLO and checks the version: a different major version is refused with
// FailedPrecondition naming both versions; garbage with InvalidArgument.
bool DecodeHello(const uint8_t* data, size_t size, engram_msg_hello* ret_hello,
                 CodecError* ret_error);

// Decodes MAP_TABLE: its size and its reserved field (0); the layer is the caller's to check.
bool DecodeMapTable(const uint8_t* data, size_t size, engram_msg_map_table* ret_request,
                    CodecError* ret_error);

// Client side: decodes WELCOME, or turns an ERROR message into the error it carries.
bool DecodeWelcome(const uint8_t* data, size_t size, engram_msg_welcome* ret_welcome,
                   CodecError* ret_error);

// Builds an ERROR message (the text is cut at ENGRAM_ERROR_MESSAGE_MAX bytes).
std::vector<uint8_t> EncodeError(int32_t code, const std::string& message, uint32_t request_id);

// Decodes an ERROR message.
bool DecodeError(const uint8_t* data, size_t size, CodecError* ret_error);

// The bounds of a table a request may name.
struct TableBounds {
  uint32_t layer_id = 0;
  uint64_t num_rows = 0;       // the whole logical table
  uint64_t covered_begin = 0;  // rows this copy serves
  uint64_t covered_end = 0;
};

// What the decoder needs to know about the session.
struct RequestContext {
  uint32_t slots = 0;
  uint64_t max_rows = 0;          // rows per request
  const uint8_t* data = nullptr;  // the data region (shared memory: read once, by copying)
  uint64_t data_bytes = 0;
  std::span<const TableBounds> tables;
  bool admit = false;  // the session was granted ENGRAM_FEATURE_ADMIT
};

// A request after it was copied out of shared memory and checked. Only these copies are used
// afterwards, whatever the client writes into its arena meanwhile.
struct DecodedRequest {
  uint64_t ticket = 0;
  uint32_t slot = 0;
  uint16_t opcode = 0;
  uint32_t table_index = 0;  // index into RequestContext::tables
  uint64_t dest_offset = 0;  // in the data region
  std::vector<uint64_t> rows;
  std::vector<uint64_t> dest_offsets;  // relative to dest_offset; empty: contiguous rows
  // PREFETCH with ENGRAM_SQE_PIN (pin) and ADMIT_DONE: the request's id; its ttl (0: the
  // daemon's limit).
  bool pin = false;
  uint64_t admission_id = 0;
  uint64_t admission_ttl_ns = 0;
};

// Decodes a submission entry that the caller has already copied out of the ring.
// Returns false with a precise error; when the error can be reported to the client (the ticket's
// slot is valid), *ret_slot_valid is true and ret_request->ticket/slot are set.
bool DecodeRequest(const engram_sqe& sqe, const RequestContext& context,
                   DecodedRequest* ret_request, bool* ret_slot_valid, CodecError* ret_error);

// Name of a status code ("RESOURCE_EXHAUSTED").
const char* StatusCodeName(int32_t code);

}  // namespace engram::protocol
