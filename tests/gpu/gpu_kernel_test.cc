// engram_dequant_scatter on a real GPU equals the CPU reference bit for bit: every (value, scale)
// byte pair, synthetic-checkpoint rows, repeated/padding/out-of-range indices, read zero-copy
// from registered host memory and after an H2D copy; and engram_dequant_gather reading a mapped
// table in place by row id.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engram/engram.h"  // engram_last_error
#include "engram/gpu.h"
#include "kernels/dequant_ref.h"
#include "testkit/gpu_test_util.h"
#ifdef ENGRAM_HAVE_SYNTH
#include "testkit/synthetic.h"
#endif

namespace engram {
namespace {

using testing::DeviceBuffer;
using testing::RegisteredHostBuffer;

constexpr size_t kRow = ENGRAM_GPU_ROW_BYTES;

enum class Source { kZeroCopy, kStaged, kDevice };

const char* SourceName(Source s) {
  return s == Source::kZeroCopy ? "zero-copy" : s == Source::kStaged ? "staged" : "device";
}

// Runs the kernel over `rows` with `map` and returns the bf16 output and the bad-index count.
std::vector<uint16_t> RunOnGpu(const std::vector<uint8_t>& rows, uint32_t num_rows,
                               const std::vector<int32_t>& map, uint32_t tokens, uint32_t heads,
                               Source source, uint32_t* ret_bad) {
  REQUIRE(map.size() == size_t{tokens} * heads);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RegisteredHostBuffer host(rows.size() + 4096);
  std::memcpy(host.host(), rows.data(), rows.size());
  DeviceBuffer device_rows(rows.size());
  DeviceBuffer staging(rows.size());
  DeviceBuffer map_d(map.size() * sizeof(int32_t));
  DeviceBuffer out_d(map.size() * 256 * sizeof(uint16_t));
  DeviceBuffer bad_d(sizeof(uint32_t));
  CUDA_REQUIRE(cudaMemcpy(map_d.get(), map.data(), map_d.bytes(), cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemcpy(device_rows.get(), rows.data(), rows.size(), cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemset(out_d.get(), 0xAB, out_d.bytes()));  // poison: every slot must change
  CUDA_REQUIRE(cudaMemset(bad_d.get(), 0, sizeof(uint32_t)));
  const void* src = source == Source::kDevice ? device_rows.get() : host.device();
  REQUIRE(src != nullptr);
  void* stage = source == Source::kStaged ? staging.get() : nullptr;
  ENGRAM_REQUIRE(engram_dequant_scatter(src, num_rows, map_d.get<int32_t>(), tokens, heads,
                                        out_d.get(), stage, staging.bytes(), bad_d.get<uint32_t>(),
                                        reinterpret_cast<uintptr_t>(stream)));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  std::vector<uint16_t> out(map.size() * 256);
  CUDA_REQUIRE(cudaMemcpy(out.data(), out_d.get(), out_d.bytes(), cudaMemcpyDeviceToHost));
  CUDA_REQUIRE(cudaMemcpy(ret_bad, bad_d.get(), sizeof(uint32_t), cudaMemcpyDeviceToHost));
  CUDA_REQUIRE(cudaStreamDestroy(stream));
  return out;
}

void CheckAgainstReference(const std::vector<uint8_t>& rows, uint32_t num_rows,
                           const std::vector<int32_t>& map, uint32_t tokens, uint32_t heads) {
  std::vector<uint16_t> expected(map.size() * 256);
  const uint64_t expected_bad = DequantScatter(rows, num_rows, map, expected);
  for (Source source : {Source::kZeroCopy, Source::kStaged, Source::kDevice}) {
    INFO("rows read " << SourceName(source));
    uint32_t bad = 0;
    const std::vector<uint16_t> got = RunOnGpu(rows, num_rows, map, tokens, heads, source, &bad);
    CHECK(bad == expected_bad);
    size_t mismatches = 0;
    size_t first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != expected[i] && mismatches++ == 0) first = i;
    }
    INFO("first mismatch: slot " << first / 256 << " value " << first % 256 << " row "
                                 << map[first / 256] << ": gpu 0x" << std::hex << got[first]
                                 << " ref 0x" << expected[first]);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("every value byte under every scale byte matches the reference", "[gpu][kernel]") {
  // Row r: values 0..255, all 8 scales = r. Rows 0..255 cover all 65,536 (value, scale) pairs,
  // including scale 0, 254, 255 (NaN), e4m3 NaN 0x7F/0xFF and the subnormals.
  std::vector<uint8_t> rows(256 * kRow);
  for (int r = 0; r < 256; ++r) {
    for (int i = 0; i < 256; ++i) rows[r * kRow + i] = uint8_t(i);
    for (int b = 0; b < 8; ++b) rows[r * kRow + 256 + b] = uint8_t(r);
  }
  std::vector<int32_t> map(256);
  std::iota(map.begin(), map.end(), 0);
  CheckAgainstReference(rows, 256, map, 16, 16);
}

TEST_CASE("random rows with per-block scales, repeats, padding and bad indices", "[gpu][kernel]") {
  std::mt19937_64 rng(GENERATE(1, 2, 3));
  const uint32_t num_rows = 1000;
  std::vector<uint8_t> rows(num_rows * kRow);
  for (auto& b : rows) b = uint8_t(rng());
  const uint32_t tokens = 96, heads = 24;
  std::vector<int32_t> map(tokens * heads);
  for (auto& m : map) {
    const uint64_t pick = rng() % 100;
    m = pick < 3    ? -1                                // padding
        : pick < 5  ? int32_t(num_rows + rng() % 1000)  // out of range
        : pick < 50 ? int32_t(rng() % 8)                // hot rows served many times
                    : int32_t(rng() % num_rows);
  }
  map[0] = INT32_MAX;  // the extreme bad index
  map[1] = INT32_MIN;  // the extreme padding index
  CheckAgainstReference(rows, num_rows, map, tokens, heads);
}

#ifdef ENGRAM_HAVE_SYNTH
TEST_CASE("synthetic checkpoint rows gathered for a decode step and a prefill chunk",
          "[gpu][kernel]") {
  // The decode step of the H200 reference setup (96 tokens x 12 heads per rank) and a slice of a
  // prefill chunk; rows come from the synthetic checkpoint of testkit/.
  const auto [tokens, num_rows] =
      GENERATE(std::pair<uint32_t, uint32_t>{96, 1152}, std::pair<uint32_t, uint32_t>{2048, 20000});
  const uint32_t heads = 12;
  std::vector<uint8_t> rows(size_t{num_rows} * kRow);
  SyntheticRows(/*seed=*/7, /*layer=*/14, /*first=*/123456, num_rows, rows.data());
  std::mt19937 rng(num_rows);
  std::vector<int32_t> map(size_t{tokens} * heads);
  for (auto& m : map) m = int32_t(rng() % num_rows);
  CheckAgainstReference(rows, num_rows, map, tokens, heads);
}
#endif

TEST_CASE("bad arguments are refused with a message and launch nothing", "[gpu][kernel]") {
  DeviceBuffer rows(4 * kRow), map(16 * sizeof(int32_t)), out(16 * 512);
  const auto* m = map.get<int32_t>();
  CHECK(engram_dequant_scatter(nullptr, 4, m, 4, 4, out.get(), nullptr, 0, nullptr, 0) == -EINVAL);
  CHECK(std::string(engram_last_error()).find("rows is NULL") != std::string::npos);
  CHECK(engram_dequant_scatter(rows.get<char>() + 4, 3, m, 4, 4, out.get(), nullptr, 0, nullptr,
                               0) == -EINVAL);
  CHECK(std::string(engram_last_error()).find("8-byte aligned") != std::string::npos);
  CHECK(engram_dequant_scatter(rows.get(), 4, nullptr, 4, 4, out.get(), nullptr, 0, nullptr, 0) ==
        -EINVAL);
  CHECK(engram_dequant_scatter(rows.get(), 4, m, 4, 4, out.get<char>() + 2, nullptr, 0, nullptr,
                               0) == -EINVAL);
  CHECK(engram_dequant_scatter(rows.get(), 4, m, 4, 4, out.get(), rows.get(), 3 * kRow, nullptr,
                               0) == -EINVAL);
  CHECK(std::string(engram_last_error()).find("staging holds") != std::string::npos);
  CHECK(engram_dequant_scatter(rows.get(), 0x80000000u, m, 4, 4, out.get(), nullptr, 0, nullptr,
                               0) == -EINVAL);
  CHECK(engram_dequant_scatter(rows.get(), 4, nullptr, 0, 4, nullptr, nullptr, 0, nullptr, 0) ==
        0);  // nothing to do
  CHECK(std::string(engram_kernels_backend()) == "cuda");
}

}  // namespace
}  // namespace engram

namespace engram {
namespace {

// engram_dequant_gather: rows read in place from a registered "table" by absolute row ids; the
// reference is the scatter of the same rows gathered on the host.
TEST_CASE("dequant-gather reads a mapped table by row id, bit-exact") {
  constexpr uint64_t kTableRows = 50'000, kRowBegin = 96'000'564;  // a TP rank's range
  constexpr uint32_t kTokens = 96, kHeads = 12;
  std::mt19937_64 rng(17);
  std::vector<uint8_t> table(kTableRows * kRow);
  for (auto& b : table) b = static_cast<uint8_t>(rng());
  for (uint64_t r = 0; r < kTableRows; ++r) {
    for (int s = 0; s < 8; ++s) table[r * kRow + 256 + s] = static_cast<uint8_t>(100 + rng() % 40);
  }
  RegisteredHostBuffer host(table.size());
  std::memcpy(host.host(), table.data(), table.size());
  std::vector<uint64_t> ids(kTokens * kHeads);
  for (auto& id : ids) id = kRowBegin + rng() % kTableRows;
  ids[5] = kRowBegin - 1;           // below the mapped range
  ids[7] = kRowBegin + kTableRows;  // past it
  ids[9] = UINT64_MAX;              // what the GPU hasher writes for a bad token id
  // Reference: the rows gathered on the host (bad ids map to an index past the end: NaN).
  std::vector<uint8_t> gathered(ids.size() * kRow);
  std::vector<int32_t> map(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool inside = ids[i] >= kRowBegin && ids[i] - kRowBegin < kTableRows;
    if (inside) std::memcpy(&gathered[i * kRow], &table[(ids[i] - kRowBegin) * kRow], kRow);
    map[i] = inside ? static_cast<int32_t>(i) : static_cast<int32_t>(ids.size());
  }
  std::vector<uint16_t> expected(ids.size() * 256);
  const uint64_t expected_bad =
      DequantScatter(gathered, static_cast<uint32_t>(ids.size()), map, expected);
  REQUIRE(expected_bad == 3);

  DeviceBuffer ids_d(ids.size() * 8), out_d(ids.size() * 512), bad_d(4);
  CUDA_REQUIRE(cudaMemcpy(ids_d.get(), ids.data(), ids_d.bytes(), cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemset(out_d.get(), 0xAB, out_d.bytes()));
  CUDA_REQUIRE(cudaMemset(bad_d.get(), 0, 4));
  ENGRAM_REQUIRE(engram_dequant_gather(host.device(), kRowBegin, kTableRows, ids_d.get<uint64_t>(),
                                       kTokens, kHeads, out_d.get(), bad_d.get<uint32_t>(), 0));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  std::vector<uint16_t> got(expected.size());
  uint32_t bad = 0;
  CUDA_REQUIRE(cudaMemcpy(got.data(), out_d.get(), out_d.bytes(), cudaMemcpyDeviceToHost));
  CUDA_REQUIRE(cudaMemcpy(&bad, bad_d.get(), 4, cudaMemcpyDeviceToHost));
  CHECK(bad == expected_bad);
  CHECK(got == expected);

  CHECK(engram_dequant_gather(nullptr, 0, 1, ids_d.get<uint64_t>(), 1, 1, out_d.get(), nullptr,
                              0) == -EINVAL);
}

}  // namespace
}  // namespace engram
