#include "process-server/process_server.h"

#include <boost/json.hpp>

#include "common/codec.h"
#include "process-server/ps_control_api.h"
#include "process-server/process_server_impl.h"

namespace cdp::ps {

namespace json = boost::json;

MtLink* ProcessServer::Impl::LinkFor(const std::string& tenant, const std::string& volume) {
  auto it = links.find(tenant);
  if (it == links.end() || it->second.empty()) return nullptr;
  auto& v = it->second;
  size_t h = std::hash<std::string>{}(volume);
  return v[h % v.size()].get();
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
    // over, or failed back and not yet re-protected). Anything else is refused.
    if (open->generation < have || fence.empty())
      return Status::InvalidArgument("wrong generation: spool has " + std::to_string(have) + ", agent sent " +
                                     std::to_string(open->generation));
    CDP_RETURN_IF_ERROR(RetireSpoolLocked(key, fence));
  }
  auto [codec, level] = CodecFor(key);
  CDP_ASSIGN_OR_RETURN(std::unique_ptr<SpooledVolume> v, SpooledVolume::Open(SpoolOpts(tenant, name), tenant, open, codec, level));
  SpooledVolume* raw = v.get();
  volumes[key] = std::move(v);
  RegisterMetrics(raw);
  if (MtLink* link = LinkFor(tenant, name)) link->AddVolume(raw);
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
  if (MtLink* link = LinkFor(v->tenant(), v->name())) link->RemoveVolume(v);
  v->spool().Close();
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
  log->warn("{} re-protect: the agent opened a newer generation while generation {} is fenced by the master target "
            "({}); its spool ({} records never delivered, up to seq {}) is retired to {}; nothing was deleted, the "
            "operator may delete that directory",
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
  if (opt_.clock == nullptr) opt_.clock = SystemClock::Get();
  throttle_ = std::make_unique<Throttle>(opt_.clock, opt_.throttle);
  impl_ = std::make_unique<Impl>();
  impl_->self = this;
  impl_->opt = &opt_;
}

ProcessServer::~ProcessServer() { Stop(); }

Status ProcessServer::Start() {
  Impl& im = *impl_;
  if (opt_.tls.enabled) {
    CDP_ASSIGN_OR_RETURN(im.tls, TlsCredentials::Load(TlsFiles{opt_.tls.ca, opt_.tls.cert, opt_.tls.key}));
    const TlsPeer& self = im.tls->Current()->self();
    im.log->info("TLS on: certificate '{}' (role {}, tenant {})", self.name, self.role, self.tenant);
  } else {
    im.log->warn("tls = off: agents and the master target are reached in clear text; blocks cross the network unencrypted");
  }
  // MT links per tenant.
  for (const auto& [tenant, secret] : opt_.tenants) {
    if (!proto::ValidName(tenant)) return Status::InvalidArgument("bad tenant name '" + tenant + "'");
    auto& v = im.links[tenant];
    for (int i = 0; i < std::max(1, opt_.connections); ++i) {
      MtLinkOptions lo;
      lo.clock = opt_.clock;
      lo.throttle = throttle_.get();
      lo.tls = im.tls.get();
      lo.host = opt_.mt.host;
      lo.port = opt_.mt.port;
      lo.tenant = tenant;
      lo.secret = secret;
      lo.client_id = opt_.client_id;
      lo.index = i;
      lo.frame_bytes = opt_.frame_bytes;
      lo.max_inflight = opt_.max_inflight;
      int pool = opt_.compress_threads > 0 ? opt_.compress_threads : int(std::thread::hardware_concurrency());
      lo.workers = std::max(1, pool / std::max(1, opt_.connections));
      lo.backoff_min_ms = opt_.backoff_min_ms;
      lo.backoff_max_ms = opt_.backoff_max_ms;
      lo.ack_timeout_ms = opt_.ack_timeout_ms;
      v.push_back(std::make_unique<MtLink>(lo));
    }
    if (opt_.registry) {
      std::vector<const MtLink*> ls;
      for (const auto& l : v) ls.push_back(l.get());
      opt_.registry->AddComputed("cdp_ps_mt_connections_up", "Connections to the master target that are up",
                                 metrics::Type::kGauge, [ls] {
                                   double n = 0;
                                   for (const MtLink* l : ls) n += l->connected() ? 1 : 0;
                                   return n;
                                 }, metrics::Labels{{"tenant", tenant}});
      opt_.registry->AddComputed("cdp_ps_mt_connections", "Connections to the master target configured",
                                 metrics::Type::kGauge, [n = double(ls.size())] { return n; },
                                 metrics::Labels{{"tenant", tenant}});
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
      if (!proto::ValidName(name) || IsRetiredSpoolName(name) ||
          !opt_.env->Exists(JoinPath(JoinPath(tdir, name), "volume.meta")))
        continue;  // a retired spool (re-protect) stays where it is, unshipped
      auto v = im.GetVolume(tenant, nullptr, name);
      if (!v.ok()) return v.status().WithContext("reopening spool " + tenant + "/" + name);
    }
  }
  for (auto& [t, v] : im.links)
    for (auto& l : v) l->Start();

  // Agent listener.
  Listener::Options lo;
  lo.name = "ps-agents";
  lo.max_connections = opt_.connection_caps.total;
  lo.max_per_peer = opt_.connection_caps.per_peer;
  lo.tcp_host = opt_.listen.host;
  lo.tcp_port = opt_.listen.port;
  lo.mode = Listener::Mode::kThreadPerConnection;
  lo.registry = opt_.registry;
  StreamWrapper secure;
  if (im.tls) secure = TlsWrapper(im.tls.get(), TlsSide::kServer, std::chrono::milliseconds(10'000));
  im.listener = std::make_unique<Listener>(lo, ServeFrames([&im](FrameChannel& ch) { im.Serve(ch); }, secure));
  CDP_RETURN_IF_ERROR(im.listener->Start());
  agent_port_ = im.listener->tcp_port();

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
  im.log->info("process server listening on {}:{} (agents), control port {}, master target {}:{}", opt_.listen.host,
               agent_port_, control_port_, opt_.mt.host, opt_.mt.port);
  return Status::OK();
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
  for (auto& [t, v] : im.links)
    for (auto& l : v) l->Stop();                // wakes sessions waiting on the master target
  if (im.listener) im.listener->Stop();       // joins the agent threads
  if (opt_.registry != nullptr)
    for (auto& [name, labels] : im.series) opt_.registry->RemoveSeries(name, labels);
  im.series.clear();
  std::lock_guard<std::mutex> l(im.mu);
  for (auto& [k, v] : im.volumes) v->spool().Close();
}

Result<uint64_t> ProcessServer::MtAckedSeq(const std::string& tenant, const std::string& volume) {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->volumes.find(tenant + "/" + volume);
  if (it == impl_->volumes.end()) return Status::NotFound("no volume " + tenant + "/" + volume);
  return it->second->counters().mt_acked.load();
}

}  // namespace cdp::ps
