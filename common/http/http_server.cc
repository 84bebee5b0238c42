// SPDX-License-Identifier: Apache-2.0
#include "common/http/http_server.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <boost/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include <openssl/ssl.h>

#include <boost/asio/ssl.hpp>
#include <type_traits>

#include "common/base/asio_status.h"
#include "common/crypto/pki.h"
#include "common/base/log.h"
#include "common/daemon/metrics.h"
#include "common/http/http_detail.h"
#include "common/http/http_router.h"
#include "common/net/listener.h"
#include "common/net/tls_stream.h"

namespace cdp::http {

using namespace detail;

namespace {

// After a 413 the client may still be sending: read and discard up to this
// much (for at most kDrainTime) so that closing does not reset the connection
// before the client has read the answer.
constexpr size_t kDrainLimit = 64 << 20;
constexpr auto kDrainTime = std::chrono::seconds(2);

}  // namespace

Response Response::Json(int status, const boost::json::value& body) {
  Response r;
  r.status = status;
  r.body = boost::json::serialize(body);
  r.content_type = "application/json";
  return r;
}

Response Response::Error(int status, std::string_view message) {
  return Json(status, boost::json::object{{"error", message}});
}

// ---------------------------------------------------------------- Params

Result<Params> Params::Of(const Request& r, std::initializer_list<std::string_view> allowed) {
  Params p;
  auto check = [&](std::string_view key) -> Status {
    for (std::string_view a : allowed) {
      if (a == key) return Status::OK();
    }
    return Status::InvalidArgument("unknown parameter '" + std::string(key) + "'");
  };
  if (r.method == "GET" || r.method == "HEAD") {
    p.from_query_ = true;
    p.query_ = r.params;
    for (const auto& [k, v] : p.query_) CDP_RETURN_IF_ERROR(check(k));
    return p;
  }
  if (!r.params.empty()) {
    return Status::InvalidArgument("the parameters of a " + r.method + " go in its JSON body, not in the query string");
  }
  if (!r.body.empty()) {
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(r.body, ec);
    if (ec || !v.is_object()) return Status::InvalidArgument("the request body must be a JSON object");
    p.body_ = std::move(v.as_object());
  }
  for (const auto& kv : p.body_) CDP_RETURN_IF_ERROR(check(kv.key()));
  return p;
}

namespace {
Status BadValue(std::string_view key, const char* want) {
  return Status::InvalidArgument("parameter '" + std::string(key) + "' must be " + want);
}
}  // namespace

Result<std::optional<std::string>> Params::String(std::string_view key) const {
  if (from_query_) {
    auto it = query_.find(std::string(key));
    if (it == query_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }
  const boost::json::value* v = body_.if_contains(key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return BadValue(key, "a string");
  return std::optional<std::string>(std::string(v->as_string()));
}

namespace {

// One number parameter as T: decimal text in a query, a JSON number the value
// fits exactly (boost::json's to_number refuses 1.5 as an integer, -1 as unsigned).
template <typename T>
Result<std::optional<T>> NumberParam(bool from_query, const std::map<std::string, std::string>& query,
                                     const boost::json::object& body, std::string_view key, const char* want) {
  T x{};
  if (from_query) {
    auto it = query.find(std::string(key));
    if (it == query.end()) return std::optional<T>();
    const std::string& t = it->second;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), x);
    if (t.empty() || ec != std::errc() || end != t.data() + t.size()) return BadValue(key, want);
  } else {
    const boost::json::value* v = body.if_contains(key);
    if (v == nullptr) return std::optional<T>();
    boost::system::error_code ec;
    x = v->is_number() ? v->to_number<T>(ec) : T{};
    if (!v->is_number() || ec) return BadValue(key, want);
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(x)) return BadValue(key, "a finite number");
  }
  return std::optional<T>(x);
}

}  // namespace

Result<std::optional<int64_t>> Params::Int(std::string_view key) const {
  return NumberParam<int64_t>(from_query_, query_, body_, key, "an integer");
}

Result<std::optional<uint64_t>> Params::Uint(std::string_view key) const {
  return NumberParam<uint64_t>(from_query_, query_, body_, key, "a non-negative integer");
}

