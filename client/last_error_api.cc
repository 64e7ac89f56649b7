// engram_last_error() and its older per-area names, over client/last_error.h's message.
// A program links this once: inside libengram_client.so, or, for a test that links the static
// parts of the library instead of the shared one, into the program itself. A program that links
// the shared library must not link this too: its own copy would hide the library's message.
#include "client/last_error.h"
#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/hash.h"

extern "C" {

ENGRAM_API const char* engram_last_error(void) { return engram::client::LastError(); }

// Deprecated: the names of the same message from before there was one for both libraries
// (libengram_kernels_* exports engram_kernels_last_error likewise).
ENGRAM_API const char* engram_hash_last_error(void) { return engram::client::LastError(); }
ENGRAM_API const char* engram_gpu_last_error(void) { return engram::client::LastError(); }

// Declared in engram/engram.h for libengram_kernels_*; exported in ENGRAM_PRIVATE.
ENGRAM_API void engram_internal_set_last_error(const char* message) {
  engram::client::SetErrorMessage(0, message != nullptr ? message : "");
}

}  // extern "C"
