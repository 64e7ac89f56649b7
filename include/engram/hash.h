/* engram/hash.h: DeepSeek-V4.1 Engram row ids computed on the host from token ids.
 *
 * An engramd client hashes the tokens a step will process into the absolute row ids it then
 * gathers, without a round trip through the GPU. The hash is bit-exact with the model's
 * reference (docs/hashing.md): compressed vocabulary, per-layer odd multipliers, XOR mix over
 * n-grams of orders 2..N, modulo per-head primes, plus head offsets.
 *
 * Conventions: those of engram/engram.h (size-prefixed structs that grow, -errno returns,
 * ret_* out-parameters, one engram_last_error() message per thread, a table's id called
 * `layer`), and:
 *  1. engram_hasher is an opaque handle. It is immutable once opened: any number of threads may
 *     call the functions below on one hasher at the same time. engram_hasher_close() must not
 *     race with any other call on that hasher.
 *  2. Sequences carry their own history (the ids before their new tokens): the hasher keeps no
 *     per-sequence state, so speculative tokens that are later rejected need no rollback.
 *
 * Example: the rows of TP rank 1 of 4 for a decode step of two sequences, layer 14.
 *
 *   engram_hasher* h;
 *   if (engram_hasher_open("/models/DeepSeek-V4.1-Flash", NULL, &h) < 0) {
 *     fprintf(stderr, "%s\n", engram_last_error());
 *   }
 *   uint32_t hb, he;
 *   engram_hasher_rank_heads(h, 4, 1, &hb, &he);            // heads [6, 12)
 *   struct engram_hash_seq seqs[2] = {
 *     {sizeof(struct engram_hash_seq), next_a, 6, hist_a, 3},  // 1 token + 5 drafts
 *     {sizeof(struct engram_hash_seq), next_b, 6, hist_b, 3},
 *   };
 *   uint64_t rows[12 * 6];                                   // 12 tokens x 6 heads
 *   int rc = engram_hash(h, 14, seqs, 2, hb, he, 0, rows, 12 * 6);
 */
#ifndef ENGRAM_HASH_H_
#define ENGRAM_HASH_H_

#include <stddef.h>
#include <stdint.h>

#include "engram/abi.h" /* ENGRAM_API, ENGRAM_ASSERT_SIZE */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct engram_hasher engram_hasher;

/* engram_hasher_opts.flags */
/* Open without a derived-tables file: only compressed ids can be hashed, and compressed_pad_id
 * must be set. */
#define ENGRAM_HASHER_COMPRESSED_ONLY (1u << 0)

struct engram_hasher_opts {
  size_t size;               /* sizeof(struct engram_hasher_opts) */
  uint32_t flags;            /* ENGRAM_HASHER_* */
  uint32_t reserved;         /* 0 */
  const char* derived_path;  /* derived-tables file; NULL: <model_dir>/engram-hash.bin */
  int64_t compressed_pad_id; /* compressed id of the pad token; -1: take it from the file */
};
ENGRAM_ASSERT_SIZE(struct engram_hasher_opts, 32);

/* Fills the caller's struct of `size` bytes (sizeof *opts) with the defaults (no flags,
 * default path, pad id from the file) and sets its size field. A caller whose struct ends
 * before compressed_pad_id gets the pad id from the file. Writes nothing for a NULL struct or
 * a size out of bounds (engram.h, convention 3). */
ENGRAM_API void engram_hasher_opts_init(struct engram_hasher_opts* opts, size_t size);

/* Opens the hasher of the model in model_dir (its config.json, and the derived-tables file
 * written by tools/engram_vocab.py). opts may be NULL.
 * Returns 0, -ENOENT (a file is missing), -EINVAL (bad config or options), -ESTALE (the
 * derived tables do not match config.json/tokenizer.json), -EBADMSG (corrupt derived tables),
 * -ENOMEM. */
ENGRAM_API int engram_hasher_open(const char* model_dir, const struct engram_hasher_opts* opts,
                                  engram_hasher** ret_hasher);

/* Frees the hasher; NULL is a no-op. */
ENGRAM_API void engram_hasher_close(engram_hasher* hasher);

struct engram_hasher_info {
  size_t size;             /* set by the caller: sizeof(struct engram_hasher_info) */
  uint32_t num_layers;     /* Engram layers (tables) */
  uint32_t max_ngram_size; /* orders 2..max_ngram_size */
  uint32_t heads_per_order;
  uint32_t heads_per_layer; /* (max_ngram_size - 1) * heads_per_order */
  uint32_t vocab_size;      /* tokenizer ids accepted; 0 if only compressed ids */
  uint32_t compressed_vocab_size;
  uint32_t compressed_pad_id;
};
ENGRAM_ASSERT_SIZE(struct engram_hasher_info, 40);

