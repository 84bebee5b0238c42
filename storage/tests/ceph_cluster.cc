// SPDX-License-Identifier: Apache-2.0
#include "storage/tests/ceph_cluster.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <vector>

#include "common/tests/test_util.h"

namespace cdp::storage::testing {
namespace {

const std::string kScript = std::string(CDP_SOURCE_DIR) + "/scripts/ceph-micro.sh";

// A cluster this process started: stopped and removed at exit.
struct OwnCluster {
  cdp::testing::ScratchDir dir;
  ~OwnCluster() { cdp::testing::RunCommand({kScript, "stop", dir.path()}, 120000); }
};

bool ParseEnv(const std::string& text, const std::string& dir, CephTestCluster* c) {
  std::istringstream in(text);
  std::string line;
  c->dir = dir;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "CEPH_CONF") c->conf = value;
    if (key == "CEPH_KEYRING") c->keyring = value;
    if (key == "CEPH_POOL") c->pool = value;
    if (key == "CEPH_CLIENT_ID") c->client_id = value;
    if (key == "CEPH_ADMIN_ID") c->admin_id = value;
  }
  return !c->conf.empty() && !c->pool.empty() && !c->client_id.empty();
}

}  // namespace

const CephTestCluster* TestCluster(std::string* skip_reason) {
  static std::unique_ptr<CephTestCluster> cluster;
  static std::unique_ptr<OwnCluster> own;
  if (cluster) return cluster.get();
  for (const char* tool : {"ceph-mon", "ceph-osd", "ceph", "rbd", "ceph-authtool", "monmaptool"}) {
    if (!cdp::testing::HaveProgram(tool)) {
      *skip_reason = std::string("the Ceph packages are not installed (no ") + tool +
                     "; scripts/install-deps.sh installs ceph-mon, ceph-osd, ceph-common)";
      return nullptr;
    }
  }
  const char* env_dir = std::getenv("CDP_CEPH_DIR");
  std::string dir;
  if (env_dir != nullptr && *env_dir != '\0') {
    dir = env_dir;
  } else {
    own = std::make_unique<OwnCluster>();
    REQUIRE(!own->dir.path().empty());
    dir = own->dir.path();
    auto r = cdp::testing::RunCommand(
        {"env", "CEPH_MICRO_OWNER_PID=" + std::to_string(::getpid()), kScript, "start", dir}, 300000);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  auto r = cdp::testing::RunCommand({kScript, "env", dir}, 30000);
  INFO("the test cluster in " << dir << ": " << r.output);
  REQUIRE(r.exit_code == 0);
  auto c = std::make_unique<CephTestCluster>();
  REQUIRE(ParseEnv(r.output, dir, c.get()));
  cluster = std::move(c);
  return cluster.get();
}

std::string UniqueName(const std::string& prefix) {
  static int counter = 0;
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
}

ScopedImages::~ScopedImages() {
  const std::vector<std::string> rbd = {"rbd", "--conf", cluster_.conf, "--name", "client." + cluster_.admin_id};
  auto ls = rbd;
  ls.insert(ls.end(), {"ls", cluster_.pool});
  auto r = cdp::testing::RunCommand(ls, 60000);
  std::istringstream names(r.output);
  for (std::string n; std::getline(names, n);) {
    if (n.compare(0, prefix_.size() + 1, prefix_ + "~") != 0) continue;
    auto rm = rbd;
    rm.insert(rm.end(), {"rm", "--no-progress", cluster_.pool + "/" + n});
    (void)cdp::testing::RunCommand(rm, 60000);
  }
}

}  // namespace cdp::storage::testing
