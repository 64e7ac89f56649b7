// How much of a speculative decode step's row fetch time the model's own work hides, on the
// timeline docs/row-store.md ("Hiding misses behind the step") states: the accepted tokens'
// rows are requested at the step's start, the draft tokens' rows once the draft model has run,
// and both must have landed when the target model reaches its first Engram layer.
#ifndef ENGRAM_TESTKIT_MISS_TIMELINE_H_
#define ENGRAM_TESTKIT_MISS_TIMELINE_H_

#include <cstdint>
#include <span>
#include <vector>

namespace engram {

// A step of step_ns: the draft model takes draft_share of it, then the target model's `layers`
// layers share the rest evenly; rows are needed when layer first_engram_layer (0-based) starts.
struct StepTimeline {
  uint64_t step_ns = 0;
  double draft_share = 0.25;
  uint32_t layers = 40;             // DeepSeek-V4.1
  uint32_t first_engram_layer = 1;  // DeepSeek-V4.1's first Engram layer
  uint64_t DraftEndNs() const;      // when the draft tokens exist
  uint64_t DeadlineNs() const;      // when the first Engram layer starts
};

// One step's measured fetch times: the accepted tokens' rows and the draft tokens' rows.
struct StepFetch {
  uint64_t accepted_ns = 0;
  uint64_t draft_ns = 0;
};

// The time step f makes the model wait: the later of the two groups' landings past the
// deadline (the groups are taken to be served side by side, each in its measured time).
uint64_t TwoPhaseStallNs(const StepFetch& f, const StepTimeline& t);
// The same for the one-call form after the draft: every row requested when the draft ends,
// taking accepted_ns + draft_ns (one request served as the two were).
uint64_t AfterDraftStallNs(const StepFetch& f, const StepTimeline& t);

struct HiddenReport {
  uint64_t fetch_ns = 0;              // all steps' accepted_ns + draft_ns
  uint64_t stall_ns = 0;              // two-phase: the part the model waited for
  uint64_t after_draft_stall_ns = 0;  // one call after the draft
  double hidden_fraction = 1.0;       // 1 - stall_ns / fetch_ns
  // Each group against its own deadline: the accepted rows' time past the first Engram layer
  // over all accepted time; the draft rows' past it over all draft time.
  double accepted_hidden_fraction = 1.0;
  double draft_hidden_fraction = 1.0;
  double after_draft_hidden_fraction = 1.0;
  std::vector<uint32_t> exposed_steps;  // two-phase: steps whose fetch was not fully hidden
  uint64_t after_draft_exposed = 0;
};

HiddenReport HideFetches(std::span<const StepFetch> steps, const StepTimeline& t);

}  // namespace engram

#endif  // ENGRAM_TESTKIT_MISS_TIMELINE_H_
