// The names calls had before ENGRAM_0.6 (engram.h, convention 8), still exported for programs
// built against them: each forwards to the call's current name.
#include "engram/engram.h"

// engram.h declares these names deprecated; their own definitions are the one place that names
// them on purpose, and must not warn.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

extern "C" {

int engram_connect(const struct engram_connect_options* options, engram_session** ret_session) {
  return engram_session_open(options, ret_session);
}

void engram_close(engram_session* session) { engram_session_close(session); }

int engram_map_table(engram_session* s, uint32_t layer, engram_table_map** ret_map) {
  return engram_table_map_open(s, layer, ret_map);
}

void engram_unmap_table(engram_table_map* map) { engram_table_map_close(map); }

}  // extern "C"

#pragma GCC diagnostic pop
