// Parsing helpers for engramd's configuration (see server_config.h).
#include "daemon/server/server_config.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace engram {

bool IsAdministrator(const ServerConfig& config, uid_t own_uid, uid_t uid, gid_t gid,
                     const std::vector<gid_t>& groups) {
  if (uid == 0 || uid == own_uid) return true;
  const auto& uids = config.admin_uids;
  if (std::find(uids.begin(), uids.end(), uid) != uids.end()) return true;
  const auto& gids = config.admin_gids;
  if (std::find(gids.begin(), gids.end(), gid) != gids.end()) return true;
  for (gid_t g : groups) {
    if (std::find(gids.begin(), gids.end(), g) != gids.end()) return true;
  }
  return false;
}

std::string DescribeAdministrators(const ServerConfig& config, uid_t own_uid) {
  std::string out = own_uid == 0 ? "root (engramd's own uid)"
                                 : absl::StrFormat("root, uid %u (engramd's own)", own_uid);
  if (!config.admin_uids.empty()) out += ", uids " + absl::StrJoin(config.admin_uids, ",");
  if (!config.admin_gids.empty()) out += ", gids " + absl::StrJoin(config.admin_gids, ",");
  return out;
}

}  // namespace engram
