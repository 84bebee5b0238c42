// SPDX-License-Identifier: Apache-2.0
// common/http/http_router.h without a socket: parsing with the server's limits,
// decoding, the Host and content-type checks and route precedence.
#include "common/http/http_router.h"

#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <optional>
#include <stdexcept>
#include <string>

using namespace cdp::http;
using namespace cdp::http::detail;

namespace {

// Parses `raw` as the server does; false if it is not one complete request.
bool Parse(const std::string& raw, size_t max_body, Request* out, bool* too_large = nullptr) {
  RequestParser p;
  LimitRequestParser(p, max_body);
  p.eager(true);
  beast::error_code ec;
  p.put(net::buffer(raw), ec);
  if (too_large != nullptr) *too_large = ec == bhttp::error::body_limit || (p.is_header_done() && BodyTooLarge(p, max_body));
  if (ec || !p.is_done()) return false;
  *out = ToRequest(p.get());
  return true;
}

}  // namespace

TEST_CASE("ToRequest decodes the path and the query", "[http]") {
  Request r;
  REQUIRE(Parse("GET /v1/a%20b/c?x=1+2&y=%2F&x=3&&z HTTP/1.1\r\nHost: localhost:9\r\n\r\n", 1024, &r));
  CHECK(r.method == "GET");
  CHECK(r.path == "/v1/a b/c");
  CHECK(r.query == "x=1+2&y=%2F&x=3&&z");
  CHECK(r.params.at("x") == "3");
  CHECK(r.params.at("y") == "/");
  CHECK(r.params.at("z").empty());
  CHECK(r.host == "localhost:9");
  CHECK(PercentDecode("%4", false) == "%4");
  CHECK(PercentDecode("%zz+", true) == "%zz ");
}

TEST_CASE("the server's body limit applies while parsing", "[http]") {
  Request r;
  bool too_large = false;
  CHECK_FALSE(Parse("POST /x HTTP/1.1\r\nHost: 1.2.3.4\r\nContent-Length: 11\r\n\r\n01234567890", 10, &r, &too_large));
  CHECK(too_large);
  CHECK(Parse("POST /x HTTP/1.1\r\nHost: 1.2.3.4\r\nContent-Length: 10\r\n\r\n0123456789", 10, &r, &too_large));
  CHECK_FALSE(too_large);
}

TEST_CASE("HostAllowed and IsJson", "[http]") {
  CHECK(HostAllowed("127.0.0.1:9100", {}));
  CHECK(HostAllowed("[::1]:9100", {}));
  CHECK(HostAllowed("LocalHost", {}));
  CHECK(HostAllowed("cdp.example:1", {"cdp.example"}));
  CHECK_FALSE(HostAllowed("evil.example", {"cdp.example"}));
  CHECK_FALSE(HostAllowed("[::1", {}));
  CHECK_FALSE(HostAllowed("", {}));
  CHECK(IsJson("Application/JSON ; charset=utf-8"));
  CHECK_FALSE(IsJson("text/plain"));
}

TEST_CASE("Router: checks, precedence, 404, 405, 500", "[http]") {
  ServerOptions o;
  o.allowed_hosts = {"cdp.example"};
  Router router(o);
  auto named = [](std::string n) {
    return [n](const Request& r) { return Response::Json(200, {{"h", n}, {"rest", r.rest}}); };
  };
  router.Add("GET", "/v1/*", named("short"));
  router.Add("GET", "/v1/volumes/*", named("long"));
  router.Add("GET", "/v1/volumes/db1", named("exact"));
  router.Add("POST", "/v1/throw", [](const Request&) -> Response { throw std::runtime_error("boom"); });
  auto call = [&](std::string method, std::string path, std::string host = "localhost",
                  std::string ctype = "") {
    Request r;
    r.method = std::move(method);
    r.path = std::move(path);
    r.host = std::move(host);
    r.content_type = std::move(ctype);
    Response resp = router.Dispatch(r);
    return std::make_pair(resp.status, resp.status == 200 ? boost::json::parse(resp.body).as_object() : boost::json::object{});
  };
  CHECK(call("GET", "/v1/volumes/db1").second.at("h") == "exact");
  auto [s1, b1] = call("GET", "/v1/volumes/db2/tag");
  CHECK(b1.at("h") == "long");
  CHECK(b1.at("rest") == "db2/tag");
  CHECK(call("GET", "/v1/x").second.at("h") == "short");
  CHECK(call("GET", "/v1/").first == 404);  // a prefix needs something after it
  CHECK(call("DELETE", "/v1/volumes/db1").first == 405);
  CHECK(call("GET", "/nope").first == 404);
  CHECK(call("POST", "/v1/throw", "localhost", "application/json").first == 500);
  CHECK(call("GET", "/v1/x", "evil.example").first == 403);
  CHECK(call("POST", "/v1/throw", "localhost", "text/plain").first == 415);
}

