// The GPU half of include/engram/gpu_hash.h: Engram row ids from token ids, bit-exact with the
// host hasher (hash/). One source for nvcc and hipcc (see gpu_compat.h).
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "engram/engram.h"
#include "engram/gpu_hash.h"
#include "kernels/gpu_compat.h"
#include "kernels/kernel_errors.h"

using engram::kernels::Fail;
using engram::kernels::FailRuntime;

namespace {

constexpr uint32_t kMaxNgram = 8;  // orders 2..8, as the host hasher's kMaxNgramSize
constexpr uint32_t kBlockThreads = 256;
constexpr uint64_t kBadRow = UINT64_MAX;

// One layer's parameters, passed to the kernel by value (so a captured launch carries them).
struct DeviceLayer {
  uint32_t layer_id = 0;
  uint32_t heads = 0;
  int64_t multipliers[kMaxNgram] = {};
  const uint64_t* primes = nullptr;   // heads entries, device memory
  const uint64_t* offsets = nullptr;  // heads entries: the first row of each head
};

// What the kernel needs besides the layer: the id spaces and the vocabulary.
struct DeviceVocab {
  const uint32_t* lookup = nullptr;  // tokenizer id -> compressed id; NULL: compressed only
  uint32_t vocab_size = 0;
  uint32_t compressed_vocab_size = 0;
  uint32_t compressed_pad_id = 0;
  uint32_t max_ngram = 0;
  uint32_t heads_per_order = 0;
};

// NumPy's int64 % p for p >= 1: the result is in [0, p). For x < 0, x = -(y + 1) with y = ~x.
__device__ __forceinline__ uint64_t FloorMod(uint64_t x, uint64_t p) {
  const bool negative = static_cast<int64_t>(x) < 0;
  const uint64_t r = (negative ? ~x : x) % p;
  return negative ? p - 1 - r : r;
}

// The compressed id at lag `lag` (0: the token itself) of token `local` of a sequence, or
// UINT32_MAX when the id is out of range.
__device__ __forceinline__ uint32_t IdAt(const int32_t* seq_tokens, const int32_t* history,
                                         int64_t local, uint32_t lag, const DeviceVocab& v,
                                         bool compressed) {
  const int64_t pos = local - static_cast<int64_t>(lag);
  int32_t id;
  if (pos >= 0) {
    id = seq_tokens[pos];
  } else {
    const int64_t h = static_cast<int64_t>(v.max_ngram) - 1 + pos;  // history is N - 1 long
    id = (history != nullptr && h >= 0) ? history[h] : -1;
    if (id < 0) return v.compressed_pad_id;
  }
  if (id < 0) return UINT32_MAX;
  const uint32_t u = static_cast<uint32_t>(id);
  if (compressed) return u < v.compressed_vocab_size ? u : UINT32_MAX;
  return u < v.vocab_size ? v.lookup[u] : UINT32_MAX;
}

// Which sequence holds token t: the last s with seq_starts[s] <= t (binary search), or -1.
__device__ __forceinline__ int32_t SequenceOf(const int32_t* seq_starts, uint32_t n_seqs,
                                              uint32_t t) {
  if (n_seqs == 0 || static_cast<int64_t>(t) < seq_starts[0] ||
      static_cast<int64_t>(t) >= seq_starts[n_seqs]) {
    return -1;
  }
  uint32_t lo = 0, hi = n_seqs;  // seq_starts[lo] <= t < seq_starts[hi]
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (seq_starts[mid] <= static_cast<int64_t>(t)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return static_cast<int32_t>(lo);
}

// One hash call as the kernel runs it (engram_gpu_hash_args, checked and resolved to its layer).
struct HashCall {
  DeviceLayer layer;
  bool compressed = false;
  uint32_t head_begin = 0;
  uint32_t head_end = 0;
  const int32_t* tokens = nullptr;
  uint32_t n_tokens = 0;
  uint32_t n_seqs = 0;
  const int32_t* seq_starts = nullptr;
  const int32_t* history = nullptr;
  uint64_t* rows = nullptr;
  uint32_t* error_count = nullptr;
};

// The calls of one launch, passed by value (about 1.3 KB of kernel parameters at most).
struct HashCalls {
  HashCall c[ENGRAM_GPU_HASH_MAX_CALLS];  // the launch's grid has a row (blockIdx.y) per call
};

// A block first copies its call's heads' primes and offsets (dynamic shared memory: 16 bytes a
// head, kMaxHeads at most) and, for up to kSharedSeqStarts sequences, the sequence starts into
// shared memory, all with one round of parallel loads, so that a token's chain of dependent loads
// is its ids and their vocabulary entries only. A call with more sequences searches them in place.
constexpr uint32_t kSharedSeqStarts = 512;
constexpr uint32_t kMaxHeads = 2048;

// Block (x, y) hashes tokens [x * 256, x * 256 + 256) of call y, one thread per token: its ids
// are gathered once, then every head of the range is hashed.
__global__ void __launch_bounds__(kBlockThreads) HashKernel(DeviceVocab vocab, HashCalls calls) {
  // A kernel launched after-prior behind this one (the GPU queue's submit kernel, a dequantise
  // kernel) may be put in place now; it awaits this grid's end before reading the row ids.
  ENGRAM_GPU_RELEASE_DEPENDENTS();
  __shared__ int32_t shared_starts[kSharedSeqStarts + 1];
  extern __shared__ uint64_t head_params[];  // primes, then offsets, of the call's heads
  const HashCall& c = calls.c[blockIdx.y];
  const uint32_t heads = c.head_end - c.head_begin;
  const bool stage_starts = c.n_seqs <= kSharedSeqStarts;
  if (stage_starts) {
    for (uint32_t i = threadIdx.x; i <= c.n_seqs; i += blockDim.x) {
      shared_starts[i] = c.seq_starts[i];
    }
  }
  uint64_t* primes = head_params;
  uint64_t* offsets = head_params + heads;
  for (uint32_t i = threadIdx.x; i < heads; i += blockDim.x) {
    primes[i] = c.layer.primes[c.head_begin + i];
    offsets[i] = c.layer.offsets[c.head_begin + i];
  }
  __syncthreads();
  const int32_t* seq_starts = stage_starts ? shared_starts : c.seq_starts;
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= c.n_tokens) return;
  uint64_t* out = c.rows + static_cast<uint64_t>(t) * heads;
  const int32_t s = SequenceOf(seq_starts, c.n_seqs, t);
  uint64_t ids[kMaxNgram];
  bool ok = s >= 0;
  if (ok) {
    const int64_t start = seq_starts[s];
    const int32_t* seq_history = c.history != nullptr
                                     ? c.history + static_cast<int64_t>(s) * (vocab.max_ngram - 1)
                                     : nullptr;
    for (uint32_t k = 0; k < vocab.max_ngram; ++k) {
      const uint32_t id = IdAt(c.tokens + start, seq_history, static_cast<int64_t>(t) - start, k,
                               vocab, c.compressed);
      ok = ok && id != UINT32_MAX;
      ids[k] = id;
    }
  }
  if (!ok) {
    for (uint32_t h = 0; h < heads; ++h) out[h] = kBadRow;
    if (c.error_count != nullptr) atomicAdd(c.error_count, 1u);
    return;
  }
  for (uint32_t h = 0; h < heads; ++h) {
    const uint32_t n = (c.head_begin + h) / vocab.heads_per_order + 2;  // the head's n-gram order
    uint64_t mix = 0;
    for (uint32_t k = 0; k < n; ++k) mix ^= ids[k] * static_cast<uint64_t>(c.layer.multipliers[k]);
    out[h] = FloorMod(mix, primes[h]) + offsets[h];
  }
}

}  // namespace

