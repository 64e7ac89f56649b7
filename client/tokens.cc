// Gathers asked for by token ids (engram_submit_tokens, engram_gather_tokens): the ids hashed into
// the data region, then submitted as any gather.
#include <errno.h>

#include <cstdint>

#include "client/abi_struct.h"
#include "client/last_error.h"
#include "client/session.h"
#include "engram/engram.h"
#include "engram/hash.h"
#include "engram/protocol.h"

namespace {

using engram::client::GatherNow;
using engram::client::InData;
using engram::client::Push;
using engram::client::ReadStruct;
using engram::client::SetError;

// The head range of a token request: a TP rank's, an explicit one, or the whole layer.
int TokenHeads(const engram_hasher* hasher, const engram_token_request& r, uint32_t* ret_head_begin,
               uint32_t* ret_head_end) {
  uint32_t head_begin = r.head_begin;
  uint32_t head_end = r.head_end;
  if (r.tp_size != 0) {
    if (r.head_begin != 0 || r.head_end != 0) {
      return SetError(-EINVAL,
                      "table %u: both a head range [%u, %u) and TP rank %u of %u were given; "
                      "give one",
                      r.layer, r.head_begin, r.head_end, r.tp_rank, r.tp_size);
    }
    if (engram_hasher_rank_heads(hasher, r.tp_size, r.tp_rank, &head_begin, &head_end) < 0) {
      return SetError(-EINVAL, "table %u: %s", r.layer, engram_last_error());
    }
  } else if (head_begin == 0 && head_end == 0) {
    engram_hasher_info info{};
    info.size = sizeof(info);
    if (engram_hasher_get_info(hasher, &info) < 0) {
      return SetError(-EINVAL, "table %u: %s", r.layer, engram_last_error());
    }
    head_end = info.heads_per_layer;
  }
  if (head_end <= head_begin) {
    return SetError(-EINVAL, "table %u: empty or reversed head range [%u, %u)", r.layer, head_begin,
                    head_end);
  }
  *ret_head_begin = head_begin;
  *ret_head_end = head_end;
  return 0;
}

// The tokens of a token request's sequences (an array whose first element's size is the
// stride), bounded by what the data region could hold.
int TokenPositions(const engram_session* s, const engram_token_request& r,
                   uint64_t* ret_positions) {
  uint64_t positions = 0;
  size_t stride = 0;
  if (int rc = engram::client::CheckArray("engram_hash_seq", r.seqs, r.n_seqs,
                                          sizeof(engram_hash_seq), &stride);
      rc < 0) {
    return rc;
  }
  for (size_t i = 0; i < r.n_seqs; ++i) {
    engram_hash_seq seq{};
    const void* theirs = engram::client::ArrayElement(r.seqs, stride, i);
    if (int rc = ReadStruct("engram_hash_seq", theirs, &seq); rc < 0) return rc;
    positions += seq.n_tokens;
    if (positions > s->data_bytes) {
      return SetError(-EINVAL, "table %u: more tokens than the %llu-byte data region can hold",
                      r.layer, static_cast<unsigned long long>(s->data_bytes));
    }
  }
  *ret_positions = positions;
  return 0;
}

// The submission entry of a token request, its ids hashed into the data region where the daemon
// (or the in-place path) reads them: the request needs no other copy.
int TokenSqe(engram_session* s, const engram_hasher* hasher,
             const struct engram_token_request* request, engram_sqe* ret_sqe) {
  engram_token_request r{};
  if (int rc = ReadStruct("engram_token_request", request, &r); rc < 0) return rc;
  if ((r.flags & ~ENGRAM_HASH_COMPRESSED_IDS) != 0) {
    return SetError(-EINVAL, "table %u: unknown token request flags 0x%x", r.layer, r.flags);
  }
  if (r.seqs == nullptr && r.n_seqs > 0) {
    return SetError(-EINVAL, "table %u: %zu sequences but seqs is NULL", r.layer, r.n_seqs);
  }
  uint32_t head_begin = 0;
  uint32_t head_end = 0;
  if (int rc = TokenHeads(hasher, r, &head_begin, &head_end); rc < 0) return rc;
  uint64_t positions = 0;
  if (int rc = TokenPositions(s, r, &positions); rc < 0) return rc;
  const uint64_t heads = head_end - head_begin;
  const uint64_t n = positions * heads;  // positions <= data_bytes < 2^40, heads < 2^16
  uint64_t rows_offset = 0;
  uint64_t dest_offset = 0;
  if (r.rows_cap > s->data_bytes / 8 || !InData(s, r.rows, r.rows_cap * 8, &rows_offset) ||
      rows_offset % 8 != 0) {
    return SetError(-EINVAL,
                    "table %u: the row ids (rows_cap %llu) must lie in the session's data "
                    "region, 8-byte aligned (allocate them with engram_alloc)",
                    r.layer, static_cast<unsigned long long>(r.rows_cap));
  }
  if (n > r.rows_cap) {
    return SetError(
        -ENOSPC, "table %u: %llu positions x %llu heads need %llu row ids; rows_cap is %llu",
        r.layer, static_cast<unsigned long long>(positions), static_cast<unsigned long long>(heads),
        static_cast<unsigned long long>(n), static_cast<unsigned long long>(r.rows_cap));
  }
  if (n > s->data_bytes / ENGRAM_ROW_BYTES ||
      !InData(s, r.dest, n * ENGRAM_ROW_BYTES, &dest_offset)) {
    return SetError(-EINVAL,
                    "table %u: the destination of %llu rows (%llu bytes) must lie in the "
                    "session's data region",
                    r.layer, static_cast<unsigned long long>(n),
                    static_cast<unsigned long long>(n * ENGRAM_ROW_BYTES));
  }
  if (int rc = engram_hash(hasher, r.layer, r.seqs, r.n_seqs, head_begin, head_end, r.flags, r.rows,
                           r.rows_cap);
      rc < 0) {
    return SetError(rc, "table %u: %s", r.layer, engram_last_error());
  }
  engram_sqe sqe{};
  sqe.opcode = ENGRAM_OP_GATHER;
  sqe.table = r.layer;
  sqe.num_rows = n;
  sqe.rows_offset = rows_offset;
  sqe.dest_offset = dest_offset;
  *ret_sqe = sqe;
  return 0;
}

}  // namespace

extern "C" {

int engram_submit_tokens(engram_session* s, const engram_hasher* hasher,
                         const struct engram_token_request* request, uint64_t* ret_ticket,
                         uint64_t* ret_num_rows) {
  if (s == nullptr || hasher == nullptr || request == nullptr || ret_ticket == nullptr) {
    return SetError(-EINVAL,
                    "engram_submit_tokens needs a session, a hasher, a request and ret_ticket");
  }
  engram_sqe sqe;
  if (int rc = TokenSqe(s, hasher, request, &sqe); rc < 0) return rc;
  if (int rc = Push(s, sqe, ret_ticket); rc < 0) return rc;
  if (ret_num_rows != nullptr) *ret_num_rows = sqe.num_rows;
  return 0;
}

int engram_gather_tokens(engram_session* s, const engram_hasher* hasher,
                         const struct engram_token_request* request, int64_t timeout_ns) {
  if (s == nullptr || hasher == nullptr || request == nullptr) {
    return SetError(-EINVAL, "engram_gather_tokens needs a session, a hasher and a request");
  }
  engram_sqe sqe;
  if (int rc = TokenSqe(s, hasher, request, &sqe); rc < 0) return rc;
  return GatherNow(s, sqe, s->gather_in_place, timeout_ns);
}

}  // extern "C"
