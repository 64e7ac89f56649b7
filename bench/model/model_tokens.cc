// engram-model-step's token ids (model_tokens.h): a token trace's documents or synthetic Zipf
// ids, cut into decode steps and prefill chunks.
#include "bench/model/model_tokens.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench/common/token_trace.h"

namespace engram::bench::model_step {

TokenSource::TokenSource(const Options& o) : rng_(o.seed) {
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

StepTokens TokenSource::Decode(uint32_t seqs, uint32_t per_seq) {
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

StepTokens TokenSource::Prefill(uint32_t n) {
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

}  // namespace engram::bench::model_step
