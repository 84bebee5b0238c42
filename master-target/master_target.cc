// SPDX-License-Identifier: Apache-2.0
#include "master-target/master_target.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "common/wire/stage_metrics.h"
#include "master-target/dashboard.h"
#include "master-target/master_target_impl.h"
#include "master-target/mt_control_api.h"
#include "master-target/ps_session.h"

namespace cdp::mt {

std::string VolumeDir(const std::string& data_dir, const std::string& tenant, const std::string& volume) {
  if (!ValidName(tenant) || !ValidName(volume)) return "";
  return JoinPath(JoinPath(JoinPath(JoinPath(data_dir, "tenants"), tenant), "volumes"), volume);
}

uint64_t MasterTarget::Impl::Quota(const std::string& tenant) const {
  auto it = o.tenant_quota_bytes.find(tenant);
  return it == o.tenant_quota_bytes.end() ? 0 : it->second;
}

uint64_t MasterTarget::Impl::UsageLocked(const std::string& tenant) {
  uint64_t used = 0;
  for (auto& [k, e] : volumes) {
    if (e->tenant != tenant) continue;
    VolumeStatus st = e->volume->GetStatus();
    used += st.identity.size + st.journal_bytes;
  }
  return used;
}

bool MasterTarget::Impl::OverQuota(const std::string& tenant) {
  uint64_t q = Quota(tenant);
  if (q == 0) return false;
  std::lock_guard<std::mutex> lk(vol_mu);
  return UsageLocked(tenant) > q;
}

uint64_t MasterTarget::Impl::JournalBytes(const std::string& tenant) {
  std::lock_guard<std::mutex> lk(vol_mu);
  uint64_t bytes = 0;
  for (auto& [k, e] : volumes) {
    if (e->tenant == tenant) bytes += e->volume->GetStatus().journal_bytes;
  }
  return bytes;
}

VolumeOptions MasterTarget::Impl::VolOpts(const std::string& tenant, const std::string& name) {
  VolumeOptions vo;
  vo.env = store;
  vo.clock = o.clock;
  vo.dir = VolumeDir(store_root, tenant, name);
  vo.index_path = JoinPath(vo.dir, "index.db");
  if (store_vfs) vo.index_vfs = store_vfs->name();
  vo.segment_bytes = o.segment_bytes;
  // Retention drops whole closed segments: under a small budget they must be
  // a small part of it, or the current segment alone would fill the budget
  // and, inside the history lock, stall apply for good.
  if (o.retention.max_bytes != 0)
    vo.segment_bytes = std::min(vo.segment_bytes, std::max<uint64_t>(1u << 20, o.retention.max_bytes / 8));
  auto level = o.tenant_journal_zstd_level.find(tenant);
  vo.journal_zstd_level = level == o.tenant_journal_zstd_level.end() ? o.journal_zstd_level : level->second;
  vo.point_interval_us = o.point_interval_us;
  vo.points_require_flush = o.points_require_flush;
  vo.replica_direct_io = o.replica_direct_io;
  vo.max_batch_work = o.max_batch_work;
  vo.retention = o.retention;
  if (auto age = o.volume_max_age_us.find(tenant + "/" + name); age != o.volume_max_age_us.end())
    vo.retention.max_age_us = age->second;
  if (auto lock = o.tenant_lock_us.find(tenant); lock != o.tenant_lock_us.end()) vo.retention.lock_us = lock->second;
  if (auto lock = o.volume_lock_us.find(tenant + "/" + name); lock != o.volume_lock_us.end())
    vo.retention.lock_us = lock->second;
  metrics::Labels l{{"tenant", tenant}, {"volume", name}};
  auto& r = mt->registry_;
  vo.metrics.bytes_applied = r.GetCounter("cdp_mt_applied_bytes_total", "Change bytes applied to the replica", l);
  vo.metrics.records_applied = r.GetCounter("cdp_mt_applied_records_total", "Records applied", l);
  vo.metrics.disk_read_bytes =
      r.GetCounter("cdp_mt_disk_read_bytes_total", "Bytes read from replica and journal by apply and undo", l);
  vo.metrics.disk_write_bytes =
      r.GetCounter("cdp_mt_disk_write_bytes_total", "Bytes written to replica and journal by apply and undo", l);
  vo.metrics.journal_bytes = r.GetGauge("cdp_mt_journal_bytes", "Bytes in the undo journal", l);
  vo.metrics.points = r.GetGauge("cdp_mt_recovery_points", "Recovery points kept", l);
  vo.metrics.applied_seq = r.GetGauge("cdp_mt_applied_seq", "Last applied and committed sequence", l);
  vo.metrics.apply_lag_seconds = r.GetDoubleGauge(
      "cdp_mt_apply_lag_seconds", "Wall time between capture and apply of the last applied record", l);
  vo.metrics.retention_span_seconds =
      r.GetDoubleGauge("cdp_mt_retention_span_seconds", "Age of the oldest recovery point kept", l);
  // One series per cause, so that an alert names it (packaging/prometheus).
  const char* kStalledHelp = "1 while apply is stalled for this cause (the last batch failed and was undone)";
  metrics::Labels ns = l, io = l;
  ns.push_back({"cause", "no_space"});
  io.push_back({"cause", "io_error"});
  vo.metrics.stalled_no_space = r.GetGauge("cdp_mt_apply_stalled", kStalledHelp, ns);
  vo.metrics.stalled_io_error = r.GetGauge("cdp_mt_apply_stalled", kStalledHelp, io);
  metrics::Labels hl = l;
  hl.push_back({"cause", "history_lock"});
  vo.metrics.stalled_history_lock = r.GetGauge("cdp_mt_apply_stalled", kStalledHelp, hl);
  vo.anomaly_hold_us = o.anomaly_hold_us;
  vo.metrics.anomalies_open = r.GetGauge(
      "cdp_mt_anomalies_open", "Possible ransomware seen by the agent, not acknowledged: suspect-clean points held", l);
  vo.metrics.history_lock_seconds = r.GetGauge(
      "cdp_mt_history_lock_seconds", "The history lock in force: no recovery point younger than this is dropped", l);
  // The retention budget, for alerts on the journal's use of it (packaging/prometheus).
  r.GetGauge("cdp_mt_retention_max_bytes", "Retention policy: undo journal bytes kept at most (0: no limit)", l)
      ->Set(int64_t(o.retention.max_bytes));
  r.GetGauge("cdp_mt_retention_max_age_seconds", "Retention policy: oldest recovery point kept (0: no limit)", l)
      ->Set(int64_t(o.retention.max_age_us / 1'000'000));
  return vo;
}

void MasterTarget::Impl::NoteRefusedLocked(const std::string& tenant, const std::string& name, const Status& why) {
  Refusal r;
  r.tenant = tenant;
  r.volume = name;
  // kBusy: another master target holds the volume (the Ceph lock on its
  // image or on its index, storage/ceph_env.h).
  r.cause = why.code() == Code::kBusy ? "locked" : "error";
  r.message = why.ToString();
  const std::string key = Key(tenant, name);
  if (auto it = refused.find(key); it != refused.end() && it->second.cause != r.cause)
    ClearRefusedLocked(tenant, name);
  mt->registry_
      .GetGauge("cdp_mt_volume_refused", "1 while this MT cannot open a volume on its storage, by cause",
                metrics::Labels{{"tenant", tenant}, {"volume", name}, {"cause", r.cause}})
      ->Set(1);
  refused[key] = std::move(r);
}

void MasterTarget::Impl::ClearRefusedLocked(const std::string& tenant, const std::string& name) {
  auto it = refused.find(Key(tenant, name));
  if (it == refused.end()) return;
  mt->registry_
      .GetGauge("cdp_mt_volume_refused", "1 while this MT cannot open a volume on its storage, by cause",
                metrics::Labels{{"tenant", tenant}, {"volume", name}, {"cause", it->second.cause}})
      ->Set(0);
  refused.erase(it);
}

Status MasterTarget::Impl::LoadVolumes() {
  for (const auto& [tenant, secret] : o.tenants) {
    std::string vdir = JoinPath(JoinPath(JoinPath(store_root, "tenants"), tenant), "volumes");
    CDP_RETURN_IF_ERROR(store->CreateDirs(vdir));
    // Overlays of writable exports do not survive a restart.
    std::string xdir = JoinPath(JoinPath(JoinPath(o.data_dir, "tenants"), tenant), "exports");
    CDP_RETURN_IF_ERROR(o.env->CreateDirs(xdir));
    CDP_ASSIGN_OR_RETURN(auto stale, o.env->ListDir(xdir));
    for (const auto& n : stale) {
      if (n.size() > 4 && n.compare(n.size() - 4, 4, ".cow") == 0) CDP_RETURN_IF_ERROR(o.env->Remove(JoinPath(xdir, n)));
    }
    CDP_ASSIGN_OR_RETURN(auto names, store->ListDir(vdir));
    for (const auto& n : names) {
      if (!ValidName(n) || !store->Exists(JoinPath(JoinPath(vdir, n), "index.db"))) continue;
      auto v = ReplicaVolume::Open(VolOpts(tenant, n), nullptr);
      if (!v.ok()) {
        log->error("{} cannot open volume: {}", log::Where{n, tenant, 0}, v.status().ToString());
        std::lock_guard<std::mutex> lk(vol_mu);
        NoteRefusedLocked(tenant, n, v.status());
        continue;
      }
      auto e = std::make_shared<VolEntry>();
      e->tenant = tenant;
      e->name = n;
      e->volume = std::shared_ptr<ReplicaVolume>(std::move(*v));
      log->info("{} opened: applied seq {}, {} points", log::Where{n, tenant, e->volume->applied_seq()},
                e->volume->applied_seq(), e->volume->points().count());
      volumes[Key(tenant, n)] = e;
    }
  }
  return Status::OK();
}

Result<std::pair<std::shared_ptr<VolEntry>, ApplyOutcome>> MasterTarget::Impl::OpenVolume(const std::string& tenant,
                                                                       const proto::VolumeOpen& m,
                                                                       const Upstream& from) {
  VolumeIdentity id;
  id.name = m.name;
  id.size = m.size;
  id.block_size = m.block_size;
  id.uuid = m.uuid;
  id.generation = m.generation;
  id.sealed = m.sealed;
  std::shared_ptr<VolEntry> e;
  {
    std::lock_guard<std::mutex> lk(vol_mu);
    auto it = volumes.find(Key(tenant, m.name));
    if (it != volumes.end()) {
      e = it->second;
    } else {
      std::string dir = VolumeDir(store_root, tenant, m.name);
      if (dir.empty()) {
        ApplyOutcome bad;
        bad.ack = false;
        bad.reason = proto::NackReason::kBadRecord;
        bad.message = "bad volume name";
        return std::make_pair(std::shared_ptr<VolEntry>(), bad);
      }
      size_t count = 0;
      for (const auto& [key, entry] : volumes) count += entry->tenant == tenant ? 1 : 0;
      if (count >= o.max_volumes_per_tenant) {
        ApplyOutcome bad;
        bad.ack = false;
        bad.reason = proto::NackReason::kPermissionDenied;
        bad.message = "tenant volume limit reached: " + std::to_string(count) + " volumes (max_volumes_per_tenant)";
        return std::make_pair(std::shared_ptr<VolEntry>(), bad);
      }
      if (uint64_t q = Quota(tenant); q != 0 && UsageLocked(tenant) + m.size > q) {
        ApplyOutcome bad;
        bad.ack = false;
        bad.reason = proto::NackReason::kPermissionDenied;
        bad.message = "tenant quota exceeded: " + std::to_string(UsageLocked(tenant)) + " + " +
                      std::to_string(m.size) + " > " + std::to_string(q) + " bytes";
        return std::make_pair(std::shared_ptr<VolEntry>(), bad);
      }
      CDP_RETURN_IF_ERROR(store->CreateDirs(dir));
      auto v = ReplicaVolume::Open(VolOpts(tenant, m.name), &id);
      if (!v.ok() && v.status().code() != Code::kInvalidArgument) NoteRefusedLocked(tenant, m.name, v.status());
      if (!v.ok()) {
        if (v.status().code() == Code::kInvalidArgument) {
          ApplyOutcome bad;
          bad.ack = false;
          bad.reason = proto::NackReason::kBadRecord;
          bad.message = v.status().message();
          return std::make_pair(std::shared_ptr<VolEntry>(), bad);
        }
        return v.status();
      }
      e = std::make_shared<VolEntry>();
      e->tenant = tenant;
      e->name = m.name;
      e->volume = std::shared_ptr<ReplicaVolume>(std::move(*v));
      volumes[Key(tenant, m.name)] = e;
      ClearRefusedLocked(tenant, m.name);
      log->info("{} created: {} bytes, block size {}", log::Where{m.name, tenant, 0}, m.size, m.block_size);
    }
  }
  CDP_ASSIGN_OR_RETURN(ApplyOutcome out, e->volume->CheckOpen(id, from));
  return std::make_pair(e, out);
}

void MasterTarget::Impl::RetentionLoop() {
  std::unique_lock<std::mutex> lk(ret_mu);
  while (!stopping.load()) {
    ret_cv.wait_for(lk, std::chrono::microseconds(o.retention_check_us), [this] { return stopping.load(); });
    if (stopping.load()) break;
    lk.unlock();
    RunRetention();
    lk.lock();
  }
}

json::array MasterTarget::Impl::RunRetention(const std::string& tenant) {
  json::array out;
  std::vector<std::shared_ptr<VolEntry>> vs;
  {
    std::lock_guard<std::mutex> lk(vol_mu);
    for (auto& [k, e] : volumes) {
      if (tenant.empty() || e->tenant == tenant) vs.push_back(e);
    }
  }
  for (auto& e : vs) {
    auto r = e->volume->ApplyRetention();
    if (!r.ok()) {
      log->error("{} retention failed: {}", log::Where{e->name, e->tenant, 0}, r.status().ToString());
      continue;
    }
    out.push_back(json::object{{"tenant", e->tenant},
                               {"volume", e->name},
                               {"dropped_segments", r->dropped_segments.size()},
                               {"dropped_points", r->dropped_points.size()},
                               {"horizon_seq", r->horizon_seq}});
  }
  return out;
}

Result<std::shared_ptr<VolEntry>> MasterTarget::Impl::Resolve(const http::Caller& caller, const std::string& tenant,
                                                              const std::string& volume) {
  if (!ValidName(volume)) return Status::InvalidArgument("missing or bad 'volume'");
  std::lock_guard<std::mutex> lk(vol_mu);
  if (!caller.admin) {
    // One answer for "not yours" and "not there": nothing tells them apart.
    auto it = tenant.empty() || tenant == caller.tenant ? volumes.find(Key(caller.tenant, volume)) : volumes.end();
    if (it == volumes.end()) return Status::NotFound("no volume " + volume);
    return it->second;
  }
  if (!tenant.empty()) {
    auto it = volumes.find(Key(tenant, volume));
    if (it == volumes.end()) return Status::NotFound("no volume " + tenant + "/" + volume);
    return it->second;
  }
  std::shared_ptr<VolEntry> found;
  for (auto& [k, e] : volumes) {
    if (e->name == volume) {
      if (found) return Status::InvalidArgument("volume name " + volume + " is ambiguous; give 'tenant'");
      found = e;
    }
  }
  if (!found) return Status::NotFound("no volume " + volume);
  return found;
}

MasterTarget::MasterTarget(MasterTargetOptions opts) : o_(std::move(opts)) {
  impl_ = std::make_unique<Impl>(this);
}

MasterTarget::~MasterTarget() { Stop(); }

uint16_t MasterTarget::control_port() const { return impl_->http ? impl_->http->port() : 0; }
uint16_t MasterTarget::nbd_port() const { return impl_->nbd ? impl_->nbd->port() : 0; }

std::shared_ptr<ReplicaVolume> MasterTarget::FindVolume(const std::string& tenant, const std::string& name) {
  std::lock_guard<std::mutex> lk(impl_->vol_mu);
  auto it = impl_->volumes.find(Impl::Key(tenant, name));
  return it == impl_->volumes.end() ? nullptr : it->second->volume;
}

Status MasterTarget::Start() {
  Impl& m = *impl_;
  if (!o_.env || !o_.clock) return Status::InvalidArgument("master target: env and clock are required");
  if (o_.max_batch_work < proto::kMaxRecordLength)
    return Status::InvalidArgument("max_batch_work must be at least one record (" +
                                   std::to_string(proto::kMaxRecordLength) + " bytes)");
  if (o_.max_batch_work < proto::kMaxBatchWork)
    m.log->warn("max_batch_work {} is below the {} bytes sources cut batches at: a batch of many zero/trim records "
                "will be refused and its volume stall",
                o_.max_batch_work, proto::kMaxBatchWork);
  for (const auto& [t, s] : o_.tenants) {
    if (!ValidName(t)) return Status::InvalidArgument("bad tenant name '" + t + "'");
    if (s.empty()) return Status::InvalidArgument("tenant " + t + " has an empty secret");
  }
  m.connections = registry_.GetGauge("cdp_mt_connections", "Process server connections open");
  m.nacks = registry_.GetCounter("cdp_mt_nacks_total", "Requests refused with a Nack");
  m.received_queued = registry_.GetGauge("cdp_mt_received_queued_bytes",
                                         "Bytes received from process servers and not yet applied (all sessions)");
  m.batches_grouped = registry_.GetCounter("cdp_mt_batches_grouped_total",
                                           "WriteBatches applied in one group commit with the batch before them");
  repl::RegisterReceiveStages(registry_, "cdp_mt", &m.receive_stages);
  metrics::RegisterProcessMetrics(registry_, o_.env, o_.clock);
  CDP_RETURN_IF_ERROR(o_.env->CreateDirs(o_.data_dir));
  {
    auto lock = o_.env->LockFile(JoinPath(o_.data_dir, "LOCK"));
    if (!lock.ok()) return lock.status().WithContext("data_dir");
    m.data_dir_lock = std::move(*lock);
  }
  if (o_.store) {
    m.store = o_.store.get();
    m.store_root = o_.store_dir;
    m.store_vfs = std::make_unique<sqlite::EnvVfs>(m.store);
  } else if (o_.max_open_files > 0) {
    m.local_files = std::make_unique<FileCacheEnv>(o_.env, o_.max_open_files);
    m.store = m.local_files.get();
    m.store_root = o_.data_dir;
    m.store_vfs = std::make_unique<sqlite::EnvVfs>(m.store);
  } else {
    m.store = o_.env;
    m.store_root = o_.data_dir;
    // sqlite's own VFS would create the index 0644: its files go through the
    // Env too, with the Env's modes.
    m.store_vfs = std::make_unique<sqlite::EnvVfs>(m.store);
  }
  // Crash recovery of every volume comes before anything else.
  CDP_RETURN_IF_ERROR(m.LoadVolumes());

  if (o_.tls.enabled) {
    auto creds = TlsCredentials::Load(TlsFiles{o_.tls.ca, o_.tls.cert, o_.tls.key, o_.tls.crl});
    if (!creds.ok()) return creds.status().WithContext("TLS");
    m.tls = std::move(*creds);
  }
  if (!o_.nbd.off()) {
    NbdServerOptions no;
    no.tcp = o_.nbd;
    no.idle_timeout_ms = o_.nbd_idle_timeout_ms;
    no.max_connections = o_.nbd_max_connections;
    no.read_threads = o_.nbd_read_threads;
    no.max_connections_per_tenant = o_.nbd_max_connections_per_tenant;
    if (o_.nbd_tls) {
      if (!m.tls) return Status::InvalidArgument("nbd exports: nbd_tls needs TLS credentials (tls = on)");
      no.tls = m.tls.get();
      no.tls_mode = NbdServerOptions::TlsMode::kRequire;
    } else {
      m.log->warn("nbd_tls = off: every tenant's point-in-time exports are open to anyone who reaches {}:{}",
                  o_.nbd.host, o_.nbd.port);
    }
    m.nbd = std::make_unique<NbdServer>(no);
    Status s = m.nbd->Start();
    if (!s.ok()) {
      m.nbd.reset();
      return s.WithContext("nbd exports");
    }
  }
  // A failover's export is served again before anything else can reach the volumes.
  m.RestorePromoted();
  // Groups across process servers, coordinated here (common/wire/group_coordinator.h).
  {
    GroupCoordinator::Options go;
    go.env = o_.env;
    go.path = JoinPath(o_.data_dir, "groups.json");
    go.registry = &registry_;
    go.metric_prefix = "cdp_mt";
    go.log_name = "mt";
    go.route_by_volume = true;
    m.groups = std::make_unique<GroupCoordinator>(go);
    if (Status s = m.groups->Start(); !s.ok()) {
      Stop();
      return s.WithContext("groups");
    }
  }
  if (!o_.control.off()) {
    http::ServerOptions ho;
    ho.host = o_.control.host;
    ho.port = o_.control.port;
    ho.max_connections_per_peer = o_.connection_caps.control_per_peer;
    ho.registry = &registry_;
    ho.status = [this] { return impl_->StatusJson(); };
    if (m.nbd && !o_.nbd_tls) ho.insecure.push_back("nbd_tls = off");  // exports in clear text on TCP
    auto tokens = ApplyControlAuth(o_.control_auth, JoinPath(o_.data_dir, "control.token"),
                                   JoinPath(o_.data_dir, "tenant_tokens"), "mt", &ho, m.tls.get());
    if (!tokens.ok()) {
      Stop();
      return tokens.status();
    }
    m.control_tokens = *tokens;
    m.http = std::make_unique<http::Server>(ho);
    m.AddRoutes();
    AddDashboardRoutes(*m.http);
    Status s = m.http->Start();
    if (!s.ok()) {
      Stop();
      return s.WithContext("control server");
    }
  }
  Listener::Options lo;
  lo.name = "mt-peers";
  lo.max_connections = o_.connection_caps.total;
  lo.max_per_peer = o_.connection_caps.per_peer;
  lo.tcp = o_.listen;
  lo.mode = Listener::Mode::kThreadPerConnection;
  lo.registry = &registry_;
  StreamWrapper secure;
  if (m.tls) {
    secure = TlsWrapper(m.tls.get(), TlsSide::kServer, std::chrono::milliseconds(o_.handshake_timeout_ms));
    m.log->info("TLS on: certificate '{}' (role {})", m.tls->Current()->self().name, m.tls->Current()->self().role);
  } else {
    m.log->warn("tls = off: process servers connect in clear text; blocks cross the network unencrypted");
  }
  m.receiver = m.MakeReceiver();
  m.listener = std::make_unique<Listener>(lo, ServeFrames([&m](FrameChannel& ch, Listener::Slot& slot) { m.receiver->Serve(ch, &slot); }, secure));
  if (Status s = m.listener->Start(); !s.ok()) {
    Stop();
    return s;
  }
  port_ = m.listener->tcp_port();
  m.retention_thread = std::thread([&m] { m.RetentionLoop(); });
  m.log->info("listening on {}:{}, control port {}, nbd port {}; volumes in {}", o_.listen.host, port(), control_port(),
              nbd_port(), o_.store ? o_.store_description : o_.data_dir);
  return Status::OK();
}

Status MasterTarget::ReloadTls() {
  if (!impl_ || !impl_->tls) return Status::OK();
  return impl_->tls->Reload();
}

void MasterTarget::Stop() {
  if (!impl_) return;
  Impl& m = *impl_;
  if (m.stopping.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lk(m.ret_mu);
    m.ret_cv.notify_all();
  }
  if (m.retention_thread.joinable()) m.retention_thread.join();
  if (m.groups) m.groups->Stop();  // no round pushes to a session after this
  if (m.listener) m.listener->Stop();  // every PS connection sees EOF; joins their threads
  if (m.http) m.http->Stop();
  if (m.nbd) m.nbd->Stop();
  m.nbd.reset();
  {
    std::lock_guard<std::mutex> lk(m.export_mu);
    m.exports.clear();
  }
  std::lock_guard<std::mutex> lk(m.vol_mu);
  m.volumes.clear();
  m.data_dir_lock.reset();  // data_dir is free for another master target
}

Result<std::string> MasterTarget::StartExport(const std::string& tenant, const std::string& volume, uint64_t point_seq,
                                              bool writable) {
  Impl& m = *impl_;
  if (!m.nbd) return Status::NotSupported("NBD exports are disabled (nbd port < 0)");
  std::shared_ptr<ReplicaVolume> v = FindVolume(tenant, volume);
  if (!v) return Status::NotFound("no volume " + tenant + "/" + volume);
  std::lock_guard<std::mutex> lk(m.export_mu);
  if (o_.max_exports_per_tenant > 0) {
    const auto held = std::count_if(m.exports.begin(), m.exports.end(), [&](const auto& kv) {
      return kv.second.tenant == tenant && !kv.second.promoted;
    });
    if (held >= o_.max_exports_per_tenant) {
      m.log->warn("{} export refused: tenant {} has {} exports (max_exports_per_tenant)",
                  log::Where{volume, tenant, point_seq}, tenant, held);
      return Status::Busy("tenant '" + tenant + "' already has " + std::to_string(held) +
                          " exports, the cap max_exports_per_tenant; remove one (cdpctl unexport) first");
    }
  }
  uint64_t n = ++m.export_counter;
  std::string name = tenant + "/" + volume + "@" + std::to_string(point_seq);
  if (writable) name += "-rw";
  if (m.exports.count(name)) name += "." + std::to_string(n);
  std::string overlay;
  if (writable) {
    overlay = JoinPath(JoinPath(JoinPath(JoinPath(o_.data_dir, "tenants"), tenant), "exports"),
                       std::to_string(n) + ".cow");
    if (o_.env->Exists(overlay)) CDP_RETURN_IF_ERROR(o_.env->Remove(overlay));
  }
  CDP_ASSIGN_OR_RETURN(auto dev, PointInTimeDevice::Open(v, point_seq, o_.env, overlay));
  const std::string what = volume + " at sequence " + std::to_string(point_seq);
  CDP_RETURN_IF_ERROR(m.nbd->AddExport(name, dev, what, tenant));
  m.exports[name] = ExportEntry{tenant, volume, point_seq, writable, false, dev};
  m.log->info("{} export {} started{}{}", log::Where{volume, tenant, point_seq}, name,
              writable ? " (writable overlay)" : "",
              v->identity().sealed ? " (sealed: the stored blocks and MACs, decrypted only at the tenant)" : "");
  return name;
}

Status MasterTarget::StopExport(const std::string& name) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.export_mu);
  auto it = m.exports.find(name);
  if (it == m.exports.end()) return Status::NotFound("no export " + name);
  if (it->second.promoted)
    return Status::InvalidArgument(name + " is the export of a failover; cdpctl failover " + it->second.volume +
                                   " --undo removes it (before a commit)");
  if (m.nbd) {
    Status s = m.nbd->RemoveExport(name);
    if (!s.ok() && !s.IsNotFound()) return s;
  }
  m.exports.erase(it);
  m.log->info("export {} removed", name);
  return Status::OK();
}

