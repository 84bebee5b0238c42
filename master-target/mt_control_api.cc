// SPDX-License-Identifier: Apache-2.0
#include "master-target/mt_control_api.h"

#include <map>
#include <string>
#include <vector>

#include "common/base/group_marker.h"
#include "common/crypto/seal.h"
#include "common/http/control_token.h"
#include "common/wire/block_digest.h"
#include "common/wire/group_routes.h"
#include "common/wire/hash.h"

namespace cdp::mt {

namespace {

json::object PointJson(const RecoveryPoint& p) {
  return json::object{{"id", p.id},
                      {"seq", p.seq},
                      {"time_us", p.time_us},        // when the protected host wrote it
                      {"applied_us", p.applied_us},  // when this MT applied it
                      {"kind", PointKindName(p.kind)},
                      {"name", p.name},
                      // a rollback to an earlier point rewound past it; still exportable
                      {"rolled_back", p.rolled_back}};
}

}  // namespace

json::object MasterTarget::Impl::VolumeJson(const VolEntry& e) {
  VolumeStatus st = e.volume->GetStatus();
  return json::object{{"tenant", e.tenant},
                      {"volume", e.name},
                      {"size", st.identity.size},
                      {"block_size", st.identity.block_size},
                      {"generation", st.identity.generation},
                      {"sealed", st.identity.sealed},  // tenant-side encryption: the MT holds ciphertext only
                      {"state", ShownState(st)},  // "stalled: no space" while apply fails
                      // the generation's own sequence, as its source counts it
                      {"applied_seq", Numbering{st.seq_base}.Wire(st.applied_seq)},
                      // the volume's history sequence (points and exports use it)
                      {"history_seq", st.applied_seq},
                      {"seq_base", st.seq_base},
                      {"reprotect_armed", st.reprotect_armed},
                      // the peer this generation replicates through ("" before its first open)
                      {"upstream", st.upstream.name.empty() ? std::string() : st.upstream.Describe()},
                      {"horizon_seq", st.horizon_seq},
                      {"journal_bytes", st.journal_bytes},
                      {"journal_segments", st.journal_segments},
                      {"undo_records", st.undo_records},
                      {"points", st.points},
                      {"exports", st.active_exports},
                      {"rollback_to", st.rollback_to},
                      {"failover", FailoverJson(e, st)},
                      {"stall", StallJson(st)},
                      // this volume's policy (volume_retention overrides the age per volume)
                      {"retention_max_bytes", e.volume->points().policy().max_bytes},
                      {"retention_max_age_seconds", e.volume->points().policy().max_age_us / 1'000'000},
                      // the history lock in force: no point younger than it is dropped
                      {"history_lock_seconds", st.lock_us / 1'000'000},
                      // a shortened lock: when the longer one being waited out ends (0: none)
                      {"history_lock_pending_until_us", st.lock_pending_until_us},
                      {"rolled_back_points", st.rolled_back_points},
                      // possible ransomware (GET /v1/anomalies): suspect-clean points held
                      {"anomalies_open", st.anomalies_open},
                      {"last_anomaly", st.last_anomaly}};
}

json::value MasterTarget::Impl::StallJson(const VolumeStatus& st) {
  if (!st.stall) return nullptr;
  return json::object{{"cause", StallCauseName(st.stall->cause)},
                      {"message", st.stall->message},
                      {"since_us", st.stall->since_us},
                      {"failures", st.stall->failures}};
}

json::value MasterTarget::Impl::FailoverJson(const VolEntry& e, const VolumeStatus& st) {
  if (!st.failover) return nullptr;
  const FailoverInfo& f = *st.failover;
  json::object j{{"point", f.point_id},
                 {"seq", Numbering{st.seq_base}.Wire(f.point_seq)},  // as the current generation's source counts it
                 {"history_seq", f.point_seq},        // as points, exports and seq:N name it
                 {"committed", f.committed},
                 {"quiesced", f.quiesced},
                 {"time_us", f.time_us},
                 {"export", MasterTarget::PromotedExportName(e.tenant, e.name)},
                 {"served", false},
                 {"provider_written_blocks", 0}};
  std::lock_guard<std::mutex> lk(export_mu);
  if (auto it = exports.find(MasterTarget::PromotedExportName(e.tenant, e.name)); it != exports.end()) {
    j["served"] = true;
    j["provider_written_blocks"] = it->second.device->overlay_blocks();
  }
  return j;
}

json::value MasterTarget::Impl::StatusJson() {
  json::array vols;
  std::lock_guard<std::mutex> lk(vol_mu);
  for (auto& [k, e] : volumes) vols.push_back(VolumeJson(*e));
  json::array refusals;
  for (const auto& [k, r] : refused)
    refusals.push_back(json::object{{"tenant", r.tenant}, {"volume", r.volume}, {"cause", r.cause}, {"why", r.message}});
  return json::object{
      {"daemon", "cdp-master-target"}, {"storage", o.store_kind}, {"volumes", vols}, {"refused", refusals}};
}

Result<std::shared_ptr<VolEntry>> MasterTarget::Impl::ResolveParams(const http::Request& r, const http::Params& p) {
  CDP_ASSIGN_OR_RETURN(auto tenant, p.String("tenant"));
  CDP_ASSIGN_OR_RETURN(auto volume, p.String("volume"));
  return Resolve(r.caller, tenant.value_or(""), volume.value_or(""));
}

Result<uint64_t> MasterTarget::Impl::PointSeq(const VolEntry& e, const http::Params& p, int64_t* id_out) {
  CDP_ASSIGN_OR_RETURN(auto id, p.Int("point"));
  CDP_ASSIGN_OR_RETURN(auto seq, p.Uint("seq"));
  CDP_ASSIGN_OR_RETURN(auto tag, p.String("tag"));
  CDP_ASSIGN_OR_RETURN(auto time, p.String("time"));
  if (int(bool(id)) + int(bool(seq)) + int(bool(tag)) + int(bool(time)) > 1)
    return Status::InvalidArgument("give one of 'point', 'tag', 'seq' or 'time'");
  if (id_out) *id_out = 0;
  if (time) {
    CDP_ASSIGN_OR_RETURN(uint64_t t, ParseUtcTime(*time));
    std::optional<RecoveryPoint> found = PointAtTime(e.volume->points().List(), t);
    if (!found) return Status::NotFound("no recovery point of " + e.name + " was written at or before " + *time);
    id = found->id;
  }
  if (tag) {
    std::optional<RecoveryPoint> found;
    int n = 0;
    for (const auto& pt : e.volume->points().List()) {
      if (pt.kind == PointKind::kTag && pt.name == *tag) {
        found = pt;
        ++n;
      }
    }
    if (!found) return Status::NotFound("no tag point named '" + *tag + "' on " + e.name);
    if (n > 1)
      return Status::InvalidArgument("tag '" + *tag + "' names " + std::to_string(n) + " points of " + e.name +
                                     "; give the point's id");
    id = found->id;
  }
  if (id) {
    auto pt = e.volume->points().Find(*id);
    if (!pt) return Status::NotFound("no recovery point " + std::to_string(*id) + " on " + e.name);
    if (id_out) *id_out = pt->id;
    return pt->seq;
  }
  if (seq) return *seq;
  return Status::InvalidArgument("give 'point' (an id from /v1/points), 'tag', 'seq' or 'time' (UTC)");
}

namespace {

// Runs `body` with the request's parameters (only `allowed` keys); a bad
// parameter or a failed Status becomes its HTTP error.
template <typename F>
http::Response WithParams(const http::Request& r, std::initializer_list<std::string_view> allowed, F&& body) {
  auto p = http::Params::Of(r, allowed);
  if (!p.ok()) return http::ErrorResponse(p.status());
  Result<http::Response> out = body(*p);
  if (!out.ok()) return http::ErrorResponse(out.status());
  return std::move(*out);
}

json::object TokenJson(const TokenInfo& t) {
  return json::object{{"id", t.id},
                      {"scope", TokenScopeName(t.scope)},
                      {"tenant", t.tenant},
                      {"created_us", t.created_us},
                      {"expires_us", t.expires_us},
                      // since this MT started (kept in memory only); 0: not used since
                      {"last_used_us", t.last_used_us}};
}

http::Response NeedsAdmin(const http::Request& r) {
  return http::Response::Error(403, r.method + " " + r.path + " needs the admin token");
}

}  // namespace

void MasterTarget::Impl::AddRoutes() {
  http->Route("GET", "/v1/volumes", [this](const http::Request& r) {
    return WithParams(r, {}, [&](const http::Params&) -> Result<http::Response> {
      json::array vols;
      std::lock_guard<std::mutex> lk(vol_mu);
      for (auto& [k, e] : volumes) {
        if (r.caller.Sees(e->tenant)) vols.push_back(VolumeJson(*e));
      }
      return http::Response::Json(200, json::object{{"volumes", vols}});
    });
  });
  http->Route("GET", "/v1/whoami", [this](const http::Request& r) {
    return WithParams(r, {}, [&](const http::Params&) -> Result<http::Response> {
      json::array tenants;
      for (const auto& [t, secret] : o.tenants) {
        if (r.caller.Sees(t)) tenants.push_back(json::value(t));
      }
      return http::Response::Json(200, json::object{{"admin", r.caller.admin},
                                                    {"tenant", r.caller.tenant},
                                                    {"read_only", r.caller.read_only},  // scope tenant-read
                                                    {"token_id", r.caller.token_id},    // "" for the admin file's token
                                                    {"tenants", tenants},
                                                    {"nbd_port", nbd ? nbd->port() : 0},
                                                    {"nbd_tls", o.nbd_tls}});
    });
  });
  http->Route("GET", "/v1/lag", [this](const http::Request& r) {
    return WithParams(r, {"tenant", "volume"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      const uint64_t now = o.clock->WallMicros();
      json::array samples;
      for (const auto& x : e->lag.Samples(now)) {
        samples.push_back(json::object{{"time_us", x.time_us},
                                       {"max_lag_seconds", x.max_lag_seconds},
                                       {"batches", x.batches},
                                       {"wire_bytes", x.wire_bytes}});
      }
      return http::Response::Json(200, json::object{{"tenant", e->tenant},
                                                    {"volume", e->name},
                                                    {"now_us", now},
                                                    {"bucket_seconds", e->lag.bucket_us() / 1'000'000},
                                                    {"window_seconds", e->lag.window_us() / 1'000'000},
                                                    {"link_mbit", o.link_mbit},
                                                    {"samples", samples}});
    });
  });
  http->Route("GET", "/v1/points", [this](const http::Request& r) {
    return WithParams(r, {"tenant", "volume"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      json::array pts;
      for (const auto& pt : e->volume->points().List()) pts.push_back(PointJson(pt));
      return http::Response::Json(200, json::object{{"tenant", e->tenant},
                                                    {"volume", e->name},
                                                    {"applied_seq", e->volume->applied_seq()},
                                                    {"points", pts}});
    });
  });
  // Consistency groups as this master target holds them (docs/groups.md):
  // the markers group.<G>.<round>.<members>[.tag.<T>] among the tag points of the
  // caller's volumes (a tenant's, or the one asked). A group point is
  // complete when <members> volumes of the tenant hold its marker; an
  // incomplete one older than the newest complete point is partial (a
  // member's hold lapsed, or its records were lost) and never a recovery
  // point of the group. Rolled-back markers are left out.
  http->Route("GET", "/v1/groups", [this](const http::Request& r) {
    return WithParams(r, {"tenant", "group"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(std::optional<std::string> tenant, p.String("tenant"));
      CDP_ASSIGN_OR_RETURN(std::optional<std::string> only, p.String("group"));
      if ((tenant && !ValidName(*tenant)) || (only && !ValidName(*only)))
        return Status::InvalidArgument("tenant and group must be valid names");
      struct Mark {
        uint64_t members = 0;
        std::string tag;  // an application-consistent point's
        uint64_t time_us = 0;
        std::map<std::string, uint64_t> seqs;  // volume -> the marker's sequence
      };
      // (tenant, group) -> round -> its marker's volumes
      std::map<std::pair<std::string, std::string>, std::map<uint64_t, Mark>> found;
      {
        std::lock_guard<std::mutex> lk(vol_mu);
        for (auto& [k, e] : volumes) {
          if (!r.caller.Sees(e->tenant) || (tenant && *tenant != e->tenant)) continue;
          for (const auto& pt : e->volume->points().List()) {
            if (pt.kind != PointKind::kTag || pt.rolled_back) continue;
            auto m = ParseGroupMarker(pt.name);
            if (!m || (only && *only != m->group)) continue;
            Mark& mk = found[{e->tenant, m->group}][m->round];
            mk.members = m->members;
            mk.tag = m->tag;
            mk.time_us = std::max(mk.time_us, pt.time_us);
            mk.seqs[e->name] = pt.seq;
          }
        }
      }
      json::array listed;
      for (const auto& [key, rounds] : found) {
        json::array complete, partial;
        uint64_t last_complete = 0;
        for (const auto& [round, mk] : rounds)
          if (mk.seqs.size() == mk.members) last_complete = round;
        for (const auto& [round, mk] : rounds) {
          json::object seqs;
          for (const auto& [v, s] : mk.seqs) seqs[v] = s;
          json::object pt{{"round", round},
                          {"marker", GroupMarker(key.second, round, mk.members, mk.tag)},
                          {"members", mk.members},
                          {"consistency", mk.tag.empty() ? "crash" : "application"},
                          {"time_us", mk.time_us},
                          {"seqs", std::move(seqs)}};
          if (!mk.tag.empty()) pt["tag"] = mk.tag;
          if (mk.seqs.size() == mk.members) complete.push_back(std::move(pt));
          else if (round < last_complete) partial.push_back(std::move(pt));
        }
        listed.push_back(json::object{{"tenant", key.first},
                                      {"name", key.second},
                                      {"points", std::move(complete)},
                                      {"partial", std::move(partial)}});
      }
      // With the groups coordinated here: their members, rounds and last point.
      return http::Response::Json(200, json::object{{"groups", std::move(listed)},
                                                    {"coordinated", this->groups->Json(r.caller)}});
    });
  });
  AddGroupRoutes(*http, *this->groups);
  http->Route("POST", "/v1/rollback", [this](const http::Request& r) {
    return WithParams(r, {"tenant", "volume", "point", "tag", "seq", "time", "discard_history"},
                      [&](const http::Params& p) -> Result<http::Response> {
      // A rollback keeps what it rewinds (a tenant may ask it); discarding
      // that branch is the admin's alone, and never inside the history lock.
      CDP_ASSIGN_OR_RETURN(std::optional<bool> discard, p.Bool("discard_history"));
      if (discard.value_or(false) && !r.caller.admin)
        return Status::PermissionDenied("discard_history needs the admin token");
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      CDP_ASSIGN_OR_RETURN(uint64_t seq, PointSeq(*e, p));
      CDP_RETURN_IF_ERROR(e->volume->Rollback(seq, discard.value_or(false)));
      log->warn("{} rolled back to sequence {} (failed over){}", log::Where{e->name, "control", seq}, seq,
                discard.value_or(false) ? "; the rolled-back branch discarded by the admin" : "");
      return http::Response::Json(200, VolumeJson(*e));
    });
  });
  http->Route("POST", "/v1/export", [this](const http::Request& r) {
    // No key material is taken here, on any route: a sealed volume's
    // exports serve its stored blocks and MACs, decrypted only at the tenant
    // (`cdpctl serve`). A "keys" parameter is refused as unknown.
    return WithParams(r, {"tenant", "volume", "point", "tag", "seq", "time", "writable"},
                      [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      CDP_ASSIGN_OR_RETURN(uint64_t seq, PointSeq(*e, p));
      CDP_ASSIGN_OR_RETURN(auto writable, p.Bool("writable"));
      CDP_ASSIGN_OR_RETURN(std::string name, mt->StartExport(e->tenant, e->name, seq, writable.value_or(false)));
      const bool sealed = e->volume->identity().sealed;
      return http::Response::Json(200, json::object{{"export", name},
                                                    {"port", nbd ? nbd->port() : 0},
                                                    {"tls", o.nbd_tls},  // NBD STARTTLS required
                                                    {"seq", seq},
                                                    {"writable", writable.value_or(false)},
                                                    {"sealed", sealed},
                                                    {"size", DeviceSize(e->volume->identity())},
                                                    {"volume_size", e->volume->size()},
                                                    // what the export serves: "plain", or "ciphertext" (a
                                                    // sealed volume's stored blocks, then their MACs)
                                                    {"serves", sealed ? "ciphertext" : "plain"}});
    });
  },
              // A read-only export is a read: a tenant-read token may start one.
              http::Access::kToken, http::ChangesStateWhenSet("writable"));
  http->Route("POST", "/v1/unexport", [this](const http::Request& r) {
    return WithParams(r, {"export"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto name, p.String("export"));
      if (!name || name->empty()) return Status::InvalidArgument("give 'export' (a name from /v1/exports)");
      if (!r.caller.admin) {
        std::lock_guard<std::mutex> lk(export_mu);
        auto it = exports.find(*name);
        if (it == exports.end() || !r.caller.Sees(it->second.tenant)) return Status::NotFound("no export " + *name);
      }
      CDP_RETURN_IF_ERROR(mt->StopExport(*name));
      return http::Response::Json(200, json::object{{"removed", *name}});
    });
  });
  http->Route("GET", "/v1/exports", [this](const http::Request& r) {
    return WithParams(r, {}, [&](const http::Params&) -> Result<http::Response> {
      json::array out;
      std::lock_guard<std::mutex> lk(export_mu);
      for (auto& [name, x] : exports) {
        if (!r.caller.Sees(x.tenant)) continue;
        out.push_back(json::object{{"export", name},
                                   {"tenant", x.tenant},
                                   {"volume", x.volume},
                                   {"seq", x.seq},
                                   {"writable", x.writable},
                                   {"overlay_blocks", x.device->overlay_blocks()}});
      }
      return http::Response::Json(200, json::object{{"exports", out}, {"port", nbd ? nbd->port() : 0}});
    });
  });
  // Block digests of the replica (common/wire/block_digest.h) for `cdpctl verify`:
  // the current image, or the image at wire sequence `at_seq` through the
  // undo journal. 409 while the replica has not applied at_seq yet, 410 when
  // it is outside the retained history.
  http->Route("GET", "/v1/hashes", [this](const http::Request& r) {
    return WithParams(r, {"tenant", "volume", "region_size", "first", "count", "at_seq"},
                      [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      CDP_ASSIGN_OR_RETURN(auto region_p, p.Uint("region_size"));
      CDP_ASSIGN_OR_RETURN(auto first_p, p.Uint("first"));
      CDP_ASSIGN_OR_RETURN(auto count_p, p.Uint("count"));
      CDP_ASSIGN_OR_RETURN(auto at_p, p.Uint("at_seq"));
      const uint64_t region = region_p.value_or(1u << 20);
      if (!ValidUnitSize(region)) return Status::InvalidArgument("region_size must be a power of two in 4096..1GiB");
      const uint64_t regions = (e->volume->size() + region - 1) / region;
      const uint64_t first = first_p.value_or(0);
      if (first >= regions) return Status::InvalidArgument("first is past the end of the volume");
      const uint64_t count = count_p.value_or(std::min<uint64_t>(regions - first, proto::kMaxHashes));
      if (count == 0 || count > proto::kMaxHashes || count > regions - first) {
        return Status::InvalidArgument("count must be 1.." + std::to_string(std::min<uint64_t>(regions - first, proto::kMaxHashes)));
      }
      const uint64_t at = at_p.value_or(0);
      const auto n = e->volume->fence().numbering();
      CDP_ASSIGN_OR_RETURN(auto h,
                           e->volume->Digests({uint32_t(region), first, uint32_t(count), 0, n.History(at), false}));
      const uint64_t seq = n.Wire(h.seq);
      if (h.status == proto::HashStatus::kBehind) {
        return http::Response::Error(409, "replica has applied up to " + std::to_string(seq) + ", not yet " + std::to_string(at));
      }
      if (h.status == proto::HashStatus::kPointGone) {
        return http::Response::Error(410, "sequence " + std::to_string(at) + " is outside the retained history");
      }
      json::array hs;
      for (const auto& x : h.digests) hs.push_back(json::value(HashToHex(x)));
      return http::Response::Json(200, json::object{{"tenant", e->tenant},
                                                    {"volume", e->name},
                                                    {"region_size", region},
                                                    {"first", first},
                                                    {"seq", seq},
                                                    {"applied_seq", n.Wire(e->volume->applied_seq())},
                                                    {"hashes", hs}});
    });
  });
  // Failover (`cdpctl failover`): promote, undo, commit. Idempotent; see
  // MasterTarget::Failover.
  http->Route("POST", "/v1/failover", [this](const http::Request& r) {
    return WithParams(r, {"tenant", "volume", "point", "tag", "seq", "time"},
                      [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      int64_t id = 0;
      CDP_ASSIGN_OR_RETURN(uint64_t seq, PointSeq(*e, p, &id));
      CDP_ASSIGN_OR_RETURN(auto out, mt->Failover(e->tenant, e->name, seq, id));
      if (out.changed) log->warn("{} failed over to sequence {} by the operator", log::Where{e->name, "control", seq}, seq);
      json::object j = VolumeJson(*e);
      j["changed"] = out.changed;
      j["export"] = out.export_name;
      j["port"] = nbd ? nbd->port() : 0;
      j["tls"] = o.nbd_tls;
      return http::Response::Json(200, j);
    });
  });
  http->Route("POST", "/v1/failover/undo", [this](const http::Request& r) {
    return WithParams(r, {"tenant", "volume"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      CDP_ASSIGN_OR_RETURN(bool changed, mt->UndoFailover(e->tenant, e->name));
      json::object j = VolumeJson(*e);
      j["changed"] = changed;
      return http::Response::Json(200, j);
    });
  });
  http->Route("POST", "/v1/failover/commit", [this](const http::Request& r) {
    return WithParams(r, {"tenant", "volume"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      CDP_ASSIGN_OR_RETURN(bool changed, mt->CommitFailover(e->tenant, e->name));
      json::object j = VolumeJson(*e);
      j["changed"] = changed;
      return http::Response::Json(200, j);
    });
  });
  // Failback (`cdpctl failback`): start, quiesce, finish; each idempotent
  // (MasterTarget::StartFailback ...). The pull between them is the agent's.
  auto failback_step = [this](const char* path, auto step) {
    http->Route("POST", path, [this, step](const http::Request& r) {
      return WithParams(r, {"tenant", "volume"}, [&](const http::Params& p) -> Result<http::Response> {
        CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
        CDP_ASSIGN_OR_RETURN(json::object extra, step(*e));
        json::object j = VolumeJson(*e);
        for (auto& kv : extra) j[kv.key()] = kv.value();
        return http::Response::Json(200, j);
      });
    });
  };
  failback_step("/v1/failback/start", [this](VolEntry& e) -> Result<json::object> {
    CDP_ASSIGN_OR_RETURN(bool changed, mt->StartFailback(e.tenant, e.name));
    if (changed) log->warn("{} failback started by the operator", log::Where{e.name, "control", 0});
    return json::object{{"changed", changed}};
  });
  failback_step("/v1/failback/quiesce", [this](VolEntry& e) -> Result<json::object> {
    CDP_ASSIGN_OR_RETURN(bool changed, mt->QuiesceFailback(e.tenant, e.name));
    return json::object{{"changed", changed}};
  });
  failback_step("/v1/failback/finish", [this](VolEntry& e) -> Result<json::object> {
    CDP_ASSIGN_OR_RETURN(auto out, mt->FinishFailback(e.tenant, e.name));
    return json::object{{"changed", out.changed}, {"blocks", out.blocks}, {"failback_seq", out.seq}};
  });
  // Ransomware anomalies the agents saw: a tenant lists its own; only the
  // admin acknowledges one (which releases its suspect-clean point's hold).
  http->Route("GET", "/v1/anomalies", [this](const http::Request& r) {
    return WithParams(r, {"tenant", "volume"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      const uint64_t now = o.clock->WallMicros();
      json::array list;
      for (const AnomalyEvent& a : e->volume->points().Anomalies()) {
        list.push_back(json::object{{"id", a.id},
                                    {"seq", a.seq},
                                    {"clean_seq", a.clean_seq},
                                    {"point", a.point_id},
                                    {"time_us", a.time_us},
                                    {"message", a.message},
                                    {"acknowledged", a.acknowledged},
                                    {"held", a.Holds(now)},
                                    {"hold_until_us", a.hold_until_us}});
      }
      return http::Response::Json(200, json::object{{"tenant", e->tenant}, {"volume", e->name}, {"anomalies", list}});
    });
  });
  http->Route("POST", "/v1/anomalies/ack", [this](const http::Request& r) {
    if (!r.caller.admin) return NeedsAdmin(r);
    return WithParams(r, {"tenant", "volume", "id"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      CDP_ASSIGN_OR_RETURN(std::optional<int64_t> id, p.Int("id"));
      if (!id) return Status::InvalidArgument("missing 'id'");
      CDP_ASSIGN_OR_RETURN(bool changed, e->volume->AcknowledgeAnomaly(*id));
      return http::Response::Json(200, json::object{{"tenant", e->tenant}, {"volume", e->name}, {"changed", changed}});
    });
  });
  // Re-protect (an operator's command, never a peer's): the next VolumeOpen
  // with the next generation is accepted; every recovery point is kept.
  http->Route("POST", "/v1/reprotect", [this](const http::Request& r) {
    return WithParams(r, {"tenant", "volume"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto e, ResolveParams(r, p));
      CDP_ASSIGN_OR_RETURN(uint64_t gen, e->volume->ArmReprotect());
      return http::Response::Json(200, json::object{{"tenant", e->tenant},
                                                    {"volume", e->name},
                                                    {"generation", gen},
                                                    {"points", e->volume->points().List().size()}});
    });
  });
  http->Route("POST", "/v1/retention", [this](const http::Request& r) {
    return WithParams(r, {}, [&](const http::Params&) -> Result<http::Response> {
      return http::Response::Json(200, json::object{{"volumes", RunRetention(r.caller.admin ? "" : r.caller.tenant)}});
    });
  });
  // Issued tokens (common/http/control_token.h): the admin only.
  http->Route("GET", "/v1/tokens", [this](const http::Request& r) {
    if (!r.caller.admin) return NeedsAdmin(r);
    json::object counts;
    json::array list;
    if (control_tokens) {
      for (const auto& [t, n] : control_tokens->TenantTokenCounts()) counts[t] = n;
      for (const TokenInfo& t : control_tokens->List()) list.push_back(TokenJson(t));
    }
    return http::Response::Json(200, json::object{{"tenants", counts}, {"tokens", list}});
  });
  http->Route("POST", "/v1/tokens", [this](const http::Request& r) {
    if (!r.caller.admin) return NeedsAdmin(r);
    return WithParams(r, {"tenant", "scope", "expires_seconds"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto tenant, p.String("tenant"));
      CDP_ASSIGN_OR_RETURN(auto scope_text, p.String("scope"));
      CDP_ASSIGN_OR_RETURN(auto lifetime, p.Uint("expires_seconds"));
      CDP_ASSIGN_OR_RETURN(TokenScope scope, ParseTokenScope(scope_text.value_or("tenant")));
      if (scope == TokenScope::kAdmin) {
        if (tenant) return Status::InvalidArgument("an admin-scoped token has no tenant: drop 'tenant'");
      } else if (!tenant || !o.tenants.count(*tenant)) {
        return Status::InvalidArgument("give 'tenant', one of the tenants configured at this master target");
      }
      if (!control_tokens) return Status::InvalidArgument("control_auth is off at this master target: no tokens");
      CDP_ASSIGN_OR_RETURN(IssuedToken t, control_tokens->Issue(scope, tenant.value_or(""),
                                                                lifetime.value_or(kDefaultTokenLifetimeSeconds)));
      log->warn("control token {} issued: scope {}{}, expires in {}s", t.info.id, TokenScopeName(scope),
                tenant ? " tenant " + *tenant : std::string(), (t.info.expires_us - t.info.created_us) / 1'000'000);
      json::object j = TokenJson(t.info);
      j["token"] = t.token;
      return http::Response::Json(200, j);
    });
  });
  // {"id": ID} revokes one token (with "tenant": only a token of T); {"tenant": T} every token of T.
  http->Route("POST", "/v1/tokens/revoke", [this](const http::Request& r) {
    if (!r.caller.admin) return NeedsAdmin(r);
    return WithParams(r, {"tenant", "id"}, [&](const http::Params& p) -> Result<http::Response> {
      CDP_ASSIGN_OR_RETURN(auto tenant, p.String("tenant"));
      CDP_ASSIGN_OR_RETURN(auto id, p.String("id"));
      if (!tenant && !id) return Status::InvalidArgument("give 'id' (one token) or 'tenant' (all of its tokens)");
      if (!control_tokens) return Status::InvalidArgument("control_auth is off at this master target: no tokens");
      if (id) {
        // With 'tenant' too, only if the token is that tenant's.
        CDP_ASSIGN_OR_RETURN(TokenInfo t, control_tokens->Revoke(*id, tenant.value_or("")));
        log->warn("control token {} ({} {}) revoked", t.id, TokenScopeName(t.scope), t.tenant.empty() ? "-" : t.tenant);
        return http::Response::Json(200, json::object{{"id", t.id}, {"tenant", t.tenant}, {"revoked", 1}});
      }
      CDP_ASSIGN_OR_RETURN(size_t n, control_tokens->RevokeTenantTokens(*tenant));
      log->warn("{} control token(s) of tenant {} revoked", n, *tenant);
      return http::Response::Json(200, json::object{{"tenant", *tenant}, {"revoked", n}});
    });
  });
}

}  // namespace cdp::mt
