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
