// The command-line conventions of engramd, engramctl and the table tools: a usage error exits 2
// with one line naming what was wrong and the usage; numbers are checked against bounds named in
// words; engramctl's --timeout gives up on a socket that never answers; and --help and
// engramctl's listings fit the width asked for.
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "tools/engramctl/text_table.h"

namespace {

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/engram-cli-test-XXXXXX";
    return std::string(mkdtemp(tmpl));
  }();
  return dir;
}

// Runs `program args` (program: the environment variable naming it), capturing both streams.
Result Run(const char* program, const std::string& args) {
  const char* exe = getenv(program);
  REQUIRE(exe != nullptr);
  const std::string err_path = Dir() + "/stderr.txt";
  FILE* p = popen((std::string(exe) + " " + args + " 2>" + err_path).c_str(), "r");
  Result r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::stringstream ss;
  ss << std::ifstream(err_path).rdbuf();
  r.err = ss.str();
  return r;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A usage error: exit 2, stderr's first line "NAME: what", then the usage and the hint.
void CheckUsageError(const Result& r, const std::string& name, const std::string& what) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  const std::vector<std::string> lines = Lines(r.err);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == name + ": " + what);
  CHECK(lines[1].rfind("Usage: " + name + " ", 0) == 0);
  CHECK(lines[2] == "Run '" + name + " --help' for more.");
}

TEST_CASE("usage errors exit 2 naming what was wrong, with the usage") {
  CheckUsageError(Run("ENGRAMCTL", "stauts"), "engramctl",
                  "The following argument was not expected: stauts");
  CheckUsageError(Run("ENGRAMCTL", "status --frobnicate"), "engramctl status",
                  "The following argument was not expected: --frobnicate");
  CheckUsageError(Run("ENGRAMCTL", "rows 14"), "engramctl rows", "ROW is required");
  CheckUsageError(Run("ENGRAMCTL", "tables -o tall"), "engramctl tables",
                  "--output: tall not in {wide}");
  CheckUsageError(Run("ENGRAMD", "--no-such-flag"), "engramd",
                  "The following argument was not expected: --no-such-flag");
  CheckUsageError(Run("ENGRAM_SYNTH", ""), "engram-synth", "OUT_DIR is required");
  CheckUsageError(Run("ENGRAM_PACK", "/nonexistent --out x"), "engram-pack", "--layer is required");
  CheckUsageError(Run("ENGRAM_INSPECT", "--json"), "engram-inspect", "PATH is required");
}

TEST_CASE("engramctl alone prints its help to stderr and exits 2") {
  Result r = Run("ENGRAMCTL", "");
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find("Usage: engramctl [OPTIONS] SUBCOMMAND") != std::string::npos);
  CHECK(r.err.find("Subcommands:") != std::string::npos);
  CHECK(r.err.find("A subcommand is required") == std::string::npos);
}

TEST_CASE("--help and --version exit 0 on every program") {
  for (const char* program :
       {"ENGRAMCTL", "ENGRAMD", "ENGRAM_SYNTH", "ENGRAM_PACK", "ENGRAM_INSPECT"}) {
    INFO(program);
    Result help = Run(program, "--help");
    CHECK(help.code == 0);
    CHECK(help.out.find("Usage: ") != std::string::npos);
    Result version = Run(program, "--version");
    CHECK(version.code == 0);
    CHECK(version.out.find("0.") != std::string::npos);
  }
  Result sub = Run("ENGRAMCTL", "rows --help");
  CHECK(sub.code == 0);
  CHECK(sub.out.find("Usage: engramctl rows") != std::string::npos);
}

