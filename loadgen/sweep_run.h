// Sweep driver: runs the seed's experiment (sweep.h) against a deployment.
//
//   for each size:  wait until the agent queue and PS backlog are empty
//                   snapshot /metrics of agent, PS, MT           (begin)
//                   for `window`: write a tree of `size` MB (seed 8), pause, delete
//                   snapshot /metrics again                      (end)
//
// The tree goes either to a directory (a file system mounted over the agent's
// NBD export: the seed's setup) or straight into an NBD export, the files'
// bytes laid end to end from offset 0 (wrapping at the export's end) -- the
// block writes a file system would issue for them, minus its metadata.
//
// LocalDeployment starts a real cdp-master-target, cdp-process-server and
// cdp-agent on loopback (free ports, a temporary directory, one sparse
// volume), as scripts/demo.sh does, so that `sweep --local BUILD_DIR` and the
// tests need no running deployment. Compression off/on = the process server's
// codec "none" / "zstd".
//
// Thread safety: a LocalDeployment is used from one thread; its destructor
// stops the daemons (SIGTERM, then SIGKILL after 10 s).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/env.h"
#include "common/result.h"
#include "loadgen/sweep.h"

namespace cdp::loadgen {

struct SweepTargets {
  std::string agent_metrics, ps_metrics, mt_metrics;  // http://HOST:PORT/metrics
  std::string nbd_uri;                                // the protected volume's export, or
  std::string dir;                                    // a directory on a file system over it
};

struct SweepRunOptions {
  std::vector<uint64_t> sizes_mb = {1, 10, 50, 100, 150, 200, 250};
  uint64_t seed = 8;
  double compressibility = 0.75;
  uint64_t window_us = 60'000'000;
  uint64_t pause_us = 4'000'000;         // ping -n 5 localhost
  uint64_t drain_timeout_us = 300'000'000;
  uint64_t warmup_us = 0;                // one unrecorded window of the first size first
  std::function<void(const std::string&)> log;  // progress lines (may be empty)
};

// Runs one phase (all sizes) and returns its samples, labelled `compression`.
// Failure: a scrape, write or drain-timeout error naming what failed.
Result<std::vector<SweepSample>> RunSweepPhase(const SweepTargets& t, bool compression, const SweepRunOptions& o,
                                               Env* env, const Clock* clock);

// Waits until cdp_agent_queue_bytes and cdp_ps_backlog_bytes are 0.
Status WaitDrained(const SweepTargets& t, uint64_t timeout_us, const Clock* clock);

struct LocalDeploymentOptions {
  std::string agent_bin, ps_bin, mt_bin;  // paths of the three daemons
  std::string work_dir;                   // created; holds configs, data, logs
  std::string codec = "none";             // PS codec: none | lz4 | zstd
  int level = 1;
  uint64_t volume_bytes = 1ull << 30;     // sparse source volume
};

class LocalDeployment {
 public:
  explicit LocalDeployment(LocalDeploymentOptions o) : o_(std::move(o)) {}
  ~LocalDeployment();
  LocalDeployment(const LocalDeployment&) = delete;
  LocalDeployment& operator=(const LocalDeployment&) = delete;

  // Writes configs, starts MT, PS and agent and waits (30 s each) until each
  // answers /status. Failure: which daemon failed, with the tail of its log.
  Status Start();
  // SIGTERM every daemon, wait, SIGKILL stragglers. Idempotent.
  void Stop();
  const SweepTargets& targets() const { return targets_; }

 private:
  Status Spawn(const std::string& name, const std::string& bin, const std::string& conf, uint16_t control_port);
  LocalDeploymentOptions o_;
  SweepTargets targets_;
  std::vector<pid_t> pids_;
};

// Removes `path` and, if it is a directory, everything under it. ok if absent.
Status RemoveAll(Env* env, const std::string& path);

// An unused TCP port on 127.0.0.1 (bound with port 0, then released).
Result<uint16_t> FreeLoopbackPort();

}  // namespace cdp::loadgen
