// engram-serve's scheduler, as the engines' continuous batching: every iteration carries each
// running sequence's decode tokens (1 + k speculative) and, in the token budget left, prefill
// chunks of the sequences still reading their prompts, then of waiting requests in arrival order
// (vLLM V1's order: running first, then waiting). The iteration runs as the captured CUDA graph
// of the smallest bucket of tokens it fits.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "bench/serve/serve_requests.h"

namespace engram::bench::serve {

struct SchedulerOptions {
  // Sequences running at once: the H200 reference deployment's --max-num-seqs.
  uint32_t max_num_seqs = 16;
  // Tokens an iteration carries: vLLM V1's max_num_batched_tokens for its API server.
  uint32_t max_batched_tokens = 8192;
  uint32_t spec_tokens = 5;  // k draft tokens verified per decode
  double acceptance = 0.8;   // each draft accepted with this probability, up to the first miss
  uint64_t seed = 1;         // the acceptance draws
};

// The token counts graphs are captured for: powers of two and the 16 x 6 decode step up to the
// budget, and the budget itself; every iteration runs as the smallest that holds it.
std::vector<uint32_t> Buckets(uint32_t max_batched_tokens);
// The smallest bucket of `buckets` (ascending) holding `tokens`; 0 when none does.
uint32_t BucketFor(const std::vector<uint32_t>& buckets, uint32_t tokens);

// Whether draft `draft` (0-based) of the decode at output position `pos` of request `id` is
// accepted: a hash of the four, so every method draws the same.
bool DraftAccepted(const SchedulerOptions& o, uint64_t id, uint64_t pos, uint32_t draft);

// What a request saw: when it arrived, and when each group of its output tokens arrived.
struct RequestRecord {
  uint64_t id = 0, arrival_ns = 0;
  uint32_t prompt = 0, output = 0, delivered = 0;
  bool finished = false;
  std::vector<uint64_t> delivery_ns;  // the first is the first token's
  std::vector<uint32_t> delivery_tokens;
};

// One sequence's share of an iteration: `count` tokens from document position `pos`.
struct Segment {
  uint32_t slot = 0;  // the running sequence's slot in the scheduler
  bool prefill = false;
  uint64_t pos = 0;
  uint32_t count = 0;
};

struct Iteration {
  std::vector<Segment> segments;
  uint32_t tokens = 0, prefill_tokens = 0, bucket = 0;
};

// An iteration's inputs as the step's graph reads them: `bucket` token ids, the sequences'
// starts (seqs + 1, padded with empty sequences), the three ids before each sequence. Tokens
// past the iteration's own are one more sequence of pad ids, as an engine pads a graph's batch.
struct Batch {
  std::vector<int32_t> tokens, starts, history;
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& o, std::vector<uint32_t> buckets);
  void Add(const Request& r, uint64_t arrival_ns);
  bool Idle() const { return running_.empty() && waiting_.empty(); }
  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }
  // The next iteration; empty (no segment) when Idle.
  Iteration Plan();
  // The ids of `it` for a graph of `seqs` sequences (at least max_num_seqs + 1).
  Batch Inputs(const Iteration& it, uint32_t seqs) const;
  // `it` ended at `end_ns`: prompts advance, decodes deliver 1 + their accepted drafts (at most
  // what is left of the output), a finished prompt its first token. Returns the requests that
  // finished.
  std::vector<RequestRecord> Complete(const Iteration& it, uint64_t end_ns);
  // The requests still running or waiting, unfinished, and the scheduler emptied.
  std::vector<RequestRecord> Drain();

 private:
  struct Seq {
    Request req;
    RequestRecord rec;
    uint32_t prefilled = 0;
    bool live = false;
  };
  uint32_t Slot();

  SchedulerOptions o_;
  std::vector<uint32_t> buckets_;
  std::vector<Seq> slots_;
  std::vector<uint32_t> running_;  // slots, in admission order
  std::deque<Seq> waiting_;
};

}  // namespace engram::bench::serve
