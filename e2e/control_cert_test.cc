// SPDX-License-Identifier: Apache-2.0
// Client certificates on the control API (issue #40, "callers authenticate
// with a token, or with a client certificate mapped to admin or to a tenant";
// common/http/http_server.h, Request::cert_*): at a real master target over
// HTTPS, with no bearer token,
//   - a certificate of role admin is an admin caller (cdpctl --tls-cert too);
//   - one of role tenant sees its tenant's objects only, and gets 403 on the
//     daemon-wide /status;
//   - the daemons' own certificates (agent) and no certificate get 401;
//   - a revoked admin certificate is refused at the handshake after SIGHUP,
//     while the tenant's certificate keeps working.
#include <signal.h>

#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <chrono>
#include <string>

#include "common/http/http_client.h"
#include "e2e/harness.h"

namespace {

namespace json = boost::json;
using cdp::e2e::Cluster;
using cdp::e2e::Which;
using cdp::testing::RunCommand;
using namespace std::chrono_literals;

struct Reply {
  int status = 0;  // 0: no HTTP answer (the error is the body)
  std::string body;
};

// GET https://127.0.0.1:port/target presenting the certificate `prefix`.crt
// (none when empty) and no token.
Reply GetAs(Cluster& c, uint16_t port, const std::string& target, const std::string& prefix) {
  cdp::http::ClientOptions co;
  co.tls_ca = c.pki_dir() + "/ca.crt";
  if (!prefix.empty()) {
    co.tls_cert = prefix + ".crt";
    co.tls_key = prefix + ".key";
  }
  auto r = cdp::http::HttpRequest("127.0.0.1", port, "GET", target, {}, 10s, co);
  if (!r.ok()) return Reply{0, r.status().ToString()};
  return Reply{r->status, r->body};
}

std::string Issue(Cluster& c, const std::vector<std::string>& role_args, const std::string& name) {
  const std::string prefix = c.Path("cert-" + name);
  std::vector<std::string> argv = {CDP_CTL_BIN, "pki", "issue", "--dir", c.pki_dir()};
  argv.insert(argv.end(), role_args.begin(), role_args.end());
  argv.insert(argv.end(), {"--name", name, "--out", prefix});
  auto r = RunCommand(argv);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return prefix;
}

}  // namespace

TEST_CASE("control certificates: admin is an admin, tenant its tenant, a daemon's certificate nothing, a revoked one "
          "refused after SIGHUP",
          "[e2e][security][tls][token]") {
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  const uint16_t mt = c.mt_control();
  const std::string vol = c.options().volume;

  const std::string ops = Issue(c, {"--role", "admin"}, "ops");
  const std::string alice = Issue(c, {"--role", "tenant", "--tenant", "acme"}, "alice");
  const std::string mallory = Issue(c, {"--role", "tenant", "--tenant", "globex"}, "mallory");
  // An admin certificate has no tenant, a tenant one needs one.
  auto bad = RunCommand({CDP_CTL_BIN, "pki", "issue", "--dir", c.pki_dir(), "--role", "admin", "--tenant", "acme",
                         "--name", "x", "--out", c.Path("x")});
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("a certificate of role admin has no tenant: drop --tenant") != std::string::npos);

  // Admin: every object, and the daemon-wide /status.
  Reply who = GetAs(c, mt, "/v1/whoami", ops);
  INFO(who.body);
  REQUIRE(who.status == 200);
  CHECK(json::parse(who.body).at("admin") == true);
  CHECK(json::parse(who.body).at("token_id") == "certificate:ops");
  CHECK(GetAs(c, mt, "/status", ops).status == 200);

  // cdpctl with the admin certificate and no token at all.
  auto ctl = RunCommand({CDP_CTL_BIN, "--mt", "127.0.0.1:" + std::to_string(mt), "--tls-ca", c.pki_dir() + "/ca.crt",
                         "--tls-cert", ops + ".crt", "--tls-key", ops + ".key", "--json", "points", vol});
  INFO(ctl.output);
  CHECK(ctl.exit_code == 0);
  CHECK(ctl.output.find("\"points\"") != std::string::npos);

  // Tenant acme: its volume, not /status. Tenant globex: not acme's volume.
  Reply vols = GetAs(c, mt, "/v1/volumes", alice);
  REQUIRE(vols.status == 200);
  REQUIRE(json::parse(vols.body).at("volumes").as_array().size() == 1);
  CHECK(json::parse(vols.body).at("volumes").at(0).at("volume") == json::value(vol));
  Reply st = GetAs(c, mt, "/status", alice);
  CHECK(st.status == 403);
  CHECK(st.body == R"({"error":"/status covers every tenant: it needs an admin token"})");
  Reply other = GetAs(c, mt, "/v1/volumes", mallory);
  REQUIRE(other.status == 200);
  CHECK(json::parse(other.body).at("volumes").as_array().empty());

  // A daemon's certificate (a protected host holds the agent's) and no
  // certificate are no caller.
  for (const std::string& prefix : {c.pki_dir() + "/agent", std::string()}) {
    INFO("certificate " << prefix);
    Reply r = GetAs(c, mt, "/v1/volumes", prefix);
    CHECK(r.status == 401);
    CHECK(r.body.find("or a client certificate of role admin or tenant") != std::string::npos);
  }

  // Revoke the admin certificate and reload the MT: refused at the handshake;
  // the tenant's certificate still works.
  auto rv = RunCommand({CDP_CTL_BIN, "pki", "revoke", "--dir", c.pki_dir(), ops + ".crt"});
  INFO(rv.output);
  REQUIRE(rv.exit_code == 0);
  REQUIRE(::kill(c.pid(Which::kMasterTarget), SIGHUP) == 0);
  const bool refused = cdp::e2e::WaitFor([&] { return GetAs(c, mt, "/v1/whoami", ops).status == 0; }, 20s);
  CHECK(refused);
  CHECK(GetAs(c, mt, "/v1/volumes", alice).status == 200);
}
