// The one per-thread error message of libengram_client: engram_last_error() returns it, and
// every part of the library (sessions, hashing, GPU registration, and libengram_kernels through
// engram_internal_set_last_error) records its failures here.
#pragma once

#include <string>

namespace engram::client {

// Records the message for the calling thread and returns neg_errno.
int SetError(int neg_errno, const char* format, ...) __attribute__((format(printf, 2, 3)));
int SetErrorMessage(int neg_errno, std::string message);

// The calling thread's last message ("" if none).
const char* LastError();

}  // namespace engram::client

// Exported in the ENGRAM_PRIVATE version node, not in the public headers: lets the kernel
// library (a separate shared object built from this tree) record its failures where
// engram_last_error() finds them.
extern "C" void engram_internal_set_last_error(const char* message);
