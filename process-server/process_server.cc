// SPDX-License-Identifier: Apache-2.0
#include "process-server/process_server.h"

#include <boost/json.hpp>
#include <optional>

#include "common/wire/codec.h"
#include "common/wire/stage_metrics.h"
#include "process-server/process_server_impl.h"
#include "process-server/ps_control_api.h"

namespace cdp::ps {

namespace json = boost::json;

MtLink* ProcessServer::Impl::LinkFor(const std::string& tenant, const std::string& volume, size_t copy) {
  if (copy >= links.size()) return nullptr;
  auto it = links[copy].find(tenant);
  if (it == links[copy].end() || it->second.empty()) return nullptr;
  auto& v = it->second;
  size_t h = std::hash<std::string>{}(volume);
  return v[h % v.size()].get();
}

Result<uint64_t> ProcessServer::Impl::LearnPosition(SpooledVolume* v) {
  uint64_t top = 0;
  const std::vector<CopyState> copies = v->CopyStates();
  for (size_t c = 0; c < copies.size(); ++c) {
    MtLink* link = LinkFor(v->tenant(), v->name(), c);
    if (link == nullptr) return Status::Unavailable("no link to copy " + std::to_string(c) + "'s master target");
    Result<uint64_t> d = link->WaitOpened(v, std::chrono::milliseconds(opt->mt_open_wait_ms));
    if (!d.ok()) return d.status().WithContext("master target " + copies[c].mt);
    top = std::max(top, *d);
  }
  return top;
}

std::vector<HostPort> ProcessServer::Impl::Targets() const {
  std::vector<HostPort> t{opt->mt};
  t.insert(t.end(), opt->more_mts.begin(), opt->more_mts.end());
  return t;
}

size_t ProcessServer::Impl::CopiesFor(const std::string& key) const {
  const size_t mts = 1 + opt->more_mts.size();
  int n = opt->copies;
  if (auto it = opt->volume_copies.find(key); it != opt->volume_copies.end()) n = it->second;
  if (n <= 0) return mts;
  return std::min(mts, size_t(n));
}

void ProcessServer::Impl::NotifyLinks(SpooledVolume* v) {
  for (size_t c = 0; c < v->copies(); ++c)
    if (MtLink* link = LinkFor(v->tenant(), v->name(), c)) link->Notify();
}

std::vector<CopyStatus> ProcessServer::Impl::CopyStatuses(SpooledVolume* v) {
  std::vector<CopyStatus> out;
  const uint64_t now = opt->clock->WallMicros();
  const std::vector<CopyState> states = v->CopyStates();
  for (size_t i = 0; i < states.size(); ++i) {
    const CopyState& c = states[i];
    const SpoolBacklog b = v->spool().BacklogAbove(c.acked);
    CopyStatus s;
    s.copy = i;
    s.mt = c.mt;
    s.acked_seq = c.acked;
    s.lag_records = b.records;
    s.lag_bytes = b.bytes;
    s.lag_seconds = b.oldest_timestamp_us && b.oldest_timestamp_us < now ? double(now - b.oldest_timestamp_us) / 1e6 : 0;
    s.lost = c.lost;
    s.undeliverable = c.undeliverable;
    MtLink* link = LinkFor(v->tenant(), v->name(), i);
    s.link = link ? link->state() : std::string("none");
    s.stalled = c.stalled;
    s.fenced = c.fenced;
    out.push_back(std::move(s));
  }
  return out;
}

std::pair<proto::Codec, int> ProcessServer::Impl::CodecFor(const std::string& key) {
  auto it = opt->volume_codecs.find(key);
  if (it != opt->volume_codecs.end()) return it->second;
  return {opt->codec, opt->level};
}

SpoolOptions ProcessServer::Impl::SpoolOpts(const std::string& tenant, const std::string& volume) {
  SpoolOptions so;
  so.env = opt->env;
  so.clock = opt->clock;
  so.dir = JoinPath(JoinPath(opt->spool_dir, tenant), volume);
  so.segment_bytes = opt->segment_bytes;
  so.quota_bytes = opt->quota_bytes;
  std::string key = tenant + "/" + volume;
  auto lg = log;
  so.on_corruption = [lg, key](const Status& s) {
    lg->error("{} spool corruption: {}", log::Where{key, "", 0}, s.ToString());
  };
  return so;
}

void ProcessServer::Impl::RegisterMetrics(SpooledVolume* v) {
  metrics::Registry* reg = opt->registry;
  if (reg == nullptr) return;
  metrics::Labels lb{{"tenant", v->tenant()}, {"volume", v->name()}};
  Clock* clock = opt->clock;
  auto add = [&](const char* name, const char* help, metrics::Type t, std::function<double()> fn) {
    reg->AddComputed(name, help, t, std::move(fn), lb);
    series.emplace_back(name, lb);
  };
  VolumeCounters* c = &v->counters();
  add("cdp_ps_bytes_in_total", "Record data bytes accepted from agents", metrics::Type::kCounter,
      [c] { return double(c->bytes_in.load()); });
  add("cdp_ps_records_in_total", "Records accepted from agents", metrics::Type::kCounter,
      [c] { return double(c->records_in.load()); });
  add("cdp_ps_bytes_out_total", "Frame bytes sent to the master target", metrics::Type::kCounter,
      [c] { return double(c->wire_out.load()); });
  add("cdp_ps_raw_bytes_out_total", "Spooled record bytes shipped (before compression)", metrics::Type::kCounter,
      [c] { return double(c->raw_out.load()); });
  add("cdp_ps_compression_ratio", "Raw bytes shipped / wire bytes", metrics::Type::kGauge, [c] {
    uint64_t w = c->wire_out.load();
    return w ? double(c->raw_out.load()) / double(w) : 0.0;
  });
  add("cdp_ps_busy_nacks_total", "Batches refused for quota", metrics::Type::kCounter,
      [c] { return double(c->busy_nacks.load()); });
  add("cdp_ps_resent_frames_total", "Frames sent again after a gap, busy or reconnect", metrics::Type::kCounter,
      [c] { return double(c->resent_frames.load()); });
  add("cdp_ps_spool_corruptions_total", "Spool records that failed their CRC", metrics::Type::kCounter,
      [c] { return double(c->corruptions.load()); });
  add("cdp_ps_mt_acked_seq", "Highest sequence durable at the master target", metrics::Type::kGauge,
      [c] { return double(c->mt_acked.load()); });
  Spool* sp = &v->spool();
  add("cdp_ps_spool_durable_seq", "Highest sequence durable in the spool", metrics::Type::kGauge,
      [sp] { return double(sp->durable_seq()); });
  add("cdp_ps_backlog_bytes", "Spooled bytes not yet acknowledged by the master target", metrics::Type::kGauge,
      [sp] { return double(sp->stats().backlog_bytes); });
  add("cdp_ps_backlog_records", "Spooled records not yet acknowledged by the master target",
      metrics::Type::kGauge, [sp] { return double(sp->stats().backlog_records); });
  add("cdp_ps_spool_disk_bytes", "Bytes of the volume's spool segment files", metrics::Type::kGauge,
      [sp] { return double(sp->stats().disk_bytes); });
  add("cdp_ps_oldest_record_age_seconds", "Age of the oldest unacknowledged spooled record",
      metrics::Type::kGauge, [sp, clock] {
        uint64_t ts = sp->stats().oldest_timestamp_us, now = clock->WallMicros();
        return ts == 0 || ts > now ? 0.0 : double(now - ts) / 1e6;
      });
  add("cdp_ps_spool_busy", "1 while the spool refuses batches for quota", metrics::Type::kGauge,
      [sp] { return sp->stats().busy ? 1.0 : 0.0; });
  add("cdp_ps_spool_quota_bytes", "The spool's backlog quota (0: unlimited)", metrics::Type::kGauge,
      [q = double(opt->quota_bytes)] { return q; });
  // Per copy (one MT each; copy 0 is the primary): its own lag.
  const std::vector<CopyState> copies = v->CopyStates();
  for (size_t i = 0; i < copies.size(); ++i) {
    metrics::Labels cl{{"tenant", v->tenant()}, {"volume", v->name()}, {"copy", std::to_string(i)},
                       {"mt", copies[i].mt}};
    auto add_copy = [&](const char* name, const char* help, std::function<double(const SpoolBacklog&, uint64_t)> fn) {
      reg->AddComputed(name, help, metrics::Type::kGauge, [v, i, fn] {
        const std::vector<CopyState> st = v->CopyStates();
        if (i >= st.size()) return 0.0;
        return fn(v->spool().BacklogAbove(st[i].acked), st[i].acked);
      }, cl);
      series.emplace_back(name, cl);
    };
    add_copy("cdp_ps_copy_acked_seq", "Highest sequence durable at this copy's master target",
             [](const SpoolBacklog&, uint64_t acked) { return double(acked); });
    add_copy("cdp_ps_copy_lag_records", "Spooled records this copy's master target has not acknowledged",
             [](const SpoolBacklog& b, uint64_t) { return double(b.records); });
    add_copy("cdp_ps_copy_lag_bytes", "Spooled bytes this copy's master target has not acknowledged",
             [](const SpoolBacklog& b, uint64_t) { return double(b.bytes); });
    add_copy("cdp_ps_copy_lag_seconds", "Age of the oldest record this copy's master target has not acknowledged",
             [clock](const SpoolBacklog& b, uint64_t) {
               uint64_t now = clock->WallMicros();
               return b.oldest_timestamp_us == 0 || b.oldest_timestamp_us > now
                          ? 0.0
                          : double(now - b.oldest_timestamp_us) / 1e6;
             });
  }
}

Result<SpooledVolume*> ProcessServer::Impl::GetVolume(const std::string& tenant, const proto::VolumeOpen* open, const std::string& name) {
  std::string key = tenant + "/" + name;
  std::lock_guard<std::mutex> l(mu);
  auto it = volumes.find(key);
  if (it != volumes.end()) {
    const uint64_t have = it->second->open_message().generation;
    if (open == nullptr || open->generation == have) return it->second.get();
    const std::string fence = it->second->fenced();
    // Re-protect: a higher generation replaces a spool the MT fences (failed
    // over, or failed back and not yet re-protected). The next generation an
    // operator armed here (cdpctl reprotect) replaces one with nothing left
    // that a master target could take (everything acknowledged, or every copy
    // lost: resync needed); until then the agent is refused and tries again,
    // the old generation's records are delivered first. An agent's word alone
    // never replaces a spool.
    const std::string refused =
        "wrong generation: spool has " + std::to_string(have) + ", agent sent " + std::to_string(open->generation);
    if (open->generation < have) return Status::InvalidArgument(refused);
    auto armed = reprotect_armed.find(key);
    if (fence.empty() && (armed == reprotect_armed.end() || armed->second != open->generation))
      return Status::InvalidArgument(refused + "; a re-protect is an operator command (cdpctl reprotect)");
    if (fence.empty() && !it->second->NothingToDeliver())
      return Status::InvalidArgument(refused + "; generation " + std::to_string(have) +
                                     " still has records to deliver to the master target, the new one is taken "
                                     "once they are");
    CDP_RETURN_IF_ERROR(RetireSpoolLocked(key, fence.empty() ? "armed by the operator, nothing left to deliver" : fence));
    reprotect_armed.erase(key);
  }
  auto [codec, level] = CodecFor(key);
  std::vector<std::string> copies;
  const std::vector<HostPort> targets = Targets();
  for (size_t c = 0; c < CopiesFor(key); ++c) copies.push_back(targets[c].ToString());
  // The agent's acknowledged sequence is a hint for one answer (agent_session.cc):
  // neither kept in the spool's metadata nor sent on to the master target.
  std::optional<proto::VolumeOpen> kept;
  if (open != nullptr) {
    kept = *open;
    kept->acked_seq = 0;
  }
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<SpooledVolume> v,
                       SpooledVolume::Open(SpoolOpts(tenant, name), tenant, kept ? &*kept : nullptr, codec, level,
                                           copies, opt->cursor_sync_ms));
  if (auto it = opt->volume_inflight.find(key); it != opt->volume_inflight.end()) v->set_max_inflight(it->second);
  SpooledVolume* raw = v.get();
  volumes[key] = std::move(v);
  RegisterMetrics(raw);
  for (size_t c = 0; c < raw->copies(); ++c)
    if (MtLink* link = LinkFor(tenant, name, c)) link->AddVolume(raw);
  SpoolStats st = raw->spool().stats();
  log->info("{} spool open: durable {}, backlog {} records / {} bytes", log::Where{key, "", st.durable_seq},
            st.durable_seq, st.backlog_records, st.backlog_bytes);
  return raw;
}

