// SPDX-License-Identifier: Apache-2.0
// HTTP server: the operating and control surface of every daemon.
//
// One small HTTP/1.1 server (Boost.Beast over Asio, on its own io_context
// thread(s)) per daemon serves:
//   GET /metrics              Prometheus text of the daemon's metrics::Registry
//   GET /metrics?format=json  the same as JSON
//   GET /status               JSON from the daemon's status callback
//   <method> <path>           routes added with Route(): the control API (/v1/...)
// Anything else: 404 (unknown path) or 405 (known path, other method), JSON
// error body {"error": "..."}. A body larger than max_body_bytes: 413 and the
// connection is closed. Keep-alive is supported; idle connections are closed
// after idle_timeout_ms. "Expect: 100-continue" is answered.
//
// Authentication (ServerOptions::authenticate; common/http/control_token.h):
// without a valid bearer token a request gets 401 and reaches no handler;
// handlers see the Caller (admin, or one tenant) in Request::caller. Routes
// added with Access::kPublic are the exception: their handler authenticates.
//
// Against DNS rebinding and cross-site requests from a browser on the host:
//   - the Host header must name an IP literal, "localhost", or one of
//     ServerOptions::allowed_hosts (a page of evil.example rebound to
//     127.0.0.1 still sends "Host: evil.example"): else 403;
//   - a request with a body (or any Content-Type) must be application/json:
//     a form post (x-www-form-urlencoded, multipart, text/plain: the types a
//     page may send without asking) gets 415.
//
//   http::Server srv({.host = "127.0.0.1", .port = 9100, .registry = &reg,
//                     .status = [&] { return agent.StatusJson(); }});
//   srv.Route("POST", "/v1/volumes/*", [&](const http::Request& r) {
//     return http::Response::Json(200, {{"ok", true}});  // r.rest == "db1/tag"
//   });
//   CDP_RETURN_IF_ERROR(srv.Start());   // srv.port() is the bound port
//   ...
//   srv.Stop();
//
// Lifecycle:  constructed --Route()*--> --Start()--> serving --Stop()--> stopped
//
// Thread safety: Route() only before Start(). Start(), Stop() and port() from
// the owning thread. Handlers and the status callback run on the server's
// thread(s) (one at a time when threads == 1); they must be thread-safe with
// respect to the rest of the daemon and should not block for long.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp::metrics {
class Registry;
}
namespace cdp {
class TlsCredentials;
}

namespace cdp::http {

// Who sent a request, as ServerOptions::authenticate found it (common/http/control_token.h).
struct Caller {
  bool admin = false;  // an admin token: every object of the daemon
  std::string tenant;  // a tenant token: only this tenant's objects ("" for admin)
  // A read-only token (scope tenant-read): the router refuses it, with 403,
  // every request that changes state (ChangesState), before any handler.
  bool read_only = false;
  // An issued token's public id; "" for the daemon's own admin token;
  // "certificate:NAME" for a caller known by its client certificate.
  std::string token_id;
  // The one scope rule: the admin sees every tenant's objects, a tenant its own.
  bool Sees(const std::string& owner) const { return admin || owner == tenant; }
};

struct Request {
  std::string method;   // "GET", "POST", ...
  std::string target;   // as sent: "/v1/volumes/db1?x=1"
  std::string path;     // percent-decoded path: "/v1/volumes/db1"
  std::string rest;     // for a prefix route "/a/*": the part after "/a/"; else ""
  std::string query;    // raw query string after '?', "" if none
  std::map<std::string, std::string> params;  // decoded query parameters (last one wins)
  std::string body;
  std::string content_type;
  std::string host;  // the Host header as sent
  std::string authorization;  // the Authorization header as sent
  std::string cookie;         // the Cookie header as sent
  Caller caller;     // set when ServerOptions::authenticate accepted the request
  // Whether a token was accepted (always on kToken routes; on kSession routes
  // the handler decides what an anonymous request gets), and which: from the
  // bearer header, or on kSession routes from the session cookie.
  bool signed_in = false;
  std::string token;
  // The connection: over TLS (ServerOptions::tls), and the identity of the
  // client's certificate when it presented one (verified against the site
  // CA; common/crypto/pki.h): role "agent" | "ps" | "mt" | "admin" | "tenant",
  // tenant, name. Without a bearer token, a certificate of role admin is an
  // admin caller and one of role tenant its tenant's caller; the daemons' own
  // roles are no caller (the router; a protected host holds an agent's).
  bool tls = false;
  std::string cert_role, cert_tenant, cert_name;
};

struct Response {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  // More headers to send (name, value): Cache-Control, Content-Security-Policy, ...
  std::vector<std::pair<std::string, std::string>> headers;