Result<std::optional<double>> Params::Number(std::string_view key) const {
  return NumberParam<double>(from_query_, query_, body_, key, "a number");
}

Result<std::optional<bool>> Params::Bool(std::string_view key) const {
  if (from_query_) {
    auto it = query_.find(std::string(key));
    if (it == query_.end()) return std::optional<bool>();
    if (it->second == "true" || it->second == "1") return std::optional<bool>(true);
    if (it->second == "false" || it->second == "0") return std::optional<bool>(false);
    return BadValue(key, "true or false");
  }
  const boost::json::value* v = body_.if_contains(key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_bool()) return BadValue(key, "true or false");
  return std::optional<bool>(v->as_bool());
}

Response ErrorResponse(const Status& s) {
  int status = 500;
  switch (s.code()) {
    case Code::kNotFound: status = 404; break;
    case Code::kInvalidArgument:
    case Code::kOutOfRange: status = 400; break;
    case Code::kPermissionDenied: status = 403; break;
    case Code::kBusy:
    case Code::kAlreadyExists: status = 409; break;
    default: break;
  }
  return Response::Error(status, s.message());
}

// ---------------------------------------------------------------- Server::Impl

// The server's state; Session sees it through this type (Server::Impl is private).
struct ServerState {
  explicit ServerState(ServerOptions o) : opts(std::move(o)), router(opts) {}

  ServerOptions opts;
  Router router;  // refers to opts
  std::unique_ptr<net::io_context> ioc;
  std::unique_ptr<Listener> listener;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;  // keeps run() going
  std::vector<std::thread> threads;
  bool started = false;
  bool stopped = false;
  std::shared_ptr<spdlog::logger> log = cdp::log::Get("http");

  void OnConnection(Listener::Connection c);
};

struct Server::Impl : ServerState {
  using ServerState::ServerState;
};

namespace {

// One connection: HTTP/1.1 over `Stream` — beast::tcp_stream, or TLS over it
// (asio::ssl::stream, handshake first; ServerOptions::tls).
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  // `slot` holds the connection's place under the listener's caps until the session ends.
  Session(Stream stream, ServerState* srv, Listener::Slot slot)
      : stream_(std::move(stream)), srv_(srv), slot_(std::move(slot)) {}

  void Start() {
    if constexpr (kTls) {
      // The handshake is bounded like a request: a client that never
      // finishes it is closed after idle_timeout_ms.
      Lowest().expires_after(std::chrono::milliseconds(srv_->opts.idle_timeout_ms));
      stream_.async_handshake(net::ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
        if (ec) return self->Close();  // plain HTTP, another CA, a revoked or expired certificate: nothing to answer
        self->ReadPeer();
        self->DoReadHeader();
      });
    } else {
      DoReadHeader();
    }
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  // The client's certificate, when it presented one (verified against the site CA).
  void ReadPeer() {
    if constexpr (kTls) {
      X509* cert = SSL_get1_peer_certificate(stream_.native_handle());
      if (cert == nullptr) return;
      auto id = pki::IdentityOf(cert);
      if (!id.ok()) {
        X509_free(cert);
        return;
      }
      peer_.role = std::string(pki::RoleName(id->role));
      peer_.tenant = id->tenant;
      peer_.name = id->name;
      peer_.serial = pki::SerialHex(cert);
      X509_free(cert);
    }
  }

