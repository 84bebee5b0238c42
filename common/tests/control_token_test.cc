// SPDX-License-Identifier: Apache-2.0
// Control tokens (common/http/control_token.h), request parameters (http::Params)
// and the HTTP server's authentication of every route.
#include <sys/stat.h>

#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <cstdlib>

#include "common/daemon/metrics.h"
#include "common/env/env.h"
#include "common/env/fault_env.h"
#include "common/http/control_token.h"
#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "common/tests/test_util.h"

using namespace cdp;

namespace {

std::string ReadText(Env* env, const std::string& path) {
  auto b = ReadWholeFile(env, path);
  REQUIRE(b.ok());
  return std::string(b->begin(), b->end());
}

unsigned ModeOf(const std::string& path) {
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return unsigned(st.st_mode & 07777);
}

}  // namespace

TEST_CASE("control token: made at first start with mode 0600, the same at the next start", "[control][token]") {
  testing::ScratchDir dir;
  const std::string path = dir.Join("state/control.token");
  auto a = ControlTokens::Open(DefaultEnv(), path);
  REQUIRE(a.ok());
  CHECK(ModeOf(path) == 0600);
  auto token = ReadTokenFile(DefaultEnv(), path);
  REQUIRE(token.ok());
  CHECK(token->size() == 64);
  auto caller = (*a)->Authenticate(*token);
  REQUIRE(caller.has_value());
  CHECK(caller->admin);
  CHECK(caller->tenant.empty());
  CHECK_FALSE((*a)->Authenticate("").has_value());
  CHECK_FALSE((*a)->Authenticate(token->substr(0, 63)).has_value());
  CHECK_FALSE((*a)->Authenticate(*token + "0").has_value());

  auto b = ControlTokens::Open(DefaultEnv(), path);  // a restart reads the same token
  REQUIRE(b.ok());
  CHECK(ReadTokenFile(DefaultEnv(), path).value() == *token);
  CHECK((*b)->Authenticate(*token).has_value());

  // Two fresh daemons never share a token.
  auto other = ControlTokens::Open(DefaultEnv(), dir.Join("other.token"));
  REQUIRE(other.ok());
  CHECK_FALSE((*other)->Authenticate(*token).has_value());
}

TEST_CASE("control token: a token file open to group or others is refused", "[control][token]") {
  testing::ScratchDir dir;
  const std::string path = dir.Join("control.token");
  REQUIRE(ControlTokens::Open(DefaultEnv(), path).ok());
  REQUIRE(::chmod(path.c_str(), 0644) == 0);
  auto r = ControlTokens::Open(DefaultEnv(), path);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kPermissionDenied);
  CHECK(r.status().message() == path + " has mode 0644: a token file must not be open to group or others (chmod 600 " +
                                    path + ")");
}

TEST_CASE("control token: tenant tokens are issued, persisted as digests, revoked", "[control][token]") {
  testing::ScratchDir dir;
  const std::string admin = dir.Join("control.token"), tenants = dir.Join("tenant_tokens");
  auto t = ControlTokens::Open(DefaultEnv(), admin, tenants);
  REQUIRE(t.ok());
  auto acme = (*t)->IssueTenantToken("acme");
  REQUIRE(acme.ok());
  auto beta = (*t)->IssueTenantToken("beta");
  REQUIRE(beta.ok());
  CHECK(*acme != *beta);
  CHECK(ModeOf(tenants) == 0600);
  // Only digests are stored: the token itself is nowhere in the file.
  CHECK(ReadText(DefaultEnv(), tenants).find(*acme) == std::string::npos);

  auto who = (*t)->Authenticate(*acme);
  REQUIRE(who.has_value());
  CHECK_FALSE(who->admin);
  CHECK(who->tenant == "acme");

  // A restart knows them.
  auto again = ControlTokens::Open(DefaultEnv(), admin, tenants);
  REQUIRE(again.ok());
  CHECK((*again)->Authenticate(*beta)->tenant == "beta");
  CHECK((*again)->TenantTokenCounts() == std::map<std::string, size_t>{{"acme", 1}, {"beta", 1}});

  CHECK((*again)->RevokeTenantTokens("acme").value() == 1);
  CHECK_FALSE((*again)->Authenticate(*acme).has_value());
  CHECK((*again)->RevokeTenantTokens("acme").status().code() == Code::kNotFound);
  auto third = ControlTokens::Open(DefaultEnv(), admin, tenants);
  REQUIRE(third.ok());
  CHECK_FALSE((*third)->Authenticate(*acme).has_value());
  CHECK((*third)->Authenticate(*beta).has_value());

  CHECK((*t)->IssueTenantToken("../x").status().code() == Code::kInvalidArgument);
  auto no_tenants = ControlTokens::Open(DefaultEnv(), admin);
  REQUIRE(no_tenants.ok());
  CHECK((*no_tenants)->IssueTenantToken("acme").status().code() == Code::kNotSupported);
}

