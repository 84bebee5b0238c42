// cdp-agent: protects block volumes behind an NBD capture tap and ships every
// write to the process server. See docs/agent.md.
#include <cstdio>
#include <iostream>

#include "agent/agent_config.h"
#include "common/daemon.h"
#include "common/log.h"

namespace {

int Fail(const std::string& msg) {
  std::cerr << "cdp-agent: " << msg << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  cdp::TuneMalloc();  // keep freed data-path buffers (common/daemon.h)
  cdp::StopSignals signals;
  cdp::RaiseOpenFileLimit();  // descriptors grow with volumes (common/daemon.h)
  cdp::ConfigOptions co;
  co.program = "cdp-agent";
  co.summary = "OpenCDP agent: NBD capture tap with write-order capture, dirty bitmap and resync";
  co.default_config_path = "/etc/opencdp/agent.conf";
  auto loaded = cdp::LoadConfig(argc, argv, cdp::agent::AgentConfigDescription(), co);
  if (!loaded.ok()) return Fail(loaded.status().message());
  if (const std::string* answer = loaded->Answer()) {
    std::cout << *answer;
    return 0;
  }
  cdp::log::Options lo;
  auto ao = cdp::agent::AgentOptionsFromConfig(loaded->vars, cdp::DefaultEnv(), &lo);
  if (!ao.ok()) return Fail(ao.status().message());
  if (auto s = cdp::log::Init(lo); !s.ok()) return Fail(s.message());

  cdp::agent::Agent agent(*ao);
  if (auto s = agent.Start(); !s.ok()) return Fail(s.ToString());
  std::printf("cdp-agent ready: nbd_port=%u control_port=%u\n", agent.nbd_port(), agent.control_port());
  std::fflush(stdout);
  int sig = signals.Wait([&agent] { (void)agent.ReloadTls(); });
  cdp::log::Get("agent")->info("signal {}: stopping", sig);
  agent.Stop();
  return 0;
}
