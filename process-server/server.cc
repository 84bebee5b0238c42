#include "process-server/server.h"

#include <boost/json.hpp>

#include <functional>
#include <list>
#include <optional>
#include <variant>

#include "common/channel.h"
#include "common/listener.h"
#include "common/codec.h"
#include "common/http_server.h"
#include "common/log.h"
#include "common/metrics.h"
#include "process-server/mt_link.h"
#include "process-server/volume.h"

namespace cdp::ps {
namespace {

using Millis = std::chrono::milliseconds;
namespace json = boost::json;

bool RecordInVolume(const proto::Record& r, const proto::VolumeOpen& v) {
  switch (r.kind) {
    case proto::RecordKind::kData:
    case proto::RecordKind::kZero:
    case proto::RecordKind::kTrim:
      return r.length > 0 && r.offset <= v.size && r.length <= v.size - r.offset;
    case proto::RecordKind::kFlush:
    case proto::RecordKind::kTag:
      return true;
  }
  return false;
}

proto::Nack MakeNack(uint32_t id, proto::NackReason reason, uint64_t expected, std::string msg) {
  proto::Nack n;
  n.volume_id = id;
  n.reason = reason;
  n.expected_seq = expected;
  n.message = std::move(msg);
  return n;
}

}  // namespace

struct ProcessServer::Impl {
  ProcessServer* self = nullptr;
  ProcessServerOptions* opt = nullptr;
  std::shared_ptr<spdlog::logger> log = log::Get("ps");

  std::mutex mu;
  std::map<std::string, std::unique_ptr<Volume>> volumes;           // "tenant/volume"
  std::map<std::string, std::vector<std::unique_ptr<MtLink>>> links;  // tenant -> links
  std::vector<std::pair<std::string, metrics::Labels>> series;       // registered computed metrics

  std::unique_ptr<Listener> listener;  // agents, one thread each

  std::atomic<bool> stopping{false};

  std::unique_ptr<http::Server> http;

  MtLink* LinkFor(const std::string& tenant, const std::string& volume) {
    auto it = links.find(tenant);
    if (it == links.end() || it->second.empty()) return nullptr;
    auto& v = it->second;
    size_t h = std::hash<std::string>{}(volume);
    return v[h % v.size()].get();
  }

  std::pair<proto::Codec, int> CodecFor(const std::string& key) {
    auto it = opt->volume_codecs.find(key);
    if (it != opt->volume_codecs.end()) return it->second;
    return {opt->codec, opt->level};
  }

