// engram-model-step's step on the GPU: the 40 layers' stand-ins sized to a real layer's time, the
// Engram layers' inputs and weights, and one method's whole step captured in a CUDA graph (the
// lookup on a high-priority side stream, the layers on the main one).
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "bench/model/model_kernels.h"
#include "bench/model/model_step.h"
#include "engram/gpu.h"
#include "engram/gpu_hash.h"
#include "engram/gpu_submit.h"

namespace engram::bench::model_step {
namespace {

engram_gpu_hash_args HashArgs(const HashCtx& h, const Shape& s, uint32_t layer, uint64_t* rows) {
  engram_gpu_hash_args a;
  engram_gpu_hash_args_init(&a, sizeof(a));
  a.layer = layer;
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
      engram_gpu_request r{.size = sizeof(r),
                           .layer = kEngramLayers[l],
                           .flags = 0,
                           .rows = m.ids[l],
                           .num_rows = n,
                           .dest = m.arena_rows[l]};
      engram_gpu_dequant d{sizeof(d),  s.map_d.get<int32_t>(), s.tokens, h.heads(),
                           g.mem[l].p, g.bad.get<uint32_t>()};
      ENGRAM_CHECK(engram_gpu_queue_gather_dequant(m.queue, &r, &d, 1, 0, side));
    }
    CUDA_CHECK(Stamp(g.stamps.get<uint64_t>() + (l == 0 ? kLookup1End : kLookup14End), st.side));
    CUDA_CHECK(cudaEventRecord(st.ready[l], st.side));
  }
}

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

}  // namespace

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

void SizeStandIns(std::vector<std::unique_ptr<Shape>>& shapes, Weights& w, cudaStream_t stream) {
  const uint32_t cal_n = 65536;
  Dev cal(size_t{kHidden} * cal_n * 2);
  CUDA_CHECK(FillBf16(cal.get<uint16_t>(), size_t{kHidden} * cal_n, 1, 0.02f, stream));
  std::vector<uint32_t> room;  // each shape's widest second sizing
  uint32_t max_n = 128;
  for (auto& s : shapes) {
    CUDA_CHECK(FillBf16(s->x_d.get<uint16_t>(), size_t{s->tokens} * kHidden, 2, 1.0f, stream));
    s->y_d = Dev(size_t{s->tokens} * cal_n * 2);
    const double us = TimeGemm(*s, cal, cal_n, stream);
    s->stand_n =
        std::max<uint32_t>(128, static_cast<uint32_t>(s->target_us / us * cal_n / 128) * 128);
    room.push_back((s->stand_n + s->stand_n / 2 + 127) / 128 * 128);
    max_n = std::max(max_n, room.back());
    s->y_d = Dev();  // freed before the next shape's calibration output
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    shapes[i]->y_d = Dev(size_t{shapes[i]->tokens} * room[i] * 2);
  }
  w.stand = Dev(size_t{kHidden} * max_n * 2);
  CUDA_CHECK(FillBf16(w.stand.get<uint16_t>(), size_t{kHidden} * max_n, 3, 0.02f, stream));
  for (size_t i = 0; i < shapes.size(); ++i) {
    Shape& s = *shapes[i];
    const double us = TimeGemm(s, w.stand, s.stand_n, stream);
    const double n = s.stand_n * s.target_us / us;
    s.stand_n = std::clamp<uint32_t>(static_cast<uint32_t>(n / 128) * 128, 128, room[i]);
    s.layer_us = TimeGemm(s, w.stand, s.stand_n, stream);
  }
}

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

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace engram::bench::model_step