TEST_CASE("Router: a public route reaches its handler without a token, every other route still needs one",
          "[http]") {
  ServerOptions o;
  o.authenticate = [](std::string_view token) -> cdp::Result<Caller> {
    if (token == "good") return Caller{false, "acme", false, ""};
    return cdp::Status::PermissionDenied("the control token is not valid here");
  };
  Router router(o);
  router.Add("GET", "/v1/x", [](const Request& r) { return Response::Json(200, {{"tenant", r.caller.tenant}}); });
  router.Add("GET", "/ui", [](const Request& r) {
    Response resp = Response::Json(200, {{"tenant", r.caller.tenant}, {"cookie", r.cookie}});
    resp.headers = {{"Cache-Control", "no-store"}};
    return resp;
  }, Access::kPublic);
  auto call = [&](std::string path, std::string auth, std::string host = "localhost") {
    Request r;
    r.method = "GET";
    r.path = std::move(path);
    r.host = std::move(host);
    r.authorization = std::move(auth);
    r.cookie = "a=b";
    return router.Dispatch(r);
  };
  CHECK(call("/v1/x", "").status == 401);
  CHECK(call("/v1/x", "Bearer bad").status == 401);
  CHECK(call("/v1/x", "Bearer good").status == 200);
  CHECK(call("/nope", "").status == 401);  // nothing is told about paths without a token
  Response pub = call("/ui", "");
  REQUIRE(pub.status == 200);
  auto body = boost::json::parse(pub.body).as_object();
  CHECK(body.at("tenant") == "");  // the handler decides: it sees no caller
  CHECK(body.at("cookie") == "a=b");
  REQUIRE(pub.headers.size() == 1);
  CHECK(call("/ui", "", "evil.example").status == 403);  // the Host check still applies
}

TEST_CASE("Router: without a token a verified admin certificate is an admin, a tenant certificate its tenant, a "
          "daemon's certificate or a claim without TLS nothing, and a token wins over the certificate",
          "[http]") {
  ServerOptions o;
  o.authenticate = [](std::string_view token) -> cdp::Result<Caller> {
    if (token == "good") return Caller{false, "acme", true, "t1"};
    return cdp::Status::PermissionDenied("the control token is not valid here");
  };
  Router router(o);
  router.Add("GET", "/v1/x", [](const Request& r) {
    return Response::Json(200, {{"admin", r.caller.admin}, {"tenant", r.caller.tenant}, {"id", r.caller.token_id}});
  });
  auto call = [&](bool tls, std::string role, std::string tenant, std::string auth = "") {
    Request r;
    r.method = "GET";
    r.path = "/v1/x";
    r.host = "localhost";
    r.authorization = std::move(auth);
    r.tls = tls;
    r.cert_role = std::move(role);
    r.cert_tenant = std::move(tenant);
    r.cert_name = "n";
    return router.Dispatch(r);
  };
  CHECK(call(true, "admin", "").body == R"({"admin":true,"tenant":"","id":"certificate:n"})");
  CHECK(call(true, "tenant", "acme").body == R"({"admin":false,"tenant":"acme","id":"certificate:n"})");
  for (const char* role : {"agent", "ps", "mt"}) {
    INFO(role);
    Response r = call(true, role, role == std::string("mt") ? "" : "acme");
    CHECK(r.status == 401);
    CHECK(r.body.find("or a client certificate of role admin or tenant") != std::string::npos);
  }
  CHECK(call(true, "tenant", "").status == 401);
  CHECK(call(false, "admin", "").status == 401);  // only the TLS handshake sets a certificate
  CHECK(call(true, "admin", "", "Bearer good").body == R"({"admin":false,"tenant":"acme","id":"t1"})");
  CHECK(call(true, "admin", "", "Bearer bad").status == 401);
}

