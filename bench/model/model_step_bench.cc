// engram-model-step: what Engram offload costs a whole DeepSeek-V4.1 step on the GPU, end to end.
//
// One TP4 rank (rank 1: heads [6, 12) of each table) runs a 40-layer step captured in a CUDA
// graph, for a decode step (16 sequences x (1 + 5 speculative tokens) = 96 tokens) and a prefill
// chunk (8,192 tokens of one sequence):
//   - Engram layers 1 and 14: the full data path at the model's sizes. The step's row ids are
//     hashed on the GPU at forward entry (engram_gpu_hash_layers) on a high-priority side stream,
//     the rows gathered and dequantised (the method below), and at the layer the main stream
//     waits for them, projects the rank's memory (6 heads x 256 values) to the value and hc_mult
//     = 4 keys (one GEMM, hidden 5120) and runs the gate and the short convolution
//     (python/examples/engram_layer.py's EngramMixer).
//   - every layer (0..39): a stand-in of measured cost, one bf16 tensor-core GEMM of the step's
//     tokens x 5120 by 5120 x N, N chosen at start-up so that the GEMM takes the time a real
//     layer takes at TP4 on this GPU: a decode layer reads its weights once (the model's
//     per-rank weight bytes at HBM peak), a prefill layer is bound by its FLOPs (per-rank active
//     parameters x 2 x tokens at FP8 dense peak). Both floors are shorter than a real layer, so
//     the overheads printed are upper bounds.
// Methods, run round-robin with the same token ids every step:
//   no engram        the stand-ins alone (what Engram's share is measured against)
//   gpu memory       the rank's tables copied to GPU memory, read by engram_dequant_gather
//   pinned host      a per-process pinned host copy, read by the GPU over PCIe (zero-copy)
//   resident inplace engramd's resident tables mapped read-only (engram_map_table), registered,
//                    read in place by the GPU: no request
//   resident arena   engramd resident tier through the session's arena: GPU-submitted requests
//                    (engram_gpu_queue_gather_dequant)
//   cache half       engramd cache tier with a cache of half the rank's rows, through the arena
//   storage          engramd storage tier (buffered reads of the table files), through the arena
//   cache inplace    the same cache tier, its row cache mapped read-only and registered: the GPU
//                    reads the hits in place and only the misses go to engramd, from the GPU
//                    (engram_gpu_queue_cache_gather)
// Token ids: --trace FILE (the ENGTRC01 files engram-trace-replay reads; real text through
// tools/trace) or synthetic Zipf ids. Tables are synthetic (random FP8 rows) with the
// DeepSeek-V4.1 hash and compressed vocabulary but smaller primes (--engram-vocab-size), so the
// tables fit a benchmark; the layout and the row size are the model's.
// Prints per method the step's wall time p50/p99, Engram's share, the overhead against GPU
// memory, the host CPU per step (launch + engramd) and the timeline of one step; --json writes
// the same for bench/model/plot_model_step.py. Exit status: 0, 1 on a failed check, 77 without
// a GPU.
#include <cuda_runtime.h>
#include <dirent.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/common/engramd_process.h"
#include "bench/common/token_trace.h"
#include "bench/model/model_kernels.h"
#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/gpu_hash.h"
#include "engram/gpu_submit.h"
#include "engram/hash.h"
#include "nlohmann/json.hpp"
#include "testkit/synthetic.h"

namespace engram::bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// DeepSeek-V4.1's shape, one TP4 rank.
constexpr uint32_t kHidden = 5120, kHc = 4, kLayers = 40, kTp = 4, kRank = 1;
constexpr uint32_t kEngramLayers[2] = {1, 14};
constexpr uint32_t kHeadsPerTable = 24, kRowValues = 256, kRowBytes = 264;
constexpr uint32_t kCompressedVocab = 99092, kPadId = 2;
constexpr uint32_t kProjCols = (1 + kHc) * kHidden;  // value + hc keys

// A failed check: the message names what failed.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void CudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Failure(std::string(what) + ": " + cudaGetErrorString(e));
}
void EngramCheck(int rc, const char* what) {
  if (rc != 0) {
    throw Failure(std::string(what) + " = " + std::to_string(rc) + ": " + engram_last_error());
  }
}
#define CUDA_CHECK(x) CudaCheck((x), #x)
#define ENGRAM_CHECK(x) EngramCheck((x), #x)

struct Options {
  std::string trace, dir = "/var/tmp/engram-model-step", json_out;
  uint64_t engram_vocab_size = 600'000;  // start of the prime search: tables of ~24x rows
  uint32_t decode_steps = 400, prefill_steps = 30, warmup = 20;
  double zipf_s = 1.0;
  // The stand-in's sizing (per TP4 rank, per layer); see the header comment.
  double layer_weight_gb = 1.69;     // weights a 96-token decode step reads per layer and rank
  double layer_active_mparams = 81;  // active parameters per token per layer and rank
  double hbm_tbs = 4.8, fp8_tflops = 989;
  std::string shapes = "decode,prefill";
  uint64_t seed = 1;
};

// ---- Token ids --------------------------------------------------------------------------

// One step's token ids: `seqs` sequences of `per_seq` tokens, and each sequence's three ids
// before them (the pad id at a document's start).
struct StepTokens {
  std::vector<int32_t> tokens, history;
};

class TokenSource {
 public:
  TokenSource(const Options& o) : rng_(o.seed) {
    if (!o.trace.empty()) {
      auto t = ReadTrace(o.trace);
      if (!t.ok()) throw Failure(std::string(t.status().message()));
      if (t->compressed_vocab > kCompressedVocab) {
        throw Failure(o.trace + ": its compressed vocabulary (" +
                      std::to_string(t->compressed_vocab) + ") is larger than DeepSeek-V4.1's (" +
                      std::to_string(kCompressedVocab) + ")");
      }
      for (auto& d : t->docs) {
        if (d.size() >= 8) docs_.push_back(std::move(d));
      }
      if (docs_.empty()) throw Failure(o.trace + ": no document of 8 tokens or more");
      source_ = "trace " + o.trace;
    } else {
      // Zipf over the compressed vocabulary, ranks shuffled onto ids.
      std::vector<double> w(kCompressedVocab);
      for (uint32_t i = 0; i < kCompressedVocab; ++i) w[i] = 1.0 / std::pow(i + 1.0, o.zipf_s);
      zipf_ = std::discrete_distribution<uint32_t>(w.begin(), w.end());
      perm_.resize(kCompressedVocab);
      for (uint32_t i = 0; i < kCompressedVocab; ++i) perm_[i] = static_cast<int32_t>(i);
      std::shuffle(perm_.begin(), perm_.end(), rng_);
      char buf[64];
      std::snprintf(buf, sizeof(buf), "synthetic Zipf(s=%.2f) ids", o.zipf_s);
      source_ = buf;
    }
  }
  const std::string& source() const { return source_; }

  // Decode: each of `seqs` sequences reads its own document, per_seq tokens a step, and moves
  // to the next document when its own runs out.
  StepTokens Decode(uint32_t seqs, uint32_t per_seq) {
    if (cursors_.empty()) {
      for (uint32_t s = 0; s < seqs; ++s) cursors_.push_back({s % Docs(), 0});
    }
    StepTokens st;
    for (auto& c : cursors_) {
      if (c.second + per_seq > Length(c.first)) c = {(c.first + seqs) % Docs(), 0};
      for (uint32_t k = 3; k > 0; --k) {
        st.history.push_back(c.second >= k ? Token(c.first, c.second - k) : kPadId);
      }
      for (uint32_t i = 0; i < per_seq; ++i) st.tokens.push_back(Token(c.first, c.second + i));
      c.second += per_seq;
    }
    return st;
  }
  // Prefill: the next `n` tokens of the documents read one after the other as one stream.
  StepTokens Prefill(uint32_t n) {
    StepTokens st;
    for (uint32_t k = 3; k > 0; --k)
      st.history.push_back(stream_.size() >= k ? stream_[stream_.size() - k] : kPadId);
    for (uint32_t i = 0; i < n; ++i) {
      if (pdoc_pos_ >= Length(pdoc_)) pdoc_ = (pdoc_ + 1) % Docs(), pdoc_pos_ = 0;
      st.tokens.push_back(Token(pdoc_, pdoc_pos_++));
    }
    stream_.assign(st.tokens.end() - 3, st.tokens.end());
    return st;
  }

