// The GPU hasher (include/engram/gpu_hash.h) against the host hasher (include/engram/hash.h):
// random batches of sequences with and without history, every head range a TP rank owns, several
// calls in one launch, ids out of range, and a captured CUDA graph replayed with new tokens.
// Tokenizer ids through the compressed vocabulary ([tokenizer]) need $ENGRAM_HASH_MODEL, a model
// directory with a derived-tables file: tests/gpu/with_hash_model.py (meson's gpu_hash_tokenizer)
// and tools/gpu-bundle.sh write tests/hash's tokenizer fixture for it; without one they skip.
#include "engram/gpu_hash.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engram/engram.h"  // engram_last_error
#include "engram/gpu.h"
#include "engram/hash.h"
#include "testkit/gpu_test_util.h"
#include "tests/common/skip.h"

namespace {

using engram::testing::DeviceBuffer;

constexpr uint32_t kHistory = 3;  // DeepSeek-V4.1: max_ngram_size 4

// A model directory holding only the DeepSeek-V4.1 config (compressed ids only).
std::string WriteDsv41Config() {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("engram-gpu-hash-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"text_config": {
    "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4, "engram_n_heads": 8, "engram_head_dim": 256,
    "engram_vocab_size": 16000000, "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092}})";
  return dir;
}

struct HostHasher {
  engram_hasher* h = nullptr;
  ~HostHasher() { engram_hasher_close(h); }
};

struct GpuHasher {
  engram_gpu_hasher* g = nullptr;
  ~GpuHasher() { engram_gpu_hasher_destroy(g); }
};

// One batch: sequences back to back, each with 0..3 ids of history (-1 where it starts).
struct Batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> starts{0};
  std::vector<int32_t> history;  // n_seqs x kHistory, oldest first
  std::vector<std::vector<int32_t>> host_history;
};

Batch RandomBatch(std::mt19937_64& rng, uint32_t id_bound, uint32_t max_seqs, uint32_t max_len) {
  Batch b;
  const uint32_t n_seqs = 1 + rng() % max_seqs;
  for (uint32_t s = 0; s < n_seqs; ++s) {
    const uint32_t len = 1 + rng() % max_len;
    for (uint32_t i = 0; i < len; ++i) b.tokens.push_back(static_cast<int32_t>(rng() % id_bound));
    b.starts.push_back(static_cast<int32_t>(b.tokens.size()));
    const uint32_t known = rng() % (kHistory + 1);
    std::vector<int32_t> hist;
    for (uint32_t k = 0; k < kHistory; ++k) {
      const bool present = k >= kHistory - known;
      const int32_t id = present ? static_cast<int32_t>(rng() % id_bound) : -1;
      b.history.push_back(id);
      if (present) hist.push_back(id);
    }
    b.host_history.push_back(hist);
  }
  return b;
}

std::vector<uint64_t> HostRows(const HostHasher& host, const Batch& b, uint32_t layer, uint32_t hb,
                               uint32_t he, uint32_t flags) {
  std::vector<engram_hash_seq> seqs;
  for (size_t s = 0; s + 1 < b.starts.size(); ++s) {
    seqs.push_back({sizeof(engram_hash_seq), b.tokens.data() + b.starts[s],
                    static_cast<size_t>(b.starts[s + 1] - b.starts[s]), b.host_history[s].data(),
                    b.host_history[s].size()});
  }
  std::vector<uint64_t> rows(b.tokens.size() * (he - hb));
  const int rc =
      engram_hash(host.h, layer, seqs.data(), seqs.size(), hb, he, flags, rows.data(), rows.size());
  INFO(engram_last_error());
  REQUIRE(rc == 0);
  return rows;
}

// Device copies of a batch and the GPU hash's outputs.
struct DeviceBatch {
  DeviceBuffer tokens, starts, history, rows, errors;
  DeviceBatch(size_t max_tokens, size_t max_seqs, size_t heads)
      : tokens(max_tokens * 4),
        starts((max_seqs + 1) * 4),
        history(max_seqs * kHistory * 4),
        rows(max_tokens * heads * 8),
        errors(4) {}
  void Upload(const Batch& b) {
    CUDA_REQUIRE(
        cudaMemcpy(tokens.get(), b.tokens.data(), b.tokens.size() * 4, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(
        cudaMemcpy(starts.get(), b.starts.data(), b.starts.size() * 4, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(
        cudaMemcpy(history.get(), b.history.data(), b.history.size() * 4, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaMemset(errors.get(), 0, 4));
  }
  engram_gpu_hash_args Args(const Batch& b, uint32_t layer, uint32_t hb, uint32_t he,
                            uint32_t flags) const {
    engram_gpu_hash_args a;
    engram_gpu_hash_args_init(&a, sizeof(a));
    a.layer = layer;
    a.flags = flags;
    a.head_begin = hb;
    a.head_end = he;
    a.tokens = tokens.get<int32_t>();
    a.n_tokens = static_cast<uint32_t>(b.tokens.size());
    a.n_seqs = static_cast<uint32_t>(b.starts.size() - 1);
    a.seq_starts = starts.get<int32_t>();
    a.history = history.get<int32_t>();
    a.rows = rows.get<uint64_t>();
    a.error_count = errors.get<uint32_t>();
    return a;
  }
  std::vector<uint64_t> Rows(size_t n) const {
    std::vector<uint64_t> out(n);
    CUDA_REQUIRE(cudaMemcpy(out.data(), rows.get(), n * 8, cudaMemcpyDeviceToHost));
    return out;
  }
  uint32_t Errors() const {
    uint32_t e = 0;
    CUDA_REQUIRE(cudaMemcpy(&e, errors.get(), 4, cudaMemcpyDeviceToHost));
    return e;
  }
};

struct HeadRange {
  uint32_t begin, end;
};

std::vector<HeadRange> RankRanges(const HostHasher& host) {
  std::vector<HeadRange> ranges;
  for (uint32_t tp : {1u, 4u, 8u}) {
    for (uint32_t rank = 0; rank < tp; ++rank) {
      uint32_t b = 0, e = 0;
      REQUIRE(engram_hasher_rank_heads(host.h, tp, rank, &b, &e) == 0);
      ranges.push_back({b, e});
    }
  }
  return ranges;
}

// Random batches over every layer and TP head range, compared row for row.
void CompareRandomBatches(const HostHasher& host, const GpuHasher& gpu, uint32_t id_bound,
                          uint32_t flags, int batches) {
  std::mt19937_64 rng(20261130);
  const std::vector<HeadRange> ranges = RankRanges(host);
  DeviceBatch dev(64 * 16, 64, 24);
  for (int i = 0; i < batches; ++i) {
    const Batch b = RandomBatch(rng, id_bound, 64, 16);
    const uint32_t layer = (i % 2) ? 14 : 1;
    const HeadRange r = ranges[i % ranges.size()];
    dev.Upload(b);
    const engram_gpu_hash_args a = dev.Args(b, layer, r.begin, r.end, flags);
    ENGRAM_REQUIRE(engram_gpu_hash(gpu.g, &a, 0));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    INFO("batch " << i << ": " << b.tokens.size() << " tokens, layer " << layer << ", heads ["
                  << r.begin << ", " << r.end << ")");
    REQUIRE(dev.Errors() == 0);
    REQUIRE(dev.Rows(b.tokens.size() * (r.end - r.begin)) ==
            HostRows(host, b, layer, r.begin, r.end, flags));
  }
}

}  // namespace

TEST_CASE("GPU hash of compressed ids matches the host hasher") {
  const std::string dir = WriteDsv41Config();
  HostHasher host;
  engram_hasher_opts opts;
  engram_hasher_opts_init(&opts, sizeof(opts));
  opts.flags = ENGRAM_HASHER_COMPRESSED_ONLY;
  opts.compressed_pad_id = 2;
  REQUIRE(engram_hasher_open(dir.c_str(), &opts, &host.h) == 0);
  GpuHasher gpu;
  ENGRAM_REQUIRE(engram_gpu_hasher_create(host.h, &gpu.g));

  SECTION("random batches, every TP rank's heads") {
    CompareRandomBatches(host, gpu, 99092, ENGRAM_HASH_COMPRESSED_IDS, 600);
  }

  SECTION("ids out of range are counted and their rows poisoned") {
    std::mt19937_64 rng(7);
    Batch b = RandomBatch(rng, 99092, 4, 8);
    b.tokens[0] = 99092;     // one past the compressed vocabulary
    b.history[2] = 1 << 30;  // the first sequence's newest history id
    DeviceBatch dev(64, 8, 24);
    dev.Upload(b);
    const engram_gpu_hash_args a = dev.Args(b, 14, 0, 24, ENGRAM_HASH_COMPRESSED_IDS);
    ENGRAM_REQUIRE(engram_gpu_hash(gpu.g, &a, 0));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    const std::vector<uint64_t> rows = dev.Rows(b.tokens.size() * 24);
    CHECK(dev.Errors() >= 1);
    for (uint32_t h = 0; h < 24; ++h) CHECK(rows[h] == UINT64_MAX);
  }

  SECTION("host-side checks name what was wrong") {
    DeviceBatch dev(8, 2, 24);
    Batch b;
    b.tokens = {5, 6};
    b.starts = {0, 2};
    b.history = {-1, -1, -1};
    engram_gpu_hash_args a = dev.Args(b, 7, 0, 24, ENGRAM_HASH_COMPRESSED_IDS);
    CHECK(engram_gpu_hash(gpu.g, &a, 0) == -ENOENT);
    CHECK(std::string(engram_last_error()).find("layer 7") != std::string::npos);
    a = dev.Args(b, 14, 3, 25, ENGRAM_HASH_COMPRESSED_IDS);
    CHECK(engram_gpu_hash(gpu.g, &a, 0) == -EINVAL);
    a = dev.Args(b, 14, 0, 24, 0);  // tokenizer ids, but no vocabulary
    CHECK(engram_gpu_hash(gpu.g, &a, 0) == -EOPNOTSUPP);
    // A newer, larger struct than this library knows: refused when a byte it does not know is
    // set (engram.h's size policy), accepted when they are all zero.
    struct {
      engram_gpu_hash_args args;
      uint64_t newer_field;
    } larger{dev.Args(b, 14, 0, 24, ENGRAM_HASH_COMPRESSED_IDS), 1};
    larger.args.size = sizeof(larger);
    CHECK(engram_gpu_hash(gpu.g, &larger.args, 0) == -E2BIG);
    CHECK(std::string(engram_last_error()).find("engram_gpu_hash_args") != std::string::npos);
    larger.newer_field = 0;
    CHECK(engram_gpu_hash(gpu.g, &larger.args, 0) == 0);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
  }

  SECTION("several calls in one launch: each call's rows are those it gets alone") {
    // Calls of different sizes (so some of the grid's blocks have nothing of a smaller call),
    // layers and head ranges, 1 to ENGRAM_GPU_HASH_MAX_CALLS at once; every tenth round one
    // call has more sequences than a block keeps in shared memory.
    std::mt19937_64 rng(1201);
    const std::vector<HeadRange> ranges = RankRanges(host);
    for (int round = 0; round < 80; ++round) {
      const uint32_t n = 1 + round % ENGRAM_GPU_HASH_MAX_CALLS;
      std::vector<Batch> batches;
      std::vector<std::unique_ptr<DeviceBatch>> devs;
      std::vector<engram_gpu_hash_args> args(n);
      std::vector<const engram_gpu_hash_args*> ptrs;
      std::vector<uint32_t> layers;
      std::vector<HeadRange> heads;
      for (uint32_t i = 0; i < n; ++i) {
        const bool many_seqs = round % 10 == 9 && i == 0;
        batches.push_back(many_seqs ? RandomBatch(rng, 99092, 1, 1)
                                    : RandomBatch(rng, 99092, 64, 16));
        if (many_seqs) {
          while (batches.back().starts.size() <= 700) {
            Batch more = RandomBatch(rng, 99092, 1, 1);
            Batch& b = batches.back();
            b.tokens.push_back(more.tokens[0]);
            b.starts.push_back(static_cast<int32_t>(b.tokens.size()));
            b.history.insert(b.history.end(), more.history.begin(), more.history.end());
            b.host_history.push_back(more.host_history[0]);
          }
        }
        const Batch& b = batches.back();
        layers.push_back(rng() % 2 ? 14 : 1);
        heads.push_back(ranges[rng() % ranges.size()]);
        devs.push_back(std::make_unique<DeviceBatch>(b.tokens.size(), b.starts.size() - 1, 24));
        devs.back()->Upload(b);
        args[i] = devs.back()->Args(b, layers.back(), heads.back().begin, heads.back().end,
                                    ENGRAM_HASH_COMPRESSED_IDS);
        ptrs.push_back(&args[i]);
      }
      ENGRAM_REQUIRE(engram_gpu_hash_layers(gpu.g, ptrs.data(), n, 0));
      CUDA_REQUIRE(cudaDeviceSynchronize());
      for (uint32_t i = 0; i < n; ++i) {
        const Batch& b = batches[i];
        INFO("round " << round << ", call " << i << " of " << n << ": " << b.tokens.size()
                      << " tokens in " << b.starts.size() - 1 << " sequences, layer " << layers[i]
                      << ", heads [" << heads[i].begin << ", " << heads[i].end << ")");
        REQUIRE(devs[i]->Errors() == 0);
        REQUIRE(
            devs[i]->Rows(b.tokens.size() * (heads[i].end - heads[i].begin)) ==
            HostRows(host, b, layers[i], heads[i].begin, heads[i].end, ENGRAM_HASH_COMPRESSED_IDS));
      }
    }
  }

  SECTION("one launch of several calls refuses a bad call, naming it, and queues nothing") {
    std::mt19937_64 rng(3);
    const Batch b = RandomBatch(rng, 99092, 4, 4);
    DeviceBatch dev(b.tokens.size(), b.starts.size() - 1, 24);
    dev.Upload(b);
    CUDA_REQUIRE(cudaMemset(dev.rows.get(), 0xab, b.tokens.size() * 24 * 8));
    const engram_gpu_hash_args good = dev.Args(b, 14, 0, 24, ENGRAM_HASH_COMPRESSED_IDS);
    engram_gpu_hash_args bad = dev.Args(b, 14, 0, 25, ENGRAM_HASH_COMPRESSED_IDS);
    const engram_gpu_hash_args* calls[ENGRAM_GPU_HASH_MAX_CALLS + 1] = {};
    for (auto& c : calls) c = &good;
    calls[1] = &bad;
    CHECK(engram_gpu_hash_layers(gpu.g, calls, 2, 0) == -EINVAL);
    CHECK(std::string(engram_last_error()).find("call 1: head range [0, 25)") != std::string::npos);
    bad = dev.Args(b, 7, 0, 24, ENGRAM_HASH_COMPRESSED_IDS);
    CHECK(engram_gpu_hash_layers(gpu.g, calls, 2, 0) == -ENOENT);
    CHECK(std::string(engram_last_error()).find("call 1: layer 7") != std::string::npos);
    calls[1] = nullptr;
    CHECK(engram_gpu_hash_layers(gpu.g, calls, 2, 0) == -EINVAL);
    CHECK(std::string(engram_last_error()).find("call 1: NULL") != std::string::npos);
    calls[1] = &good;
    CHECK(engram_gpu_hash_layers(gpu.g, calls, 0, 0) == -EINVAL);
    CHECK(engram_gpu_hash_layers(gpu.g, calls, ENGRAM_GPU_HASH_MAX_CALLS + 1, 0) == -EINVAL);
    CHECK(std::string(engram_last_error()).find("9 calls") != std::string::npos);
    CUDA_REQUIRE(cudaDeviceSynchronize());
    // Nothing was queued by the refused launches: the rows are as the memset left them.
    for (uint64_t r : dev.Rows(b.tokens.size() * 24)) CHECK(r == 0xababababababababull);
  }

  SECTION("a captured graph replayed with new tokens") {
    // A decode step: 16 sequences of 1 + 5 tokens, TP4 rank 1, layer 14; the history and tokens
    // change at every replay, the buffers and the graph do not.
    std::mt19937_64 rng(11);
    uint32_t hb = 0, he = 0;
    REQUIRE(engram_hasher_rank_heads(host.h, 4, 1, &hb, &he) == 0);
    Batch b;
    for (int s = 0; s < 16; ++s) {
      for (int i = 0; i < 6; ++i) b.tokens.push_back(0);
      b.starts.push_back(static_cast<int32_t>(b.tokens.size()));
      for (uint32_t k = 0; k < kHistory; ++k) b.history.push_back(0);
      b.host_history.emplace_back(kHistory, 0);
    }
    DeviceBatch dev(b.tokens.size(), 16, 24);
    dev.Upload(b);
    cudaStream_t stream;
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const engram_gpu_hash_args a = dev.Args(b, 14, hb, he, ENGRAM_HASH_COMPRESSED_IDS);
    const int rc = engram_gpu_hash(gpu.g, &a, reinterpret_cast<uintptr_t>(stream));
    CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
    REQUIRE(rc == 0);
    cudaGraphExec_t exec;
    CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2000; ++replay) {
      for (auto& t : b.tokens) t = static_cast<int32_t>(rng() % 99092);
      for (size_t s = 0; s < 16; ++s) {
        for (uint32_t k = 0; k < kHistory; ++k) {
          b.history[s * kHistory + k] = b.host_history[s][k] = static_cast<int32_t>(rng() % 99092);
        }
      }
      dev.Upload(b);
      CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      INFO("replay " << replay);
      REQUIRE(dev.Rows(b.tokens.size() * (he - hb)) ==
              HostRows(host, b, 14, hb, he, ENGRAM_HASH_COMPRESSED_IDS));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("GPU hash of tokenizer ids goes through the compressed vocabulary", "[tokenizer]") {
  const char* model = std::getenv("ENGRAM_HASH_MODEL");
  if (model == nullptr || *model == '\0') {
    ENGRAM_SKIP(
        "$ENGRAM_HASH_MODEL (a model directory with engram-hash.bin) is not set: run it as "
        "meson's gpu_hash_tokenizer, which writes one");
  }
  HostHasher host;
  REQUIRE(engram_hasher_open(model, nullptr, &host.h) == 0);
  engram_hasher_info info{};
  info.size = sizeof(info);
  REQUIRE(engram_hasher_get_info(host.h, &info) == 0);
  REQUIRE(info.vocab_size > 0);
  GpuHasher gpu;
  ENGRAM_REQUIRE(engram_gpu_hasher_create(host.h, &gpu.g));
  std::mt19937_64 rng(3);
  const std::vector<HeadRange> ranges = RankRanges(host);
  DeviceBatch dev(64 * 16, 64, info.heads_per_layer);
  for (int i = 0; i < 200; ++i) {
    const Batch b = RandomBatch(rng, info.vocab_size, 64, 16);
    engram_hash_layer_info li{};
    li.size = sizeof(li);
    REQUIRE(engram_hasher_get_layer(host.h, i % info.num_layers, &li) == 0);
    const HeadRange r = ranges[i % ranges.size()];
    dev.Upload(b);
    const engram_gpu_hash_args a = dev.Args(b, li.layer, r.begin, r.end, 0);
    ENGRAM_REQUIRE(engram_gpu_hash(gpu.g, &a, 0));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    REQUIRE(dev.Errors() == 0);
    REQUIRE(dev.Rows(b.tokens.size() * (r.end - r.begin)) ==
            HostRows(host, b, li.layer, r.begin, r.end, 0));
  }
}