// The dashboard's cookie check is the router's (Access::kSession), not a
// second token check in the page's handler.
TEST_CASE("Router: a session route signs in by bearer token or else a session cookie holding a random id, never the token, and runs its handler either way",
          "[http]") {
  ServerOptions o;
  bool good_revoked = false;
  o.authenticate = [&](std::string_view token) -> cdp::Result<Caller> {
    if (token == "good" && !good_revoked) return Caller{false, "acme", false, ""};
    if (token == "root") return Caller{true, "", false, ""};
    return cdp::Status::PermissionDenied("the control token is not valid here");
  };
  Router router(o);
  auto echo = [](const Request& r) {
    return Response::Json(200, {{"signed_in", r.signed_in}, {"tenant", r.caller.tenant}, {"token", r.token}});
  };
  router.Add("GET", "/ui", echo, Access::kSession);
  router.Add("GET", "/v1/x", echo);
  auto call = [&](std::string path, std::string auth, std::string cookie, bool tls = true) {
    Request r;
    r.method = "GET";
    r.path = std::move(path);
    r.host = "localhost";
    r.authorization = std::move(auth);
    r.cookie = std::move(cookie);
    r.tls = tls;
    Response resp = router.Dispatch(r);
    return std::make_pair(resp.status, resp.status == 200 ? boost::json::parse(resp.body) : boost::json::value());
  };
  auto anonymous = call("/ui", "", "");
  CHECK(anonymous.first == 200);
  CHECK(anonymous.second.at("signed_in") == false);
  CHECK(anonymous.second.at("tenant") == "");

  const auto now = std::chrono::steady_clock::now();
  auto id = router.OpenSession("good", now);
  REQUIRE(id.ok());
  CHECK(id->size() == 64);
  CHECK(id->find("good") == std::string::npos);
  auto other = router.OpenSession("good", now);
  REQUIRE(other.ok());
  CHECK(*other != *id);  // random, not derived from the token

  auto by_cookie = call("/ui", "", "x=1; __Host-cdp_session=" + *id + " ; y=2");
  CHECK(by_cookie.second.at("signed_in") == true);
  CHECK(by_cookie.second.at("tenant") == "acme");
  // Over TLS only the __Host- cookie counts; in plain HTTP only the plain one.
  CHECK(call("/ui", "", "cdp_session=" + *id).second.at("signed_in") == false);
  CHECK(call("/ui", "", "cdp_session=" + *id, false).second.at("signed_in") == true);
  // The token itself in a cookie signs nothing in, nor does an unknown id.
  CHECK(call("/ui", "", "__Host-cdp_session=good").second.at("signed_in") == false);
  CHECK(call("/ui", "", "cdp_ui_token=good").second.at("signed_in") == false);
  CHECK(call("/ui", "", "__Host-cdp_session=" + std::string(64, '0')).second.at("signed_in") == false);
  // A bearer header wins over the cookie, whichever is valid.
  CHECK(call("/ui", "Bearer bad", "__Host-cdp_session=" + *id).second.at("signed_in") == false);
  auto by_bearer = call("/ui", "bearer root", "__Host-cdp_session=" + *id);
  CHECK(by_bearer.second.at("signed_in") == true);
  CHECK(by_bearer.second.at("token") == "root");
  // The cookie never reaches a token route (no CSRF through the API).
  CHECK(call("/v1/x", "", "__Host-cdp_session=" + *id).first == 401);
  auto api = call("/v1/x", "Bearer good", "");
  CHECK(api.first == 200);
  CHECK(api.second.at("signed_in") == true);
  // A session's token is checked at every use: revoked, the session signs nothing in.
  good_revoked = true;
  CHECK(call("/ui", "", "__Host-cdp_session=" + *id).second.at("signed_in") == false);
  good_revoked = false;
  // Ended, or past its lifetime, a session is gone.
  router.EndSession(*id);
  CHECK(call("/ui", "", "__Host-cdp_session=" + *id).second.at("signed_in") == false);
  CHECK(router.SessionToken(*other, now + std::chrono::seconds(o.session_lifetime_s) - std::chrono::seconds(1)) ==
        "good");
  CHECK(router.SessionToken(*other, now + std::chrono::seconds(o.session_lifetime_s)).empty());
  CHECK(call("/ui", "", "__Host-cdp_session=" + *other).second.at("signed_in") == false);
  // At most kMaxSessions: the oldest goes first.
  auto first = router.OpenSession("root", now);
  REQUIRE(first.ok());
  for (size_t i = 0; i < cdp::http::kMaxSessions; ++i) REQUIRE(router.OpenSession("root", now).ok());
  CHECK(router.SessionToken(*first, now).empty());

  // Without authentication every caller is the admin, signed in.
  ServerOptions open;
  Router open_router(open);
  open_router.Add("GET", "/ui", echo, Access::kSession);
  Request r;
  r.method = "GET";
  r.path = "/ui";
  r.host = "localhost";
  CHECK(boost::json::parse(open_router.Dispatch(r).body).at("signed_in") == true);
}

