// cdp-process-server: loads the config, runs the ProcessServer until SIGINT/SIGTERM.
#include <csignal>
#include <cstdio>
#include <iostream>

#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "process-server/ps_config.h"
#include "process-server/server.h"

int main(int argc, char** argv) {
  // Block the stop signals in every thread; main waits for them with sigwait.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

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
    cdp::ps::LogSettings ls;
    auto opts = cdp::ps::OptionsFromConfig(loaded->vars, &ls);
    if (!opts.ok()) {
      std::fprintf(stderr, "cdp-process-server: %s\n", opts.status().ToString().c_str());
      return 2;
    }
    cdp::log::Options lo;
    lo.level = ls.level;
    lo.file = ls.file;
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
    int sig = 0;
    sigwait(&set, &sig);
    cdp::log::Get("ps")->info("signal {}: stopping", sig);
    server.Stop();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cdp-process-server: %s\n", e.what());
    return 1;
  }
}
