// Header-only C++ wrapper over the C ABI of engram/engram.h: RAII sessions and buffers, status
// values instead of errno integers. No exceptions; every call that can fail returns a Status.
//
//   engram::Session session;
//   engram::Status s = engram::Session::Connect({}, &session);
//   if (!s.ok()) { std::cerr << s.message() << "\n"; return; }
//   engram::Buffer rows, out;
//   session.Alloc(n * sizeof(uint64_t), &rows);
//   session.Alloc(n * ENGRAM_ROW_BYTES, &out);
//   ... fill rows.as<uint64_t>()[0..n) ...
//   engram::Ticket t;
//   s = session.Submit(14, rows.as<uint64_t>(), n, out.data(), &t);
//   s = session.Wait(t);  // out holds the rows
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engram/engram.h"

namespace engram {

// 0 or a negative errno (see engram.h for the mapping to the daemon's codes) and a message.
class Status {
 public:
  Status() = default;
  Status(int code, std::string message) : code_(code), message_(std::move(message)) {}
  // Captures the calling thread's last error message when `rc` is negative.
  static Status FromReturn(int rc) { return rc < 0 ? Status(rc, engram_last_error()) : Status(); }
  bool ok() const { return code_ == 0; }
  int code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  int code_ = 0;
  std::string message_;
};

using Ticket = uint64_t;

class Session;

// An allocation in a session's data region, returned to it on destruction. Must not outlive its
// session.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      Reset();
      std::swap(session_, other.session_);
      std::swap(data_, other.data_);
      std::swap(bytes_, other.bytes_);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void Reset() {
    if (session_ != nullptr && data_ != nullptr) engram_free(session_, data_);
    session_ = nullptr;
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  friend class Session;
  engram_session* session_ = nullptr;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

struct ConnectOptions {
  std::string socket_path;  // empty: $ENGRAM_SOCKET or ENGRAM_DEFAULT_SOCKET
  uint64_t data_bytes = 0;  // 0: the daemon's default (limits.default_data_bytes, 64 MiB)
  uint32_t slots = 0;       // 0: the daemon's default (limits.default_slots, 64)
  uint32_t spin_ns = 0;     // 0: adaptive (see engram_connect_options)
  std::string client_name;  // empty: program name
  std::chrono::nanoseconds timeout{0};
  // Gather (and GatherTokens) through the daemon by default (ENGRAM_CONNECT_GATHER_VIA_DAEMON)
  // instead of in place where the table can be mapped.
  bool gather_via_daemon = false;
};

// Host-side n-gram hasher of a model (engram/hash.h). Move-only; closes on destruction.
// Immutable once open: any number of threads and sessions may use one Hasher at once.
//
//   engram::Hasher hasher;
//   engram::Status s = engram::Hasher::Open("/models/DeepSeek-V4.1-Flash", {}, &hasher);
class Hasher {
 public:
  struct Options {
    std::string derived_path;        // empty: <model_dir>/engram-hash.bin
    bool compressed_only = false;    // no derived tables: compressed ids only
    int64_t compressed_pad_id = -1;  // -1: from the derived tables
  };

  Hasher() = default;
  Hasher(Hasher&& other) noexcept : h_(std::exchange(other.h_, nullptr)) {}
  Hasher& operator=(Hasher&& other) noexcept {
    if (this != &other) {
      Close();
      h_ = std::exchange(other.h_, nullptr);
    }
    return *this;
  }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  ~Hasher() { Close(); }

  static Status Open(const std::string& model_dir, const Options& options, Hasher* ret_hasher) {
    engram_hasher_opts o;
    engram_hasher_opts_init(&o, sizeof(o));
    o.flags = options.compressed_only ? ENGRAM_HASHER_COMPRESSED_ONLY : 0u;
    o.derived_path = options.derived_path.empty() ? nullptr : options.derived_path.c_str();
    o.compressed_pad_id = options.compressed_pad_id;
    engram_hasher* h = nullptr;
    const int rc = engram_hasher_open(model_dir.c_str(), &o, &h);
    if (rc < 0) return Status(rc, engram_last_error());
    ret_hasher->Close();
    ret_hasher->h_ = h;
    return {};
  }

  void Close() {
    engram_hasher_close(h_);
    h_ = nullptr;
  }
  bool is_open() const { return h_ != nullptr; }
  const engram_hasher* get() const { return h_; }

  Status Info(engram_hasher_info* ret_info) const {
    engram_hasher_info info{};
    info.size = sizeof(info);
    const int rc = engram_hasher_get_info(h_, &info);
    if (rc < 0) return Status(rc, engram_last_error());
    *ret_info = info;
    return {};
  }
  // Heads [*ret_begin, *ret_end) of tensor-parallel rank tp_rank of tp_size.
  Status RankHeads(uint32_t tp_size, uint32_t tp_rank, uint32_t* ret_begin,
                   uint32_t* ret_end) const {
    return FromHash(engram_hasher_rank_heads(h_, tp_size, tp_rank, ret_begin, ret_end));
  }
  // Row ids of heads [head_begin, head_end) of layer_id for every token of seqs, token-major
  // (engram_hash). flags: ENGRAM_HASH_COMPRESSED_IDS for compressed ids.
  Status Hash(uint32_t layer_id, std::span<const engram_hash_seq> seqs, uint32_t head_begin,
              uint32_t head_end, uint32_t flags, std::span<uint64_t> ret_rows) const {
    return FromHash(engram_hash(h_, layer_id, seqs.data(), seqs.size(), head_begin, head_end, flags,
                                ret_rows.data(), ret_rows.size()));
  }
  // One sequence: its new tokens and the ids before them.
  static engram_hash_seq Sequence(std::span<const int32_t> tokens,
                                  std::span<const int32_t> history = {}) {
    return engram_hash_seq{sizeof(engram_hash_seq), tokens.data(), tokens.size(), history.data(),
                           history.size()};
  }

 private:
  static Status FromHash(int rc) { return rc < 0 ? Status(rc, engram_last_error()) : Status(); }
  engram_hasher* h_ = nullptr;
};

// What Session::SubmitTokens hashes and where the rows go (struct engram_token_request).
struct TokenRequest {
  union {
    uint32_t layer = 0;                             // Engram layer id
    uint32_t table ENGRAM_DEPRECATED("use layer");  // older name of `layer`
  };
  std::span<const engram_hash_seq> seqs;  // Hasher::Sequence(...) each
  bool compressed = false;                // ids are compressed ids
  uint32_t head_begin = 0, head_end = 0;  // 0, 0: all heads (or the TP rank's below)
  uint32_t tp_size = 0, tp_rank = 0;      // tp_size != 0: that rank's heads
  uint64_t* rows = nullptr;               // in the data region: positions * heads entries
  uint64_t rows_cap = 0;
  void* dest = nullptr;  // in the data region: [positions][heads][264]
};

// A session with engramd. Move-only; closes on destruction. Thread-safety as the C functions.
class Session {
 public:
  Session() = default;
  Session(Session&& other) noexcept : s_(std::exchange(other.s_, nullptr)) {}
  Session& operator=(Session&& other) noexcept {
    if (this != &other) {
      Close();
      s_ = std::exchange(other.s_, nullptr);
    }
    return *this;
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() { Close(); }

  // Connects (or reconnects: a connected *ret_session is closed first).
  static Status Connect(const ConnectOptions& options, Session* ret_session) {
    engram_connect_options o;
    engram_connect_options_init(&o, sizeof(o));
    o.socket_path = options.socket_path.empty() ? nullptr : options.socket_path.c_str();
    o.data_bytes = options.data_bytes;
    o.slots = options.slots;
    o.spin_ns = options.spin_ns;
    o.client_name = options.client_name.empty() ? nullptr : options.client_name.c_str();
    o.timeout_ns = options.timeout.count();
    o.flags = options.gather_via_daemon ? ENGRAM_CONNECT_GATHER_VIA_DAEMON : 0u;
    engram_session* s = nullptr;
    Status status = Status::FromReturn(engram_session_open(&o, &s));
    if (status.ok()) {
      ret_session->Close();
      ret_session->s_ = s;
    }
    return status;
  }

  void Close() {
    engram_session_close(s_);
    s_ = nullptr;
  }
  bool connected() const { return s_ != nullptr; }
  engram_session* get() const { return s_; }

  std::span<uint8_t> DataRegion() const {
    void* base = nullptr;
    uint64_t bytes = 0;
    engram_data_region(s_, &base, &bytes);
    return {static_cast<uint8_t*>(base), static_cast<size_t>(bytes)};
  }

  Status Alloc(uint64_t bytes, Buffer* ret_buffer) {
    void* p = nullptr;
    Status status = Status::FromReturn(engram_alloc(s_, bytes, &p));
    if (status.ok()) {
      ret_buffer->Reset();
      ret_buffer->session_ = s_;
      ret_buffer->data_ = p;
      ret_buffer->bytes_ = bytes;
    }
    return status;
  }

  // rows and dest (and dest_offsets, if not empty) must lie in the data region.
  Status Submit(uint32_t layer, const uint64_t* rows, uint64_t num_rows, void* dest,
                Ticket* ret_ticket, const uint64_t* dest_offsets = nullptr) {
    engram_gather_request r{};
    r.size = sizeof(r);
    r.layer = layer;
    r.rows = rows;
    r.num_rows = num_rows;
    r.dest = dest;
    r.dest_offsets = dest_offsets;
    return Status::FromReturn(engram_submit(s_, &r, ret_ticket));
  }
  // Rows of `layer`'s table the caller will probably gather soon (engram_prefetch): returns
  // once the daemon queued them, never after I/O; *ret_queued (if given) = rows queued, the rest
  // dropped.
  Status Prefetch(uint32_t layer, const uint64_t* rows, uint64_t num_rows,
                  uint64_t* ret_queued = nullptr) {
    return Status::FromReturn(engram_prefetch(s_, layer, rows, num_rows, 0, ret_queued));
  }
  // Request `request_id` will gather these rows of `layer`'s table in its prefill
  // (engram_admit): read at the lowest priority and pinned in the row cache until AdmitDone,
  // `ttl` (0: the daemon's memory.admit_ttl_ms) or the session's end. Returns once queued.
  Status Admit(uint64_t request_id, uint32_t layer, const uint64_t* rows, uint64_t num_rows,
               std::chrono::nanoseconds ttl = std::chrono::nanoseconds(0),
               uint64_t* ret_queued = nullptr) {
    return Status::FromReturn(engram_admit(s_, request_id, layer, rows, num_rows,
                                           static_cast<uint64_t>(ttl.count()), ret_queued));
  }
  // The request is done with its admitted rows: they are unpinned (engram_admit_done).
  // *ret_found (if given): whether it had an admission.
  Status AdmitDone(uint64_t request_id, bool* ret_found = nullptr) {
    int found = 0;
    Status s = Status::FromReturn(engram_admit_done(s_, request_id, &found));
    if (s.ok() && ret_found != nullptr) *ret_found = found != 0;
    return s;
  }
  Status SubmitNop(Ticket* ret_ticket) {
    return Status::FromReturn(engram_submit_nop(s_, ret_ticket));
  }
  // A negative timeout waits without limit.
  Status Wait(Ticket ticket, std::chrono::nanoseconds timeout = std::chrono::nanoseconds(-1)) {
    return Status::FromReturn(engram_wait(s_, ticket, timeout.count()));
  }
  // Status code -EAGAIN while in flight.
  Status Poll(Ticket ticket) { return Status::FromReturn(engram_poll(s_, ticket)); }
  // engram_gather: in place where the table can be mapped and the session's default allows it;
  // flags ENGRAM_GATHER_VIA_DAEMON or ENGRAM_GATHER_IN_PLACE choose the path for this call.
  Status Gather(uint32_t layer, const uint64_t* rows, uint64_t num_rows, void* dest,
                std::chrono::nanoseconds timeout = std::chrono::nanoseconds(-1), uint32_t flags = 0,
                const uint64_t* dest_offsets = nullptr) {
    engram_gather_request r{};
    r.size = sizeof(r);
    r.layer = layer;
    r.flags = flags;
    r.rows = rows;
    r.num_rows = num_rows;
    r.dest = dest;
    r.dest_offsets = dest_offsets;
    return Status::FromReturn(engram_gather(s_, &r, timeout.count()));
  }

  // Hashes request.seqs into request.rows and submits their gather into request.dest in one
  // call (engram_submit_tokens); *ret_num_rows (if given) = positions * heads.
  Status SubmitTokens(const Hasher& hasher, const TokenRequest& request, Ticket* ret_ticket,
                      uint64_t* ret_num_rows = nullptr) {
    engram_token_request r = ToC(request);
    return Status::FromReturn(engram_submit_tokens(s_, hasher.get(), &r, ret_ticket, ret_num_rows));
  }
  Status GatherTokens(const Hasher& hasher, const TokenRequest& request,
                      std::chrono::nanoseconds timeout = std::chrono::nanoseconds(-1)) {
    engram_token_request r = ToC(request);
    return Status::FromReturn(engram_gather_tokens(s_, hasher.get(), &r, timeout.count()));
  }

  Status ListTables(std::vector<engram_table_info>* ret_tables) {
    engram_table_info blank{};
    blank.size = sizeof(blank);
    std::vector<engram_table_info> tables(16, blank);
    size_t count = 0;
    while (true) {
      Status s = Status::FromReturn(engram_list_tables(s_, tables.data(), tables.size(), &count));
      if (!s.ok()) return s;
      if (count <= tables.size()) break;
      tables.resize(count, blank);
    }
    tables.resize(count);
    *ret_tables = std::move(tables);
    return {};
  }
  Status Stats(struct engram_session_stats* ret_stats) {
    struct engram_session_stats st {};
    st.size = sizeof(st);
    Status s = Status::FromReturn(engram_get_session_stats(s_, &st));
    if (s.ok()) *ret_stats = st;
    return s;
  }
  const volatile uint64_t* CompletionCounter() const {
    const volatile uint64_t* c = nullptr;
    engram_completion_counter(s_, &c);
    return c;
  }

 private:
  static engram_token_request ToC(const TokenRequest& request) {
    engram_token_request r{};
    r.size = sizeof(r);
    r.layer = request.layer;
    r.flags = request.compressed ? ENGRAM_HASH_COMPRESSED_IDS : 0u;
    r.seqs = request.seqs.data();
    r.n_seqs = request.seqs.size();
    r.head_begin = request.head_begin;
    r.head_end = request.head_end;
    r.tp_size = request.tp_size;
    r.tp_rank = request.tp_rank;
    r.rows = request.rows;
    r.rows_cap = request.rows_cap;
    r.dest = request.dest;
    return r;
  }
  engram_session* s_ = nullptr;
};

}  // namespace engram
