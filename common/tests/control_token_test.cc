// SPDX-License-Identifier: Apache-2.0
// Control tokens (common/http/control_token.h), request parameters (http::Params)
// and the HTTP server's authentication of every route.
#include <sys/stat.h>

#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <cstdlib>

#include "common/daemon/metrics.h"
#include "common/base/clock.h"
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
  REQUIRE(caller.ok());
  CHECK(caller->admin);
  CHECK(caller->tenant.empty());
  CHECK_FALSE((*a)->Authenticate("").ok());
  CHECK_FALSE((*a)->Authenticate(token->substr(0, 63)).ok());
  CHECK_FALSE((*a)->Authenticate(*token + "0").ok());

  auto b = ControlTokens::Open(DefaultEnv(), path);  // a restart reads the same token
  REQUIRE(b.ok());
  CHECK(ReadTokenFile(DefaultEnv(), path).value() == *token);
  CHECK((*b)->Authenticate(*token).ok());

  // Two fresh daemons never share a token.
  auto other = ControlTokens::Open(DefaultEnv(), dir.Join("other.token"));
  REQUIRE(other.ok());
  CHECK_FALSE((*other)->Authenticate(*token).ok());
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
  REQUIRE(who.ok());
  CHECK_FALSE(who->admin);
  CHECK(who->tenant == "acme");

  // A restart knows them.
  auto again = ControlTokens::Open(DefaultEnv(), admin, tenants);
  REQUIRE(again.ok());
  CHECK((*again)->Authenticate(*beta)->tenant == "beta");
  CHECK((*again)->TenantTokenCounts() == std::map<std::string, size_t>{{"acme", 1}, {"beta", 1}});

  CHECK((*again)->RevokeTenantTokens("acme").value() == 1);
  CHECK_FALSE((*again)->Authenticate(*acme).ok());
  CHECK((*again)->RevokeTenantTokens("acme").status().code() == Code::kNotFound);
  auto third = ControlTokens::Open(DefaultEnv(), admin, tenants);
  REQUIRE(third.ok());
  CHECK_FALSE((*third)->Authenticate(*acme).ok());
  CHECK((*third)->Authenticate(*beta).ok());

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

namespace {

void WriteText(Env* env, const std::string& path, const std::string& text) {
  REQUIRE(env->CreateDirs(DirName(path)).ok());
  REQUIRE(WriteFileAtomic(env, path, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()), 0600).ok());
}

const std::string kDigest(64, 'a');  // any SHA-256 in hex

}  // namespace

