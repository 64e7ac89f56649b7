// The GPU's clock and power through NVML, loaded at run time (serve_nvml.h).
#include "bench/serve/serve_nvml.h"

#include <dlfcn.h>

#include <chrono>

namespace engram::bench::serve {
namespace {

constexpr int kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;  // nvmlClockType_t NVML_CLOCK_SM

}  // namespace

GpuSensor::GpuSensor(unsigned index, const char* library) {
  lib_ = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) {
    why_ = std::string("NVML not loaded: ") + dlerror();
    return;
  }
  auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
  auto handle =
      reinterpret_cast<int (*)(unsigned, void**)>(dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2"));
  clock_ = reinterpret_cast<GetClock>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
  max_clock_ = reinterpret_cast<GetClock>(dlsym(lib_, "nvmlDeviceGetMaxClockInfo"));
  power_ = reinterpret_cast<GetPower>(dlsym(lib_, "nvmlDeviceGetPowerUsage"));
  shutdown_ = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlShutdown"));
  if (init == nullptr || handle == nullptr || clock_ == nullptr || max_clock_ == nullptr ||
      power_ == nullptr || shutdown_ == nullptr) {
    why_ = std::string(library) + " lacks an NVML function this needs";
    return;
  }
  if (const int rc = init(); rc != kNvmlSuccess) {
    why_ = "nvmlInit_v2 = " + std::to_string(rc);
    shutdown_ = nullptr;
    return;
  }
  void* dev = nullptr;
  if (const int rc = handle(index, &dev); rc != kNvmlSuccess) {
    why_ = "nvmlDeviceGetHandleByIndex_v2(" + std::to_string(index) + ") = " + std::to_string(rc);
    return;
  }
  device_ = dev;
}

GpuSensor::~GpuSensor() {
  if (shutdown_ != nullptr) shutdown_();
  if (lib_ != nullptr) dlclose(lib_);
}

GpuReading GpuSensor::Read() const {
  GpuReading r;
  if (device_ == nullptr) return r;
  unsigned mhz = 0, mw = 0;
  if (clock_(device_, kNvmlClockSm, &mhz) == kNvmlSuccess) r.sm_mhz = mhz;
  if (power_(device_, &mw) == kNvmlSuccess) r.power_w = mw / 1e3;
  return r;
}

uint32_t GpuSensor::MaxSmMhz() const {
  unsigned mhz = 0;
  if (device_ == nullptr || max_clock_(device_, kNvmlClockSm, &mhz) != kNvmlSuccess) return 0;
  return mhz;
}

GpuSampler::GpuSampler(const GpuSensor& sensor) : sensor_(sensor) {
  if (!sensor_.available()) return;
  thread_ = std::thread([this] {
    while (!stop_.load(std::memory_order_relaxed)) {
      const GpuReading r = sensor_.Read();
      mhz_.store(r.sm_mhz, std::memory_order_relaxed);
      power_mw_.store(static_cast<uint32_t>(r.power_w * 1e3), std::memory_order_relaxed);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
}

GpuSampler::~GpuSampler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace engram::bench::serve
