// A one-line progress display for long table jobs (bytes done, rate, ETA) on stderr.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace engram {

class ProgressLine {
 public:
  // `enabled`: draw at all (callers pass isatty(2) or --progress).
  ProgressLine(std::string label, bool enabled);
  ~ProgressLine();
  // Redraws at most a few times a second.
  void Update(uint64_t done_bytes, uint64_t total_bytes);
  // Draws the final state and ends the line.
  void Finish();

 private:
  void Draw(uint64_t done, uint64_t total, bool final);
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  bool finished_ = false;
  uint64_t last_done_ = 0, last_total_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1.5 GiB", "12.0 MiB": for the CLIs' messages.
std::string HumanBytes(double bytes);

}  // namespace engram