TEST_CASE("control token: a failed write of the tenant file changes nothing", "[control][token]") {
  auto mem = NewMemEnv();
  FaultEnv fault(mem.get());
  auto t = ControlTokens::Open(&fault, "/s/control.token", "/s/tenant_tokens");
  REQUIRE(t.ok());
  auto kept = (*t)->IssueTenantToken("acme");
  REQUIRE(kept.ok());
  const std::string before = ReadText(&fault, "/s/tenant_tokens");
  for (FaultEnv::Op op : {FaultEnv::Op::kWrite, FaultEnv::Op::kSync, FaultEnv::Op::kRename, FaultEnv::Op::kSyncDir}) {
    INFO(FaultEnv::OpName(op));
    fault.InjectError(op, ENOSPC);
    auto r = (*t)->IssueTenantToken("beta");
    fault.ClearErrors();
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == Code::kNoSpace);
    CHECK((*t)->TenantTokenCounts() == std::map<std::string, size_t>{{"acme", 1}});
  }
  // The file on "disk" still holds the one good token (a failed SyncDir may
  // already have renamed the new file in place: then it is re-read as valid).
  auto reopened = ControlTokens::Open(&fault, "/s/control.token", "/s/tenant_tokens");
  REQUIRE(reopened.ok());
  CHECK((*reopened)->Authenticate(*kept)->tenant == "acme");
}

TEST_CASE("control token: a power cut at any point leaves a usable token file", "[control][token]") {
  for (uint64_t n = 0;; ++n) {
    auto mem = NewMemEnv();
    FaultEnv fault(mem.get());
    fault.SetCrashAfterSyncs(n);
    std::string admin, acme;
    auto t = ControlTokens::Open(&fault, "/s/control.token", "/s/tenant_tokens");
    if (t.ok()) {
      admin = ReadTokenFile(&fault, "/s/control.token").value();
      auto a = (*t)->IssueTenantToken("acme");
      if (a.ok()) acme = *a;
    }
    const bool finished = !fault.crashed();
    REQUIRE(fault.DropUnsyncedData().ok());
    INFO("crash after " << n << " syncs");
    auto again = ControlTokens::Open(&fault, "/s/control.token", "/s/tenant_tokens");
    REQUIRE(again.ok());
    // A token that was handed out (returned) is honoured after the crash.
    if (!admin.empty() && finished) CHECK((*again)->Authenticate(admin)->admin);
    if (!acme.empty()) CHECK((*again)->Authenticate(acme)->tenant == "acme");
    if (finished) break;
  }
}

TEST_CASE("control token: malformed files name the problem", "[control][token]") {
  auto env = NewMemEnv();
  const std::string empty = "\n";
  REQUIRE(env->CreateDirs("/s").ok());
  REQUIRE(WriteFileAtomic(env.get(), "/s/control.token", ByteSpan(reinterpret_cast<const uint8_t*>(empty.data()), empty.size())).ok());
  auto r = ControlTokens::Open(env.get(), "/s/control.token");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "/s/control.token: no token in the file");

  const std::string good = "abc\n", bad = "# tokens\nacme 00ff\n";
  REQUIRE(WriteFileAtomic(env.get(), "/s/control.token", ByteSpan(reinterpret_cast<const uint8_t*>(good.data()), good.size())).ok());
  REQUIRE(WriteFileAtomic(env.get(), "/s/tenant_tokens", ByteSpan(reinterpret_cast<const uint8_t*>(bad.data()), bad.size())).ok());
  auto t = ControlTokens::Open(env.get(), "/s/control.token", "/s/tenant_tokens");
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == Code::kCorruption);
  CHECK(t.status().message() ==
        "/s/tenant_tokens line 2: not 'TENANT SHA256HEX' (the file is written by cdpctl token issue)");
}

