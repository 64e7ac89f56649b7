// engramctl rows: gathers rows through the client library exactly as an inference process
// would, and prints them as hex or dequantised values, or writes the raw bytes to a file.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/str_format.h"
#include "cli/command_line.h"
#include "engram/engram.h"
#include "kernels/dequant_ref.h"
#include "tools/engramctl/commands.h"
#include "tools/engramctl/control_client.h"

namespace engramctl {
namespace {

using nlohmann::json;

struct RowsOptions {
  CommonOptions common;
  uint32_t table = 0;
  std::vector<uint64_t> rows;
  std::string out;
  bool dequant = false;
};

// Opens a session and gathers o.rows into its arena. On success *ret_session is open and
// *ret_bytes holds the rows; otherwise the error is reported and its exit code returned.
std::optional<int> GatherRows(const RowsOptions& o, engram_session** ret_session,
                              const uint8_t** ret_bytes) {
  engram_connect_options options;
  engram_connect_options_init(&options, sizeof(options));
  options.socket_path = o.common.socket.c_str();
  options.client_name = "engramctl rows";
  options.timeout_ns = static_cast<int64_t>(o.common.timeout_s * 1e9);
  const uint64_t row_bytes = o.rows.size() * ENGRAM_ROW_BYTES;
  options.data_bytes = ((row_bytes + o.rows.size() * 8 + 8191) / 4096 + 1) * 4096;
  options.slots = 1;
  engram_session* session = nullptr;
  if (int rc = engram_session_open(&options, &session); rc != 0) {
    const int code = rc == -ENOENT || rc == -ECONNREFUSED ? kExitNotRunning : kExitUnknown;
    return Report({code, absl::StrFormat("cannot open a session on %s: %s; check `engramctl "
                                         "status --socket %s`",
                                         o.common.socket, engram_last_error(), o.common.socket)},
                  o.common.json);
  }
  void* ids = nullptr;
  void* dest = nullptr;
  int rc = engram_alloc(session, o.rows.size() * 8, &ids);
  if (rc == 0) rc = engram_alloc(session, row_bytes, &dest);
  if (rc == 0) {
    memcpy(ids, o.rows.data(), o.rows.size() * 8);
    engram_gather_request request{};
    request.size = sizeof(request);
    request.layer = o.table;
    // The rows as engramd serves them, and no mapping of a whole table for a few rows.
    request.flags = ENGRAM_GATHER_VIA_DAEMON;
    request.rows = static_cast<const uint64_t*>(ids);
    request.num_rows = o.rows.size();
    request.dest = dest;
    rc = engram_gather(session, &request, static_cast<int64_t>(o.common.timeout_s * 1e9));
  }
  if (rc != 0) {
    const std::string why = engram_last_error();
    engram_session_close(session);
    return Report({kExitFailed, absl::StrFormat("gathering from layer %u on %s: %s", o.table,
                                                o.common.socket, why)},
                  o.common.json);
  }
  *ret_session = session;
  *ret_bytes = static_cast<const uint8_t*>(dest);
  return std::nullopt;
}

// --out: the raw rows into a file, and a line (or JSON) saying so.
int WriteRows(const RowsOptions& o, const uint8_t* bytes) {
  const uint64_t row_bytes = o.rows.size() * ENGRAM_ROW_BYTES;
  FILE* f = fopen(o.out.c_str(), "wb");
  if (f == nullptr || fwrite(bytes, 1, row_bytes, f) != row_bytes || fclose(f) != 0) {
    return Report({kExitFailed, absl::StrFormat("cannot write %s: %s", o.out, strerror(errno))},
                  o.common.json);
  }
  if (o.common.json) {
    printf("%s\n", json{{"schema_version", 1},
                        {"layer", o.table},
                        {"rows", o.rows},
                        {"file", o.out},
                        {"bytes", row_bytes}}
                       .dump(2)
                       .c_str());
  } else {
    printf("wrote %zu row(s) of layer %u, %lu bytes, to %s\n", o.rows.size(), o.table, row_bytes,
           o.out.c_str());
  }
  return kExitRunning;
}

// One row as text: 256 dequantised values, 8 a line to 3 significant digits in columns 9 wide
// (80 columns; an FP8 value holds fewer digits than that, and --json prints them in full), or
// its bytes in hex, 32 a line.
void PrintRowText(const RowsOptions& o, uint64_t row_id, const std::vector<double>& values,
                  const std::string& hex) {
  printf("layer %u row %lu:\n", o.table, row_id);
  if (o.dequant) {
    for (int v = 0; v < 256; ++v) {
      printf(" %9.3g", values[v]);
      if (v % 8 == 7) printf("\n");
    }
  } else {
    for (size_t b = 0; b < hex.size(); b += 64) printf("  %s\n", hex.substr(b, 64).c_str());
  }
}

// The rows as hex or dequantised values, as text or JSON.
void PrintRows(const RowsOptions& o, const uint8_t* bytes) {
  json list = json::array();
  for (size_t i = 0; i < o.rows.size(); ++i) {
    const uint8_t* row = bytes + i * ENGRAM_ROW_BYTES;
    std::string hex;
    std::vector<double> values;
    if (o.dequant) {
      for (int v = 0; v < 256; ++v) {
        values.push_back(engram::E4M3ToDouble(row[v]) * engram::E8M0ToDouble(row[256 + v / 32]));
      }
    } else {
      for (uint32_t b = 0; b < ENGRAM_ROW_BYTES; ++b) hex += absl::StrFormat("%02x", row[b]);
    }
    if (!o.common.json) {
      PrintRowText(o, o.rows[i], values, hex);
      continue;
    }
    json e = {{"row", o.rows[i]}};
    if (o.dequant) {
      e["values"] = values;
    } else {
      e["hex"] = hex;
    }
    list.push_back(e);
  }
  if (o.common.json) {
    printf("%s\n", json{{"schema_version", 1},
                        {"layer", o.table},
                        {"format", o.dequant ? "dequantised" : "hex"},
                        {"rows", list}}
                       .dump(2)
                       .c_str());
  }
}

int RunRows(const RowsOptions& o) {
  engram_session* session = nullptr;
  const uint8_t* bytes = nullptr;
  if (std::optional<int> failed = GatherRows(o, &session, &bytes)) return *failed;
  int result = kExitRunning;
  if (!o.out.empty()) {
    result = WriteRows(o, bytes);
  } else {
    PrintRows(o, bytes);
  }
  engram_session_close(session);
  return result;
}

}  // namespace

void AddRowsCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<RowsOptions>();
  CLI::App* c = app.add_subcommand(
      "rows", "Print rows as engramd serves them (raw hex, --dequant values) or --out FILE");
  AddCommonOptions(c, &o->common);
  c->add_option("LAYER", o->table, "Layer id of the table")
      ->required()
      ->check(engram::cli::Integer(0, UINT32_MAX));
  c->add_option("ROW", o->rows, "Row ids")->required()->check(engram::cli::Integer(0, UINT64_MAX));
  c->add_option("--out", o->out, "Write the raw 264-byte rows to FILE instead")->type_name("FILE");
  c->add_flag("--dequant", o->dequant, "Print the 256 values of each row, dequantised");
  c->callback([=] { *exit_code = RunRows(*o); });
}

}  // namespace engramctl
