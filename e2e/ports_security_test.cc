// SPDX-License-Identifier: Apache-2.0
// Security at the control ports, against the real daemons (issue #12, tests 1
// and 5), each with the admin token it made at its first start:
//   1. a control POST without a token is 401 (and runs nothing), a wrong Host
//      header 403, a form-encoded POST 415; a tenant-B token cannot see,
//      export, roll back or hash tenant A's volume, and every attempt answers
//      exactly like a missing volume;
//   5. the agent runs its freeze hook only for an authenticated tag request;
//   and a throttle below the floor is a 400 that changes nothing.
#include <catch2/catch.hpp>

#include <algorithm>

#include <boost/json.hpp>
#include <fstream>
#include <sstream>

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

// curl with extra arguments; prints the HTTP status code only.
std::string Curl(uint16_t port, const std::string& path, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {"curl",       "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20",
                                   "--cacert", cdp::e2e::ControlClient("").tls_ca};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back("https://127.0.0.1:" + std::to_string(port) + path);
  return cdp::testing::RunCommand(argv, 30000).output;
}

size_t Lines(const std::string& path) {
  std::ifstream f(path);
  size_t n = 0;
  for (std::string line; std::getline(f, line);) ++n;
  return n;
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

}  // namespace

TEST_CASE("Control ports: tokens, Host, content type, tenant scope, freeze hook", "[e2e][security][control]") {
  REQUIRE(cdp::testing::HaveProgram("curl"));
  cdp::testing::ScratchDir marks;
  const std::string froze = marks.Join("froze");
  ClusterOptions o;
  o.mt_extra_config = "tenant = beta:beta-secret-0123456789\n";
  o.agent_extra_config = "freeze_command = echo freeze >> " + froze + "\n";
  Cluster c(o);
  INFO(c.Logs());
  REQUIRE(c.Start());
  const std::string vol = c.options().volume;
  const std::string admin_mt = c.token(Which::kMasterTarget);
  REQUIRE(admin_mt.size() == 64);

  SECTION("no token: 401 everywhere, nothing runs") {
    const std::string wrong(64, 'a');
    for (const std::string& token : {std::string(), wrong}) {
      INFO("token '" << token << "'");
      CHECK(Call(c.agent_control(), "POST", "/v1/tag", token, R"({"name":"t1"})").status == 401);
      CHECK(Call(c.agent_control(), "GET", "/v1/hashes?volume=" + vol, token).status == 401);
      CHECK(Call(c.agent_control(), "POST", "/v1/repair", token,
                 R"({"volume":")" + vol + R"(","offset":0,"length":4096})").status == 401);
      CHECK(Call(c.ps_control(), "POST", "/v1/throttle", token, R"({"mbps":10})").status == 401);
      CHECK(Call(c.ps_control(), "POST", "/v1/reprotect", token, R"({"volume":")" + vol + "\"}").status == 401);
      CHECK(Call(c.mt_control(), "POST", "/v1/export", token, R"({"volume":")" + vol + R"(","seq":1})").status == 401);
      CHECK(Call(c.mt_control(), "POST", "/v1/rollback", token, R"({"volume":")" + vol + R"(","seq":1})").status == 401);
      CHECK(Call(c.mt_control(), "GET", "/status", token).status == 401);
      CHECK(Call(c.mt_control(), "GET", "/metrics", token).status == 401);
    }
    CHECK(Lines(froze) == 0);  // the freeze hook never ran
    auto ex = Call(c.mt_control(), "GET", "/v1/exports", admin_mt);
    CHECK(json::parse(ex.body).at("exports").as_array().empty());
    auto th = Call(c.ps_control(), "GET", "/v1/throttle", c.token(Which::kProcessServer));
    CHECK(json::parse(th.body).at("limit_mbps").to_number<double>() == 0);

    // cdpctl without a token says what is missing.
    const std::string ca = cdp::e2e::ControlClient("").tls_ca;
    auto r = cdp::testing::RunCommand({"env", "-u", "CDP_TOKEN", "-u", "CDP_TOKEN_FILE", CDP_CTL_BIN, "--tls-ca", ca, "--mt",
                                       "127.0.0.1:" + std::to_string(c.mt_control()), "points", vol});
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("a control token is required") != std::string::npos);
    // ... and takes it from the environment.
    auto e = cdp::testing::RunCommand({"env", "CDP_TOKEN_FILE=" + c.token_path(Which::kMasterTarget),
                                       "CDP_TLS_CA=" + ca, CDP_CTL_BIN, "--mt", "127.0.0.1:" + std::to_string(c.mt_control()), "points", vol});
    INFO(e.output);
    CHECK(e.exit_code == 0);
  }

  SECTION("HTTPS on every control port: plain HTTP gets nothing, a server from another CA is refused by cdpctl") {
    for (uint16_t port : {c.agent_control(), c.ps_control(), c.mt_control()}) {
      INFO("port " << port);
      // Plain HTTP to a TLS port: the handshake fails, no HTTP answer at all.
      auto plain = cdp::testing::RunCommand({"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
                                             "-H", "Authorization: Bearer " + admin_mt,
                                             "http://127.0.0.1:" + std::to_string(port) + "/status"});
      CHECK(plain.output == "000");
      // HTTPS with the site CA: the daemon's certificate verifies (host name included).
      CHECK(Curl(port, "/status", {}) == "401");
    }
    // cdpctl with another site's CA refuses the server before it sends its token.
    cdp::testing::ScratchDir other;
    REQUIRE(cdp::testing::RunCommand({CDP_CTL_BIN, "pki", "init", "--dir", other.path()}).exit_code == 0);
    auto foreign = cdp::testing::RunCommand({"env", "CDP_TOKEN_FILE=" + c.token_path(Which::kMasterTarget), CDP_CTL_BIN,
                                             "--tls-ca", other.Join("ca.crt"), "--mt",
                                             "127.0.0.1:" + std::to_string(c.mt_control()), "points", vol});
    INFO(foreign.output);
    CHECK(foreign.exit_code == 1);
    CHECK(foreign.output.find("TLS handshake") != std::string::npos);
    // cdpctl in plain HTTP to a TLS port gets no answer either.
    auto clear = cdp::testing::RunCommand({"env", "-u", "CDP_TLS_CA",
                                           "CDP_TOKEN_FILE=" + c.token_path(Which::kMasterTarget), CDP_CTL_BIN, "--mt",
                                           "127.0.0.1:" + std::to_string(c.mt_control()), "points", vol});
    INFO(clear.output);
    CHECK(clear.exit_code == 1);
    // The MT logs that its control port speaks HTTPS.
    std::ifstream log(c.Path("master-target.log"));
    const std::string text((std::istreambuf_iterator<char>(log)), {});
    CHECK(text.find("(HTTPS, TLS 1.3, the site CA)") != std::string::npos);
  }

  SECTION("a wrong Host is 403 and a form post 415, even with the admin token") {
    const std::string auth = "Authorization: Bearer " + admin_mt;
    CHECK(Curl(c.mt_control(), "/status", {"-H", auth}) == "200");
    CHECK(Curl(c.mt_control(), "/status", {"-H", auth, "-H", "Host: evil.example"}) == "403");
    CHECK(Curl(c.mt_control(), "/v1/export", {"-H", auth, "-d", "volume=" + vol + "&seq=1"}) == "415");
    CHECK(Curl(c.mt_control(), "/v1/export", {"-H", auth, "-F", "volume=" + vol}) == "415");
    CHECK(Curl(c.mt_control(), "/v1/export?volume=" + vol + "&seq=1",
               {"-H", auth, "-X", "POST", "-H", "Content-Type: application/json", "-d", "{}"}) == "400");
    CHECK(Curl(c.agent_control(), "/v1/tag",
               {"-H", "Authorization: Bearer " + c.token(Which::kAgent), "-d", "name=t"}) == "415");
    CHECK(Lines(froze) == 0);
  }

  SECTION("a tenant-B token finds tenant A's volume exactly like a missing one") {
    auto issued = [&](const std::string& tenant) {
      auto j = c.CdpctlJson({"--tenant", tenant, "token", "issue"});
      INFO(c.why());
      REQUIRE(j.has_value());
      return std::string(j->at("token").as_string());
    };
    const std::string beta = issued("beta"), acme = issued("acme");
    // Tenant A sees its own volume; an export of it exists.
    auto pts = Call(c.mt_control(), "GET", "/v1/points?volume=" + vol, acme);
    REQUIRE(pts.status == 200);
    const size_t points_before = json::parse(pts.body).at("points").as_array().size();
    const uint64_t applied = json::value_to<uint64_t>(json::parse(pts.body).at("applied_seq"));
    auto ex = Call(c.mt_control(), "POST", "/v1/export", acme,
                   R"({"volume":")" + vol + R"(","seq":)" + std::to_string(applied) + "}");
    REQUIRE(ex.status == 200);
    const std::string export_name(json::parse(ex.body).at("export").as_string());

    // Every route, for A's volume and for a missing one, with and without tenant=acme.
    struct Probe {
      std::string method, target, body;
    };
    auto probes = [&](const std::string& v, const std::string& tenant_param) {
      const std::string q = "volume=" + v + (tenant_param.empty() ? "" : "&tenant=" + tenant_param);
      const std::string b = R"("volume":")" + v + "\"" + (tenant_param.empty() ? "" : R"(,"tenant":")" + tenant_param + "\"");
      return std::vector<Probe>{{"GET", "/v1/points?" + q, ""},
                                {"GET", "/v1/hashes?" + q, ""},
                                {"POST", "/v1/export", "{" + b + R"(,"seq":1})"},
                                {"POST", "/v1/rollback", "{" + b + R"(,"seq":1})"},
                                {"POST", "/v1/reprotect", "{" + b + "}"}};
    };
    for (const std::string& tp : {std::string(), std::string("acme")}) {
      auto real = probes(vol, tp), missing = probes("nosuchvol", tp);
      for (size_t i = 0; i < real.size(); ++i) {
        INFO(real[i].method << " " << real[i].target << " " << real[i].body);
        Answer a = Call(c.mt_control(), real[i].method, real[i].target, beta, real[i].body);
        Answer m = Call(c.mt_control(), missing[i].method, missing[i].target, beta, missing[i].body);
        CHECK(a.status == 404);
        CHECK(a.status == m.status);
        CHECK(a.body == Replace(m.body, "nosuchvol", vol));
        CHECK(a.body == R"({"error":"no volume )" + vol + "\"}");
      }
    }
    // Lists show nothing of tenant A; A's export cannot be removed by B.
    CHECK(Call(c.mt_control(), "GET", "/v1/volumes", beta).body == R"({"volumes":[]})");
    auto bex = Call(c.mt_control(), "GET", "/v1/exports", beta);
    CHECK(json::parse(bex.body).at("exports").as_array().empty());
    Answer un = Call(c.mt_control(), "POST", "/v1/unexport", beta, R"({"export":")" + export_name + "\"}");
    Answer un_missing = Call(c.mt_control(), "POST", "/v1/unexport", beta, R"({"export":"acme/nosuch@1"})");
    CHECK(un.status == 404);
    CHECK(un.body == Replace(un_missing.body, "acme/nosuch@1", export_name));
    CHECK(Call(c.mt_control(), "GET", "/status", beta).status == 403);
    CHECK(Call(c.mt_control(), "POST", "/v1/tokens", beta, R"({"tenant":"acme"})").status == 403);
    // Nothing of A changed: its points, its export.
    auto after = Call(c.mt_control(), "GET", "/v1/points?volume=" + vol, acme);
    CHECK(json::parse(after.body).at("points").as_array().size() >= points_before);
    auto aex = Call(c.mt_control(), "GET", "/v1/exports", acme);
    REQUIRE(json::parse(aex.body).at("exports").as_array().size() == 1);
    CHECK(Call(c.mt_control(), "POST", "/v1/unexport", acme, R"({"export":")" + export_name + "\"}").status == 200);

    // A revoked token is refused from then on.
    auto rv = c.Cdpctl({"--tenant", "beta", "token", "revoke"});
    INFO(rv.output);
    REQUIRE(rv.exit_code == 0);
    CHECK(Call(c.mt_control(), "GET", "/v1/volumes", beta).status == 401);
  }

  SECTION("the freeze hook runs once per authenticated tag, and a throttle under the floor is refused") {
    CHECK(Call(c.agent_control(), "POST", "/v1/tag", "", R"({"name":"t0"})").status == 401);
    CHECK(Lines(froze) == 0);
    auto t = c.Cdpctl({"tag", "t1"});
    INFO(t.output);
    REQUIRE(t.exit_code == 0);
    CHECK(Lines(froze) == 1);
    CHECK(Call(c.agent_control(), "POST", "/v1/tag", c.token(Which::kAgent), R"({"name":"t2"})").status == 200);
    CHECK(Lines(froze) == 2);

    const std::string ps = c.token(Which::kProcessServer);
    Answer slow = Call(c.ps_control(), "POST", "/v1/throttle", ps, R"({"mbps":0.000001})");
    CHECK(slow.status == 400);
    CHECK(slow.body == R"({"error":"throttle rate: 1e-06 Mbit/s is outside 0 (unlimited) or 0.5..1e+06"})");
    CHECK(Call(c.ps_control(), "POST", "/v1/throttle", ps, R"({"mpbs":10})").status == 400);
    CHECK(Call(c.ps_control(), "POST", "/v1/throttle", ps, R"({"mbps":"fast"})").body ==
          R"({"error":"parameter 'mbps' must be a number"})");
    auto th = Call(c.ps_control(), "GET", "/v1/throttle", ps);
    CHECK(json::parse(th.body).at("limit_mbps").to_number<double>() == 0);  // unchanged: unlimited
    CHECK(Call(c.ps_control(), "POST", "/v1/throttle", ps, R"({"mbps":0.5})").status == 200);
  }
}

