// engram-serve's run options per load point (serve_run.h), shared by the GPU run and the
// CPU-only smoke run.
#include "bench/serve/serve_run.h"

namespace engram::bench::serve {

DriverOptions LoadOptions(const ServeOptions& o, const Platform& p, const LoadPoint& load) {
  DriverOptions d;
  d.sched = o.sched;
  d.buckets = Buckets(o.sched.max_batched_tokens);
  d.load = load;
  auto ns = [](double s) { return static_cast<uint64_t>(s * 1e9); };
  d.duration_ns = ns(o.duration_s > 0 ? o.duration_s : p.duration_s);
  d.warmup_ns = ns(o.warmup_s >= 0 ? o.warmup_s : p.warmup_s);
  d.drain_ns = ns(o.drain_s >= 0 ? o.drain_s : p.drain_s);
  d.seed = o.sched.seed;
  return d;
}

}  // namespace engram::bench::serve
