// engram-ranks' methods (ranks_gatherers.h): one step of one rank through engramd, from its
// mapped resident tables, or with the gather engine or io_uring in the rank's own process.
#include "bench/daemon/ranks_gatherers.h"

#include <algorithm>
#include <cerrno>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gather/gather_methods.h"
#include "engram/engram.h"

namespace engram::bench::ranks {
namespace {

// Through engramd; with `in_place`, each layer's rows by engram_gather with
// ENGRAM_GATHER_IN_PLACE (copied in the rank's process where the table is resident); with
// `piece_rows`, each layer's rows as requests of at most that many rows, all in flight at once.
class DaemonGatherer final : public StepGatherer {
 public:
  DaemonGatherer(bool in_place, uint32_t piece_rows)
      : in_place_(in_place), piece_rows_(piece_rows) {}
  bool Connect(const std::string& sock, uint64_t cap, const char* name, uint32_t spin_us) {
    engram_connect_options o;
    engram_connect_options_init(&o, sizeof(o));
    o.socket_path = sock.c_str();
    o.data_bytes = 2 * cap * (kRowBytes + 8) + (1 << 20);
    o.client_name = name;
    o.spin_ns = spin_us * 1000;
    if (engram_session_open(&o, &s_) != 0) return Fail("connect");
    for (int l = 0; l < 2; ++l) {
      if (engram_alloc(s_, cap * 8, reinterpret_cast<void**>(&ids_[l])) != 0 ||
          engram_alloc(s_, cap * kRowBytes, reinterpret_cast<void**>(&dest_[l])) != 0) {
        return Fail("alloc");
      }
    }
    if (in_place_) {
      // The first in-place gather of a table maps it: done here, before the clock starts.
      const size_t one[2] = {1, 1};
      ids_[0][0] = ids_[1][0] = 0;
      return Gather(one);
    }
    return true;
  }
  ~DaemonGatherer() override {
    if (s_ != nullptr) engram_session_close(s_);
  }
  uint64_t* ids(int l) override { return ids_[l]; }
  uint8_t* dest(int l) override { return dest_[l]; }
  bool Gather(const size_t n[2]) override {
    if (in_place_) return GatherEach(n);
    tickets_.clear();
    size_t waited = 0;
    for (int l = 0; l < 2; ++l) {
      const size_t piece = piece_rows_ > 0 ? piece_rows_ : std::max<size_t>(n[l], 1);
      for (size_t first = 0; first < n[l]; first += piece) {
        engram_gather_request r{.size = sizeof(r),
                                .layer = kLayers[l],
                                .flags = 0,
                                .rows = ids_[l] + first,
                                .num_rows = std::min(piece, n[l] - first),
                                .dest = dest_[l] + first * kRowBytes,
                                .dest_offsets = nullptr};
        uint64_t ticket = 0;
        int rc;
        // Every slot in flight: the oldest request finishes first.
        while ((rc = engram_submit(s_, &r, &ticket)) == -ENOSPC && waited < tickets_.size()) {
          if (engram_wait(s_, tickets_[waited++], -1) != 0) return Fail("wait");
        }
        if (rc != 0) return Fail("submit");
        tickets_.push_back(ticket);
      }
    }
    for (; waited < tickets_.size(); ++waited) {
      if (engram_wait(s_, tickets_[waited], -1) != 0) return Fail("wait");
    }
    return true;
  }

