/* The C ABI of engram/hash.h, compiled as C: opening, describing, hashing, errno values and
 * last-error messages. Exits 0 when every check passes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engram/engram.h" /* engram_last_error */
#include "engram/hash.h"

static int failures;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      failures++;                                                              \
    }                                                                          \
  } while (0)

static const char kConfig[] =
    "{\"text_config\": {\"engram_layer_ids\": [1, 14], \"engram_num_embeddings\": "
    "[384006168, 384016682], \"engram_max_ngram_size\": 4, \"engram_n_heads\": 8, "
    "\"engram_vocab_size\": 16000000, \"engram_pad_token_id\": 2, "
    "\"engram_compressed_vocab_size\": 99092}}";

int main(void) {
  char dir[] = "/tmp/engram-hash-capi-XXXXXX";
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  char path[256];
  snprintf(path, sizeof(path), "%s/config.json", dir);
  FILE* f = fopen(path, "w");
  if (f == NULL || fputs(kConfig, f) < 0 || fclose(f) != 0) {
    perror(path);
    return 1;
  }

  engram_hasher* h = NULL;
  /* No derived tables and no flag: tokenizer ids need them. */
  CHECK(engram_hasher_open(dir, NULL, &h) == -ENOENT);
  CHECK(strstr(engram_last_error(), "engram_vocab.py") != NULL);
  CHECK(h == NULL);
  CHECK(engram_hasher_open("/nonexistent-engram-model", NULL, &h) == -ENOENT);

  struct engram_hasher_opts opts;
  engram_hasher_opts_init(&opts, sizeof(opts));
  opts.flags = ENGRAM_HASHER_COMPRESSED_ONLY;
  CHECK(engram_hasher_open(dir, &opts, &h) == -EINVAL); /* pad id unknown */
  opts.compressed_pad_id = 2;
  opts.size = 3;
  CHECK(engram_hasher_open(dir, &opts, &h) == -EINVAL);
  opts.size = sizeof(opts);
  CHECK(engram_hasher_open(dir, &opts, &h) == 0);
  if (h == NULL) return 1;

  struct engram_hasher_info info = {.size = sizeof(info)};
  CHECK(engram_hasher_get_info(h, &info) == 0);
  CHECK(info.num_layers == 2 && info.heads_per_layer == 24 && info.max_ngram_size == 4);
  CHECK(info.vocab_size == 0 && info.compressed_vocab_size == 99092);
  CHECK(info.compressed_pad_id == 2);
  struct engram_hash_layer_info layer = {.size = sizeof(layer)};
  CHECK(engram_hasher_get_layer(h, 1, &layer) == 0);
  CHECK(layer.layer == 14 && layer.num_rows == 384016682u);
  CHECK(engram_hasher_get_layer(h, 2, &layer) == -EINVAL);

  uint32_t hb = 99, he = 99;
  CHECK(engram_hasher_rank_heads(h, 4, 1, &hb, &he) == 0);
  CHECK(hb == 6 && he == 12);
  CHECK(engram_hasher_rank_heads(h, 5, 0, &hb, &he) == -EINVAL);
  CHECK(hb == 6 && he == 12); /* untouched on failure */
  uint64_t rb, re;
  CHECK(engram_hasher_head_rows(h, 1, 6, 12, &rb, &re) == 0);
  CHECK(rb == 96000564u && re == 192001740u);
  CHECK(engram_hasher_head_rows(h, 7, 0, 1, &rb, &re) == -ENOENT);

  /* Layer 14, all heads: 4 tokens in two sequences, the second continuing the first. */
  const int32_t first[] = {5, 17, 99091};
  const int32_t second[] = {3};
  struct engram_hash_seq seqs[2] = {
      {sizeof(struct engram_hash_seq), first, 3, NULL, 0},
      {sizeof(struct engram_hash_seq), second, 1, first, 3},
  };
  uint64_t rows[4 * 24];
  CHECK(engram_hash(h, 14, seqs, 2, 0, 24, ENGRAM_HASH_COMPRESSED_IDS, rows, 4 * 24) == 0);
  CHECK(rows[0] == 6939818u && rows[1] == 27264717u && rows[2] == 45254833u);
  CHECK(rows[3 * 24] == 3342376u && rows[3 * 24 + 23] == 377785826u);

  /* Rank 1 of 4 only: heads 6..11 of the same rows. */
  uint64_t part[4 * 6];
  CHECK(engram_hash(h, 14, seqs, 2, 6, 12, ENGRAM_HASH_COMPRESSED_IDS, part, 4 * 6) == 0);
  CHECK(memcmp(part, rows + 6, 6 * sizeof(uint64_t)) == 0);
  CHECK(memcmp(part + 18, rows + 3 * 24 + 6, 6 * sizeof(uint64_t)) == 0);

  CHECK(engram_hash(h, 14, seqs, 2, 0, 24, ENGRAM_HASH_COMPRESSED_IDS, rows, 4 * 24 - 1) ==
        -ENOSPC);
  CHECK(engram_hash(h, 2, seqs, 2, 0, 24, ENGRAM_HASH_COMPRESSED_IDS, rows, 4 * 24) == -ENOENT);
  CHECK(engram_hash(h, 14, seqs, 2, 0, 24, 0, rows, 4 * 24) == -EOPNOTSUPP);
  CHECK(engram_hash(h, 14, seqs, 2, 0, 24, 0x80, rows, 4 * 24) == -EINVAL);
  const int32_t bad[] = {1, 99092};
  struct engram_hash_seq bad_seq = {sizeof(struct engram_hash_seq), bad, 2, NULL, 0};
  CHECK(engram_hash(h, 1, &bad_seq, 1, 0, 24, ENGRAM_HASH_COMPRESSED_IDS, rows, 4 * 24) == -EINVAL);
  CHECK(strstr(engram_last_error(), "position 1") != NULL);
  bad_seq.size = 4; /* not even the size field */
  CHECK(engram_hash(h, 1, &bad_seq, 1, 0, 24, ENGRAM_HASH_COMPRESSED_IDS, rows, 4 * 24) == -EINVAL);
  CHECK(strstr(engram_last_error(), "engram_hash_seq has size 4") != NULL);
  int32_t compressed[2];
  CHECK(engram_hash_compress(h, first, 2, compressed) == -EOPNOTSUPP);

  engram_hasher_close(h);
  engram_hasher_close(NULL);
  unlink(path);
  rmdir(dir);
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  return 0;
}