std::string MasterTarget::PromotedExportName(const std::string& tenant, const std::string& volume) {
  return tenant + "/" + volume + "@failover";
}

std::string MasterTarget::Impl::OverlayData(const std::string& tenant, const std::string& volume) const {
  return JoinPath(VolumeDir(store_root, tenant, volume), "failover.cow");
}

std::string MasterTarget::Impl::OverlayBitmap(const std::string& tenant, const std::string& volume) const {
  return JoinPath(VolumeDir(store_root, tenant, volume), "failover.bitmap");
}

Result<std::shared_ptr<PointInTimeDevice>> MasterTarget::Impl::ServePromoted(const std::string& tenant,
                                                                             const std::string& volume,
                                                                             const std::shared_ptr<ReplicaVolume>& v,
                                                                             uint64_t seq, bool create) {
  if (!nbd) return Status::NotSupported("NBD exports are disabled (nbd port < 0): a failover needs them");
  const std::string name = PromotedExportName(tenant, volume);
  std::lock_guard<std::mutex> lk(export_mu);
  auto it = exports.find(name);
  if (it != exports.end()) return it->second.device;
  CDP_ASSIGN_OR_RETURN(auto dev, PointInTimeDevice::OpenPersistent(v, seq, store, OverlayData(tenant, volume),
                                                                   OverlayBitmap(tenant, volume), create));
  const bool sealed = v->identity().sealed;
  CDP_RETURN_IF_ERROR(nbd->AddExport(name, dev,
                                     volume + " failed over at sequence " +
                                         std::to_string(v->fence().numbering().Wire(seq)) +
                                         (sealed ? " (read-write, persistent; sealed: stored blocks and MACs)"
                                                 : " (read-write, persistent)"),
                                     tenant));
  log->warn("{} failover export {} served (read-write, persistent overlay{}, {} blocks written at the provider)",
            log::Where{volume, tenant, seq}, name,
            sealed ? "; sealed: the tenant reads and writes it through cdpctl serve with its key" : "",
            dev->overlay_blocks());
  exports[name] = ExportEntry{tenant, volume, seq, true, true, dev};
  return dev;
}

