// SPDX-License-Identifier: Apache-2.0
// The test cluster of scripts/ceph-micro.sh itself: what the script promises.
#include "storage/tests/ceph_cluster.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "common/tests/test_util.h"

namespace cdp::storage::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Regression test: the OSD bound its cluster and heartbeat messengers to
// 0.0.0.0 until the script set "cluster addr" too.
TEST_CASE("the ceph test cluster listens on 127.0.0.1 only and requires cephx", "[ceph][e2e][cluster]") {
  CDP_CEPH_CLUSTER_OR_SKIP(cluster);
  auto ss = cdp::testing::RunCommand({"ss", "-Hltnp"}, 30000);
  REQUIRE(ss.exit_code == 0);
  for (const char* daemon : {"mon.a", "osd.0"}) {
    std::string pid = ReadFile(cluster->dir + "/run/" + daemon + ".pid");
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    INFO(daemon << " pid " << pid << "\n" << ss.output);
    REQUIRE(!pid.empty());
    std::istringstream lines(ss.output);
    std::string line;
    int listening = 0;
    while (std::getline(lines, line)) {
      if (line.find("pid=" + pid + ",") == std::string::npos) continue;
      ++listening;
      std::istringstream fields(line);
      std::string state, recvq, sendq, local;
      fields >> state >> recvq >> sendq >> local;
      CHECK(local.rfind("127.0.0.1:", 0) == 0);
    }
    CHECK(listening >= 1);
  }
  const std::string conf = ReadFile(cluster->conf);
  CHECK(conf.find("auth cluster required = cephx") != std::string::npos);
  CHECK(conf.find("auth client required = cephx") != std::string::npos);
  CHECK(conf.find("osd objectstore = memstore") != std::string::npos);
}

}  // namespace
}  // namespace cdp::storage::testing