TEST_CASE("numbers are checked against their bounds, named in words") {
  CheckUsageError(Run("ENGRAMCTL", "rows 14 -1"), "engramctl rows",
                  "ROW must be an integer of at least 0, got -1");
  CheckUsageError(Run("ENGRAMCTL", "rows 14 5 18446744073709551616"), "engramctl rows",
                  "ROW must be an integer of at least 0, got 18446744073709551616");
  CheckUsageError(Run("ENGRAMCTL", "rows -14 5"), "engramctl rows",
                  "LAYER must be an integer from 0 to 4294967295, got -14");
  CheckUsageError(Run("ENGRAMCTL", "stats -i 0"), "engramctl stats",
                  "--interval must be a number of seconds from 0.1 to 3600, got 0");
  CheckUsageError(Run("ENGRAMCTL", "status -i nan"), "engramctl status",
                  "--interval must be a number of seconds from 0.1 to 3600, got nan");
  CheckUsageError(Run("ENGRAMCTL", "status --timeout -3"), "engramctl status",
                  "--timeout must be a number of seconds from 0.1 to 86400, got -3");
  CheckUsageError(Run("ENGRAMCTL", "warm 14 --rows 9:3"), "engramctl warm",
                  "--rows: row range '9:3' is empty: BEGIN must be below END");
  CheckUsageError(Run("ENGRAMCTL", "hash --model m --layer 1 --tp-size 0"), "engramctl hash",
                  "--tp-size must be an integer from 1 to 1024, got 0");
  CheckUsageError(Run("ENGRAMD", "--max-clients -4"), "engramd",
                  "--max-clients must be an integer from 1 to 65536, got -4");
  CheckUsageError(Run("ENGRAMD", "--max-clients 70000"), "engramd",
                  "--max-clients must be an integer from 1 to 65536, got 70000");
  CheckUsageError(Run("ENGRAM_PACK", "m --layer 1 --out o --buffer-mib 0"), "engram-pack",
                  "--buffer-mib must be an integer from 1 to 1024, got 0");
  CheckUsageError(Run("ENGRAM_PACK", "m --layer -1 --out o"), "engram-pack",
                  "--layer must be an integer from 0 to 4294967295, got -1");
  CheckUsageError(Run("ENGRAM_SYNTH", "out --rows -5"), "engram-synth",
                  "--rows must be a positive row count or 'full', got '-5'");
  CheckUsageError(Run("ENGRAM_INSPECT", "p --sample -1"), "engram-inspect",
                  "--sample must be an integer of at least 0, got -1");
}

// A socket that accepts connections and never answers them.
struct SilentSocket {
  std::string path = Dir() + "/silent.sock";
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  SilentSocket() {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    unlink(path.c_str());
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(listen(fd, 16) == 0);
  }
  ~SilentSocket() {
    close(fd);
    unlink(path.c_str());
  }
};

TEST_CASE("--timeout gives up on a socket that accepts and never answers") {
  SilentSocket silent;
  for (const char* command : {"status", "tables", "stats -w", "warm 14", "load 14", "rows 14 5"}) {
    INFO(command);
    const auto start = std::chrono::steady_clock::now();
    Result r = Run("ENGRAMCTL", std::string(command) + " --timeout 0.3 --socket " + silent.path);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(r.err);
    CHECK(r.code == 4);  // cannot tell whether engramd runs
    CHECK(r.err.find(silent.path) != std::string::npos);
    CHECK(seconds < 5);
    if (std::string(command) != "rows 14 5") {  // rows reports what the client library says
      CHECK(r.err.find("no reply within 0.3 s (--timeout)") != std::string::npos);
    }
  }
  // The global form, before the subcommand, and JSON.
  Result r = Run("ENGRAMCTL", "--timeout 0.2 --json status --socket " + silent.path);
  CHECK(r.code == 4);
  CHECK(r.out.find("\"exit_code\": 4") != std::string::npos);
}

TEST_CASE("text tables fit the width by cutting the column that gives way") {
  using engramctl::TextTable;
  TextTable t({{"ID", true}, {"NAME", false, true}, {"ROWS", true}});
  t.AddRow({"1", std::string(100, 'n'), "12"});
  t.AddRow({"22", "short", engramctl::Count(123456789)});
  t.AddLineUnder("  " + std::string(120, 'f'));
  for (const std::string& line : Lines(t.Render(80))) {
    INFO(line);
    CHECK(engramctl::TextWidth(line) <= 80);
  }
  const std::vector<std::string> wide = Lines(t.Render(0));
  CHECK(wide[1].find(std::string(100, 'n')) != std::string::npos);
  CHECK(wide[3].size() == 122);
  const std::string header = Lines(t.Render(80))[0];
  CHECK(header.size() == 80);  // ID, NAME cut to 70, ROWS as wide as "123.5M"
  CHECK(header.rfind("ID NAME ", 0) == 0);
  CHECK(header.substr(72) == "    ROWS");
  CHECK(engramctl::Count(9999) == "9999");
  CHECK(engramctl::Count(12345) == "12.3k");
  CHECK(engramctl::Count(123456789) == "123.5M");
  CHECK(engramctl::FitText("caf\xc3\xa9-bar", 6) == "caf~ar");
  CHECK(engramctl::TextWidth("caf\xc3\xa9") == 4);
}

