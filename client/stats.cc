// A session's statistics (engram_get_session_stats): the daemon's counters for it and the
// library's own, and the names of the fields for bindings without the headers.
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "client/abi_struct.h"
#include "client/last_error.h"
#include "client/session.h"
#include "engram/engram.h"
#include "engram/protocol.h"
#include "engram/session_stats.h"

using engram::client::ControlExchange;
using engram::client::SetError;
using engram::client::WriteStruct;

extern "C" {

int engram_get_session_stats(engram_session* s, struct engram_session_stats* ret_stats) {
  if (s == nullptr || ret_stats == nullptr) {
    return SetError(-EINVAL, "engram_get_session_stats needs a session and ret_stats");
  }
  // Checked before the round trip: a refused struct costs no message to the daemon.
  if (int rc = engram::client::CheckOutput("engram_session_stats", ret_stats,
                                           sizeof(engram_session_stats));
      rc < 0) {
    return rc;
  }
  std::vector<uint8_t> reply;
  if (int rc = ControlExchange(s, ENGRAM_MSG_SESSION_STATS, ENGRAM_MSG_STATS, &reply); rc < 0) {
    return rc;
  }
  engram_msg_stats m;
  if (reply.size() != sizeof(m)) return SetError(-EPROTO, "STATS reply of %zu bytes", reply.size());
  memcpy(&m, reply.data(), sizeof(m));
  struct engram_session_stats out {};
  out.size = sizeof(out);
  out.session_id = m.stats.session_id;
#define ENGRAM_STATS_COPY_(field, origin, type, metric, help) \
  ENGRAM_SESSION_ON_WIRE_##origin(out.field = m.stats.field;) \
      ENGRAM_SESSION_LIBRARY_##origin(out.field = s->counters.field.load();)
  ENGRAM_SESSION_COUNTERS(ENGRAM_STATS_COPY_)
#undef ENGRAM_STATS_COPY_
  return WriteStruct("engram_session_stats", out, ret_stats);
}

// The ABI's layout of engram_session_stats (LP64): the list in engram/session_stats.h is only
// ever appended to.
static_assert(sizeof(size_t) != 8 || (offsetof(engram_session_stats, session_id) == 8 &&
                                      offsetof(engram_session_stats, doorbells) == 64 &&
                                      offsetof(engram_session_stats, rows_in_place) == 112),
              "engram_session_stats' fields keep their places");

int engram_session_stats_field(size_t index, const char** ret_name, const char** ret_help) {
  struct Field {
    const char* name;
    const char* help;
  };
  static constexpr Field kFields[] = {
      {"session_id", "The session's id, as engramd numbers sessions"},
#define ENGRAM_STATS_NAME_(field, origin, type, metric, help) {#field, help},
      ENGRAM_SESSION_COUNTERS(ENGRAM_STATS_NAME_)
#undef ENGRAM_STATS_NAME_
  };
  constexpr size_t kCount = sizeof(kFields) / sizeof(kFields[0]);
  static_assert(
      sizeof(struct engram_session_stats) == sizeof(size_t) + kCount * 8 || sizeof(size_t) != 8,
      "one uint64_t of engram_session_stats per field named here");
  if (ret_name == nullptr || ret_help == nullptr) {
    return SetError(-EINVAL, "engram_session_stats_field needs ret_name and ret_help");
  }
  if (index >= kCount) {
    return SetError(-ERANGE, "engram_session_stats has %zu fields after size; no field %zu", kCount,
                    index);
  }
  *ret_name = kFields[index].name;
  *ret_help = kFields[index].help;
  return 0;
}

}  // extern "C"