  // `body` serialized as JSON.
  static Response Json(int status, const boost::json::value& body);
  // {"error": message}
  static Response Error(int status, std::string_view message);
};

// The parameters of a control request. A GET (or HEAD) takes them from the
// query string; any other method only from its JSON object body (an empty
// body is {}), never from the query string, so that no link or form can
// forge a state change. Every accessor answers a missing key with nullopt and
// a value of the wrong type with kInvalidArgument naming the key (a 400).
//
//   auto p = http::Params::Of(r, {"volume", "tenant", "seq"});
//   if (!p.ok()) return http::Response::Error(400, p.status().message());
//   auto seq = p->Uint("seq");   // Result<std::optional<uint64_t>>
class Params {
 public:
  // kInvalidArgument: a body that is not a JSON object, a query string on
  // anything but a GET, or a key outside `allowed` ("unknown parameter 'x'"; typos must not pass silently).
  static Result<Params> Of(const Request& r, std::initializer_list<std::string_view> allowed);

  Result<std::optional<std::string>> String(std::string_view key) const;
  // An integer (JSON number without fraction, or decimal digits in a query).
  Result<std::optional<int64_t>> Int(std::string_view key) const;
  Result<std::optional<uint64_t>> Uint(std::string_view key) const;
  Result<std::optional<double>> Number(std::string_view key) const;  // finite
  // JSON true/false; in a query "true", "false", "1" or "0".
  Result<std::optional<bool>> Bool(std::string_view key) const;

