// The kernel library's error reporting, shared by its translation units: one thread-local
// message behind engram_kernels_last_error().
#pragma once

#include "kernels/gpu_compat.h"

namespace engram::kernels {

// Records the message for the calling thread and returns -err.
int Fail(int err, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Fail() for a runtime call that returned `status`: -ENODEV (no device or driver), -ENOTSUP,
// or -EIO, with the call and the runtime's error named.
int FailRuntime(const char* call, gpuError_t status);

// The calling thread's last message ("" if none).
const char* LastError();

}  // namespace engram::kernels
