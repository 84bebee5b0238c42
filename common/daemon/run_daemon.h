// SPDX-License-Identifier: Apache-2.0
// RunDaemon: the one main() of the three daemons (cdp-agent,
// cdp-process-server, cdp-master-target). Each main() is a DaemonSpec: its
// name and config, how its options come from the config, and two hooks.
//
//   TuneMalloc, StopSignals (before any thread), RaiseOpenFileLimit
//   LoadConfig (--help / --version answered: exit 0; a bad option: exit 2)
//   spec.options(vars) -> Options, log::Init (an error: exit 2)
//   spec.prepare(options, registry)   fill what the config does not say
//   Daemon d(options); d.Start()      a failure: logged and on stderr, exit 1
//   spec.started(d)                   e.g. the agent's "ready" line
//   wait for SIGINT/SIGTERM, d.ReloadTls() at each SIGHUP; d.Stop(): exit 0
//
// Daemon needs a constructor from Options, Start() -> Status, ReloadTls()
// and Stop(). The registry handed to prepare outlives the daemon. Errors go
// to stderr as "PROGRAM: message". An exception escaping the daemon is
// caught here: "PROGRAM: what", exit 1.
//
// Thread safety: call once, from main().
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <string>

#include "common/base/log.h"
#include "common/daemon/config.h"
#include "common/daemon/daemon.h"
#include "common/daemon/metrics.h"

namespace cdp {

template <typename Daemon, typename Options>
struct DaemonSpec {
  const char* program = "";              // "cdp-agent": usage, errors
  const char* summary = "";              // the first line of --help
  const char* default_config_path = "";  // "/etc/opencdp/agent.conf"
  const char* log_name = "";             // the logger of start and stop lines
  std::function<po::options_description()> describe;  // the config keys
  std::function<Result<Options>(const po::variables_map&, log::Options*)> options;
  std::function<void(Options&, metrics::Registry*)> prepare;  // may be empty
  std::function<void(Daemon&)> started;                      // may be empty
};

template <typename Daemon, typename Options>
int RunDaemon(int argc, char** argv, const DaemonSpec<Daemon, Options>& spec) {
  TuneMalloc();  // keep freed data-path buffers (common/daemon/daemon.h)
  StopSignals signals;
  RaiseOpenFileLimit();  // descriptors grow with volumes (common/daemon/daemon.h)
  auto fail = [&](const std::string& message, int code) {
    std::cerr << spec.program << ": " << message << "\n";
    return code;
  };
  try {
    ConfigOptions co;
    co.program = spec.program;
    co.summary = spec.summary;
    co.default_config_path = spec.default_config_path;
    auto loaded = LoadConfig(argc, argv, spec.describe(), co);
    if (!loaded.ok()) return fail(loaded.status().message(), 2);
    if (const std::string* answer = loaded->Answer()) {
      std::cout << *answer;
      return 0;
    }
    log::Options lo;
    Result<Options> opts = spec.options(loaded->vars, &lo);
    if (!opts.ok()) return fail(opts.status().message(), 2);
    if (Status s = log::Init(lo); !s.ok()) return fail(s.message(), 2);
    metrics::Registry registry;
    if (spec.prepare) spec.prepare(*opts, &registry);
    Daemon daemon(*opts);
    if (Status s = daemon.Start(); !s.ok()) {
      log::Get(spec.log_name)->critical("start failed: {}", s.ToString());
      return fail("start failed: " + s.ToString(), 1);
    }
    if (spec.started) spec.started(daemon);
    const int sig = signals.Wait([&daemon] { (void)daemon.ReloadTls(); });
    log::Get(spec.log_name)->info("signal {}: stopping", sig);
    daemon.Stop();
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), 1);
  }
}

}  // namespace cdp