TEST_CASE("insecure settings in force are shown by /status, a metric and cdpctl status, not one log line",
          "[e2e][security][control]") {
  cdp::e2e::ClusterOptions o;
  o.control_plain = true;  // control_tls = off (loopback only)
  o.mt_extra_config = "nbd_tls = off\n";
  Cluster c(o);
  INFO(c.why());
  REQUIRE(c.Start());
  auto st = c.StatusOf(Which::kMasterTarget);
  REQUIRE(st.has_value());
  INFO(json::serialize(*st));
  const json::array& mt = st->at("insecure").as_array();
  CHECK(std::find(mt.begin(), mt.end(), json::value("control_tls = off")) != mt.end());
  CHECK(std::find(mt.begin(), mt.end(), json::value("nbd_tls = off")) != mt.end());
  auto ps = c.StatusOf(Which::kProcessServer);
  REQUIRE(ps.has_value());
  CHECK(ps->at("insecure").as_array() == json::array{"control_tls = off"});
  auto metrics = Call(c.mt_control(), "GET", "/metrics", c.token(Which::kMasterTarget));
  CHECK(metrics.body.find("cdp_insecure_setting{setting=\"control_tls = off\"} 1") != std::string::npos);
  CHECK(metrics.body.find("cdp_insecure_setting{setting=\"nbd_tls = off\"} 1") != std::string::npos);
  auto status = c.Cdpctl({"status"});
  INFO(status.output);
  REQUIRE(status.exit_code == 0);
  CHECK(status.output.rfind("INSECURE: agent: control_tls = off\n", 0) == 0);  // first, loudly
  CHECK(status.output.find("INSECURE: process server: control_tls = off\n") != std::string::npos);
  CHECK(status.output.find("INSECURE: master target: nbd_tls = off\n") != std::string::npos);
}