 private:
  // Synthetic documents are endless: position p of document d is drawn once and kept.
  size_t Docs() const { return docs_.empty() ? 1u << 20 : docs_.size(); }
  size_t Length(size_t d) const { return docs_.empty() ? 4096 : docs_[d].size(); }
  int32_t Token(size_t d, size_t p) {
    if (!docs_.empty()) return docs_[d][p];
    return perm_[zipf_(rng_)];
  }
  std::mt19937_64 rng_;
  std::vector<std::vector<int32_t>> docs_;
  std::discrete_distribution<uint32_t> zipf_;
  std::vector<int32_t> perm_;
  std::vector<std::pair<size_t, size_t>> cursors_;
  std::vector<int32_t> stream_;
  size_t pdoc_ = 0, pdoc_pos_ = 0;
  std::string source_;
};

// ---- The synthetic checkpoint -----------------------------------------------------------

bool IsPrime(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t d = 2; d * d <= n; ++d) {
    if (n % d == 0) return false;
  }
  return true;
}

// The 24 head primes of each table: consecutive primes from engram_vocab_size, in layer order.
std::vector<std::vector<uint64_t>> HeadPrimes(uint64_t start) {
  std::vector<std::vector<uint64_t>> primes(2);
  uint64_t c = start;
  for (auto& layer : primes) {
    while (layer.size() < kHeadsPerTable) {
      if (IsPrime(c)) layer.push_back(c);
      ++c;
    }
  }
  return primes;
}

// A checkpoint engramd serves and the hasher reads: tables of exactly the rows the primes
// imply, the DeepSeek-V4.1 compressed vocabulary and pad id. Reused when it is already there.
std::string MakeModel(const Options& o, const std::vector<std::vector<uint64_t>>& primes) {
  const std::string d = o.dir + "/model-" + std::to_string(o.engram_vocab_size);
  if (std::filesystem::exists(d + "/config.json")) return d;
  uint64_t rows[2];
  for (int l = 0; l < 2; ++l) {
    rows[l] = 0;
    for (uint64_t p : primes[l]) rows[l] += p;
  }
  const std::string tmp = d + ".part";
  std::filesystem::remove_all(tmp);
  for (int l = 0; l < 2; ++l) {
    const std::string part = tmp + "-" + std::to_string(l);
    std::filesystem::remove_all(part);
    SynthOptions so{.out_dir = part, .rows = rows[l], .seed = 7};
    absl::Status s = WriteSyntheticCheckpoint(so);
    if (!s.ok()) throw Failure("cannot write the synthetic checkpoint: " + s.ToString());
  }
  // Layer 1's checkpoint directory with layer 14's shard from the second one (each table at its
  // own size), then the config with the hash parameters.
  std::filesystem::rename(tmp + "-0", tmp);
  const SynthOptions names{.out_dir = tmp, .seed = 7};
  const std::string shard = SyntheticShardName(names, 14);
  std::filesystem::rename(tmp + "-1/" + shard, tmp + "/" + shard);
  std::filesystem::remove_all(tmp + "-1");
  std::ofstream config(tmp + "/config.json", std::ios::trunc);
  config << "{\"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\", "
            "\"text_config\": {\"model_type\": \"deepseek_v4\", \"engram_layer_ids\": [1, 14], "
            "\"engram_num_embeddings\": ["
         << rows[0] << ", " << rows[1]
         << "], \"engram_max_ngram_size\": 4, \"engram_n_heads\": 8, \"engram_head_dim\": 256, "
            "\"engram_vocab_size\": "
         << o.engram_vocab_size << ", \"engram_pad_token_id\": 2, "
         << "\"engram_compressed_vocab_size\": " << kCompressedVocab << "}}\n";
  config.close();
  if (!config) throw Failure("cannot write " + tmp + "/config.json");
  std::filesystem::rename(tmp, d);
  return d;
}

// ---- engramd ---------------------------------------------------------------------------

// An engramd child serving the model with both tables in one tier; stopped at destruction.
class Engramd {
 public:
  Engramd(const std::string& model, const std::string& dir, const std::string& tier,
          uint64_t cache_bytes)
      : process_(model, dir + "/" + tier + ".sock", Flags(tier, cache_bytes), 120'000) {
    if (!process_.ok()) throw Failure("engramd (" + tier + " tier) did not start");
  }
  Engramd(const Engramd&) = delete;
  Engramd& operator=(const Engramd&) = delete;
  const std::string& socket() const { return process_.socket(); }
  // CPU time of all its threads so far (ns), from /proc/PID/task/*/schedstat.
  uint64_t CpuNs() const {
    uint64_t total = 0;
    const std::string dir = "/proc/" + std::to_string(process_.pid()) + "/task";
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return 0;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(dir + "/" + e->d_name + "/schedstat");
      uint64_t ns = 0;
      if (f >> ns) total += ns;
    }
    closedir(d);
    return total;
  }
  engram_session* Connect(uint64_t data_bytes, bool device_submit) const {
    engram_connect_options o;
    engram_connect_options_init(&o, sizeof(o));
    o.socket_path = socket().c_str();
    o.data_bytes = data_bytes;
    o.slots = 32;
    if (device_submit) o.flags = ENGRAM_CONNECT_DEVICE_SUBMIT;
    engram_session* s = nullptr;
    ENGRAM_CHECK(engram_connect(&o, &s));
    return s;
  }

 private:
  // Both tables in `tier`, requests as large as a prefill; a cache of `cache_bytes` (0: the
  // daemon's default).
  static std::vector<std::string> Flags(const std::string& tier, uint64_t cache_bytes) {
    std::vector<std::string> flags = {"--tier", "1=" + tier, "--tier", "14=" + tier,
                                      "--max-rows-per-request", "262144"};
    if (cache_bytes > 0) {
      flags.push_back("--cache-bytes");
      flags.push_back(std::to_string(cache_bytes));
    }
    return flags;
  }

  EngramdProcess process_;
};

// ---- GPU buffers --------------------------------------------------------------------------

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  Dev() = default;
  explicit Dev(size_t n) : bytes(n) {
    CUDA_CHECK(cudaMalloc(&p, n));
    CUDA_CHECK(cudaMemset(p, 0, n));
  }
  ~Dev() { cudaFree(p); }
  Dev(Dev&& o) noexcept : p(std::exchange(o.p, nullptr)), bytes(std::exchange(o.bytes, 0)) {}
  Dev& operator=(Dev&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(p);
  }
};

