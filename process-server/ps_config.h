// SPDX-License-Identifier: Apache-2.0
// The process server's configuration: option declarations for
// common/daemon/config.h and their translation into ProcessServerOptions.
//
// Keys (file `key = value`, or `--key value` flags which override the file):
//   listen = 0.0.0.0:7400            agent data port
//   control = 127.0.0.1:9101         HTTP control/metrics/status
//   mt = 127.0.0.1:7500              master target data port. Repeat the key for
//                                    more copies: each `mt` is one more master
//                                    target, the first is the primary (copy 0);
//                                    `--mt A B` on the command line replaces the
//                                    file's whole list
//   copies = 0                       copies per volume, shipped to the first N
//                                    `mt` in parallel (0 = every `mt`; 1..count)
//   volume_copies = TENANT/VOLUME=N  per-volume override (repeatable)
//   client_id = process-server       name this PS gives the MT
//   tenant = NAME:SECRET             one per tenant (repeatable)
//   spool_dir = /var/lib/opencdp/ps/spool
//   quota = 10GiB                    per-volume backlog limit (0 = unlimited)
//   segment_size = 64MiB
//   codec = zstd | lz4 | none        default codec
//   level = 1                        zstd level (1..19)
//   volume_codec = TENANT/VOLUME=zstd:3   per-volume override (repeatable)
//   frame_size = 1MiB                raw record bytes per shipped frame
//   inflight = 32                    frames per volume awaiting the MT's ack
//   volume_inflight = TENANT/VOLUME=N   per-volume override (LoRS "threads"; repeatable)
//   connections = 1                  MT connections per tenant
//   compress_threads = 0             compression pool per tenant (0 = CPU cores)
//   throttle_mbps = 0                default rate, Mbit/s (0 = unlimited)
//   throttle_schedule = 20@08:00-18:00   windows (see common/net/throttle.h)
//   throttle_utc_offset = 0          minutes added to UTC for the schedule
//   throttle_burst = 256KiB
//   [log] level = info, file = ...
//
// Thread safety: pure functions, for start-up.
#pragma once

#include "common/base/log.h"
#include "common/base/result.h"
#include "common/daemon/config.h"
#include "process-server/process_server.h"

namespace cdp::ps {

po::options_description ProcessServerConfigDescription();

// Translates loaded values. kInvalidArgument names the bad key and value.
// Fills *log with the [log] keys when given.
Result<ProcessServerOptions> OptionsFromConfig(const po::variables_map& vars, log::Options* log = nullptr);

}  // namespace cdp::ps