  SpoolOptions SpoolOpts(const std::string& tenant, const std::string& volume) {
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

  void RegisterMetrics(Volume* v) {
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
  }

  // Opens or finds the volume; ok also for a reopen by the agent.
  Result<Volume*> GetVolume(const std::string& tenant, const proto::VolumeOpen* open, const std::string& name) {
    std::string key = tenant + "/" + name;
    std::lock_guard<std::mutex> l(mu);
    auto it = volumes.find(key);
    if (it != volumes.end()) {
      if (open != nullptr && open->generation != it->second->open_message().generation)
        return Status::InvalidArgument("wrong generation: spool has " +
                                       std::to_string(it->second->open_message().generation) + ", agent sent " +
                                       std::to_string(open->generation));
      return it->second.get();
    }
    auto [codec, level] = CodecFor(key);
    CDP_ASSIGN_OR_RETURN(std::unique_ptr<Volume> v, Volume::Open(SpoolOpts(tenant, name), tenant, open, codec, level));
    Volume* raw = v.get();
    volumes[key] = std::move(v);
    RegisterMetrics(raw);
    if (MtLink* link = LinkFor(tenant, name)) link->AddVolume(raw);
    SpoolStats st = raw->spool().stats();
    log->info("{} spool open: durable {}, backlog {} records / {} bytes", log::Where{key, "", st.durable_seq},
              st.durable_seq, st.backlog_records, st.backlog_bytes);
    return raw;
  }

  template <typename M>
  static Status Reply(FrameChannel& ch, int replies, const M& msg) {
    for (int i = 0; i < replies; ++i) CDP_RETURN_IF_ERROR(ch.Send(msg));
    return Status::OK();
  }

  // One agent connection, start to end.
  void Serve(FrameChannel& ch) {
    PeerIdentity peer;
    auto tenant_r = ServerHandshake(
        ch,
        [this](const std::string& t) -> std::optional<std::string> {
          auto it = opt->tenants.find(t);
          if (it == opt->tenants.end()) return std::nullopt;
          return it->second;
        },
        Millis(10000), &peer);
    if (!tenant_r.ok()) {
      log->warn("peer={} handshake failed: {}", ch.peer(), tenant_r.status().ToString());
      return;
    }
    std::string tenant = *tenant_r;
    if (peer.role != proto::Role::kAgent) {
      log->warn("peer={} tenant={} refused: role {} is not an agent", ch.peer(), tenant, int(peer.role));
      return;
    }
    log->info("peer={} tenant={} agent {} connected", ch.peer(), tenant, peer.client_id);
    std::map<uint32_t, Volume*> handles;
    uint32_t next_id = 1;
    std::optional<proto::Message> carry;  // received while coalescing, handled next
    Status pending;                       // a receive error met while coalescing
    while (!stopping.load()) {
      proto::Message msg;
      if (carry) {
        msg = std::move(*carry);
        carry.reset();
      } else {
        if (!pending.ok()) {
          log->warn("peer={} tenant={} closing connection: {}", ch.peer(), tenant, pending.ToString());
          return;
        }
        auto m = ch.Receive(Millis(1000));
        if (!m.ok()) {
          if (m.status().IsBusy() && !ch.broken()) continue;
          if (m.status().code() == Code::kUnavailable || stopping.load())
            log->info("peer={} tenant={} agent disconnected: {}", ch.peer(), tenant, m.status().ToString());
          else
            log->warn("peer={} tenant={} closing connection: {}", ch.peer(), tenant, m.status().ToString());
          return;
        }
        msg = std::move(*m);
      }
      int replies = 1;
      if (auto* b = std::get_if<proto::WriteBatch>(&msg)) {
        // Batches the agent pipelined and that are already here, contiguous
        // with this one, go into the same spool append (one fdatasync); each
        // still gets its own reply.
        uint64_t bytes = 0;
        for (const auto& r : b->records) bytes += r.data.size();
        while (replies < 64 && !b->records.empty() && bytes < (32u << 20)) {
          auto r = ch.Receive(Millis(0));
          if (!r.ok()) {
            if (!r.status().IsBusy() || ch.broken()) pending = r.status();
            break;
          }
          auto* nb = std::get_if<proto::WriteBatch>(&*r);
          if (nb == nullptr || nb->volume_id != b->volume_id || nb->records.empty() ||
              nb->records.front().seq != b->records.back().seq + 1 ||
              b->records.size() + nb->records.size() > proto::kMaxRecords) {
            carry = std::move(*r);
            break;
          }
          for (auto& rec : nb->records) {
            bytes += rec.data.size();
            b->records.push_back(std::move(rec));
          }
          replies++;
        }
      }
      Status s = Handle(ch, tenant, handles, next_id, msg, replies);
      if (!s.ok()) {
        log->warn("peer={} tenant={} closing connection: {}", ch.peer(), tenant, s.ToString());
        return;
      }
    }
  }

  // Handles one message; a WriteBatch that holds `replies` coalesced agent
  // batches is answered `replies` times (each reply is cumulative).
  Status Handle(FrameChannel& ch, const std::string& tenant, std::map<uint32_t, Volume*>& handles,
                uint32_t& next_id, proto::Message& m, int replies = 1) {
    if (auto* o = std::get_if<proto::VolumeOpen>(&m)) {
      if (!proto::ValidName(o->name)) return ch.Send(MakeNack(0, proto::NackReason::kBadRecord, 0, "invalid volume name"));
      auto v = GetVolume(tenant, o, o->name);
      if (!v.ok()) {
        proto::NackReason reason = v.status().message().rfind("wrong generation", 0) == 0
                                       ? proto::NackReason::kWrongGeneration
                                       : proto::NackReason::kInternal;
        log->error("{} open failed: {}", log::Where{tenant + "/" + o->name, ch.peer(), 0}, v.status().ToString());
        return ch.Send(MakeNack(0, reason, 0, v.status().message()));
      }
      Volume* vol = *v;
      uint64_t durable = vol->spool().durable_seq();
      if (MtLink* link = LinkFor(tenant, o->name)) {
        auto mt = link->WaitOpened(vol, Millis(opt->mt_open_wait_ms));
        if (mt.ok() && *mt > durable) {
          vol->spool().SetFloor(*mt);
          durable = vol->spool().durable_seq();
        } else if (!mt.ok()) {
          log->warn("{} master target: {}; answering with the spool's durable seq",
                    log::Where{vol->key(), ch.peer(), durable}, mt.status().ToString());
        }
      }
      uint32_t id = next_id++;
      handles[id] = vol;
      proto::VolumeOpenReply r;
      r.volume_id = id;
      r.durable_seq = durable;
      log->info("{} opened by agent, volume_id {}, durable {}", log::Where{vol->key(), ch.peer(), durable}, id, durable);
      return ch.Send(r);
    }
    if (auto* b = std::get_if<proto::WriteBatch>(&m)) {
      auto it = handles.find(b->volume_id);
      if (it == handles.end())
        return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kUnknownVolume, 0, "volume not open on this connection"));
      Volume* v = it->second;
      for (const auto& r : b->records) {
        if (!RecordInVolume(r, v->open_message()))
          return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kBadRecord, 0,
                                  "record seq " + std::to_string(r.seq) + " outside the volume"));
      }
      uint64_t bytes = 0;  // of records that are not duplicates
      uint64_t before = v->spool().durable_seq();
      for (const auto& r : b->records)
        if (r.seq > before) bytes += r.data.size();
      AppendResult ar = v->spool().Append(std::move(b->records));
      if (ar.status.ok()) {
        VolumeCounters& c = v->counters();
        if (ar.appended > 0) {
          c.bytes_in.fetch_add(bytes);
          c.records_in.fetch_add(ar.appended);
          c.batches_in.fetch_add(uint64_t(replies));
          if (MtLink* link = LinkFor(tenant, v->name())) link->Notify();
        }
        proto::Ack a;
        a.volume_id = b->volume_id;
        a.durable_seq = ar.durable_seq;
        return Reply(ch, replies, a);
      }
      switch (ar.status.code()) {
        case Code::kBusy:
          v->counters().busy_nacks.fetch_add(uint64_t(replies));
          return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kBusy, ar.expected_seq, ar.status.message()));
        case Code::kOutOfRange:
          return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kGap, ar.expected_seq, ar.status.message()));
        case Code::kInvalidArgument:
          return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kBadRecord, ar.expected_seq, ar.status.message()));
        default:
          log->error("{} spool append failed: {}", log::Where{v->key(), ch.peer(), ar.expected_seq},
                     ar.status.ToString());
          return Reply(ch, replies, MakeNack(b->volume_id, proto::NackReason::kInternal, ar.expected_seq, ar.status.message()));
      }
    }
    if (auto* h = std::get_if<proto::HashRequest>(&m)) {
      auto it = handles.find(h->volume_id);
      if (it == handles.end())
        return ch.Send(MakeNack(h->volume_id, proto::NackReason::kUnknownVolume, 0, "volume not open on this connection"));
      MtLink* link = LinkFor(tenant, it->second->name());
      if (link == nullptr)
        return ch.Send(MakeNack(h->volume_id, proto::NackReason::kInternal, 0, "master target unavailable"));
      auto r = link->Hash(it->second, *h, Millis(opt->hash_timeout_ms));
      if (!r.ok())
        return ch.Send(MakeNack(h->volume_id, proto::NackReason::kInternal, 0,
                                "master target unavailable: " + r.status().message()));
      r->volume_id = h->volume_id;
      r->request_id = h->request_id;
      return ch.Send(*r);
    }
    if (auto* hb = std::get_if<proto::Heartbeat>(&m)) {
      if (hb->echo_us != 0) return Status::OK();
      proto::Heartbeat reply;
      reply.sent_us = opt->clock->WallMicros();
      reply.echo_us = hb->sent_us;
      return ch.Send(reply);
    }
    if (std::holds_alternative<proto::Stats>(m)) return Status::OK();
    return Status::InvalidArgument("unexpected message type " + std::to_string(int(proto::TypeOf(m))) +
                                   " from an agent");
  }
};

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
  // MT links per tenant.
  for (const auto& [tenant, secret] : opt_.tenants) {
    if (!proto::ValidName(tenant)) return Status::InvalidArgument("bad tenant name '" + tenant + "'");
    auto& v = im.links[tenant];
    for (int i = 0; i < std::max(1, opt_.connections); ++i) {
      MtLinkOptions lo;
      lo.clock = opt_.clock;
      lo.throttle = throttle_.get();
      lo.host = opt_.mt_host;
      lo.port = opt_.mt_port;
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
  }
  // Existing spools: ship their backlog.
  for (const auto& [tenant, secret] : opt_.tenants) {
    std::string tdir = JoinPath(opt_.spool_dir, tenant);
    if (!opt_.env->Exists(tdir)) continue;
    CDP_ASSIGN_OR_RETURN(std::vector<std::string> names, opt_.env->ListDir(tdir));
    for (const auto& name : names) {
      if (!proto::ValidName(name) || !opt_.env->Exists(JoinPath(JoinPath(tdir, name), "volume.meta"))) continue;
      auto v = im.GetVolume(tenant, nullptr, name);
      if (!v.ok()) return v.status().WithContext("reopening spool " + tenant + "/" + name);
    }
  }
  for (auto& [t, v] : im.links)
    for (auto& l : v) l->Start();

  // Agent listener.
  Listener::Options lo;
  lo.name = "ps-agents";
  lo.tcp_host = opt_.listen_host;
  lo.tcp_port = opt_.listen_port;
  lo.mode = Listener::Mode::kThreadPerConnection;
  lo.registry = opt_.registry;
  im.listener = std::make_unique<Listener>(lo, ServeFrames([&im](FrameChannel& ch) { im.Serve(ch); }));
  CDP_RETURN_IF_ERROR(im.listener->Start());
  agent_port_ = im.listener->tcp_port();

  // Control server.
  if (opt_.control_enabled) {
    http::ServerOptions ho;
    ho.host = opt_.control_host;
    ho.port = opt_.control_port;
    ho.registry = opt_.registry;
    ho.status = [this] { return StatusJson(); };
    im.http = std::make_unique<http::Server>(ho);
    im.http->Route("GET", "/v1/volumes", [this](const http::Request&) {
      return http::Response::Json(200, VolumesJson());
    });
    im.http->Route("GET", "/v1/throttle", [this](const http::Request&) {
      ThrottleState s = throttle_->state();
      return http::Response::Json(200, json::object{{"limit_mbps", s.limit_mbps},
                                                    {"throttling", s.throttling},
                                                    {"bytes", s.reserved_bytes},
                                                    {"waited_seconds", double(s.waited_micros) / 1e6}});
    });
    im.http->Route("POST", "/v1/throttle", [this](const http::Request& r) {
      boost::system::error_code jec;
      json::value body = json::parse(r.body, jec);
      if (jec || !body.is_object()) return http::Response::Error(400, "body must be a JSON object");
      ThrottleOptions t = opt_.throttle;
      const json::object& o = body.as_object();
      if (auto* m = o.if_contains("mbps")) {
        if (!m->is_number() || m->to_number<double>() < 0) return http::Response::Error(400, "mbps must be >= 0");
        t.default_mbps = m->to_number<double>();
      }
      if (auto* sc = o.if_contains("schedule")) {
        if (!sc->is_string()) return http::Response::Error(400, "schedule must be a string");
        auto parsed = ParseSchedule(std::string(sc->as_string()));
        if (!parsed.ok()) return http::Response::Error(400, parsed.status().message());
        t.schedule = *parsed;
      }
      throttle_->Reconfigure(t);
      opt_.throttle = t;
      return http::Response::Json(200, json::object{{"limit_mbps", throttle_->CurrentMbps()}});
    });
    CDP_RETURN_IF_ERROR(im.http->Start());
    control_port_ = im.http->port();
  }
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
  im.log->info("process server listening on {}:{} (agents), control port {}, master target {}:{}", opt_.listen_host,
               agent_port_, control_port_, opt_.mt_host, opt_.mt_port);
  return Status::OK();
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

json::value ProcessServer::VolumesJson() {
  Impl& im = *impl_;
  json::array arr;
  std::lock_guard<std::mutex> l(im.mu);
  uint64_t now = opt_.clock->WallMicros();
  for (auto& [key, v] : im.volumes) {
    SpoolStats s = v->spool().stats();
    VolumeCounters& c = v->counters();
    MtLink* link = im.LinkFor(v->tenant(), v->name());
    uint64_t wire = c.wire_out.load(), raw = c.raw_out.load();
    json::object o{
        {"tenant", v->tenant()},
        {"volume", v->name()},
        {"codec", std::string(CodecName(v->codec()))},
        {"level", v->level()},
        {"spool_durable_seq", s.durable_seq},
        {"mt_acked_seq", c.mt_acked.load()},
        {"backlog_bytes", s.backlog_bytes},
        {"backlog_records", s.backlog_records},
        {"oldest_record_age_seconds",
         s.oldest_timestamp_us && s.oldest_timestamp_us < now ? double(now - s.oldest_timestamp_us) / 1e6 : 0.0},
        {"spool_disk_bytes", s.disk_bytes},
        {"spool_segments", s.segments},
        {"spool_syncs", s.syncs},
        {"busy", s.busy},
        {"busy_nacks", c.busy_nacks.load()},
        {"bytes_in", c.bytes_in.load()},
        {"records_in", c.records_in.load()},
        {"bytes_out", wire},
        {"raw_bytes_out", raw},
        {"compression_ratio", wire ? double(raw) / double(wire) : 0.0},
        {"frames_out", c.frames_out.load()},
        {"resent_frames", c.resent_frames.load()},
        {"corruptions", c.corruptions.load()},
        {"link", link ? link->state() : std::string("none")},
        {"stalled", v->stalled()},
    };
    arr.push_back(std::move(o));
  }
  return json::object{{"volumes", std::move(arr)}};
}

json::value ProcessServer::StatusJson() {
  ThrottleState t = throttle_->state();
  json::value vols = VolumesJson();
  json::object o;
  o["daemon"] = "cdp-process-server";
  o["agent_port"] = agent_port_;
  o["master_target"] = opt_.mt_host + ":" + std::to_string(opt_.mt_port);
  json::object th;
  th["limit_mbps"] = t.limit_mbps;
  th["throttling"] = t.throttling;
  o["throttle"] = std::move(th);
  o["volumes"] = std::move(vols.as_object()["volumes"]);
  return o;
}

}  // namespace cdp::ps