 private:
  bool from_query_ = false;
  std::map<std::string, std::string> query_;
  boost::json::object body_;
};

// The HTTP status of a Status: kNotFound 404, kInvalidArgument/kOutOfRange
// 400, kPermissionDenied 403, kBusy/kAlreadyExists 409, else 500; with the
// Status's message as the error.
Response ErrorResponse(const Status& s);

// Handlers may throw; the exception becomes a 500 with its what() as the error.
using Handler = std::function<Response(const Request&)>;

// Whether a request changes state: the one read-only rule. A caller with
// Caller::read_only gets 403 for such a request, from the router, before the
// handler runs. A route without its own test (the default) changes state for
// every method but GET and HEAD; a route whose POST is sometimes read-only (a
// read-only export) gives a test, e.g. ChangesStateWhenSet("writable").
using ChangesState = std::function<bool(const Request&)>;
// A test for a route that reads only unless its JSON body sets `key` to
// anything but false: true (changes state) when the key is present and not
// false, or when the body is not a JSON object (the handler then answers 400,
// but a read-only caller gets 403 first).
ChangesState ChangesStateWhenSet(std::string key);

// Who may reach a route's handler. kToken: only a request whose bearer token
// ServerOptions::authenticate accepts (else 401 before the handler). kPublic:
// every request (after the Host and Content-Type checks); Request::caller is
// then left empty and the handler decides (the dashboard's sign-out and its
// static files). Without ServerOptions::authenticate every caller is the
// admin on every route. kSession: a page of a browser session (the master target's dashboard): the
// bearer token, or else the session cookie, is checked here like kToken's;
// the handler runs either way and answers an anonymous request itself
// (Request::signed_in). Only for GETs of pages: a browser sends the cookie
// along with cross-site requests too, so nothing that changes state may
// honour it.
//
// Sessions: a sign-in route (kToken) calls Server::OpenSession with the
// caller's token and sets the cookie SessionCookie() returns. The cookie holds
// a random session id (256 bits), never the token: over HTTPS it is
// "__Host-cdp_session=ID; Path=/; Secure; HttpOnly; SameSite=Strict;
// Max-Age=LIFETIME" (the __Host- prefix: only this origin, only over TLS, no
// Domain), in plain HTTP (control_tls = off, loopback) "cdp_session=ID; ..."
// without Secure. A session lasts ServerOptions::session_lifetime_s from its
// opening; its token is checked again at every use, so revoking or expiring
// the token ends its sessions. At most kMaxSessions live: opening one more
// ends the oldest. Sessions live in memory: a restart signs every browser out.
enum class Access { kToken, kPublic, kSession };
inline constexpr std::string_view kSessionCookieTls = "__Host-cdp_session";
inline constexpr std::string_view kSessionCookiePlain = "cdp_session";
inline constexpr size_t kMaxSessions = 1024;

struct ServerOptions {
  std::string host = "127.0.0.1";  // address to bind (IPv4 or IPv6 literal, or "localhost")
  // HTTPS: every connection starts with a TLS 1.3 handshake with these
  // credentials (the site PKI, common/net/tls_stream.h; tls->Current() per
  // connection, so a reload applies to the next one). A client certificate is
  // requested and verified when sent, not required. A client speaking plain
  // HTTP gets no answer (the handshake fails and the connection is closed).
  // Must outlive the server. Null: plain HTTP.
  const TlsCredentials* tls = nullptr;
  uint16_t port = 0;               // 0 = ephemeral; see Server::port()
  size_t max_body_bytes = 1 << 20;
  // Live connections, in all and per peer address (0 = no per-peer cap). At
  // the total cap the oldest connection that has not yet sent a request with a
  // valid token is closed to admit a new one; over the per-peer cap a new
  // connection is closed at once (common/net/listener.h).
  size_t max_connections = 256;
  size_t max_connections_per_peer = 32;
  int threads = 1;
  uint64_t idle_timeout_ms = 30'000;  // also bounds reading one request and writing one response
  metrics::Registry* registry = nullptr;       // /metrics when set; must outlive the Server
  metrics::Registry* listener_registry = nullptr;  // the listener's connection counters go here when set
  std::function<boost::json::value()> status;  // /status when set
  std::vector<std::string> allowed_hosts;      // host names accepted in Host besides IP literals and "localhost"
  // When set, every request (routes, /status, and /metrics unless
  // metrics_public) must carry "Authorization: Bearer TOKEN" for which this
  // returns a Caller: else 401 with "WWW-Authenticate: Bearer" and the
  // failure's message (an unknown or an expired token; after the Host and
  // Content-Type checks, before any route runs). Unset: no authentication
  // (in-process tests; daemons log a warning when an operator turns it off).
  std::function<Result<Caller>(std::string_view token)> authenticate;
  bool metrics_public = false;  // /metrics without a token (the operator opted in)
  uint64_t session_lifetime_s = 8 * 3600;  // a browser session (Access::kSession) from its opening
  // The daemon's insecure settings in force ("tls = off", "control_auth = off",
  // ...; ApplyControlAuth adds the control port's): /status answers them as
  // "insecure": [...] (an object status only; absent when none), and Start() sets the gauge
  // cdp_insecure_setting{setting="..."} = 1 for each in `registry`, so that
  // cdpctl status, Prometheus and the dashboard show them, not one log line.
  std::vector<std::string> insecure;
};

class Server {
 public:
  explicit Server(ServerOptions opts);
  ~Server();  // Stop()s
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Adds a route. `path` is exact ("/v1/volumes"), or a prefix ending in "/*"
  // ("/v1/volumes/*" matches "/v1/volumes/db1/tag", Request::rest = "db1/tag").
  // Exact beats prefix; a longer prefix beats a shorter one. Adding the same
  // method+path again replaces the handler. `changes`: whether a request of
  // this route changes state, for read-only callers (null: every method but
  // GET and HEAD does). Only before Start().
  void Route(std::string method, std::string path, Handler handler, Access access = Access::kToken,
             ChangesState changes = nullptr);

  // A browser session for `token` (see Access::kSession): its Set-Cookie
  // value for `request` (the sign-in request: its TLS decides the cookie's
  // name and Secure), or kIOError when no random id can be made. Any thread,
  // also from a handler.
  Result<std::string> OpenSession(const Request& request, const std::string& token);
  // The Set-Cookie value that ends the session of `request`'s cookie (and
  // forgets the session).
  std::string EndSession(const Request& request);

  // Binds host:port, listens and starts the threads. Failure: kIOError /
  // kInvalidArgument naming host:port (port in use, bad address). Once only.
  Status Start();

  // The bound port (after a successful Start()), 0 before.
  uint16_t port() const { return port_; }

  // Stops accepting, closes every connection (in-flight requests are dropped)
  // and joins the threads. Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace cdp::http
