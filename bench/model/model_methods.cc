// engram-model-step's methods, where each reads the Engram rows from: GPU memory, a pinned host
// copy, engramd's resident tables mapped in place, and engramd's tiers through the session's
// arena or (the cache tier) its row cache mapped in place with the misses sent from the GPU.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "bench/common/clocks.h"
#include "bench/model/model_step.h"
#include "engram/engram.h"
#include "engram/gpu.h"
#include "engram/gpu_submit.h"

namespace engram::bench::model_step {

Engramd::Engramd(const std::string& model, const std::string& dir, const std::string& tier,
                 uint64_t cache_bytes, const std::vector<std::string>& extra)
    : process_(model, dir + "/" + tier + ".sock", Flags(tier, cache_bytes, extra), 120'000) {
  if (!process_.ok()) throw Failure("engramd (" + tier + " tier) did not start");
}

uint64_t Engramd::CpuNs() const { return ProcessRunNs(process_.pid()); }

engram_session* Engramd::Connect(uint64_t data_bytes, bool device_submit) const {
  engram_connect_options o;
  engram_connect_options_init(&o, sizeof(o));
  o.socket_path = socket().c_str();
  o.data_bytes = data_bytes;
  o.slots = 32;
  if (device_submit) o.flags = ENGRAM_CONNECT_DEVICE_SUBMIT;
  engram_session* s = nullptr;
  ENGRAM_CHECK(engram_session_open(&o, &s));
  return s;
}

std::vector<std::string> Engramd::Flags(const std::string& tier, uint64_t cache_bytes,
                                        const std::vector<std::string>& extra) {
  std::vector<std::string> flags = {
      "--tier", "1=" + tier, "--tier", "14=" + tier, "--max-rows-per-request", "262144"};
  if (cache_bytes > 0) {
    flags.push_back("--cache-bytes");
    flags.push_back(std::to_string(cache_bytes));
  }
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

ResidentMaps::ResidentMaps(const Engramd& d, const Hashing& hs)
    : session(d.Connect(1 << 20, false)) {
  for (int l = 0; l < 2; ++l) {
    int rc = -EAGAIN;
    for (int tries = 0; rc == -EAGAIN && tries < 12000; ++tries) {  // loading at start-up
      rc = engram_table_map_open(session, kEngramLayers[l], &maps[l]);
      if (rc == -EAGAIN) usleep(10'000);
    }
    EngramCheck(rc,
                ("engram_table_map_open(layer " + std::to_string(kEngramLayers[l]) + ")").c_str());
    info[l].size = sizeof(info[l]);
    ENGRAM_CHECK(engram_get_table_map_info(maps[l], &info[l]));
    if (info[l].covered_begin > hs.rank_begin[l] ||
        info[l].covered_end < hs.rank_begin[l] + hs.rank_rows[l]) {
      throw Failure("the resident table of layer " + std::to_string(kEngramLayers[l]) +
                    " does not cover the rank's rows");
    }
  }
}

ResidentMaps::~ResidentMaps() {
  for (auto* m : maps) {
    if (m != nullptr) engram_table_map_close(m);
  }
  engram_session_close(session);
}

TableCopies::TableCopies(const ResidentMaps& rm, const Hashing& hs, std::vector<Method>& methods) {
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
    const void* tables[3] = {gpu[l].p, pinned_dev, engram_gpu_device_ptr(reg[l], rm.info[l].base)};
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

TableCopies::~TableCopies() {
  for (int l = 0; l < 2; ++l) {
    if (reg[l] != nullptr) engram_gpu_unregister(reg[l]);
    if (pinned[l] != nullptr) cudaFreeHost(pinned[l]);
  }
}

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
  if (m.session != nullptr) engram_session_close(m.session);
  m.queue = nullptr, m.reg = nullptr, m.session = nullptr;
}

CacheInPlace::CacheInPlace(const Engramd& d, Method& m, uint32_t max_rows)
    : session(d.Connect(1 << 20, false)) {
  m.lookup = Lookup::kCache;
  for (int l = 0; l < 2; ++l) {
    int rc = -EAGAIN;
    for (int tries = 0; rc == -EAGAIN && tries < 12000; ++tries) {  // loading at start-up
      rc = engram_table_map_open_any(session, kEngramLayers[l], &maps[l]);
      if (rc == -EAGAIN) usleep(10'000);
    }
    EngramCheck(
        rc, ("engram_table_map_open_any(layer " + std::to_string(kEngramLayers[l]) + ")").c_str());
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

CacheInPlace::~CacheInPlace() {
  for (int l = 0; l < 2; ++l) {
    if (reg[l] != nullptr) engram_gpu_unregister(reg[l]);
    engram_table_map_close(maps[l]);
  }
  engram_session_close(session);
}

std::vector<Method> NamedMethods() {
  std::vector<Method> methods(8);
  const char* names[8] = {"no engram",      "gpu memory", "pinned host", "resident inplace",
                          "resident arena", "cache half", "storage",     "cache inplace"};
  for (int i = 0; i < 8; ++i) methods[i].name = names[i];
  return methods;
}

}  // namespace engram::bench::model_step
