// engram.h's struct-size policy (conventions 3-5) at every entry point of libengram_kernels_*
// that takes a size-prefixed struct. The kernels read a caller's structs before they look at
// their handles or call the GPU runtime, so these checks run on any machine: a call given a NULL
// handle gets past an accepted struct and stops at the handle ("NULL queue"), which the calls
// below report as kAccepted.
#include <errno.h>
#include <string.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <string>

#include "engram/engram.h"
#include "engram/gpu_hash.h"
#include "engram/gpu_submit.h"
#include "tests/abi/size_policy.h"

namespace {

using engram::testing::CheckInitStruct;
using engram::testing::CheckInputStruct;
using engram::testing::LastErrorHas;

constexpr int kAccepted = 1;

// rc of a call with a NULL handle: kAccepted when it stopped at the handle, after the structs.
int Accepted(int rc) { return rc == -EINVAL && LastErrorHas(": NULL") ? kAccepted : rc; }

// Device pointers the host never dereferences.
template <typename T>
T* Fake(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

engram_gpu_hash_args HashArgs() {
  engram_gpu_hash_args a;
  engram_gpu_hash_args_init(&a, sizeof(a));
  a.layer = 14;
  a.head_begin = 0;
  a.head_end = 8;
  a.tokens = Fake<const int32_t>(0x1000);
  a.n_tokens = 4;
  a.n_seqs = 1;
  a.seq_starts = Fake<const int32_t>(0x2000);
  a.rows = Fake<uint64_t>(0x3000);
  return a;
}

engram_gpu_request Request() {
  engram_gpu_request r{};
  r.size = sizeof(r);
  r.layer = 14;
  r.rows = Fake<const uint64_t>(0x1000);
  r.num_rows = 16;
  r.dest = Fake<uint8_t>(0x2000);
  return r;
}

engram_gpu_dequant Dequant() {
  engram_gpu_dequant d{};
  d.size = sizeof(d);
  d.index_map = Fake<const int32_t>(0x1000);
  d.tokens = 2;
  d.heads = 8;
  d.out = Fake<void>(0x4000);
  return d;
}

}  // namespace

TEST_CASE("engram_gpu_queue_options: init and engram_gpu_queue_create", "[abi][gpu]") {
  constexpr size_t kOlder = offsetof(engram_gpu_queue_options, flags);
  CheckInitStruct("engram_gpu_queue_options", sizeof(engram_gpu_queue_options), kOlder,
                  [](void* p, size_t size) {
                    engram_gpu_queue_options_init(static_cast<engram_gpu_queue_options*>(p), size);
                  });
  engram_gpu_queue_options o;
  engram_gpu_queue_options_init(&o, sizeof(o));
  const int exact =
      CheckInputStruct("engram_gpu_queue_options", &o, sizeof(o), kOlder, [](const void* p) {
        engram_gpu_queue* q = nullptr;
        return Accepted(engram_gpu_queue_create(
            nullptr, nullptr, static_cast<const engram_gpu_queue_options*>(p), &q));
      });
  CHECK(exact == kAccepted);
  // A field within the caller's size is read; one past it takes its default.
  o.flags = 0xF0;
  engram_gpu_queue* q = nullptr;
  CHECK(engram_gpu_queue_create(nullptr, nullptr, &o, &q) == -EINVAL);
  CHECK(LastErrorHas("unknown option flags 0xf0"));
  o.size = kOlder;
  CHECK(Accepted(engram_gpu_queue_create(nullptr, nullptr, &o, &q)) == kAccepted);
}

TEST_CASE("engram_gpu_hash_args: init, engram_gpu_hash and engram_gpu_hash_layers", "[abi][gpu]") {
  constexpr size_t kOlder = offsetof(engram_gpu_hash_args, error_count);
  CheckInitStruct("engram_gpu_hash_args", sizeof(engram_gpu_hash_args), kOlder,
                  [](void* p, size_t size) {
                    engram_gpu_hash_args_init(static_cast<engram_gpu_hash_args*>(p), size);
                  });
  const engram_gpu_hash_args a = HashArgs();
  CHECK(CheckInputStruct("engram_gpu_hash_args", &a, sizeof(a), kOlder, [](const void* p) {
          return Accepted(engram_gpu_hash(nullptr, static_cast<const engram_gpu_hash_args*>(p), 0));
        }) == kAccepted);
  // The second of several calls: its failures name it.
  CHECK(CheckInputStruct("engram_gpu_hash_args", &a, sizeof(a), kOlder, [&a](const void* p) {
          const engram_gpu_hash_args* calls[2] = {&a, static_cast<const engram_gpu_hash_args*>(p)};
          return Accepted(engram_gpu_hash_layers(nullptr, calls, 2, 0));
        }) == kAccepted);
  // An older struct without `rows` has none, whatever lies past its end.
  engram_gpu_hash_args older = a;
  older.size = offsetof(engram_gpu_hash_args, rows);
  CHECK(engram_gpu_hash(nullptr, &older, 0) == -EINVAL);
  CHECK(LastErrorHas("rows must be set"));
}

TEST_CASE("engram_gpu_request arrays: engram_gpu_queue_gather", "[abi][gpu]") {
  const engram_gpu_request r = Request();
  constexpr size_t kOlder = offsetof(engram_gpu_request, flags);
  CHECK(CheckInputStruct("engram_gpu_request", &r, sizeof(r), kOlder, [](const void* p) {
          return Accepted(
              engram_gpu_queue_gather(nullptr, static_cast<const engram_gpu_request*>(p), 1, 0));
        }) == kAccepted);
  // The first request's size is the stride; the others must declare it.
  engram_gpu_request two[2] = {r, r};
  CHECK(Accepted(engram_gpu_queue_gather(nullptr, two, 2, 0)) == kAccepted);
  two[1].size = sizeof(r) - 8;
  CHECK(engram_gpu_queue_gather(nullptr, two, 2, 0) == -EINVAL);
  CHECK(LastErrorHas("engram_gpu_request 1"));
  // flags within the caller's size are read; past it, they are 0.
  engram_gpu_request flagged = r;
  flagged.flags = 1;
  CHECK(engram_gpu_queue_gather(nullptr, &flagged, 1, 0) == -EINVAL);
  CHECK(LastErrorHas("has flags 0x1"));
  flagged.size = kOlder;
  CHECK(Accepted(engram_gpu_queue_gather(nullptr, &flagged, 1, 0)) == kAccepted);
}

TEST_CASE("engram_gpu_dequant arrays: engram_gpu_queue_gather_dequant", "[abi][gpu]") {
  const engram_gpu_request r = Request();
  const engram_gpu_dequant d = Dequant();
  constexpr size_t kOlder = offsetof(engram_gpu_dequant, bad_index_count);
  CHECK(CheckInputStruct("engram_gpu_dequant", &d, sizeof(d), kOlder, [&r](const void* p) {
          return Accepted(engram_gpu_queue_gather_dequant(
              nullptr, &r, static_cast<const engram_gpu_dequant*>(p), 1, 0, 0));
        }) == kAccepted);
  CHECK(CheckInputStruct("engram_gpu_request", &r, sizeof(r), offsetof(engram_gpu_request, flags),
                         [&d](const void* p) {
                           return Accepted(engram_gpu_queue_gather_dequant(
                               nullptr, static_cast<const engram_gpu_request*>(p), &d, 1, 0, 0));
                         }) == kAccepted);
  // An older struct without `out` has none, whatever lies past its end.
  engram_gpu_dequant older = d;
  older.size = offsetof(engram_gpu_dequant, out);
  CHECK(engram_gpu_queue_gather_dequant(nullptr, &r, &older, 1, 0, 0) == -EINVAL);
  CHECK(LastErrorHas("must be set"));
}

TEST_CASE("the kernels' failures reach engram_last_error", "[abi][gpu]") {
  CHECK(engram_gpu_queue_gather(nullptr, nullptr, 0, 0) == -EINVAL);
  const std::string message = engram_last_error();
  CHECK(message.find("engram_gpu_queue_gather") != std::string::npos);
  // The deprecated names stay exported for binaries built against them: the same message.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  CHECK(message == engram_kernels_last_error());
  CHECK(message == engram_gpu_last_error());
#pragma GCC diagnostic pop
}
