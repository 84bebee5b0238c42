// SPDX-License-Identifier: Apache-2.0
// Certificate revocation end to end (issue 40, test 6; docs/operations.md,
// "Revoking a certificate"): `cdpctl pki revoke` adds the agent's certificate
// to the site CA's list, the process server loads it on SIGHUP (tls_crl), the
// agent's live session ends within 60 s and its next connection is refused at
// the TLS handshake, while the process server's own link to the master target
// is untouched.
#include <signal.h>

#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <chrono>
#include <fstream>
#include <string>

#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::Which;
using cdp::testing::RunCommand;
namespace json = boost::json;
using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The test volume's `connected` in the agent's /status (false when unanswered).
bool AgentConnected(Cluster& c) {
  auto a = c.StatusOf(Which::kAgent);
  if (!a) return false;
  for (const auto& v : a->at("volumes").as_array()) {
    if (v.at("name").as_string() == c.options().volume) return v.at("connected").as_bool();
  }
  return false;
}

}  // namespace

TEST_CASE("revocation: a revoked agent certificate loses its live session within 60 s and its next connection is "
          "refused, the other links stay up",
          "[e2e][security][tls]") {
  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  REQUIRE(AgentConnected(c));
  std::string w = cdp::e2e::RandomWrites(c.nbd_uri(), c.options().volume_size, 61, 1, 20, 0, c.dir());
  INFO(w);
  REQUIRE(w.empty());
  REQUIRE(c.WaitDrained());

  // Revoke the agent's certificate in the site CA's list, and reload the PS.
  const std::string pki = c.pki_dir();
  auto r = RunCommand({CDP_CTL_BIN, "pki", "revoke", "--dir", pki, pki + "/agent.crt"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("revoked: " + pki + "/agent.crt (agent e2e-agent)") != std::string::npos);
  // Revoking again changes nothing; a certificate of another CA is refused.
  CHECK(RunCommand({CDP_CTL_BIN, "pki", "revoke", "--dir", pki, pki + "/agent.crt"}).exit_code == 0);
  cdp::testing::ScratchDir other;
  REQUIRE(RunCommand({CDP_CTL_BIN, "pki", "init", "--dir", other.path()}).exit_code == 0);
  auto foreign = RunCommand({CDP_CTL_BIN, "pki", "revoke", "--dir", other.path(), pki + "/agent.crt"});
  CHECK(foreign.exit_code == 1);
  CHECK(foreign.output.find("was not issued by the CA of " + other.path()) != std::string::npos);

  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(::kill(c.pid(Which::kProcessServer), SIGHUP) == 0);
  const std::string ps_log = c.Path("process-server.log");
  // The live session ends...
  const bool cut = cdp::e2e::WaitFor(
      [&] { return Slurp(ps_log).find("(serial ") != std::string::npos && !AgentConnected(c); }, 60s);
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO(c.Logs(6000));
  REQUIRE(cut);
  CHECK(took < 60s);
  const std::string log = Slurp(ps_log);
  CHECK(log.find("certificate 'e2e-agent' (serial ") != std::string::npos);
  CHECK(log.find("is revoked: the session ends") != std::string::npos);
  // ... and its next connection is refused at the handshake.
  const bool refused = cdp::e2e::WaitFor(
      [&] { return Slurp(ps_log).find("certificate revoked") != std::string::npos; }, 30s);
  CHECK(refused);
  CHECK(!AgentConnected(c));
  // The PS's own certificate is not revoked: its link to the MT stays up, and
  // the MT still answers.
  auto ps = c.StatusOf(Which::kProcessServer);
  REQUIRE(ps.has_value());
  INFO(json::serialize(*ps));
  CHECK(json::serialize(*ps).find("\"link\":\"connected\"") != std::string::npos);
  CHECK(c.StatusOf(Which::kMasterTarget).has_value());
}
