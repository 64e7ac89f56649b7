// The library's one thread-local error message (last_error_api.cc exports it).
#include "client/last_error.h"

#include <stdarg.h>
#include <stdio.h>

#include <utility>

namespace engram::client {
namespace {
thread_local std::string g_last_error;
}  // namespace

int SetError(int neg_errno, const char* format, ...) {
  char buffer[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  g_last_error = buffer;
  return neg_errno;
}

int SetErrorMessage(int neg_errno, std::string message) {
  g_last_error = std::move(message);
  return neg_errno;
}

const char* LastError() { return g_last_error.c_str(); }

}  // namespace engram::client
