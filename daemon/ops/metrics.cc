// Prometheus exposition, process_* metrics, loopback HTTP listener and textfile writer
// (metrics.h).
#include "daemon/ops/metrics.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/page_size.h"

namespace engram::metrics {
namespace {

std::string RenderLabels(const Labels& labels, const std::string& extra_key = "",
                         const std::string& extra_value = "") {
  std::string out;
  auto add = [&](const std::string& k, const std::string& v) {
    out += (out.empty() ? "{" : ",") + k + "=\"" + EscapeLabel(v) + "\"";
  };
  for (const auto& [k, v] : labels) add(k, v);
  if (!extra_key.empty()) add(extra_key, extra_value);
  if (!out.empty()) out += "}";
  return out;
}

}  // namespace

std::string FormatSampleValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // An integer (every counter of events) in digits, never an exponent: %.0f prints the double's
  // exact value, which is the count itself up to 2^53.
  if (v == std::floor(v) && std::fabs(v) < 0x1p63) return absl::StrFormat("%.0f", v);
  // Anything else in the fewest digits that read back as the same double (a timestamp since the
  // epoch in seconds needs 16 or 17 of them).
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string EscapeLabel(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

Exposition::Family& Exposition::Get(const std::string& name, const std::string& help,
                                    const char* type) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    order_.push_back(name);
    it->second.help = help;
    it->second.type = type;
  }
  return it->second;
}

void Exposition::Gauge(const std::string& name, const std::string& help, const Labels& labels,
                       double value) {
  Get(name, help, "gauge")
      .samples.push_back(name + RenderLabels(labels) + " " + FormatSampleValue(value));
}

void Exposition::Counter(const std::string& name, const std::string& help, const Labels& labels,
                         double value) {
  Get(name, help, "counter")
      .samples.push_back(name + RenderLabels(labels) + " " + FormatSampleValue(value));
}

void Exposition::Log2Histogram(const std::string& name, const std::string& help,
                               const Labels& labels, const uint64_t* buckets, size_t num_buckets,
                               uint64_t sum_ns, const Log2Edges& edges) {
  Family& f = Get(name, help, "histogram");
  // Edge 2^k ns holds every bucket below it: buckets i < k (bucket i ends at 2^(i+1) ns).
  uint64_t cumulative = 0;
  size_t i = 0;
  for (int edge = edges.first_log2; edge <= edges.last_log2; edge += edges.step) {
    for (; i < num_buckets && int(i) < edge; ++i) cumulative += buckets[i];
    const double le = std::ldexp(1.0, edge) / 1e9;
    f.samples.push_back(name + "_bucket" + RenderLabels(labels, "le", FormatSampleValue(le)) + " " +
                        FormatSampleValue(double(cumulative)));
  }
  for (; i < num_buckets; ++i) cumulative += buckets[i];
  f.samples.push_back(name + "_bucket" + RenderLabels(labels, "le", "+Inf") + " " +
                      FormatSampleValue(double(cumulative)));
  f.samples.push_back(name + "_sum" + RenderLabels(labels) + " " +
                      FormatSampleValue(double(sum_ns) / 1e9));
  f.samples.push_back(name + "_count" + RenderLabels(labels) + " " +
                      FormatSampleValue(double(cumulative)));
}

std::string Exposition::Text() const {
  std::string out;
  for (const std::string& name : order_) {
    const Family& f = families_.at(name);
    out += "# HELP " + name + " " + f.help + "\n# TYPE " + name + " " + f.type + "\n";
    for (const std::string& s : f.samples) out += s + "\n";
  }
  return out;
}

namespace {

// The whole of a small /proc file, or nullopt.
std::optional<std::string> ReadProcFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// /proc/stat's btime: when the machine booted, in seconds since the epoch.
std::optional<uint64_t> BootTime(const std::string& proc) {
  std::optional<std::string> stat = ReadProcFile(proc + "/stat");
  if (!stat) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*stat, '\n')) {
    uint64_t v;
    if (absl::ConsumePrefix(&line, "btime ") && absl::SimpleAtoi(line, &v)) return v;
  }
  return std::nullopt;
}

}  // namespace

