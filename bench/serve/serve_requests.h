// engram-serve's requests: each is a document of the token trace cut into a prompt (its prefix)
// and the tokens it generates (the continuation), and the load points that send them (a fixed
// concurrency of closed-loop clients, or open-loop Poisson arrivals at a rate).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace engram::bench::serve {

// DeepSeek-V4.1's compressed pad id: the hash's history before a document's first token, and
// what stands for a draft token past a document's end.
constexpr int32_t kPadToken = 2;

struct RequestOptions {
  uint32_t prompt_cap = 2048;                 // at most this many prompt tokens
  uint32_t output_cap = 128;                  // at most this many generated tokens
  uint32_t min_prompt = 16, min_output = 16;  // shorter documents are not used
  uint64_t seed = 1;                          // the order the documents are used in
};

struct Request {
  uint64_t id = 0;
  const std::vector<int32_t>* doc = nullptr;  // prompt then output, the document's first tokens
  uint32_t prompt = 0, output = 0;
  // The document's token at `pos`, the pad id past its end (a draft beyond the text).
  int32_t Token(uint64_t pos) const { return pos < doc->size() ? (*doc)[pos] : kPadToken; }
};

// The requests in a fixed order: the documents long enough (min_prompt + min_output) in a seeded
// shuffle, used again from the first when they run out. The prompt is a document's first
// min(prompt_cap, length - min_output) tokens, the output the next min(output_cap, rest).
class RequestSource {
 public:
  // InvalidArgument when no document is long enough.
  static absl::StatusOr<RequestSource> Make(std::vector<std::vector<int32_t>> docs,
                                            const RequestOptions& o);
  // Back to the first request: every load point and method sends the same requests.
  void Rewind() { next_ = 0; }
  Request Next();
  size_t documents() const { return order_.size(); }

 private:
  RequestSource() = default;
  std::vector<std::vector<int32_t>> docs_;
  std::vector<uint32_t> order_;
  RequestOptions o_;
  uint64_t next_ = 0;
};

// Synthetic documents for a run without a trace: `n` documents of 1,024-4,095 Zipf(1.0) ids over
// `vocab` (not real text: their n-gram locality is the Zipf law's).
std::vector<std::vector<int32_t>> ZipfDocuments(uint32_t n, uint32_t vocab, uint64_t seed);

// A load point: `value` clients each sending its next request when its last one finished, or
// Poisson arrivals at `value` requests a second.
struct LoadPoint {
  enum Kind { kConcurrency, kRate } kind = kConcurrency;
  double value = 1;
  std::string Name() const;  // "c16", "r2.5"
};

// "c1,c4,c16" or "r0.5,r2"; InvalidArgument naming the bad item.
absl::StatusOr<std::vector<LoadPoint>> ParseLoadPoints(std::string_view list);

// Arrival times (ns after the start) of a Poisson process of `rate` per second within
// [0, duration_ns), the same for the same seed.
std::vector<uint64_t> PoissonArrivals(double rate, uint64_t duration_ns, uint64_t seed);

}  // namespace engram::bench::serve