Status ProcessServer::Impl::RetireSpoolLocked(const std::string& key, const std::string& fence) {
  auto it = volumes.find(key);
  if (it == volumes.end()) return Status::NotFound("no volume " + key);
  SpooledVolume* v = it->second.get();
  const uint64_t gen = v->open_message().generation;
  // Shipping stops first: nothing releases (deletes) spool segments from now
  // on, and a closed spool refuses to (Spool::Close).
  for (size_t c = 0; c < v->copies(); ++c)
    if (MtLink* link = LinkFor(v->tenant(), v->name(), c)) link->RemoveVolume(v);
  v->Close();
  const SpoolStats st = v->spool().stats();
  const std::string dir = SpoolOpts(v->tenant(), v->name()).dir;
  const std::string base = dir + ".gen" + std::to_string(gen) + std::string(kRetiredMark) +
                           std::to_string(opt->clock->WallMicros() / 1'000'000);
  std::string to = base;
  for (int n = 2; opt->env->Exists(to); ++n) to = base + "-" + std::to_string(n);  // retired twice in a second
  // One rename: a crash before it leaves the old spool in place (the switch
  // is redone at the next open), after it the new spool is created from
  // nothing; the start-up scan skips the retired directory.
  Status s = opt->env->Rename(dir, to);
  if (s.ok()) s = opt->env->SyncDir(JoinPath(opt->spool_dir, v->tenant()));
  if (!s.ok()) {
    log->error("{} retiring the spool of generation {}: {}", log::Where{key, "", st.durable_seq}, gen, s.ToString());
    return s.WithContext("retiring the spool of generation " + std::to_string(gen));
  }
  log->warn("{} re-protect: the agent opened a newer generation than {} ({}); its spool ({} records never "
            "delivered, up to seq {}) is retired to {}; nothing was deleted, the operator may delete that directory",
            log::Where{key, "", st.durable_seq}, gen, fence, st.backlog_records, st.durable_seq, to);
  retired.push_back(std::move(it->second));
  volumes.erase(it);
  return Status::OK();
}

