// The miss benchmarks' table and store (paged_cache_store.h).
#include "bench/store/paged_cache_store.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>

#include "tables/pack.h"
#include "testkit/synthetic.h"

namespace engram::bench {

PagedCacheStore::~PagedCacheStore() {
  store.reset();
  engine.reset();
  tables.clear();
  if (!work.empty()) (void)std::system(("rm -rf '" + work + "'").c_str());
}

absl::Status PagedCacheStore::Open(const std::string& dir, const std::string& prefix, uint64_t rows,
                                   uint32_t workers, StoreConfig config) {
  std::string tmpl = dir + "/" + prefix + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::ErrnoToStatus(errno, "cannot create a directory in " + dir);
  }
  work = tmpl;
  const std::string path = work + "/l14.paged.engram";
  SynthOptions synth{.out_dir = work + "/model", .rows = rows, .seed = 3, .layers = {14}};
  if (absl::Status s = WriteSyntheticCheckpoint(synth); !s.ok()) return s;
  PackOptions pack{.input = work + "/model", .layer = 14, .out = path};
  pack.paged = true;
  if (absl::Status s = PackTable(pack); !s.ok()) return s;
  // The checkpoint was only the packer's input: the device holds the paged file alone.
  (void)std::system(("rm -rf '" + work + "/model'").c_str());
  auto opened = OpenTables(path, {});
  if (!opened.ok()) return opened.status();
  tables = std::move(*opened);
  auto made = GatherEngine::Create({.workers = workers});
  if (!made.ok()) return made.status();
  engine = std::move(*made);
  if (absl::Status s = engine->AddTable(table(), {.mode = ReadMode::kDirect}); !s.ok()) return s;
  config.default_tier = Tier::kCache;
  config.pressure = false;
  auto made_store = RowStore::Create(config, tables, engine.get(), [](const std::string&) {});
  if (!made_store.ok()) return made_store.status();
  store = std::move(*made_store);
  return absl::OkStatus();
}

}  // namespace engram::bench
