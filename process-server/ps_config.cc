// SPDX-License-Identifier: Apache-2.0
#include "process-server/ps_config.h"


#include "common/base/host_port.h"
#include "common/daemon/daemon.h"
#include "common/env/file_cache_env.h"
#include "common/http/control_token.h"
#include "common/wire/codec.h"
#include "common/wire/link_config.h"

#include <tuple>

namespace cdp::ps {

po::options_description ProcessServerConfigDescription() {
  po::options_description d("cdp-process-server options");
  d.add_options()
      ("listen", po::value<std::string>()->default_value("0.0.0.0:7400"), "agent data address host:port")
      ("control", po::value<std::string>()->default_value("127.0.0.1:9101"), "HTTP control address host:port")
      ("mt", po::value<std::vector<std::string>>()->multitoken()->default_value({"127.0.0.1:7500"}, "127.0.0.1:7500"),
       "master target address host:port; repeat for more copies (the first is the primary)")
      ("copies", po::value<int>()->default_value(0), "copies per volume, on the first N master targets (0 = all)")
      ("volume_copies", po::value<std::vector<std::string>>()->composing(), "TENANT/VOLUME=N (repeatable)")
      ("client_id", po::value<std::string>()->default_value("process-server"), "name given to the master target")
      ("tenant", po::value<std::vector<std::string>>()->composing(), "NAME:SECRET (repeatable)")
      ("spool_dir", po::value<std::string>()->default_value("/var/lib/opencdp/ps/spool"), "spool directory")
      ("quota", po::value<ByteSize>()->default_value(ByteSize{0}), "per-volume backlog limit (0 = unlimited)")
      ("segment_size", po::value<ByteSize>()->default_value(ByteSize{64u << 20}), "spool segment size")
      ("codec", po::value<std::string>()->default_value("zstd"), "none, lz4 or zstd")
      ("level", po::value<int>()->default_value(1), "zstd level 1..19")
      ("volume_codec", po::value<std::vector<std::string>>()->composing(), "TENANT/VOLUME=CODEC[:LEVEL] (repeatable)")
      ("frame_size", po::value<ByteSize>()->default_value(ByteSize{1u << 20}), "older name of link.frame_size")
      ("inflight", po::value<int>()->default_value(32), "older name of link.inflight")
      ("volume_inflight", po::value<std::vector<std::string>>()->composing(),
       "TENANT/VOLUME=N: that volume's frames in flight to each MT (LoRS threads; repeatable)")
      ("connections", po::value<int>()->default_value(1), "master target connections per tenant")
      ("compress_threads", po::value<int>()->default_value(0), "compression threads per tenant (0 = CPU cores)")
      ("max_open_files", po::value<size_t>()->default_value(1000),
       "spool files open at once, whatever the number of volumes (0 = no bound)")
      ("throttle_mbps", po::value<double>()->default_value(0), "WAN rate limit in Mbit/s (0 = unlimited)")
      ("throttle_schedule", po::value<std::string>()->default_value(""), "MBPS@HH:MM-HH:MM,...")
      ("throttle_utc_offset", po::value<int>()->default_value(0), "schedule time zone, minutes east of UTC")
      ("throttle_burst", po::value<ByteSize>()->default_value(ByteSize{256u << 10}), "token bucket depth")
      ("log.level", po::value<std::string>()->default_value(""), "trace, debug, info, warn, error")
      ("log.file", po::value<std::string>()->default_value(""), "log file (default stderr)");
  AddConnectionCapOptions(&d);
  repl::AddLinkConfig(&d, PsLinkDefaults());
  AddTlsOptions(&d);
  AddControlAuthOptions(&d);
  return d;
}

namespace {

Result<std::pair<proto::Codec, int>> ParseCodecLevel(const std::string& key, const std::string& text, int def_level) {
  size_t colon = text.find(':');
  auto c = ParseCodecName(text.substr(0, colon));
  if (!c.ok()) return Status::InvalidArgument("bad codec '" + text + "' for '" + key + "'");
  int level = def_level;
  if (colon != std::string::npos) {
    try {
      size_t used = 0;
      level = std::stoi(text.substr(colon + 1), &used);
      if (used != text.size() - colon - 1) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      return Status::InvalidArgument("bad level in '" + text + "' for '" + key + "'");
    }
  }
  if (level < 0 || level > 19) return Status::InvalidArgument("level out of range in '" + text + "' for '" + key + "'");
  return std::make_pair(*c, level);
}

// Every TENANT/VOLUME=N value of `key` (N in lo..hi) into *out.
Status ParseVolumeCounts(const po::variables_map& vars, const std::string& key, int lo, int hi,
                         std::map<std::string, int>* out) {
  if (!vars.count(key)) return Status::OK();
  for (const auto& t : vars[key].as<std::vector<std::string>>()) {
    size_t eq = t.find('=');
    if (eq == std::string::npos) return Status::InvalidArgument("bad value '" + t + "' for '" + key + "'");
    std::string volume = t.substr(0, eq);
    size_t slash = volume.find('/');
    if (slash == std::string::npos || !ValidName(volume.substr(0, slash)) ||
        !ValidName(volume.substr(slash + 1)))
      return Status::InvalidArgument("bad volume '" + volume + "' for '" + key + "' (want TENANT/VOLUME)");
    int n = 0;
    try {
      size_t used = 0;
      n = std::stoi(t.substr(eq + 1), &used);
      if (used != t.size() - eq - 1) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      return Status::InvalidArgument("bad count in '" + t + "' for '" + key + "'");
    }
    if (n < lo || n > hi)
      return Status::InvalidArgument("'" + key + "' in '" + t + "' must be " + std::to_string(lo) + ".." +
                                     std::to_string(hi));
    (*out)[volume] = n;
  }
  return Status::OK();
}

}  // namespace

Result<ProcessServerOptions> OptionsFromConfig(const po::variables_map& vars, log::Options* log) {
  ProcessServerOptions o;
  CDP_ASSIGN_OR_RETURN(o.listen, GetHostPort(vars, "listen", HostPort::Rules::Listen()));
  CDP_ASSIGN_OR_RETURN(o.control, GetHostPort(vars, "control", HostPort::Rules::OptionalListen()));
  {
    // One `mt` per master target; each one more copy. Flags replace the file's list.
    const auto& mts = vars["mt"].as<std::vector<std::string>>();
    if (mts.empty()) return Status::InvalidArgument("no 'mt' configured");
    std::vector<HostPort> all;
    for (const std::string& m : mts) {
      auto hp = ParseHostPort(m, HostPort::Rules::Peer());
      if (!hp.ok()) return hp.status().WithContext("'mt'");
      for (const HostPort& seen : all)
        if (seen == *hp) return Status::InvalidArgument("'mt' " + m + " listed twice");
      all.push_back(*hp);
    }
    o.mt = all.front();
    o.more_mts.assign(all.begin() + 1, all.end());
  }
  const int mt_count = 1 + int(o.more_mts.size());
  o.copies = vars["copies"].as<int>();
  if (o.copies < 0 || o.copies > mt_count)
    return Status::InvalidArgument("'copies' must be 0.." + std::to_string(mt_count) + " (the number of 'mt' keys)");
  CDP_RETURN_IF_ERROR(ParseVolumeCounts(vars, "volume_copies", 1, mt_count, &o.volume_copies));
  CDP_RETURN_IF_ERROR(ParseVolumeCounts(vars, "volume_inflight", 1, 1024, &o.volume_inflight));
  o.mt_link.client_id = vars["client_id"].as<std::string>();
  if (!ValidName(o.mt_link.client_id)) return Status::InvalidArgument("bad value '" + o.mt_link.client_id + "' for 'client_id'");
  if (vars.count("tenant")) {
    for (const auto& t : vars["tenant"].as<std::vector<std::string>>()) {
      CDP_RETURN_IF_ERROR(AddTenantEntry(t, &o.tenants).WithContext("'tenant'"));
    }
  }
  if (o.tenants.empty()) return Status::InvalidArgument("no 'tenant' configured (tenant = NAME:SECRET)");
  for (const auto& [name, secret] : o.tenants) {
    CDP_RETURN_IF_ERROR(CheckSecretStrength(secret, "tenant '" + name + "'"));
  }
  o.spool_dir = vars["spool_dir"].as<std::string>();
  o.quota_bytes = vars["quota"].as<ByteSize>().bytes;
  o.segment_bytes = vars["segment_size"].as<ByteSize>().bytes;
  if (o.segment_bytes < (1u << 20)) return Status::InvalidArgument("'segment_size' below 1MiB");
  CDP_ASSIGN_OR_RETURN(auto cl, ParseCodecLevel("codec", vars["codec"].as<std::string>(), vars["level"].as<int>()));
  o.codec = cl.first;
  o.level = cl.second;
  if (vars["level"].as<int>() < 0 || vars["level"].as<int>() > 19)
    return Status::InvalidArgument("bad value for 'level': 0..19");
  if (vars.count("volume_codec")) {
    for (const auto& t : vars["volume_codec"].as<std::vector<std::string>>()) {
      size_t eq = t.find('=');
      if (eq == std::string::npos) return Status::InvalidArgument("bad value '" + t + "' for 'volume_codec'");
      std::string key = t.substr(0, eq);
      size_t slash = key.find('/');
      if (slash == std::string::npos || !ValidName(key.substr(0, slash)) ||
          !ValidName(key.substr(slash + 1)))
        return Status::InvalidArgument("bad volume '" + key + "' for 'volume_codec' (want TENANT/VOLUME)");
      CDP_ASSIGN_OR_RETURN(auto vc, ParseCodecLevel("volume_codec", t.substr(eq + 1), o.level));
      o.volume_codecs[key] = vc;
    }
  }
  CDP_RETURN_IF_ERROR(repl::LinkFromConfig(vars, repl::LinkKeyAliases{"frame_size", "inflight"}, &o.mt_link));
  CDP_ASSIGN_OR_RETURN(o.connection_caps, GetConnectionCaps(vars));
  CDP_ASSIGN_OR_RETURN(o.tls, GetTlsSettings(vars));
  CDP_ASSIGN_OR_RETURN(o.control_auth, GetControlAuthSettings(vars));
  o.connections = vars["connections"].as<int>();
  if (o.connections < 1 || o.connections > 64) return Status::InvalidArgument("'connections' must be 1..64");
  o.compress_threads = vars["compress_threads"].as<int>();
  o.max_open_files = vars["max_open_files"].as<size_t>();
  CDP_RETURN_IF_ERROR(CheckMaxOpenFiles(o.max_open_files));
  if (o.compress_threads < 0 || o.compress_threads > 256)
    return Status::InvalidArgument("'compress_threads' must be 0..256");
  o.throttle.default_mbps = vars["throttle_mbps"].as<double>();
  if (!(o.throttle.default_mbps >= 0)) return Status::InvalidArgument("'throttle_mbps' must be >= 0");
  CDP_ASSIGN_OR_RETURN(o.throttle.schedule, ParseSchedule(vars["throttle_schedule"].as<std::string>()));
  o.throttle.utc_offset_minutes = vars["throttle_utc_offset"].as<int>();
  o.throttle.burst_bytes = vars["throttle_burst"].as<ByteSize>().bytes;
  if (o.throttle.burst_bytes < 4096) return Status::InvalidArgument("'throttle_burst' below 4KiB");
  CDP_RETURN_IF_ERROR(ValidateThrottle(o.throttle).WithContext("'throttle_mbps'/'throttle_schedule'"));
  if (log != nullptr) {
    log->level = vars["log.level"].as<std::string>();
    log->file = vars["log.file"].as<std::string>();
  }
  return o;
}

}  // namespace cdp::ps
