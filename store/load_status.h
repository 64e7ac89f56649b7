// Where a resident table's load stands: what `engramctl load` and `engramctl tables` show.
#pragma once

#include <cstdint>
#include <string>

namespace engram {

enum class LoadState : uint8_t {
  kWaiting,    // not asked to load yet ([memory] load_at_start = false)
  kQueued,     // behind another table's load
  kLoading,    // streaming in
  kLoaded,     // every row in memory, the memfd sealed
  kCancelled,  // stopped by CancelLoad; Load() resumes
  kFailed,     // a read error; `error` names the file, Load() retries
};

inline const char* LoadStateName(LoadState s) {
  switch (s) {
    case LoadState::kWaiting:
      return "waiting";
    case LoadState::kQueued:
      return "queued";
    case LoadState::kLoading:
      return "loading";
    case LoadState::kLoaded:
      return "loaded";
    case LoadState::kCancelled:
      return "cancelled";
    case LoadState::kFailed:
      return "failed";
  }
  return "?";
}

struct ResidentLoadStatus {
  uint32_t layer = 0;
  LoadState state = LoadState::kWaiting;
  uint64_t rows_loaded = 0;  // rows in memory and served from it
  uint64_t rows = 0;         // rows the table covers
  uint64_t bytes = 0;        // memory held for it
  std::string error;         // kFailed: what failed
};

}  // namespace engram
