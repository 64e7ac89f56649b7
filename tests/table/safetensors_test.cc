// Tests of safetensors header parsing: a good header, and every kind of damage refused with
// DataLoss naming the file and tensor.
#include "tables/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "testkit/table_test_util.h"

namespace engram {
namespace {

using Catch::Matchers::Contains;
using testing::Safetensors;
using testing::TempDir;
using testing::WriteFile;

absl::StatusOr<SafetensorsHeader> Parse(const std::string& path, bool complete = true) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  struct stat st;
  REQUIRE(::fstat(fd, &st) == 0);
  auto header = ReadSafetensorsHeader(path, fd, st.st_size,
                                      SafetensorsReadOptions{.require_complete_file = complete});
  ::close(fd);
  return header;
}

const char* kGood = R"({"__metadata__":{"format":"pt"},)"
                    R"("a":{"dtype":"F8_E4M3","shape":[4,256],"data_offsets":[0,1024]},)"
                    R"("b":{"dtype":"F8_E8M0","shape":[4,8],"data_offsets":[1024,1056]},)"
                    R"("c":{"dtype":"BF16","shape":[3],"data_offsets":[1056,1062]}})";

TEST_CASE("a valid safetensors header parses", "[safetensors]") {
  TempDir dir;
  // Three padding spaces make the data start at an odd offset; safetensors allows it.
  const std::string header = std::string(kGood) + "   ";
  WriteFile(dir / "ok.safetensors", Safetensors(header, 1062));
  auto h = Parse(dir / "ok.safetensors");
  REQUIRE(h.ok());
  CHECK(h->header_bytes == header.size());
  CHECK(h->data_start == 8 + header.size());
  CHECK(h->tensors.size() == 3);
  CHECK(h->metadata.at("format") == "pt");
  const SafetensorsTensor* a = h->Find("a");
  REQUIRE(a != nullptr);
  CHECK(a->dtype == "F8_E4M3");
  CHECK(a->shape == std::vector<uint64_t>{4, 256});
  CHECK(a->begin == 0);
  CHECK(a->end == 1024);
  CHECK(h->Find("b")->begin == 1024);
  CHECK(h->Find("missing") == nullptr);
  CHECK(h->RequiredFileSize() == 8 + header.size() + 1062);
}

TEST_CASE("unknown dtypes and empty tensors are accepted without a size check", "[safetensors]") {
  TempDir dir;
  WriteFile(dir / "x.safetensors",
            Safetensors(R"({"q":{"dtype":"F4_NEW","shape":[7],"data_offsets":[0,3]},)"
                        R"("e":{"dtype":"F32","shape":[0],"data_offsets":[3,3]}})",
                        3));
  auto h = Parse(dir / "x.safetensors");
  REQUIRE(h.ok());
  CHECK(h->Find("q")->bytes() == 3);
  CHECK(h->Find("e")->bytes() == 0);
}

struct BadCase {
  const char* name;
  std::string bytes;
  const char* message;
};

TEST_CASE("damaged safetensors headers are refused with DataLoss", "[safetensors]") {
  TempDir dir;
  const BadCase cases[] = {
      {"shorter than the length field", std::string("\x10\x00\x00", 3), "too short"},
      {"zero header length", Safetensors("", 16), "header length is 0"},
      {"absurd header length", testing::LengthPrefix(uint64_t{1} << 40) + "{}", "exceeds"},
      {"header length past the end", testing::LengthPrefix(5000) + std::string(kGood),
       "runs past the end"},
      {"malformed JSON", Safetensors(R"({"a":{"dtype":"F8_E4M3",)", 0), "not valid JSON"},
      {"JSON that is not an object", Safetensors("[1,2,3]", 0), "not a JSON object"},
      {"tensor without dtype", Safetensors(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", 1),
       "'a' has no string 'dtype'"},
      {"tensor without data_offsets", Safetensors(R"({"a":{"dtype":"U8","shape":[1]}})", 1),
       "'a' has no 'data_offsets'"},
      {"negative shape",
       Safetensors(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1), "shape entry"},
      {"reversed offsets",
       Safetensors(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[5,2]}})", 8), "reversed"},
      {"shape disagreeing with offsets",
       Safetensors(R"({"a":{"dtype":"F8_E4M3","shape":[4,256],"data_offsets":[0,1000]}})", 1024),
       "needs 1024 bytes but data_offsets [0, 1000) span 1000"},
      {"shape whose size overflows",
       Safetensors(R"({"a":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                   8),
       "more than 2^64"},
      {"overlapping tensors",
       Safetensors(R"({"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},)"
                   R"("b":{"dtype":"U8","shape":[10],"data_offsets":[5,15]}})",
                   15),
       "overlap"},
      {"offsets outside the file",
       Safetensors(R"({"a":{"dtype":"U8","shape":[100],"data_offsets":[0,100]}})", 60),
       "lie outside the file"},
      {"non-string metadata", Safetensors(R"({"__metadata__":{"n":1}})", 0), "not a string"},
  };
  for (const BadCase& c : cases) {
    SECTION(c.name) {
      const std::string path = dir / "bad.safetensors";
      WriteFile(path, c.bytes);
      auto h = Parse(path);
      REQUIRE_FALSE(h.ok());
      CHECK(h.status().code() == absl::StatusCode::kDataLoss);
      CHECK_THAT(std::string(h.status().message()), Contains(path));
      CHECK_THAT(std::string(h.status().message()), Contains(c.message));
    }
  }
}

TEST_CASE("a file shorter than its tensors is accepted only when asked to", "[safetensors]") {
  TempDir dir;
  WriteFile(dir / "short.safetensors",
            Safetensors(R"({"a":{"dtype":"U8","shape":[100],"data_offsets":[0,100]}})", 10));
  CHECK(Parse(dir / "short.safetensors", /*complete=*/true).status().code() ==
        absl::StatusCode::kDataLoss);
  CHECK(Parse(dir / "short.safetensors", /*complete=*/false).ok());
}

}  // namespace
}  // namespace engram