template <typename T>
void Upload(const Dev& d, const std::vector<T>& v) {
  CUDA_CHECK(cudaMemcpy(d.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// ---- Self-check of the model kernels against the host -----------------------------------

void CheckGemm(cudaStream_t stream) {
  // A row count that is not a tile multiple.
  const uint32_t m = 100, n = 256, k = 96;
  std::vector<uint16_t> a(m * k), b(k * n), c(m * n);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : a) x = FloatToBf16(u(rng));
  for (auto& x : b) x = FloatToBf16(u(rng));
  Dev ad(a.size() * 2), bd(b.size() * 2), cd(c.size() * 2);
  Upload(ad, a), Upload(bd, b);
  CUDA_CHECK(Gemm(ad.get<uint16_t>(), bd.get<uint16_t>(), cd.get<uint16_t>(), m, n, k, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaMemcpy(c.data(), cd.p, c.size() * 2, cudaMemcpyDeviceToHost));
  for (uint32_t i = 0; i < m; ++i) {
    for (uint32_t j = 0; j < n; ++j) {
      double want = 0;
      for (uint32_t q = 0; q < k; ++q)
        want += Bf16ToFloat(a[i * k + q]) * Bf16ToFloat(b[q * n + j]);
      const double got = Bf16ToFloat(c[i * n + j]);
      if (std::fabs(got - want) > 0.02 * std::fabs(want) + 0.05) {
        throw Failure("self-check: GEMM C[" + std::to_string(i) + "][" + std::to_string(j) +
                      "] = " + std::to_string(got) + ", want " + std::to_string(want));
      }
    }
  }
}

// The mixer's inputs for the self-check, on the host.
struct MixerCase {
  static constexpr uint32_t t = 24, h = 256, hc = 4, seq = 12;  // 2 sequences of 12 tokens
  std::vector<uint16_t> proj, hid;
  std::vector<float> kn, qn, cn, cw;
  MixerCase() : proj(t * (1 + hc) * h), hid(t * hc * h) {
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : proj) x = FloatToBf16(u(rng));
    for (auto& x : hid) x = FloatToBf16(u(rng));
    kn = RandomFloats(hc * h, 5, 0.5, 1.5), qn = RandomFloats(hc * h, 6, 0.5, 1.5);
    cn = RandomFloats(h, 7, 0.5, 1.5), cw = RandomFloats(h * 4, 8, -0.5, 0.5);
  }
  double F(uint16_t v) const { return Bf16ToFloat(v); }
  // gated and normed of one (token, branch), as EngramMixer computes them.
  void Gate(uint32_t i, uint32_t br, std::vector<double>& gated,
            std::vector<double>& normed) const {
    const uint16_t* key = &proj[(i * (1 + hc) + 1 + br) * h];
    const uint16_t* query = &hid[(i * hc + br) * h];
    double sk = 0, sq = 0, sv = 0, score = 0;
    for (uint32_t j = 0; j < h; ++j) sk += F(key[j]) * F(key[j]), sq += F(query[j]) * F(query[j]);
    const double rk = 1 / std::sqrt(sk / h + 1e-6), rq = 1 / std::sqrt(sq / h + 1e-6);
    for (uint32_t j = 0; j < h; ++j) {
      score += F(key[j]) * rk * kn[br * h + j] * F(query[j]) * rq * qn[br * h + j];
    }
    score /= std::sqrt(double(h));
    const double root = std::sqrt(std::max(std::fabs(score), 1e-6));
    const double gate = 1 / (1 + std::exp(score < 0 ? root : -root));
    const size_t at = (i * hc + br) * h;
    for (uint32_t j = 0; j < h; ++j) {
      gated[at + j] = gate * F(proj[i * (1 + hc) * h + j]);
      sv += gated[at + j] * gated[at + j];
    }
    for (uint32_t j = 0; j < h; ++j)
      normed[at + j] = gated[at + j] / std::sqrt(sv / h + 1e-6) * cn[j];
  }
  // The layer's output: hidden + gated + SiLU(causal depthwise convolution of normed).
  std::vector<double> Want() const {
    std::vector<double> gated(t * hc * h), normed(t * hc * h), want(t * hc * h);
    for (uint32_t i = 0; i < t; ++i) {
      for (uint32_t br = 0; br < hc; ++br) Gate(i, br, gated, normed);
    }
    for (uint32_t i = 0; i < t; ++i) {
      for (uint32_t br = 0; br < hc; ++br) {
        for (uint32_t j = 0; j < h; ++j) {
          double acc = 0;
          for (uint32_t tap = 0; tap < 4; ++tap) {
            const uint32_t back = (3 - tap) * 3;
            if (i % seq >= back) acc += cw[j * 4 + tap] * normed[((i - back) * hc + br) * h + j];
          }
          const size_t at = (i * hc + br) * h + j;
          want[at] = F(hid[at]) + gated[at] + acc / (1 + std::exp(-acc));
        }
      }
    }
    return want;
  }
};

void CheckMixer(cudaStream_t stream) {
  const MixerCase c;
  Dev pd(c.proj.size() * 2), hd(c.hid.size() * 2), knd(c.kn.size() * 4), qnd(c.qn.size() * 4),
      cnd(c.cn.size() * 4), cwd(c.cw.size() * 4), gd(c.hid.size() * 2), nd(c.hid.size() * 2);
  Upload(pd, c.proj), Upload(hd, c.hid), Upload(knd, c.kn), Upload(qnd, c.qn), Upload(cnd, c.cn),
      Upload(cwd, c.cw);
  MixerArgs ma{c.t,
               c.h,
               c.hc,
               c.seq,
               pd.get<uint16_t>(),
               hd.get<uint16_t>(),
               knd.get<float>(),
               qnd.get<float>(),
               cnd.get<float>(),
               cwd.get<float>(),
               gd.get<uint16_t>(),
               nd.get<uint16_t>()};
  CUDA_CHECK(EngramMix(ma, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> got(c.hid.size());
  CUDA_CHECK(cudaMemcpy(got.data(), hd.p, got.size() * 2, cudaMemcpyDeviceToHost));
  const std::vector<double> want = c.Want();
  for (size_t at = 0; at < want.size(); ++at) {
    if (std::fabs(c.F(got[at]) - want[at]) > 0.03 * std::fabs(want[at]) + 0.03) {
      throw Failure("self-check: Engram mixer output " + std::to_string(at) + " (token " +
                    std::to_string(at / (c.hc * c.h)) + ") = " + std::to_string(c.F(got[at])) +
                    ", want " + std::to_string(want[at]));
    }
  }
}

// ---- Methods ----------------------------------------------------------------------------

enum class Lookup { kNone, kTable, kArena, kCache };

struct Method {
  std::string name;
  Lookup lookup = Lookup::kNone;
  const Engramd* daemon = nullptr;  // whose CPU the method's steps cost
  const void* table[2] = {};        // kTable: device-readable rank-range tables
  uint64_t row_begin[2] = {}, rows[2] = {};
  // kArena: a device-submit session, its registered arena, queue, and ids/rows per layer.
  engram_session* session = nullptr;
  engram_gpu_registration* reg = nullptr;
  engram_gpu_queue* queue = nullptr;
  uint64_t* ids[2] = {};
  uint8_t* arena_rows[2] = {};
  // kCache (an arena method too, for the misses): the row cache as a kernel reads it, and where
  // the lookup lists the misses (rows in the arena's ids, output slots and count on the GPU).
  engram_gpu_row_cache cache[2] = {};
  engram_gpu_cache_misses misses[2] = {};
};

// The step's timestamps (globaltimer), slot by slot.
enum StampAt : int {
  kStepStart,
  kLookupStart,
  kLookup1End,
  kLookup14End,
  kMix1Start,
  kLayer0End,
  kLayer1End,
  kLayer2End,
  kStepEnd,
  kStamps
};
const char* const kStampNames[kStamps] = {
    "step start",          "lookup start",          "layer-1 rows ready",
    "layer-14 rows ready", "layer-1 Engram starts", "layer 0 end",
    "layer 1 end",         "layer 2 end",           "step end"};

// One shape's device state shared by its graphs.
struct Shape {
  std::string name;
  uint32_t seqs, per_seq, tokens;
  double target_us = 0, layer_us = 0;  // a real layer's floor; the stand-in's measured time
  uint32_t stand_n = 0;
  Dev tokens_d, starts_d, history_d, x_d, y_d, hidden_d, proj_d, gated_d, normed_d, map_d;
  Shape(std::string n, uint32_t s, uint32_t p)
      : name(std::move(n)),
        seqs(s),
        per_seq(p),
        tokens(s * p),
        tokens_d(tokens * 4),
        starts_d((s + 1) * 4),
        history_d(s * 3 * 4),
        x_d(size_t{tokens} * kHidden * 2),
        hidden_d(size_t{tokens} * kHc * kHidden * 2),
        proj_d(size_t{tokens} * kProjCols * 2),
        gated_d(size_t{tokens} * kHc * kHidden * 2),
        normed_d(size_t{tokens} * kHc * kHidden * 2),
        map_d(size_t{tokens} * 6 * 4) {}
};

// Model weights shared by all graphs.
struct Weights {
  Dev stand, kv[2], key_norm, query_norm, conv_norm, conv_w;
};

// A method's captured step for one shape.
struct Graph {
  cudaGraphExec_t exec = nullptr;
  Dev stamps{kStamps * 8};
  Dev mem[2], ids[2], bad{4};
  ~Graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

struct Streams {
  cudaStream_t main, side;
  cudaEvent_t fork, ready[2];
};

struct HashCtx {
  engram_hasher* host = nullptr;
  engram_gpu_hasher* gpu = nullptr;
  uint32_t head_begin = 0, head_end = 0;
  uint32_t heads() const { return head_end - head_begin; }
};

engram_gpu_hash_args HashArgs(const HashCtx& h, const Shape& s, uint32_t layer, uint64_t* rows) {
  engram_gpu_hash_args a;
  engram_gpu_hash_args_init(&a, sizeof(a));
  a.layer_id = layer;
  a.flags = ENGRAM_HASH_COMPRESSED_IDS;
  a.head_begin = h.head_begin;
  a.head_end = h.head_end;
  a.tokens = s.tokens_d.get<int32_t>();
  a.n_tokens = s.tokens;
  a.n_seqs = s.seqs;
  a.seq_starts = s.starts_d.get<int32_t>();
  a.history = s.history_d.get<int32_t>();
  a.rows = rows;
  return a;
}

// The lookup on the side stream: hash both layers, then each layer's rows into g.mem[l].
void EnqueueLookup(const Method& m, const HashCtx& h, const Shape& s, Graph& g, const Streams& st) {
  const uint32_t n = s.tokens * h.heads();
  const auto side = reinterpret_cast<uintptr_t>(st.side);
  uint64_t* ids[2];
  for (int l = 0; l < 2; ++l) {
    ids[l] = m.lookup == Lookup::kArena
                 ? static_cast<uint64_t*>(engram_gpu_device_ptr(m.reg, m.ids[l]))
                 : g.ids[l].get<uint64_t>();
  }
  const engram_gpu_hash_args a[2] = {HashArgs(h, s, kEngramLayers[0], ids[0]),
                                     HashArgs(h, s, kEngramLayers[1], ids[1])};
  const engram_gpu_hash_args* both[2] = {&a[0], &a[1]};
  ENGRAM_CHECK(engram_gpu_hash_layers(h.gpu, both, 2, side));
  for (int l = 0; l < 2; ++l) {
    if (m.lookup == Lookup::kTable) {
      ENGRAM_CHECK(engram_dequant_gather(m.table[l], m.row_begin[l], m.rows[l], ids[l], s.tokens,
                                         h.heads(), g.mem[l].p, g.bad.get<uint32_t>(), side));
    } else if (m.lookup == Lookup::kCache) {
      ENGRAM_CHECK(engram_gpu_queue_cache_gather(
          m.queue, &m.cache[l], ids[l], s.tokens, h.heads(), g.mem[l].p, &m.misses[l],
          engram_gpu_device_ptr(m.reg, m.arena_rows[l]), g.bad.get<uint32_t>(), side));
    } else {
      engram_gpu_request r{sizeof(r), {kEngramLayers[l]}, 0, m.ids[l], n, m.arena_rows[l]};
      engram_gpu_dequant d{sizeof(d),  s.map_d.get<int32_t>(), s.tokens, h.heads(),
                           g.mem[l].p, g.bad.get<uint32_t>()};
      ENGRAM_CHECK(engram_gpu_queue_gather_dequant(m.queue, &r, &d, 1, 0, side));
    }
    CUDA_CHECK(Stamp(g.stamps.get<uint64_t>() + (l == 0 ? kLookup1End : kLookup14End), st.side));
    CUDA_CHECK(cudaEventRecord(st.ready[l], st.side));
  }
}

// Captures the method's whole step for the shape.
void Capture(const Method& m, const HashCtx& h, const Shape& s, const Weights& w, Graph& g,
             const Streams& st) {
  const uint32_t heads = h.heads();
  for (int l = 0; l < 2; ++l) {
    g.mem[l] = Dev(size_t{s.tokens} * heads * kRowValues * 2);
    g.ids[l] = Dev(size_t{s.tokens} * heads * 8);
  }
  uint64_t* stamps = g.stamps.get<uint64_t>();
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamBeginCapture(st.main, cudaStreamCaptureModeThreadLocal));
  CUDA_CHECK(Stamp(stamps + kStepStart, st.main));
  const bool engram = m.lookup != Lookup::kNone;
  if (engram) {
    CUDA_CHECK(cudaEventRecord(st.fork, st.main));
    CUDA_CHECK(cudaStreamWaitEvent(st.side, st.fork, 0));
    CUDA_CHECK(Stamp(stamps + kLookupStart, st.side));
    EnqueueLookup(m, h, s, g, st);
  }
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (int e = 0; e < 2 && engram; ++e) {
      if (layer != kEngramLayers[e]) continue;
      CUDA_CHECK(cudaStreamWaitEvent(st.main, st.ready[e], 0));
      if (e == 0) CUDA_CHECK(Stamp(stamps + kMix1Start, st.main));
      CUDA_CHECK(Gemm(g.mem[e].get<uint16_t>(), w.kv[e].get<uint16_t>(), s.proj_d.get<uint16_t>(),
                      s.tokens, kProjCols, heads * kRowValues, st.main));
      MixerArgs ma{s.tokens,
                   kHidden,
                   kHc,
                   s.per_seq,
                   s.proj_d.get<uint16_t>(),
                   s.hidden_d.get<uint16_t>(),
                   w.key_norm.get<float>(),
                   w.query_norm.get<float>(),
                   w.conv_norm.get<float>(),
                   w.conv_w.get<float>(),
                   s.gated_d.get<uint16_t>(),
                   s.normed_d.get<uint16_t>()};
      CUDA_CHECK(EngramMix(ma, st.main));
    }
    CUDA_CHECK(Gemm(s.x_d.get<uint16_t>(), w.stand.get<uint16_t>(), s.y_d.get<uint16_t>(), s.tokens,
                    s.stand_n, kHidden, st.main));
    if (layer <= 2) CUDA_CHECK(Stamp(stamps + kLayer0End + layer, st.main));
  }
  CUDA_CHECK(Stamp(stamps + kStepEnd, st.main));
  CUDA_CHECK(cudaStreamEndCapture(st.main, &graph));
  CUDA_CHECK(
      cudaGraphInstantiateWithFlags(&g.exec, graph, cudaGraphInstantiateFlagUseNodePriority));
  cudaGraphDestroy(graph);
}

// ---- Stand-in sizing --------------------------------------------------------------------

// Microseconds one stand-in GEMM of n columns takes for the shape (median of 15).
double TimeGemm(const Shape& s, const Dev& w, uint32_t n, cudaStream_t stream) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> us;
  for (int i = 0; i < 18; ++i) {
    CUDA_CHECK(cudaEventRecord(a, stream));
    CUDA_CHECK(Gemm(s.x_d.get<uint16_t>(), w.get<uint16_t>(), s.y_d.get<uint16_t>(), s.tokens, n,
                    kHidden, stream));
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) us.push_back(ms * 1000);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// ---- Measurement ------------------------------------------------------------------------

struct Sample {
  std::vector<double> wall_us, span_us, launch_cpu_us, daemon_cpu_us;
  std::vector<std::vector<double>> stamps_us;  // per stamp, relative to step start
  Sample() : stamps_us(kStamps) {}
};

double Pct(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}
double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? NAN : s / v.size();
}

double ThreadCpuUs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

// ---- Setting up ---------------------------------------------------------------------------

Streams MakeStreams() {
  Streams st;
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&st.main, cudaStreamNonBlocking, least));
  // The lookup's stream goes first: its kernels are small and must not queue behind a layer's.
  CUDA_CHECK(cudaStreamCreateWithPriority(&st.side, cudaStreamNonBlocking, greatest));
  CUDA_CHECK(cudaEventCreateWithFlags(&st.fork, cudaEventDisableTiming));
  for (auto& e : st.ready) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return st;
}

