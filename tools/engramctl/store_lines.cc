// The row store's lines in engramctl status, stats and tables: tier, memory against the budget,
// hit rates and the cache, and prefetch. Each prints nothing when the daemon serves every table
// from storage (prefetch lines: when nothing was prefetched).
#include <cstdio>

#include "absl/strings/str_format.h"
#include "base/page_size.h"
#include "tools/engramctl/commands.h"
#include "tools/engramctl/control_client.h"
#include "tools/engramctl/counter_lines.h"
#include "tools/engramctl/text_table.h"

namespace engramctl {
namespace {

using nlohmann::json;

uint64_t Num(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<uint64_t>() : 0;
}
double Frac(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

}  // namespace

void PrintStoreStatus(const json& reply) {
  if (reply.contains("prefetch") && reply["prefetch"].is_object()) {
    const json& p = reply["prefetch"];
    if (Num(p, "requested_rows") + Num(p, "dropped_rows") != 0) {
      PrintLine(absl::StrFormat(
          "  prefetch %lu rows queued now, %lu fetched, %lu dropped, %lu used by gathers",
          Num(p, "queue_rows"), Num(p, "fetched_rows"), Num(p, "dropped_rows"),
          Num(p, "used_rows")));
    }
  }
  if (!reply.contains("store") || !reply["store"].is_object()) return;
  const json& s = reply["store"];
  PrintLine(absl::StrFormat(
      "  row store %s of %s%s, hit rate %.1f%%, all-hit requests %.1f%%",
      Bytes(double(Num(s, "store_bytes"))).c_str(),
      Num(s, "budget_bytes") == 0
          ? "no budget"
          : ("its share of the budget, " + Bytes(double(Num(s, "budget_bytes")))).c_str(),
      s.value("loading", false) ? " (resident tables loading)" : "", 100 * Frac(s, "hit_rate"),
      100 * Frac(s, "all_hit_fraction")));
  if (s.contains("cache") && s["cache"].is_object()) {
    const json& c = s["cache"];
    PrintLine(absl::StrFormat("  row cache, hit rate %.1f%%%s:", 100 * Frac(c, "hit_rate"),
                              Num(c, "capacity_rows") < Num(c, "configured_rows")
                                  ? absl::StrFormat(" (shrunk from %lu rows by memory pressure)",
                                                    Num(c, "configured_rows"))
                                        .c_str()
                                  : ""));
    fputs(CounterLines(RowCacheCounters(), c, nullptr, 0, "    ").c_str(), stdout);
  }
  if (s.contains("misses") && s["misses"].is_object()) {
    const json& m = s["misses"];
    PrintLine(absl::StrFormat(
        "  miss queue, depth %lu, device read rate %.0f rows/s, %lu rows read:", Num(m, "depth"),
        Frac(m, "read_rate_per_s"), Num(m, "completed_reads")));
    // Above 1 the device is the bottleneck: demand outruns what it reads.
    PrintLine(absl::StrFormat("    asked %.0f rows/s (%.2fx the device's rate%s), backlog %.3f s",
                              Frac(m, "demand_per_s"), Frac(m, "load"),
                              Frac(m, "load") > 1 ? ": the device is the bottleneck" : "",
                              Frac(m, "backlog_s")));
    if (m.contains("classes") && m["classes"].is_object()) {
      for (const char* name : {"decode", "prefill", "prefetch", "admission"}) {
        if (!m["classes"].contains(name)) continue;
        const json& c = m["classes"][name];
        printf("    %s: piece wait p50 %.0f us, p99 %.0f us\n", name, Frac(c, "wait_p50_us"),
               Frac(c, "wait_p99_us"));
        fputs(CounterLines(MissClassCounters(), m["classes"][name], nullptr, 0, "      ").c_str(),
              stdout);
      }
    }
  }
}

void PrintStoreTableStats(const json& t) {
  if (Num(t, "prefetch_requested_rows") + Num(t, "prefetch_dropped_rows") != 0) {
    PrintLine(
        absl::StrFormat("  prefetch: %lu rows queued, %lu fetched, %lu already held, %lu "
                        "dropped, %lu failed; "
                        "%lu prefetched rows used by gathers",
                        Num(t, "prefetch_requested_rows"), Num(t, "prefetch_fetched_rows"),
                        Num(t, "prefetch_held_rows"), Num(t, "prefetch_dropped_rows"),
                        Num(t, "prefetch_failed_rows"), Num(t, "prefetch_used_rows")));
  }
  if (!t.contains("store_requests")) return;
  PrintLine(absl::StrFormat("  tier %s: %.1f%% of rows from memory, %.1f%% of requests all hits",
                            t.value("tier", "?").c_str(), 100 * Frac(t, "store_hit_rate"),
                            100 * Frac(t, "store_all_hit_fraction")));
  fputs(CounterLines(StoreTableCounters(), t, nullptr, 0, "    ").c_str(), stdout);
}

std::string StoreTableLines(const json& t) {
  if (!t.contains("tier")) return "";
  if (t["tier"] != "resident") {
    return absl::StrFormat("         tier %s\n", t["tier"].get<std::string>());
  }
  const std::string state = t.value("resident_load_state", std::string());
  const std::string pages = engram::PageSizeName(t.value("resident_page_bytes", uint64_t{0}));
  std::string out = absl::StrFormat("         tier resident (%s %spages%s%s):\n", pages,
                                    t.value("resident_huge_pages", false) ? "huge " : "",
                                    state.empty() ? "" : ", ", state);
  out += CounterLines(StoreTableCounters(), t, nullptr, 0, "           ");
  if (t.contains("resident_load_error")) {
    out +=
        absl::StrFormat("         load failed: %s\n", t["resident_load_error"].get<std::string>());
  }
  return out;
}

}  // namespace engramctl
