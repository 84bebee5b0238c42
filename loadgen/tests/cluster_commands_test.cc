// SPDX-License-Identifier: Apache-2.0
#include "loadgen/cluster_commands.h"

#include <catch2/catch.hpp>

#include "common/env/env.h"
#include "common/http/http_client.h"
#include "loadgen/tests/test_util.h"

namespace cdp::loadgen {
namespace {

using Kind = ClusterCommand::Kind;

TEST_CASE("cluster commands: each verb parses to its command", "[cluster_commands]") {
  auto s = ParseClusterCommand("start agent --encryption on --key_file /k");
  REQUIRE(s.ok());
  CHECK(s->kind == Kind::kStart);
  CHECK(s->role == Role::kAgent);
  CHECK(s->words == std::vector<std::string>{"--encryption", "on", "--key_file", "/k"});
  auto r = ParseClusterCommand("  restart   ps ");
  REQUIRE(r.ok());
  CHECK(r->kind == Kind::kRestart);
  CHECK(r->role == Role::kProcessServer);
  CHECK(ParseClusterCommand("stop mtb")->role == Role::kMasterTargetB);
  CHECK(ParseClusterCommand("kill9 mt")->kind == Kind::kKill9);
  auto v = ParseClusterCommand("volume v1=/a/b=c.img");
  REQUIRE(v.ok());
  CHECK(v->name == "v1");
  CHECK(v->path == "/a/b=c.img");
  CHECK(ParseClusterCommand("direct on")->on);
  CHECK_FALSE(ParseClusterCommand("direct off")->on);
  auto set = ParseClusterCommand("set mt nbd_tls=off max_open_files=128");
  REQUIRE(set.ok());
  CHECK(set->words == std::vector<std::string>{"nbd_tls=off", "max_open_files=128"});
  CHECK(ParseClusterCommand("quit")->kind == Kind::kQuit);
}

TEST_CASE("cluster commands: malformed lines are refused, naming the problem", "[cluster_commands]") {
  for (const char *bad :
       {"", "   ", "launch agent", "start", "start nbd", "stop ps now", "restart agent --x 1", "volume vol",
        "volume =x", "volume v=", "direct maybe", "set ps codec", "set ps =zstd", "quit now", "direct"}) {
    INFO(bad);
    auto c = ParseClusterCommand(bad);
    CHECK(c.status().code() == Code::kInvalidArgument);
  }
  CHECK(ParseClusterCommand("start robot").status().message().find("robot") != std::string::npos);
}

// The harness as the benchmarks drive it (bench/lib.sh): MT, MT B and PS at
// start, the agent later on another image with more flags, a PS restart on
// its ports, and the env file's endpoints answering with their tokens.
TEST_CASE(
    "cluster commands: a two-MT cluster started without its agent, "
    "driven command by command",
    "[cluster_commands][e2e]") {
  cdp::testing::ScratchDir tmp;
  LocalClusterOptions o = LocalClusterOptionsFor(CDP_BUILD_DIR, tmp.path() + "/c");
  o.tenant = "bench";
  o.master_targets = 2;
  o.start_agent = false;
  o.ps_args = {"--codec", "lz4"};
  o.die_with_parent = true;
  LocalCluster c(o);
  REQUIRE(c.Start().ok());
  CHECK(c.Running(Role::kMasterTarget));
  CHECK(c.Running(Role::kMasterTargetB));
  CHECK(c.Running(Role::kProcessServer));
  CHECK_FALSE(c.Running(Role::kAgent));
  std::string env = ClusterEnv(c);
  CHECK(env.find("CDP_AGENT_PID=\n") != std::string::npos);
  CHECK(env.find("CDP_MTB_PID=" + std::to_string(c.pid(Role::kMasterTargetB)) + "\n") != std::string::npos);
  CHECK(env.find("CDP_MTB_DATA='127.0.0.1:" + std::to_string(c.mtb_data_port()) + "'") != std::string::npos);

  auto get = [&](Role r, const std::string &path) {
    return http::HttpRequest("127.0.0.1", c.control_port(r), "GET", path, {}, std::chrono::seconds(10),
                             c.ControlClient(r));
  };
  // The PS ships to both master targets (copies = 2).
  auto ps = get(Role::kProcessServer, "/status");
  REQUIRE(ps.ok());
  INFO(ps->body);
  CHECK(ps->body.find(std::to_string(c.mtb_data_port())) != std::string::npos);

  // The agent on an image of the caller's, under another name.
  const std::string image = tmp.path() + "/other.img";
  REQUIRE(RunShell("truncate -s 64M " + image).exit_code == 0);
  CHECK(RunClusterCommand(c, *ParseClusterCommand("volume v9=/no/such.img")).code() == Code::kNotFound);
  REQUIRE(RunClusterCommand(c, *ParseClusterCommand("volume v9=" + image)).ok());
  Status st = RunClusterCommand(c, *ParseClusterCommand("start agent --budget 16MiB"));
  INFO(c.Logs());
  REQUIRE(st.ok());
  auto ag = get(Role::kAgent, "/status");
  REQUIRE(ag.ok());
  CHECK(ag->body.find("\"v9\"") != std::string::npos);
  CHECK(ClusterEnv(c).find("CDP_SOURCE='" + image + "'") != std::string::npos);
  // The volume reaches the PS, with the codec of the PS's flag (over the file's
  // "none").
  std::string volumes;
  CHECK(cdp::testing::WaitUntil(
      [&] {
        auto v = get(Role::kProcessServer, "/v1/volumes");
        volumes = v.ok() ? v->body : "";
        return volumes.find("\"v9\"") != std::string::npos;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(50)));
  INFO(volumes);
  CHECK(volumes.find("\"codec\":\"lz4\"") != std::string::npos);

  // Stop and restart the PS on the same ports; the agent stays up.
  const uint16_t ps_data = c.ps_data_port();
  REQUIRE(RunClusterCommand(c, *ParseClusterCommand("stop ps")).ok());
  CHECK_FALSE(c.Running(Role::kProcessServer));
  CHECK(ClusterEnv(c).find("CDP_PS_PID=\n") != std::string::npos);
  CHECK(RunClusterCommand(c, *ParseClusterCommand("stop ps")).ok());  // stopped already: nothing to do
  REQUIRE(RunClusterCommand(c, *ParseClusterCommand("restart ps")).ok());
  CHECK(c.ps_data_port() == ps_data);
  CHECK(get(Role::kProcessServer, "/status").ok());
  CHECK(RunClusterCommand(c, *ParseClusterCommand("start ps")).code() == Code::kAlreadyExists);
  c.StopAll();
  for (Role r : {Role::kAgent, Role::kProcessServer, Role::kMasterTarget, Role::kMasterTargetB})
    CHECK_FALSE(c.Running(r));
}

TEST_CASE("cluster commands: a second MT is refused without master_targets = 2", "[cluster_commands]") {
  cdp::testing::ScratchDir tmp;
  LocalCluster c(LocalClusterOptionsFor(CDP_BUILD_DIR, tmp.path() + "/c"));
  CHECK(c.StartOne(Role::kMasterTargetB).code() == Code::kInvalidArgument);
}

}  // namespace
}  // namespace cdp::loadgen
