// engram-serve's requests and load points (serve_requests.h).
#include "bench/serve/serve_requests.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace engram::bench::serve {

absl::StatusOr<RequestSource> RequestSource::Make(std::vector<std::vector<int32_t>> docs,
                                                  const RequestOptions& o) {
  if (o.prompt_cap < o.min_prompt || o.output_cap < o.min_output || o.min_prompt == 0 ||
      o.min_output == 0) {
    return absl::InvalidArgumentError("the prompt and output caps must be at least their minima");
  }
  RequestSource s;
  s.o_ = o;
  s.docs_ = std::move(docs);
  for (uint32_t d = 0; d < s.docs_.size(); ++d) {
    if (s.docs_[d].size() >= size_t{o.min_prompt} + o.min_output) s.order_.push_back(d);
  }
  if (s.order_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no document of ", o.min_prompt + o.min_output,
                                                   " tokens or more for a request"));
  }
  std::mt19937_64 rng(o.seed);
  std::shuffle(s.order_.begin(), s.order_.end(), rng);
  return s;
}

Request RequestSource::Next() {
  Request r;
  r.id = next_;
  r.doc = &docs_[order_[next_ % order_.size()]];
  ++next_;
  const uint64_t len = r.doc->size();
  r.prompt = static_cast<uint32_t>(std::min<uint64_t>(o_.prompt_cap, len - o_.min_output));
  r.output = static_cast<uint32_t>(std::min<uint64_t>(o_.output_cap, len - r.prompt));
  return r;
}

std::vector<std::vector<int32_t>> ZipfDocuments(uint32_t n, uint32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> w(vocab);
  for (uint32_t i = 0; i < vocab; ++i) w[i] = 1.0 / (i + 1.0);
  std::discrete_distribution<uint32_t> zipf(w.begin(), w.end());
  std::uniform_int_distribution<uint32_t> length(1024, 4095);
  std::vector<std::vector<int32_t>> docs(n);
  for (auto& d : docs) {
    d.resize(length(rng));
    for (auto& t : d) t = static_cast<int32_t>(zipf(rng));
  }
  return docs;
}

std::string LoadPoint::Name() const {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%c%g", kind == kConcurrency ? 'c' : 'r', value);
  return buf;
}

absl::StatusOr<std::vector<LoadPoint>> ParseLoadPoints(std::string_view list) {
  std::vector<LoadPoint> out;
  std::vector<std::string> items;
  for (size_t b = 0; b <= list.size();) {
    const size_t e = std::min(list.find(',', b), list.size());
    if (e > b) items.emplace_back(list.substr(b, e - b));
    b = e + 1;
  }
  for (const std::string& item : items) {
    const std::string rest = item.substr(1);
    char* end = nullptr;
    const double v = rest.empty() ? 0 : std::strtod(rest.c_str(), &end);
    const bool number = end != nullptr && *end == '\0' && std::isfinite(v) && v > 0;
    LoadPoint p;
    if (item[0] == 'c' && number && v == std::floor(v) && v <= 1024) {
      p.kind = LoadPoint::kConcurrency;
    } else if (item[0] == 'r' && number && v <= 1e4) {
      p.kind = LoadPoint::kRate;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "load point '", item, "': want cN (N clients, 1..1024) or rX (X requests/s)"));
    }
    p.value = v;
    out.push_back(p);
  }
  if (out.empty()) return absl::InvalidArgumentError("no load point given");
  return out;
}

std::vector<uint64_t> PoissonArrivals(double rate, uint64_t duration_ns, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::vector<uint64_t> t;
  for (double s = gap(rng); s * 1e9 < static_cast<double>(duration_ns); s += gap(rng)) {
    t.push_back(static_cast<uint64_t>(s * 1e9));
  }
  return t;
}

}  // namespace engram::bench::serve
