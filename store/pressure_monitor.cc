// PressureMonitor: PSI sampling and the shrink/grow steps of the row cache.
#include "store/pressure_monitor.h"

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/clock.h"

namespace engram {
namespace {

bool ReadText(const std::string& path, std::string* ret_text) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *ret_text = ss.str();
  return !ret_text->empty();
}

std::string Mib(uint64_t slots) {
  return absl::StrCat(RowCache::BytesForSlots(slots) >> 20, " MiB");
}

// One "some ..." or "full ..." line; nullopt unless avg10, avg60 and total all parse.
std::optional<PressureStall> ParseStall(absl::string_view line, absl::string_view kind) {
  std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (f.size() < 5 || f[0] != kind) return std::nullopt;
  PressureStall s;
  bool avg10 = false, avg60 = false, total = false;
  for (size_t i = 1; i < f.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(f[i], '=');
    if (kv.first == "avg10") avg10 = absl::SimpleAtod(kv.second, &s.avg10);
    if (kv.first == "avg60") avg60 = absl::SimpleAtod(kv.second, &s.avg60);
    if (kv.first == "total") total = absl::SimpleAtoi(kv.second, &s.total_us);
  }
  if (!avg10 || !avg60 || !total) return std::nullopt;
  return s;
}

}  // namespace

std::optional<MemoryPressure> ParseMemoryPressure(const std::string& text) {
  MemoryPressure p;
  bool some = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (std::optional<PressureStall> s = ParseStall(line, "some")) {
      p.some = *s;
      some = true;
    } else if (std::optional<PressureStall> f = ParseStall(line, "full")) {
      p.full = *f;
    }
  }
  if (!some) return std::nullopt;
  return p;
}

absl::StatusOr<std::string> FindMemoryPressureFile() {
  std::string text, ignored;
  if (ReadText("/proc/self/cgroup", &text)) {
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      if (!absl::ConsumePrefix(&line, "0::")) continue;
      // cgroup v2 mounted at /sys/fs/cgroup, or beside v1 at /sys/fs/cgroup/unified (hybrid).
      for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
        std::string path = absl::StrCat(root, line == "/" ? "" : line, "/memory.pressure");
        if (ReadText(path, &ignored) && ParseMemoryPressure(ignored).has_value()) return path;
      }
    }
  }
  if (ReadText("/proc/pressure/memory", &ignored) && ParseMemoryPressure(ignored).has_value()) {
    return std::string("/proc/pressure/memory");
  }
  return absl::NotFoundError(
      "no memory pressure information (neither the cgroup's memory.pressure nor "
      "/proc/pressure/memory can be read; the kernel needs CONFIG_PSI and psi=1)");
}

PressureMonitor::PressureMonitor(RowCache* cache, uint64_t target_slots, PressureOptions options,
                                 Notice notice)
    : cache_(cache),
      target_slots_(target_slots),
      options_(std::move(options)),
      notice_(std::move(notice)) {}

PressureMonitor::~PressureMonitor() { Stop(); }

absl::Status PressureMonitor::Start() {
  if (options_.path.empty()) {
    auto path = FindMemoryPressureFile();
    if (!path.ok()) return path.status();
    options_.path = *path;
  } else if (std::string text;
             !ReadText(options_.path, &text) || !ParseMemoryPressure(text).has_value()) {
    // A file named in the configuration that gives nothing would leave the cache deaf to
    // pressure without a word.
    return absl::NotFoundError(absl::StrCat(options_.path, " cannot be read as a PSI file"));
  }
  Tick(NowNs());
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void PressureMonitor::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PressureMonitor::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::nanoseconds(options_.interval_ns),
                       [this] { return stop_; })) {
    lock.unlock();
    Tick(NowNs());
    lock.lock();
  }
}

std::optional<double> PressureMonitor::Tick(uint64_t now_ns) {
  std::string text;
  if (!ReadText(options_.path, &text)) return std::nullopt;
  std::optional<MemoryPressure> sample = ParseMemoryPressure(text);
  if (!sample) return std::nullopt;
  std::optional<MemoryPressure> last = std::exchange(last_, *sample);
  const uint64_t last_ns = std::exchange(last_ns_, now_ns);
  if (!last || now_ns <= last_ns) return std::nullopt;
  const double stall =
      double(sample->some.total_us - last->some.total_us) * 1000.0 / double(now_ns - last_ns);
  const uint64_t current = cache_->capacity_slots();
  const uint64_t floor = static_cast<uint64_t>(target_slots_ * options_.floor_fraction);
  if (stall > options_.shrink_above) {
    calm_ = 0;
    const uint64_t want =
        std::max(floor, current - static_cast<uint64_t>(current * options_.shrink_step));
    if (want < current) {
      const uint64_t now = cache_->SetCapacitySlots(want);
      notice_(absl::StrCat("memory pressure (", static_cast<int>(stall * 100),
                           " % of the last interval stalled, ", options_.path,
                           "): row cache shrunk from ", Mib(current), " to ", Mib(now)));
    }
  } else if (stall < options_.shrink_above / 4 && current < target_slots_) {
    if (++calm_ >= options_.calm_intervals) {
      const uint64_t want = std::min(
          target_slots_, current + static_cast<uint64_t>(target_slots_ * options_.grow_step) + 1);
      const uint64_t now = cache_->SetCapacitySlots(want);
      if (now > current) {
        notice_(absl::StrCat("memory pressure gone: row cache grown from ", Mib(current), " to ",
                             Mib(now), " (configured ", Mib(target_slots_), ")"));
      }
    }
  } else {
    calm_ = 0;
  }
  return stall;
}

}  // namespace engram
