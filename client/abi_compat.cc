// The forms of exported functions whose signatures changed, kept for binaries linked against an
// older libengram_client: each is bound to name@ENGRAM_0.N (a non-default version) with the
// symver attribute, and forwards to the current function. They live in their own object because
// ld drops a non-default version whose object also defines the plain name.
#include <stddef.h>

#include <vector>

#include "engram/engram.h"

extern "C" {

// ENGRAM_0.1: engram_connect_options_init took no size; callers passed that release's struct,
// which ended after timeout_ns (flags and reserved came in 0.4).
__attribute__((symver("engram_connect_options_init@ENGRAM_0.1"))) ENGRAM_API void
engram_connect_options_init_v0_1(struct engram_connect_options* ret_options) {
  engram_connect_options_init(ret_options, offsetof(struct engram_connect_options, flags));
}

// ENGRAM_0.2: engram_hasher_opts_init took no size; likewise.
__attribute__((symver("engram_hasher_opts_init@ENGRAM_0.2"))) ENGRAM_API void
engram_hasher_opts_init_v0_2(struct engram_hasher_opts* opts) {
  engram_hasher_opts_init(opts, sizeof(*opts));
}

// ENGRAM_0.1's engram_table_info had no size field.
struct engram_table_info_v0_1 {
  uint32_t layer_id;
  uint32_t row_bytes;
  uint64_t num_rows;
  uint64_t covered_begin;
  uint64_t covered_end;
  uint32_t layout;
  uint32_t files;
  uint64_t data_bytes;
};

__attribute__((symver("engram_list_tables@ENGRAM_0.1"))) ENGRAM_API int engram_list_tables_v0_1(
    engram_session* session, struct engram_table_info_v0_1* ret_tables, size_t capacity,
    size_t* ret_count) {
  engram_table_info blank{};
  blank.size = sizeof(blank);
  std::vector<engram_table_info> tables(capacity, blank);
  size_t count = 0;
  if (int rc = engram_list_tables(session, tables.data(), capacity, &count); rc < 0) return rc;
  for (size_t i = 0; i < count && i < capacity; ++i) {
    const engram_table_info& t = tables[i];
    ret_tables[i] = {t.layer,       t.row_bytes, t.num_rows, t.covered_begin,
                     t.covered_end, t.layout,    t.files,    t.data_bytes};
  }
  *ret_count = count;
  return 0;
}

}  // extern "C"
