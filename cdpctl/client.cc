// SPDX-License-Identifier: Apache-2.0
// The HTTP client of every command and the JSON helpers (commands.h).
#include "cdpctl/commands.h"


#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "common/base/host_port.h"
#include "common/base/names.h"
#include "common/base/version.h"
#include "common/crypto/pki.h"
#include "common/crypto/seal.h"
#include "common/http/control_token.h"
#include "common/http/http_client.h"

namespace cdp::ctl {


Call Http(const Options& o, const Endpoint& ep, std::string_view method, const std::string& target,
          const json::value& body) {
  Call c;
  std::string payload = body.is_null() ? std::string() : json::serialize(body);
  http::ClientOptions co;
  co.bearer_token = ep.token;
  co.tls_ca = o.tls_ca;
  co.tls_cert = o.tls_cert;
  co.tls_key = o.tls_key;
  auto r = http::HttpRequest(ep.host, ep.port, method, target, payload, std::chrono::milliseconds(o.timeout_ms), co);
  if (!r.ok()) {
    c.error = r.status().ToString();
    return c;
  }
  c.reached = true;
  c.status = r->status;
  boost::system::error_code ec;
  c.body = json::parse(r->body, ec);
  if (ec) c.body = nullptr;
  if (c.status / 100 != 2) {
    const json::object* o2 = c.body.if_object();
    const json::value* e = o2 ? o2->if_contains("error") : nullptr;
    c.error = (e && e->is_string()) ? std::string(e->as_string()) : r->body;
  }
  return c;
}

std::string Where(const Endpoint& ep) { return ep.host + ":" + std::to_string(ep.port); }

// Percent-encodes a query value.
std::string Q(std::string_view s) {
  std::string out;
  for (unsigned char ch : s) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += char(ch);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", ch);
      out += buf;
    }
  }
  return out;
}

std::string TenantParam(const Options& o) { return o.tenant.empty() ? "" : "&tenant=" + Q(o.tenant); }

double Num(const json::object& o, std::string_view key, double dflt) {
  const json::value* v = o.if_contains(key);
  if (!v) return dflt;
  if (v->is_double()) return v->as_double();
  if (v->is_int64()) return double(v->as_int64());
  if (v->is_uint64()) return double(v->as_uint64());
  return dflt;
}

std::string Str(const json::object& o, std::string_view key, std::string dflt) {
  const json::value* v = o.if_contains(key);
  if (v && v->is_string()) return std::string(v->as_string());
  if (v && v->is_bool()) return v->as_bool() ? "yes" : "no";
  return dflt;
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

std::string Secs(double s) {
  char buf[32];
  if (s < 0) return "-";
  if (s < 120) std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%.0fm%02.0fs", std::floor(s / 60), std::fmod(s, 60));
  else std::snprintf(buf, sizeof buf, "%.1fh", s / 3600);
  return buf;
}

const json::array* Volumes(const json::value& body) {
  const json::object* o = body.if_object();
  if (!o) return nullptr;
  const json::value* v = o->if_contains("volumes");
  return v ? v->if_array() : nullptr;
}


int Fail(std::ostream& err, const std::string& what, const Call& c) {
  err << "cdpctl: " << what << ": " << (c.error.empty() ? "HTTP " + std::to_string(c.status) : c.error) << "\n";
  return 1;
}


// POINT is an id from `points`, "seq:N" for an exact sequence, a UTC time
// (the newest point written at or before it), or a tag's name.
json::object PointArg(const std::string& volume, const std::string& point, const Options& o) {
  json::object b{{"volume", volume}};
  if (!o.tenant.empty()) b["tenant"] = o.tenant;
  // Numbers go as JSON numbers; anything else as given, for the daemon's 400 naming it.
  auto number = [](std::string_view t) -> json::value {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (!t.empty() && ec == std::errc() && p == t.data() + t.size()) return v;
    return json::string(t);
  };
  // A UTC time (YYYY-MM-DDTHH:MM...): the newest point written at or before it.
  const bool is_time = point.size() >= 10 && point[4] == '-' && point[7] == '-' &&
                       std::all_of(point.begin(), point.begin() + 4, [](char ch) { return ch >= '0' && ch <= '9'; });
  if (point.rfind("seq:", 0) == 0) {
    b["seq"] = number(std::string_view(point).substr(4));
  } else if (is_time) {
    b["time"] = point;
  } else if (json::value n = number(point); n.is_int64()) {
    b["point"] = n;
  } else {
    b["tag"] = point;
  }
  return b;
}

// A recovery point's URI, cdp://TENANT/VOLUME@POINT (POINT as for export:
// an id, seq:N or a tag name): the tenant and VOLUME@POINT. False when
// `uri` is not one.
bool ParsePointUri(const std::string& uri, std::string* tenant, std::string* spec) {
  constexpr std::string_view kScheme = "cdp://";
  if (uri.rfind(kScheme, 0) != 0) return false;
  const std::string rest = uri.substr(kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string::npos || !ValidName(rest.substr(0, slash))) return false;
  *tenant = rest.substr(0, slash);
  *spec = rest.substr(slash + 1);
  return spec->find('@') != std::string::npos;
}

}  // namespace cdp::ctl
