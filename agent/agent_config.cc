// SPDX-License-Identifier: Apache-2.0
#include "agent/agent_config.h"


#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "common/base/host_port.h"
#include "common/daemon/daemon.h"
#include "common/env/file_cache_env.h"
#include "common/http/control_token.h"
#include "common/wire/link_config.h"

namespace cdp::agent {

po::options_description AgentConfigDescription() {
  using po::value;
  po::options_description desc("cdp-agent options");
  desc.add_options()
      ("volume", value<std::vector<std::string>>()->composing(), "NAME=PATH: protect backing file/device PATH as volume NAME (repeatable)")
      ("export_name", value<std::vector<std::string>>()->composing(), "NAME=EXPORT: NBD export name of volume NAME (default: NAME)")
      ("encryption", value<std::vector<std::string>>()->composing(), "on|off for every volume, or NAME=on|off for one: tenant-side encryption (blocks sealed before they leave this host)")
      ("key_file", value<std::string>()->default_value(""), "the tenant key file (cdpctl keys init); required by encrypted volumes")
      ("frame_size", value<std::vector<std::string>>()->composing(), "NAME=SIZE: record bytes per frame volume NAME ships (default link.frame_size; 4KiB..32MiB)")
      ("nbd_listen", value<std::string>()->default_value("none"),
       "NBD TCP listener host:port ('none' = off); TCP requires NBD TLS (tls = on)")
      ("nbd_unix", value<std::string>()->default_value(""),
       "NBD unix socket path ('' = <bitmap_dir>/nbd.sock, 'none' = off)")
      ("nbd_unix_group", value<std::string>()->default_value(""), "group of the NBD unix socket ('' = the agent's)")
      ("nbd_unix_mode", value<std::string>()->default_value("0660"), "mode of the NBD unix socket (octal)")
      ("nbd_idle_timeout", value<Duration>()->default_value(Duration{600'000'000}),
       "close an attached NBD client idle this long (0 = never)")
      ("nbd_max_connections", value<int>()->default_value(256), "NBD connections at most (1..65536)")
      ("nbd_workers", value<int>()->default_value(2), "NBD threads beside the first (each serves its share of the connections)")
      ("ps", value<std::string>()->default_value("127.0.0.1:7400"),
       "process server host:port (a direct agent: the master target's)")
      ("tenant", value<std::string>()->default_value(""), "tenant name")
      ("secret", value<std::string>()->default_value(""), "tenant secret")
      ("secret_file", value<std::string>()->default_value(""), "file holding the tenant secret")
      ("client_id", value<std::string>()->default_value(""), "agent id sent to the process server (default: host name)")
      ("capture_only", value<bool>()->default_value(false), "do not connect to a process server (tap benchmarks)")
      ("budget", value<ByteSize>()->default_value(ByteSize{64ull << 20}), "capture queue memory per volume")
      ("anomaly.enabled", value<bool>()->default_value(true),
       "ransomware detection: a jump in change rate made of incompressible writes (docs/operations.md)")
      ("anomaly.sample_every", value<uint32_t>()->default_value(16), "compress 1 written 4 KiB block in N (1..4096)")
      ("anomaly.window", value<Duration>()->default_value(Duration{1'000'000}), "detection window (10ms..1h)")
      ("anomaly.learning_windows", value<uint32_t>()->default_value(30), "windows learned before anything can fire")
      ("anomaly.run_windows", value<uint32_t>()->default_value(3), "suspect windows in a row that fire (1..1000)")
      ("anomaly.rate_factor", value<double>()->default_value(3.0), "a window is suspect at this x the baseline rate (>= 1)")
      ("anomaly.min_rate", value<ByteSize>()->default_value(ByteSize{1u << 20}),
       "and at least this many bytes per second")
      ("anomaly.min_incompressible", value<double>()->default_value(0.8),
       "and at least this fraction of its sampled blocks incompressible (0..1)")
      ("anomaly.incompressible_delta", value<double>()->default_value(0.3),
       "and that fraction at least this much above the baseline's (0..1)")
      ("anomaly.holdoff", value<Duration>()->default_value(Duration{60'000'000}), "quiet time after an anomaly")
      ("region_size", value<ByteSize>()->default_value(ByteSize{1u << 20}), "dirty bitmap region size")
      ("bitmap_dir", value<std::string>()->default_value("/var/lib/opencdp/agent"), "directory of the dirty bitmaps")
      ("batch_bytes", value<ByteSize>()->default_value(ByteSize{4u << 20}), "older name of link.frame_size")
      ("max_inflight", value<int>()->default_value(4), "older name of link.inflight")
      ("ps_connections", value<int>()->default_value(4),
       "connections to the process server at most (1..64); the volumes are spread over them")
      ("max_open_files", value<size_t>()->default_value(1000),
       "backing files, bitmaps and branch stores open at once, whatever the number of volumes (0 = no bound)")
      ("resync_fill_target", value<ByteSize>()->default_value(ByteSize{8u << 20}),
       "resync data queued, not yet acknowledged, at least (at most budget/2: the rest is for live writes)")
      ("resync_plan_ahead", value<Duration>()->default_value(Duration{100'000}),
       "the resync window grows to what was acknowledged in this time, up to budget/2 (0 = fill target only)")
      ("resync_max_rate", value<ByteSize>()->default_value(ByteSize{0}), "resync bytes per second (0 = no cap)")
      ("resync_requests", value<int>()->default_value(64), "resync hash requests in flight")
      ("control", value<std::string>()->default_value("127.0.0.1:9100"), "control/metrics HTTP host:port ('none' = off)")
      ("freeze_command", value<std::string>()->default_value(""), "run before a tag (e.g. 'fsfreeze -f /data')")
      ("thaw_command", value<std::string>()->default_value(""), "run after a tag, always (e.g. 'fsfreeze -u /data')")
      ("freeze_timeout", value<Duration>()->default_value(Duration{10'000'000}), "bound on the freeze window")
      ("group_hold_max", value<Duration>()->default_value(Duration{200'000}),
       "longest hold of writes a group point may ask of this agent (0 = none: the agent is in no group)")
      ("group_freeze_min_interval", value<Duration>()->default_value(Duration{30'000'000}),
       "a group tag's freeze asked sooner than this after the last one began is refused")
      ("log.level", value<std::string>()->default_value(""), "trace|debug|info|warn|error")
      ("log.file", value<std::string>()->default_value(""), "log file ('' = stderr)");
  repl::AddLinkConfig(&desc, AgentLinkDefaults());
  AddTlsOptions(&desc);
  AddControlAuthOptions(&desc);
  return desc;
}

Result<AgentOptions> AgentOptionsFromConfig(const po::variables_map& vm, Env* env, log::Options* log) {
  AgentOptions ao;
  ao.env = env;
  ao.clock = SystemClock::Get();
  std::map<std::string, std::string> exports;
  if (vm.count("export_name")) {
    for (const auto& e : vm["export_name"].as<std::vector<std::string>>()) {
      auto eq = e.find('=');
      if (eq == std::string::npos) return Status::InvalidArgument("export_name must be NAME=EXPORT: '" + e + "'");
      exports[e.substr(0, eq)] = e.substr(eq + 1);
    }
  }
  std::map<std::string, uint64_t> frames;
  if (vm.count("frame_size")) {
    for (const auto& f : vm["frame_size"].as<std::vector<std::string>>()) {
      const auto eq = f.find('=');
      auto size = eq == std::string::npos ? Result<ByteSize>(Status::InvalidArgument("want NAME=SIZE"))
                                          : ParseByteSize(f.substr(eq + 1));
      if (!size.ok() || size->bytes < 4096 || size->bytes > proto::kMaxRecordLength)
        return Status::InvalidArgument("frame_size must be NAME=SIZE with SIZE in 4KiB..32MiB: '" + f + "'");
      frames[f.substr(0, eq)] = size->bytes;
    }
  }
  bool encrypt_all = false;
  std::map<std::string, bool> encrypt;
  if (vm.count("encryption")) {
    for (const auto& e : vm["encryption"].as<std::vector<std::string>>()) {
      const auto eq = e.find('=');
      const std::string value = eq == std::string::npos ? e : e.substr(eq + 1);
      if (value != "on" && value != "off")
        return Status::InvalidArgument("encryption must be on, off, NAME=on or NAME=off: '" + e + "'");
      if (eq == std::string::npos) {
        encrypt_all = value == "on";
      } else {
        encrypt[e.substr(0, eq)] = value == "on";
      }
    }
  }
  if (vm.count("volume")) {
    for (const auto& v : vm["volume"].as<std::vector<std::string>>()) {
      auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
        return Status::InvalidArgument("volume must be NAME=PATH: '" + v + "'");
      VolumeConfig vc{v.substr(0, eq), v.substr(eq + 1), ""};
      if (!ValidName(vc.name)) return Status::InvalidArgument("bad volume name '" + vc.name + "'");
      if (auto it = exports.find(vc.name); it != exports.end()) vc.export_name = it->second;
      vc.encrypted = encrypt_all;
      if (auto it = frames.find(vc.name); it != frames.end()) vc.frame_bytes = it->second;
      if (auto it = encrypt.find(vc.name); it != encrypt.end()) vc.encrypted = it->second;
      ao.volumes.push_back(vc);
    }
  }
  if (ao.volumes.empty()) return Status::InvalidArgument("no volume configured (volume = NAME=PATH)");
  auto configured = [&ao](const std::string& name) {
    return std::any_of(ao.volumes.begin(), ao.volumes.end(), [&](const VolumeConfig& v) { return v.name == name; });
  };
  for (const auto& [name, on] : encrypt) {
    if (!configured(name)) return Status::InvalidArgument("encryption names volume '" + name + "', which is not configured");
  }
  for (const auto& [name, bytes] : frames) {
    if (!configured(name)) return Status::InvalidArgument("frame_size names volume '" + name + "', which is not configured");
  }
  ao.key_file = vm["key_file"].as<std::string>();
  if (ao.key_file.empty() &&
      std::any_of(ao.volumes.begin(), ao.volumes.end(), [](const VolumeConfig& v) { return v.encrypted; }))
    return Status::InvalidArgument("encrypted volumes need key_file (create one with cdpctl keys init)");
  const auto listener = HostPort::Rules::OptionalListen();
  CDP_ASSIGN_OR_RETURN(HostPort nbd, GetHostPort(vm, "nbd_listen", listener));
  ao.nbd.tcp = nbd;
  ao.bitmap_dir = vm["bitmap_dir"].as<std::string>();
  ao.nbd.unix_path = vm["nbd_unix"].as<std::string>();
  if (ao.nbd.unix_path.empty()) ao.nbd.unix_path = ao.bitmap_dir + "/nbd.sock";
  if (ao.nbd.unix_path == "none") ao.nbd.unix_path.clear();
  ao.nbd.unix_group = vm["nbd_unix_group"].as<std::string>();
  {
    const std::string mode = vm["nbd_unix_mode"].as<std::string>();
    char* end = nullptr;
    const unsigned long m = mode.empty() ? 0 : std::strtoul(mode.c_str(), &end, 8);
    if (mode.empty() || *end != '\0' || m == 0 || m > 0777) {
      return Status::InvalidArgument("'nbd_unix_mode' must be an octal mode such as 0660, not '" + mode + "'");
    }
    ao.nbd.unix_mode = uint32_t(m);
  }
  const uint64_t idle_ms = vm["nbd_idle_timeout"].as<Duration>().millis();
  if (idle_ms > UINT32_MAX) return Status::InvalidArgument("'nbd_idle_timeout' is too long");
  ao.nbd.idle_timeout_ms = uint32_t(idle_ms);
  ao.nbd.max_connections = vm["nbd_max_connections"].as<int>();
  if (ao.nbd.max_connections < 1 || ao.nbd.max_connections > 65536)
    return Status::InvalidArgument("'nbd_max_connections' must be 1..65536");
  ao.nbd.worker_threads = std::max(1, vm["nbd_workers"].as<int>());
  ao.budget = vm["budget"].as<ByteSize>().bytes;
  {
    AnomalyOptions& a = ao.anomaly;
    a.enabled = vm["anomaly.enabled"].as<bool>();
    a.sample_every = vm["anomaly.sample_every"].as<uint32_t>();
    a.window_us = vm["anomaly.window"].as<Duration>().micros;
    a.learning_windows = vm["anomaly.learning_windows"].as<uint32_t>();
    a.run_windows = vm["anomaly.run_windows"].as<uint32_t>();
    a.rate_factor = vm["anomaly.rate_factor"].as<double>();
    a.min_rate = vm["anomaly.min_rate"].as<ByteSize>().bytes;
    a.min_incompressible = vm["anomaly.min_incompressible"].as<double>();
    a.incompressible_delta = vm["anomaly.incompressible_delta"].as<double>();
    a.holdoff_us = vm["anomaly.holdoff"].as<Duration>().micros;
    if (a.sample_every < 1 || a.sample_every > 4096) return Status::InvalidArgument("'anomaly.sample_every' must be 1..4096");
    if (a.window_us < 10'000 || a.window_us > 3'600'000'000ull)
      return Status::InvalidArgument("'anomaly.window' must be 10ms..1h");
    if (a.run_windows < 1 || a.run_windows > 1000) return Status::InvalidArgument("'anomaly.run_windows' must be 1..1000");
    if (!(a.rate_factor >= 1.0)) return Status::InvalidArgument("'anomaly.rate_factor' must be at least 1");
    if (!(a.min_incompressible >= 0.0 && a.min_incompressible <= 1.0))
      return Status::InvalidArgument("'anomaly.min_incompressible' must be 0..1");
    if (!(a.incompressible_delta >= 0.0 && a.incompressible_delta <= 1.0))
      return Status::InvalidArgument("'anomaly.incompressible_delta' must be 0..1");
  }
  uint64_t region = vm["region_size"].as<ByteSize>().bytes;
  if (region < 4096 || region > (1u << 30) || (region & (region - 1)) != 0)
    return Status::InvalidArgument("region_size must be a power of two in 4KiB..1GiB");
  ao.region_size = uint32_t(region);
  ao.sender_enabled = !vm["capture_only"].as<bool>();
  CDP_ASSIGN_OR_RETURN(HostPort ps, GetHostPort(vm, "ps", HostPort::Rules::Peer()));
  ao.sender.link.peer = ps;
  CDP_ASSIGN_OR_RETURN(ao.tls, GetTlsSettings(vm));
  CDP_ASSIGN_OR_RETURN(ao.control_auth, GetControlAuthSettings(vm));
  if (!ao.nbd.tcp.off() && !ao.tls.enabled) {
    return Status::InvalidArgument("'nbd_listen' serves the tap over TCP, which requires NBD TLS: set tls = on with "
                                   "tls_ca, tls_cert and tls_key, or use nbd_unix only (nbd_listen = none)");
  }
  ao.sender.link.tenant = vm["tenant"].as<std::string>();
  ao.sender.link.secret = vm["secret"].as<std::string>();
  std::string secret_file = vm["secret_file"].as<std::string>();
  if (!secret_file.empty()) {
    CDP_RETURN_IF_ERROR(CheckPrivateFile(env, secret_file, "secret_file"));
    CDP_ASSIGN_OR_RETURN(Bytes data, ReadWholeFile(env, secret_file));
    ao.sender.link.secret.assign(data.begin(), data.end());
    while (!ao.sender.link.secret.empty() && (ao.sender.link.secret.back() == '\n' || ao.sender.link.secret.back() == '\r'))
      ao.sender.link.secret.pop_back();
  }
  if (ao.sender_enabled && (!ValidName(ao.sender.link.tenant) || ao.sender.link.secret.empty())) {
    return Status::InvalidArgument("tenant and secret (or secret_file) are required unless capture_only = true");
  }
  if (ao.sender_enabled) {
    CDP_RETURN_IF_ERROR(CheckSecretStrength(ao.sender.link.secret, "tenant '" + ao.sender.link.tenant + "'"));
  }
  ao.sender.link.client_id = vm["client_id"].as<std::string>();
  if (ao.sender.link.client_id.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    ao.sender.link.client_id = host;
    if (!ValidName(ao.sender.link.client_id)) ao.sender.link.client_id = "agent";
  }
  CDP_RETURN_IF_ERROR(repl::LinkFromConfig(vm, repl::LinkKeyAliases{"batch_bytes", "max_inflight"}, &ao.sender.link));
  ao.ps_connections = vm["ps_connections"].as<int>();
  ao.max_open_files = vm["max_open_files"].as<size_t>();
  CDP_RETURN_IF_ERROR(CheckMaxOpenFiles(ao.max_open_files));
  if (ao.ps_connections < 1 || ao.ps_connections > 64)
    return Status::InvalidArgument("'ps_connections' must be 1..64, not " + std::to_string(ao.ps_connections));
  ao.sender.resync.fill_target = vm["resync_fill_target"].as<ByteSize>().bytes;
  if (ao.sender.resync.fill_target < 65536 || ao.sender.resync.fill_target > ao.budget / 2) {
    return Status::InvalidArgument("resync_fill_target must be 64KiB..budget/2 (" + std::to_string(ao.budget / 2) +
                                   " bytes)");
  }
  ao.sender.resync.fill_max = ao.budget / 2;
  ao.sender.resync.plan_ahead_ms = vm["resync_plan_ahead"].as<Duration>().millis();
  ao.sender.resync.max_rate = vm["resync_max_rate"].as<ByteSize>().bytes;
  ao.sender.resync.max_requests = vm["resync_requests"].as<int>();
  if (ao.sender.resync.max_requests < 1 || ao.sender.resync.max_requests > 128) {
    return Status::InvalidArgument("resync_requests must be 1..128");
  }
  CDP_ASSIGN_OR_RETURN(ao.control, GetHostPort(vm, "control", listener));
  ao.freeze_command = vm["freeze_command"].as<std::string>();
  ao.thaw_command = vm["thaw_command"].as<std::string>();
  ao.freeze_timeout_ms = vm["freeze_timeout"].as<Duration>().millis();
  ao.group_hold_max_ms = vm["group_hold_max"].as<Duration>().millis();
  ao.group_freeze_min_interval_ms = vm["group_freeze_min_interval"].as<Duration>().millis();
  if (ao.group_hold_max_ms > proto::kMaxGroupHoldMs) {
    return Status::InvalidArgument("group_hold_max must be at most " + std::to_string(proto::kMaxGroupHoldMs) + " ms");
  }
  if (log != nullptr) {
    log->level = vm["log.level"].as<std::string>();
    log->file = vm["log.file"].as<std::string>();
  }
  return ao;
}

}  // namespace cdp::agent