void AppendProcessMetrics(Exposition& e, const std::string& proc) {
  const double ticks = double(sysconf(_SC_CLK_TCK));
  const double page = double(KernelPageBytes());  // /proc counts rss in the kernel's pages
  // /proc/self/stat: the fields after the command's closing parenthesis (which the command
  // itself may contain) start with field 3, the state.
  std::optional<std::string> stat = ReadProcFile(proc + "/self/stat");
  const size_t paren = stat ? stat->rfind(')') : std::string::npos;
  if (paren != std::string::npos) {
    const std::vector<std::string> f = absl::StrSplit(stat->substr(paren + 2), ' ');
    // Field n of proc(5) is f[n - 3]: utime 14, stime 15, starttime 22, vsize 23, rss 24.
    uint64_t utime, stime, start, vsize;
    int64_t rss;
    if (f.size() > 21 && absl::SimpleAtoi(f[11], &utime) && absl::SimpleAtoi(f[12], &stime) &&
        absl::SimpleAtoi(f[19], &start) && absl::SimpleAtoi(f[20], &vsize) &&
        absl::SimpleAtoi(f[21], &rss)) {
      e.Counter("process_cpu_seconds_total", "User and system CPU time spent in seconds", {},
                double(utime + stime) / ticks);
      // /proc/self/statm has both sizes in pages, as the kernel keeps them; an emulator that
      // makes up /proc/self/stat for its guest (qemu-user: rss 0) passes it through.
      std::optional<std::string> statm = ReadProcFile(proc + "/self/statm");
      const std::vector<std::string> m =
          statm ? absl::StrSplit(*statm, ' ') : std::vector<std::string>{};
      uint64_t size_pages, resident_pages;
      if (m.size() > 1 && absl::SimpleAtoi(m[0], &size_pages) &&
          absl::SimpleAtoi(m[1], &resident_pages)) {
        vsize = static_cast<uint64_t>(double(size_pages) * page);
        rss = static_cast<int64_t>(resident_pages);
      }
      e.Gauge("process_resident_memory_bytes", "Resident memory size in bytes", {},
              double(std::max<int64_t>(rss, 0)) * page);
      e.Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes", {}, double(vsize));
      if (std::optional<uint64_t> boot = BootTime(proc)) {
        e.Gauge("process_start_time_seconds",
                "Start time of the process since the epoch, in seconds", {},
                double(*boot) + double(start) / ticks);
      }
    }
  }
  if (DIR* d = opendir((proc + "/self/fd").c_str()); d != nullptr) {
    uint64_t open = 0;
    while (const dirent* entry = readdir(d)) open += entry->d_name[0] != '.' ? 1 : 0;
    closedir(d);
    e.Gauge("process_open_fds", "Open file descriptors", {}, double(open - 1));  // the DIR's own
  }
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    e.Gauge("process_max_fds", "Most file descriptors the process may open", {},
            nofile.rlim_cur == RLIM_INFINITY ? std::numeric_limits<double>::infinity()
                                             : double(nofile.rlim_cur));
  }
}