void MasterTarget::Impl::RestorePromoted() {
  std::vector<std::shared_ptr<VolEntry>> vs;
  {
    std::lock_guard<std::mutex> lk(vol_mu);
    for (auto& [k, e] : volumes) vs.push_back(e);
  }
  std::lock_guard<std::mutex> fl(failover_mu);
  for (auto& e : vs) {
    if (auto f = e->volume->fence().failover()) {
      auto d = ServePromoted(e->tenant, e->name, e->volume, f->point_seq, false);
      // Failing back past the quiesce: writes stay refused (Quiesce sets that before its flush).
      if (d.ok() && f->quiesced) {
        if (Status q = (*d)->Quiesce(); !q.ok())
          log->error("{} quiesced export: flush failed: {}", log::Where{e->name, e->tenant, 0}, q.ToString());
      }
      if (!d.ok()) {
        log->error("{} failed over, but its export cannot be served: {}", log::Where{e->name, e->tenant, f->point_seq},
                   d.status().ToString());
      }
    } else if (store->Exists(OverlayData(e->tenant, e->name)) || store->Exists(OverlayBitmap(e->tenant, e->name))) {
      // Left by an undo or a failover that did not commit: nothing refers to it.
      Status s = PointInTimeDevice::RemoveOverlay(store, OverlayData(e->tenant, e->name),
                                                  OverlayBitmap(e->tenant, e->name));
      if (!s.ok()) log->warn("{} stale failover overlay: {}", log::Where{e->name, e->tenant, 0}, s.ToString());
    }
  }
}

