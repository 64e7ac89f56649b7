// PacePredictor: learns the period of the bursts of requests the poller sees (decode steps of
// engines stepping on a clock: every rank of a node submits once per step) and says when the
// next burst is due, so that the poller and the request threads can be awake and spinning a
// little before it instead of paying a sleeping thread's wake-up on the critical path of every
// step. It predicts only while the bursts are regular; irregular traffic gets no spinning. One
// late or early burst (a long step, a scheduling hiccup) is passed over; two in a row mean the
// pace changed, and it is learned again.
//
//   PacePredictor pace;
//   pace.OnBurst(now);                        // work arrived after an idle gap
//   if (auto w = pace.Window(now)) { sleep until w->wake; spin until w->until; }
#pragma once

#include <cstdint>
#include <optional>

namespace engram {

struct PaceOptions {
  // A gap of at least this much without work ends a burst; work after it starts the next one.
  uint64_t idle_gap_ns = 1'000'000;
  // Periods outside [min, max] are not predicted (back-to-back work needs no prediction; a
  // period of seconds is not worth a spin).
  uint64_t min_period_ns = 2'000'000;
  uint64_t max_period_ns = 200'000'000;
  // Consecutive intervals within tolerance of the period before a prediction is made.
  uint32_t stable_bursts = 4;
  // An interval is "within tolerance" when it differs from the period by at most this fraction
  // of it, plus the slack.
  double tolerance = 0.125;
  uint64_t slack_ns = 100'000;
  // The spin window starts lead before the expected burst and ends lead after it; lead is twice
  // the intervals' mean deviation, within [min_lead, max_lead].
  uint64_t min_lead_ns = 100'000;
  uint64_t max_lead_ns = 500'000;
};

class PacePredictor {
 public:
  struct SpinWindow {
    uint64_t wake_ns;   // be awake from here
    uint64_t until_ns;  // spin until here at most (the burst is late or skipped: sleep again)
  };

  explicit PacePredictor(PaceOptions options = {}) : o_(options) {}

  // Work arrived at `now_ns` after at least idle_gap_ns without any.
  void OnBurst(uint64_t now_ns) {
    if (last_burst_ns_ != 0) {
      const uint64_t interval = now_ns - last_burst_ns_;
      const uint64_t deviation =
          interval > period_ns_ ? interval - period_ns_ : period_ns_ - interval;
      if (period_ns_ != 0 &&
          double(deviation) <= o_.tolerance * double(period_ns_) + double(o_.slack_ns)) {
        ++stable_;
        outliers_ = 0;
        period_ns_ = (7 * period_ns_ + interval) / 8;
        deviation_ns_ = (3 * deviation_ns_ + deviation) / 4;
      } else if (period_ns_ != 0 && stable_ >= o_.stable_bursts && ++outliers_ < 2) {
        // One burst off the pace: keep the period (the next burst is predicted from this one).
      } else {
        stable_ = 0;
        outliers_ = 0;
        period_ns_ = interval;
        deviation_ns_ = 0;
      }
    }
    last_burst_ns_ = now_ns;
  }

  // The window around the next expected burst, if bursts are regular and it is still ahead
  // (or under way) at `now_ns`; nullopt otherwise.
  std::optional<SpinWindow> Window(uint64_t now_ns) const {
    if (stable_ < o_.stable_bursts || period_ns_ < o_.min_period_ns ||
        period_ns_ > o_.max_period_ns) {
      return std::nullopt;
    }
    const uint64_t lead = lead_ns();
    // The next due burst after the last one; a skipped step moves it on by whole periods.
    uint64_t expected = last_burst_ns_ + period_ns_;
    while (expected + lead < now_ns) expected += period_ns_;
    return SpinWindow{expected - lead, expected + lead};
  }

  uint64_t period_ns() const { return period_ns_; }
  uint64_t lead_ns() const {
    const uint64_t lead = 2 * deviation_ns_;
    return lead < o_.min_lead_ns ? o_.min_lead_ns : lead > o_.max_lead_ns ? o_.max_lead_ns : lead;
  }
  bool predicting() const {
    return stable_ >= o_.stable_bursts && period_ns_ >= o_.min_period_ns &&
           period_ns_ <= o_.max_period_ns;
  }
  const PaceOptions& options() const { return o_; }

 private:
  const PaceOptions o_;
  uint64_t last_burst_ns_ = 0;
  uint64_t period_ns_ = 0;
  uint64_t deviation_ns_ = 0;
  uint32_t stable_ = 0;
  uint32_t outliers_ = 0;  // consecutive bursts off the pace
};

}  // namespace engram
