// Runs engram-synth, engram-pack and engram-inspect as a user would: exit codes and messages.
// The binaries' paths come from the environment (set by tests/table/meson.build).
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "testkit/table_test_util.h"

namespace engram {
namespace {

using Catch::Matchers::Contains;
using testing::TempDir;

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

std::string Tool(const char* env) {
  const char* path = std::getenv(env);
  REQUIRE(path != nullptr);
  return path;
}

Result Run(const std::string& command) {
  Result r;
  std::FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

TEST_CASE("engram-synth, engram-pack and engram-inspect work end to end", "[cli]") {
  TempDir dir;
  const std::string synth = Tool("ENGRAM_SYNTH"), pack = Tool("ENGRAM_PACK"),
                    inspect = Tool("ENGRAM_INSPECT");
  const std::string model = dir / "model";

  Result r = Run(synth + " " + model + " --rows 2000 --seed 5");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("2000 rows per table, seed 5"));
  CHECK(std::filesystem::exists(model + "/model.safetensors.index.json"));

  r = Run(inspect + " " + model + " --verify-synthetic --sample 0");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("layer 1: checkpoint, 2000 rows"));
  CHECK_THAT(r.output, Contains("layer 14: checkpoint, 2000 rows"));
  CHECK_THAT(r.output, Contains("2000 rows match engram-synth seed 5"));

  r = Run(pack + " " + model + " --layer 14 --out " + (dir / "l14.etbl") + " --progress");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("100.0%"));  // the forced progress display
  CHECK_THAT(r.output, Contains("wrote"));

  r = Run(inspect + " " + (dir / "l14.etbl") + " --verify-synthetic --seed 5 --sample 0");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("layer 14: packed, 2000 rows, covers [0, 2000)"));
  CHECK_THAT(r.output, Contains("2000 rows match"));

  r = Run(inspect + " " + (dir / "l14.etbl") + " --seed 6");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("differ from engram-synth seed 6"));

  r = Run(pack + " " + model + " --layer 1 --rows 500:1500 --sparse -q --out " + (dir / "r.etbl"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.empty());
  r = Run(inspect + " " + (dir / "r.etbl") + " --json --seed 5");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto doc = nlohmann::json::parse(r.output);
  CHECK(doc[0]["covered"] == nlohmann::json({500, 1500}));
  CHECK(doc[0]["mismatched_rows"] == 0);

  // Paged (format version 2), whole and per rank, compacted and sparse: space and time reported,
  // every row as engram-synth made it, and a repack of a paged file.
  r = Run(pack + " " + model + " --layer 14 --paged --out " + (dir / "p.etbl"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("paged (15 rows a 4 KiB page)"));
  // 2000 rows: 134 pages (133 full, one of 5) after the header page.
  CHECK_THAT(r.output, Contains("2000 rows, 528000 bytes of rows in a 552960-byte file"));
  CHECK_THAT(r.output, Contains("time: "));
  CHECK(std::filesystem::file_size(dir / "p.etbl") == 4096 + 134 * 4096);
  r = Run(inspect + " " + (dir / "p.etbl") + " --verify-synthetic --seed 5 --sample 0");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("paged: row r in slot s"));
  CHECK_THAT(r.output, Contains("2000 rows match"));
  for (const char* form : {"", " --sparse"}) {
    const std::string out = dir / "pr.etbl";
    r = Run(pack + " " + (dir / "p.etbl") + " --layer 14 --rows 507:1493 --paged -q" + form +
            " --buffer-mib 1 --out " + out);
    INFO(form << r.output);
    REQUIRE(r.exit_code == 0);
    r = Run(inspect + " " + out + " --json --seed 5 --sample 0");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    doc = nlohmann::json::parse(r.output);
    CHECK(doc[0]["covered"] == nlohmann::json({507, 1493}));
    CHECK(doc[0]["parts"][0]["rows_per_page"] == 15);
    CHECK(doc[0]["mismatched_rows"] == 0);
  }
}

TEST_CASE("the CLIs fail loudly on bad input", "[cli]") {
  TempDir dir;
  const std::string synth = Tool("ENGRAM_SYNTH"), pack = Tool("ENGRAM_PACK"),
                    inspect = Tool("ENGRAM_INSPECT");
  const std::string model = dir / "model";
  REQUIRE(Run(synth + " -q " + model + " --rows 100").exit_code == 0);

  SECTION("engram-pack on an invalid checkpoint") {
    std::filesystem::resize_file(model + "/model-00002-of-00003.safetensors", 1000);
    Result r = Run(pack + " " + model + " --layer 1 --out " + (dir / "x.etbl"));
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Contains("cannot pack layer 1"));
    CHECK_THAT(r.output, Contains("model-00002-of-00003.safetensors"));
    CHECK_THAT(r.output, Contains("DATA_LOSS"));
    CHECK_FALSE(std::filesystem::exists(dir / "x.etbl"));
    Result i = Run(inspect + " " + model);
    CHECK(i.exit_code == 1);
    CHECK_THAT(i.output, Contains("is not servable"));
  }
  SECTION("engram-pack on a layer that is not there") {
    Result r = Run(pack + " " + model + " --layer 3 --out " + (dir / "x.etbl"));
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Contains("layer 3 is not an Engram layer"));
  }
  SECTION("engram-pack usage errors") {
    CHECK(Run(pack + " " + model + " --out " + (dir / "x.etbl")).exit_code != 0);  // no --layer
    Result r = Run(pack + " " + model + " --layer 1 --rows 9:3 --out " + (dir / "x.etbl"));
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains("empty"));
  }
  SECTION("engram-synth with a bad row count") {
    Result r = Run(synth + " " + (dir / "m2") + " --rows 0");
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains("--rows"));
  }
}

}  // namespace
}  // namespace engram
