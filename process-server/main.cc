// SPDX-License-Identifier: Apache-2.0
// cdp-process-server: loads the config, runs the ProcessServer until SIGINT/SIGTERM.
#include "common/daemon/run_daemon.h"
#include "process-server/process_server.h"
#include "process-server/ps_config.h"

int main(int argc, char** argv) {
  using cdp::ps::ProcessServer;
  using cdp::ps::ProcessServerOptions;
  cdp::DaemonSpec<ProcessServer, ProcessServerOptions> spec;
  spec.program = "cdp-process-server";
  spec.summary = "OpenCDP process server: spools agents' writes, compresses and ships them to the master target";
  spec.default_config_path = "/etc/opencdp/process-server.conf";
  spec.log_name = "ps";
  spec.describe = [] { return cdp::ps::ProcessServerConfigDescription(); };
  spec.options = [](const cdp::po::variables_map& vars, cdp::log::Options* lo) {
    return cdp::ps::OptionsFromConfig(vars, lo);
  };
  spec.prepare = [](ProcessServerOptions& o, cdp::metrics::Registry* registry) {
    cdp::metrics::RegisterProcessMetrics(*registry, cdp::DefaultEnv(), cdp::SystemClock::Get());
    o.env = cdp::DefaultEnv();
    o.clock = cdp::SystemClock::Get();
    o.registry = registry;
  };
  return cdp::RunDaemon(argc, argv, spec);
}
