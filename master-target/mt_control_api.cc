#include "master-target/mt_control_api.h"

#include <string>
#include <vector>

#include "common/hash.h"

namespace cdp::mt {

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

json::object MasterTarget::Impl::VolumeJson(const VolEntry& e) {
  VolumeStatus st = e.volume->GetStatus();
  return json::object{{"tenant", e.tenant},
                      {"volume", e.name},
                      {"size", st.identity.size},
                      {"block_size", st.identity.block_size},
                      {"generation", st.identity.generation},
                      {"state", StateName(st.state)},
                      // the generation's own sequence, as its source counts it
                      {"applied_seq", st.applied_seq - st.seq_base},
                      // the volume's history sequence (points and exports use it)
                      {"history_seq", st.applied_seq},
                      {"seq_base", st.seq_base},
                      {"reprotect_armed", st.reprotect_armed},
                      {"horizon_seq", st.horizon_seq},
                      {"journal_bytes", st.journal_bytes},
                      {"journal_segments", st.journal_segments},
                      {"undo_records", st.undo_records},
                      {"points", st.points},
                      {"exports", st.active_exports},
                      {"rollback_to", st.rollback_to}};
}

json::value MasterTarget::Impl::StatusJson() {
  json::array vols;
  std::lock_guard<std::mutex> lk(vol_mu);
  for (auto& [k, e] : volumes) vols.push_back(VolumeJson(*e));
  return json::object{{"daemon", "cdp-master-target"}, {"volumes", vols}};
}

json::object MasterTarget::Impl::Body(const http::Request& r) {
  if (r.body.empty()) return {};
  boost::system::error_code ec;
  json::value v = json::parse(r.body, ec);
  if (ec || !v.is_object()) return {};
  return v.as_object();
}

std::string MasterTarget::Impl::Str(const json::object& b, const http::Request& r, const char* key) {
  if (auto* v = b.if_contains(key); v && v->is_string()) return std::string(v->as_string());
  auto it = r.params.find(key);
  return it == r.params.end() ? "" : it->second;
}

std::optional<int64_t> MasterTarget::Impl::Int(const json::object& b, const http::Request& r, const char* key) {
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

Result<uint64_t> MasterTarget::Impl::PointSeq(const VolEntry& e, const json::object& b, const http::Request& r) {
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

void MasterTarget::Impl::AddRoutes() {
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
  // Re-protect (an operator's command, never a peer's): the next VolumeOpen
  // with the next generation is accepted; every recovery point is kept.
  http->Route("POST", "/v1/reprotect", [this](const http::Request& r) {
    json::object b = Body(r);
    auto e = Resolve(Str(b, r, "tenant"), Str(b, r, "volume"));
    if (!e.ok()) return http::Response::Error(HttpStatusOf(e.status()), e.status().message());
    auto gen = (*e)->volume->ArmReprotect();
    if (!gen.ok()) return http::Response::Error(HttpStatusOf(gen.status()), gen.status().message());
    return http::Response::Json(200, json::object{{"tenant", (*e)->tenant},
                                                  {"volume", (*e)->name},
                                                  {"generation", *gen},
                                                  {"points", (*e)->volume->ListPoints().size()}});
  });
  http->Route("POST", "/v1/retention", [this](const http::Request&) {
    return http::Response::Json(200, json::object{{"volumes", RunRetention()}});
  });
}

}  // namespace cdp::mt
