// SPDX-License-Identifier: Apache-2.0
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
// `sweep --local BUILD_DIR` runs it against a LocalCluster
// (loadgen/local_cluster.h), so that it and the tests need no running
// deployment. Compression off/on = the process server's codec "none" / "zstd".
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/env/env.h"
#include "loadgen/local_cluster.h"
#include "loadgen/sweep.h"

namespace cdp::loadgen {

struct SweepTargets {
  std::string agent_metrics, ps_metrics, mt_metrics;  // https://HOST:PORT/metrics (http:// with TLS off)
  std::string agent_token, ps_token, mt_token;        // their control tokens ("" = none)
  std::string tls_ca;                                 // the site CA of https:// URLs
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

// The targets of a local cluster (loadgen/local_cluster.h): its three
// /metrics and the agent's export.
SweepTargets TargetsOf(const LocalCluster& c);

// Removes `path` and, if it is a directory, everything under it. ok if absent.
Status RemoveAll(Env* env, const std::string& path);

}  // namespace cdp::loadgen
