// engram-serve's continuous-batching scheduler (serve_scheduler.h).
#include "bench/serve/serve_scheduler.h"

#include <algorithm>

namespace engram::bench::serve {
namespace {

uint64_t Mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<uint32_t> Buckets(uint32_t max_batched_tokens) {
  std::vector<uint32_t> b;
  for (uint32_t t :
       {8u, 16u, 32u, 64u, 96u, 128u, 256u, 512u, 1024u, 2048u, 4096u, 8192u, 16384u, 32768u}) {
    if (t < max_batched_tokens) b.push_back(t);
  }
  b.push_back(max_batched_tokens);
  return b;
}

uint32_t BucketFor(const std::vector<uint32_t>& buckets, uint32_t tokens) {
  auto it = std::lower_bound(buckets.begin(), buckets.end(), tokens);
  return it == buckets.end() ? 0 : *it;
}

bool DraftAccepted(const SchedulerOptions& o, uint64_t id, uint64_t pos, uint32_t draft) {
  const uint64_t h = Mix64(Mix64(Mix64(o.seed ^ id) ^ pos) ^ draft);
  return static_cast<double>(h >> 11) * 0x1.0p-53 < o.acceptance;
}

Scheduler::Scheduler(const SchedulerOptions& o, std::vector<uint32_t> buckets)
    : o_(o), buckets_(std::move(buckets)), slots_(o.max_num_seqs) {}

void Scheduler::Add(const Request& r, uint64_t arrival_ns) {
  Seq s;
  s.req = r;
  s.rec.id = r.id;
  s.rec.arrival_ns = arrival_ns;
  s.rec.prompt = r.prompt;
  s.rec.output = r.output;
  waiting_.push_back(std::move(s));
}

uint32_t Scheduler::Slot() {
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].live) return i;
  }
  return 0;  // not reached: admission checks running_.size() first
}

Iteration Scheduler::Plan() {
  Iteration it;
  uint32_t budget = o_.max_batched_tokens;
  for (uint32_t slot : running_) {  // running first: decodes, then unfinished prompts
    const Seq& s = slots_[slot];
    Segment g{.slot = slot};
    if (s.prefilled < s.req.prompt) {
      g.prefill = true;
      g.pos = s.prefilled;
      g.count = std::min(s.req.prompt - s.prefilled, budget);
    } else {
      // The last token sampled and k drafts after it.
      g.pos = s.req.prompt + s.rec.delivered - 1;
      g.count = 1 + o_.spec_tokens;
      if (g.count > budget) g.count = 0;
    }
    if (g.count == 0) continue;
    budget -= g.count;
    it.segments.push_back(g);
  }
  while (!waiting_.empty() && running_.size() < o_.max_num_seqs && budget > 0) {
    const uint32_t slot = Slot();
    slots_[slot] = std::move(waiting_.front());
    slots_[slot].live = true;
    waiting_.pop_front();
    running_.push_back(slot);
    const Segment g{.slot = slot,
                    .prefill = true,
                    .pos = 0,
                    .count = std::min(slots_[slot].req.prompt, budget)};
    budget -= g.count;
    it.segments.push_back(g);
  }
  for (const Segment& g : it.segments) {
    it.tokens += g.count;
    if (g.prefill) it.prefill_tokens += g.count;
  }
  it.bucket = BucketFor(buckets_, it.tokens);
  return it;
}

Batch Scheduler::Inputs(const Iteration& it, uint32_t seqs) const {
  Batch b;
  b.tokens.reserve(it.bucket);
  for (const Segment& g : it.segments) {
    const Request& r = slots_[g.slot].req;
    b.starts.push_back(static_cast<int32_t>(b.tokens.size()));
    for (uint64_t k = 3; k > 0; --k)
      b.history.push_back(g.pos >= k ? r.Token(g.pos - k) : kPadToken);
    for (uint32_t i = 0; i < g.count; ++i) b.tokens.push_back(r.Token(g.pos + i));
  }
  if (b.tokens.size() < it.bucket) {  // the padding sequence
    b.starts.push_back(static_cast<int32_t>(b.tokens.size()));
    b.history.insert(b.history.end(), 3, kPadToken);
    b.tokens.resize(it.bucket, kPadToken);
  }
  while (b.starts.size() < seqs) {  // empty sequences
    b.starts.push_back(static_cast<int32_t>(b.tokens.size()));
    b.history.insert(b.history.end(), 3, kPadToken);
  }
  b.starts.push_back(static_cast<int32_t>(b.tokens.size()));
  return b;
}

std::vector<RequestRecord> Scheduler::Complete(const Iteration& it, uint64_t end_ns) {
  std::vector<RequestRecord> done;
  for (const Segment& g : it.segments) {
    Seq& s = slots_[g.slot];
    uint32_t tokens = 0;
    if (g.prefill) {
      s.prefilled += g.count;
      if (s.prefilled == s.req.prompt) tokens = 1;  // the prompt's last position samples one
    } else {
      tokens = 1;  // the verified token, then each accepted draft up to the first rejection
      const uint64_t pos = s.req.prompt + s.rec.delivered;
      while (tokens < g.count && DraftAccepted(o_, s.req.id, pos, tokens - 1)) ++tokens;
    }
    tokens = std::min(tokens, s.req.output - s.rec.delivered);
    if (tokens == 0) continue;
    s.rec.delivered += tokens;
    s.rec.delivery_ns.push_back(end_ns);
    s.rec.delivery_tokens.push_back(tokens);
    if (s.rec.delivered == s.req.output) {
      s.rec.finished = true;
      s.live = false;
      done.push_back(std::move(s.rec));
      running_.erase(std::find(running_.begin(), running_.end(), g.slot));
    }
  }
  return done;
}

std::vector<RequestRecord> Scheduler::Drain() {
  std::vector<RequestRecord> left;
  for (uint32_t slot : running_) {
    left.push_back(std::move(slots_[slot].rec));
    slots_[slot].live = false;
  }
  for (Seq& s : waiting_) left.push_back(std::move(s.rec));
  running_.clear();
  waiting_.clear();
  return left;
}

}  // namespace engram::bench::serve
