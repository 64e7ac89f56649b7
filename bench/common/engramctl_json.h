// A benchmark asking a running engramd for its state: `engramctl COMMAND --json` on the socket
// ($ENGRAMCTL, or the build tree's engramctl), parsed.
//
//   const nlohmann::json status = engram::bench::ControlJson(daemon.socket(), "status");
//   if (status.is_discarded()) ...  // engramctl failed or printed no JSON
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "nlohmann/json.hpp"

namespace engram::bench {

inline nlohmann::json ControlJson(const std::string& socket, const char* command) {
  const char* env = std::getenv("ENGRAMCTL");
  const std::string line = std::string(env != nullptr ? env : "build/tools/engramctl/engramctl") +
                           " " + command + " --json --socket " + socket;
  FILE* p = popen(line.c_str(), "r");
  if (p == nullptr) return nlohmann::json(nlohmann::json::value_t::discarded);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  pclose(p);
  return nlohmann::json::parse(out, nullptr, false);
}

}  // namespace engram::bench
