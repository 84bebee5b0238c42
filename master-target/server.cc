#include "master-target/server.h"

#include <boost/asio.hpp>
#include <boost/json.hpp>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <list>

#include "common/channel.h"
#include "common/listener.h"
#include "common/hash.h"
#include "common/http_server.h"
#include "common/log.h"
#include "common/nbd_server.h"
#include "master-target/export.h"

namespace cdp::mt {

namespace asio = boost::asio;
namespace json = boost::json;
using asio::ip::tcp;

std::string VolumeDir(const std::string& data_dir, const std::string& tenant, const std::string& volume) {
  if (!proto::ValidName(tenant) || !proto::ValidName(volume)) return "";
  return JoinPath(JoinPath(JoinPath(JoinPath(data_dir, "tenants"), tenant), "volumes"), volume);
}

namespace {

int HttpStatusOf(const Status& s) {
  switch (s.code()) {
    case Code::kNotFound: return 404;
    case Code::kInvalidArgument:
    case Code::kOutOfRange: return 400;
    case Code::kBusy:
    case Code::kAlreadyExists: return 409;
    case Code::kPermissionDenied: return 403;
    default: return 500;
  }
}

json::object PointJson(const RecoveryPoint& p) {
  return json::object{{"id", p.id},
                      {"seq", p.seq},
                      {"time_us", p.time_us},
                      {"kind", PointKindName(p.kind)},
                      {"name", p.name}};
}

}  // namespace

struct VolEntry {
  std::string tenant, name;
  std::shared_ptr<Volume> volume;
};

struct ExportEntry {
  std::string tenant, volume;
  uint64_t seq = 0;
  bool writable = false;
  std::shared_ptr<PointInTimeDevice> device;
};

struct MasterTarget::Impl {
  explicit Impl(MasterTarget* owner) : mt(owner), o(owner->o_), log(log::Get("mt")) {}

  MasterTarget* mt;
  MasterTargetOptions& o;
  std::shared_ptr<spdlog::logger> log;

  std::mutex vol_mu;
  std::map<std::string, std::shared_ptr<VolEntry>> volumes;  // "tenant/name"

  std::unique_ptr<Listener> listener;  // process servers, one thread each
  std::atomic<bool> stopping{false};

  std::unique_ptr<http::Server> http;
  std::unique_ptr<NbdServer> nbd;
  std::mutex export_mu;
  std::map<std::string, ExportEntry> exports;
  uint64_t export_counter = 0;

  std::mutex ret_mu;
  std::condition_variable ret_cv;
  std::thread retention_thread;

  std::shared_ptr<metrics::Gauge> connections;
  std::shared_ptr<metrics::Counter> nacks;

  static std::string Key(const std::string& t, const std::string& n) { return t + "/" + n; }

  uint64_t Quota(const std::string& tenant) const {
    auto it = o.tenant_quota_bytes.find(tenant);
    return it == o.tenant_quota_bytes.end() ? 0 : it->second;
  }
  // Bytes a tenant uses: its volumes' sizes plus their journals. vol_mu held.
  uint64_t UsageLocked(const std::string& tenant) {
    uint64_t used = 0;
    for (auto& [k, e] : volumes) {
      if (e->tenant != tenant) continue;
      VolumeStatus st = e->volume->GetStatus();
      used += st.identity.size + st.journal_bytes;
    }
    return used;
  }
  bool OverQuota(const std::string& tenant) {
    uint64_t q = Quota(tenant);
    if (q == 0) return false;
    std::lock_guard<std::mutex> lk(vol_mu);
    return UsageLocked(tenant) > q;
  }

  VolumeOptions VolOpts(const std::string& tenant, const std::string& name) {
    VolumeOptions vo;
    vo.env = o.env;
    vo.clock = o.clock;
    vo.dir = VolumeDir(o.data_dir, tenant, name);
    vo.index_path = JoinPath(vo.dir, "index.db");
    vo.segment_bytes = o.segment_bytes;
    vo.point_interval_us = o.point_interval_us;
    vo.retention = o.retention;
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
    return vo;
  }

