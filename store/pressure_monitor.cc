// PressureMonitor: PSI sampling and the shrink/grow steps of the row cache.
#include "store/pressure_monitor.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/clock.h"
#include "base/file_io.h"

namespace engram {
namespace {

// A PSI file is two lines of four fields ("some avg10=100.00 avg60=100.00 avg300=100.00
// total=18446744073709551615"), under 80 bytes each: a file holding more is not one, and is not
// read further.
constexpr size_t kMaxPsiBytes = 1024;
// /proc/self/cgroup: a line per hierarchy (a dozen under v1), each a path under /sys/fs/cgroup.
constexpr size_t kMaxCgroupListBytes = 64 * 1024;

// The text of `path`, a regular file (followed through symbolic links: a cgroup's files may be
// reached through one) of at most `max_bytes`; opening it never blocks (file_io.h).
absl::StatusOr<std::string> ReadText(const std::string& path, size_t max_bytes) {
  absl::StatusOr<UniqueFd> fd = OpenRegularFile("", path, Symlink::kFollow);
  if (!fd.ok()) return fd.status();
  return ReadAtMost(fd->get(), path, max_bytes);
}

// The PSI sample in `path`, or why there is none.
absl::StatusOr<MemoryPressure> ReadPressure(const std::string& path) {
  absl::StatusOr<std::string> text = ReadText(path, kMaxPsiBytes);
  if (!text.ok()) return text.status();
  std::optional<MemoryPressure> p = ParseMemoryPressure(*text);
  if (!p) return absl::NotFoundError(absl::StrCat(path, " holds no PSI \"some\" line"));
  return *p;
}

std::string SlotsMib(uint64_t slots) {
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
  if (absl::StatusOr<std::string> text = ReadText("/proc/self/cgroup", kMaxCgroupListBytes);
      text.ok()) {
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
      if (!absl::ConsumePrefix(&line, "0::")) continue;
      // cgroup v2 mounted at /sys/fs/cgroup, or beside v1 at /sys/fs/cgroup/unified (hybrid).
      for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
        std::string path = absl::StrCat(root, line == "/" ? "" : line, "/memory.pressure");
        if (ReadPressure(path).ok()) return path;
      }
    }
  }
  if (ReadPressure("/proc/pressure/memory").ok()) return std::string("/proc/pressure/memory");
  return absl::NotFoundError(
      "no memory pressure information (neither the cgroup's memory.pressure nor "
      "/proc/pressure/memory can be read; the kernel needs CONFIG_PSI and psi=1)");
}

absl::Status CheckPressureFile(const std::string& path) {
  absl::StatusOr<MemoryPressure> p = ReadPressure(path);
  if (p.ok()) return absl::OkStatus();
  if (absl::IsFailedPrecondition(p.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat(kPressureFileSetting, " ", p.status().message()));
  }
  // Missing, unreadable, too long or not PSI text: the file cannot be read as one.
  return absl::NotFoundError(
      absl::StrCat(kPressureFileSetting, " cannot be read as a PSI file: ", p.status().message()));
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
  } else if (absl::Status s = CheckPressureFile(options_.path); !s.ok()) {
    // A file named in the configuration that gives nothing would leave the cache deaf to
    // pressure without a word.
    return s;
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
  // Opened afresh each time, and as safely as at the start: the file may be replaced meanwhile.
  absl::StatusOr<MemoryPressure> sample = ReadPressure(options_.path);
  if (!sample.ok()) return std::nullopt;
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
                           "): row cache shrunk from ", SlotsMib(current), " to ", SlotsMib(now)));
    }
  } else if (stall < options_.shrink_above / 4 && current < target_slots_) {
    if (++calm_ >= options_.calm_intervals) {
      const uint64_t want = std::min(
          target_slots_, current + static_cast<uint64_t>(target_slots_ * options_.grow_step) + 1);
      const uint64_t now = cache_->SetCapacitySlots(want);
      if (now > current) {
        notice_(absl::StrCat("memory pressure gone: row cache grown from ", SlotsMib(current),
                             " to ", SlotsMib(now), " (configured ", SlotsMib(target_slots_), ")"));
      }
    }
  } else {
    calm_ = 0;
  }
  return stall;
}

}  // namespace engram