  void DoReadHeader() {
    parser_.emplace();
    LimitRequestParser(*parser_, srv_->opts.max_body_bytes);
    Lowest().expires_after(std::chrono::milliseconds(srv_->opts.idle_timeout_ms));
    bhttp::async_read_header(stream_, buf_, *parser_,
                             [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    // Beast checks Content-Length against the body limit with the header.
    if (ec == bhttp::error::body_limit) return TooLarge();
    if (ec) return Close();  // end of stream, timeout, garbage: nothing to answer
    auto& req = parser_->get();
    if (BodyTooLarge(*parser_, srv_->opts.max_body_bytes)) return TooLarge();
    if (req[bhttp::field::expect] == "100-continue") {
      cont_.emplace(bhttp::status::continue_, req.version());
      bhttp::async_write(stream_, *cont_, [self = this->shared_from_this()](beast::error_code ec2, size_t) {
        if (ec2) return self->Close();
        self->DoReadBody();
      });
      return;
    }
    DoReadBody();
  }

  void DoReadBody() {
    bhttp::async_read(stream_, buf_, *parser_,
                      [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) return TooLarge();
    if (ec) return Close();
    auto& preq = parser_->get();
    // A certificate revoked (and the list reloaded) since the handshake ends
    // its connection before another request, as the data links end sessions.
    if (!peer_.name.empty() && srv_->opts.tls != nullptr && !srv_->opts.tls->Distrusted(peer_).empty()) {
      return Close();
    }
    Request req = ToRequest(preq);
    req.tls = kTls;
    req.cert_role = peer_.role;
    req.cert_tenant = peer_.tenant;
    req.cert_name = peer_.name;
    Response r = srv_->router.Dispatch(req);
    // A valid token (or no authentication configured): the listener no
    // longer evicts this connection at its cap.
    if (req.signed_in) slot_.MarkAuthenticated();
    Send(r, preq.version(), preq.keep_alive());
  }

  void Send(const Response& r, unsigned version, bool keep_alive) {
    res_.emplace(static_cast<bhttp::status>(r.status), version);
    res_->set(bhttp::field::server, "opencdp");
    res_->set(bhttp::field::content_type, r.content_type);
    if (r.status == 401) res_->set(bhttp::field::www_authenticate, "Bearer");
    if (kTls) res_->set(bhttp::field::strict_transport_security, "max-age=31536000");
    for (const auto& [name, value] : r.headers) res_->set(name, value);
    res_->keep_alive(keep_alive);
    res_->body() = r.body;
    res_->prepare_payload();
    Lowest().expires_after(std::chrono::milliseconds(srv_->opts.idle_timeout_ms));
    bhttp::async_write(stream_, *res_, [self = this->shared_from_this(), keep_alive](beast::error_code ec, size_t) {
      if (ec) return self->Close();
      if (!keep_alive) return self->Close();
      self->DoReadHeader();
    });
  }

  // 413, then a lingering close.
  void TooLarge() {
    Response r = Response::Error(413, "request body larger than " + std::to_string(srv_->opts.max_body_bytes) + " bytes");
    unsigned version = parser_->get().version() != 0 ? parser_->get().version() : 11;
    res_.emplace(bhttp::status::payload_too_large, version);
    res_->set(bhttp::field::server, "opencdp");
    res_->set(bhttp::field::content_type, r.content_type);
    res_->keep_alive(false);
    res_->body() = r.body;
    res_->prepare_payload();
    Lowest().expires_after(std::chrono::milliseconds(srv_->opts.idle_timeout_ms));
    bhttp::async_write(stream_, *res_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->Close();
      if constexpr (kTls) return self->Close();  // no half-close under TLS
      beast::error_code ignored;
      self->Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
      self->Lowest().expires_after(kDrainTime);
      self->Drain();
    });
  }

  void Drain() {
    drain_buf_.resize(64 << 10);
    stream_.async_read_some(net::buffer(drain_buf_), [self = this->shared_from_this()](beast::error_code ec, size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > kDrainLimit) return self->Close();
      self->Drain();
    });
  }

  void Close() {
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Lowest().close();
  }

  Stream stream_;
  ServerState* srv_;
  Listener::Slot slot_;
  TlsPeer peer_;  // the client's certificate; empty name when it sent none
  beast::flat_buffer buf_;
  std::optional<RequestParser> parser_;
  std::optional<bhttp::response<bhttp::empty_body>> cont_;
  std::optional<bhttp::response<bhttp::string_body>> res_;
  std::vector<char> drain_buf_;
  size_t drained_ = 0;
};

using TlsStream = net::ssl::stream<beast::tcp_stream>;

}  // namespace

