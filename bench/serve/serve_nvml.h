// The GPU's SM clock and power as NVML reports them, sampled by a thread while engram-serve
// runs so that each iteration can be tagged with the clock state it ran in. NVML is loaded with
// dlopen (libnvidia-ml.so.1), so the benchmark builds and runs without it and says so.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace engram::bench::serve {

struct GpuReading {
  uint32_t sm_mhz = 0;  // 0: unknown
  double power_w = 0;   // 0: unknown
};

class GpuSensor {
 public:
  // Opens NVML's library and device `index`; available() false (why() says why) when it can't.
  explicit GpuSensor(unsigned index = 0, const char* library = "libnvidia-ml.so.1");
  ~GpuSensor();
  GpuSensor(const GpuSensor&) = delete;
  GpuSensor& operator=(const GpuSensor&) = delete;
  bool available() const { return device_ != nullptr; }
  const std::string& why() const { return why_; }
  GpuReading Read() const;
  uint32_t MaxSmMhz() const;  // 0: unknown

 private:
  using GetClock = int (*)(void*, int, unsigned*);
  using GetPower = int (*)(void*, unsigned*);
  void* lib_ = nullptr;
  void* device_ = nullptr;
  GetClock clock_ = nullptr, max_clock_ = nullptr;
  GetPower power_ = nullptr;
  int (*shutdown_)() = nullptr;
  std::string why_;
};

// Reads `sensor` about every millisecond on its own thread (an NVML call takes from tens of
// microseconds to a millisecond: too long for the loop that launches the iterations); Latest()
// is the last reading.
class GpuSampler {
 public:
  explicit GpuSampler(const GpuSensor& sensor);
  ~GpuSampler();
  GpuReading Latest() const {
    return {mhz_.load(std::memory_order_relaxed), power_mw_.load(std::memory_order_relaxed) / 1e3};
  }

 private:
  const GpuSensor& sensor_;
  std::atomic<uint32_t> mhz_{0};
  std::atomic<uint32_t> power_mw_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace engram::bench::serve