TEST_CASE("control token: a client takes --token-file, else CDP_TOKEN, else CDP_TOKEN_FILE", "[control][token]") {
  testing::ScratchDir dir;
  const std::string file = dir.Join("t"), env_file = dir.Join("e");
  REQUIRE(ControlTokens::Open(DefaultEnv(), file).ok());
  REQUIRE(ControlTokens::Open(DefaultEnv(), env_file).ok());
  const std::string from_file = ReadTokenFile(DefaultEnv(), file).value();
  const std::string from_env_file = ReadTokenFile(DefaultEnv(), env_file).value();
  ::unsetenv("CDP_TOKEN");
  ::unsetenv("CDP_TOKEN_FILE");
  CHECK(ClientToken("").value() == "");
  ::setenv("CDP_TOKEN_FILE", env_file.c_str(), 1);
  CHECK(ClientToken("").value() == from_env_file);
  ::setenv("CDP_TOKEN", "tok-from-env", 1);
  CHECK(ClientToken("").value() == "tok-from-env");
  CHECK(ClientToken(file).value() == from_file);
  ::setenv("CDP_TOKEN", "bad token", 1);
  CHECK(ClientToken("").status().code() == Code::kInvalidArgument);
  ::unsetenv("CDP_TOKEN");
  ::unsetenv("CDP_TOKEN_FILE");
  CHECK(ClientToken(dir.Join("missing")).status().code() == Code::kNotFound);
}

namespace {

http::Request Req(std::string method, std::map<std::string, std::string> params, std::string body) {
  http::Request r;
  r.method = std::move(method);
  r.params = std::move(params);
  r.body = std::move(body);
  return r;
}

}  // namespace

TEST_CASE("http::Params: GET from the query, other methods only from a JSON object body", "[http][params]") {
  auto g = http::Params::Of(Req("GET", {{"volume", "db1"}, {"seq", "42"}, {"w", "true"}}, ""), {"volume", "seq", "w"});
  REQUIRE(g.ok());
  CHECK(g->String("volume").value() == std::optional<std::string>("db1"));
  CHECK(g->Uint("seq").value() == std::optional<uint64_t>(42));
  CHECK(g->Bool("w").value() == std::optional<bool>(true));
  CHECK(g->String("missing").value() == std::nullopt);
  CHECK(g->Uint("volume").status().message() == "parameter 'volume' must be a non-negative integer");

  // A POST never reads the query string: a link cannot carry a state change.
  auto p = http::Params::Of(Req("POST", {{"volume", "db1"}}, ""), {"volume"});
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message() == "the parameters of a POST go in its JSON body, not in the query string");
  auto empty = http::Params::Of(Req("POST", {}, ""), {"volume"});
  REQUIRE(empty.ok());
  CHECK(empty->String("volume").value() == std::nullopt);

  auto b = http::Params::Of(Req("POST", {}, R"({"volume":"db1","seq":7,"writable":false,"mbps":2.5})"),
                            {"volume", "seq", "writable", "mbps"});
  REQUIRE(b.ok());
  CHECK(b->Int("seq").value() == std::optional<int64_t>(7));
  CHECK(b->Bool("writable").value() == std::optional<bool>(false));
  CHECK(b->Number("mbps").value() == std::optional<double>(2.5));
  CHECK(b->Int("volume").status().message() == "parameter 'volume' must be an integer");
  CHECK(b->Bool("seq").status().message() == "parameter 'seq' must be true or false");
  CHECK(b->String("seq").status().message() == "parameter 'seq' must be a string");

  CHECK(http::Params::Of(Req("POST", {}, "volume=db1"), {"volume"}).status().message() ==
        "the request body must be a JSON object");
  CHECK(http::Params::Of(Req("POST", {}, "[1]"), {}).status().message() == "the request body must be a JSON object");
  CHECK(http::Params::Of(Req("POST", {}, R"({"mpbs":1})"), {"mbps"}).status().message() == "unknown parameter 'mpbs'");
  auto neg = http::Params::Of(Req("POST", {}, R"({"seq":-1})"), {"seq"});
  REQUIRE(neg.ok());
  CHECK(neg->Uint("seq").status().code() == Code::kInvalidArgument);
}

