// SPDX-License-Identifier: Apache-2.0
#include "process-server/ps_control_api.h"

#include <boost/json.hpp>

#include "common/wire/codec.h"
#include "common/wire/group_routes.h"

namespace cdp::ps {

namespace json = boost::json;


Status ProcessServer::StartControl() {
  Impl& im = *impl_;
  http::ServerOptions ho;
  ho.host = opt_.control.host;
  ho.port = opt_.control.port;
  ho.max_connections_per_peer = opt_.connection_caps.control_per_peer;
  ho.registry = opt_.registry;
  ho.status = [this] { return StatusJson(); };
  CDP_ASSIGN_OR_RETURN(im.control_tokens,
                       ApplyControlAuth(opt_.control_auth, JoinPath(opt_.spool_dir, "control.token"), "", "ps", &ho,
                                        im.tls.get()));
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
    auto p = http::Params::Of(r, {"mbps", "schedule"});
    if (!p.ok()) return http::ErrorResponse(p.status());
    auto mbps = p->Number("mbps");
    auto schedule = p->String("schedule");
    if (!mbps.ok()) return http::ErrorResponse(mbps.status());
    if (!schedule.ok()) return http::ErrorResponse(schedule.status());
    if (!*mbps && !*schedule) return http::Response::Error(400, "give 'mbps' and/or 'schedule'");
    ThrottleOptions t = opt_.throttle;
    if (*mbps) t.default_mbps = **mbps;
    if (*schedule) {
      auto parsed = ParseSchedule(**schedule);
      if (!parsed.ok()) return http::ErrorResponse(parsed.status());
      t.schedule = *parsed;
    }
    if (Status s = ValidateThrottle(t); !s.ok()) return http::ErrorResponse(s);
    throttle_->Reconfigure(t);
    opt_.throttle = t;
    return http::Response::Json(200, json::object{{"limit_mbps", throttle_->CurrentMbps()}});
  });
  // Consistency groups (common/wire/group_coordinator.h, docs/groups.md).
  im.http->Route("GET", "/v1/groups", [&im](const http::Request& r) {
    return http::Response::Json(200, json::object{{"groups", im.groups->Json(r.caller)}});
  });
  AddGroupRoutes(*im.http, *im.groups);
  im.http->Route("POST", "/v1/reprotect", [this](const http::Request& r) {
    auto p = http::Params::Of(r, {"volume", "tenant"});
    if (!p.ok()) return http::ErrorResponse(p.status());
    auto volume = p->String("volume");
    auto tenant = p->String("tenant");
    if (!volume.ok()) return http::ErrorResponse(volume.status());
    if (!tenant.ok()) return http::ErrorResponse(tenant.status());
    if (!*volume) return http::Response::Error(400, "give 'volume'");
    auto a = ArmReprotect(tenant->value_or(""), **volume);
    if (!a.ok()) return http::ErrorResponse(a.status());
    return http::Response::Json(200, json::object{{"tenant", a->tenant},
                                                  {"volume", **volume},
                                                  {"generation", a->generation},
                                                  {"undelivered_records", a->undelivered_records}});
  });
  CDP_RETURN_IF_ERROR(im.http->Start());
  control_port_ = im.http->port();
  return Status::OK();
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
        {"spool_read_bytes", s.read_bytes},
        {"spool_read_file_bytes", s.read_file_bytes},
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
        {"fenced", v->fenced()},
    };
    // One entry per master target the volume ships to (copy 0: the primary,
    // whose acked seq is mt_acked_seq above); backlog_* above is the slowest.
    json::array copies;
    for (const CopyStatus& cs : im.CopyStatuses(v.get())) {
      copies.push_back(json::object{
          {"copy", cs.copy},
          {"mt", cs.mt},
          {"acked_seq", cs.acked_seq},
          {"lag_records", cs.lag_records},
          {"lag_bytes", cs.lag_bytes},
          {"lag_seconds", cs.lag_seconds},
          {"lost", cs.lost},
          {"undeliverable", cs.undeliverable},
          {"link", cs.link},
          {"stalled", cs.stalled},
          {"fenced", cs.fenced},
      });
    }
    o["copies"] = std::move(copies);
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
  o["master_target"] = opt_.mt.ToString();
  json::array mts;
  for (const HostPort& t : impl_->Targets()) mts.push_back(json::value(t.ToString()));
  o["master_targets"] = std::move(mts);
  json::object th;
  th["limit_mbps"] = t.limit_mbps;
  th["throttling"] = t.throttling;
  o["throttle"] = std::move(th);
  o["volumes"] = std::move(vols.as_object()["volumes"]);
  if (impl_->groups) {
    http::Caller admin;
    admin.admin = true;
    o["groups"] = impl_->groups->Json(admin);
  }
  return o;
}

}  // namespace cdp::ps