Result<std::vector<proto::BlockExtent>> ProcessServer::Impl::UnshippedBlocks(const std::string& tenant,
                                                                             const std::string& volume,
                                                                             uint64_t from_block) {
  const std::string key = tenant + "/" + volume;
  SpooledVolume* v = nullptr;
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = volumes.find(key);
    if (it == volumes.end()) return std::vector<proto::BlockExtent>{};
    v = it->second.get();  // never destroyed while the daemon runs (a retired one moves to `retired`)
  }
  const uint64_t bs = v->open_message().block_size;
  Spool& spool = v->spool();
  const SpoolStats st = spool.stats();
  if (st.first_seq == 0) return std::vector<proto::BlockExtent>{};
  const uint64_t from_seq = std::max(v->counters().mt_acked.load() + 1, st.first_seq);
  auto page = [from_block](const std::vector<proto::BlockExtent>& all) {
    std::vector<proto::BlockExtent> out;
    for (const proto::BlockExtent& e : all) {
      const uint64_t end = e.first_block + e.count;
      if (end <= from_block) continue;
      const uint64_t first = std::max(e.first_block, from_block);
      out.push_back(proto::BlockExtent{first, uint32_t(end - first)});
    }
    return out;
  };
  std::lock_guard<std::mutex> cl(unshipped_mu);
  UnshippedCache& c = unshipped_cache[key];
  if (c.volume == v && c.first_seq == st.first_seq && c.durable_seq == st.durable_seq && c.from_seq == from_seq)
    return page(c.blocks);
  std::vector<proto::BlockExtent> all;
  for (uint64_t from = from_seq; from <= st.durable_seq;) {
    CDP_ASSIGN_OR_RETURN(std::vector<proto::Record> recs, spool.Read(from, 16u << 20));
    if (recs.empty()) break;
    for (const proto::Record& r : recs) {
      if (!proto::IsWriteKind(r.kind)) continue;
      if (r.length == 0) continue;
      const uint64_t first = r.offset / bs;
      const uint64_t end = (r.offset + r.length + bs - 1) / bs;  // a record is at most kMaxRecordLength
      all.push_back(proto::BlockExtent{first, uint32_t(end - first)});
    }
    if (all.size() > 4 * size_t(proto::kMaxExtents)) all = proto::MergeExtents(std::move(all));
    from = recs.back().seq + 1;
  }
  c.volume = v;
  c.first_seq = st.first_seq;
  c.durable_seq = st.durable_seq;
  c.from_seq = from_seq;
  c.blocks = proto::MergeExtents(std::move(all));
  return page(c.blocks);
}