namespace {

// A server with one route, authenticated by a ControlTokens in `dir`.
struct AuthServer {
  explicit AuthServer(const std::string& dir, bool metrics_public = false) {
    auto t = ControlTokens::Open(DefaultEnv(), dir + "/control.token", dir + "/tenant_tokens");
    REQUIRE(t.ok());
    tokens = std::shared_ptr<ControlTokens>(std::move(*t));
    admin = ReadTokenFile(DefaultEnv(), dir + "/control.token").value();
    tenant = tokens->IssueTenantToken("acme").value();
    reg.GetCounter("cdp_test_total", "a counter");
    http::ServerOptions o;
    o.registry = &reg;
    o.status = [] { return boost::json::value{{"state", "ok"}}; };
    o.authenticate = [t = tokens](std::string_view tok) { return t->Authenticate(tok); };
    o.metrics_public = metrics_public;
    server = std::make_unique<http::Server>(o);
    server->Route("POST", "/v1/act", [this](const http::Request& r) {
      ++calls;
      return http::Response::Json(200, {{"admin", r.caller.admin}, {"tenant", r.caller.tenant}});
    });
    REQUIRE(server->Start().ok());
  }
  int Call(const std::string& method, const std::string& target, const std::string& token,
           std::string* body = nullptr) {
    http::ClientOptions co;
    co.bearer_token = token;
    auto r = http::HttpRequest("127.0.0.1", server->port(), method, target, method == "POST" ? "{}" : "",
                               std::chrono::milliseconds(5000), co);
    REQUIRE(r.ok());
    if (body) *body = r->body;
    return r->status;
  }
  metrics::Registry reg;
  std::shared_ptr<ControlTokens> tokens;
  std::string admin, tenant;
  std::atomic<int> calls{0};
  std::unique_ptr<http::Server> server;
};

}  // namespace

TEST_CASE("HTTP auth: no token or a wrong one is 401 and runs nothing, and tenants see no daemon-wide page",
          "[http][control][token]") {
  testing::ScratchDir dir;
  AuthServer s(dir.path());
  std::string body;
  CHECK(s.Call("POST", "/v1/act", "", &body) == 401);
  CHECK(body == R"x({"error":"a control token is required (Authorization: Bearer TOKEN; cdpctl --token-file)"})x");
  CHECK(s.Call("POST", "/v1/act", s.admin.substr(1) + "x", &body) == 401);
  CHECK(body == R"({"error":"the control token is not valid here"})");
  CHECK(s.Call("GET", "/status", "") == 401);
  CHECK(s.Call("GET", "/metrics", "") == 401);
  CHECK(s.Call("GET", "/no-such-path", "") == 401);  // nothing about the routes leaks either
  CHECK(s.calls.load() == 0);

  CHECK(s.Call("POST", "/v1/act", s.admin, &body) == 200);
  CHECK(body == R"({"admin":true,"tenant":""})");
  CHECK(s.Call("POST", "/v1/act", s.tenant, &body) == 200);
  CHECK(body == R"({"admin":false,"tenant":"acme"})");
  CHECK(s.calls.load() == 2);
  CHECK(s.Call("GET", "/status", s.admin) == 200);
  CHECK(s.Call("GET", "/metrics", s.admin) == 200);
  CHECK(s.Call("GET", "/status", s.tenant, &body) == 403);
  CHECK(body == R"({"error":"/status covers every tenant: it needs an admin token"})");
  CHECK(s.Call("GET", "/metrics", s.tenant) == 403);

  // The scheme is case-insensitive (RFC 7235); the token is not.
  REQUIRE(testing::HaveProgram("curl"));
  const std::string url = "http://127.0.0.1:" + std::to_string(s.server->port()) + "/status";
  auto curl = [&](const std::string& header) {
    return testing::RunCommand({"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", header, url}, 20000).output;
  };
  CHECK(curl("Authorization: bearer " + s.admin) == "200");
  CHECK(curl("Authorization: Basic " + s.admin) == "401");
  CHECK(curl("Authorization: Bearer") == "401");
}

TEST_CASE("HTTP auth: /metrics without a token only where the operator opted in", "[http][control][token]") {
  testing::ScratchDir dir;
  AuthServer s(dir.path(), /*metrics_public=*/true);
  std::string body;
  CHECK(s.Call("GET", "/metrics", "", &body) == 200);
  CHECK(body.find("cdp_test_total 0") != std::string::npos);
  CHECK(s.Call("GET", "/status", "") == 401);
  CHECK(s.Call("POST", "/v1/act", "") == 401);
}
