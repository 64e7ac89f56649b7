// The C ABI of include/engram/hash.h over NgramHasher: struct-size checks, status -> -errno,
// and the per-thread last-error message.
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "client/abi_struct.h"
#include "client/last_error.h"
#include "engram/hash.h"
#include "hash/ngram_hasher.h"

static_assert(sizeof(engram_hasher_opts) == 32);
static_assert(offsetof(engram_hasher_opts, derived_path) == 16);
static_assert(offsetof(engram_hasher_opts, compressed_pad_id) == 24);
static_assert(sizeof(engram_hasher_info) == 40);
static_assert(sizeof(engram_hash_layer_info) == 24);
static_assert(offsetof(engram_hash_layer_info, num_rows) == 16);
static_assert(sizeof(engram_hash_seq) == 40);
static_assert(offsetof(engram_hash_seq, history) == 24);

struct engram_hasher {
  engram::NgramHasher impl;
};

namespace {

int ErrnoFor(const absl::Status& status, int failed_precondition_errno) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      return ENOENT;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return EINVAL;
    case absl::StatusCode::kFailedPrecondition:
      return failed_precondition_errno;
    case absl::StatusCode::kDataLoss:
      return EBADMSG;
    case absl::StatusCode::kResourceExhausted:
      return ENOSPC;
    case absl::StatusCode::kPermissionDenied:
      return EACCES;
    default:
      return EIO;
  }
}

// Records the message and returns the errno for a status. FailedPrecondition means a stale
// derived-tables file when opening (-ESTALE) and a missing vocabulary when hashing.
int Fail(const absl::Status& status, int failed_precondition_errno) {
  return engram::client::SetErrorMessage(-ErrnoFor(status, failed_precondition_errno),
                                         std::string(status.message()));
}

int FailInvalid(std::string message) {
  return engram::client::SetErrorMessage(-EINVAL, std::move(message));
}

}  // namespace

