// engramctl status, tables, stats, clients, config and metrics: what a running engramd reports
// about itself, human-readable or as JSON; status and stats can be watched with rates.
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/command_line.h"
#include "tools/engramctl/commands.h"
#include "tools/engramctl/control_client.h"
#include "tools/engramctl/counter_lines.h"
#include "tools/engramctl/text_table.h"

namespace engramctl {
namespace {

using nlohmann::json;

std::atomic<bool> g_watch_interrupted{false};

// -i: how often --watch repeats, and its bounds.
constexpr double kMinIntervalSeconds = 0.1;
constexpr double kMaxIntervalSeconds = 3600;

struct WatchOptions {
  bool watch = false;
  double interval_s = 0;
};

void AddWatchOptions(CLI::App* command, WatchOptions* options) {
  command->add_flag("-w,--watch", options->watch, "Repeat every 2 s (or -i) with rates");
  command
      ->add_option("-i,--interval", options->interval_s,
                   absl::StrFormat("Repeat every SECONDS, %g to %g (implies --watch)",
                                   kMinIntervalSeconds, kMaxIntervalSeconds))
      ->type_name("SECONDS")
      ->check(engram::cli::Seconds(kMinIntervalSeconds, kMaxIntervalSeconds));
}

// -o wide: listings with every column at full width; by default they fit 80 columns.
struct ListOptions {
  std::string output;
  size_t width() const { return output == "wide" ? 0 : kTerminalColumns; }
};

void AddListOptions(CLI::App* command, ListOptions* options) {
  command
      ->add_option("-o,--output", options->output,
                   "wide: every column in full (default: fit 80 columns)")
      ->type_name("FORMAT")
      ->check(CLI::IsMember({"wide"}));
}

// The terminal's size when stdout is one, else 80 columns by 24 rows.
void TerminalSize(size_t* ret_columns, size_t* ret_rows) {
  winsize ws{};
  const bool tty = isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0;
  *ret_columns = tty && ws.ws_col >= 40 ? ws.ws_col : kTerminalColumns;
  *ret_rows = tty && ws.ws_row >= 10 ? ws.ws_row : kTerminalRows;
}

std::string Uptime(double s) {
  const uint64_t t = static_cast<uint64_t>(s);
  if (t < 60) return absl::StrFormat("%us", t);
  if (t < 3600) return absl::StrFormat("%um %us", t / 60, t % 60);
  if (t < 86400) return absl::StrFormat("%uh %um", t / 3600, t / 60 % 60);
  return absl::StrFormat("%ud %uh", t / 86400, t / 3600 % 24);
}

// Text the daemon took from outside (client names, paths) as a terminal line: the JSON carries
// it unescaped, so it is escaped here, where it is printed. Control characters and backslashes
// become \xNN and \\; U+FFFD stands where the daemon found bytes that are not UTF-8.
std::string Printable(const std::string& text) {
  std::string out;
  for (char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (b == '\\') {
      out += "\\\\";
    } else if (b < 0x20 || b == 0x7F) {
      out += absl::StrFormat("\\x%02x", b);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

uint64_t U(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<uint64_t>() : 0;
}

double Rate(const json& now, const json* before, const char* key, double seconds) {
  if (before == nullptr || seconds <= 0) return -1;
  return double(U(now, key) - std::min(U(now, key), U(*before, key))) / seconds;
}

std::string RateText(double r, const char* unit) {
  return r < 0 ? "" : absl::StrFormat("  (%.0f %s/s)", r, unit);
}

// Finds the entry of `list` whose `key` equals that of `entry`.
const json* Match(const json* list, const json& entry, const char* key) {
  if (list == nullptr || !list->is_array()) return nullptr;
  for (const json& e : *list) {
    if (e.contains(key) && e[key] == entry[key]) return &e;
  }
  return nullptr;
}

// "memory 1.2 GiB of 24.0 GiB (high 21.6 GiB), pressure some 0.00%": the cgroup's charge against
// its limits (page cache included), and what throttling it saw.
void PrintMemory(const json& m) {
  auto limit = [](const json& v) { return v.is_number() ? Bytes(v.get<double>()) : "unlimited"; };
  std::string line = "  memory ";
  if (U(m, "cgroup_version") == 0) {
    line += "(no memory cgroup found)";
  } else {
    line += absl::StrFormat("%s of %s", Bytes(double(U(m, "current_bytes"))),
                            limit(m.value("max_bytes", json())));
    if (m.contains("high_bytes") && m["high_bytes"].is_number()) {
      line += absl::StrFormat(" (high %s)", Bytes(m["high_bytes"].get<double>()));
    }
  }
  line += U(m, "budget_bytes") == 0
              ? ", budget unbounded"
              : absl::StrFormat(", budget %s", Bytes(double(U(m, "budget_bytes"))));
  // A daemon outside any memory cgroup (the root cgroup, a VM's init) reports only the system's
  // pressure: a const json's operator[] on a missing key asserts, so every key is looked up first.
  const bool own = m.contains("pressure") && m["pressure"].is_object();
  const json& p = own                             ? m["pressure"]
                  : m.contains("system_pressure") ? m["system_pressure"]
                                                  : json();
  if (p.is_object() && p.contains("some") && p["some"].is_object()) {
    line += absl::StrFormat(", %spressure some %.2f%%", own ? "" : "system ",
                            p["some"].value("avg10", 0.0));
  }
  PrintLine(line);
  if (m.contains("split") && m["split"].is_object()) {
    const json& s = m["split"];
    PrintLine(absl::StrFormat(
        "  budget split: process %s, buffers %s, arenas %s, page cache %s, row store %s",
        Bytes(double(U(s, "process_bytes"))).c_str(), Bytes(double(U(s, "buffers_bytes"))).c_str(),
        Bytes(double(U(s, "arenas_bytes"))).c_str(),
        Bytes(double(U(s, "page_cache_bytes"))).c_str(),
        Bytes(double(U(s, "store_bytes"))).c_str()));
  }
  if (U(m, "high_events") + U(m, "max_events") + U(m, "oom_kills") != 0) {
    PrintLine(absl::StrFormat(
        "  memory throttled %lu times at high, limit hit %lu times, %lu OOM kills (%s)",
        U(m, "high_events"), U(m, "max_events"), U(m, "oom_kills"),
        m.value("cgroup", "?").c_str()));
  }
}

void PrintStatus(const json& r, const json* before, double dt) {
  PrintLine(absl::StrFormat("engramd %s on %s", r.value("state", "?").c_str(),
                            Printable(r.value("socket", "?")).c_str()));
  printf("  version %s (protocol %s), pid %lu, up %s\n", r.value("version", "?").c_str(),
         r.value("protocol", "?").c_str(), U(r, "pid"),
         Uptime(r.value("uptime_seconds", 0.0)).c_str());
  printf("  tables %lu, clients %lu of %lu, requests in flight %lu, arenas %s\n", U(r, "tables"),
         U(r, "clients"), U(r, "max_clients"), U(r, "requests_in_flight"),
         Bytes(double(U(r, "arena_bytes"))).c_str());
  printf("  rows served %lu in %lu batches%s\n", U(r, "rows_served"), U(r, "batches"),
         RateText(Rate(r, before, "rows_served", dt), "rows").c_str());
  PrintStoreStatus(r);
  if (r.contains("poll") && r["poll"].is_object()) {
    const json& p = r["poll"];
    const std::string mode =
        U(p, "cores") == 0
            ? std::string("polling mode off")
            : absl::StrFormat("polling mode %lu cores, %s", U(p, "cores"),
                              p.value("holding", false) ? "spinning (clients active)" : "idle");
    PrintLine(absl::StrFormat("  %s; spun %.1f s (poller) + %.1f s (request threads)", mode.c_str(),
                              p.value("poller_spin_seconds", 0.0),
                              p.value("request_threads_spin_seconds", 0.0)));
  }
  if (r.contains("memory") && r["memory"].is_object()) PrintMemory(r["memory"]);
  printf("  log level %s, watchdog %s\n", r.value("log_level", "?").c_str(),
         U(r, "watchdog_usec") == 0
             ? "off"
             : absl::StrFormat("%.0f s", U(r, "watchdog_usec") / 1e6).c_str());
  if (r.contains("access") && r["access"].is_object()) {
    const json& a = r["access"];
    std::string commands;
    for (const json& c : a.value("admin_commands", json::array())) {
      commands += (commands.empty() ? "" : ", ") + c.get<std::string>();
    }
    if (a.contains("may_connect")) {
      PrintLine(absl::StrFormat("  may connect: %s", a.value("may_connect", "?").c_str()));
    }
    PrintLine(absl::StrFormat("  administrators (%s): %s", commands.c_str(),
                              a.value("administrators", "?").c_str()));
    printf("  you (uid %lu): %s\n", U(a, "peer_uid"),
           a.value("peer_is_administrator", false) ? "administrator" : "read and gather only");
  }
}

// stats: one table's counters, each line within 80 columns, with rates against `b` (the table
// in the reply before; nullptr for none).
void PrintTableStats(const json& t, const json* b, double dt) {
  const uint64_t req = U(t, "rows_requested"), uniq = U(t, "rows_unique");
  const uint64_t hits = U(t, "nowait_hits"), miss = U(t, "nowait_eagain");
  printf("layer %lu (%s reads, residue via %s)\n", U(t, "layer"), t.value("read_mode", "?").c_str(),
         t.value("residue_path", "?").c_str());
  fputs(
      ItemLines("  ", {absl::StrFormat("batches %lu%s", U(t, "batches"),
                                       RateText(Rate(t, b, "batches", dt), "batches")),
                       absl::StrFormat("rows %lu requested", req),
                       absl::StrFormat(
                           "%lu unique (de-dup saved %.1f%%)%s", uniq,
                           req == 0 ? 0.0 : 100.0 * double(req - std::min(req, uniq)) / double(req),
                           RateText(Rate(t, b, "rows_requested", dt), "rows"))})
          .c_str(),
      stdout);
  // A cache-tier table's misses are read with O_DIRECT: no NOWAIT pass, its tier line says
  // what the row cache held.
  if (t.value("tier", "") != "cache") {
    fputs(ItemLines(
              "  ",
              {absl::StrFormat("NOWAIT %lu hits", hits),
               absl::StrFormat("%lu misses (EAGAIN residue)", miss),
               absl::StrFormat("hit rate %.1f%%",
                               hits + miss == 0 ? 0.0 : 100.0 * double(hits) / double(hits + miss)),
               absl::StrFormat("pass %s", t.value("nowait_enabled", false) ? "on" : "off")})
              .c_str(),
          stdout);
  }
  const double read_rate = Rate(t, b, "bytes_read", dt);
  fputs(ItemLines(
            "  ",
            {absl::StrFormat("reads %lu (io_uring %lu", U(t, "read_calls"), U(t, "uring_reads")),
             absl::StrFormat("pool %lu", U(t, "pool_reads")),
             absl::StrFormat("direct %lu of which %lu registered)", U(t, "direct_reads"),
                             U(t, "fixed_reads")),
             absl::StrFormat("%s read%s", Bytes(double(U(t, "bytes_read"))),
                             read_rate < 0 ? "" : absl::StrFormat(" (%s/s)", Bytes(read_rate))),
             absl::StrFormat("%lu syscalls", U(t, "syscalls"))})
            .c_str(),
        stdout);
  if (U(t, "ring_failures") != 0) {
    printf("  io_uring rings failed %lu times, %lu replaced\n", U(t, "ring_failures"),
           U(t, "ring_resets"));
  }
  PrintStoreTableStats(t);
  printf("  errors %lu, batch latency p50 %s p99 %s p99.9 %s\n", U(t, "errors"),
         Duration(U(t, "latency_p50_ns")).c_str(), Duration(U(t, "latency_p99_ns")).c_str(),
         Duration(U(t, "latency_p999_ns")).c_str());
}

void PrintStats(const json& r, const json* before, double dt) {
  const json* before_tables = before != nullptr ? &(*before)["tables"] : nullptr;
  const json* before_clients = before != nullptr ? &(*before)["clients"] : nullptr;
  printf("TABLES\n");
  for (const json& t : r["tables"]) PrintTableStats(t, Match(before_tables, t, "layer"), dt);
  printf("CLIENTS\n");
  if (r["clients"].empty()) printf("  (none connected)\n");
  for (const json& c : r["clients"]) {
    const json* b = Match(before_clients, c, "session");
    // A long client name is cut in the middle, as in the listings, to keep the line in 80.
    printf("session %lu '%s' (pid %lu, uid %lu)\n", U(c, "session"),
           FitText(Printable(c.value("name", "")), 40).c_str(), U(c, "pid"), U(c, "uid"));
    fputs(CounterLines(SessionCounters(), c, b, dt, "  ").c_str(), stdout);
  }
}

// A rate as a short count, "-" before there are two replies.
std::string RateCell(double rate) { return rate < 0 ? "-" : Count(rate); }

// How many of `n` entries fit in `lines`: all, or lines - 1 and a line saying how many more.
size_t Shown(size_t n, size_t lines) { return n <= lines ? n : (lines == 0 ? 0 : lines - 1); }

// A share as a percentage, "-" when nothing was tried.
std::string Share(uint64_t part, uint64_t all) {
  return all == 0 ? "-" : absl::StrFormat("%.1f%%", 100.0 * double(part) / double(all));
}

// A table's hits and misses as its tier defines them: for a cache-tier table, rows the row
// cache held and rows it missed (read from the device with O_DIRECT, where no NOWAIT pass
// runs); for a storage or resident table (whose gathers reach the engine only for rows not in
// memory), rows the RWF_NOWAIT pass found in the page cache and rows it left to blocking reads.
struct TierHits {
  uint64_t hits = 0;
  uint64_t misses = 0;
};
TierHits HitsOf(const json& t) {
  if (t.value("tier", "") == "cache") {
    const uint64_t rows = U(t, "store_rows"), hit = U(t, "store_hit_rows");
    return {hit, rows - std::min(rows, hit)};
  }
  return {U(t, "nowait_hits"), U(t, "nowait_eagain")};
}

// stats --watch: one line per table, the first `shown` of the reply, with rates against the
// reply before (`before_tables`: its "tables"; nullptr for the first). HIT and MISS/S are the
// tier's own (HitsOf).
TextTable TableRates(const json& r, const json* before_tables, double dt, size_t shown) {
  TextTable tables({{"LAYER", true},
                    {"TIER", false},
                    {"ROWS/S", true},
                    {"DE-DUP", true},
                    {"HIT", true},
                    {"MISS/S", true},
                    {"READ/S", true},
                    {"P50", true},
                    {"P99", true},
                    {"ERRORS", true}});
  for (size_t i = 0; i < shown; ++i) {
    const json& t = r["tables"][i];
    const json* b = Match(before_tables, t, "layer");
    const uint64_t req = U(t, "rows_requested"), uniq = U(t, "rows_unique");
    const TierHits now = HitsOf(t);
    const double read = Rate(t, b, "bytes_read", dt);
    const double misses = b == nullptr || dt <= 0
                              ? -1
                              : double(now.misses - std::min(now.misses, HitsOf(*b).misses)) / dt;
    tables.AddRow({std::to_string(U(t, "layer")), t.value("tier", "storage"),
                   RateCell(Rate(t, b, "rows_requested", dt)),
                   Share(req - std::min(req, uniq), req), Share(now.hits, now.hits + now.misses),
                   RateCell(misses), read < 0 ? "-" : Bytes(read), Duration(U(t, "latency_p50_ns")),
                   Duration(U(t, "latency_p99_ns")), Count(double(U(t, "errors")))});
  }
  return tables;
}

// stats --watch: one line per session of `clients` (busiest first), the first `shown`.
TextTable SessionRates(const std::vector<json>& clients, size_t shown,
                       const std::function<double(const json&)>& rate) {
  TextTable sessions({{"SESSION", true},
                      {"PID", true},
                      {"NAME", false, true},
                      {"ROWS/S", true},
                      {"ROWS", true},
                      {"REQUESTS", true},
                      {"INFLIGHT", true},
                      {"P50", true},
                      {"P99", true}});
  for (size_t i = 0; i < shown; ++i) {
    const json& c = clients[i];
    sessions.AddRow({std::to_string(U(c, "session")), std::to_string(U(c, "pid")),
                     Printable(c.value("name", "")), RateCell(rate(c)), Count(double(U(c, "rows"))),
                     Count(double(U(c, "requests_ok"))), std::to_string(U(c, "inflight")),
                     Duration(U(c, "latency_p50_ns")), Duration(U(c, "latency_p99_ns"))});
  }
  return sessions;
}

// engramctl stats --watch, as top shows processes: a title, one line per table and one per
// session, busiest first, all within a terminal of `columns` by `rows` (24 by 80 unless stdout
// is a larger or smaller terminal). Entries that do not fit are counted on a last line.
void PrintStatsTop(const json& r, const json* before, double dt, double interval, size_t columns,
                   size_t rows) {
  const json* before_tables = before != nullptr ? &(*before)["tables"] : nullptr;
  const json* before_clients = before != nullptr ? &(*before)["clients"] : nullptr;
  std::vector<json> clients(r["clients"].begin(), r["clients"].end());
  auto rate = [&](const json& c) {
    return Rate(c, Match(before_clients, c, "session"), "rows", dt);
  };
  // Busiest first: by rows per second, then by rows served.
  std::stable_sort(clients.begin(), clients.end(), [&](const json& a, const json& b) {
    const double ra = rate(a), rb = rate(b);
    return ra != rb ? ra > rb : U(a, "rows") > U(b, "rows");
  });
  // The title, two headers and the blank line between the lists take 4 rows.
  const size_t lines = rows > 6 ? rows - 4 : 2;
  const size_t ntables = r["tables"].size();
  const size_t client_lines = std::min(std::max<size_t>(clients.size(), 1), lines / 2);
  const size_t table_lines = std::min(ntables, lines - client_lines);
  const size_t tables_shown = Shown(ntables, table_lines);
  const size_t clients_shown = Shown(clients.size(), lines - table_lines);
  printf("%s\n", FitText(absl::StrFormat("engramd stats: %zu tables, %zu sessions; every %.1f s, "
                                         "Ctrl-C to stop",
                                         ntables, clients.size(), interval),
                         columns)
                     .c_str());
  fputs(TableRates(r, before_tables, dt, tables_shown).Render(columns).c_str(), stdout);
  if (tables_shown < ntables)
    printf("... %zu more tables (engramctl stats)\n", ntables - tables_shown);
  printf("\n");
  fputs(SessionRates(clients, clients_shown, rate).Render(columns).c_str(), stdout);
  if (clients.empty()) printf("  (none connected)\n");
  if (clients_shown < clients.size()) {
    printf("... %zu more sessions (engramctl clients)\n", clients.size() - clients_shown);
  }
}

// Prints a reply, with the one before it (nullptr for the first) and the seconds between them.
using Printer = std::function<void(const json&, const json*, double)>;

// Runs `command` once, or repeatedly with --watch, printing each reply; a printer that titles
// its own frames (`titled`) gets no "(every ...)" line under them.
int Run(const CommonOptions& common, const WatchOptions& watch, const std::string& command,
        const json& args, const Printer& print, bool titled = false) {
  ControlError error;
  std::unique_ptr<ControlClient> client =
      ControlClient::Connect(common.socket, common.timeout_s, &error);
  if (client == nullptr) return Report(error, common.json);
  const bool repeat = watch.watch || watch.interval_s > 0;
  const double interval = watch.interval_s > 0 ? watch.interval_s : 2.0;
  if (repeat) {
    struct sigaction sa {};
    sa.sa_handler = [](int) { g_watch_interrupted = true; };
    sigaction(SIGINT, &sa, nullptr);
  }
  json before;
  auto before_time = std::chrono::steady_clock::now();
  bool have_before = false;
  while (true) {
    json reply;
    if (!client->Call(command, args, &reply, &error)) return Report(error, common.json);
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - before_time).count();
    if (common.json) {
      if (have_before) reply["interval_seconds"] = dt;
      printf("%s\n", repeat ? reply.dump().c_str() : reply.dump(2).c_str());
    } else {
      if (repeat && isatty(STDOUT_FILENO)) printf("\033[H\033[2J");
      print(reply, have_before ? &before : nullptr, dt);
      if (repeat && !titled) printf("\n(every %.1f s; Ctrl-C to stop)\n", interval);
    }
    fflush(stdout);
    if (!repeat) return kExitRunning;
    before = reply;
    before_time = now;
    have_before = true;
    for (double slept = 0; slept < interval && !g_watch_interrupted; slept += 0.05) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (g_watch_interrupted) return kExitRunning;
  }
}

// engramctl tables: one line per table, then its files and row store lines. Within `width`
// columns (0: no limit, -o wide) the size is the table's alone and long file names are cut in
// the middle; wide adds the row size to it.
void PrintTables(const json& r, size_t width) {
  TextTable table({{"LAYER", true},
                   {"ROWS", true},
                   {"COVERED"},
                   {"LAYOUT", false, true},
                   {"SIZE", true},
                   {"RESIDENT", true},
                   {"FILES", true}});
  for (const json& t : r["tables"]) {
    const std::string resident =
        t.contains("resident_fraction")
            ? absl::StrFormat("%.1f%%", 100 * t["resident_fraction"].get<double>())
            : "-";
    std::string size = Bytes(double(U(t, "data_bytes")));
    if (width == 0) size += absl::StrFormat(" (%u B rows)", U(t, "row_bytes"));
    table.AddRow({std::to_string(U(t, "layer")), std::to_string(U(t, "rows")),
                  absl::StrFormat("[%u, %u)", U(t, "covered_begin"), U(t, "covered_end")),
                  t.value("layout", "?"), size, resident, std::to_string(t["files"].size())});
    for (const json& f : t["files"]) {
      table.AddLineUnder("         " + Printable(f.get<std::string>()));
    }
    for (absl::string_view line : absl::StrSplit(StoreTableLines(t), '\n', absl::SkipEmpty())) {
      table.AddLineUnder(std::string(line));
    }
    // Pages that left recently and would be read again: the table is thrashing.
    if (U(t, "recently_evicted_bytes") != 0) {
      table.AddLineUnder(absl::StrFormat("         %s recently evicted (refaults when read again)",
                                         Bytes(double(U(t, "recently_evicted_bytes")))));
    }
  }
  fputs(table.Render(width).c_str(), stdout);
}

// engramctl clients: one line per session. Within `width` columns the counts are shortened
// (12.3k) and the slots left out; wide shows them as they are.
void PrintClients(const json& r, size_t width) {
  const bool wide = width == 0;
  std::vector<TextColumn> columns = {
      {"SESSION", true}, {"PID", true}, {"UID", true}, {"NAME", false, true}};
  if (wide) columns.push_back({"SLOTS", true});
  for (const char* h : {"ARENA", "INFLIGHT", "REQUESTS", "ROWS"}) columns.push_back({h, true});
  TextTable table(std::move(columns));
  auto count = [wide](uint64_t n) { return wide ? std::to_string(n) : Count(double(n)); };
  for (const json& s : r["clients"]) {
    std::vector<std::string> cells = {std::to_string(U(s, "session")), std::to_string(U(s, "pid")),
                                      std::to_string(U(s, "uid")), Printable(s.value("name", ""))};
    if (wide) cells.push_back(std::to_string(U(s, "slots")));
    cells.push_back(Bytes(double(U(s, "arena_bytes"))));
    cells.push_back(std::to_string(U(s, "inflight")));
    cells.push_back(count(U(s, "requests_submitted")));
    cells.push_back(count(U(s, "rows")));
    table.AddRow(std::move(cells));
  }
  fputs(table.Render(width).c_str(), stdout);
}

// engramctl config: one line per setting, with the value engramd runs with (in the
// configuration file's syntax, escaped once, by the JSON writer) and whether a SIGHUP changes it.
void PrintConfig(const json& r, size_t width) {
  TextTable table({{"SETTING", false}, {"VALUE", false, true}, {"SIGHUP", false}});
  for (const json& s : r["settings"]) {
    table.AddRow({s.value("key", "?"), s.contains("value") ? s["value"].dump() : "?",
                  s.value("live", false) ? "live" : "restart"});
  }
  fputs(table.Render(width).c_str(), stdout);
}

void AddConfigCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<CommonOptions>();
  auto list = std::make_shared<ListOptions>();
  CLI::App* c = app.add_subcommand(
      "config",
      "The settings engramd runs with, each as the part that applies it holds it, and which a "
      "SIGHUP changes live");
  AddCommonOptions(c, options.get());
  AddListOptions(c, list.get());
  c->callback([=] {
    *exit_code = Run(*options, WatchOptions{}, "config", json::object(),
                     [=](const json& r, const json*, double) { PrintConfig(r, list->width()); });
  });
}

}  // namespace

void AddDaemonCommands(CLI::App& app, int* exit_code) {
  {
    auto options = std::make_shared<CommonOptions>();
    auto watch = std::make_shared<WatchOptions>();
    CLI::App* c = app.add_subcommand(
        "status",
        "Is engramd running: version, uptime, tables, clients, who administers it (exit 0/3/4 "
        "like systemctl)");
    AddCommonOptions(c, options.get());
    AddWatchOptions(c, watch.get());
    c->callback([=] { *exit_code = Run(*options, *watch, "status", json::object(), PrintStatus); });
  }
  {
    auto options = std::make_shared<CommonOptions>();
    auto watch = std::make_shared<WatchOptions>();
    CLI::App* c = app.add_subcommand(
        "stats",
        "Per table and per client counters: rows, de-dup, hits (row cache or NOWAIT, by tier), "
        "reads, latency (--watch: one line each, busiest first, fitting the terminal)");
    AddCommonOptions(c, options.get());
    AddWatchOptions(c, watch.get());
    c->callback([=] {
      if (!watch->watch && watch->interval_s == 0) {
        *exit_code = Run(*options, *watch, "stats", json::object(), PrintStats);
        return;
      }
      const double interval = watch->interval_s > 0 ? watch->interval_s : 2.0;
      size_t columns = 0, rows = 0;
      TerminalSize(&columns, &rows);
      *exit_code = Run(
          *options, *watch, "stats", json::object(),
          [=](const json& r, const json* before, double dt) {
            PrintStatsTop(r, before, dt, interval, columns, rows);
          },
          /*titled=*/true);
    });
  }
  {
    auto options = std::make_shared<CommonOptions>();
    auto list = std::make_shared<ListOptions>();
    auto no_residency = std::make_shared<bool>(false);
    CLI::App* c = app.add_subcommand(
        "tables",
        "Tables served: layer, rows, layout, files, covered rows, size, page-cache residency");
    AddCommonOptions(c, options.get());
    AddListOptions(c, list.get());
    c->add_flag("--no-residency", *no_residency, "Skip the page-cache residency scan");
    c->callback([=] {
      *exit_code = Run(*options, WatchOptions{}, "tables", json{{"residency", !*no_residency}},
                       [=](const json& r, const json*, double) { PrintTables(r, list->width()); });
    });
  }
  {
    auto options = std::make_shared<CommonOptions>();
    auto list = std::make_shared<ListOptions>();
    CLI::App* c = app.add_subcommand(
        "clients", "Connected sessions: pid, uid, arena size, requests in flight, rows served");
    AddCommonOptions(c, options.get());
    AddListOptions(c, list.get());
    c->callback([=] {
      *exit_code = Run(*options, WatchOptions{}, "clients", json::object(),
                       [=](const json& r, const json*, double) { PrintClients(r, list->width()); });
    });
  }
  AddConfigCommand(app, exit_code);
  {
    auto options = std::make_shared<CommonOptions>();
    CLI::App* c = app.add_subcommand("metrics", "The Prometheus text exposition");
    AddCommonOptions(c, options.get());
    c->callback([=] {
      *exit_code = Run(
          *options, WatchOptions{}, "metrics", json::object(),
          [](const json& r, const json*, double) { fputs(r.value("text", "").c_str(), stdout); });
    });
  }
}

}  // namespace engramctl
