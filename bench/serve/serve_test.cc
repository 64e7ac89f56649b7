// engram-serve's host logic: requests cut from documents, load points and arrivals, the
// continuous-batching scheduler and its buckets, the figures, the platforms, NVML's absence, and
// a whole load point on modelled iteration times.
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>

#include "bench/serve/serve_driver.h"
#include "bench/serve/serve_nvml.h"
#include "bench/serve/serve_platform.h"
#include "bench/serve/serve_report.h"
#include "bench/serve/serve_requests.h"
#include "bench/serve/serve_scheduler.h"
#include "bench/serve/serve_stats.h"

namespace engram::bench::serve {
namespace {

using Catch::Matchers::WithinRel;

// A document whose token at position p is 1000 + p (so a test can tell positions apart).
std::vector<int32_t> Doc(uint32_t n, int32_t base = 1000) {
  std::vector<int32_t> d(n);
  std::iota(d.begin(), d.end(), base);
  return d;
}

RequestSource Source(std::vector<std::vector<int32_t>> docs, RequestOptions o) {
  auto s = RequestSource::Make(std::move(docs), o);
  REQUIRE(s.ok());
  return std::move(*s);
}

TEST_CASE("a request is a document's prefix as prompt and its continuation as output") {
  RequestOptions o{.prompt_cap = 100, .output_cap = 20, .min_prompt = 4, .min_output = 4};
  RequestSource s = Source({Doc(50), Doc(500), Doc(7)}, o);  // the 7-token one is too short
  CHECK(s.documents() == 2);
  std::vector<std::pair<uint32_t, uint32_t>> seen;
  for (int i = 0; i < 4; ++i) {
    const Request r = s.Next();
    CHECK(r.id == static_cast<uint64_t>(i));
    CHECK(r.Token(0) == 1000);  // the document's start
    CHECK(r.Token(r.doc->size()) == kPadToken);
    seen.push_back({r.prompt, r.output});
  }
  // Doc(50): prompt 46 (leaving the minimum output), output 4; Doc(500): capped 100 + 20.
  const std::pair<uint32_t, uint32_t> a{46, 4}, b{100, 20};
  CHECK(((seen[0] == a && seen[1] == b) || (seen[0] == b && seen[1] == a)));
  CHECK(seen[2] == seen[0]);  // used again from the first
  s.Rewind();
  CHECK(s.Next().prompt == seen[0].first);
  CHECK_FALSE(RequestSource::Make({Doc(7)}, o).ok());
}

TEST_CASE("load points parse and name themselves") {
  auto p = ParseLoadPoints("c1,c16,r2.5");
  REQUIRE(p.ok());
  REQUIRE(p->size() == 3);
  CHECK((*p)[1].kind == LoadPoint::kConcurrency);
  CHECK((*p)[1].value == 16);
  CHECK((*p)[2].kind == LoadPoint::kRate);
  CHECK((*p)[2].Name() == "r2.5");
  for (const char* bad : {"", "c0", "c1.5", "x3", "r", "r-1", "c1,q"}) {
    CHECK_FALSE(ParseLoadPoints(bad).ok());
  }
}

TEST_CASE("Poisson arrivals come at the rate, in order, the same for the same seed") {
  const auto t = PoissonArrivals(50, 20'000'000'000, 3);
  CHECK(t.size() > 900);  // 1,000 expected; 5 sigma is 158
  CHECK(t.size() < 1100);
  CHECK(std::is_sorted(t.begin(), t.end()));
  CHECK(t.back() < 20'000'000'000);
  CHECK(t == PoissonArrivals(50, 20'000'000'000, 3));
  CHECK(t != PoissonArrivals(50, 20'000'000'000, 4));
}

TEST_CASE("buckets cover every iteration up to the budget") {
  const auto b = Buckets(8192);
  CHECK(b.front() == 8);
  CHECK(b.back() == 8192);
  CHECK(std::find(b.begin(), b.end(), 96u) != b.end());  // the 16 x 6 decode step
  CHECK(BucketFor(b, 1) == 8);
  CHECK(BucketFor(b, 96) == 96);
  CHECK(BucketFor(b, 97) == 128);
  CHECK(BucketFor(b, 8192) == 8192);
  CHECK(BucketFor(b, 8193) == 0);
  CHECK(Buckets(5000).back() == 5000);
}

SchedulerOptions Sched(uint32_t seqs, uint32_t budget, uint32_t k, double acceptance) {
  return {.max_num_seqs = seqs,
          .max_batched_tokens = budget,
          .spec_tokens = k,
          .acceptance = acceptance,
          .seed = 9};
}

TEST_CASE("the scheduler chunks prefill to the budget and runs decodes first") {
  RequestSource s =
      Source({Doc(3000)}, {.prompt_cap = 1000, .output_cap = 3, .min_prompt = 16, .min_output = 3});
  Scheduler sched(Sched(4, 512, 2, 1.0), Buckets(512));
  sched.Add(s.Next(), 0);
  sched.Add(s.Next(), 0);
  Iteration it = sched.Plan();  // request 0's first chunk takes the whole budget
  REQUIRE(it.segments.size() == 1);
  CHECK(it.segments[0].prefill);
  CHECK(it.segments[0].count == 512);
  CHECK(it.bucket == 512);
  CHECK(sched.Complete(it, 10).empty());
  it = sched.Plan();  // the rest of request 0's prompt, then request 1's first chunk
  REQUIRE(it.segments.size() == 2);
  CHECK(it.segments[0].pos == 512);
  CHECK(it.segments[0].count == 488);
  CHECK(it.segments[1].count == 24);
  CHECK(it.prefill_tokens == 512);
  sched.Complete(it, 20);
  it = sched.Plan();  // request 0 decodes (1 + 2 tokens) first, then request 1's prefill
  REQUIRE(it.segments.size() == 2);
  CHECK_FALSE(it.segments[0].prefill);
  CHECK(it.segments[0].count == 3);
  CHECK(it.segments[0].pos == 1000);  // the first output token, then the drafts after it
  CHECK(it.segments[1].count == 509);
  // All drafts accepted: request 0's 3 tokens are its first (at 20) and 2 more: finished.
  const auto done = sched.Complete(it, 30);
  REQUIRE(done.size() == 1);
  CHECK(done[0].finished);
  CHECK(done[0].delivery_ns == std::vector<uint64_t>{20, 30});
  CHECK(done[0].delivery_tokens == std::vector<uint32_t>{1, 2});
  CHECK(sched.running() == 1);
}

TEST_CASE("the scheduler admits at most max_num_seqs and lays out the graph's inputs") {
  RequestSource s =
      Source({Doc(64)}, {.prompt_cap = 8, .output_cap = 8, .min_prompt = 8, .min_output = 8});
  Scheduler sched(Sched(2, 64, 1, 0.0), Buckets(64));
  for (int i = 0; i < 3; ++i) sched.Add(s.Next(), 0);
  Iteration it = sched.Plan();
  CHECK(it.segments.size() == 2);
  CHECK(sched.waiting() == 1);
  CHECK(it.tokens == 16);
  CHECK(it.bucket == 16);
  sched.Complete(it, 5);  // both prompts done: one token each
  it = sched.Plan();      // two decodes of 2 tokens: bucket 8, a padding sequence of 4
  CHECK(it.tokens == 4);
  const Batch b = sched.Inputs(it, 4);
  REQUIRE(b.tokens.size() == 8);
  CHECK(b.starts == std::vector<int32_t>{0, 2, 4, 8, 8});
  CHECK(b.tokens == std::vector<int32_t>{1008, 1009, 1008, 1009, 2, 2, 2, 2});
  CHECK(b.history.size() == 12);
  CHECK(b.history[0] == 1005);  // the three ids before position 8
  CHECK(b.history[2] == 1007);
  CHECK(b.history[6] == kPadToken);
  // No draft accepted: one token per decode.
  sched.Complete(it, 9);
  const auto left = sched.Drain();
  REQUIRE(left.size() == 3);
  CHECK(left[0].delivered == 2);
  CHECK_FALSE(left[0].finished);
  CHECK(left[2].delivered == 0);  // still waiting
}

TEST_CASE("drafts are accepted at the configured rate, the same for every method") {
  const SchedulerOptions o = Sched(1, 64, 5, 0.8);
  int accepted = 0;
  for (uint64_t pos = 0; pos < 20000; ++pos) accepted += DraftAccepted(o, 7, pos, 0) ? 1 : 0;
  CHECK(accepted > 15600);
  CHECK(accepted < 16400);
  CHECK(DraftAccepted(o, 7, 123, 2) == DraftAccepted(o, 7, 123, 2));
}

RequestRecord Record(uint64_t arrival, std::vector<uint64_t> at, std::vector<uint32_t> n) {
  RequestRecord r;
  r.arrival_ns = arrival;
  r.delivery_ns = std::move(at);
  r.delivery_tokens = std::move(n);
  r.delivered = std::accumulate(r.delivery_tokens.begin(), r.delivery_tokens.end(), 0u);
  r.output = r.delivered;
  r.finished = true;
  return r;
}

TEST_CASE("request figures: TTFT, TPOT, gaps, stutters, tokens a second") {
  constexpr uint64_t ms = 1'000'000;
  // Gaps 10, 10, 10, 30 ms: one stutter (30 > 2 x 10); TPOT = 60 ms / (1 + 3 x 2 + 2 - 1).
  const RequestRecord a = Record(0, {5 * ms, 15 * ms, 25 * ms, 35 * ms, 65 * ms}, {1, 2, 2, 2, 2});
  const RequestRecord early = Record(0, {1 * ms}, {1});
  std::vector<RequestRecord> rs = {a, early};
  rs[1].arrival_ns = 0;
  rs[0].arrival_ns = 1 * ms;  // a arrives inside the window, early before it
  const RequestStats s = SummarizeRequests(rs, 1 * ms, 101 * ms);
  CHECK(s.requests == 1);
  CHECK_THAT(s.ttft_p50_ms, WithinRel(4.0, 1e-9));
  CHECK_THAT(s.tpot_p50_ms, WithinRel(60.0 / 8, 1e-9));
  CHECK(s.gaps == 4);
  CHECK(s.stutters == 1);
  CHECK_THAT(s.longest_gap_ms, WithinRel(30.0, 1e-9));
  CHECK_THAT(s.itl_p99_ms, WithinRel(30.0, 1e-9));
  // Tokens delivered within the window: a's 9 and early's 1 (at 1 ms), over 0.1 s.
  CHECK_THAT(s.output_tok_s, WithinRel(100.0, 1e-9));
  const RequestStats none = SummarizeRequests({}, 0, ms);
  CHECK(std::isnan(none.ttft_p99_ms));
}

TEST_CASE("iteration figures: Engram's share and slow iterations by cause") {
  std::vector<IterationRecord> its(4);
  for (auto& r : its) r.base_us = 100, r.span_us = 110, r.wall_us = 120, r.sm_mhz = 1980;
  its[1].wall_us = 300, its[1].wait_us = 150;  // slow, waiting for rows: Engram
  its[2].wall_us = 300, its[2].sm_mhz = 1200;  // slow, the clock low: not Engram's
  its[3].wall_us = 300, its[3].wait_us = 10;   // slow, something else
  const IterationStats s = SummarizeIterations(its, 1980);
  CHECK_THAT(s.engram_share, WithinRel(10.0 / 110, 1e-9));
  CHECK(s.slow == 3);
  CHECK(s.slow_engram == 1);
  CHECK(s.slow_clock == 1);
  CHECK(s.slow_other == 1);
  CHECK_THAT(s.slow_clock_fraction, WithinRel(0.25, 1e-9));
  CHECK(s.sm_mhz_min == 1200);
  // Unknown clock: nothing is put down to it.
  CHECK(SummarizeIterations(its, 0).slow_clock == 0);
  CHECK(std::isnan(SummarizeIterations(its, 0).slow_clock_fraction));
}

TEST_CASE("platforms: the H200 floors, a GB10's step, the cache budget and the NVMe") {
  const PlatformInputs in;
  auto h = PlatformNamed("h200", in);
  auto g = PlatformNamed("gb10", in);
  REQUIRE(h.ok());
  REQUIRE(g.ok());
  CHECK_THAT(LayerTargetUs(*h, 96), WithinRel(1.69e9 / 4.8e12 * 1e6, 1e-9));  // weight bound
  CHECK_THAT(LayerTargetUs(*h, 8192), WithinRel(2 * 81e6 * 8192 / 989e12 * 1e6, 1e-9));
  CHECK_THAT(40 * LayerTargetUs(*g, 96), WithinRel(67e3, 1e-9));
  CHECK(g->emulate_read_latency_us == 286);
  CHECK(g->emulate_read_iops == 112000);
  CHECK(g->cache_fraction < 0.1);
  PlatformInputs measured;
  measured.gb10_prefill_tok_s = 4000;
  CHECK_THAT(40 * LayerTargetUs(*PlatformNamed("gb10", measured), 8192),
             WithinRel(8192.0 / 4000 * 1e6, 1e-9));
  CHECK_FALSE(PlatformNamed("mi350", in).ok());
  CHECK_THAT(UnifiedMemoryBoundUs(1'000'000), WithinRel(3 * 264e6 / 273e9 * 1e6, 1e-9));
}

TEST_CASE("without NVML the sensor says why and reads nothing") {
  GpuSensor s(0, "libnvidia-ml-absent.so.0");
  CHECK_FALSE(s.available());
  CHECK_FALSE(s.why().empty());
  CHECK(s.Read().sm_mhz == 0);
  CHECK(s.MaxSmMhz() == 0);
  GpuSampler sampler(s);  // no thread, nothing read
  CHECK(sampler.Latest().sm_mhz == 0);
}

DriverOptions Driver(LoadPoint load) {
  DriverOptions d;
  d.sched = Sched(16, 8192, 5, 0.8);
  d.buckets = Buckets(8192);
  d.load = load;
  d.duration_ns = 5'000'000'000;
  d.warmup_ns = 500'000'000;
  d.drain_ns = 5'000'000'000;
  return d;
}

TEST_CASE("a closed-loop load point keeps its clients busy and every request finishes") {
  RequestSource s = Source(ZipfDocuments(64, 1000, 1), {.prompt_cap = 512, .output_cap = 32});
  // 10 ms a decode-sized step, more for prefill: a model of an H200.
  ModelExecutor ex(17, [](uint32_t b) { return 10'000.0 + 2.0 * b; });
  const LoadRun one = RunLoad(Driver({LoadPoint::kConcurrency, 1}), s, ex);
  REQUIRE(one.error.empty());
  for (const auto& r : one.requests) CHECK(r.finished);
  const RequestStats q1 = SummarizeRequests(one.requests, one.begin_ns, one.end_ns);
  // Alone, a request's first token takes one prefill iteration of its prompt's bucket.
  CHECK(q1.ttft_p50_ms >= 10.0);
  CHECK(q1.ttft_p50_ms < 12.0);
  CHECK(q1.stutters == 0);  // every decode step the same length
  const LoadRun sixteen = RunLoad(Driver({LoadPoint::kConcurrency, 16}), s, ex);
  const RequestStats q16 = SummarizeRequests(sixteen.requests, sixteen.begin_ns, sixteen.end_ns);
  CHECK(q16.output_tok_s > 4 * q1.output_tok_s);  // batching: more tokens a second
  CHECK(q16.tpot_p50_ms > q1.tpot_p50_ms);        // prefills of others share the steps
  const IterationStats is = SummarizeIterations(sixteen.iterations, 0);
  CHECK(is.iterations > 100);
}

TEST_CASE("an open-loop load point sends its arrivals whatever the server does") {
  RequestSource s = Source(ZipfDocuments(64, 1000, 1), {.prompt_cap = 256, .output_cap = 16});
  ModelExecutor ex(17, [](uint32_t b) { return 10'000.0 + 2.0 * b; });
  DriverOptions d = Driver({LoadPoint::kRate, 4});
  const LoadRun run = RunLoad(d, s, ex);
  REQUIRE(run.error.empty());
  CHECK(run.requests.size() == PoissonArrivals(4, d.duration_ns, d.seed).size());
  Report report(nlohmann::json{{"platform", "test"}});
  report.Add(Summarize("modelled", d.load, run, 0, 6, 0));
  CHECK(report.json()["points"][0]["load"] == "r4");
  CHECK(report.json()["points"][0]["finished"].get<uint64_t>() > 0);
}

}  // namespace
}  // namespace engram::bench::serve
