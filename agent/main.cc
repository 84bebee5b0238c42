// SPDX-License-Identifier: Apache-2.0
// cdp-agent: protects block volumes behind an NBD capture tap and ships every
// write to the process server. See docs/agent.md.
#include <cstdio>

#include "agent/agent.h"
#include "agent/agent_config.h"
#include "common/daemon/run_daemon.h"

int main(int argc, char** argv) {
  using cdp::agent::Agent;
  using cdp::agent::AgentOptions;
  cdp::DaemonSpec<Agent, AgentOptions> spec;
  spec.program = "cdp-agent";
  spec.summary = "OpenCDP agent: NBD capture tap with write-order capture, dirty bitmap and resync";
  spec.default_config_path = "/etc/opencdp/agent.conf";
  spec.log_name = "agent";
  spec.describe = [] { return cdp::agent::AgentConfigDescription(); };
  spec.options = [](const cdp::po::variables_map& vars, cdp::log::Options* lo) {
    return cdp::agent::AgentOptionsFromConfig(vars, cdp::DefaultEnv(), lo);
  };
  // Scripts and tests wait for this line (docs/operations.md, "Without systemd").
  spec.started = [](Agent& agent) {
    std::printf("cdp-agent ready: nbd_port=%u control_port=%u\n", agent.nbd_port(), agent.control_port());
    std::fflush(stdout);
  };
  return cdp::RunDaemon(argc, argv, spec);
}
