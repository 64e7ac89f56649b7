// engram-model-step's token ids: a token trace's documents (bench/common/token_trace.h, the files
// engram-trace-replay reads) or synthetic Zipf ids, cut into decode steps and prefill chunks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/model/model_step.h"

namespace engram::bench::model_step {

// One step's token ids: `seqs` sequences of `per_seq` tokens, and each sequence's three ids
// before them (the pad id at a document's start).
struct StepTokens {
  std::vector<int32_t> tokens, history;
};

class TokenSource {
 public:
  // From --trace (a Failure naming the file when it is not a token trace or holds ids outside
  // DeepSeek-V4.1's compressed vocabulary), else Zipf(--zipf) ids.
  explicit TokenSource(const Options& o);
  const std::string& source() const { return source_; }

  // Decode: each of `seqs` sequences reads its own document, per_seq tokens a step, and moves
  // to the next document when its own runs out.
  StepTokens Decode(uint32_t seqs, uint32_t per_seq);
  // Prefill: the next `n` tokens of the documents read one after the other as one stream.
  StepTokens Prefill(uint32_t n);

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

}  // namespace engram::bench::model_step
