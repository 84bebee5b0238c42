// SPDX-License-Identifier: Apache-2.0
#include "master-target/mt_config.h"

#include "common/base/host_port.h"
#include "common/daemon/daemon.h"
#include "common/env/file_cache_env.h"
#include "common/http/control_token.h"
#include "common/wire/protocol.h"
#include "storage/ceph_env.h"

#include <tuple>

namespace cdp::mt {

po::options_description MasterTargetConfigDescription() {
  po::options_description desc("cdp-master-target options");
  desc.add_options()
      ("listen", po::value<std::string>()->default_value("0.0.0.0:7500"), "data listener for process servers (host:port)")
      ("control", po::value<std::string>()->default_value("127.0.0.1:9102"), "control API, /metrics, /status (host:port)")
      ("nbd", po::value<std::string>()->default_value("127.0.0.1:10810"), "point-in-time NBD exports (host:port)")
      ("nbd_tls", po::value<std::string>()->default_value("require"),
       "require | off: NBD clients must STARTTLS with a certificate of the export's tenant (needs tls = on)")
      ("nbd_idle_timeout", po::value<Duration>()->default_value(Duration{600'000'000}),
       "close an attached NBD client idle this long (0 = never)")
      ("nbd_max_connections", po::value<int>()->default_value(256), "NBD connections at most (1..65536)")
      ("nbd_read_threads", po::value<int>()->default_value(4),
       "threads reading exports for NBD clients, several READs of one connection at once (0..64; 0 = one READ at a "
       "time per connection, on its own thread)")
      ("nbd_max_connections_per_tenant", po::value<int>()->default_value(64),
       "NBD connections in transmission at most per tenant (1..65536)")
      ("link_mbit", po::value<double>()->default_value(0),
       "capacity of the WAN link the process servers' streams arrive on, Mbit/s: the dashboard shows each "
       "volume's share of it (0 = not known: the rate alone)")
      ("max_exports_per_tenant", po::value<int>()->default_value(32),
       "point-in-time exports at most per tenant (1..65536; a failover's export not counted)")
      ("data_dir", po::value<std::string>()->default_value("/var/lib/opencdp/master-target"), "replicas, journals, indexes")
      ("tenant", po::value<std::vector<std::string>>()->composing(), "a tenant as NAME:SECRET (repeatable)")
      ("tenants_file", po::value<std::string>(), "file of tenants, one 'NAME = SECRET' per line")
      ("tenant_quota", po::value<std::vector<std::string>>()->composing(),
       "NAME:SIZE, bytes of volumes + journals a tenant may use (repeatable)")
      ("segment_size", po::value<ByteSize>()->default_value(ByteSize{64ull << 20}), "undo journal segment size")
      ("journal_compression", po::value<int>()->default_value(1),
       "zstd level (1..19) of old data in undo journals, 0 = none")
      ("tenant_journal_compression", po::value<std::vector<std::string>>()->composing(),
       "NAME:LEVEL, a tenant's own journal_compression (repeatable)")
      ("replica_io", po::value<std::string>()->default_value("direct"),
       "direct | buffered: apply reads and writes the replicas' 4 KiB blocks with O_DIRECT, several at once "
       "(buffered: through the page cache, one at a time)")
      ("point_interval", po::value<Duration>()->default_value(Duration{5'000'000}),
       "a crash-consistent point per interval, at a flush or a write (0: at every flush)")
      ("point_require_flush", po::value<bool>()->default_value(false),
       "crash-consistent points only at flushes (an application that never flushes gets none)")
      ("retention.max_age", po::value<Duration>(), "keep points younger than this (unset: no age limit)")
      ("volume_retention", po::value<std::vector<std::string>>()->composing(),
       "TENANT/VOLUME=DURATION: that volume keeps points younger than DURATION instead (repeatable)")
      ("retention.max_bytes", po::value<ByteSize>(), "journal size limit per volume (unset: none)")
      ("retention.lock", po::value<Duration>()->default_value(Duration{MasterTargetOptions::kDefaultHistoryLockUs}),
       "history lock: no point younger than this is dropped, whatever the byte budget, a token or a peer asks "
       "(apply stops instead); a shorter value takes effect only after the old one has passed (0: no lock)")
      ("anomaly_hold", po::value<Duration>()->default_value(Duration{7ull * 86'400'000'000}),
       "a possible ransomware attack's suspect-clean point is kept at least this long, unless the admin "
       "acknowledges it (cdpctl anomalies VOLUME --ack ID)")
      ("tenant_retention_lock", po::value<std::vector<std::string>>()->composing(),
       "TENANT=DURATION: that tenant's volumes have this history lock instead (repeatable)")
      ("volume_retention_lock", po::value<std::vector<std::string>>()->composing(),
       "TENANT/VOLUME=DURATION: that volume has this history lock instead (repeatable)")
      ("retention.check_interval", po::value<Duration>()->default_value(Duration{10'000'000}),
       "how often retention runs")
      ("log.level", po::value<std::string>()->default_value(""), "trace, debug, info, warn, error")
      ("log.file", po::value<std::string>()->default_value(""), "log file (default stderr)");
  desc.add_options()("max_open_files", po::value<size_t>()->default_value(1000),
                      "files of the local store open at once, whatever the number of volumes (0 = no bound)");
  desc.add_options()("max_volumes_per_tenant", po::value<size_t>()->default_value(256),
                      "volumes a tenant may create, at most (1..100000)");
  desc.add_options()("max_batch_work", po::value<ByteSize>()->default_value(ByteSize{proto::kMaxBatchWork}),
                      "ranged work (bytes read into the undo journal) one batch may ask (32MiB..64GiB)");
  desc.add_options()("max_journal_bytes_per_tenant", po::value<ByteSize>()->default_value(ByteSize{0}),
                      "undo-journal bytes a tenant's volumes may hold before its batches wait for retention (0: unlimited)");
  desc.add_options()("storage", po::value<std::string>()->default_value("local"),
                      "local | ceph: where volumes are kept (data_dir, or the Ceph pool of the ceph.* keys)");
  desc.add_options()("ceph.conf", po::value<std::string>()->default_value("/etc/ceph/ceph.conf"),
                      "the Ceph cluster's conf (monitors, keyring)");
  desc.add_options()("ceph.user", po::value<std::string>()->default_value("opencdp"),
                      "cephx user without 'client.' (needs profile rbd on the pool)");
  desc.add_options()("ceph.pool", po::value<std::string>()->default_value("rbd"), "the RBD pool of the volumes");
  desc.add_options()("ceph.prefix", po::value<std::string>()->default_value("opencdp"),
                      "first part of every image name; master targets sharing volumes share it");
  desc.add_options()("ceph.take_over", po::value<bool>()->default_value(false),
                      "break another client's lock on a volume's images (blocklisting it): a takeover");
  desc.add_options()("direct_agents", po::value<std::vector<std::string>>()->composing(),
                      "a tenant whose agents may connect without a process server (repeatable)");
  AddConnectionCapOptions(&desc);
  AddTlsOptions(&desc);
  AddControlAuthOptions(&desc);
  return desc;
}

Result<MasterTargetOptions> MasterTargetOptionsFromConfig(const po::variables_map& vm, Env* env, log::Options* log) {
  MasterTargetOptions o;
  o.env = env;
  o.clock = SystemClock::Get();
  o.data_dir = vm["data_dir"].as<std::string>();
  CDP_ASSIGN_OR_RETURN(o.listen, GetHostPort(vm, "listen", HostPort::Rules::Listen()));
  CDP_ASSIGN_OR_RETURN(o.control, GetHostPort(vm, "control", HostPort::Rules::OptionalListen()));
  CDP_ASSIGN_OR_RETURN(o.nbd, GetHostPort(vm, "nbd", HostPort::Rules::OptionalListen()));
  CDP_ASSIGN_OR_RETURN(o.connection_caps, GetConnectionCaps(vm));
  CDP_ASSIGN_OR_RETURN(o.tls, GetTlsSettings(vm));
  CDP_ASSIGN_OR_RETURN(o.control_auth, GetControlAuthSettings(vm));
  const std::string nbd_tls = vm["nbd_tls"].as<std::string>();
  if (nbd_tls != "require" && nbd_tls != "off") {
    return Status::InvalidArgument("'nbd_tls' must be require or off, not '" + nbd_tls + "'");
  }
  o.nbd_tls = nbd_tls == "require";
  if (o.nbd_tls && !o.nbd.off() && !o.tls.enabled) {
    return Status::InvalidArgument("'nbd_tls' = require needs tls = on (tls_ca, tls_cert, tls_key); "
                                   "nbd_tls = off serves every tenant's exports to anyone who can connect");
  }
  const uint64_t idle_ms = vm["nbd_idle_timeout"].as<Duration>().millis();
  if (idle_ms > UINT32_MAX) return Status::InvalidArgument("'nbd_idle_timeout' is too long");
  o.nbd_idle_timeout_ms = uint32_t(idle_ms);
  o.nbd_max_connections = vm["nbd_max_connections"].as<int>();
  if (o.nbd_max_connections < 1 || o.nbd_max_connections > 65536)
    return Status::InvalidArgument("'nbd_max_connections' must be 1..65536");
  o.nbd_read_threads = vm["nbd_read_threads"].as<int>();
  if (o.nbd_read_threads < 0 || o.nbd_read_threads > 64) {
    return Status::InvalidArgument("'nbd_read_threads' must be 0..64");
  }
  o.nbd_max_connections_per_tenant = vm["nbd_max_connections_per_tenant"].as<int>();
  if (o.nbd_max_connections_per_tenant < 1 || o.nbd_max_connections_per_tenant > 65536)
    return Status::InvalidArgument("'nbd_max_connections_per_tenant' must be 1..65536");
  o.link_mbit = vm["link_mbit"].as<double>();
  if (!(o.link_mbit >= 0 && o.link_mbit <= 1e7)) return Status::InvalidArgument("'link_mbit' must be 0..10000000");
  o.max_exports_per_tenant = vm["max_exports_per_tenant"].as<int>();
  if (o.max_exports_per_tenant < 1 || o.max_exports_per_tenant > 65536)
    return Status::InvalidArgument("'max_exports_per_tenant' must be 1..65536");
  if (vm.count("direct_agents")) {
    for (const auto& t : vm["direct_agents"].as<std::vector<std::string>>()) {
      if (!ValidName(t)) return Status::InvalidArgument("'direct_agents': bad tenant name '" + t + "'");
      o.direct_agent_tenants.insert(t);
    }
  }
  o.max_volumes_per_tenant = vm["max_volumes_per_tenant"].as<size_t>();
  if (o.max_volumes_per_tenant < 1 || o.max_volumes_per_tenant > 100000)
    return Status::InvalidArgument("'max_volumes_per_tenant' must be 1..100000");
  o.max_batch_work = vm["max_batch_work"].as<ByteSize>().bytes;
  if (o.max_batch_work < proto::kMaxRecordLength || o.max_batch_work > (64ull << 30))
    return Status::InvalidArgument("'max_batch_work' must be 32MiB..64GiB");
  o.max_journal_bytes_per_tenant = vm["max_journal_bytes_per_tenant"].as<ByteSize>().bytes;
  if (vm.count("tenant")) {
    for (const auto& t : vm["tenant"].as<std::vector<std::string>>()) {
      CDP_RETURN_IF_ERROR(AddTenantEntry(t, &o.tenants).WithContext("'tenant'"));
    }
  }
  if (vm.count("tenants_file")) {
    const std::string path = vm["tenants_file"].as<std::string>();
    CDP_ASSIGN_OR_RETURN(Bytes text, ReadWholeFile(env, path));
    std::string_view all(reinterpret_cast<const char*>(text.data()), text.size());
    int line_no = 0;
    while (!all.empty()) {
      size_t nl = all.find('\n');
      std::string_view line = all.substr(0, nl);
      all = nl == std::string_view::npos ? std::string_view() : all.substr(nl + 1);
      ++line_no;
      size_t first = line.find_first_not_of(" \t\r");
      if (first == std::string_view::npos || line[first] == '#') continue;
      CDP_RETURN_IF_ERROR(AddTenantEntry(line, &o.tenants).WithContext(path + ":" + std::to_string(line_no)));
    }
  }
  for (const auto& [name, secret] : o.tenants) {
    CDP_RETURN_IF_ERROR(CheckSecretStrength(secret, "tenant '" + name + "'"));
  }
  if (vm.count("tenant_quota")) {
    for (const auto& q : vm["tenant_quota"].as<std::vector<std::string>>()) {
      auto c = q.find(':');
      auto size = c == std::string::npos ? Result<ByteSize>(Status::InvalidArgument("missing ':'"))
                                         : ParseByteSize(q.substr(c + 1));
      if (!size.ok() || !o.tenants.count(q.substr(0, c))) {
        return Status::InvalidArgument("bad tenant_quota '" + q + "' (NAME:SIZE of a configured tenant)");
      }
      o.tenant_quota_bytes[q.substr(0, c)] = size->bytes;
    }
  }
  o.segment_bytes = vm["segment_size"].as<ByteSize>().bytes;
  const std::string replica_io = vm["replica_io"].as<std::string>();
  if (replica_io != "direct" && replica_io != "buffered") {
    return Status::InvalidArgument("'replica_io' must be direct or buffered, not '" + replica_io + "'");
  }
  o.replica_direct_io = replica_io == "direct";
  o.max_open_files = vm["max_open_files"].as<size_t>();
  CDP_RETURN_IF_ERROR(CheckMaxOpenFiles(o.max_open_files));
  o.journal_zstd_level = vm["journal_compression"].as<int>();
  if (o.journal_zstd_level < 0 || o.journal_zstd_level > 19)
    return Status::InvalidArgument("journal_compression must be 0..19");
  if (vm.count("tenant_journal_compression")) {
    for (const auto& q : vm["tenant_journal_compression"].as<std::vector<std::string>>()) {
      auto c = q.find(':');
      int level = -1;
      if (c != std::string::npos) {
        const std::string v = q.substr(c + 1);
        if (!v.empty() && v.size() <= 2 && v.find_first_not_of("0123456789") == std::string::npos) level = std::stoi(v);
      }
      if (level < 0 || level > 19 || !o.tenants.count(q.substr(0, c))) {
        return Status::InvalidArgument("bad tenant_journal_compression '" + q +
                                       "' (NAME:LEVEL of a configured tenant, level 0..19)");
      }
      o.tenant_journal_zstd_level[q.substr(0, c)] = level;
    }
  }
  o.point_interval_us = vm["point_interval"].as<Duration>().micros;
  o.points_require_flush = vm["point_require_flush"].as<bool>();
  if (vm.count("retention.max_age")) o.retention.max_age_us = vm["retention.max_age"].as<Duration>().micros;
  if (vm.count("retention.max_bytes")) o.retention.max_bytes = vm["retention.max_bytes"].as<ByteSize>().bytes;
  o.retention_check_us = vm["retention.check_interval"].as<Duration>().micros;
  // "KEY = [TENANT/]NAME=DURATION" entries (volume_retention, *_retention_lock).
  const auto durations = [&](const std::string& key, bool per_volume,
                             std::map<std::string, uint64_t>* out) -> Status {
    if (!vm.count(key)) return Status::OK();
    for (const auto& q : vm[key].as<std::vector<std::string>>()) {
      const auto slash = q.find('/'), eq = q.find('=');
      const auto bad = [&](const std::string& why) {
        return Status::InvalidArgument("bad " + key + " '" + q + "': " + why);
      };
      if (eq == std::string::npos || (per_volume && (slash == std::string::npos || eq < slash)))
        return bad(per_volume ? "want TENANT/VOLUME=DURATION" : "want TENANT=DURATION");
      const std::string tenant = q.substr(0, per_volume ? slash : eq);
      if (!o.tenants.count(tenant)) return bad("no tenant " + tenant);
      if (per_volume && !ValidName(q.substr(slash + 1, eq - slash - 1))) return bad("invalid volume name");
      auto d = ParseDuration(q.substr(eq + 1));
      if (!d.ok()) return bad(d.status().message());
      (*out)[q.substr(0, eq)] = d->micros;
    }
    return Status::OK();
  };
  CDP_RETURN_IF_ERROR(durations("volume_retention", true, &o.volume_max_age_us));
  o.retention.lock_us = vm["retention.lock"].as<Duration>().micros;
  o.anomaly_hold_us = vm["anomaly_hold"].as<Duration>().micros;
  CDP_RETURN_IF_ERROR(durations("tenant_retention_lock", false, &o.tenant_lock_us));
  CDP_RETURN_IF_ERROR(durations("volume_retention_lock", true, &o.volume_lock_us));
  if (log != nullptr) {
    log->level = vm["log.level"].as<std::string>();
    log->file = vm["log.file"].as<std::string>();
  }
  // Last: every other key is checked before the cluster is connected to.
  const std::string storage = vm["storage"].as<std::string>();
  if (storage == "ceph") {
    storage::RadosOptions ro;
    ro.conf_path = vm["ceph.conf"].as<std::string>();
    ro.client_id = vm["ceph.user"].as<std::string>();
    storage::CephEnvOptions eo;
    eo.prefix = vm["ceph.prefix"].as<std::string>();
    eo.take_over = vm["ceph.take_over"].as<bool>();
    auto store = storage::CephEnv::Connect(ro, vm["ceph.pool"].as<std::string>(), eo);
    if (!store.ok()) return store.status().WithContext("storage = ceph");
    o.store = std::move(*store);
    o.store_kind = "ceph";
    o.store_description = "ceph pool " + vm["ceph.pool"].as<std::string>() + ", image prefix " + eo.prefix +
                          ", as client." + ro.client_id + (eo.take_over ? " (taking over locks)" : "");
  } else if (storage != "local") {
    return Status::InvalidArgument("'storage' must be local or ceph, not '" + storage + "'");
  }
  return o;
}

}  // namespace cdp::mt