void ServerState::OnConnection(Listener::Connection c) {
  tcp::socket socket(net::make_strand(*ioc));
  if (Status st = AssignTo(c, socket); !st.ok()) {
    log->warn("accept: {}", st.ToString());
    return;
  }
  if (opts.tls == nullptr) {
    std::make_shared<Session<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), this, std::move(c.slot))->Start();
    return;
  }
  // The site's credentials as they are now (a SIGHUP reload applies to the
  // next connection). A client certificate is asked for, not required:
  // callers without one authenticate with a token.
  SSL* ssl = SSL_new(opts.tls->Current()->native());
  if (ssl == nullptr) {
    log->warn("accept: SSL_new: {}", pki::OpenSslErrors());
    return;
  }
  SSL_set_verify(ssl, SSL_VERIFY_PEER, nullptr);
  std::make_shared<Session<TlsStream>>(TlsStream(beast::tcp_stream(std::move(socket)), ssl), this, std::move(c.slot))
      ->Start();
}

// ---------------------------------------------------------------- Server

Server::Server(ServerOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {}

Server::~Server() { Stop(); }

Result<std::string> Server::OpenSession(const Request& request, const std::string& token) {
  CDP_ASSIGN_OR_RETURN(std::string id, impl_->router.OpenSession(token, std::chrono::steady_clock::now()));
  return std::string(request.tls ? kSessionCookieTls : kSessionCookiePlain) + "=" + id + "; Path=/; " +
         (request.tls ? "Secure; " : "") + "HttpOnly; SameSite=Strict; Max-Age=" +
         std::to_string(impl_->opts.session_lifetime_s);
}

std::string Server::EndSession(const Request& request) {
  impl_->router.EndSession(detail::Router::SessionId(request));
  return std::string(request.tls ? kSessionCookieTls : kSessionCookiePlain) + "=; Path=/; " +
         (request.tls ? "Secure; " : "") + "HttpOnly; SameSite=Strict; Max-Age=0";
}

void Server::Route(std::string method, std::string path, Handler handler, Access access, ChangesState changes) {
  impl_->router.Add(std::move(method), std::move(path), std::move(handler), access, std::move(changes));
}

Status Server::Start() {
  Impl& im = *impl_;
  std::string where = im.opts.host + ":" + std::to_string(im.opts.port);
  if (im.started) return Status::InvalidArgument("http server " + where + " already started");
  if (im.opts.threads < 1) return Status::InvalidArgument("http server " + where + ": threads must be >= 1");
  if (im.opts.registry != nullptr) {
    for (const std::string& x : im.opts.insecure) {
      im.opts.registry
          ->GetGauge("cdp_insecure_setting", "An insecure setting in force at this daemon (1)", {{"setting", x}})
          ->Set(1);
    }
  }
  im.ioc = std::make_unique<net::io_context>(im.opts.threads);
  im.work.emplace(im.ioc->get_executor());
  Listener::Options lo;
  lo.name = "http";
  lo.tcp = HostPort{im.opts.host, im.opts.port};
  lo.max_connections = im.opts.max_connections;
  lo.max_per_peer = im.opts.max_connections_per_peer;
  lo.registry = im.opts.listener_registry;
  im.listener = std::make_unique<Listener>(lo, [&im](Listener::Connection c) { im.OnConnection(std::move(c)); });
  if (Status st = im.listener->Start(); !st.ok()) return st.WithContext("http server");
  port_ = im.listener->tcp_port();
  im.started = true;
  for (int i = 0; i < im.opts.threads; ++i) im.threads.emplace_back([ioc = im.ioc.get()] { ioc->run(); });
  im.log->info("http server listening on {}:{}{}", im.opts.host, port_,
               im.opts.tls ? " (HTTPS, TLS 1.3, the site CA)" : " (plain HTTP)");
  return Status::OK();
}

void Server::Stop() {
  Impl& im = *impl_;
  if (!im.started || im.stopped) return;
  im.stopped = true;
  im.listener->Stop();
  im.work.reset();
  im.ioc->stop();
  for (auto& t : im.threads) t.join();
  im.threads.clear();
  // Destroying the io_context destroys the pending handlers, and with them the
  // sessions: every connection is closed here.
  im.ioc.reset();
  im.listener.reset();
}

}  // namespace cdp::http
