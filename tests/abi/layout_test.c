/* The layout of every struct of include/engram/, as a C compiler sees it: sizes and offsets of
 * the 64-bit ABI, pinned field by field. A change here breaks binaries built against an earlier
 * header; growing a struct (a field at its end, engram.h convention 2) changes only its size.
 * The checks are compile-time; main() prints what it checked. */
#include <stddef.h>
#include <stdio.h>

#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/gpu_hash.h"
#include "engram/gpu_submit.h"
#include "engram/hash.h"
#include "engram/protocol.h"
#include "engram/row.h"

#define AT(type, field, offset) \
  _Static_assert(offsetof(struct type, field) == (offset), #type "." #field " moved")
#define SIZE(type, bytes) _Static_assert(sizeof(struct type) == (bytes), #type " changed size")

_Static_assert(sizeof(void*) == 8, "the pinned layout is the 64-bit one");

/* engram/engram.h */
SIZE(engram_connect_options, 56);
AT(engram_connect_options, socket_path, 8);
AT(engram_connect_options, data_bytes, 16);
AT(engram_connect_options, slots, 24);
AT(engram_connect_options, spin_ns, 28);
AT(engram_connect_options, client_name, 32);
AT(engram_connect_options, timeout_ns, 40);
AT(engram_connect_options, flags, 48);
AT(engram_connect_options, reserved, 52);
SIZE(engram_device_ring, 56);
AT(engram_device_ring, header, 8);
AT(engram_device_ring, sq, 16);
AT(engram_device_ring, status, 24);
AT(engram_device_ring, data, 32);
AT(engram_device_ring, data_bytes, 40);
AT(engram_device_ring, slots, 48);
AT(engram_device_ring, reserved, 52);
SIZE(engram_gather_request, 48);
AT(engram_gather_request, layer, 8);
AT(engram_gather_request, flags, 12);
AT(engram_gather_request, rows, 16);
AT(engram_gather_request, num_rows, 24);
AT(engram_gather_request, dest, 32);
AT(engram_gather_request, dest_offsets, 40);
SIZE(engram_table_info, 64);
AT(engram_table_info, layer, 8);
AT(engram_table_info, row_bytes, 12);
AT(engram_table_info, num_rows, 16);
AT(engram_table_info, covered_begin, 24);
AT(engram_table_info, covered_end, 32);
AT(engram_table_info, layout, 40);
AT(engram_table_info, files, 44);
AT(engram_table_info, data_bytes, 48);
AT(engram_table_info, tier, 56);
SIZE(engram_session_stats, 120);
AT(engram_session_stats, session_id, 8);
AT(engram_session_stats, client_sleeps, 104);
AT(engram_session_stats, rows_in_place, 112);
SIZE(engram_table_map_info, 56);
AT(engram_table_map_info, layer, 8);
AT(engram_table_map_info, row_bytes, 12);
AT(engram_table_map_info, covered_begin, 16);
AT(engram_table_map_info, covered_end, 24);
AT(engram_table_map_info, base, 32);
AT(engram_table_map_info, map_bytes, 40);
AT(engram_table_map_info, kind, 48);
SIZE(engram_gpu_row_cache, 72);
AT(engram_gpu_row_cache, guard_page_bytes, 64);
SIZE(engram_gpu_cache_hit, 16);
SIZE(engram_gpu_cache_misses, 56);
SIZE(engram_token_request, 72);
AT(engram_token_request, layer, 8);
AT(engram_token_request, flags, 12);
AT(engram_token_request, seqs, 16);
AT(engram_token_request, n_seqs, 24);
AT(engram_token_request, head_begin, 32);
AT(engram_token_request, head_end, 36);
AT(engram_token_request, tp_size, 40);
AT(engram_token_request, tp_rank, 44);
AT(engram_token_request, rows, 48);
AT(engram_token_request, rows_cap, 56);
AT(engram_token_request, dest, 64);

/* engram/hash.h */
SIZE(engram_hasher_opts, 32);
AT(engram_hasher_opts, flags, 8);
AT(engram_hasher_opts, reserved, 12);
AT(engram_hasher_opts, derived_path, 16);
AT(engram_hasher_opts, compressed_pad_id, 24);
SIZE(engram_hasher_info, 40);
AT(engram_hasher_info, num_layers, 8);
AT(engram_hasher_info, max_ngram_size, 12);
AT(engram_hasher_info, heads_per_order, 16);
AT(engram_hasher_info, heads_per_layer, 20);
AT(engram_hasher_info, vocab_size, 24);
AT(engram_hasher_info, compressed_vocab_size, 28);
AT(engram_hasher_info, compressed_pad_id, 32);
SIZE(engram_hash_layer_info, 24);
AT(engram_hash_layer_info, layer, 8);
AT(engram_hash_layer_info, reserved, 12);
AT(engram_hash_layer_info, num_rows, 16);
SIZE(engram_hash_seq, 40);
AT(engram_hash_seq, tokens, 8);
AT(engram_hash_seq, n_tokens, 16);
AT(engram_hash_seq, history, 24);
AT(engram_hash_seq, n_history, 32);

/* engram/gpu_hash.h */
SIZE(engram_gpu_hash_args, 72);
AT(engram_gpu_hash_args, layer, 8);
AT(engram_gpu_hash_args, flags, 12);
AT(engram_gpu_hash_args, head_begin, 16);
AT(engram_gpu_hash_args, head_end, 20);
AT(engram_gpu_hash_args, tokens, 24);
AT(engram_gpu_hash_args, n_tokens, 32);
AT(engram_gpu_hash_args, n_seqs, 36);
AT(engram_gpu_hash_args, seq_starts, 40);
AT(engram_gpu_hash_args, history, 48);
AT(engram_gpu_hash_args, rows, 56);
AT(engram_gpu_hash_args, error_count, 64);

/* engram/gpu_submit.h */
SIZE(engram_gpu_queue_options, 24);
AT(engram_gpu_queue_options, timeout_ns, 8);
AT(engram_gpu_queue_options, flags, 16);
SIZE(engram_gpu_request, 40);
AT(engram_gpu_request, layer, 8);
AT(engram_gpu_request, flags, 12);
AT(engram_gpu_request, rows, 16);
AT(engram_gpu_request, num_rows, 24);
AT(engram_gpu_request, dest, 32);
SIZE(engram_gpu_dequant, 40);
AT(engram_gpu_dequant, index_map, 8);
AT(engram_gpu_dequant, tokens, 16);
AT(engram_gpu_dequant, heads, 20);
AT(engram_gpu_dequant, out, 24);
AT(engram_gpu_dequant, bad_index_count, 32);

/* engram/protocol.h: shared with the daemon (its header pins the arena's offsets too). */
SIZE(engram_msg_header, 16);
SIZE(engram_msg_hello, 80);
SIZE(engram_msg_welcome, 64);
SIZE(engram_msg_error, 24);
SIZE(engram_wire_table, 64);
SIZE(engram_msg_tables, 24);
SIZE(engram_wire_session_stats, 128);
SIZE(engram_msg_stats, 144);
SIZE(engram_msg_map_table, 24);
SIZE(engram_msg_table_mapped, 56);
AT(engram_msg_table_mapped, state_index, 48);
SIZE(engram_table_state_entry, 8);
SIZE(engram_table_state_page, 128);
AT(engram_table_state_page, daemon_alive, 64);
SIZE(engram_arena_header, 4096);
SIZE(engram_sqe, 64);
SIZE(engram_cqe, 16);
SIZE(engram_request_status, 256);

/* The deprecated field names (engram.h, convention 9) alias `layer`, at its offset: binaries
 * built against them read and write the same bytes. Using them is what is checked here. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
AT(engram_gather_request, table, 8);
AT(engram_table_info, layer_id, 8);
AT(engram_table_map_info, layer_id, 8);
AT(engram_token_request, table, 8);
AT(engram_hash_layer_info, layer_id, 8);
AT(engram_gpu_hash_args, layer_id, 8);
AT(engram_gpu_request, table, 8);
#pragma GCC diagnostic pop

/* engram/row.h and engram/abi.h */
_Static_assert(ENGRAM_ROW_BYTES == 264, "row size");
_Static_assert(ENGRAM_MAX_STRUCT_BYTES == 4096, "the size-field bound of engram.h convention 3");
/* Flag values a binary compiled against an older header passes as numbers. */
_Static_assert(ENGRAM_CONNECT_DEVICE_SUBMIT == 0x1u && ENGRAM_CONNECT_GATHER_VIA_DAEMON == 0x2u,
               "connect flags");
_Static_assert(ENGRAM_GATHER_IN_PLACE == 0x1u && ENGRAM_GATHER_VIA_DAEMON == 0x2u,
               "gather request flags");

int main(void) {
  printf("layouts of 15 ABI structs and 16 protocol structs checked at compile time\n");
  return 0;
}