// The hashers, and the rank's row range of each table (its heads' sub-tables).
struct Hashing {
  HashCtx h;
  uint64_t rank_begin[2] = {}, rank_rows[2] = {};
  Hashing(const std::string& model, const std::vector<std::vector<uint64_t>>& primes) {
    engram_hasher_opts ho;
    engram_hasher_opts_init(&ho, sizeof(ho));
    ho.flags = ENGRAM_HASHER_COMPRESSED_ONLY;
    ho.compressed_pad_id = kPadId;
    ENGRAM_CHECK(engram_hasher_open(model.c_str(), &ho, &h.host));
    ENGRAM_CHECK(engram_gpu_hasher_create(h.host, &h.gpu));
    ENGRAM_CHECK(engram_hasher_rank_heads(h.host, kTp, kRank, &h.head_begin, &h.head_end));
    for (int l = 0; l < 2; ++l) {
      for (uint32_t hd = 0; hd < kHeadsPerTable; ++hd) {
        if (hd < h.head_begin)
          rank_begin[l] += primes[l][hd];
        else if (hd < h.head_end)
          rank_rows[l] += primes[l][hd];
      }
    }
  }
  ~Hashing() {
    engram_gpu_hasher_destroy(h.gpu);
    engram_hasher_close(h.host);
  }
};

