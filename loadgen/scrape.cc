// SPDX-License-Identifier: Apache-2.0
#include "loadgen/scrape.h"

#include <cmath>
#include <cstdlib>

#include "common/base/host_port.h"
#include "common/http/http_client.h"

namespace cdp::loadgen {

Result<MetricSums> ParsePrometheusText(std::string_view text) {
  MetricSums out;
  size_t line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (line.empty() || line.front() == '#') continue;
    auto bad = [&] { return Status::Corruption("metrics line " + std::to_string(line_no) + ": '" + std::string(line.substr(0, 80)) + "'"); };
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ' && line[i] != '\t') ++i;
    std::string_view name = line.substr(0, i);
    if (name.empty()) return bad();
    if (i < line.size() && line[i] == '{') {
      bool quoted = false;
      for (++i; i < line.size(); ++i) {
        char c = line[i];
        if (quoted) {
          if (c == '\\') ++i;
          else if (c == '"') quoted = false;
        } else if (c == '"') {
          quoted = true;
        } else if (c == '}') {
          break;
        }
      }
      if (i >= line.size()) return bad();
      ++i;
    }
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    size_t e = i;
    while (e < line.size() && line[e] != ' ' && line[e] != '\t') ++e;
    std::string num(line.substr(i, e - i));
    if (num.empty() || num.size() > 64) return bad();
    double v;
    if (num == "NaN") v = std::nan("");
    else if (num == "+Inf") v = INFINITY;
    else if (num == "-Inf") v = -INFINITY;
    else {
      char* end = nullptr;
      v = std::strtod(num.c_str(), &end);
      if (*end != '\0') return bad();
    }
    auto it = out.find(name);
    if (it == out.end()) out.emplace(std::string(name), v);
    else it->second += v;
  }
  return out;
}

Result<HttpUrl> ParseHttpUrl(std::string_view url) {
  HttpUrl u;
  std::string_view rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    rest = url.substr(8);
    u.https = true;
    u.port = 443;
  } else {
    return Status::InvalidArgument("not an http:// or https:// URL: " + std::string(url));
  }
  size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) u.target = std::string(rest.substr(slash));
  auto hp = ParseHostPort(hostport, HostPort::Rules::UrlAuthority(u.port));
  if (!hp.ok()) return Status::InvalidArgument(std::string(url) + ": " + hp.status().message());
  u.host = hp->host;
  u.port = hp->port;
  return u;
}

Result<MetricSums> Scrape(const HttpUrl& url, uint32_t timeout_ms) {
  if (url.https && url.tls_ca.empty())
    return Status::InvalidArgument("https://" + url.host + ": give the site CA (CDP_TLS_CA) to check the daemon");
  http::ClientOptions co;
  co.bearer_token = url.token;
  if (url.https) co.tls_ca = url.tls_ca;
  CDP_ASSIGN_OR_RETURN(auto resp, http::HttpRequest(url.host, url.port, "GET", url.target, {},
                                                   std::chrono::milliseconds(timeout_ms), co));
  if (resp.status != 200)
    return Status::Unavailable(std::string("GET ") + (url.https ? "https://" : "http://") + url.host + ":" + std::to_string(url.port) + url.target + ": HTTP " +
                               std::to_string(resp.status));
  return ParsePrometheusText(resp.body);
}

Profile ProfileFromReadings(const std::vector<CounterReading>& r) {
  Profile p;
  for (size_t i = 0; i + 1 < r.size(); ++i) {
    double d = r[i + 1].wall_s - r[i].wall_s;
    if (!(d > 0)) continue;
    double inc = r[i + 1].value >= r[i].value ? r[i + 1].value - r[i].value : r[i + 1].value;
    p.samples.push_back({r[i].wall_s, inc, d});
  }
  return p;
}

}  // namespace cdp::loadgen
