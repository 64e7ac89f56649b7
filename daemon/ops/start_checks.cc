// The warnings a start and --check-config share (start_checks.h).
#include "daemon/ops/start_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/ops/metrics.h"
#include "store/pressure_monitor.h"

namespace engram {
namespace {

bool AnyCacheTier(const StoreConfig& store, const std::vector<std::unique_ptr<Table>>& tables) {
  return std::any_of(tables.begin(), tables.end(),
                     [&](const auto& t) { return store.TierOf(t->layer_id()) == Tier::kCache; });
}

// Why files cannot be made in `dir` by this process ("" when they can).
std::string CannotWriteIn(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "not a directory";
  if (faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0) return strerror(errno);
  return "";
}

std::optional<std::string> TextfileWarning(const MetricsOptions& metrics) {
  if (metrics.textfile_dir.empty()) return std::nullopt;
  const std::string why = CannotWriteIn(metrics.textfile_dir);
  if (why.empty()) return std::nullopt;
  return absl::StrFormat(
      "metrics.textfile_dir %s: %s; the metrics textfile is not written until it can be",
      metrics.textfile_dir, why);
}

std::optional<std::string> HotSetWarning(const std::string& path) {
  if (path.empty()) return std::nullopt;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const std::string why = CannotWriteIn(dir);
  if (why.empty()) return std::nullopt;
  return absl::StrFormat(
      "memory.hot_set_path %s: its directory %s: %s; the hot set is not written (engramd does "
      "not make the directory), and a later start finds none to warm the row cache from",
      path, dir, why);
}

// A memory.pressure_file named in the settings that cannot be read as PSI (the wrong kind of file
// is refused before: CheckPathSettings). An empty one is found at start; a machine without PSI
// is no misconfiguration, and the store says so in a notice.
std::optional<std::string> PressureWarning(const StoreConfig& store) {
  if (!store.pressure || store.pressure_file.empty()) return std::nullopt;
  absl::Status s = CheckPressureFile(store.pressure_file);
  if (s.ok()) return std::nullopt;
  return absl::StrCat("row cache keeps its size under memory pressure: ", s.message());
}

}  // namespace

std::string WithoutMetricsPort(const absl::Status& why) {
  return absl::StrCat(why.message(), "; serving without the metrics port");
}

std::optional<std::string> CheckMetricsPort(const MetricsOptions& metrics) {
  if (metrics.http_port == 0) return std::nullopt;
  auto l = metrics::HttpListener::Start(
      metrics.http_address, static_cast<uint16_t>(metrics.http_port), [] { return std::string(); },
      [] { return metrics::Health{}; });
  if (l.ok()) return std::nullopt;
  return WithoutMetricsPort(l.status());
}

std::vector<std::string> StartWarnings(const DaemonSettings& settings,
                                       const std::vector<std::unique_ptr<Table>>& tables) {
  std::vector<std::string> warnings;
  if (std::optional<std::string> w = TextfileWarning(settings.metrics)) warnings.push_back(*w);
  const StoreConfig& store = settings.store;
  if (!AnyCacheTier(store, tables)) {
    if (store.cache_bytes != 0) {
      warnings.push_back(absl::StrFormat(
          "memory.cache is set (%u bytes) but no table is of the cache tier ([tables] tier or "
          "tiers, --tier LAYER=cache): no row cache is made and the setting has no effect",
          store.cache_bytes));
    }
    return warnings;
  }
  if (std::optional<std::string> w = HotSetWarning(settings.server.hot_set_path)) {
    warnings.push_back(*w);
  }
  if (std::optional<std::string> w = PressureWarning(store)) warnings.push_back(*w);
  return warnings;
}

bool PressureFileWarned(const DaemonSettings& settings,
                        const std::vector<std::unique_ptr<Table>>& tables) {
  return AnyCacheTier(settings.store, tables) && PressureWarning(settings.store).has_value();
}

}  // namespace engram
