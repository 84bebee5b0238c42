// SPDX-License-Identifier: Apache-2.0
#include "common/http/http_router.h"

#include <openssl/rand.h>

#include <boost/asio/ip/address.hpp>
#include <boost/json.hpp>
#include <cctype>
#include <map>
#include <optional>

#include "common/base/log.h"
#include "common/daemon/metrics.h"

namespace cdp::http::detail {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::map<std::string, std::string> ParseQuery(std::string_view q) {
  std::map<std::string, std::string> out;
  while (!q.empty()) {
    size_t amp = q.find('&');
    std::string_view part = q.substr(0, amp);
    q.remove_prefix(amp == std::string_view::npos ? q.size() : amp + 1);
    if (part.empty()) continue;
    size_t eq = part.find('=');
    std::string key = PercentDecode(part.substr(0, eq), true);
    std::string value = eq == std::string_view::npos ? std::string() : PercentDecode(part.substr(eq + 1), true);
    out[std::move(key)] = std::move(value);
  }
  return out;
}

// The host part of a Host header ("127.0.0.1:9100" -> "127.0.0.1",
// "[::1]:9100" -> "::1", "localhost" -> "localhost").
std::string HostPart(std::string_view h) {
  if (!h.empty() && h.front() == '[') {
    size_t close = h.find(']');
    return close == std::string_view::npos ? std::string() : std::string(h.substr(1, close - 1));
  }
  size_t colon = h.find(':');
  return std::string(h.substr(0, colon));
}

}  // namespace

void LimitRequestParser(RequestParser& parser, size_t max_body_bytes) {
  parser.header_limit(kHeaderLimit);
  parser.body_limit(max_body_bytes);
}

bool BodyTooLarge(const RequestParser& parser, size_t max_body_bytes) {
  auto len = parser.content_length();
  return len && *len > max_body_bytes;
}

std::string PercentDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += char(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += (plus_is_space && s[i] == '+') ? ' ' : s[i];
  }
  return out;
}

Request ToRequest(bhttp::request<bhttp::string_body>& parsed) {
  Request req;
  req.method = std::string(parsed.method_string());
  req.target = std::string(parsed.target());
  std::string_view target(req.target);
  size_t q = target.find('?');
  req.path = PercentDecode(target.substr(0, q), false);
  if (q != std::string_view::npos) {
    req.query = std::string(target.substr(q + 1));
    req.params = ParseQuery(req.query);
  }
  req.body = std::move(parsed.body());
  req.content_type = std::string(parsed[bhttp::field::content_type]);
  req.host = std::string(parsed[bhttp::field::host]);
  req.authorization = std::string(parsed[bhttp::field::authorization]);
  req.cookie = std::string(parsed[bhttp::field::cookie]);
  return req;
}

std::string_view BearerToken(std::string_view authorization) {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() <= kBearer.size() || !EqualsIgnoreCase(authorization.substr(0, kBearer.size()), kBearer)) {
    return {};
  }
  return authorization.substr(kBearer.size());
}

// The caller a client certificate stands for (verified against the site CA by
// the TLS handshake; Request::cert_*): role admin is an admin, role tenant its
// tenant. The daemons' own roles (agent, ps, mt) carry no control authority:
// a compromised protected host holds an agent certificate.
std::optional<Caller> CertificateCaller(const Request& req) {
  if (!req.tls) return std::nullopt;
  Caller c;
  c.token_id = "certificate:" + req.cert_name;
  if (req.cert_role == "admin") {
    c.admin = true;
    return c;
  }
  if (req.cert_role == "tenant" && !req.cert_tenant.empty()) {
    c.tenant = req.cert_tenant;
    return c;
  }
  return std::nullopt;
}

