// The step timeline engram-trace-replay --hide-drafts reports with: deadlines, stalls and the
// hidden fraction on hand-worked steps.
#include "testkit/miss_timeline.h"

#include <catch2/catch.hpp>
#include <vector>

namespace engram {
namespace {

constexpr uint64_t kMs = 1'000'000;

TEST_CASE("the first Engram layer starts one layer into the target model") {
  const StepTimeline t{
      .step_ns = 20 * kMs, .draft_share = 0.2, .layers = 40, .first_engram_layer = 1};
  CHECK(t.DraftEndNs() == 4 * kMs);
  CHECK(t.DeadlineNs() == 4 * kMs + 400'000);  // 16 ms / 40
}

TEST_CASE("accepted rows hide behind the draft, draft rows only behind layer 0") {
  const StepTimeline t{.step_ns = 20 * kMs, .draft_share = 0.2};  // deadline 4.4 ms
  CHECK(TwoPhaseStallNs({.accepted_ns = 4 * kMs, .draft_ns = 0}, t) == 0);
  CHECK(TwoPhaseStallNs({.accepted_ns = 5 * kMs, .draft_ns = 0}, t) == 600'000);
  CHECK(TwoPhaseStallNs({.accepted_ns = 0, .draft_ns = 400'000}, t) == 0);
  CHECK(TwoPhaseStallNs({.accepted_ns = 0, .draft_ns = 1 * kMs}, t) == 600'000);
  // The later landing decides; the two groups are not added.
  CHECK(TwoPhaseStallNs({.accepted_ns = 5 * kMs, .draft_ns = 1 * kMs}, t) == 600'000);
  // Everything after the draft: 3 ms of accepted rows no longer hide behind it.
  CHECK(AfterDraftStallNs({.accepted_ns = 3 * kMs, .draft_ns = 0}, t) == 2'600'000);
}

TEST_CASE("the hidden fraction is one minus the stall over all fetch time") {
  const StepTimeline t{.step_ns = 20 * kMs, .draft_share = 0.2};
  const std::vector<StepFetch> steps = {{.accepted_ns = 2 * kMs, .draft_ns = 200'000},
                                        {.accepted_ns = 1 * kMs, .draft_ns = 1 * kMs},
                                        {.accepted_ns = 0, .draft_ns = 0}};
  const HiddenReport r = HideFetches(steps, t);
  CHECK(r.fetch_ns == 4'200'000);
  CHECK(r.stall_ns == 600'000);
  CHECK(r.hidden_fraction == 1.0 - 600'000.0 / 4'200'000.0);
  CHECK(r.exposed_steps == std::vector<uint32_t>{1});
  CHECK(r.after_draft_stall_ns == 1'800'000 + 1'600'000);
  CHECK(r.after_draft_exposed == 2);
  CHECK(r.accepted_hidden_fraction == 1.0);                         // 2 ms and 1 ms by 4.4 ms
  CHECK(r.draft_hidden_fraction == 1.0 - 600'000.0 / 1'200'000.0);  // 0.4 ms of window
  CHECK(HideFetches({}, t).hidden_fraction == 1.0);
}

}  // namespace
}  // namespace engram
