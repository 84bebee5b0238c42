// SPDX-License-Identifier: Apache-2.0
// Stage metrics: the stage costs of the replication stream (issue 42), as
// Prometheus series, the same for every daemon. `prefix` is the daemon's
// ("cdp_agent", "cdp_ps", "cdp_mt"); every series carries `labels`.
//
// Sending half (repl::ShipStages of a ReplicationSender, or a sum of them):
//   PREFIX_ship_seconds_total{stage=read|idle_read|encode|encode_cpu|write|write_cpu|ack}
//   PREFIX_ship_frames_total, PREFIX_ship_acked_frames_total
//   PREFIX_ship_record_bytes_total, PREFIX_ship_wire_bytes_total
// Receiving half (repl::ReceiveStages):
//   PREFIX_receive_seconds_total{stage=receive_cpu|queue|apply|answer}
//   PREFIX_receive_messages_total, PREFIX_receive_groups_total
//
// A stage's seconds per second of wall time is the share of a thread it
// kept busy: the sending thread runs read, encode and write one after the
// other, so their sum near 1 s/s means that thread is the bottleneck; ack
// divided by acked frames is the mean time from a frame's write to its Ack.
// docs/benchmarks.md ("Where the stream's time goes") reads them.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/daemon/metrics.h"
#include "common/wire/replication_receiver.h"
#include "common/wire/replication_sender.h"

namespace cdp::repl {

// The series registered, as (name, labels), for a caller that removes them later.
using SeriesList = std::vector<std::pair<std::string, metrics::Labels>>;

// `stages` is called at render time (with the registry's lock held: it must
// not call back into the registry).
SeriesList RegisterShipStages(metrics::Registry& registry, const std::string& prefix,
                              std::function<ShipStages()> stages, const metrics::Labels& labels = {});
// `stages` must outlive the registry's use of it (until the series are removed).
SeriesList RegisterReceiveStages(metrics::Registry& registry, const std::string& prefix, const ReceiveStages* stages,
                                 const metrics::Labels& labels = {});

}  // namespace cdp::repl