std::string CookieValue(std::string_view header, std::string_view name) {
  while (!header.empty()) {
    size_t end = header.find(';');
    std::string_view item = header.substr(0, end);
    header = end == std::string_view::npos ? std::string_view() : header.substr(end + 1);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    size_t eq = item.find('=');
    if (eq != std::string_view::npos && item.substr(0, eq) == name) return std::string(item.substr(eq + 1));
  }
  return "";
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

bool HostAllowed(std::string_view host_header, const std::vector<std::string>& allowed) {
  const std::string host = HostPart(host_header);
  if (host.empty()) return false;
  boost::system::error_code ec;
  (void)boost::asio::ip::make_address(host, ec);
  if (!ec) return true;  // an IP literal: no name to rebind
  std::string lower;
  for (char c : host) lower += char(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "localhost") return true;
  for (const std::string& a : allowed) {
    if (lower == a) return true;
  }
  return false;
}

bool IsJson(std::string_view content_type) {
  std::string_view t = content_type.substr(0, content_type.find(';'));
  while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
  std::string lower;
  for (char c : t) lower += char(std::tolower(static_cast<unsigned char>(c)));
  return lower == "application/json";
}

void Router::Add(std::string method, std::string path, Handler handler, Access access, ChangesState changes) {
  Entry e;
  e.method = std::move(method);
  e.changes = std::move(changes);
  e.access = access;
  if (path.size() >= 2 && path.compare(path.size() - 2, 2, "/*") == 0) {
    e.prefix = true;
    path.pop_back();  // keep the trailing '/'
  }
  e.path = std::move(path);
  e.handler = std::move(handler);
  for (Entry& r : routes_) {
    if (r.method == e.method && r.path == e.path && r.prefix == e.prefix) {
      r = std::move(e);
      return;
    }
  }
  routes_.push_back(std::move(e));
}

Response Router::Dispatch(Request& req) const {
  if (!HostAllowed(req.host, opts_.allowed_hosts)) {
    return Response::Error(403, "Host header '" + req.host + "' is not allowed (IP literals, localhost, allowed_hosts)");
  }
  if ((!req.body.empty() || !req.content_type.empty()) && !IsJson(req.content_type)) {
    return Response::Error(415, "request bodies must be application/json, not '" + req.content_type + "'");
  }
  const Entry* best = nullptr;
  bool path_known = false;
  for (const Entry& r : routes_) {
    bool match = r.prefix ? (req.path.size() > r.path.size() && req.path.compare(0, r.path.size(), r.path) == 0)
                          : req.path == r.path;
    if (!match) continue;
    path_known = true;
    if (r.method != req.method) continue;
    if (best == nullptr || (best->prefix && !r.prefix) ||
        (best->prefix && r.prefix && r.path.size() > best->path.size())) {
      best = &r;
    }
  }
  const Access access = best != nullptr ? best->access : Access::kToken;
  if (opts_.authenticate && access == Access::kPublic) {
    // The handler decides; it sees no caller.
  } else if (opts_.authenticate && access == Access::kSession) {
    // A bearer header wins; only without one does the session cookie count.
    std::string token(BearerToken(req.authorization));
    if (token.empty()) token = SessionToken(SessionId(req), std::chrono::steady_clock::now());
    if (!token.empty()) {
      if (auto caller = opts_.authenticate(token); caller.ok()) {
        req.caller = std::move(*caller);
        req.signed_in = true;
        req.token = std::move(token);
      }
    } else if (auto caller = CertificateCaller(req)) {
      req.caller = std::move(*caller);
      req.signed_in = true;
    }
  } else if (opts_.authenticate && !(opts_.metrics_public && req.path == "/metrics")) {
    std::string_view token = BearerToken(req.authorization);
    std::optional<Caller> by_cert = token.empty() ? CertificateCaller(req) : std::nullopt;
    if (token.empty() && !by_cert) {
      return Response::Error(401,
                             "a control token is required (Authorization: Bearer TOKEN; cdpctl --token-file), or a "
                             "client certificate of role admin or tenant (cdpctl --tls-cert, --tls-key)");
    }
    Result<Caller> caller = by_cert ? Result<Caller>(std::move(*by_cert)) : opts_.authenticate(token);
    if (!caller.ok()) return Response::Error(401, caller.status().message());
    req.caller = std::move(*caller);
    req.signed_in = true;
    req.token = std::string(token);
  } else {
    req.caller.admin = true;  // no authentication configured: the only caller is the operator
    req.signed_in = true;
    req.token = std::string(BearerToken(req.authorization));
  }
  try {
    const bool daemon_wide = (req.path == "/metrics" && !opts_.metrics_public) || req.path == "/status";
    if (daemon_wide && opts_.authenticate && !req.caller.admin) {
      return Response::Error(403, req.path + " covers every tenant: it needs an admin token");
    }
    if (req.path == "/metrics" && opts_.registry != nullptr) {
      if (req.method != "GET") return Response::Error(405, "method " + req.method + " not allowed on /metrics");
      auto f = req.params.find("format");
      if (f != req.params.end() && f->second == "json") return Response::Json(200, opts_.registry->RenderJson());
      Response r;
      r.body = opts_.registry->RenderPrometheus();
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      return r;
    }
    if (req.path == "/status" && opts_.status) {
      if (req.method != "GET") return Response::Error(405, "method " + req.method + " not allowed on /status");
      boost::json::value st = opts_.status();
      if (st.is_object() && !opts_.insecure.empty()) {
        boost::json::array insecure;
        for (const std::string& x : opts_.insecure) insecure.push_back(boost::json::value(x));
        st.as_object()["insecure"] = std::move(insecure);
      }
      return Response::Json(200, st);
    }
    if (best == nullptr) {
      if (path_known) return Response::Error(405, "method " + req.method + " not allowed on " + req.path);
      return Response::Error(404, "no such path: " + req.path);
    }
    // The one read-only rule (Caller::read_only): before any handler.
    if (req.caller.read_only) {
      const bool changes = best->changes ? best->changes(req) : !(req.method == "GET" || req.method == "HEAD");
      if (changes) {
        return Response::Error(403, req.method + " " + req.path +
                                        " changes state: this token is read-only (scope tenant-read)");
      }
    }
    if (best->prefix) req.rest = req.path.substr(best->path.size());
    return best->handler(req);
  } catch (const std::exception& e) {
    cdp::log::Get("http")->error("{} {}: handler failed: {}", req.method, req.path, e.what());
    return Response::Error(500, e.what());
  }
}

std::string Router::SessionId(const Request& req) {
  // Over TLS only the __Host- cookie counts; a plain-HTTP cookie of the same
  // host (any web server there may set one) never does.
  return CookieValue(req.cookie, req.tls ? kSessionCookieTls : kSessionCookiePlain);
}

Result<std::string> Router::OpenSession(const std::string& token, std::chrono::steady_clock::time_point now) {
  uint8_t raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) return Status::IOError("session id: the random generator failed");
  static const char* kHex = "0123456789abcdef";
  std::string id;
  for (uint8_t b : raw) id += {kHex[b >> 4], kHex[b & 15]};
  std::lock_guard<std::mutex> lk(session_mu_);
  while (sessions_.size() >= kMaxSessions && !session_order_.empty()) {
    sessions_.erase(session_order_.front());
    session_order_.pop_front();
  }
  sessions_[id] = Session{token, now + std::chrono::seconds(opts_.session_lifetime_s)};
  session_order_.push_back(id);
  if (session_order_.size() > 2 * kMaxSessions) {  // drop ids of sessions already ended
    std::erase_if(session_order_, [&](const std::string& x) { return sessions_.count(x) == 0; });
  }
  return id;
}

std::string Router::SessionToken(const std::string& id, std::chrono::steady_clock::time_point now) const {
  if (id.empty()) return "";
  std::lock_guard<std::mutex> lk(session_mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return "";
  if (now >= it->second.expires) {
    sessions_.erase(it);
    return "";
  }
  return it->second.token;
}

void Router::EndSession(const std::string& id) {
  std::lock_guard<std::mutex> lk(session_mu_);
  sessions_.erase(id);
}

}  // namespace cdp::http::detail

namespace cdp::http {

ChangesState ChangesStateWhenSet(std::string key) {
  return [key = std::move(key)](const Request& r) {
    if (r.body.empty()) return false;  // an empty body is {}
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(r.body, ec);
    if (ec || !v.is_object()) return true;
    const boost::json::value* x = v.as_object().if_contains(key);
    return x != nullptr && !(x->is_bool() && !x->as_bool());
  };
}

}  // namespace cdp::http