Result<MasterTarget::FailoverOutcome> MasterTarget::Failover(const std::string& tenant, const std::string& volume,
                                                             uint64_t point_seq, int64_t point_id) {
  Impl& m = *impl_;
  std::shared_ptr<ReplicaVolume> v = FindVolume(tenant, volume);
  if (!v) return Status::NotFound("no volume " + tenant + "/" + volume);
  if (!m.nbd) return Status::NotSupported("NBD exports are disabled (nbd port < 0): a failover needs them");
  std::lock_guard<std::mutex> fl(m.failover_mu);
  FailoverOutcome out;
  out.export_name = PromotedExportName(tenant, volume);
  if (auto f = v->fence().failover()) {
    // Already failed over: the same point is a no-op (the export is served
    // again if it was not), another one the volume's error.
    CDP_ASSIGN_OR_RETURN(bool changed, v->Failover(point_seq, point_id));
    (void)changed;
    CDP_RETURN_IF_ERROR(m.ServePromoted(tenant, volume, v, f->point_seq, false).status());
    return out;
  }
  // Overlay first (created and synced), then the state, then the export.
  const std::string data = m.OverlayData(tenant, volume), bitmap = m.OverlayBitmap(tenant, volume);
  CDP_ASSIGN_OR_RETURN(auto dev, PointInTimeDevice::OpenPersistent(v, point_seq, m.store, data, bitmap, true));
  auto changed = v->Failover(point_seq, point_id);
  if (!changed.ok()) {
    dev.reset();
    (void)PointInTimeDevice::RemoveOverlay(m.store, data, bitmap);
    return changed.status();
  }
  dev.reset();
  CDP_RETURN_IF_ERROR(m.ServePromoted(tenant, volume, v, point_seq, false).status());
  out.changed = true;
  return out;
}