 private:
  bool GatherEach(const size_t n[2]) {
    for (int l = 0; l < 2; ++l) {
      if (n[l] == 0) continue;
      engram_gather_request r{.size = sizeof(r),
                              .layer = kLayers[l],
                              .flags = ENGRAM_GATHER_IN_PLACE,
                              .rows = ids_[l],
                              .num_rows = n[l],
                              .dest = dest_[l],
                              .dest_offsets = nullptr};
      if (engram_gather(s_, &r, -1) != 0) return Fail("gather");
    }
    return true;
  }
  bool Fail(const char* what) {
    error = absl::StrCat(what, ": ", engram_last_error());
    return false;
  }
  bool in_place_;
  uint32_t piece_rows_;
  std::vector<uint64_t> tickets_;
  engram_session* s_ = nullptr;
  uint64_t* ids_[2] = {};
  uint8_t* dest_[2] = {};
};

// In-process from the same memory the daemon serves: both tables (of the resident tier) mapped
// read-only into the rank's process, rows copied with engram_table_map_gather (a memcpy each).
class MappedGatherer final : public StepGatherer {
 public:
  MappedGatherer(const std::string& sock, uint64_t cap) {
    for (int l = 0; l < 2; ++l) {
      ids_[l].resize(cap);
      dest_[l].resize(cap * kRowBytes);
    }
    engram_connect_options o;
    engram_connect_options_init(&o, sizeof(o));
    o.socket_path = sock.c_str();
    o.client_name = "engram-ranks mapped";
    engram_session* s = nullptr;
    if (engram_session_open(&o, &s) != 0) {
      error = absl::StrCat("connect: ", engram_last_error());
      return;
    }
    for (int l = 0; l < 2 && error.empty(); ++l) {
      if (engram_table_map_open(s, kLayers[l], &maps_[l]) != 0) {
        error = absl::StrCat("map layer ", kLayers[l], ": ", engram_last_error());
      }
    }
    engram_session_close(s);  // the mappings outlive the session
  }
  ~MappedGatherer() override {
    for (engram_table_map* m : maps_) engram_table_map_close(m);
  }
  uint64_t* ids(int l) override { return ids_[l].data(); }
  uint8_t* dest(int l) override { return dest_[l].data(); }
  bool Gather(const size_t n[2]) override {
    for (int l = 0; l < 2; ++l) {
      if (n[l] == 0) continue;
      if (engram_table_map_gather(maps_[l], ids_[l].data(), n[l], dest_[l].data()) != 0) {
        error = absl::StrCat("gather: ", engram_last_error());
        return false;
      }
    }
    return true;
  }

 private:
  engram_table_map* maps_[2] = {};
  std::vector<uint64_t> ids_[2];
  std::vector<uint8_t> dest_[2];
};

// In-process: the gather engine (defaults) or a plain io_uring loop, in the rank's own process.
class LocalGatherer final : public StepGatherer {
 public:
  LocalGatherer(const std::string& method, const std::vector<const Table*>& tables, uint64_t cap)
      : tables_(tables) {
    for (int l = 0; l < 2; ++l) {
      ids_[l].resize(cap);
      dest_[l].resize(cap * kRowBytes);
    }
    if (method == "engine") {
      method_ = MakeEngineMethod("engine", {});
    } else {
      method_ = MakeUringOnlyMethod();
    }
    for (const Table* t : tables_) {
      if (absl::Status s = method_->Attach(*t); !s.ok()) error = s.ToString();
    }
  }
  uint64_t* ids(int l) override { return ids_[l].data(); }
  uint8_t* dest(int l) override { return dest_[l].data(); }
  bool Gather(const size_t n[2]) override {
    for (int l = 0; l < 2; ++l) {
      if (n[l] == 0) continue;
      absl::Status s =
          method_->Gather(*tables_[l], std::span(ids_[l].data(), n[l]), dest_[l].data());
      if (!s.ok()) {
        error = s.ToString();
        return false;
      }
    }
    return true;
  }

 private:
  std::vector<const Table*> tables_;
  std::unique_ptr<GatherMethod> method_;
  std::vector<uint64_t> ids_[2];
  std::vector<uint8_t> dest_[2];
};

}  // namespace

bool ThroughDaemon(const std::string& method) {
  return method == "daemon" || method == "inplace" || method == "pieces";
}

std::unique_ptr<StepGatherer> MakeGatherer(const Env& env, const std::string& method, uint64_t cap,
                                           const char* name) {
  if (ThroughDaemon(method)) {
    auto d = std::make_unique<DaemonGatherer>(method == "inplace",
                                              method == "pieces" ? env.cfg->piece_rows : 0);
    d->Connect(env.sock, cap, name, env.cfg->client_spin_us);
    return d;
  }
  if (method == "mapped") return std::make_unique<MappedGatherer>(env.sock, cap);
  return std::make_unique<LocalGatherer>(method, env.tables, cap);
}

}  // namespace engram::bench::ranks
