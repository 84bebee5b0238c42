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

#include <boost/json/value.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <string_view>

#include "common/result.h"
#include "common/status.h"

namespace cdp::metrics {
class Registry;
}

namespace cdp::http {

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
};

struct Response {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";

  // `body` serialized as JSON.
  static Response Json(int status, const boost::json::value& body);
  // {"error": message}
  static Response Error(int status, std::string_view message);
};

// Handlers may throw; the exception becomes a 500 with its what() as the error.
using Handler = std::function<Response(const Request&)>;

struct ServerOptions {
  std::string host = "127.0.0.1";  // address to bind (IPv4 or IPv6 literal, or "localhost")
  uint16_t port = 0;               // 0 = ephemeral; see Server::port()
  size_t max_body_bytes = 1 << 20;
  size_t max_connections = 256;  // live connections; more are closed at once (common/listener.h)
  int threads = 1;
  uint64_t idle_timeout_ms = 30'000;  // also bounds reading one request and writing one response
  metrics::Registry* registry = nullptr;       // /metrics when set; must outlive the Server
  metrics::Registry* listener_registry = nullptr;  // the listener's connection counters go here when set
  std::function<boost::json::value()> status;  // /status when set
  std::vector<std::string> allowed_hosts;      // host names accepted in Host besides IP literals and "localhost"
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
  // method+path again replaces the handler. Only before Start().
  void Route(std::string method, std::string path, Handler handler);

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
