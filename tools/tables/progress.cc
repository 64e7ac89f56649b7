// ProgressLine: carriage-return progress display for engram-synth and engram-pack.
#include "tools/tables/progress.h"

#include <cstdio>

#include "fmt/format.h"

namespace engram {

std::string HumanBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

ProgressLine::ProgressLine(std::string label, bool enabled)
    : label_(std::move(label)), enabled_(enabled), start_(std::chrono::steady_clock::now()) {}

ProgressLine::~ProgressLine() {
  if (drawn_ && !finished_) std::fputc('\n', stderr);
}

void ProgressLine::Update(uint64_t done, uint64_t total) {
  last_done_ = done;
  last_total_ = total;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  Draw(done, total, false);
}

void ProgressLine::Finish() {
  if (!enabled_ || finished_) return;
  Draw(last_done_, last_total_, true);
  finished_ = true;
}

void ProgressLine::Draw(uint64_t done, uint64_t total, bool final) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = seconds > 0 ? done / seconds : 0;
  const double pct = total ? 100.0 * done / total : 100.0;
  std::string eta = "--";
  if (final) {
    eta = fmt::format("done in {:.1f} s", seconds);
  } else if (rate > 0 && total >= done) {
    const uint64_t left = static_cast<uint64_t>((total - done) / rate);
    eta = fmt::format("ETA {}:{:02d}:{:02d}", left / 3600, (left / 60) % 60, left % 60);
  }
  std::fprintf(stderr, "\r%s: %5.1f%%  %s / %s  %s/s  %s\033[K%s", label_.c_str(), pct,
               HumanBytes(done).c_str(), HumanBytes(total).c_str(), HumanBytes(rate).c_str(),
               eta.c_str(), final ? "\n" : "");
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace engram
