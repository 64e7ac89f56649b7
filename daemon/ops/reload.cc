// What a SIGHUP changes (reload.h).
#include "daemon/ops/reload.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace engram {

ReloadReport CompareSettings(const DaemonSettings& running, const DaemonSettings& fresh) {
  ReloadReport report;
  for (const Setting& setting : Settings()) {
    if (setting.Same(running, fresh)) continue;
    std::string entry =
        absl::StrCat(setting.key, " ", setting.Text(running), " -> ", setting.Text(fresh));
    (setting.live() ? report.changed : report.restart).push_back(std::move(entry));
  }
  return report;
}

DaemonSettings TakeLiveSettings(const DaemonSettings& running, const DaemonSettings& fresh) {
  DaemonSettings next = running;
  for (const Setting& setting : Settings()) {
    if (setting.live()) setting.Copy(fresh, &next);
  }
  return next;
}

std::string ChangedLine(const ReloadReport& report) {
  if (report.changed.empty()) return "nothing that can change live changed";
  return "changed: " + absl::StrJoin(report.changed, "; ");
}

std::string RestartLine(const ReloadReport& report) {
  return "needs a restart: " + absl::StrJoin(report.restart, "; ");
}

}  // namespace engram