Result<bool> MasterTarget::UndoFailover(const std::string& tenant, const std::string& volume) {
  Impl& m = *impl_;
  std::shared_ptr<ReplicaVolume> v = FindVolume(tenant, volume);
  if (!v) return Status::NotFound("no volume " + tenant + "/" + volume);
  std::lock_guard<std::mutex> fl(m.failover_mu);
  auto f = v->fence().failover();
  if (!f || f->committed) return v->UndoFailover();  // false, or the volume's error
  const std::string name = PromotedExportName(tenant, volume);
  {
    std::lock_guard<std::mutex> lk(m.export_mu);
    if (m.nbd) {
      Status s = m.nbd->RemoveExport(name);
      if (!s.ok() && !s.IsNotFound()) return s;
    }
    m.exports.erase(name);
  }
  auto changed = v->UndoFailover();
  if (!changed.ok()) {
    // Still failed over: serve its export again.
    auto d = m.ServePromoted(tenant, volume, v, f->point_seq, false);
    if (!d.ok()) m.log->error("{} export after a failed undo: {}", log::Where{volume, tenant, 0}, d.status().ToString());
    return changed.status();
  }
  Status s = PointInTimeDevice::RemoveOverlay(m.store, m.OverlayData(tenant, volume), m.OverlayBitmap(tenant, volume));
  if (!s.ok()) m.log->warn("{} failover overlay not removed (removed at the next start): {}",
                           log::Where{volume, tenant, 0}, s.ToString());
  return *changed;
}

Result<bool> MasterTarget::CommitFailover(const std::string& tenant, const std::string& volume) {
  Impl& m = *impl_;
  std::shared_ptr<ReplicaVolume> v = FindVolume(tenant, volume);
  if (!v) return Status::NotFound("no volume " + tenant + "/" + volume);
  std::lock_guard<std::mutex> fl(m.failover_mu);
  return v->CommitFailover();
}

}  // namespace cdp::mt