  Status LoadVolumes() {
    for (const auto& [tenant, secret] : o.tenants) {
      std::string vdir = JoinPath(JoinPath(JoinPath(o.data_dir, "tenants"), tenant), "volumes");
      CDP_RETURN_IF_ERROR(o.env->CreateDirs(vdir));
      // Overlays of writable exports do not survive a restart.
      std::string xdir = JoinPath(JoinPath(JoinPath(o.data_dir, "tenants"), tenant), "exports");
      CDP_RETURN_IF_ERROR(o.env->CreateDirs(xdir));
      CDP_ASSIGN_OR_RETURN(auto stale, o.env->ListDir(xdir));
      for (const auto& n : stale) {
        if (n.size() > 4 && n.compare(n.size() - 4, 4, ".cow") == 0) CDP_RETURN_IF_ERROR(o.env->Remove(JoinPath(xdir, n)));
      }
      CDP_ASSIGN_OR_RETURN(auto names, o.env->ListDir(vdir));
      for (const auto& n : names) {
        if (!proto::ValidName(n) || !o.env->Exists(JoinPath(JoinPath(vdir, n), "index.db"))) continue;
        auto v = Volume::Open(VolOpts(tenant, n), nullptr);
        if (!v.ok()) {
          log->error("{} cannot open volume: {}", log::Where{n, tenant, 0}, v.status().ToString());
          continue;
        }
        auto e = std::make_shared<VolEntry>();
        e->tenant = tenant;
        e->name = n;
        e->volume = std::shared_ptr<Volume>(std::move(*v));
        log->info("{} opened: applied seq {}, {} points", log::Where{n, tenant, e->volume->applied_seq()},
                  e->volume->applied_seq(), e->volume->ListPoints().size());
        volumes[Key(tenant, n)] = e;
      }
    }
    return Status::OK();
  }