TEST_CASE("load and warm progress: total, percentage, rate and ETA in IEC units, in 80 columns") {
  using engramctl::ProgressLine;
  const uint64_t gib = uint64_t{1} << 30, mib = uint64_t{1} << 20;
  // 1 GiB of 4 GiB done, 512 MiB of it in this run's 2 s: 256 MiB/s, 3 GiB left: 12 s.
  const std::string line = ProgressLine("load layer 14", gib, 4 * gib, 512 * mib, 2.0);
  INFO(line);
  CHECK(line.rfind("load layer 14 [", 0) == 0);
  CHECK(line.find(" 25.0% 1.0 GiB of 4.0 GiB, 256.0 MiB/s, ETA 0:12") != std::string::npos);
  CHECK(engramctl::TextWidth(line) == 80);  // the bar takes what the words leave
  CHECK(line.find('#') != std::string::npos);
  CHECK(line.find(" MB") == std::string::npos);
  // Nothing moved yet: no rate, no ETA; a wide name still fits.
  const std::string start = ProgressLine("evict layer 4294967295", 0, 300 * gib, 0, 0.0);
  INFO(start);
  CHECK(start.find("0.0% 0 B of 300.0 GiB, 0 B/s, ETA -") != std::string::npos);
  CHECK(engramctl::TextWidth(start) <= 80);
  CHECK(engramctl::Clock(59.6) == "1:00");
  CHECK(engramctl::Clock(7390) == "2:03:10");
  CHECK(engramctl::Bytes(1536.0 * mib) == "1.5 GiB");
}

TEST_CASE("counter lines break after a comma to fit 80 columns, no item lost") {
  std::vector<std::string> items;
  std::string all;
  for (int i = 0; i < 12; ++i) {
    items.push_back("counter " + std::to_string(i) + " 1234567890");
    all += items.back();
  }
  const std::string text = engramctl::ItemLines("  ", items);
  std::string joined;
  for (const std::string& line : Lines(text)) {
    INFO(line);
    CHECK(engramctl::TextWidth(line) <= 80);
    CHECK(line.rfind("  ", 0) == 0);
    for (const std::string& item : items) {
      if (line.find(item) != std::string::npos) joined += item;
    }
  }
  CHECK(joined == all);
  CHECK(Lines(text).size() > 1);
  CHECK(Lines(text)[1].rfind("    counter", 0) == 0);  // a further line indented two more
  CHECK(engramctl::ItemLines("  ", {"a", "b"}) == "  a, b\n");
}

TEST_CASE("help descriptions wrap at spaces within the width, keeping their words") {
  using engram::cli::WrapText;
  const std::string text =
      "Validate the configuration and open every table, then exit without serving; a long "
      "description\nwith a line break of its own and averyveryverylongwordthatdoesnotfit";
  const std::string wrapped = WrapText(text, 30);
  size_t words = 0;
  for (const std::string& line : Lines(wrapped)) {
    INFO(line);
    CHECK((line.size() <= 30 || line.find(' ') == std::string::npos));
    std::istringstream in(line);
    for (std::string w; in >> w;) ++words;
  }
  std::istringstream in(text);
  size_t expected = 0;
  for (std::string w; in >> w;) ++expected;
  CHECK(words == expected);
  CHECK(wrapped.find("description\nwith") != std::string::npos);
  CHECK(WrapText("a b", 80) == "a b");
  CHECK(WrapText("", 80).empty());
}

}  // namespace
