// engram-serve's driver (serve_driver.h).
#include "bench/serve/serve_driver.h"

#include <algorithm>

namespace engram::bench::serve {

std::string ModelExecutor::Run(const Iteration& it, const Batch& b, IterationRecord& rec) {
  if (b.tokens.size() != it.bucket || b.starts.size() != seqs_ + 1) {
    return "the iteration's inputs do not match its bucket";
  }
  const double us = step_us_(it.bucket);
  now_ += static_cast<uint64_t>(us * 1e3);
  rec.wall_us = rec.span_us = rec.base_us = us;  // a model has no Engram to wait for
  return "";
}

namespace {

// Where the load point's requests come from: the Poisson times, or the clients' next sends.
struct Arrivals {
  std::vector<uint64_t> times;  // absolute ns, ascending
  size_t next = 0;
};

// Adds to `sched` every request arrived by `now`.
void Admit(Arrivals& a, uint64_t now, RequestSource& requests, Scheduler& sched) {
  while (a.next < a.times.size() && a.times[a.next] <= now) {
    sched.Add(requests.Next(), a.times[a.next]);
    ++a.next;
  }
}

}  // namespace

LoadRun RunLoad(const DriverOptions& o, RequestSource& requests, Executor& ex) {
  requests.Rewind();
  Scheduler sched(o.sched, o.buckets);
  LoadRun run;
  const uint64_t t0 = ex.Now();
  const uint64_t issue_end = t0 + o.duration_ns, stop = issue_end + o.drain_ns;
  run.begin_ns = t0 + o.warmup_ns;
  run.end_ns = issue_end;
  run.start_ns = t0;
  Arrivals a;
  const bool closed = o.load.kind == LoadPoint::kConcurrency;
  if (closed) {
    a.times.assign(static_cast<size_t>(o.load.value), t0);
  } else {
    a.times = PoissonArrivals(o.load.value, o.duration_ns, o.seed);
    for (auto& t : a.times) t += t0;
  }
  while (true) {
    const uint64_t now = ex.Now();
    Admit(a, now, requests, sched);
    if (sched.Idle()) {
      if (a.next == a.times.size()) break;  // every request sent has finished
      ex.WaitUntil(a.times[a.next]);
      continue;
    }
    if (now >= stop) break;
    const Iteration it = sched.Plan();
    const Batch b = sched.Inputs(it, ex.Seqs());
    IterationRecord rec;
    run.error = ex.Run(it, b, rec);
    if (!run.error.empty()) break;
    const uint64_t end = ex.Now();
    rec.end_ns = end;
    rec.bucket = it.bucket, rec.tokens = it.tokens, rec.prefill_tokens = it.prefill_tokens;
    ++run.iterations_all;
    if (end >= run.begin_ns && end < run.end_ns) run.iterations.push_back(rec);
    for (RequestRecord& r : sched.Complete(it, end)) {
      // A client sends its next request as soon as its last one finished, until the end.
      if (closed && end < issue_end) a.times.push_back(end);
      run.requests.push_back(std::move(r));
    }
  }
  for (RequestRecord& r : sched.Drain()) run.requests.push_back(std::move(r));
  run.finish_ns = ex.Now();
  return run;
}

}  // namespace engram::bench::serve