// The read-only rule (Caller::read_only) is the router's, for every route:
// a tenant-read token reaches GETs and the POSTs that say they only read.
TEST_CASE("Router: a read-only caller gets 403 on every request that changes state, before the handler",
          "[http][token]") {
  ServerOptions o;
  o.authenticate = [](std::string_view token) -> cdp::Result<Caller> {
    if (token == "reader") return Caller{false, "acme", true, "0123456789ab"};
    if (token == "writer") return Caller{false, "acme", false, "ba9876543210"};
    if (token == "old") return cdp::Status::PermissionDenied("the control token 0123456789ab expired at 2024-01-01T00:00:00Z");
    return cdp::Status::PermissionDenied("the control token is not valid here");
  };
  Router router(o);
  int calls = 0;
  auto echo = [&calls](const Request& r) {
    ++calls;
    return Response::Json(200, {{"read_only", r.caller.read_only}, {"id", r.caller.token_id}});
  };
  router.Add("GET", "/v1/points", echo);
  router.Add("POST", "/v1/rollback", echo);
  router.Add("DELETE", "/v1/thing", echo);
  router.Add("POST", "/v1/export", echo, Access::kToken, ChangesStateWhenSet("writable"));
  auto call = [&](std::string method, std::string path, std::string token, std::string body = "") {
    Request r;
    r.method = std::move(method);
    r.path = std::move(path);
    r.host = "localhost";
    r.authorization = "Bearer " + token;
    r.body = std::move(body);
    if (!r.body.empty()) r.content_type = "application/json";
    return router.Dispatch(r);
  };
  Response got = call("GET", "/v1/points", "reader");
  CHECK(got.status == 200);
  CHECK(got.body == R"({"read_only":true,"id":"0123456789ab"})");
  CHECK(call("POST", "/v1/export", "reader", "").status == 200);
  CHECK(call("POST", "/v1/export", "reader", R"({"volume":"v","seq":1})").status == 200);
  CHECK(call("POST", "/v1/export", "reader", R"({"volume":"v","writable":false})").status == 200);
  CHECK(calls == 4);
  Response refused = call("POST", "/v1/rollback", "reader", R"({"volume":"v","seq":1})");
  CHECK(refused.status == 403);
  CHECK(refused.body == R"x({"error":"POST /v1/rollback changes state: this token is read-only (scope tenant-read)"})x");
  CHECK(call("DELETE", "/v1/thing", "reader").status == 403);
  CHECK(call("POST", "/v1/export", "reader", R"({"volume":"v","writable":true})").status == 403);
  CHECK(call("POST", "/v1/export", "reader", R"({"volume":"v","writable":"yes"})").status == 403);
  CHECK(call("POST", "/v1/export", "reader", R"([1])").status == 403);
  CHECK(call("POST", "/v1/export", "reader", "{not json").status == 403);
  CHECK(calls == 4);
  // A full tenant token is not read-only.
  CHECK(call("POST", "/v1/rollback", "writer", "{}").status == 200);
  CHECK(call("POST", "/v1/export", "writer", R"({"writable":true})").status == 200);
  // An expired token is 401 with the authenticator's message.
  Response old = call("GET", "/v1/points", "old");
  CHECK(old.status == 401);
  CHECK(old.body == R"({"error":"the control token 0123456789ab expired at 2024-01-01T00:00:00Z"})");
  CHECK(calls == 6);
}
