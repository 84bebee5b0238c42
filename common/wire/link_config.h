// SPDX-License-Identifier: Apache-2.0
// The config keys of a replication link (repl::LinkOptions,
// common/wire/replication_sender.h): one set, the same in every daemon that
// ships records: the agent (to the process server) and the process server
// (to the master target). docs/operations.md, "Replication links".
//
//   link.frame_size       record bytes per frame (4KiB..32MiB)
//   link.inflight         frames per volume sent and not yet acknowledged (1..1024)
//   link.connect_timeout  connect and handshake
//   link.heartbeat        a heartbeat after this long without sending
//   link.dead_peer        nothing received for this long: reconnect
//   link.backoff_max      the longest wait between reconnection attempts
//
// A key not given keeps the daemon's default (its *LinkDefaults()). Older
// spellings stay accepted where a daemon had them (the agent's batch_bytes
// and max_inflight, the process server's frame_size and inflight); giving a
// key under both names is an error.
//
// Thread safety: plain functions.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/daemon/config.h"
#include "common/wire/replication_sender.h"

namespace cdp::repl {

// An older name of link.frame_size / link.inflight in one daemon's config
// ("" = none). The older key must be declared by the daemon, with a default.
struct LinkKeyAliases {
  std::string frame_size;
  std::string inflight;
};

// Declares the link.* keys; `defaults` shows in --help.
void AddLinkConfig(po::options_description* desc, const LinkOptions& defaults);

// Sets the fields of *link the config gives (link.* or their older names).
// Failure: kInvalidArgument naming the key.
Status LinkFromConfig(const po::variables_map& vars, const LinkKeyAliases& aliases, LinkOptions* link);

}  // namespace cdp::repl
