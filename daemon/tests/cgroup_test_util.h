// A memory cgroup a test makes and runs engramd in, with the limits of the systemd drop-in that
// `engramd --memory-dropin` prints: cgroup v2 with the memory controller where the machine has
// it (MemoryHigh= and MemoryMax= as memory.high and memory.max), else the legacy v1 controller
// (MemoryMax= as memory.limit_in_bytes; v1 has no memory.high, as systemd's v1 backend has none).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "testkit/daemon_test_util.h"

namespace engram::testing {

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline bool WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

[[noreturn]] inline void Skip(const std::string& why) {
  std::fprintf(stderr, "SKIP: %s\n", why.c_str());
  std::exit(77);
}

// The value of `key`= in a systemd unit text (a number of bytes), or nullopt ("infinity", absent).
inline std::optional<uint64_t> UnitBytes(const std::string& unit, const std::string& key) {
  std::istringstream in(unit);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + "=", 0) != 0) continue;
    char* end = nullptr;
    const std::string value = line.substr(key.size() + 1);
    const uint64_t v = std::strtoull(value.c_str(), &end, 10);
    if (end != value.c_str() && *end == '\0') return v;
  }
  return std::nullopt;
}

// MemoryHigh= and MemoryMax= of the drop-in `engramd --memory-dropin FLAGS` prints. The test
// case fails (showing engramd's output) unless it prints both as numbers.
inline std::pair<uint64_t, uint64_t> DropInLimits(const std::vector<std::string>& flags) {
  std::string line = "'" + EngramdPath() + "' --memory-dropin";
  for (const std::string& flag : flags) line += " '" + flag + "'";
  const auto [code, unit] = RunCommand(line + " 2>&1");
  INFO(line << ": " << unit);
  REQUIRE(code == 0);
  const std::optional<uint64_t> high = UnitBytes(unit, "MemoryHigh");
  const std::optional<uint64_t> max = UnitBytes(unit, "MemoryMax");
  REQUIRE(high.has_value());
  REQUIRE(max.has_value());
  return {*high, *max};
}

// A memory cgroup of this process's making, with memory.max `max` (and memory.high `high` on
// v2); removed (once empty) on destruction. version 0: none could be made.
struct TestCgroup {
  int version = 0;
  std::string dir;
  std::string peak_file, oom_file;

  TestCgroup(const std::string& name, uint64_t high, uint64_t max) {
    if (access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0 &&
        ReadText("/sys/fs/cgroup/cgroup.controllers").find("memory") != std::string::npos) {
      // Pure v2: the root must hand the memory controller to its children.
      WriteText("/sys/fs/cgroup/cgroup.subtree_control", "+memory");
      dir = "/sys/fs/cgroup/" + name;
      if (mkdir(dir.c_str(), 0755) == 0 && access((dir + "/memory.max").c_str(), F_OK) == 0) {
        version = 2;
        WriteText(dir + "/memory.high", std::to_string(high));
        WriteText(dir + "/memory.max", std::to_string(max));
        WriteText(dir + "/memory.swap.max", "0");
        peak_file = dir + "/memory.peak";
        oom_file = dir + "/memory.events";
        return;
      }
      rmdir(dir.c_str());
    }
    dir = "/sys/fs/cgroup/memory/" + name;
    if (mkdir(dir.c_str(), 0755) == 0) {
      if (WriteText(dir + "/memory.limit_in_bytes", std::to_string(max))) {
        version = 1;
        peak_file = dir + "/memory.max_usage_in_bytes";
        oom_file = dir + "/memory.oom_control";
        return;
      }
      rmdir(dir.c_str());
    }
    dir.clear();
  }
  ~TestCgroup() {
    for (int i = 0; !dir.empty() && i < 500 && rmdir(dir.c_str()) != 0; ++i) usleep(10000);
  }
  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;

  uint64_t Number(const std::string& file) const {
    return std::strtoull(ReadText(file).c_str(), nullptr, 10);
  }
  uint64_t Keyed(const std::string& file, const std::string& key) const {
    std::istringstream in(ReadText(file));
    std::string k;
    uint64_t v;
    while (in >> k >> v) {
      if (k == key) return v;
    }
    return 0;
  }
  uint64_t Current() const {
    return Number(dir + (version == 2 ? "/memory.current" : "/memory.usage_in_bytes"));
  }
  uint64_t Peak() const { return Number(peak_file); }
  uint64_t OomKills() const { return Keyed(oom_file, "oom_kill"); }

  // A script that moves itself into this cgroup and then execs engramd with its arguments; the
  // daemon is in the cgroup before it allocates anything.
  std::string Wrapper(const std::string& path) const {
    const bool ok = WriteText(path, "#!/bin/sh\necho $$ > '" + dir + "/cgroup.procs' || exit 1\n" +
                                        "exec '" + EngramdPath() + "' \"$@\"\n") &&
                    chmod(path.c_str(), 0755) == 0;
    if (!ok) Skip("cannot write the wrapper script " + path);
    return path;
  }
};

// Skips (77) where a test cannot make a memory cgroup and run engramd in it meaningfully.
inline void SkipWithoutCgroups() {
  if (geteuid() != 0) Skip("creating a memory cgroup needs root");
  if (std::getenv("MESON_EXE_WRAPPER") != nullptr) {
    Skip("under an emulator (qemu-user) the emulator's own memory is charged to the cgroup");
  }
}

}  // namespace engram::testing