ProcessServer::ProcessServer(ProcessServerOptions options) : opt_(std::move(options)) {
  if (opt_.env == nullptr) opt_.env = DefaultEnv();
  if (opt_.max_open_files > 0) {
    files_ = std::make_unique<FileCacheEnv>(opt_.env, opt_.max_open_files);
    opt_.env = files_.get();
  }
  if (opt_.clock == nullptr) opt_.clock = SystemClock::Get();
  throttle_ = std::make_unique<Throttle>(opt_.clock, opt_.throttle);
  impl_ = std::make_unique<Impl>();
  impl_->self = this;
  impl_->opt = &opt_;
}

ProcessServer::~ProcessServer() { Stop(); }

Status ProcessServer::Start() {
  Impl& im = *impl_;
  CDP_RETURN_IF_ERROR(opt_.env->CreateDirs(opt_.spool_dir).WithContext("spool_dir"));
  {
    auto lock = opt_.env->LockFile(JoinPath(opt_.spool_dir, "LOCK"));
    if (!lock.ok()) return lock.status().WithContext("spool_dir");
    spool_lock_ = std::move(*lock);
  }
  if (opt_.tls.enabled) {
    CDP_ASSIGN_OR_RETURN(im.tls, TlsCredentials::Load(TlsFiles{opt_.tls.ca, opt_.tls.cert, opt_.tls.key, opt_.tls.crl}));
    const TlsPeer& self = im.tls->Current()->self();
    im.log->info("TLS on: certificate '{}' (role {}, tenant {})", self.name, self.role, self.tenant);
  } else {
    im.log->warn("tls = off: agents and the master target are reached in clear text; blocks cross the network unencrypted");
  }
  // MT links per tenant, for every MT (copy).
  const std::vector<HostPort> targets = im.Targets();
  for (size_t i = 0; i < opt_.more_mts.size(); ++i) {
    for (size_t j = 0; j < i + 1; ++j) {
      if (targets[j].ToString() == opt_.more_mts[i].ToString())
        return Status::InvalidArgument("master target " + opt_.more_mts[i].ToString() + " listed twice");
    }
  }
  for (const auto& [key, n] : opt_.volume_copies) {
    if (n < 1 || size_t(n) > targets.size())
      return Status::InvalidArgument("copies of " + key + " must be 1.." + std::to_string(targets.size()));
  }
  if (opt_.copies < 0 || size_t(opt_.copies) > targets.size())
    return Status::InvalidArgument("copies must be 0.." + std::to_string(targets.size()));
  // The groups coordinated here, and the relay of the master target's rounds
  // (common/wire/group_coordinator.h): before the links, which relay.
  GroupCoordinator::Options go;
  go.env = opt_.env;
  go.path = JoinPath(opt_.spool_dir, "groups.json");
  go.registry = opt_.registry;
  im.groups = std::make_unique<GroupCoordinator>(go);
  CDP_RETURN_IF_ERROR(im.groups->Start());
  im.links.resize(targets.size());
  for (const auto& [tenant, secret] : opt_.tenants) {
    if (!ValidName(tenant)) return Status::InvalidArgument("bad tenant name '" + tenant + "'");
    std::vector<const MtLink*> ls;
    for (size_t copy = 0; copy < targets.size(); ++copy) {
      auto& v = im.links[copy][tenant];
      for (int i = 0; i < std::max(1, opt_.connections); ++i) {
        MtLinkOptions lo;
        lo.link = opt_.mt_link;
        lo.link.peer = targets[copy];
        lo.link.tenant = tenant;
        lo.link.secret = secret;
        int pool = opt_.compress_threads > 0 ? opt_.compress_threads : int(std::thread::hardware_concurrency());
        lo.link.workers = std::max(1, pool / std::max(1, opt_.connections));
        lo.clock = opt_.clock;
        lo.throttle = throttle_.get();
        lo.tls = im.tls.get();
        lo.index = i;
        lo.copy = copy;
        lo.on_peer_request = [g = im.groups.get(), tenant](repl::ReplicationSender& from, proto::Message m) {
          // The links outlive the coordinator's relay thread (Stop).
          g->Relay(tenant, m, [&from](proto::Message answer) { (void)from.Send(answer); });
        };
        v.push_back(std::make_unique<MtLink>(lo));
      }
      for (const auto& l : v) ls.push_back(l.get());
    }
    if (opt_.registry) {
      // Over every MT: `connections` per MT are configured.
      opt_.registry->AddComputed("cdp_ps_mt_connections_up", "Connections to the master target(s) that are up",
                                 metrics::Type::kGauge, [ls] {
                                   double n = 0;
                                   for (const MtLink* l : ls) n += l->connected() ? 1 : 0;
                                   return n;
                                 }, metrics::Labels{{"tenant", tenant}});
      opt_.registry->AddComputed("cdp_ps_mt_connections", "Connections to the master target(s) configured",
                                 metrics::Type::kGauge, [n = double(ls.size())] { return n; },
                                 metrics::Labels{{"tenant", tenant}});
      // The stage costs of the tenant's streams to the MT(s), over its links.
      for (auto& sr : repl::RegisterShipStages(*opt_.registry, "cdp_ps", [ls] {
             repl::ShipStages sum;
             for (const MtLink* l : ls) sum += l->stages();
             return sum;
           }, metrics::Labels{{"tenant", tenant}}))
        im.series.push_back(std::move(sr));
      im.series.emplace_back("cdp_ps_mt_connections_up", metrics::Labels{{"tenant", tenant}});
      im.series.emplace_back("cdp_ps_mt_connections", metrics::Labels{{"tenant", tenant}});
    }
  }
  // Existing spools: ship their backlog.
  for (const auto& [tenant, secret] : opt_.tenants) {
    std::string tdir = JoinPath(opt_.spool_dir, tenant);
    if (!opt_.env->Exists(tdir)) continue;
    CDP_ASSIGN_OR_RETURN(std::vector<std::string> names, opt_.env->ListDir(tdir));
    for (const auto& name : names) {
      if (!ValidName(name) || IsRetiredSpoolName(name) ||
          !opt_.env->Exists(JoinPath(JoinPath(tdir, name), "volume.meta")))
        continue;  // a retired spool (re-protect) stays where it is, unshipped
      auto v = im.GetVolume(tenant, nullptr, name);
      if (!v.ok()) return v.status().WithContext("reopening spool " + tenant + "/" + name);
    }
  }
  for (auto& site : im.links)
    for (auto& [t, v] : site)
      for (auto& l : v) l->Start();
  im.cursor_flusher = std::thread([&im] { im.FlushCursors(); });

  // Agent listener.
  Listener::Options lo;
  lo.name = "ps-agents";
  lo.max_connections = opt_.connection_caps.total;
  lo.max_per_peer = opt_.connection_caps.per_peer;
  lo.tcp = opt_.listen;
  lo.mode = Listener::Mode::kThreadPerConnection;
  lo.registry = opt_.registry;
  StreamWrapper secure;
  if (im.tls) secure = TlsWrapper(im.tls.get(), TlsSide::kServer, std::chrono::milliseconds(10'000));
  im.receiver = im.MakeReceiver();
  im.listener = std::make_unique<Listener>(lo, ServeFrames([&im](FrameChannel& ch, Listener::Slot& slot) { im.receiver->Serve(ch, &slot); }, secure));
  CDP_RETURN_IF_ERROR(im.listener->Start());
  agent_port_ = im.listener->tcp_port();

  if (opt_.registry != nullptr)
    for (auto& sr : repl::RegisterReceiveStages(*opt_.registry, "cdp_ps", &im.receive_stages))
      im.series.push_back(std::move(sr));

  // Control server.
  if (!opt_.control.off()) CDP_RETURN_IF_ERROR(StartControl());
  if (opt_.registry != nullptr) {
    Throttle* th = throttle_.get();
    opt_.registry->AddComputed("cdp_ps_throttle_limit_mbps", "Throttle rate in force (0 = unlimited)",
                               metrics::Type::kGauge, [th] { return th->state().limit_mbps; });
    opt_.registry->AddComputed("cdp_ps_throttle_waiting", "1 when the last frame had to wait for the throttle",
                               metrics::Type::kGauge, [th] { return th->state().throttling ? 1.0 : 0.0; });
    opt_.registry->AddComputed("cdp_ps_throttle_wait_seconds_total", "Time frames waited for the throttle",
                               metrics::Type::kCounter, [th] { return double(th->state().waited_micros) / 1e6; });
    im.series.emplace_back("cdp_ps_throttle_limit_mbps", metrics::Labels{});
    im.series.emplace_back("cdp_ps_throttle_waiting", metrics::Labels{});
    im.series.emplace_back("cdp_ps_throttle_wait_seconds_total", metrics::Labels{});
  }
  std::string mts;
  for (const HostPort& t : targets) mts += (mts.empty() ? "" : ", ") + t.ToString();
  im.log->info("process server listening on {}:{} (agents), control port {}, master target(s) {} (copies {})",
               opt_.listen.host, agent_port_, control_port_, mts,
               opt_.copies > 0 ? std::to_string(opt_.copies) : "all");
  return Status::OK();
}

void ProcessServer::Impl::FlushCursors() {
  const auto period = std::chrono::milliseconds(std::max<uint64_t>(opt->cursor_sync_ms, 10));
  std::unique_lock<std::mutex> l(mu);
  while (!stopping.load()) {
    flusher_cv.wait_for(l, period, [&] { return stopping.load(); });
    if (stopping.load()) break;
    std::vector<SpooledVolume*> vols;
    for (auto& [k, v] : volumes) vols.push_back(v.get());
    l.unlock();  // volumes are never erased from the map while the server runs
    for (SpooledVolume* v : vols)
      if (Status s = v->PersistCursorsIfMoved(); !s.ok())
        log->warn("{} copy cursors not persisted: {}", log::Where{v->key(), "", 0}, s.ToString());
    l.lock();
  }
}

Status ProcessServer::ReloadTls() {
  if (!impl_ || !impl_->tls) return Status::OK();
  return impl_->tls->Reload();
}

void ProcessServer::Stop() {
  if (!impl_) return;
  Impl& im = *impl_;
  if (im.stopping.exchange(true)) return;
  if (im.http) im.http->Stop();
  if (im.listener) im.listener->Shutdown();  // agent connections see EOF and end
  for (auto& site : im.links)
    for (auto& [t, v] : site)
      for (auto& l : v) l->Stop();              // wakes sessions waiting on the master target
  if (im.listener) im.listener->Stop();       // joins the agent threads
  if (im.groups) im.groups->Stop();
  {
    std::lock_guard<std::mutex> l(im.mu);  // stopping was set: the flusher sees it under mu
  }
  im.flusher_cv.notify_all();
  if (im.cursor_flusher.joinable()) im.cursor_flusher.join();
  if (opt_.registry != nullptr)
    for (auto& [name, labels] : im.series) opt_.registry->RemoveSeries(name, labels);
  im.series.clear();
  std::lock_guard<std::mutex> l(im.mu);
  for (auto& [k, v] : im.volumes) v->Close();  // persists the copy cursors
  spool_lock_.reset();  // the spool is free for another server
}

Result<ProcessServer::ReprotectArm> ProcessServer::ArmReprotect(const std::string& tenant, const std::string& volume) {
  std::lock_guard<std::mutex> l(impl_->mu);
  SpooledVolume* v = nullptr;
  for (const auto& [key, vol] : impl_->volumes) {
    if (vol->name() != volume || (!tenant.empty() && vol->tenant() != tenant)) continue;
    if (v != nullptr) return Status::InvalidArgument("volume " + volume + " is in several tenants: name the tenant");
    v = vol.get();
  }
  if (v == nullptr) return Status::NotFound("no volume " + (tenant.empty() ? volume : tenant + "/" + volume));
  ReprotectArm a;
  a.tenant = v->tenant();
  a.generation = v->open_message().generation + 1;
  a.undelivered_records = v->NothingToDeliver() ? 0 : v->spool().stats().backlog_records;
  impl_->reprotect_armed[v->key()] = a.generation;
  impl_->log->warn("{} re-protect armed by the operator: generation {} replaces the spool once it has nothing left "
                   "to deliver ({} records now)",
                   log::Where{v->key(), "", v->spool().durable_seq()}, a.generation, a.undelivered_records);
  return a;
}

Result<uint64_t> ProcessServer::MtAckedSeq(const std::string& tenant, const std::string& volume) {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->volumes.find(tenant + "/" + volume);
  if (it == impl_->volumes.end()) return Status::NotFound("no volume " + tenant + "/" + volume);
  return it->second->counters().mt_acked.load();
}

Result<std::vector<CopyStatus>> ProcessServer::Copies(const std::string& tenant, const std::string& volume) {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->volumes.find(tenant + "/" + volume);
  if (it == impl_->volumes.end()) return Status::NotFound("no volume " + tenant + "/" + volume);
  return impl_->CopyStatuses(it->second.get());
}

}  // namespace cdp::ps
