// SPDX-License-Identifier: Apache-2.0
// The example configuration files of docs/examples/ are real: each daemon is
// started from its example, with only host names, ports, paths and devices
// replaced by scratch ones, and must come up and replicate (so a key renamed in
// a daemon, or a value the parser refuses, breaks this test, not an operator).
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "common/crypto/pki.h"
#include "common/http/control_token.h"
#include "common/http/http_client.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Daemon;
using cdp::e2e::FreePort;
using cdp::e2e::GetJson;
using cdp::e2e::WaitFor;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Replaces every occurrence of `from`; REQUIREs at least one (so the example
// and this test cannot drift apart silently).
void Sub(std::string* text, const std::string& from, const std::string& to) {
  INFO("example no longer contains '" << from << "'");
  REQUIRE(text->find(from) != std::string::npos);
  for (size_t pos = 0; (pos = text->find(from, pos)) != std::string::npos; pos += to.size()) {
    text->replace(pos, from.size(), to);
  }
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  REQUIRE(out.good());
}

}  // namespace

TEST_CASE("docs/examples configs start the three daemons, which then replicate", "[e2e][examples]") {
  const std::string ex = std::string(CDP_SOURCE_DIR) + "/docs/examples/";
  cdp::testing::ScratchDir dir;
  REQUIRE(!dir.path().empty());
  auto hp = [](uint16_t p) { return "127.0.0.1:" + std::to_string(p); };
  const uint16_t mt_data = FreePort(), mt_ctl = FreePort(), mt_nbd = FreePort(), ps_data = FreePort(),
                 ps_ctl = FreePort(), ag_ctl = FreePort();
  // The examples carry a placeholder the daemons refuse (issue 40): an
  // operator puts a random secret in its place, as this test does.
  const std::string placeholder = "change-me-to-a-long-random-secret";
  const std::string secret = "examples-e2e-3f9a0c51d2b84e67";
  // The site PKI the examples point at, made as `cdpctl pki` makes it.
  const std::string tls = dir.Join("tls");
  REQUIRE(cdp::pki::InitCa(tls, cdp::pki::CaOptions{}).ok());
  auto issue = [&](cdp::pki::CertRole role, const std::string& tenant, const std::string& name, const char* file) {
    cdp::pki::IssueOptions io;
    io.identity = cdp::pki::Identity{role, tenant, name};
    REQUIRE(cdp::pki::Issue(tls, io, tls + "/" + file + ".key", tls + "/" + file + ".crt").ok());
  };
  issue(cdp::pki::CertRole::kMasterTarget, "", "mt-1", "mt");
  issue(cdp::pki::CertRole::kProcessServer, "acme", "ps-1", "ps");
  issue(cdp::pki::CertRole::kAgent, "acme", "db-host-1", "agent");

  std::string mt = Slurp(ex + "master-target.conf");
  Sub(&mt, "0.0.0.0:7500", hp(mt_data));
  Sub(&mt, "127.0.0.1:9102", hp(mt_ctl));
  Sub(&mt, "127.0.0.1:10810", hp(mt_nbd));
  Sub(&mt, "/var/lib/opencdp/master-target", dir.Join("mt"));
  std::string tenants = Slurp(ex + "mt-tenants");
  Sub(&tenants, placeholder, secret);
  Write(dir.Join("mt-tenants"), tenants);
  ::chmod(dir.Join("mt-tenants").c_str(), 0600);
  Sub(&mt, "/etc/opencdp/mt-tenants", dir.Join("mt-tenants"));
  Sub(&mt, "/etc/opencdp/tls", tls);
  Write(dir.Join("mt.conf"), mt);

  std::string ps = Slurp(ex + "process-server.conf");
  Sub(&ps, "0.0.0.0:7400", hp(ps_data));
  Sub(&ps, "127.0.0.1:9101", hp(ps_ctl));
  Sub(&ps, "mt.provider.example:7500", hp(mt_data));
  Sub(&ps, "/var/lib/opencdp/ps/spool", dir.Join("spool"));
  Sub(&ps, "/etc/opencdp/tls", tls);
  REQUIRE(ps.find("tenant = acme:" + placeholder) != std::string::npos);
  Sub(&ps, placeholder, secret);
  Write(dir.Join("ps.conf"), ps);

  std::string ag = Slurp(ex + "agent.conf");
  Sub(&ag, "/dev/vg0/db", dir.Join("db.img"));
  Sub(&ag, "/dev/vg0/logs", dir.Join("logs.img"));
  Sub(&ag, "/run/opencdp/agent.sock", dir.Join("agent.sock"));
  Sub(&ag, "ps.example.net:7400", hp(ps_data));
  Sub(&ag, "/etc/opencdp/agent.secret", dir.Join("agent.secret"));
  Sub(&ag, "/var/lib/opencdp/agent", dir.Join("bitmaps"));
  Sub(&ag, "/etc/opencdp/tls", tls);
  Sub(&ag, "127.0.0.1:9100", hp(ag_ctl));
  Sub(&ag, "fsfreeze -f /srv/db", "true");
  Sub(&ag, "fsfreeze -u /srv/db", "true");
  Write(dir.Join("agent.conf"), ag);
  Write(dir.Join("agent.secret"), secret + "\n");
  ::chmod(dir.Join("agent.secret").c_str(), 0600);
  REQUIRE(cdp::e2e::MakeSparseFile(dir.Join("db.img"), 8 << 20));
  REQUIRE(cdp::e2e::MakeSparseFile(dir.Join("logs.img"), 8 << 20));

  Daemon dm, dp, da;
  REQUIRE(dm.Start({CDP_MT_BIN, "--config", dir.Join("mt.conf")}, dir.Join("mt.log")));
  REQUIRE(dp.Start({CDP_PS_BIN, "--config", dir.Join("ps.conf")}, dir.Join("ps.log")));
  REQUIRE(da.Start({CDP_AGENT_BIN, "--config", dir.Join("agent.conf")}, dir.Join("agent.log")));
  // Each daemon makes its admin control token at first start, in its state directory.
  // Their control ports speak HTTPS with the example's site CA.
  auto token = [&](const std::string& file) {
    auto t = cdp::ReadTokenFile(cdp::DefaultEnv(), file);
    cdp::http::ClientOptions co;
    co.bearer_token = t.ok() ? *t : std::string();
    co.tls_ca = tls + "/ca.crt";
    return co;
  };
  const std::pair<uint16_t, std::string> daemons[] = {{mt_ctl, dir.Join("mt/control.token")},
                                                      {ps_ctl, dir.Join("spool/control.token")},
                                                      {ag_ctl, dir.Join("bitmaps/control.token")}};
  for (const auto& [port, file] : daemons) {
    bool up = WaitFor([&] { return GetJson(port, "/status", token(file)).has_value(); }, std::chrono::seconds(30));
    INFO("port " << port << "\n" << Slurp(dir.Join("mt.log")) << Slurp(dir.Join("ps.log")) << Slurp(dir.Join("agent.log")));
    REQUIRE(up);
  }
  // Both volumes of the example reach the master target.
  bool both = WaitFor(
      [&] {
        auto s = GetJson(mt_ctl, "/status", token(dir.Join("mt/control.token")));
        return s && s->at("volumes").as_array().size() == 2;
      },
      std::chrono::seconds(30));
  INFO(Slurp(dir.Join("mt.log")) << Slurp(dir.Join("ps.log")) << Slurp(dir.Join("agent.log")));
  REQUIRE(both);
}
