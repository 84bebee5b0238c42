// SPDX-License-Identifier: Apache-2.0
// Issued control tokens at a real master target (issue #40, test 3;
// common/http/control_token.h):
//   - a token past its expiry gets 401, saying it expired;
//   - a tenant-read token lists and starts a read-only export, and gets 403
//     on rollback, failover, reprotect and a writable export, which change
//     nothing;
//   - revoking one token id leaves the tenant's other tokens working.
#include <catch2/catch.hpp>

#include <boost/json.hpp>

#include "common/http/http_client.h"
#include "common/tests/test_util.h"
#include "e2e/harness.h"

namespace {

namespace json = boost::json;
using cdp::e2e::Cluster;
using cdp::e2e::ClusterOptions;
using cdp::e2e::Which;

using cdp::e2e::Answer;
using cdp::e2e::Call;

}  // namespace

TEST_CASE("Tokens: expiry is 401, tenant-read reads and exports read-only only, revoke by id", "[e2e][security][token]") {
  Cluster c;
  INFO(c.Logs());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  const uint16_t mt = c.mt_control();

  struct Issued {
    std::string token, id;
  };
  auto issue = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--tenant", "acme", "token", "issue"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto j = c.CdpctlJson(args);
    INFO(c.why());
    REQUIRE(j.has_value());
    return Issued{std::string(j->at("token").as_string()), std::string(j->at("id").as_string())};
  };
  const Issued full = issue({}), other = issue({"--scope", "tenant"}), reader = issue({"--scope", "tenant-read"});
  const json::value who = json::parse(Call(mt, "GET", "/v1/whoami", reader.token).body);
  CHECK(who.at("tenant") == "acme");
  CHECK(who.at("read_only") == true);
  CHECK(who.at("token_id") == json::value(reader.id));

  SECTION("a tenant-read token lists and exports read-only, and is refused every state change") {
    auto pts = Call(mt, "GET", "/v1/points?volume=" + vol, reader.token);
    REQUIRE(pts.status == 200);
    const uint64_t applied = json::value_to<uint64_t>(json::parse(pts.body).at("applied_seq"));
    const size_t points = json::parse(pts.body).at("points").as_array().size();
    auto vols = Call(mt, "GET", "/v1/volumes", reader.token);
    REQUIRE(vols.status == 200);
    REQUIRE(json::parse(vols.body).at("volumes").as_array().size() == 1);
    const json::value before = json::parse(vols.body).at("volumes").at(0);

    const std::string seq = std::to_string(applied);
    auto ex = Call(mt, "POST", "/v1/export", reader.token, R"({"volume":")" + vol + R"(","seq":)" + seq + "}");
    INFO(ex.body);
    REQUIRE(ex.status == 200);
    CHECK(json::parse(ex.body).at("writable") == false);
    CHECK(Call(mt, "GET", "/v1/exports", reader.token).status == 200);

    const std::string b = R"("volume":")" + vol + R"(","seq":)" + seq;
    struct Probe {
      std::string path, body;
    };
    for (const Probe& p : {Probe{"/v1/rollback", "{" + b + "}"}, Probe{"/v1/failover", "{" + b + "}"},
                           Probe{"/v1/reprotect", R"({"volume":")" + vol + "\"}"},
                           Probe{"/v1/export", "{" + b + R"(,"writable":true})"}}) {
      INFO(p.path << " " << p.body);
      Answer a = Call(mt, "POST", p.path, reader.token, p.body);
      CHECK(a.status == 403);
      CHECK(a.body == R"({"error":"POST )" + p.path + R"x( changes state: this token is read-only (scope tenant-read)"})x");
    }
    CHECK(Call(mt, "POST", "/v1/tokens", reader.token, R"({"tenant":"acme"})").status == 403);
    CHECK(Call(mt, "POST", "/v1/unexport", reader.token, R"({"export":"x"})").status == 403);

    // Nothing changed: the volume is as it was (state, generation, no rollback
    // target), its points are all there, and the one export is the read-only one.
    auto after = Call(mt, "GET", "/v1/volumes", full.token);
    const json::value now = json::parse(after.body).at("volumes").at(0);
    CHECK(now.at("state") == before.at("state"));
    CHECK(now.at("generation") == before.at("generation"));
    CHECK(now.at("rollback_to") == before.at("rollback_to"));
    CHECK(now.at("failover").is_null());
    CHECK(now.at("reprotect_armed") == before.at("reprotect_armed"));
    CHECK(json::parse(Call(mt, "GET", "/v1/points?volume=" + vol, full.token).body).at("points").as_array().size() >=
          points);
    auto exports = json::parse(Call(mt, "GET", "/v1/exports", full.token).body).at("exports").as_array();
    REQUIRE(exports.size() == 1);
    CHECK(exports[0].at("writable") == false);

    // The same token with full tenant scope may make the writable export.
    CHECK(Call(mt, "POST", "/v1/export", full.token, "{" + b + R"(,"writable":true})").status == 200);

    // token list shows ids, scopes and the reader's last use, never a secret.
    auto list = c.Cdpctl({"token", "list"});
    INFO(list.output);
    REQUIRE(list.exit_code == 0);
    CHECK(list.output.find(reader.id) != std::string::npos);
    CHECK(list.output.find("tenant-read") != std::string::npos);
    CHECK(list.output.find(reader.token) == std::string::npos);
    CHECK(list.output.find(full.token) == std::string::npos);
    auto lj = c.CdpctlJson({"token", "list"});
    REQUIRE(lj.has_value());
    bool seen = false;
    for (const auto& t : lj->at("tokens").as_array()) {
      if (t.at("id") != json::value(reader.id)) continue;
      seen = true;
      CHECK(t.at("scope") == "tenant-read");
      CHECK(t.at("tenant") == "acme");
      CHECK(json::value_to<uint64_t>(t.at("last_used_us")) > 0);
      CHECK(json::value_to<uint64_t>(t.at("expires_us")) > json::value_to<uint64_t>(t.at("created_us")));
    }
    CHECK(seen);
  }

  SECTION("revoking one token id leaves the tenant's other tokens working") {
    auto rv = c.Cdpctl({"token", "revoke", full.id});
    INFO(rv.output);
    REQUIRE(rv.exit_code == 0);
    CHECK(Call(mt, "GET", "/v1/volumes", full.token).status == 401);
    CHECK(Call(mt, "GET", "/v1/volumes", other.token).status == 200);
    CHECK(Call(mt, "GET", "/v1/volumes", reader.token).status == 200);
    // It stays revoked across a restart of the master target; the others stay valid.
    REQUIRE(c.Kill9(Which::kMasterTarget));
    REQUIRE(c.Restart(Which::kMasterTarget));
    const uint16_t mt2 = c.mt_control();
    CHECK(Call(mt2, "GET", "/v1/volumes", full.token).status == 401);
    CHECK(Call(mt2, "GET", "/v1/volumes", other.token).status == 200);
    auto again = c.Cdpctl({"token", "revoke", full.id});
    CHECK(again.exit_code == 1);

    // An admin-scoped issued token acts as the admin (/status is the admin's
    // alone) until its id is revoked.
    auto adm = Call(mt2, "POST", "/v1/tokens", c.token(Which::kMasterTarget), R"({"scope":"admin","expires_seconds":600})");
    INFO(adm.body);
    REQUIRE(adm.status == 200);
    const json::value aj = json::parse(adm.body);
    const std::string admin_token(aj.at("token").as_string()), admin_id(aj.at("id").as_string());
    CHECK(aj.at("scope") == "admin");
    CHECK(Call(mt2, "GET", "/status", admin_token).status == 200);
    CHECK(Call(mt2, "GET", "/status", other.token).status == 403);
    CHECK(Call(mt2, "POST", "/v1/tokens/revoke", admin_token, R"({"id":")" + admin_id + "\"}").status == 200);
    CHECK(Call(mt2, "GET", "/status", admin_token).status == 401);
  }

  SECTION("a token past its expiry gets 401, saying so") {
    const Issued brief = issue({"--expires", "1s"});
    Answer last;
    // No sleep: poll until the one-second lifetime has run out (a deadline, not a wait).
    CHECK(cdp::testing::WaitUntil(
        [&] {
          last = Call(mt, "GET", "/v1/volumes", brief.token);
          return last.status == 401;
        },
        std::chrono::seconds(10), std::chrono::milliseconds(50)));
    INFO(last.body);
    CHECK(last.body.find("the control token " + brief.id + " expired at ") != std::string::npos);
    // The other tokens of the tenant are untouched.
    CHECK(Call(mt, "GET", "/v1/volumes", full.token).status == 200);
  }
}