  // VolumeOpen: find or create, then check identity.
  Result<std::pair<std::shared_ptr<VolEntry>, ApplyOutcome>> OpenVolume(const std::string& tenant,
                                                                         const proto::VolumeOpen& m) {
    VolumeIdentity id;
    id.name = m.name;
    id.size = m.size;
    id.block_size = m.block_size;
    id.uuid = m.uuid;
    id.generation = m.generation;
    std::shared_ptr<VolEntry> e;
    {
      std::lock_guard<std::mutex> lk(vol_mu);
      auto it = volumes.find(Key(tenant, m.name));
      if (it != volumes.end()) {
        e = it->second;
      } else {
        std::string dir = VolumeDir(o.data_dir, tenant, m.name);
        if (dir.empty()) {
          ApplyOutcome bad;
          bad.ack = false;
          bad.reason = proto::NackReason::kBadRecord;
          bad.message = "bad volume name";
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
        CDP_RETURN_IF_ERROR(o.env->CreateDirs(dir));
        auto v = Volume::Open(VolOpts(tenant, m.name), &id);
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
        e->volume = std::shared_ptr<Volume>(std::move(*v));
        volumes[Key(tenant, m.name)] = e;
        log->info("{} created: {} bytes, block size {}", log::Where{m.name, tenant, 0}, m.size, m.block_size);
      }
    }
    CDP_ASSIGN_OR_RETURN(ApplyOutcome out, e->volume->CheckOpen(id));
    return std::make_pair(e, out);
  }

  // One process-server connection, start to end (its own thread: the Listener's).
  void Serve(FrameChannel& ch) {
    const std::string peer_addr = ch.peer();
    PeerIdentity peer;
    auto tenant = ServerHandshake(
        ch,
        [this](const std::string& t) -> std::optional<std::string> {
          auto it = o.tenants.find(t);
          if (it == o.tenants.end()) return std::nullopt;
          return it->second;
        },
        std::chrono::milliseconds(o.handshake_timeout_ms), &peer);
    if (!tenant.ok()) {
      log->warn("{} handshake failed: {}", log::Where{"", peer_addr, 0}, tenant.status().ToString());
      return;
    }
    if (peer.role != proto::Role::kProcessServer && peer.role != proto::Role::kAgent) {
      log->warn("{} refused role {}", log::Where{"", peer_addr, 0}, int(peer.role));
      return;
    }
    connections->Add(1);
    log->info("{} tenant {} connected ({})", log::Where{"", peer_addr, 0}, *tenant, peer.client_id);
    std::map<uint32_t, std::shared_ptr<VolEntry>> handles;
    uint32_t next_id = 1;
    auto nack = [&](uint32_t vid, proto::NackReason r, std::string msg, uint64_t expected = 0) {
      nacks->Inc();
      proto::Nack n;
      n.volume_id = vid;
      n.reason = r;
      n.expected_seq = expected;
      n.message = std::move(msg);
      return ch.Send(n);
    };
    while (!stopping.load()) {
      auto m = ch.Receive(std::chrono::milliseconds(500));
      if (!m.ok()) {
        if (m.status().IsBusy()) continue;
        if (!stopping.load())
          log->info("{} connection ended: {}", log::Where{"", peer_addr, 0}, m.status().ToString());
        break;
      }
      Status s;
      if (auto* vo = std::get_if<proto::VolumeOpen>(&*m)) {
        auto r = OpenVolume(*tenant, *vo);
        if (!r.ok()) {
          log->error("{} volume open failed: {}", log::Where{vo->name, peer_addr, 0}, r.status().ToString());
          s = nack(0, proto::NackReason::kInternal, r.status().ToString());
        } else if (!r->second.ack) {
          log->warn("{} volume open refused: {}", log::Where{vo->name, peer_addr, 0}, r->second.message);
          s = nack(0, r->second.reason, r->second.message);
        } else {
          uint32_t vid = next_id++;
          handles[vid] = r->first;
          s = ch.Send(proto::VolumeOpenReply{vid, r->second.durable_seq});
        }
      } else if (auto* wb = std::get_if<proto::WriteBatch>(&*m)) {
        auto it = handles.find(wb->volume_id);
        if (it == handles.end()) {
          s = nack(wb->volume_id, proto::NackReason::kUnknownVolume, "unknown volume id");
        } else if (OverQuota(*tenant) && !wb->records.empty() &&
                   wb->records.back().seq > it->second->volume->applied_seq()) {
          s = nack(wb->volume_id, proto::NackReason::kBusy, "tenant quota exceeded; retry after retention",
                   it->second->volume->applied_seq() + 1);
        } else {
          auto r = it->second->volume->ApplyBatch(wb->records);
          uint64_t first = wb->records.empty() ? 0 : wb->records.front().seq;
          if (!r.ok()) {
            s = nack(wb->volume_id, proto::NackReason::kInternal, r.status().ToString());
          } else if (!r->ack) {
            log->warn("{} batch refused: {}", log::Where{it->second->name, peer_addr, first}, r->message);
            s = nack(wb->volume_id, r->reason, r->message, r->expected_seq);
          } else {
            s = ch.Send(proto::Ack{wb->volume_id, r->durable_seq});
          }
        }
      } else if (auto* hr = std::get_if<proto::HashRequest>(&*m)) {
        auto it = handles.find(hr->volume_id);
        if (it == handles.end()) {
          s = nack(hr->volume_id, proto::NackReason::kUnknownVolume, "unknown volume id");
        } else {
          auto r = it->second->volume->RegionHashes(hr->region_size, hr->first_region, hr->count);
          if (!r.ok()) {
            s = nack(hr->volume_id, proto::NackReason::kBadRecord, r.status().ToString());
          } else {
            proto::HashResponse resp;
            resp.volume_id = hr->volume_id;
            resp.request_id = hr->request_id;
            resp.region_size = hr->region_size;
            resp.first_region = hr->first_region;
            resp.hashes = std::move(*r);
            s = ch.Send(resp);
          }
        }
      } else if (auto* hb = std::get_if<proto::Heartbeat>(&*m)) {
        if (hb->echo_us == 0) s = ch.Send(proto::Heartbeat{o.clock->WallMicros(), hb->sent_us});
      } else if (std::holds_alternative<proto::Stats>(*m)) {
        // Counters from the peer are not used by the master target.
      } else {
        log->warn("{} unexpected message type {}; closing", log::Where{"", peer_addr, 0}, int(proto::TypeOf(*m)));
        break;
      }
      if (!s.ok()) {
        log->info("{} send failed: {}", log::Where{"", peer_addr, 0}, s.ToString());
        break;
      }
    }
    connections->Add(-1);
  }

  void RetentionLoop() {
    std::unique_lock<std::mutex> lk(ret_mu);
    while (!stopping.load()) {
      ret_cv.wait_for(lk, std::chrono::microseconds(o.retention_check_us), [this] { return stopping.load(); });
      if (stopping.load()) break;
      lk.unlock();
      RunRetention();
      lk.lock();
    }
  }

  json::array RunRetention() {
    json::array out;
    std::vector<std::shared_ptr<VolEntry>> vs;
    {
      std::lock_guard<std::mutex> lk(vol_mu);
      for (auto& [k, e] : volumes) vs.push_back(e);
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

  // Finds a volume from "tenant" + "volume" (tenant optional when unique).
  Result<std::shared_ptr<VolEntry>> Resolve(const std::string& tenant, const std::string& volume) {
    if (!proto::ValidName(volume)) return Status::InvalidArgument("missing or bad 'volume'");
    std::lock_guard<std::mutex> lk(vol_mu);
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

  json::object VolumeJson(const VolEntry& e) {
    VolumeStatus st = e.volume->GetStatus();
    return json::object{{"tenant", e.tenant},
                        {"volume", e.name},
                        {"size", st.identity.size},
                        {"block_size", st.identity.block_size},
                        {"generation", st.identity.generation},
                        {"state", StateName(st.state)},
                        {"applied_seq", st.applied_seq},
                        {"horizon_seq", st.horizon_seq},
                        {"journal_bytes", st.journal_bytes},
                        {"journal_segments", st.journal_segments},
                        {"undo_records", st.undo_records},
                        {"points", st.points},
                        {"exports", st.active_exports},
                        {"rollback_to", st.rollback_to}};
  }

  json::value StatusJson() {
    json::array vols;
    std::lock_guard<std::mutex> lk(vol_mu);
    for (auto& [k, e] : volumes) vols.push_back(VolumeJson(*e));
    return json::object{{"daemon", "cdp-master-target"}, {"volumes", vols}};
  }

  // Reads a JSON body (or an empty object); throws nothing.
  static json::object Body(const http::Request& r) {
    if (r.body.empty()) return {};
    boost::system::error_code ec;
    json::value v = json::parse(r.body, ec);
    if (ec || !v.is_object()) return {};
    return v.as_object();
  }
  static std::string Str(const json::object& b, const http::Request& r, const char* key) {
    if (auto* v = b.if_contains(key); v && v->is_string()) return std::string(v->as_string());
    auto it = r.params.find(key);
    return it == r.params.end() ? "" : it->second;
  }
  static std::optional<int64_t> Int(const json::object& b, const http::Request& r, const char* key) {
    if (auto* v = b.if_contains(key)) {
      if (v->is_int64()) return v->as_int64();
      if (v->is_uint64()) return int64_t(v->as_uint64());
      if (v->is_string()) {
        try {
          return std::stoll(std::string(v->as_string()));
        } catch (...) {
          return std::nullopt;
        }
      }
    }
    auto it = r.params.find(key);
    if (it == r.params.end()) return std::nullopt;
    try {
      size_t pos = 0;
      long long x = std::stoll(it->second, &pos);
      if (pos != it->second.size()) return std::nullopt;
      return x;
    } catch (...) {
      return std::nullopt;
    }
  }

  // The sequence named by "point" (an id) or "seq".
  Result<uint64_t> PointSeq(const VolEntry& e, const json::object& b, const http::Request& r) {
    if (auto id = Int(b, r, "point")) {
      auto p = e.volume->FindPoint(*id);
      if (!p) return Status::NotFound("no recovery point " + std::to_string(*id) + " on " + e.name);
      return p->seq;
    }
    if (auto seq = Int(b, r, "seq")) {
      if (*seq < 0) return Status::InvalidArgument("bad seq");
      return uint64_t(*seq);
    }
    return Status::InvalidArgument("give 'point' (an id from /v1/points) or 'seq'");
  }

  void AddRoutes() {
    http->Route("GET", "/v1/volumes", [this](const http::Request&) {
      json::array vols;
      std::lock_guard<std::mutex> lk(vol_mu);
      for (auto& [k, e] : volumes) vols.push_back(VolumeJson(*e));
      return http::Response::Json(200, json::object{{"volumes", vols}});
    });
    http->Route("GET", "/v1/points", [this](const http::Request& r) {
      json::object b;
      auto e = Resolve(Str(b, r, "tenant"), Str(b, r, "volume"));
      if (!e.ok()) return http::Response::Error(HttpStatusOf(e.status()), e.status().message());
      json::array pts;
      for (const auto& p : (*e)->volume->ListPoints()) pts.push_back(PointJson(p));
      return http::Response::Json(200, json::object{{"tenant", (*e)->tenant},
                                                    {"volume", (*e)->name},
                                                    {"applied_seq", (*e)->volume->applied_seq()},
                                                    {"points", pts}});
    });
    http->Route("POST", "/v1/rollback", [this](const http::Request& r) {
      json::object b = Body(r);
      auto e = Resolve(Str(b, r, "tenant"), Str(b, r, "volume"));
      if (!e.ok()) return http::Response::Error(HttpStatusOf(e.status()), e.status().message());
      auto seq = PointSeq(**e, b, r);
      if (!seq.ok()) return http::Response::Error(HttpStatusOf(seq.status()), seq.status().message());
      Status s = (*e)->volume->Rollback(*seq);
      if (!s.ok()) return http::Response::Error(HttpStatusOf(s), s.ToString());
      log->warn("{} rolled back to sequence {} (failed over)", log::Where{(*e)->name, "control", *seq}, *seq);
      return http::Response::Json(200, VolumeJson(**e));
    });
    http->Route("POST", "/v1/export", [this](const http::Request& r) {
      json::object b = Body(r);
      auto e = Resolve(Str(b, r, "tenant"), Str(b, r, "volume"));
      if (!e.ok()) return http::Response::Error(HttpStatusOf(e.status()), e.status().message());
      auto seq = PointSeq(**e, b, r);
      if (!seq.ok()) return http::Response::Error(HttpStatusOf(seq.status()), seq.status().message());
      bool writable = false;
      if (auto* w = b.if_contains("writable"); w && w->is_bool()) writable = w->as_bool();
      if (r.params.count("writable")) writable = r.params.at("writable") == "true" || r.params.at("writable") == "1";
      auto name = mt->StartExport((*e)->tenant, (*e)->name, *seq, writable);
      if (!name.ok()) return http::Response::Error(HttpStatusOf(name.status()), name.status().message());
      return http::Response::Json(200, json::object{{"export", *name},
                                                    {"port", nbd ? nbd->port() : 0},
                                                    {"seq", *seq},
                                                    {"writable", writable}});
    });
    http->Route("DELETE", "/v1/export", [this](const http::Request& r) {
      json::object b = Body(r);
      std::string name = Str(b, r, "name");
      if (name.empty()) name = Str(b, r, "export");
      Status s = mt->StopExport(name);
      if (!s.ok()) return http::Response::Error(HttpStatusOf(s), s.message());
      return http::Response::Json(200, json::object{{"removed", name}});
    });
    http->Route("GET", "/v1/exports", [this](const http::Request&) {
      json::array out;
      std::lock_guard<std::mutex> lk(export_mu);
      for (auto& [name, x] : exports) {
        out.push_back(json::object{{"export", name},
                                   {"tenant", x.tenant},
                                   {"volume", x.volume},
                                   {"seq", x.seq},
                                   {"writable", x.writable},
                                   {"overlay_blocks", x.device->overlay_blocks()}});
      }
      return http::Response::Json(200, json::object{{"exports", out}, {"port", nbd ? nbd->port() : 0}});
    });
    http->Route("GET", "/v1/hashes", [this](const http::Request& r) {
      json::object b;
      auto e = Resolve(Str(b, r, "tenant"), Str(b, r, "volume"));
      if (!e.ok()) return http::Response::Error(HttpStatusOf(e.status()), e.status().message());
      int64_t region = Int(b, r, "region_size").value_or(1 << 20);
      int64_t first = Int(b, r, "first").value_or(0);
      if (region <= 0 || region > (1ll << 30) || first < 0) return http::Response::Error(400, "bad region_size or first");
      uint64_t regions = ((*e)->volume->size() + uint64_t(region) - 1) / uint64_t(region);
      int64_t count = Int(b, r, "count").value_or(int64_t(std::min<uint64_t>(regions - std::min<uint64_t>(regions, first), proto::kMaxHashes)));
      if (count <= 0 || count > int64_t(proto::kMaxHashes)) return http::Response::Error(400, "bad count");
      auto h = (*e)->volume->RegionHashes(uint32_t(region), uint64_t(first), uint32_t(count));
      if (!h.ok()) return http::Response::Error(HttpStatusOf(h.status()), h.status().message());
      json::array hs;
      for (const auto& x : *h) hs.push_back(json::value(HashToHex(x)));
      return http::Response::Json(200, json::object{{"tenant", (*e)->tenant},
                                                    {"volume", (*e)->name},
                                                    {"region_size", region},
                                                    {"first", first},
                                                    {"applied_seq", (*e)->volume->applied_seq()},
                                                    {"hashes", hs}});
    });
    http->Route("POST", "/v1/retention", [this](const http::Request&) {
      return http::Response::Json(200, json::object{{"volumes", RunRetention()}});
    });
  }
};

MasterTarget::MasterTarget(MasterTargetOptions opts) : o_(std::move(opts)) {
  impl_ = std::make_unique<Impl>(this);
}

MasterTarget::~MasterTarget() { Stop(); }

uint16_t MasterTarget::control_port() const { return impl_->http ? impl_->http->port() : 0; }
uint16_t MasterTarget::nbd_port() const { return impl_->nbd ? impl_->nbd->port() : 0; }

std::shared_ptr<Volume> MasterTarget::FindVolume(const std::string& tenant, const std::string& name) {
  std::lock_guard<std::mutex> lk(impl_->vol_mu);
  auto it = impl_->volumes.find(Impl::Key(tenant, name));
  return it == impl_->volumes.end() ? nullptr : it->second->volume;
}

Status MasterTarget::Start() {
  Impl& m = *impl_;
  if (!o_.env || !o_.clock) return Status::InvalidArgument("master target: env and clock are required");
  for (const auto& [t, s] : o_.tenants) {
    if (!proto::ValidName(t)) return Status::InvalidArgument("bad tenant name '" + t + "'");
    if (s.empty()) return Status::InvalidArgument("tenant " + t + " has an empty secret");
  }
  m.connections = registry_.GetGauge("cdp_mt_connections", "Process server connections open");
  m.nacks = registry_.GetCounter("cdp_mt_nacks_total", "Requests refused with a Nack");
  metrics::RegisterProcessMetrics(registry_, o_.env, o_.clock);
  CDP_RETURN_IF_ERROR(o_.env->CreateDirs(o_.data_dir));
  // Crash recovery of every volume comes before anything else.
  CDP_RETURN_IF_ERROR(m.LoadVolumes());

  if (o_.nbd_port >= 0) {
    NbdServerOptions no;
    no.tcp_host = o_.nbd_host;
    no.tcp_port = o_.nbd_port;
    m.nbd = std::make_unique<NbdServer>(no);
    Status s = m.nbd->Start();
    if (!s.ok()) {
      m.nbd.reset();
      return s.WithContext("nbd exports");
    }
  }
  if (o_.control_port >= 0) {
    http::ServerOptions ho;
    ho.host = o_.control_host;
    ho.port = uint16_t(o_.control_port);
    ho.registry = &registry_;
    ho.status = [this] { return impl_->StatusJson(); };
    m.http = std::make_unique<http::Server>(ho);
    m.AddRoutes();
    Status s = m.http->Start();
    if (!s.ok()) {
      Stop();
      return s.WithContext("control server");
    }
  }
  Listener::Options lo;
  lo.name = "mt-peers";
  lo.tcp_host = o_.listen_host;
  lo.tcp_port = o_.listen_port;
  lo.mode = Listener::Mode::kThreadPerConnection;
  lo.registry = &registry_;
  m.listener = std::make_unique<Listener>(lo, ServeFrames([&m](FrameChannel& ch) { m.Serve(ch); }));
  if (Status s = m.listener->Start(); !s.ok()) {
    Stop();
    return s;
  }
  port_ = m.listener->tcp_port();
  m.retention_thread = std::thread([&m] { m.RetentionLoop(); });
  m.log->info("listening on {}:{}, control port {}, nbd port {}", o_.listen_host, port(), control_port(), nbd_port());
  return Status::OK();
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
}

Result<std::string> MasterTarget::StartExport(const std::string& tenant, const std::string& volume, uint64_t point_seq,
                                              bool writable) {
  Impl& m = *impl_;
  if (!m.nbd) return Status::NotSupported("NBD exports are disabled (nbd port < 0)");
  std::shared_ptr<Volume> v = FindVolume(tenant, volume);
  if (!v) return Status::NotFound("no volume " + tenant + "/" + volume);
  std::lock_guard<std::mutex> lk(m.export_mu);
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
  CDP_RETURN_IF_ERROR(m.nbd->AddExport(name, dev, volume + " at sequence " + std::to_string(point_seq)));
  m.exports[name] = ExportEntry{tenant, volume, point_seq, writable, dev};
  m.log->info("{} export {} started{}", log::Where{volume, tenant, point_seq}, name, writable ? " (writable overlay)" : "");
  return name;
}

Status MasterTarget::StopExport(const std::string& name) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.export_mu);
  auto it = m.exports.find(name);
  if (it == m.exports.end()) return Status::NotFound("no export " + name);
  if (m.nbd) {
    Status s = m.nbd->RemoveExport(name);
    if (!s.ok() && !s.IsNotFound()) return s;
  }
  m.exports.erase(it);
  m.log->info("export {} removed", name);
  return Status::OK();
}

}  // namespace cdp::mt