std::vector<std::unique_ptr<Shape>> MakeShapes(const Options& o) {
  std::vector<std::unique_ptr<Shape>> shapes;
  if (o.shapes.find("decode") != std::string::npos) {
    shapes.push_back(std::make_unique<Shape>("decode", 16, 6));
    // A decode layer reads its weights once: bytes at HBM peak.
    shapes.back()->target_us = o.layer_weight_gb * 1e9 / (o.hbm_tbs * 1e12) * 1e6;
  }
  if (o.shapes.find("prefill") != std::string::npos) {
    shapes.push_back(std::make_unique<Shape>("prefill", 1, 8192));
    // A prefill layer is bound by its FLOPs: 2 x active parameters x tokens at FP8 peak.
    shapes.back()->target_us =
        2 * o.layer_active_mparams * 1e6 * 8192 / (o.fp8_tflops * 1e12) * 1e6;
  }
  if (shapes.empty()) throw Failure("--shapes: name decode, prefill or both");
  return shapes;
}

// Sizes each shape's stand-in GEMM to its target time: a calibration GEMM first, then once
// more at the chosen width (several waves of blocks run faster per column than one).
void SizeStandIns(std::vector<std::unique_ptr<Shape>>& shapes, Weights& w, cudaStream_t stream) {
  const uint32_t cal_n = 65536;
  Dev cal(size_t{kHidden} * cal_n * 2);
  CUDA_CHECK(FillBf16(cal.get<uint16_t>(), size_t{kHidden} * cal_n, 1, 0.02f, stream));
  uint32_t max_n = 128;
  for (auto& s : shapes) {
    CUDA_CHECK(FillBf16(s->x_d.get<uint16_t>(), size_t{s->tokens} * kHidden, 2, 1.0f, stream));
    s->y_d = Dev(size_t{s->tokens} * cal_n * 2);
    const double us = TimeGemm(*s, cal, cal_n, stream);
    s->stand_n =
        std::max<uint32_t>(128, static_cast<uint32_t>(s->target_us / us * cal_n / 128) * 128);
    max_n = std::max(max_n, s->stand_n);
  }
  max_n = (max_n + max_n / 2 + 127) / 128 * 128;  // room for the second sizing
  for (auto& s : shapes) s->y_d = Dev(size_t{s->tokens} * max_n * 2);
  w.stand = Dev(size_t{kHidden} * max_n * 2);
  CUDA_CHECK(FillBf16(w.stand.get<uint16_t>(), size_t{kHidden} * max_n, 3, 0.02f, stream));
  for (auto& s : shapes) {
    const double us = TimeGemm(*s, w.stand, s->stand_n, stream);
    const double n = s->stand_n * s->target_us / us;
    s->stand_n = std::clamp<uint32_t>(static_cast<uint32_t>(n / 128) * 128, 128, max_n);
    s->layer_us = TimeGemm(*s, w.stand, s->stand_n, stream);
  }
}