struct engram_gpu_hasher {
  std::vector<DeviceLayer> layers;
  DeviceVocab vocab;
  void* device_block = nullptr;  // primes and offsets of every layer, then the lookup table
};

namespace {

// Reads the host hasher's parameters into host vectors laid out as the device block will be.
int CollectParameters(const engram_hasher* hasher, engram_gpu_hasher* g,
                      std::vector<uint64_t>* ret_words, std::vector<uint32_t>* ret_lookup) {
  engram_hasher_info info{};
  info.size = sizeof(info);
  if (engram_hasher_get_info(hasher, &info) < 0) {
    return Fail(EINVAL, "engram_gpu_hasher_create: %s", engram_last_error());
  }
  if (info.max_ngram_size < 2 || info.max_ngram_size > kMaxNgram || info.heads_per_order == 0) {
    return Fail(EINVAL, "engram_gpu_hasher_create: max_ngram_size %u (2..%u supported)",
                info.max_ngram_size, kMaxNgram);
  }
  if (info.heads_per_layer == 0 || info.heads_per_layer > kMaxHeads) {
    return Fail(EINVAL, "engram_gpu_hasher_create: %u heads per layer (1..%u supported)",
                info.heads_per_layer, kMaxHeads);
  }
  g->vocab = {nullptr,
              info.vocab_size,
              info.compressed_vocab_size,
              info.compressed_pad_id,
              info.max_ngram_size,
              info.heads_per_order};
  for (uint32_t i = 0; i < info.num_layers; ++i) {
    engram_hash_layer_info layer_info{};
    layer_info.size = sizeof(layer_info);
    DeviceLayer layer;
    if (engram_hasher_get_layer(hasher, i, &layer_info) < 0 ||
        engram_hasher_multipliers(hasher, layer_info.layer, layer.multipliers, kMaxNgram) < 0) {
      return Fail(EINVAL, "engram_gpu_hasher_create: %s", engram_last_error());
    }
    layer.layer_id = layer_info.layer;
    layer.heads = info.heads_per_layer;
    std::vector<uint64_t> primes, offsets;
    for (uint32_t h = 0; h < info.heads_per_layer; ++h) {
      uint64_t begin = 0, end = 0;
      if (engram_hasher_head_rows(hasher, layer.layer_id, h, h + 1, &begin, &end) < 0) {
        return Fail(EINVAL, "engram_gpu_hasher_create: %s", engram_last_error());
      }
      primes.push_back(end - begin);  // a head's rows are its prime's residues
      offsets.push_back(begin);
    }
    ret_words->insert(ret_words->end(), primes.begin(), primes.end());
    ret_words->insert(ret_words->end(), offsets.begin(), offsets.end());
    g->layers.push_back(layer);
  }
  if (info.vocab_size > 0) {
    std::vector<int32_t> ids(info.vocab_size);
    for (uint32_t i = 0; i < info.vocab_size; ++i) ids[i] = static_cast<int32_t>(i);
    ret_lookup->resize(info.vocab_size);
    if (engram_hash_compress(hasher, ids.data(), ids.size(),
                             reinterpret_cast<int32_t*>(ret_lookup->data())) < 0) {
      return Fail(EINVAL, "engram_gpu_hasher_create: %s", engram_last_error());
    }
  }
  return 0;
}

// Reads call i's arguments and checks what needs no hasher: the struct (engram.h's size
// policy), the flags and the buffers. `which` names the call among several.
int ReadHashCall(const char* fn, const char* which, const engram_gpu_hash_args* theirs,
                 engram_gpu_hash_args* ret_args) {
  if (theirs == nullptr) return Fail(EINVAL, "%s:%s NULL argument", fn, which);
  engram_gpu_hash_args& a = *ret_args;
  a = engram_gpu_hash_args{};
  char where[96];
  std::snprintf(where, sizeof(where), "%s:%s", fn, which);
  where[std::strlen(where) - 1] = '\0';  // "fn" or "fn: call i", as the messages below start
  if (int rc = engram::kernels::ReadStruct(where, "engram_gpu_hash_args", theirs, &a); rc < 0) {
    return rc;
  }
  if (a.flags & ~ENGRAM_HASH_COMPRESSED_IDS) {
    return Fail(EINVAL, "%s:%s unknown flags 0x%x", fn, which, a.flags);
  }
  if (a.tokens == nullptr || a.seq_starts == nullptr || a.rows == nullptr || a.n_tokens == 0 ||
      a.n_seqs == 0) {
    return Fail(EINVAL,
                "%s:%s tokens, seq_starts and rows must be set and "
                "n_tokens, n_seqs non-zero",
                fn, which);
  }
  return 0;
}

// Checks call a against the hasher (its layer, head range and vocabulary) and describes it for
// the kernel.
int PlanHashCall(const char* fn, const char* which, const engram_gpu_hasher& g,
                 const engram_gpu_hash_args& a, HashCall* ret_call) {
  const auto layer = std::find_if(g.layers.begin(), g.layers.end(),
                                  [&](const DeviceLayer& l) { return l.layer_id == a.layer; });
  if (layer == g.layers.end()) {
    return Fail(ENOENT, "%s:%s layer %u is not an Engram layer of the hasher", fn, which, a.layer);
  }
  if (a.head_begin >= a.head_end || a.head_end > layer->heads) {
    return Fail(EINVAL, "%s:%s head range [%u, %u) is empty or beyond the %u heads", fn, which,
                a.head_begin, a.head_end, layer->heads);
  }
  const bool compressed = (a.flags & ENGRAM_HASH_COMPRESSED_IDS) != 0;
  if (!compressed && g.vocab.lookup == nullptr) {
    return Fail(EOPNOTSUPP,
                "%s:%s tokenizer ids given, but the hasher has no "
                "compressed vocabulary (derive it with tools/engram_vocab.py)",
                fn, which);
  }
  *ret_call = {*layer,   compressed,   a.head_begin, a.head_end, a.tokens,     a.n_tokens,
               a.n_seqs, a.seq_starts, a.history,    a.rows,     a.error_count};
  return 0;
}

// Checks and queues n hash calls as one launch; failures are named after `fn`, the entry point
// the caller used. The argument structs are read before the hasher is looked at, so that what
// the caller passed is checked first (and without a GPU).
int QueueHashCalls(const char* fn, const engram_gpu_hasher* gpu_hasher,
                   const struct engram_gpu_hash_args* const* args, uint32_t n, uintptr_t stream) {
  if (args == nullptr) return Fail(EINVAL, "%s: NULL argument", fn);
  if (n == 0 || n > ENGRAM_GPU_HASH_MAX_CALLS) {
    return Fail(EINVAL, "%s: %u calls (1..%u in one launch)", fn, n, ENGRAM_GPU_HASH_MAX_CALLS);
  }
  // Failures of call i of several name it.
  char which[ENGRAM_GPU_HASH_MAX_CALLS][32] = {};
  engram_gpu_hash_args a[ENGRAM_GPU_HASH_MAX_CALLS];
  for (uint32_t i = 0; i < n; ++i) {
    if (n > 1) std::snprintf(which[i], sizeof(which[i]), " call %u:", i);
    if (int rc = ReadHashCall(fn, which[i], args[i], &a[i]); rc < 0) return rc;
  }
  if (gpu_hasher == nullptr) return Fail(EINVAL, "%s: NULL gpu_hasher", fn);
  HashCalls calls;
  uint32_t max_tokens = 0, max_heads = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (int rc = PlanHashCall(fn, which[i], *gpu_hasher, a[i], &calls.c[i]); rc < 0) return rc;
    max_tokens = std::max(max_tokens, a[i].n_tokens);
    max_heads = std::max(max_heads, a[i].head_end - a[i].head_begin);
  }
  const dim3 grid((max_tokens + kBlockThreads - 1) / kBlockThreads, n);
  const size_t head_bytes = size_t{max_heads} * 2 * sizeof(uint64_t);  // <= 32 KiB (kMaxHeads)
  HashKernel<<<grid, kBlockThreads, head_bytes, reinterpret_cast<gpuStream_t>(stream)>>>(
      gpu_hasher->vocab, calls);
  const gpuError_t st = gpuGetLastError();
  return st == gpuSuccess ? 0 : FailRuntime((std::string(fn) + " launch").c_str(), st);
}

}  // namespace

