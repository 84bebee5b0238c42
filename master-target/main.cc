// cdp-master-target: the provider-side daemon. See master-target/master_target.h for
// the protocol and control API, docs/recovery.md for operating it.
#include <iostream>

#include "common/daemon.h"
#include "common/log.h"
#include "master-target/mt_config.h"

namespace {

int Fail(const std::string& msg) {
  std::cerr << "cdp-master-target: " << msg << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  cdp::TuneMalloc();  // keep freed data-path buffers (common/daemon.h)
  cdp::StopSignals signals;
  cdp::RaiseOpenFileLimit();  // descriptors grow with volumes (common/daemon.h)
  cdp::ConfigOptions co;
  co.program = "cdp-master-target";
  co.summary = "OpenCDP master target: applies replicated writes behind an undo journal";
  co.default_config_path = "/etc/opencdp/master-target.conf";
  auto cfg = cdp::LoadConfig(argc, argv, cdp::mt::MasterTargetConfigDescription(), co);
  if (!cfg.ok()) return Fail(cfg.status().message());
  if (const std::string* answer = cfg->Answer()) {
    std::cout << *answer;
    return 0;
  }
  cdp::log::Options lo;
  auto o = cdp::mt::MasterTargetOptionsFromConfig(cfg->vars, cdp::DefaultEnv(), &lo);
  if (!o.ok()) return Fail(o.status().message());
  if (cdp::Status s = cdp::log::Init(lo); !s.ok()) return Fail(s.ToString());
  auto log = cdp::log::Get("mt");
  if (o->tenants.empty()) log->warn("no tenants configured: every connection will be refused");

  cdp::mt::MasterTarget mt(*o);
  if (cdp::Status s = mt.Start(); !s.ok()) {
    log->critical("start failed: {}", s.ToString());
    return 1;
  }
  int sig = signals.Wait([&mt] { (void)mt.ReloadTls(); });
  log->info("signal {}: stopping", sig);
  mt.Stop();
  return 0;
}