/* Fills the fields that fit in ret_info->size. Returns 0 or -EINVAL. */
ENGRAM_API int engram_hasher_get_info(const engram_hasher* hasher,
                                      struct engram_hasher_info* ret_info);

struct engram_hash_layer_info {
  size_t size; /* set by the caller: sizeof(struct engram_hash_layer_info) */
  union {
    uint32_t layer;                                   /* the model layer, e.g. 1 or 14 */
    uint32_t layer_id ENGRAM_DEPRECATED("use layer"); /* older name of `layer` */
  };
  uint32_t reserved;
  uint64_t num_rows; /* rows of the layer's table: sum of its head primes */
};
ENGRAM_ASSERT_SIZE(struct engram_hash_layer_info, 24);

/* Describes the index-th Engram layer (0 <= index < num_layers). Returns 0 or -EINVAL. */
ENGRAM_API int engram_hasher_get_layer(const engram_hasher* hasher, uint32_t index,
                                       struct engram_hash_layer_info* ret_info);

/* The heads [*ret_head_begin, *ret_head_end) a tensor-parallel rank owns (heads split evenly
 * into tp_size contiguous ranges). Returns 0 or -EINVAL (tp_size does not divide the heads,
 * or tp_rank >= tp_size). */
ENGRAM_API int engram_hasher_rank_heads(const engram_hasher* hasher, uint32_t tp_size,
                                        uint32_t tp_rank, uint32_t* ret_head_begin,
                                        uint32_t* ret_head_end);

/* The rows [*ret_row_begin, *ret_row_end) that heads [head_begin, head_end) of `layer` own:
 * one contiguous range. Returns 0, -ENOENT (not an Engram layer) or -EINVAL. */
ENGRAM_API int engram_hasher_head_rows(const engram_hasher* hasher, uint32_t layer,
                                       uint32_t head_begin, uint32_t head_end,
                                       uint64_t* ret_row_begin, uint64_t* ret_row_end);

/* The max_ngram_size odd multipliers of `layer` (ret_multipliers[k] multiplies the id at lag
 * k), as the hash uses them: what a re-implementation of the hash (the GPU hasher in
 * engram/gpu_hash.h) needs beyond engram_hasher_head_rows. cap is the capacity of
 * ret_multipliers in entries. Returns 0, -ENOENT (not an Engram layer), -ENOSPC (cap below
 * max_ngram_size) or -EINVAL. */
ENGRAM_API int engram_hasher_multipliers(const engram_hasher* hasher, uint32_t layer,
                                         int64_t* ret_multipliers, size_t cap);

/* One sequence of a hash call: its new token ids, and the ids right before them (oldest
 * first, only the last max_ngram_size - 1 matter; fewer means the sequence starts there and
 * the pad id fills in). Chunks hashed with the previous chunk's tail as history give exactly
 * the rows of the whole sequence. In an array of sequences the first one's size is the
 * stride: every sequence must carry the same size. */
struct engram_hash_seq {
  size_t size; /* sizeof(struct engram_hash_seq) */
  const int32_t* tokens;
  size_t n_tokens;
  const int32_t* history;
  size_t n_history;
};
ENGRAM_ASSERT_SIZE(struct engram_hash_seq, 40);

/* engram_hash() flags */
#define ENGRAM_HASH_COMPRESSED_IDS (1u << 0) /* tokens and history are compressed ids */

/* Row ids of heads [head_begin, head_end) of layer `layer` for every token of seqs, tokens
 * in sequence order: ret_rows[t * (head_end - head_begin) + (h - head_begin)] is the absolute
 * row (head offset included) of head h for the t-th token overall. rows_cap is the capacity
 * of ret_rows in entries. All ids are checked before anything is written.
 * Returns 0, -ENOENT (`layer` is not an Engram layer), -EINVAL (an id out of range, a bad head
 * range or struct size), -ENOSPC (rows_cap too small), -EOPNOTSUPP (tokenizer ids without a
 * compressed vocabulary). */
ENGRAM_API int engram_hash(const engram_hasher* hasher, uint32_t layer,
                           const struct engram_hash_seq* seqs, size_t n_seqs, uint32_t head_begin,
                           uint32_t head_end, uint32_t flags, uint64_t* ret_rows, size_t rows_cap);

/* Maps n tokenizer ids to compressed ids. Returns 0, -EINVAL or -EOPNOTSUPP. */
ENGRAM_API int engram_hash_compress(const engram_hasher* hasher, const int32_t* tokens, size_t n,
                                    int32_t* ret_ids);

/* Deprecated: engram_last_error() (engram/engram.h) under its older name. */
ENGRAM_API ENGRAM_DEPRECATED("use engram_last_error") const char* engram_hash_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* ENGRAM_HASH_H_ */
