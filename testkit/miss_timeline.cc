// The step timeline of miss_timeline.h (engram-trace-replay --hide-drafts).
#include "testkit/miss_timeline.h"

#include <algorithm>

namespace engram {

uint64_t StepTimeline::DraftEndNs() const {
  return static_cast<uint64_t>(draft_share * static_cast<double>(step_ns));
}

uint64_t StepTimeline::DeadlineNs() const {
  const uint64_t target_ns = step_ns - DraftEndNs();
  return DraftEndNs() + target_ns * first_engram_layer / layers;
}

uint64_t TwoPhaseStallNs(const StepFetch& f, const StepTimeline& t) {
  const uint64_t landed = std::max(f.accepted_ns, t.DraftEndNs() + f.draft_ns);
  return landed > t.DeadlineNs() ? landed - t.DeadlineNs() : 0;
}

uint64_t AfterDraftStallNs(const StepFetch& f, const StepTimeline& t) {
  const uint64_t landed = t.DraftEndNs() + f.accepted_ns + f.draft_ns;
  return landed > t.DeadlineNs() ? landed - t.DeadlineNs() : 0;
}

namespace {

uint64_t Past(uint64_t landed, uint64_t deadline) {
  return landed > deadline ? landed - deadline : 0;
}

double Hidden(uint64_t late, uint64_t total) {
  return total == 0 ? 1.0 : 1.0 - double(late) / double(total);
}

}  // namespace

HiddenReport HideFetches(std::span<const StepFetch> steps, const StepTimeline& t) {
  HiddenReport r;
  uint64_t accepted = 0, accepted_late = 0, draft = 0, draft_late = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    r.fetch_ns += steps[i].accepted_ns + steps[i].draft_ns;
    accepted += steps[i].accepted_ns;
    draft += steps[i].draft_ns;
    accepted_late += Past(steps[i].accepted_ns, t.DeadlineNs());
    draft_late += Past(t.DraftEndNs() + steps[i].draft_ns, t.DeadlineNs());
    const uint64_t stall = TwoPhaseStallNs(steps[i], t);
    const uint64_t late = AfterDraftStallNs(steps[i], t);
    r.stall_ns += stall;
    r.after_draft_stall_ns += late;
    if (stall > 0) r.exposed_steps.push_back(static_cast<uint32_t>(i));
    r.after_draft_exposed += late > 0;
  }
  r.hidden_fraction = Hidden(r.stall_ns, r.fetch_ns);
  r.after_draft_hidden_fraction = Hidden(r.after_draft_stall_ns, r.fetch_ns);
  r.accepted_hidden_fraction = Hidden(accepted_late, accepted);
  r.draft_hidden_fraction = Hidden(draft_late, draft);
  return r;
}

}  // namespace engram