TEST_CASE("control token: scopes and lifetimes parse, and nothing else does", "[control][token]") {
  CHECK(ParseTokenScope("admin").value() == TokenScope::kAdmin);
  CHECK(ParseTokenScope("tenant").value() == TokenScope::kTenant);
  CHECK(ParseTokenScope("tenant-read").value() == TokenScope::kTenantRead);
  for (TokenScope sc : {TokenScope::kAdmin, TokenScope::kTenant, TokenScope::kTenantRead}) {
    CHECK(ParseTokenScope(TokenScopeName(sc)).value() == sc);
  }
  for (const char* bad : {"", "Admin", "read", "tenant_read", "tenant-read "}) {
    INFO("'" << bad << "'");
    CHECK(ParseTokenScope(bad).status().code() == Code::kInvalidArgument);
  }
  CHECK(ParseTokenScope("root").status().message() == "bad token scope 'root' (admin | tenant | tenant-read)");

  CHECK(ParseTokenLifetime("90s").value() == 90);
  CHECK(ParseTokenLifetime("15m").value() == 900);
  CHECK(ParseTokenLifetime("12h").value() == 12 * 3600);
  CHECK(ParseTokenLifetime("30d").value() == 30 * 86400);
  CHECK(ParseTokenLifetime("365d").value() == kMaxTokenLifetimeSeconds);
  for (const char* bad : {"", "d", "0d", "366d", "8761h", "never", "30", "1.5d", "-1d", "1h30m", "99999999999d"}) {
    INFO("'" << bad << "'");
    CHECK(ParseTokenLifetime(bad).status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("control token: an issued token has an id, a scope and an expiry on the injected clock",
          "[control][token]") {
  auto env = NewMemEnv();
  ManualClock clock;
  auto t = ControlTokens::Open(env.get(), "/s/control.token", "/s/tenant_tokens", &clock);
  REQUIRE(t.ok());
  auto full = (*t)->Issue(TokenScope::kTenant, "acme");  // the default lifetime: 90 days
  auto reader = (*t)->Issue(TokenScope::kTenantRead, "acme", 3600);
  auto extra_admin = (*t)->Issue(TokenScope::kAdmin, "", 7200);
  REQUIRE(full.ok());
  REQUIRE(reader.ok());
  REQUIRE(extra_admin.ok());
  CHECK(full->info.id.size() == 12);
  CHECK(full->info.id != reader->info.id);
  CHECK(full->token.find(full->info.id) == std::string::npos);
  const uint64_t issued_at = clock.WallMicros() / 1'000'000 * 1'000'000;
  CHECK(full->info.created_us == issued_at);
  CHECK(full->info.expires_us == issued_at + 90ull * 86400 * 1'000'000);
  CHECK(reader->info.expires_us == issued_at + 3600ull * 1'000'000);

  auto a = (*t)->Authenticate(full->token);
  REQUIRE(a.ok());
  CHECK_FALSE(a->admin);
  CHECK_FALSE(a->read_only);
  CHECK(a->tenant == "acme");
  CHECK(a->token_id == full->info.id);
  auto r = (*t)->Authenticate(reader->token);
  REQUIRE(r.ok());
  CHECK(r->read_only);
  CHECK(r->tenant == "acme");
  auto ad = (*t)->Authenticate(extra_admin->token);
  REQUIRE(ad.ok());
  CHECK(ad->admin);
  CHECK_FALSE(ad->read_only);
  CHECK(ad->tenant.empty());
  CHECK((*t)->TenantTokenCounts() == std::map<std::string, size_t>{{"acme", 2}});

  // Last use: in memory, the time of the last accepted use.
  clock.Advance(10'000'000);
  REQUIRE((*t)->Authenticate(reader->token).ok());
  for (const TokenInfo& i : (*t)->List()) {
    if (i.id == reader->info.id) CHECK(i.last_used_us == clock.WallMicros());
  }

  // One second before the hour the reader still works; at the hour it is refused, saying so.
  clock.Set(clock.NowMicros() + (issued_at + 3600ull * 1'000'000 - clock.WallMicros()) - 1);
  CHECK((*t)->Authenticate(reader->token).ok());
  clock.Advance(1);
  auto expired = (*t)->Authenticate(reader->token);
  REQUIRE_FALSE(expired.ok());
  CHECK(expired.status().code() == Code::kPermissionDenied);
  CHECK(expired.status().message().find("the control token " + reader->info.id + " expired at ") == 0);
  CHECK((*t)->Authenticate(full->token).ok());
  CHECK((*t)->Authenticate("nosuchtoken").status().message() == "the control token is not valid here");
  // The 90-day default runs out too, and the expiry survives a restart.
  clock.Advance(90ull * 86400 * 1'000'000);
  CHECK_FALSE((*t)->Authenticate(full->token).ok());
  auto reopened = ControlTokens::Open(env.get(), "/s/control.token", "/s/tenant_tokens", &clock);
  REQUIRE(reopened.ok());
  CHECK_FALSE((*reopened)->Authenticate(full->token).ok());
  CHECK((*reopened)->List().size() == 3);

  // Bad issues change nothing.
  CHECK((*t)->Issue(TokenScope::kTenant, "acme", 0).status().code() == Code::kInvalidArgument);
  CHECK((*t)->Issue(TokenScope::kTenant, "acme", kMaxTokenLifetimeSeconds + 1).status().code() ==
        Code::kInvalidArgument);
  CHECK((*t)->Issue(TokenScope::kAdmin, "acme").status().code() == Code::kInvalidArgument);
  CHECK((*t)->Issue(TokenScope::kTenantRead, "").status().code() == Code::kInvalidArgument);
  CHECK((*t)->List().size() == 3);
}

TEST_CASE("control token: revoking one id leaves the tenant's other tokens working", "[control][token]") {
  auto env = NewMemEnv();
  ManualClock clock;
  auto t = ControlTokens::Open(env.get(), "/s/control.token", "/s/tenant_tokens", &clock);
  REQUIRE(t.ok());
  auto one = (*t)->Issue(TokenScope::kTenant, "acme").value();
  auto two = (*t)->Issue(TokenScope::kTenantRead, "acme").value();
  auto other = (*t)->Issue(TokenScope::kTenant, "beta").value();
  auto gone = (*t)->Revoke(one.info.id);
  REQUIRE(gone.ok());
  CHECK(gone->tenant == "acme");
  CHECK_FALSE((*t)->Authenticate(one.token).ok());
  CHECK((*t)->Authenticate(two.token).ok());
  CHECK((*t)->Authenticate(other.token).ok());
  CHECK((*t)->Revoke(one.info.id).status().code() == Code::kNotFound);
  CHECK((*t)->Revoke("").status().code() == Code::kNotFound);
  // With a tenant, only a token of that tenant goes.
  CHECK((*t)->Revoke(other.info.id, "acme").status().code() == Code::kNotFound);
  CHECK((*t)->Authenticate(other.token).ok());
  auto again = ControlTokens::Open(env.get(), "/s/control.token", "/s/tenant_tokens", &clock);
  REQUIRE(again.ok());
  CHECK_FALSE((*again)->Authenticate(one.token).ok());
  CHECK((*again)->Authenticate(two.token)->token_id == two.info.id);
  // --tenant still revokes all of a tenant's tokens, and only those.
  CHECK((*again)->RevokeTenantTokens("acme").value() == 1);
  CHECK((*again)->Authenticate(other.token).ok());
}

TEST_CASE("control token: a first-format file loads as tenant tokens expiring 90 days after, rewritten at once",
          "[control][token]") {
  auto env = NewMemEnv();
  ManualClock clock;
  REQUIRE(ControlTokens::Open(env.get(), "/s/control.token", "", &clock).ok());
  // The token whose digest the old line holds: issue one, then write its line in the old form.
  std::string token, digest_hex;
  {
    auto t = ControlTokens::Open(env.get(), "/s/control.token", "/s/new_tokens", &clock);
    token = (*t)->IssueTenantToken("acme").value();
    const std::string text = ReadText(env.get(), "/s/new_tokens");
    const size_t line = text.find("\nv2 ");
    REQUIRE(line != std::string::npos);
    digest_hex = text.substr(text.find('\n', line + 1) - 64, 64);
  }
  WriteText(env.get(), "/s/tenant_tokens", "# tenant control tokens\nacme " + digest_hex + "\n");
  const uint64_t loaded_at = clock.WallMicros();
  auto t = ControlTokens::Open(env.get(), "/s/control.token", "/s/tenant_tokens", &clock);
  REQUIRE(t.ok());
  auto who = (*t)->Authenticate(token);
  REQUIRE(who.ok());
  CHECK(who->tenant == "acme");
  CHECK_FALSE(who->read_only);
  REQUIRE((*t)->List().size() == 1);
  const TokenInfo info = (*t)->List()[0];
  CHECK(info.scope == TokenScope::kTenant);
  CHECK(info.expires_us == loaded_at + 90ull * 86400 * 1'000'000);
  // Rewritten in the current format: a later load keeps the id and the expiry.
  const std::string text = ReadText(env.get(), "/s/tenant_tokens");
  CHECK(text.find("v2 " + info.id + " tenant acme ") != std::string::npos);
  clock.Advance(30ull * 86400 * 1'000'000);
  auto later = ControlTokens::Open(env.get(), "/s/control.token", "/s/tenant_tokens", &clock);
  REQUIRE(later.ok());
  REQUIRE((*later)->List().size() == 1);
  CHECK((*later)->List()[0].id == info.id);
  CHECK((*later)->List()[0].expires_us / 1'000'000 == info.expires_us / 1'000'000);
  clock.Advance(60ull * 86400 * 1'000'000);
  CHECK_FALSE((*later)->Authenticate(token).ok());
}

TEST_CASE("control token: malformed v2 lines are kCorruption naming the line", "[control][token]") {
  auto env = NewMemEnv();
  WriteText(env.get(), "/s/control.token", "abc\n");
  struct Case {
    std::string line, message;
  };
  const std::vector<Case> cases = {
      {"v2 0123456789ab tenant acme 100 200", "a v2 line has 7 fields, not 6"},
      {"v2 0123456789ab tenant acme 100 200 " + kDigest + " x", "a v2 line has 7 fields, not 8"},
      {"v2 0123456789AB tenant acme 100 200 " + kDigest, "bad token id '0123456789AB'"},
      {"v2 0123 tenant acme 100 200 " + kDigest, "bad token id '0123'"},
      {"v2 0123456789ab root acme 100 200 " + kDigest, "bad token scope 'root' (admin | tenant | tenant-read)"},
      {"v2 0123456789ab admin acme 100 200 " + kDigest, "bad tenant 'acme' for scope admin"},
      {"v2 0123456789ab tenant-read - 100 200 " + kDigest, "bad tenant '-' for scope tenant-read"},
      {"v2 0123456789ab tenant acme x 200 " + kDigest, "bad created or expiry time (seconds since the epoch)"},
      {"v2 0123456789ab tenant acme 100 -1 " + kDigest, "bad created or expiry time (seconds since the epoch)"},
      {"v2 0123456789ab tenant acme 100 200 " + kDigest.substr(1), "bad digest (64 lower-case hex digits)"},
      {"v3 0123456789ab tenant acme 100 200 " + kDigest,
       "neither a v2 line nor 'TENANT SHA256HEX' (the file is written by cdpctl token issue)"},
  };
  for (const Case& c : cases) {
    INFO(c.line);
    WriteText(env.get(), "/s/tenant_tokens", "# tokens\nv2 aaaaaaaaaaaa tenant acme 100 200 " + kDigest + "\n" + c.line + "\n");
    auto t = ControlTokens::Open(env.get(), "/s/control.token", "/s/tenant_tokens");
    REQUIRE_FALSE(t.ok());
    CHECK(t.status().code() == Code::kCorruption);
    CHECK(t.status().message() == "/s/tenant_tokens line 3: " + c.message);
  }
  WriteText(env.get(), "/s/tenant_tokens",
            "v2 aaaaaaaaaaaa tenant acme 100 200 " + kDigest + "\nv2 aaaaaaaaaaaa admin - 100 200 " + kDigest + "\n");
  CHECK(ControlTokens::Open(env.get(), "/s/control.token", "/s/tenant_tokens").status().message() ==
        "/s/tenant_tokens line 2: token id aaaaaaaaaaaa appears twice");
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
  CHECK(body == R"x({"error":"a control token is required (Authorization: Bearer TOKEN; cdpctl --token-file), or a client certificate of role admin or tenant (cdpctl --tls-cert, --tls-key)"})x");
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

TEST_CASE("control auth: control_tls = off is refused off loopback, and every plain-HTTP setting is listed as insecure",
          "[http][security]") {
  cdp::testing::ScratchDir dir;
  cdp::ControlAuthSettings plain;
  plain.tls = false;
  cdp::http::ServerOptions wide;
  wide.host = "0.0.0.0";
  auto refused = cdp::ApplyControlAuth(plain, dir.Join("a.token"), "", "test", &wide, nullptr);
  CHECK(refused.status().code() == cdp::Code::kInvalidArgument);
  CHECK(refused.status().message() ==
        "control_tls = off serves plain HTTP, which is allowed on a loopback address only, not on 0.0.0.0");
  for (const char* host : {"127.0.0.1", "127.3.4.5", "::1", "localhost"}) {
    INFO(host);
    cdp::http::ServerOptions lo;
    lo.host = host;
    REQUIRE(cdp::ApplyControlAuth(plain, dir.Join("b.token"), "", "test", &lo, nullptr).ok());
    CHECK(lo.tls == nullptr);
    CHECK(lo.insecure == std::vector<std::string>{"tls = off", "control_tls = off"});
  }
  // tls = off (no credentials) with control_tls on: plain HTTP too, and said so.
  cdp::ControlAuthSettings on;
  cdp::http::ServerOptions o;
  REQUIRE(cdp::ApplyControlAuth(on, dir.Join("c.token"), "", "test", &o, nullptr).ok());
  CHECK(o.insecure == std::vector<std::string>{"tls = off"});
  auto off = cdp::ControlAuthSettings::Off();
  cdp::http::ServerOptions o2;
  REQUIRE(cdp::ApplyControlAuth(off, dir.Join("d.token"), "", "test", &o2, nullptr).ok());
  CHECK(o2.insecure == std::vector<std::string>{"tls = off", "control_auth = off"});
}
