// SPDX-License-Identifier: Apache-2.0
// cdp-master-target: the provider-side daemon. See master-target/master_target.h for
// the protocol and control API, docs/recovery.md for operating it.
#include "common/daemon/run_daemon.h"
#include "master-target/master_target.h"
#include "master-target/mt_config.h"

int main(int argc, char** argv) {
  using cdp::mt::MasterTarget;
  using cdp::mt::MasterTargetOptions;
  cdp::DaemonSpec<MasterTarget, MasterTargetOptions> spec;
  spec.program = "cdp-master-target";
  spec.summary = "OpenCDP master target: applies replicated writes behind an undo journal";
  spec.default_config_path = "/etc/opencdp/master-target.conf";
  spec.log_name = "mt";
  spec.describe = [] { return cdp::mt::MasterTargetConfigDescription(); };
  spec.options = [](const cdp::po::variables_map& vars, cdp::log::Options* lo) {
    return cdp::mt::MasterTargetOptionsFromConfig(vars, cdp::DefaultEnv(), lo);
  };
  spec.prepare = [](MasterTargetOptions& o, cdp::metrics::Registry*) {
    if (o.tenants.empty()) cdp::log::Get("mt")->warn("no tenants configured: every connection will be refused");
  };
  return cdp::RunDaemon(argc, argv, spec);
}
