// engram-ranks' methods: how one rank gathers one step (both layers), through engramd (daemon,
// inplace, pieces), from engramd's mapped resident tables (mapped), or in its own process (the
// gather engine, a plain io_uring loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "bench/daemon/ranks.h"

namespace engram::bench::ranks {

// Gathers one step (both layers) for one rank, by one method.
class StepGatherer {
 public:
  virtual ~StepGatherer() = default;
  // ids[l] / dest[l]: buffers the caller fills / reads (in the arena for the daemon).
  virtual uint64_t* ids(int l) = 0;
  virtual uint8_t* dest(int l) = 0;
  virtual bool Gather(const size_t n[2]) = 0;
  std::string error;
};

// The methods whose clients talk to engramd.
bool ThroughDaemon(const std::string& method);

// A gatherer of `method` for steps of up to `cap` rows a layer; its session (if any) is named
// `name`. Never null: a gatherer that could not be set up says why in `error`.
std::unique_ptr<StepGatherer> MakeGatherer(const Env& env, const std::string& method, uint64_t cap,
                                           const char* name);

}  // namespace engram::bench::ranks
