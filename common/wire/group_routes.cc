// SPDX-License-Identifier: Apache-2.0
#include "common/wire/group_routes.h"

#include <boost/json.hpp>

namespace cdp {

namespace json = boost::json;

namespace {

// {"tenant": T, "name": G}: the group a request names, if the caller sees T.
Result<std::pair<std::string, std::string>> GroupNamed(const http::Request& r, const http::Params& p) {
  CDP_ASSIGN_OR_RETURN(std::optional<std::string> tenant, p.String("tenant"));
  CDP_ASSIGN_OR_RETURN(std::optional<std::string> name, p.String("name"));
  if (!tenant || !name) return Status::InvalidArgument("body must be {\"tenant\", \"name\"}");
  if (!r.caller.Sees(*tenant)) return Status::PermissionDenied("tenant " + *tenant + " is not the caller's");
  return std::pair{*tenant, *name};
}

Result<GroupSpec> SpecAsked(const http::Request& r) {
  CDP_ASSIGN_OR_RETURN(http::Params p, http::Params::Of(r, {"tenant", "name", "members", "interval_ms", "hold_max_ms",
                                                            "hold_timeout_ms"}));
  CDP_ASSIGN_OR_RETURN(auto named, GroupNamed(r, p));
  CDP_ASSIGN_OR_RETURN(std::optional<std::string> members, p.String("members"));
  CDP_ASSIGN_OR_RETURN(std::optional<uint64_t> interval, p.Uint("interval_ms"));
  CDP_ASSIGN_OR_RETURN(std::optional<uint64_t> hold_max, p.Uint("hold_max_ms"));
  CDP_ASSIGN_OR_RETURN(std::optional<uint64_t> hold_timeout, p.Uint("hold_timeout_ms"));
  if (!members) return Status::InvalidArgument("body must be {\"tenant\", \"name\", \"members\": \"AGENT:VOLUME,...\"}");
  GroupSpec g;
  g.tenant = named.first;
  g.name = named.second;
  const std::string& all = *members;
  for (size_t at = 0; at <= all.size();) {
    size_t comma = all.find(',', at);
    if (comma == std::string::npos) comma = all.size();
    CDP_ASSIGN_OR_RETURN(GroupMember m, ParseMember(all.substr(at, comma - at)));
    g.members.push_back(std::move(m));
    at = comma + 1;
  }
  if (interval) g.interval_ms = *interval;
  if (hold_max) g.hold_max_ms = *hold_max;
  if (hold_timeout) g.hold_timeout_ms = *hold_timeout;
  return g;
}

// A point on demand: the group, and for an application-consistent one its
// tag and freeze window.
struct PointAsked {
  std::string tenant, name, tag;
  uint64_t freeze_ms = proto::kMaxGroupHoldMs;
};

Result<PointAsked> PointOf(const http::Request& r) {
  CDP_ASSIGN_OR_RETURN(http::Params p, http::Params::Of(r, {"tenant", "name", "tag", "freeze_ms"}));
  CDP_ASSIGN_OR_RETURN(auto g, GroupNamed(r, p));
  CDP_ASSIGN_OR_RETURN(std::optional<std::string> tag, p.String("tag"));
  CDP_ASSIGN_OR_RETURN(std::optional<uint64_t> freeze_ms, p.Uint("freeze_ms"));
  if (freeze_ms && !tag) return Status::InvalidArgument("freeze_ms is for a tag");
  return PointAsked{g.first, g.second, tag.value_or(""), freeze_ms.value_or(proto::kMaxGroupHoldMs)};
}

}  // namespace

void AddGroupRoutes(http::Server& server, GroupCoordinator& groups) {
  server.Route("POST", "/v1/groups", [&groups](const http::Request& r) {
    auto g = SpecAsked(r);
    if (!g.ok()) return http::ErrorResponse(g.status());
    if (Status s = groups.Put(*g); !s.ok()) return http::ErrorResponse(s);
    return http::Response::Json(200, json::object{{"group", g->name}, {"members", g->members.size()}});
  });
  server.Route("POST", "/v1/groups/remove", [&groups](const http::Request& r) {
    auto p = http::Params::Of(r, {"tenant", "name"});
    if (!p.ok()) return http::ErrorResponse(p.status());
    auto g = GroupNamed(r, *p);
    if (!g.ok()) return http::ErrorResponse(g.status());
    if (Status s = groups.Remove(g->first, g->second); !s.ok()) return http::ErrorResponse(s);
    return http::Response::Json(200, json::object{{"removed", g->second}});
  });
  server.Route("POST", "/v1/groups/point", [&groups](const http::Request& r) {
    auto g = PointOf(r);
    if (!g.ok()) return http::ErrorResponse(g.status());
    auto out = groups.RunRound(g->tenant, g->name, g->tag, g->freeze_ms);
    if (!out.ok()) return http::ErrorResponse(out.status());
    if (!out->made) return http::Response::Error(409, "group round abandoned: " + out->why);
    return http::Response::Json(200, json::object{{"round", out->round}, {"marker", out->marker},
                                                  {"hold_us", out->hold_us}});
  });
}

}  // namespace cdp
