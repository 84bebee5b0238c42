// SPDX-License-Identifier: Apache-2.0
#include "common/wire/stage_metrics.h"

namespace cdp::repl {

namespace {

double Seconds(uint64_t us) { return double(us) / 1e6; }

}  // namespace

SeriesList RegisterShipStages(metrics::Registry& registry, const std::string& prefix,
                              std::function<ShipStages()> stages, const metrics::Labels& labels) {
  SeriesList out;
  auto add = [&](const std::string& name, const char* help, const metrics::Labels& lb, std::function<double()> fn) {
    registry.AddComputed(name, help, metrics::Type::kCounter, std::move(fn), lb);
    out.emplace_back(name, lb);
  };
  const std::string seconds = prefix + "_ship_seconds_total";
  const std::pair<const char*, uint64_t ShipStages::*> kStages[] = {
      {"read", &ShipStages::read_us},          {"idle_read", &ShipStages::idle_read_us},
      {"encode", &ShipStages::encode_us},      {"encode_cpu", &ShipStages::encode_cpu_us},
      {"write", &ShipStages::write_us},        {"write_cpu", &ShipStages::write_cpu_us},
      {"ack", &ShipStages::ack_us},
  };
  for (const auto& [stage, field] : kStages) {
    metrics::Labels lb = labels;
    lb.emplace_back("stage", stage);
    add(seconds, "Time of the replication stream's sending stages (read, encode, write: the sending thread; ack: write to Ack, per frame)",
        lb, [stages, field = field] { return Seconds(stages().*field); });
  }
  add(prefix + "_ship_frames_total", "Frames sent", labels, [stages] { return double(stages().frames); });
  add(prefix + "_ship_acked_frames_total", "Frames an Ack covered", labels,
      [stages] { return double(stages().acked_frames); });
  add(prefix + "_ship_record_bytes_total", "Record data of the frames sent", labels,
      [stages] { return double(stages().record_bytes); });
  add(prefix + "_ship_wire_bytes_total", "Frame bytes sent (compressed, headers included)", labels,
      [stages] { return double(stages().wire_bytes); });
  return out;
}

SeriesList RegisterReceiveStages(metrics::Registry& registry, const std::string& prefix, const ReceiveStages* stages,
                                 const metrics::Labels& labels) {
  SeriesList out;
  auto add = [&](const std::string& name, const char* help, const metrics::Labels& lb, std::function<double()> fn) {
    registry.AddComputed(name, help, metrics::Type::kCounter, std::move(fn), lb);
    out.emplace_back(name, lb);
  };
  const std::string seconds = prefix + "_receive_seconds_total";
  const std::pair<const char*, const std::atomic<uint64_t>*> kStages[] = {
      {"receive_cpu", &stages->inbox.receive_cpu_us},
      {"queue", &stages->inbox.queue_us},
      {"apply", &stages->apply_us},
      {"answer", &stages->answer_us},
  };
  for (const auto& [stage, v] : kStages) {
    metrics::Labels lb = labels;
    lb.emplace_back("stage", stage);
    add(seconds, "Time of the replication stream's receiving stages (receive_cpu: the reader's CPU; queue: summed per message)",
        lb, [v = v] { return Seconds(v->load()); });
  }
  add(prefix + "_receive_messages_total", "Messages received on replication sessions", labels,
      [stages] { return double(stages->inbox.messages.load()); });
  add(prefix + "_receive_groups_total", "Group commits applied (one or more WriteBatches each)", labels,
      [stages] { return double(stages->groups.load()); });
  return out;
}

}  // namespace cdp::repl