// The Engram layers' weights, and each shape's fixed inputs (sequence starts, slot map, hidden).
void MakeEngramInputs(std::vector<std::unique_ptr<Shape>>& shapes, Weights& w, uint32_t heads,
                      cudaStream_t stream) {
  const uint32_t mem_width = heads * kRowValues;
  for (int l = 0; l < 2; ++l) {
    w.kv[l] = Dev(size_t{mem_width} * kProjCols * 2);
    CUDA_CHECK(FillBf16(w.kv[l].get<uint16_t>(), size_t{mem_width} * kProjCols, 10 + l,
                        1.0f / std::sqrt(float(mem_width)), stream));
  }
  w.key_norm = Dev(kHc * kHidden * 4);
  w.query_norm = Dev(kHc * kHidden * 4);
  w.conv_norm = Dev(kHidden * 4);
  w.conv_w = Dev(kHidden * 4 * 4);
  Upload(w.key_norm, RandomFloats(kHc * kHidden, 21, 0.8, 1.2));
  Upload(w.query_norm, RandomFloats(kHc * kHidden, 22, 0.8, 1.2));
  Upload(w.conv_norm, RandomFloats(kHidden, 23, 0.8, 1.2));
  Upload(w.conv_w, RandomFloats(kHidden * 4, 24, -0.25, 0.25));
  for (auto& s : shapes) {
    std::vector<int32_t> starts(s->seqs + 1), map(s->tokens * heads);
    for (uint32_t q = 0; q <= s->seqs; ++q) starts[q] = static_cast<int32_t>(q * s->per_seq);
    for (size_t i = 0; i < map.size(); ++i) map[i] = static_cast<int32_t>(i);
    Upload(s->starts_d, starts);
    Upload(s->map_d, map);
    CUDA_CHECK(
        FillBf16(s->hidden_d.get<uint16_t>(), size_t{s->tokens} * kHc * kHidden, 4, 1.0f, stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

// Both resident tables mapped read-only from engramd (waiting while it loads them).
struct ResidentMaps {
  engram_session* session = nullptr;
  engram_table_map* maps[2] = {};
  engram_table_map_info info[2] = {};
  ResidentMaps(const Engramd& d, const Hashing& hs) : session(d.Connect(1 << 20, false)) {
    for (int l = 0; l < 2; ++l) {
      int rc = -EAGAIN;
      for (int tries = 0; rc == -EAGAIN && tries < 12000; ++tries) {  // loading at start-up
        rc = engram_map_table(session, kEngramLayers[l], &maps[l]);
        if (rc == -EAGAIN) usleep(10'000);
      }
      EngramCheck(rc, ("engram_map_table(layer " + std::to_string(kEngramLayers[l]) + ")").c_str());
      info[l].size = sizeof(info[l]);
      ENGRAM_CHECK(engram_get_table_map_info(maps[l], &info[l]));
      if (info[l].covered_begin > hs.rank_begin[l] ||
          info[l].covered_end < hs.rank_begin[l] + hs.rank_rows[l]) {
        throw Failure("the resident table of layer " + std::to_string(kEngramLayers[l]) +
                      " does not cover the rank's rows");
      }
    }
  }
  ~ResidentMaps() {
    for (auto* m : maps) {
      if (m != nullptr) engram_unmap_table(m);
    }
    engram_close(session);
  }
  uint64_t Rows(int l) const { return info[l].covered_end - info[l].covered_begin; }
};

// The table methods' memory: the rank's rows in GPU memory and in pinned host memory, and
// engramd's mappings registered; methods[1..3] read them.
struct TableCopies {
  Dev gpu[2];
  void* pinned[2] = {};
  engram_gpu_registration* reg[2] = {};
  TableCopies(const ResidentMaps& rm, const Hashing& hs, std::vector<Method>& methods) {
    for (int l = 0; l < 2; ++l) {
      const uint8_t* src = static_cast<const uint8_t*>(rm.info[l].base) +
                           (hs.rank_begin[l] - rm.info[l].covered_begin) * kRowBytes;
      const size_t bytes = hs.rank_rows[l] * kRowBytes;
      gpu[l] = Dev(bytes);
      CUDA_CHECK(cudaMemcpy(gpu[l].p, src, bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaHostAlloc(&pinned[l], bytes, cudaHostAllocMapped | cudaHostAllocPortable));
      std::memcpy(pinned[l], src, bytes);
      ENGRAM_CHECK(
          engram_gpu_register(const_cast<void*>(rm.info[l].base), rm.info[l].map_bytes, &reg[l]));
      void* pinned_dev = nullptr;
      CUDA_CHECK(cudaHostGetDevicePointer(&pinned_dev, pinned[l], 0));
      const void* tables[3] = {gpu[l].p, pinned_dev,
                               engram_gpu_device_ptr(reg[l], rm.info[l].base)};
      const uint64_t begins[3] = {hs.rank_begin[l], hs.rank_begin[l], rm.info[l].covered_begin};
      const uint64_t rows[3] = {hs.rank_rows[l], hs.rank_rows[l], rm.Rows(l)};
      for (int m = 1; m <= 3; ++m) {
        methods[m].lookup = Lookup::kTable;
        methods[m].table[l] = tables[m - 1];
        methods[m].row_begin[l] = begins[m - 1];
        methods[m].rows[l] = rows[m - 1];
      }
    }
  }
  ~TableCopies() {
    for (int l = 0; l < 2; ++l) {
      if (reg[l] != nullptr) engram_gpu_unregister(reg[l]);
      if (pinned[l] != nullptr) cudaFreeHost(pinned[l]);
    }
  }
};

// An arena method: a device-submit session of `d`, its arena registered, row ids and rows of
// max_rows per layer, a GPU queue.
void SetUpArena(Method& m, const Engramd* d, uint32_t max_rows) {
  m.lookup = Lookup::kArena;
  m.daemon = d;
  const uint64_t data = 2 * (uint64_t{max_rows} * (8 + kRowBytes) + 4096) + (4 << 20);
  m.session = d->Connect(data, true);
  void* arena = nullptr;
  uint64_t arena_bytes = 0;
  ENGRAM_CHECK(engram_arena(m.session, &arena, &arena_bytes));
  ENGRAM_CHECK(engram_gpu_register(arena, arena_bytes, &m.reg));
  for (int l = 0; l < 2; ++l) {
    ENGRAM_CHECK(engram_alloc(m.session, max_rows * 8, reinterpret_cast<void**>(&m.ids[l])));
    ENGRAM_CHECK(engram_alloc(m.session, uint64_t{max_rows} * kRowBytes,
                              reinterpret_cast<void**>(&m.arena_rows[l])));
  }
  engram_gpu_queue_options qo;
  engram_gpu_queue_options_init(&qo, sizeof(qo));
  qo.timeout_ns = 10'000'000'000;
  ENGRAM_CHECK(engram_gpu_queue_create(m.session, m.reg, &qo, &m.queue));
}

void TearDownArena(Method& m) {
  if (m.queue != nullptr) engram_gpu_queue_destroy(m.queue);
  if (m.reg != nullptr) engram_gpu_unregister(m.reg);
  if (m.session != nullptr) engram_close(m.session);
  m.queue = nullptr, m.reg = nullptr, m.session = nullptr;
}

// The cache-inplace method's row cache: mapped (from a host session of the cache-tier engramd:
// the method's own session submits from the GPU), registered, and the misses' device lists.
struct CacheInPlace {
  engram_session* session = nullptr;
  engram_table_map* maps[2] = {};
  engram_gpu_registration* reg[2] = {};
  Dev slots[2], count[2];
  CacheInPlace(const Engramd& d, Method& m, uint32_t max_rows) : session(d.Connect(1 << 20, false)) {
    m.lookup = Lookup::kCache;
    for (int l = 0; l < 2; ++l) {
      int rc = -EAGAIN;
      for (int tries = 0; rc == -EAGAIN && tries < 12000; ++tries) {  // loading at start-up
        rc = engram_table_map_open_any(session, kEngramLayers[l], &maps[l]);
        if (rc == -EAGAIN) usleep(10'000);
      }
      EngramCheck(rc, ("engram_table_map_open_any(layer " + std::to_string(kEngramLayers[l]) +
                       ")").c_str());
      engram_table_map_info info{};
      info.size = sizeof(info);
      ENGRAM_CHECK(engram_get_table_map_info(maps[l], &info));
      ENGRAM_CHECK(engram_gpu_register(const_cast<void*>(info.base), info.map_bytes, &reg[l]));
      m.cache[l].size = sizeof(m.cache[l]);
      ENGRAM_CHECK(engram_table_map_gpu_cache(maps[l], reg[l], &m.cache[l]));
      slots[l] = Dev(size_t{max_rows} * 4);
      count[l] = Dev(4);
      m.misses[l] = engram_gpu_cache_misses{};
      m.misses[l].size = sizeof(m.misses[l]);
      m.misses[l].rows = static_cast<uint64_t*>(engram_gpu_device_ptr(m.reg, m.ids[l]));
      m.misses[l].slots = slots[l].get<uint32_t>();
      m.misses[l].count = count[l].get<uint32_t>();
    }
  }
  ~CacheInPlace() {
    for (int l = 0; l < 2; ++l) {
      if (reg[l] != nullptr) engram_gpu_unregister(reg[l]);
      engram_table_map_close(maps[l]);
    }
    engram_close(session);
  }
};

std::vector<Method> NamedMethods() {
  std::vector<Method> methods(8);
  const char* names[8] = {"no engram",      "gpu memory", "pinned host", "resident inplace",
                          "resident arena", "cache half", "storage",     "cache inplace"};
  for (int i = 0; i < 8; ++i) methods[i].name = names[i];
  return methods;
}

// ---- One shape: capture, measure, check, report -------------------------------------------

struct ShapeRun {
  std::vector<std::unique_ptr<Graph>> graphs;
  std::vector<std::string> broken;  // why a method stopped, if it did
  std::vector<Sample> samples;
};

void CaptureAll(const std::vector<Method>& methods, const HashCtx& h, const Shape& s,
                const Weights& w, const Streams& st, ShapeRun& run) {
  run.broken.assign(methods.size(), "");
  run.samples.assign(methods.size(), Sample());
  for (size_t mi = 0; mi < methods.size(); ++mi) {
    run.graphs.push_back(std::make_unique<Graph>());
    try {
      Capture(methods[mi], h, s, w, *run.graphs.back(), st);
    } catch (const Failure& e) {
      if (mi <= 1) throw;  // the baselines every ratio needs
      run.broken[mi] = std::string("capture: ") + e.what();
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(st.main, &partial);
      if (partial != nullptr) cudaGraphDestroy(partial);
      cudaGetLastError();
    }
  }
}

// One replay of a method's step: wall time, the launch's CPU, engramd's CPU, the stamps.
void TimeStep(const Method& m, const Graph& g, const Streams& st, bool keep, uint32_t step,
              Sample& sm, std::string& broken) {
  const uint64_t d0 = m.daemon != nullptr ? m.daemon->CpuNs() : 0;
  const double c0 = ThreadCpuUs();
  const auto t0 = Clock::now();
  CUDA_CHECK(cudaGraphLaunch(g.exec, st.main));
  const double c1 = ThreadCpuUs();
  CUDA_CHECK(cudaStreamSynchronize(st.main));
  const auto t1 = Clock::now();
  const uint64_t d1 = m.daemon != nullptr ? m.daemon->CpuNs() : 0;
  if (m.queue != nullptr && *engram_gpu_queue_error(m.queue) != 0) {
    // Reported and left out from here on; the other methods go on.
    broken = "the GPU queue reported error " + std::to_string(*engram_gpu_queue_error(m.queue)) +
             " at step " + std::to_string(step);
    return;
  }
  if (!keep) return;
  uint64_t stamps[kStamps];
  CUDA_CHECK(cudaMemcpy(stamps, g.stamps.p, sizeof(stamps), cudaMemcpyDeviceToHost));
  sm.wall_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  sm.span_us.push_back((stamps[kStepEnd] - stamps[kStepStart]) / 1e3);
  sm.launch_cpu_us.push_back(c1 - c0);
  sm.daemon_cpu_us.push_back((d1 - d0) / 1e3);
  for (int k = 0; k < kStamps; ++k) {
    sm.stamps_us[k].push_back((double(stamps[k]) - double(stamps[kStepStart])) / 1e3);
  }
}

// Every step's tokens once, then each method's replay of them in turn (which goes first rotates).
void MeasureShape(const Options& o, TokenSource& source, Shape& s,
                  const std::vector<Method>& methods, const Streams& st, ShapeRun& run) {
  const uint32_t steps = s.name == "decode" ? o.decode_steps : o.prefill_steps;
  for (uint32_t i = 0; i < steps + o.warmup; ++i) {
    const StepTokens t =
        s.name == "decode" ? source.Decode(s.seqs, s.per_seq) : source.Prefill(s.tokens);
    Upload(s.tokens_d, t.tokens);
    Upload(s.history_d, t.history);
    for (size_t k = 0; k < methods.size(); ++k) {
      const size_t mi = (i + k) % methods.size();
      if (!run.broken[mi].empty()) continue;
      TimeStep(methods[mi], *run.graphs[mi], st, i >= o.warmup, i, run.samples[mi], run.broken[mi]);
    }
  }
}

// Every method's rows of the last step equal the GPU-memory copy's, bit for bit; 1 if not, or
// if a method failed.
int CheckRows(const std::vector<Method>& methods, const ShapeRun& run) {
  int failed = 0;
  std::vector<uint8_t> want[2];
  for (int l = 0; l < 2; ++l) {
    want[l].resize(run.graphs[1]->mem[l].bytes);
    CUDA_CHECK(cudaMemcpy(want[l].data(), run.graphs[1]->mem[l].p, want[l].size(),
                          cudaMemcpyDeviceToHost));
  }
  for (size_t mi = 2; mi < methods.size(); ++mi) {
    if (!run.broken[mi].empty()) {
      std::printf("FAILED: %s: %s\n", methods[mi].name.c_str(), run.broken[mi].c_str());
      failed = 1;
      continue;
    }
    uint32_t bad = 0;
    CUDA_CHECK(cudaMemcpy(&bad, run.graphs[mi]->bad.p, 4, cudaMemcpyDeviceToHost));
    for (int l = 0; l < 2; ++l) {
      std::vector<uint8_t> got(want[l].size());
      CUDA_CHECK(
          cudaMemcpy(got.data(), run.graphs[mi]->mem[l].p, got.size(), cudaMemcpyDeviceToHost));
      if (got != want[l] || bad != 0) {
        std::printf(
            "CHECK FAILED: %s's layer-%u rows differ from the GPU-memory copy's (%u bad "
            "row ids)\n",
            methods[mi].name.c_str(), kEngramLayers[l], bad);
        failed = 1;
      }
    }
  }
  return failed;
}

// The per-method table (printed) and its JSON.
json ReportMethods(const std::vector<Method>& methods, const ShapeRun& run) {
  const auto& samples = run.samples;
  const double base = Pct(samples[1].wall_us, 0.5), none = Pct(samples[0].wall_us, 0.5);
  std::printf("%-17s %9s %9s %9s %9s %8s %9s %10s %10s\n", "method", "p50 us", "p99 us", "gpu p50",
              "engram", "vs gpu", "vs gpu", "launch", "engramd");
  std::printf("%-17s %9s %9s %9s %9s %8s %9s %10s %10s\n", "", "(wall)", "(wall)", "(span)",
              "share", "p50", "(us)", "cpu us", "cpu us");
  json jm = json::array();
  for (size_t mi = 0; mi < methods.size(); ++mi) {
    const Sample& sm = samples[mi];
    if (sm.wall_us.empty()) continue;  // failed: said above
    const double p50 = Pct(sm.wall_us, 0.5), p99 = Pct(sm.wall_us, 0.99);
    const double share = mi == 0 ? 0 : (p50 - none) / p50;
    const double vs = p50 / base;
    std::printf("%-17s %9.1f %9.1f %9.1f %8.1f%% %8.4f %+9.1f %10.1f %10.1f\n",
                methods[mi].name.c_str(), p50, p99, Pct(sm.span_us, 0.5), 100 * share, vs,
                p50 - base, Mean(sm.launch_cpu_us), Mean(sm.daemon_cpu_us));
    json tl;
    for (int k = 0; k < kStamps; ++k) tl[kStampNames[k]] = Pct(sm.stamps_us[k], 0.5);
    jm.push_back({{"name", methods[mi].name},
                  {"p50_us", p50},
                  {"p99_us", p99},
                  {"span_p50_us", Pct(sm.span_us, 0.5)},
                  {"span_p99_us", Pct(sm.span_us, 0.99)},
                  {"engram_share", share},
                  {"vs_gpu_memory", vs},
                  {"vs_gpu_memory_p99", p99 / Pct(samples[1].wall_us, 0.99)},
                  {"launch_cpu_us", Mean(sm.launch_cpu_us)},
                  {"engramd_cpu_us", Mean(sm.daemon_cpu_us)},
                  {"timeline_us", tl},
                  {"steps", sm.wall_us.size()}});
  }
  return jm;
}

void PrintTimelines(const std::vector<Method>& methods, const ShapeRun& run) {
  std::printf(
      "timeline of a step (median us after the step starts, GPU clock): lookup "
      "start..layer-1 rows..layer-14 rows | layer 0 end, layer-1 Engram starts, "
      "layer 1 end, layer 2 end | step end\n");
  for (size_t mi = 0; mi < methods.size(); ++mi) {
    const Sample& sm = run.samples[mi];
    if (sm.wall_us.empty()) continue;
    auto p = [&](StampAt k) {
      return mi == 0 && k <= kMix1Start ? NAN : Pct(sm.stamps_us[k], 0.5);
    };
    std::printf("  %-17s %7.1f..%7.1f..%7.1f | %8.1f %8.1f %8.1f %8.1f | %9.1f   stall %+.1f\n",
                methods[mi].name.c_str(), p(kLookupStart), p(kLookup1End), p(kLookup14End),
                p(kLayer0End), p(kMix1Start), p(kLayer1End), p(kLayer2End), p(kStepEnd),
                mi == 0 ? 0.0 : p(kMix1Start) - p(kLayer0End));
  }
}

// The run's header: device, tokens, the rank's rows, the cache budget (printed and as JSON).
json Describe(const Options& o, const cudaDeviceProp& prop, const TokenSource& source,
              const Hashing& hs, const ResidentMaps& rm, uint64_t cache_bytes) {
  json out;
  out["device"] = prop.name;
  out["tokens"] = source.source();
  out["model"] = {{"hidden", kHidden},
                  {"hc_mult", kHc},
                  {"layers", kLayers},
                  {"engram_layers", {1, 14}},
                  {"tp", kTp},
                  {"rank", kRank},
                  {"rank_heads", {hs.h.head_begin, hs.h.head_end}},
                  {"table_rows", {rm.Rows(0), rm.Rows(1)}},
                  {"rank_rows", {hs.rank_rows[0], hs.rank_rows[1]}},
                  {"cache_bytes", cache_bytes}};
  out["stand_in"] = {{"layer_weight_gb", o.layer_weight_gb},
                     {"layer_active_mparams", o.layer_active_mparams},
                     {"hbm_tbs", o.hbm_tbs},
                     {"fp8_tflops", o.fp8_tflops}};
  std::printf(
      "\n%s, %s; TP%u rank %u (heads [%u, %u) of each table: %llu + %llu rows of %llu + %llu); "
      "cache tier budget %.0f MiB (half the rank's rows)\n",
      prop.name, source.source().c_str(), kTp, kRank, hs.h.head_begin, hs.h.head_end,
      static_cast<unsigned long long>(hs.rank_rows[0]),
      static_cast<unsigned long long>(hs.rank_rows[1]), static_cast<unsigned long long>(rm.Rows(0)),
      static_cast<unsigned long long>(rm.Rows(1)), cache_bytes / 1048576.0);
  return out;
}

// Captures, measures, checks and reports one shape; adds it to `out`. Returns 1 on a failure.
int RunShape(const Options& o, TokenSource& source, Shape& s, const std::vector<Method>& methods,
             const Hashing& hs, const Weights& w, const Streams& st, json& out) {
  std::printf(
      "\n== %s: %u tokens (%u x %u), %u rows per layer for the rank; stand-in layer: GEMM %u x "
      "%u x %u, %.1f us measured (floor of a real layer: %.1f us)\n",
      s.name.c_str(), s.tokens, s.seqs, s.per_seq, s.tokens * hs.h.heads(), s.tokens, kHidden,
      s.stand_n, s.layer_us, s.target_us);
  ShapeRun run;
  CaptureAll(methods, hs.h, s, w, st, run);
  MeasureShape(o, source, s, methods, st, run);
  const int failed = CheckRows(methods, run);
  json jm = ReportMethods(methods, run);
  PrintTimelines(methods, run);
  out["shapes"].push_back({{"name", s.name},
                           {"tokens", s.tokens},
                           {"seqs", s.seqs},
                           {"per_seq", s.per_seq},
                           {"rows_per_layer", s.tokens * hs.h.heads()},
                           {"stand_in_n", s.stand_n},
                           {"stand_in_us", s.layer_us},
                           {"layer_floor_us", s.target_us},
                           {"methods", jm}});
  if (!o.json_out.empty()) {  // after each shape: a run cut short keeps what it measured
    std::ofstream f(o.json_out, std::ios::trunc);
    f << out.dump(1) << "\n";
    if (!f) throw Failure("cannot write " + o.json_out);
  }
  return failed;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

int Run(const Options& o) {
  TokenSource source(o);  // a bad trace is refused on any machine, before the GPU is looked for
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const Streams st = MakeStreams();
  CheckGemm(st.main);
  CheckMixer(st.main);
  std::printf("self-check of the GEMM and the Engram mixer against the host: ok\n");

  std::filesystem::create_directories(o.dir);
  const auto primes = HeadPrimes(o.engram_vocab_size);
  const auto t_model = Clock::now();
  const std::string model = MakeModel(o, primes);
  std::printf("synthetic checkpoint %s (%.1f s)\n", model.c_str(), Seconds(t_model));
  const Hashing hs(model, primes);
  auto shapes = MakeShapes(o);
  Weights w;
  SizeStandIns(shapes, w, st.main);
  MakeEngramInputs(shapes, w, hs.h.heads(), st.main);

  // engramd: the resident tier (in place and through the arena), the cache tier at half the
  // rank's rows, the storage tier.
  const uint64_t cache_bytes = (hs.rank_rows[0] + hs.rank_rows[1]) / 2 * kRowBytes;
  const auto t_daemons = Clock::now();
  Engramd resident(model, o.dir, "resident", 0), cache(model, o.dir, "cache", cache_bytes),
      storage(model, o.dir, "storage", 0);
  const ResidentMaps rm(resident, hs);
  std::printf("engramd x3 started, resident tables mapped (%.1f s)\n", Seconds(t_daemons));
  std::vector<Method> methods = NamedMethods();
  const TableCopies copies(rm, hs, methods);
  methods[3].daemon = &resident;
  uint32_t max_rows = 0;
  for (auto& s : shapes) max_rows = std::max(max_rows, s->tokens * hs.h.heads());
  struct Arenas {  // the arena methods' sessions, closed however Run is left
    std::vector<Method>& m;
    ~Arenas() {
      for (auto& x : m) TearDownArena(x);
    }
  } arenas{methods};
  const Engramd* arena_daemons[3] = {&resident, &cache, &storage};
  for (int i = 0; i < 3; ++i) SetUpArena(methods[4 + i], arena_daemons[i], max_rows);
  SetUpArena(methods[7], &cache, max_rows);
  const CacheInPlace cache_maps(cache, methods[7], max_rows);

  json out = Describe(o, prop, source, hs, rm, cache_bytes);
  int failed = 0;
  for (auto& s : shapes) failed |= RunShape(o, source, *s, methods, hs, w, st, out);
  return failed;
}

}  // namespace

}  // namespace engram::bench

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run cut short keeps what it printed
  engram::bench::Options o;
  CLI::App app{
      "engram-model-step: a DeepSeek-V4.1-shaped step on the GPU with Engram's rows "
      "from GPU memory, a pinned host copy and engramd's tiers"};
  app.add_option("--trace", o.trace, "Token trace (ENGTRC01, tools/trace); default: Zipf ids")
      ->check(CLI::ExistingFile);
  app.add_option("--dir", o.dir, "Where the synthetic checkpoint and the sockets go")
      ->capture_default_str();
  app.add_option("--json", o.json_out, "Write the results as JSON here");
  app.add_option("--engram-vocab-size", o.engram_vocab_size,
                 "Start of the head-prime search: each table gets ~24x this many rows")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1000}, uint64_t{16'000'000}));
  app.add_option("--decode-steps", o.decode_steps, "Measured decode steps per method")
      ->capture_default_str()
      ->check(CLI::Range(10u, 100000u));
  app.add_option("--prefill-steps", o.prefill_steps, "Measured prefill chunks per method")
      ->capture_default_str()
      ->check(CLI::Range(5u, 100000u));
  app.add_option("--warmup", o.warmup, "Unmeasured steps first")->capture_default_str();
  app.add_option("--zipf", o.zipf_s, "Zipf exponent of the synthetic ids")->capture_default_str();
  app.add_option("--shapes", o.shapes, "decode, prefill or both")->capture_default_str();
  app.add_option("--layer-weight-gb", o.layer_weight_gb,
                 "Decode stand-in: weight GB a layer reads per TP4 rank")
      ->capture_default_str();
  app.add_option("--layer-active-mparams", o.layer_active_mparams,
                 "Prefill stand-in: active parameters (M) per token, layer and TP4 rank")
      ->capture_default_str();
  app.add_option("--hbm-tbs", o.hbm_tbs, "HBM peak (TB/s) a decode layer's floor is taken at")
      ->capture_default_str();
  app.add_option("--fp8-tflops", o.fp8_tflops, "FP8 dense peak a prefill layer's floor is taken at")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the synthetic ids")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return engram::bench::Run(o);
  } catch (const engram::bench::Failure& e) {
    std::fprintf(stderr, "engram-model-step: %s\n", e.what());
    return 1;
  }
}
