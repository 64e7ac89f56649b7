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
  uint64_t data_bytes = 0;  // 0: library default (64 MiB)
  uint32_t slots = 0;       // 0: library default (64)
  uint32_t spin_ns = 0;     // 0: adaptive (see engram_connect_options)
  std::string client_name;  // empty: program name
  std::chrono::nanoseconds timeout{0};
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
    engram_connect_options_init(&o);
    o.socket_path = options.socket_path.empty() ? nullptr : options.socket_path.c_str();
    o.data_bytes = options.data_bytes;
    o.slots = options.slots;
    o.spin_ns = options.spin_ns;
    o.client_name = options.client_name.empty() ? nullptr : options.client_name.c_str();
    o.timeout_ns = options.timeout.count();
    engram_session* s = nullptr;
    Status status = Status::FromReturn(engram_connect(&o, &s));
    if (status.ok()) {
      ret_session->Close();
      ret_session->s_ = s;
    }
    return status;
  }

  void Close() {
    engram_close(s_);
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
  Status Submit(uint32_t table, const uint64_t* rows, uint64_t num_rows, void* dest,
                Ticket* ret_ticket, const uint64_t* dest_offsets = nullptr) {
    engram_gather_request r{};
    r.size = sizeof(r);
    r.table = table;
    r.rows = rows;
    r.num_rows = num_rows;
    r.dest = dest;
    r.dest_offsets = dest_offsets;
    return Status::FromReturn(engram_submit(s_, &r, ret_ticket));
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
  Status Gather(uint32_t table, const uint64_t* rows, uint64_t num_rows, void* dest,
                std::chrono::nanoseconds timeout = std::chrono::nanoseconds(-1)) {
    Ticket t;
    Status s = Submit(table, rows, num_rows, dest, &t);
    return s.ok() ? Wait(t, timeout) : s;
  }

  Status ListTables(std::vector<engram_table_info>* ret_tables) {
    std::vector<engram_table_info> tables(16);
    size_t count = 0;
    while (true) {
      Status s = Status::FromReturn(engram_list_tables(s_, tables.data(), tables.size(), &count));
      if (!s.ok()) return s;
      if (count <= tables.size()) break;
      tables.resize(count);
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
  engram_session* s_ = nullptr;
};

}  // namespace engram
