// What this build of the library is, for callers without its headers: its release
// (engram_version, engram/version.h), the protocol it speaks and the size of a row.
#include "engram/version.h"

#include "engram/engram.h"
#include "engram/protocol.h"

extern "C" {

const char* engram_version(void) { return ENGRAM_VERSION; }

void engram_protocol_version(uint32_t* ret_major, uint32_t* ret_minor) {
  if (ret_major != nullptr) *ret_major = ENGRAM_PROTOCOL_MAJOR;
  if (ret_minor != nullptr) *ret_minor = ENGRAM_PROTOCOL_MINOR;
}

uint32_t engram_row_bytes(void) { return ENGRAM_ROW_BYTES; }

}  // extern "C"
