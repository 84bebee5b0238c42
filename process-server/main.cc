// cdp-process-server: loads the config, runs the ProcessServer until SIGINT/SIGTERM.
#include <csignal>
#include <cstdio>
#include <iostream>

#include "common/config.h"
#include "common/daemon.h"
#include "common/log.h"
#include "common/metrics.h"
#include "process-server/ps_config.h"
#include "process-server/process_server.h"

int main(int argc, char** argv) {
  cdp::TuneMalloc();  // keep freed data-path buffers (common/daemon.h)
  cdp::StopSignals signals;
  cdp::RaiseOpenFileLimit();  // descriptors grow with volumes (common/daemon.h)

  try {
    cdp::ConfigOptions co;
    co.program = "cdp-process-server";
    co.summary = "OpenCDP process server: spools agents' writes, compresses and ships them to the master target";
    co.default_config_path = "/etc/opencdp/process-server.conf";
    auto loaded = cdp::LoadConfig(argc, argv, cdp::ps::ProcessServerConfigDescription(), co);
    if (!loaded.ok()) {
      std::fprintf(stderr, "cdp-process-server: %s\n", loaded.status().ToString().c_str());
      return 2;
    }
    if (const std::string* answer = loaded->Answer()) {
      std::cout << *answer;
      return 0;
    }
    cdp::log::Options lo;
    auto opts = cdp::ps::OptionsFromConfig(loaded->vars, &lo);
    if (!opts.ok()) {
      std::fprintf(stderr, "cdp-process-server: %s\n", opts.status().ToString().c_str());
      return 2;
    }
    cdp::Status ls_status = cdp::log::Init(lo);
    if (!ls_status.ok()) {
      std::fprintf(stderr, "cdp-process-server: %s\n", ls_status.ToString().c_str());
      return 2;
    }
    cdp::metrics::Registry registry;
    cdp::metrics::RegisterProcessMetrics(registry, cdp::DefaultEnv(), cdp::SystemClock::Get());
    opts->env = cdp::DefaultEnv();
    opts->clock = cdp::SystemClock::Get();
    opts->registry = &registry;
    cdp::ps::ProcessServer server(*opts);
    cdp::Status s = server.Start();
    if (!s.ok()) {
      cdp::log::Get("ps")->critical("start failed: {}", s.ToString());
      return 1;
    }
    int sig = signals.Wait([&server] { (void)server.ReloadTls(); });
    cdp::log::Get("ps")->info("signal {}: stopping", sig);
    server.Stop();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cdp-process-server: %s\n", e.what());
    return 1;
  }
}
