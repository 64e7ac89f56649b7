// libFuzzer target: everything a peer can send during the handshake and afterwards on the
// socket (HELLO, WELCOME, ERROR, any header) and an arena header a client maps.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "protocol/codec.h"

using namespace engram::protocol;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CodecError error;
  engram_msg_header header;
  if (DecodeHeader(data, size, &header, &error)) {
    if (header.bytes != size) abort();
  } else if (error.message.empty()) {
    abort();
  }
  engram_msg_hello hello;
  if (DecodeHello(data, size, &hello, &error)) {
    if (hello.version_major != ENGRAM_PROTOCOL_MAJOR) abort();
    if (hello.client_name[ENGRAM_CLIENT_NAME_BYTES - 1] != '\0') abort();
  }
  engram_msg_welcome welcome;
  if (DecodeWelcome(data, size, &welcome, &error)) {
    if (welcome.slots == 0 || welcome.slots > ENGRAM_MAX_SLOTS) abort();
  } else if (error.code == 0) {
    abort();
  }
  if (DecodeError(data, size, &error)) {
    if (error.message.size() > ENGRAM_ERROR_MESSAGE_MAX) abort();
  }
  engram_arena_header arena;
  memset(&arena, 0, sizeof(arena));
  memcpy(&arena, data, size < sizeof(arena) ? size : sizeof(arena));
  uint64_t mapped = 0;
  if (size >= 8) memcpy(&mapped, data + size - 8, 8);
  if (CheckArenaHeader(arena, mapped, &error)) {
    ArenaLayout layout;
    if (!ComputeArenaLayout(arena.slots, arena.data_bytes, &layout)) abort();
    if (layout.data_offset % ENGRAM_ARENA_ALIGN != 0) abort();
    if (layout.data_offset + layout.data_bytes != mapped) abort();
  }
  return 0;
}
