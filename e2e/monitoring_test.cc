// SPDX-License-Identifier: Apache-2.0
// The monitoring the packages ship (packaging/prometheus, packaging/grafana):
// the alert rules pass promtool, and every metric the rules and the dashboard
// name is exported by a running daemon.
#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "common/http/http_client.h"
#include "common/tests/test_util.h"
#include "e2e/harness.h"

namespace {

using cdp::e2e::Cluster;
using cdp::e2e::Which;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Metric names (cdp_...) a rules or dashboard file refers to.
std::set<std::string> Names(const std::string& text) {
  std::set<std::string> out;
  std::regex re("cdp_[a-z0-9_]+");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.insert(it->str());
  return out;
}

const std::string kRules = std::string(CDP_SOURCE_DIR) + "/packaging/prometheus/opencdp-alerts.yml";
const std::string kDashboard = std::string(CDP_SOURCE_DIR) + "/packaging/grafana/opencdp-dashboard.json";

}  // namespace

TEST_CASE("the alert rules pass promtool check rules", "[e2e][monitoring]") {
  REQUIRE(cdp::testing::HaveProgram("promtool"));  // Debian package prometheus (scripts/install-deps.sh)
  auto r = cdp::testing::RunCommand({"promtool", "check", "rules", kRules}, 60000);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.output.find("SUCCESS: 11 rules found") != std::string::npos);
}

TEST_CASE("every metric the alert rules and the dashboard use is exported by a daemon", "[e2e][monitoring]") {
  std::set<std::string> wanted = Names(ReadAll(kRules));
  const std::set<std::string> dash = Names(ReadAll(kDashboard));
  REQUIRE(wanted.size() >= 10);
  REQUIRE(dash.size() >= 10);
  wanted.insert(dash.begin(), dash.end());

  Cluster c;
  INFO(c.why());
  REQUIRE(c.Start());
  std::string all;
  for (auto [port, w] : {std::pair{c.agent_control(), Which::kAgent}, std::pair{c.ps_control(), Which::kProcessServer},
                         std::pair{c.mt_control(), Which::kMasterTarget}}) {
    cdp::http::ClientOptions co = cdp::e2e::ControlClient(c.token(w));
    auto r = cdp::http::HttpRequest("127.0.0.1", port, "GET", "/metrics", "", std::chrono::milliseconds(20000), co);
    REQUIRE(r.ok());
    REQUIRE(r->status == 200);
    all += "\n" + r->body;
  }
  for (const std::string& name : wanted) {
    INFO(name);
    const bool exported = all.find("\n" + name + "{") != std::string::npos || all.find("\n" + name + " ") != std::string::npos;
    CHECK(exported);
  }
}