extern "C" {

int engram_gpu_hasher_create(const engram_hasher* hasher, engram_gpu_hasher** ret_gpu_hasher) {
  if (hasher == nullptr || ret_gpu_hasher == nullptr) {
    return Fail(EINVAL, "engram_gpu_hasher_create: NULL argument");
  }
  if (const gpuError_t st = PreloadKernel(HashKernel); st != gpuSuccess) {
    return FailRuntime("engram_gpu_hasher_create: loading the hash kernel", st);
  }
  auto* g = new (std::nothrow) engram_gpu_hasher;
  if (g == nullptr) return Fail(ENOMEM, "engram_gpu_hasher_create: out of memory");
  std::vector<uint64_t> words;  // per layer: its heads' primes, then their first rows
  std::vector<uint32_t> lookup;
  if (int rc = CollectParameters(hasher, g, &words, &lookup); rc < 0) {
    delete g;
    return rc;
  }
  const size_t word_bytes = words.size() * sizeof(uint64_t);
  const size_t bytes = word_bytes + lookup.size() * sizeof(uint32_t);
  gpuError_t st = gpuMalloc(&g->device_block, bytes);
  if (st == gpuSuccess) {
    st = gpuMemcpy(g->device_block, words.data(), word_bytes, gpuMemcpyHostToDevice);
  }
  auto* base = static_cast<uint8_t*>(g->device_block);
  if (st == gpuSuccess && !lookup.empty()) {
    st = gpuMemcpy(base + word_bytes, lookup.data(), lookup.size() * sizeof(uint32_t),
                   gpuMemcpyHostToDevice);
  }
  if (st != gpuSuccess) {
    if (g->device_block != nullptr) (void)gpuFree(g->device_block);
    delete g;
    return st == gpuErrorMemoryAllocation
               ? Fail(ENOMEM, "engram_gpu_hasher_create: %zu bytes of device memory", bytes)
               : FailRuntime("engram_gpu_hasher_create", st);
  }
  const auto* w = reinterpret_cast<const uint64_t*>(base);
  for (size_t i = 0; i < g->layers.size(); ++i) {
    g->layers[i].primes = w + i * 2 * g->layers[i].heads;
    g->layers[i].offsets = g->layers[i].primes + g->layers[i].heads;
  }
  if (!lookup.empty()) g->vocab.lookup = reinterpret_cast<const uint32_t*>(base + word_bytes);
  *ret_gpu_hasher = g;
  return 0;
}

int engram_gpu_hasher_destroy(engram_gpu_hasher* gpu_hasher) {
  if (gpu_hasher == nullptr) return 0;
  const gpuError_t st = gpuFree(gpu_hasher->device_block);
  delete gpu_hasher;
  return st == gpuSuccess ? 0 : FailRuntime("engram_gpu_hasher_destroy", st);
}

void engram_gpu_hash_args_init(struct engram_gpu_hash_args* args, size_t size) {
  engram::kernels::InitStruct("engram_gpu_hash_args_init", "engram_gpu_hash_args",
                              engram_gpu_hash_args{}, args, size);
}

int engram_gpu_hash(const engram_gpu_hasher* gpu_hasher, const struct engram_gpu_hash_args* args,
                    uintptr_t stream) {
  return QueueHashCalls("engram_gpu_hash", gpu_hasher, &args, 1, stream);
}

int engram_gpu_hash_layers(const engram_gpu_hasher* gpu_hasher,
                           const struct engram_gpu_hash_args* const* args, uint32_t n,
                           uintptr_t stream) {
  return QueueHashCalls("engram_gpu_hash_layers", gpu_hasher, args, n, stream);
}

}  // extern "C"
