// SPDX-License-Identifier: Apache-2.0
// Every binary answers --version and --help, names an unknown option and exits
// non-zero for it; and the dependency step finds nothing missing once `make`
// has run it (so it never reaches apt again).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/base/version.h"
#include "common/tests/test_util.h"

namespace {

using cdp::testing::RunCommand;

struct Binary {
  const char* path;
  const char* name;
};

const std::vector<Binary>& Binaries() {
  static const std::vector<Binary> all = {{CDP_AGENT_BIN, "cdp-agent"},
                                          {CDP_PS_BIN, "cdp-process-server"},
                                          {CDP_MT_BIN, "cdp-master-target"},
                                          {CDP_LOADGEN_BIN, "cdp-loadgen"},
                                          {CDP_CTL_BIN, "cdpctl"}};
  return all;
}

TEST_CASE("every binary prints its version and git revision", "[e2e][cli]") {
  for (const Binary& b : Binaries()) {
    INFO(b.name);
    auto r = RunCommand({b.path, "--version"}, 10000);
    CHECK(r.exit_code == 0);
    CHECK(r.output == cdp::VersionText(b.name));
    CHECK(r.output.find(std::string(" (git ") + std::string(cdp::GitRevision()) + ")") != std::string::npos);
  }
  CHECK(cdp::ProjectVersion() == "0.1.0");
}

TEST_CASE("every binary prints its usage for --help and exits 0", "[e2e][cli]") {
  for (const Binary& b : Binaries()) {
    INFO(b.name);
    auto r = RunCommand({b.path, "--help"}, 10000);
    CHECK(r.exit_code == 0);
    CHECK((r.output.find("Usage: ") == 0 || r.output.find("usage: ") == 0));
  }
}

TEST_CASE("every binary names an unknown option and exits 2", "[e2e][cli]") {
  for (const Binary& b : Binaries()) {
    INFO(b.name);
    auto r = RunCommand({b.path, "--bogus-option"}, 10000);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("'--bogus-option'") != std::string::npos);
  }
}

TEST_CASE("the dependency step finds nothing missing after make ran it", "[e2e][cli]") {
  // Regression: it asked apt for "nbdfuse", a name no Debian package has, on every make.
  auto r = RunCommand({"bash", std::string(CDP_SOURCE_DIR) + "/scripts/install-deps.sh", "--check"}, 60000);
  CHECK(r.output == "");
  CHECK(r.exit_code == 0);
}

}  // namespace

TEST_CASE("the systemd units are hardened: exposure at most 2.0 in systemd-analyze security", "[e2e][cli][security]") {
  // systemd-analyze (Debian package systemd, an install-deps package) scores a
  // unit file without loading it; --threshold=20 fails above an exposure of 2.0.
  REQUIRE(cdp::testing::HaveProgram("systemd-analyze"));
  for (const char* unit : {"cdp-agent.service", "cdp-process-server.service", "cdp-master-target.service"}) {
    const std::string path = std::string(CDP_SOURCE_DIR) + "/packaging/" + unit;
    auto r = RunCommand({"systemd-analyze", "security", "--offline=true", "--threshold=20", path}, 60000);
    INFO(unit << "\n" << r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("Overall exposure level for " + std::string(unit)) != std::string::npos);
  }
}
