// SPDX-License-Identifier: Apache-2.0
#include "common/wire/link_config.h"

#include "common/wire/protocol.h"

namespace cdp::repl {

namespace {

std::string Default(uint64_t ms) { return " (default " + FormatDuration(Duration{ms * 1000}) + ")"; }

// The value under `key`, or under `alias` when that was given, with the name
// it was given under; a null value when neither was (the alias's default
// does not count).
template <typename T>
struct GivenValue {
  const T* value = nullptr;
  std::string name;
};

template <typename T>
Result<GivenValue<T>> Given(const po::variables_map& vars, const std::string& key, const std::string& alias) {
  const bool by_key = vars.count(key) > 0;
  const bool by_alias = !alias.empty() && vars.count(alias) > 0 && !vars[alias].defaulted();
  if (by_key && by_alias)
    return Status::InvalidArgument("'" + key + "' and '" + alias + "' are the same setting: give one");
  if (by_key) return GivenValue<T>{&vars[key].as<T>(), key};
  if (by_alias) return GivenValue<T>{&vars[alias].as<T>(), alias};
  return GivenValue<T>{};
}

Status Millis(const po::variables_map& vars, const std::string& key, uint64_t min_ms, uint64_t* out) {
  if (vars.count(key) == 0) return Status::OK();
  const uint64_t ms = vars[key].as<Duration>().millis();
  if (ms < min_ms)
    return Status::InvalidArgument("'" + key + "' must be at least " + FormatDuration(Duration{min_ms * 1000}));
  *out = ms;
  return Status::OK();
}

}  // namespace

void AddLinkConfig(po::options_description* desc, const LinkOptions& d) {
  desc->add_options()
      ("link.frame_size", po::value<ByteSize>(),
       ("record bytes per frame, 4KiB..32MiB (default " + FormatByteSize(ByteSize{d.frame_bytes}) + ")").c_str())
      ("link.inflight", po::value<int>(),
       ("frames per volume sent and not yet acknowledged, 1..1024 (default " + std::to_string(d.max_inflight) + ")").c_str())
      ("link.connect_timeout", po::value<Duration>(), ("connect and handshake" + Default(d.connect_timeout_ms)).c_str())
      ("link.heartbeat", po::value<Duration>(),
       ("a heartbeat after this long without sending" + Default(d.heartbeat_ms)).c_str())
      ("link.dead_peer", po::value<Duration>(),
       ("nothing received for this long: reconnect" + Default(d.dead_peer_ms)).c_str())
      ("link.backoff_max", po::value<Duration>(),
       ("the longest wait between reconnection attempts" + Default(d.backoff_max_ms)).c_str());
}

Status LinkFromConfig(const po::variables_map& vars, const LinkKeyAliases& aliases, LinkOptions* link) {
  CDP_ASSIGN_OR_RETURN(auto frame, Given<ByteSize>(vars, "link.frame_size", aliases.frame_size));
  if (frame.value != nullptr) {
    if (frame.value->bytes < 4096 || frame.value->bytes > proto::kMaxBatchRaw / 2)
      return Status::InvalidArgument("'" + frame.name + "' must be 4KiB..32MiB");
    link->frame_bytes = frame.value->bytes;
  }
  CDP_ASSIGN_OR_RETURN(auto inflight, Given<int>(vars, "link.inflight", aliases.inflight));
  if (inflight.value != nullptr) {
    if (*inflight.value < 1 || *inflight.value > 1024)
      return Status::InvalidArgument("'" + inflight.name + "' must be 1..1024");
    link->max_inflight = *inflight.value;
  }
  CDP_RETURN_IF_ERROR(Millis(vars, "link.connect_timeout", 100, &link->connect_timeout_ms));
  CDP_RETURN_IF_ERROR(Millis(vars, "link.heartbeat", 100, &link->heartbeat_ms));
  CDP_RETURN_IF_ERROR(Millis(vars, "link.dead_peer", 1000, &link->dead_peer_ms));
  CDP_RETURN_IF_ERROR(Millis(vars, "link.backoff_max", 100, &link->backoff_max_ms));
  if (link->dead_peer_ms <= link->heartbeat_ms)
    return Status::InvalidArgument("'link.dead_peer' must be longer than 'link.heartbeat'");
  if (link->backoff_min_ms > link->backoff_max_ms) link->backoff_min_ms = link->backoff_max_ms;
  return Status::OK();
}

}  // namespace cdp::repl