namespace {
// Connections the kernel holds for accept: a flood fills this instead of making a scraper's
// SYN wait for a retransmission.
constexpr int kListenBacklog = 1024;
}  // namespace

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(
    const std::string& address, uint16_t port, std::function<std::string()> render,
    std::function<Health()> health) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(address.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("metrics address '%s': %s", address, gai_strerror(rc)));
  }
  std::unique_ptr<HttpListener> l(new HttpListener());
  l->render_ = std::move(render);
  l->health_ = std::move(health);
  l->fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  if (l->fd_ >= 0) setsockopt(l->fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (l->fd_ < 0 || bind(l->fd_, found->ai_addr, found->ai_addrlen) < 0 ||
      listen(l->fd_, kListenBacklog) < 0) {
    const int err = errno;
    freeaddrinfo(found);
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot listen for metrics on %s port %u: %s", address, port, strerror(err)));
  }
  freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(l->fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  l->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  l->stop_fd_ = eventfd(0, EFD_CLOEXEC);
  l->thread_ = std::thread([p = l.get()] { p->Loop(); });
  return l;
}

void HttpListener::SetHandlers(std::function<std::string()> render,
                               std::function<Health()> health) {
  std::lock_guard lock(handlers_mu_);
  render_ = std::move(render);
  health_ = std::move(health);
}

HttpListener::~HttpListener() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    ssize_t ignored = write(stop_fd_, &one, sizeof(one));
    (void)ignored;
    thread_.join();
  }
  if (fd_ >= 0) close(fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

namespace {

// Connections served at once; a new one past this closes the oldest that has not sent its
// whole request yet (one being answered is never closed for a newcomer).
constexpr size_t kMaxHttpConnections = 64;
// Connections accepted per pass of the loop: between passes every connection is read, so a
// scraper's request that has arrived is answered before a burst of newcomers can push it out.
constexpr size_t kAcceptsPerPass = 16;
// A connection that has not sent its whole request by then is closed: scrapers send theirs
// right after connecting.
constexpr uint64_t kHttpRequestDeadlineNs = 500'000'000;
// Whole life of one connection, request to last byte of the answer: a client that sends a
// byte now and then is closed at this deadline, whatever it does.
constexpr uint64_t kHttpDeadlineNs = 2'000'000'000;
constexpr size_t kMaxRequestBytes = 8192;

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

bool IsGet(const std::string& request, const char* path) {
  const std::string prefix = std::string("GET ") + path;
  return request.rfind(prefix + " ", 0) == 0 || request.rfind(prefix + "?", 0) == 0;
}

std::string HttpAnswer(const std::string& request, const std::function<std::string()>& render,
                       const std::function<Health()>& health) {
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  try {  // the listener's thread must not end the daemon
    if (IsGet(request, "/metrics")) {
      body = render();
    } else if (IsGet(request, "/healthz")) {
      type = "text/plain; charset=utf-8";
      const Health h = health();
      if (!h.ok) status = "503 Service Unavailable";
      body = (h.ok ? std::string("ok") : h.reason) + "\n";
    } else if (request.rfind("GET ", 0) == 0) {
      status = "404 Not Found";
      body = "engramd serves only /metrics and /healthz here\n";
    } else {
      status = "405 Method Not Allowed";
      body = "only GET /metrics and GET /healthz\n";
    }
  } catch (const std::exception& e) {
    status = "500 Internal Server Error";
    body = absl::StrFormat("cannot answer: %s\n", e.what());
  }
  return absl::StrFormat(
             "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %u\r\nConnection: close\r\n\r\n",
             status, type, body.size()) +
         body;
}

}  // namespace

struct HttpListener::Connection {
  int fd;
  uint64_t deadline_ns;
  uint64_t request_deadline_ns;  // the whole request must have come by then
  std::string in;
  std::string out;  // the answer, once the request is complete
  size_t sent = 0;
};

// One thread serves every connection without blocking on any: each is non-blocking, polled,
// and closed at its deadline, so a slow client delays nobody else.
void HttpListener::Loop() {
  std::vector<Connection> conns;
  while (true) {
    std::vector<pollfd> fds = {{.fd = fd_, .events = POLLIN}, {.fd = stop_fd_, .events = POLLIN}};
    uint64_t now = MonotonicNs();
    int timeout_ms = -1;
    for (const Connection& c : conns) {
      fds.push_back({.fd = c.fd, .events = static_cast<short>(c.out.empty() ? POLLIN : POLLOUT)});
      const uint64_t until = c.out.empty() ? c.request_deadline_ns : c.deadline_ns;
      const uint64_t left = until > now ? until - now : 0;
      const int ms = static_cast<int>(left / 1'000'000) + 1;
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) break;
    for (size_t i = 0; i < conns.size(); ++i) {
      if (fds[i + 2].revents != 0) Serve(conns[i]);
    }
    now = MonotonicNs();
    std::erase_if(conns, [&](const Connection& c) {
      const bool done =
          c.fd < 0 || now >= c.deadline_ns || (c.out.empty() && now >= c.request_deadline_ns);
      if (done && c.fd >= 0) close(c.fd);
      return done;
    });
    if (fds[0].revents != 0) Accept(&conns, now);
  }
  for (const Connection& c : conns) close(c.fd);
}

void HttpListener::Accept(std::vector<Connection>* conns, uint64_t now) {
  for (size_t accepted = 0; accepted < kAcceptsPerPass; ++accepted) {
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (conns->size() >= kMaxHttpConnections) {
      // The oldest that is still waiting for its request; if every one is being answered, the
      // newcomer waits for the next pass instead.
      auto idle = std::find_if(conns->begin(), conns->end(),
                               [](const Connection& c) { return c.out.empty(); });
      if (idle == conns->end()) {
        close(fd);
        return;
      }
      close(idle->fd);
      conns->erase(idle);
    }
    conns->push_back(Connection{.fd = fd,
                                .deadline_ns = now + kHttpDeadlineNs,
                                .request_deadline_ns = now + kHttpRequestDeadlineNs});
    Serve(conns->back());  // its request is usually here already
    if (conns->back().fd < 0) conns->pop_back();
  }
}

void HttpListener::Serve(Connection& c) {
  if (c.out.empty()) {
    char buf[2048];
    const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n > 0) c.in.append(buf, static_cast<size_t>(n));
    if (n > 0 && c.in.find("\r\n\r\n") == std::string::npos && c.in.size() < kMaxRequestBytes) {
      return;
    }
    std::function<std::string()> render;
    std::function<Health()> health;
    {
      std::lock_guard lock(handlers_mu_);
      render = render_;
      health = health_;
    }
    c.out = HttpAnswer(c.in, render, health);
  }
  const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) c.sent += static_cast<size_t>(n);
  if (n <= 0 || c.sent == c.out.size()) {
    close(c.fd);
    c.fd = -1;
  }
}

absl::Status WriteTextfile(const std::string& dir, const std::string& text) {
  const std::string final_path = dir + "/engramd.prom";
  const std::string tmp = final_path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot write metrics textfile %s: %s", tmp, strerror(errno)));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return absl::FailedPreconditionError(
          absl::StrFormat("writing metrics textfile %s: %s", tmp, strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  if (rename(tmp.c_str(), final_path.c_str()) < 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot rename %s to %s: %s", tmp, final_path, strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status RemoveTextfile(const std::string& dir) {
  const std::string final_path = dir + "/engramd.prom";
  unlink((final_path + ".tmp").c_str());
  if (unlink(final_path.c_str()) < 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot remove metrics textfile %s: %s", final_path, strerror(errno)));
  }
  return absl::OkStatus();
}

std::string TextfileFreshness(double written_unix_s, uint32_t interval_s) {
  Exposition e;
  e.Gauge("engram_textfile_written_timestamp_seconds",
          "When engramd wrote this textfile, in seconds since the epoch (compare with time())", {},
          written_unix_s);
  e.Gauge("engram_textfile_interval_seconds", "Seconds between engramd's writes of this textfile",
          {}, double(interval_s));
  return e.Text();
}

}  // namespace engram::metrics