extern "C" {

void engram_hasher_opts_init(struct engram_hasher_opts* opts, size_t size) {
  engram_hasher_opts defaults{};
  defaults.size = sizeof(defaults);
  defaults.compressed_pad_id = -1;
  engram::client::InitStruct("engram_hasher_opts", defaults, opts, size);
}

int engram_hasher_open(const char* model_dir, const struct engram_hasher_opts* opts,
                       engram_hasher** ret_hasher) {
  if (model_dir == nullptr || ret_hasher == nullptr) {
    return FailInvalid("engram_hasher_open: model_dir and ret_hasher must not be NULL");
  }
  engram_hasher_opts o;
  engram_hasher_opts_init(&o, sizeof(o));
  if (opts != nullptr) {
    if (int rc = engram::client::ReadStruct("engram_hasher_opts", opts, &o); rc < 0) return rc;
  }
  if ((o.flags & ~ENGRAM_HASHER_COMPRESSED_ONLY) || o.reserved != 0) {
    return FailInvalid(absl::StrFormat(
        "engram_hasher_open: unknown flags 0x%x or nonzero reserved field", o.flags));
  }
  engram::HasherOptions options;
  if (o.derived_path != nullptr) options.derived_path = o.derived_path;
  options.compressed_only = (o.flags & ENGRAM_HASHER_COMPRESSED_ONLY) != 0;
  if (o.compressed_pad_id >= 0) {
    if (o.compressed_pad_id > INT32_MAX) {
      return FailInvalid(
          absl::StrFormat("engram_hasher_open: compressed pad id %d", o.compressed_pad_id));
    }
    options.compressed_pad_id = static_cast<uint32_t>(o.compressed_pad_id);
  }
  auto hasher = engram::NgramHasher::Open(model_dir, options);
  if (!hasher.ok()) return Fail(hasher.status(), ESTALE);
  auto* h = new (std::nothrow) engram_hasher{*std::move(hasher)};
  if (h == nullptr) {
    return engram::client::SetErrorMessage(-ENOMEM, "engram_hasher_open: out of memory");
  }
  *ret_hasher = h;
  return 0;
}

void engram_hasher_close(engram_hasher* hasher) { delete hasher; }

int engram_hasher_get_info(const engram_hasher* hasher, struct engram_hasher_info* ret_info) {
  if (hasher == nullptr || ret_info == nullptr) {
    return FailInvalid("engram_hasher_get_info: NULL argument");
  }
  const engram::NgramHasher& h = hasher->impl;
  engram_hasher_info info{};
  info.size = sizeof(info);
  info.num_layers = h.num_layers();
  info.max_ngram_size = h.config().max_ngram_size;
  info.heads_per_order = h.config().n_heads;
  info.heads_per_layer = h.heads_per_layer();
  info.vocab_size = h.vocab_size();
  info.compressed_vocab_size = static_cast<uint32_t>(h.config().compressed_vocab_size);
  info.compressed_pad_id = h.compressed_pad_id();
  return engram::client::WriteStruct("engram_hasher_info", info, ret_info);
}

int engram_hasher_get_layer(const engram_hasher* hasher, uint32_t index,
                            struct engram_hash_layer_info* ret_info) {
  if (hasher == nullptr || ret_info == nullptr) {
    return FailInvalid("engram_hasher_get_layer: NULL argument");
  }
  if (index >= hasher->impl.num_layers()) {
    return FailInvalid(absl::StrFormat("engram_hasher_get_layer: index %d of %d layers", index,
                                       hasher->impl.num_layers()));
  }
  engram_hash_layer_info info{};
  info.size = sizeof(info);
  info.layer = hasher->impl.layer(index).layer_id;
  info.num_rows = hasher->impl.layer(index).num_rows();
  return engram::client::WriteStruct("engram_hash_layer_info", info, ret_info);
}

int engram_hasher_rank_heads(const engram_hasher* hasher, uint32_t tp_size, uint32_t tp_rank,
                             uint32_t* ret_head_begin, uint32_t* ret_head_end) {
  if (hasher == nullptr || ret_head_begin == nullptr || ret_head_end == nullptr) {
    return FailInvalid("engram_hasher_rank_heads: NULL argument");
  }
  auto range = hasher->impl.RankHeads(tp_size, tp_rank);
  if (!range.ok()) return Fail(range.status(), EINVAL);
  *ret_head_begin = range->begin;
  *ret_head_end = range->end;
  return 0;
}

int engram_hasher_head_rows(const engram_hasher* hasher, uint32_t layer, uint32_t head_begin,
                            uint32_t head_end, uint64_t* ret_row_begin, uint64_t* ret_row_end) {
  if (hasher == nullptr || ret_row_begin == nullptr || ret_row_end == nullptr) {
    return FailInvalid("engram_hasher_head_rows: NULL argument");
  }
  auto index = hasher->impl.LayerIndex(layer);
  if (!index.ok()) return Fail(index.status(), EINVAL);
  auto rows = hasher->impl.HeadRows(*index, {head_begin, head_end});
  if (!rows.ok()) return Fail(rows.status(), EINVAL);
  *ret_row_begin = rows->first;
  *ret_row_end = rows->second;
  return 0;
}

int engram_hasher_multipliers(const engram_hasher* hasher, uint32_t layer, int64_t* ret_multipliers,
                              size_t cap) {
  if (hasher == nullptr || ret_multipliers == nullptr) {
    return FailInvalid("engram_hasher_multipliers: NULL argument");
  }
  auto index = hasher->impl.LayerIndex(layer);
  if (!index.ok()) return Fail(index.status(), EINVAL);
  const std::vector<int64_t>& multipliers = hasher->impl.layer(*index).multipliers;
  if (cap < multipliers.size()) {
    return engram::client::SetErrorMessage(
        -ENOSPC, absl::StrFormat("engram_hasher_multipliers: layer %d has %d multipliers, the "
                                 "output holds %d",
                                 layer, multipliers.size(), cap));
  }
  std::copy(multipliers.begin(), multipliers.end(), ret_multipliers);
  return 0;
}

int engram_hash(const engram_hasher* hasher, uint32_t layer, const struct engram_hash_seq* seqs,
                size_t n_seqs, uint32_t head_begin, uint32_t head_end, uint32_t flags,
                uint64_t* ret_rows, size_t rows_cap) {
  if (hasher == nullptr || (seqs == nullptr && n_seqs > 0) ||
      (ret_rows == nullptr && rows_cap > 0)) {
    return FailInvalid("engram_hash: NULL argument");
  }
  if (flags & ~ENGRAM_HASH_COMPRESSED_IDS) {
    return FailInvalid(absl::StrFormat("engram_hash: unknown flags 0x%x", flags));
  }
  auto index = hasher->impl.LayerIndex(layer);
  if (!index.ok()) return Fail(index.status(), EINVAL);
  // Small batches (a decode step) stay on the stack; chunked prefill sends one sequence.
  constexpr size_t kInline = 64;
  engram::HashSequence inline_seqs[kInline];
  std::vector<engram::HashSequence> heap_seqs;
  engram::HashSequence* converted = inline_seqs;
  if (n_seqs > kInline) {
    heap_seqs.resize(n_seqs);
    converted = heap_seqs.data();
  }
  // The first sequence's size is the array's stride (a caller's header may be older or newer).
  size_t stride = 0;
  if (int rc = engram::client::CheckArray("engram_hash_seq", seqs, n_seqs, sizeof(engram_hash_seq),
                                          &stride);
      rc < 0) {
    return rc;
  }
  for (size_t i = 0; i < n_seqs; ++i) {
    const void* theirs = engram::client::ArrayElement(seqs, stride, i);
    engram_hash_seq s{};
    if (int rc = engram::client::ReadStruct("engram_hash_seq", theirs, &s); rc < 0) return rc;
    if ((s.tokens == nullptr && s.n_tokens > 0) || (s.history == nullptr && s.n_history > 0)) {
      return FailInvalid(absl::StrFormat("engram_hash: sequence %d has a NULL array", i));
    }
    converted[i].tokens = {s.tokens, s.n_tokens};
    converted[i].history = {s.history, s.n_history};
  }
  const auto space = (flags & ENGRAM_HASH_COMPRESSED_IDS) ? engram::TokenSpace::kCompressed
                                                          : engram::TokenSpace::kTokenizer;
  absl::Status st = hasher->impl.Hash(*index, {converted, n_seqs}, space, {head_begin, head_end},
                                      {ret_rows, rows_cap});
  if (!st.ok()) return Fail(st, EOPNOTSUPP);
  return 0;
}

int engram_hash_compress(const engram_hasher* hasher, const int32_t* tokens, size_t n,
                         int32_t* ret_ids) {
  if (hasher == nullptr || ((tokens == nullptr || ret_ids == nullptr) && n > 0)) {
    return FailInvalid("engram_hash_compress: NULL argument");
  }
  absl::Status st = hasher->impl.Compress({tokens, n}, {ret_ids, n});
  if (!st.ok()) return Fail(st, EOPNOTSUPP);
  return 0;
}

}  // extern "C"
