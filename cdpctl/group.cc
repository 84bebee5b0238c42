// SPDX-License-Identifier: Apache-2.0
// cdpctl group ...: consistency groups across agents (docs/groups.md).
// Groups live at the daemon that coordinates them
// (common/wire/group_coordinator.h): the process server their members ship
// through, or the master target (`group create --at mt`) for members behind
// several process servers. create asks the one named; remove, point and tag
// --group ask the master target when it coordinates the group, else the
// process server. Their points are the markers group.<G>.<round>.<members> in the member
// volumes' histories at the master target, which lists them (GET
// /v1/groups): `points` and recovery by group ask the master target only, so
// they work with the protected site gone. Recovery by group runs the
// single-volume step of every member at its marker's sequence.
#include <algorithm>
#include <boost/json.hpp>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <map>
#include <sstream>

#include "cdpctl/commands.h"
#include "common/env/env.h"
#include "common/http/control_token.h"

namespace cdp::ctl {

namespace {

struct GroupPoint {
  uint64_t round = 0;
  std::string marker;
  std::string tag;  // an application-consistent point's (cdpctl tag --group)
  std::vector<std::pair<std::string, uint64_t>> seqs;  // volume -> its marker's sequence
  double time_us = 0;                                   // the newest member's
};

bool NeedTenant(const Options& o, std::ostream& err) {
  if (!o.tenant.empty()) return true;
  err << "cdpctl: group commands need --tenant T\n";
  return false;
}

// The group's complete points, oldest first, as the master target holds
// them (its /v1/groups: the markers every member volume holds). The process
// server is not asked: at a disaster the protected site may be gone.
bool Points(const Options& o, const std::string& group, std::vector<GroupPoint>* out, uint64_t* partial,
            std::ostream& err) {
  Call c = Http(o, o.mt, "GET", "/v1/groups?group=" + Q(group) + TenantParam(o));
  if (!c.reached || c.status != 200) return Fail(err, "points of group " + group, c), false;
  *partial = 0;
  const json::value* gs = c.body.as_object().if_contains("groups");
  if (gs == nullptr || !gs->is_array()) return true;
  for (const auto& gv : gs->as_array()) {
    const json::object& g = gv.as_object();
    if (Str(g, "name") != group) continue;
    if (const json::value* pa = g.if_contains("partial"); pa && pa->is_array()) *partial += pa->as_array().size();
    for (const auto& pv : g.at("points").as_array()) {
      const json::object& p = pv.as_object();
      GroupPoint gp;
      gp.round = json::value_to<uint64_t>(p.at("round"));
      gp.marker = Str(p, "marker");
      gp.tag = Str(p, "tag");
      gp.time_us = Num(p, "time_us");
      for (const auto& [v, s] : p.at("seqs").as_object()) gp.seqs.emplace_back(v, json::value_to<uint64_t>(s));
      out->push_back(std::move(gp));
    }
  }
  std::sort(out->begin(), out->end(), [](const GroupPoint& a, const GroupPoint& b) { return a.round < b.round; });
  return true;
}

// POINT of a group: "latest", a round number, a marker, or a group tag's
// name (its newest point).
const GroupPoint* Resolve(const std::vector<GroupPoint>& pts, const std::string& point) {
  if (pts.empty()) return nullptr;
  if (point == "latest") return &pts.back();
  for (const GroupPoint& g : pts)
    if (g.marker == point || std::to_string(g.round) == point) return &g;
  for (auto it = pts.rbegin(); it != pts.rend(); ++it)
    if (it->tag == point) return &*it;
  return nullptr;
}

json::object PointJson(const GroupPoint& g) {
  json::object seqs;
  for (const auto& [v, s] : g.seqs) seqs[v] = s;
  json::object o{{"round", g.round}, {"marker", g.marker}, {"time_us", g.time_us}, {"seqs", std::move(seqs)}};
  o["consistency"] = g.tag.empty() ? "crash" : "application";
  if (!g.tag.empty()) o["tag"] = g.tag;
  return o;
}

// The groups a coordinator lists: the process server's "groups", the master
// target's "coordinated" (its "groups" are the points it holds).
const json::array* Coordinated(const Call& c, bool mt) {
  if (!c.reached || c.status != 200 || !c.body.is_object()) return nullptr;
  const json::value* gs = c.body.as_object().if_contains(mt ? "coordinated" : "groups");
  return gs != nullptr && gs->is_array() ? &gs->as_array() : nullptr;
}

// Group `name` of the caller's tenant in a coordinator's list, or null.
const json::object* Find(const json::array* groups, const Options& o, const std::string& name) {
  if (groups == nullptr) return nullptr;
  for (const auto& gv : *groups)
    if (gv.is_object() && Str(gv.as_object(), "name") == name && Str(gv.as_object(), "tenant") == o.tenant)
      return &gv.as_object();
  return nullptr;
}

// The daemon that coordinates `group`: the master target when it lists the
// group among those it coordinates, else the process server.
bool AtMasterTarget(const Options& o, const std::string& group) {
  Call c = Http(o, o.mt, "GET", "/v1/groups?group=" + Q(group) + TenantParam(o));
  return Find(Coordinated(c, true), o, group) != nullptr;
}

int Create(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  // group create G --member A:V [--member ...] [--interval MS] [--hold-max MS] [--hold-timeout MS] [--at ps|mt]
  json::object b{{"tenant", o.tenant}, {"name", args[2]}};
  std::string members;
  bool at_mt = false;
  for (size_t i = 3; i < args.size(); i += 2) {
    if (i + 1 >= args.size()) return Usage({args[i]}, err);
    const std::string& v = args[i + 1];
    auto ms = [&](const char* key) {
      uint64_t n = 0;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || p != v.data() + v.size()) return false;
      b[key] = n;
      return true;
    };
    if (args[i] == "--member") members += (members.empty() ? "" : ",") + v;
    else if (args[i] == "--at" && (v == "mt" || v == "ps")) at_mt = v == "mt";
    else if (args[i] == "--interval" ? !ms("interval_ms")
             : args[i] == "--hold-max" ? !ms("hold_max_ms")
             : args[i] == "--hold-timeout" ? !ms("hold_timeout_ms")
                                            : true) {
      err << "cdpctl: group create: bad option " << args[i] << " " << v
          << " (milliseconds are whole numbers; --at is ps or mt)\n";
      return 2;
    }
  }
  if (members.empty()) {
    err << "cdpctl: group create G --member AGENT:VOLUME [--member ...] [--interval MS] [--hold-max MS] "
           "[--hold-timeout MS] [--at ps|mt]\n";
    return 2;
  }
  b["members"] = members;
  Call c = Http(o, at_mt ? o.mt : o.ps, "POST", "/v1/groups", b);
  if (!c.reached || c.status != 200) return Fail(err, "group create " + args[2], c);
  if (o.json) out << json::serialize(c.body) << "\n";
  else
    out << "group " << args[2] << " created at the " << (at_mt ? "master target " : "process server ")
        << Where(at_mt ? o.mt : o.ps) << "\n";
  return 0;
}

// Both coordinators' groups: the process server's, then the master target's.
int List(const Options& o, std::ostream& out, std::ostream& err) {
  Call p = Http(o, o.ps, "GET", "/v1/groups");
  Call m = Http(o, o.mt, "GET", "/v1/groups" + std::string(o.tenant.empty() ? "" : "?tenant=" + Q(o.tenant)));
  const json::array* at_ps = Coordinated(p, false);
  const json::array* at_mt = Coordinated(m, true);
  if (at_ps == nullptr && at_mt == nullptr) return Fail(err, "group list", p.reached ? m : p);
  if (o.json) {
    out << json::serialize(json::object{{"process_server", at_ps ? json::value(*at_ps) : json::value(nullptr)},
                                        {"master_target", at_mt ? json::value(*at_mt) : json::value(nullptr)}})
        << "\n";
    return 0;
  }
  if (at_ps != nullptr) {
    out << "coordinated at the process server " << Where(o.ps) << "\n";
    GroupLines(p.body, out);
  }
  if (at_mt != nullptr) {
    out << "coordinated at the master target " << Where(o.mt) << "\n";
    GroupLines(json::object{{"groups", *at_mt}}, out);
  }
  return 0;
}

}  // namespace

void GroupLines(const json::value& ps_body, std::ostream& out) {
  const json::object* b = ps_body.if_object();
  const json::value* gs = b ? b->if_contains("groups") : nullptr;
  if (gs == nullptr || !gs->is_array() || gs->as_array().empty()) return;
  char line[256];
  std::snprintf(line, sizeof line, "  %-16s %-10s %7s %9s %8s %10s  %s\n", "GROUP", "TENANT", "MEMBERS", "INTERVAL",
                "POINTS", "ABANDONED", "LAST POINT");
  out << line;
  for (const auto& gv : gs->as_array()) {
    const json::object* g = gv.if_object();
    if (g == nullptr) continue;
    std::string last = "-";
    if (const json::value* lp = g->if_contains("last_point"); lp && lp->is_object()) {
      const std::time_t t = std::time_t(Num(lp->as_object(), "unix_us") / 1e6);
      char tb[64];
      std::strftime(tb, sizeof tb, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
      char held[64];
      std::snprintf(held, sizeof held, " (held %.2f ms)", Num(lp->as_object(), "hold_us") / 1000.0);
      last = std::string(tb) + held;
    }
    const json::value* ms = g->if_contains("members");
    std::snprintf(line, sizeof line, "  %-16s %-10s %7zu %8.1fs %8.0f %10.0f  %s\n", Str(*g, "name").c_str(),
                  Str(*g, "tenant").c_str(), ms && ms->is_array() ? ms->as_array().size() : size_t(0),
                  Num(*g, "interval_ms") / 1000.0, Num(*g, "points_made"), Num(*g, "rounds_abandoned"), last.c_str());
    out << line;
    const json::value* up = g->if_contains("connected");
    if (ms && ms->is_array() && up && up->is_array()) {
      for (size_t i = 0; i < ms->as_array().size() && i < up->as_array().size(); ++i) {
        const json::value& u = up->as_array()[i];
        if (u.is_bool() && !u.as_bool() && ms->as_array()[i].is_string())
          out << "    MEMBER NOT CONNECTED: " << std::string(ms->as_array()[i].as_string()) << "\n";
      }
    }
    if (const json::value* la = g->if_contains("last_abandoned"); la && la->is_object())
      out << "    LAST ROUND ABANDONED: " << Str(la->as_object(), "why") << "\n";
  }
}

void MtGroupLines(const json::value& mt_groups, std::ostream& out) {
  const json::object* b = mt_groups.if_object();
  const json::value* gs = b ? b->if_contains("groups") : nullptr;
  if (gs == nullptr || !gs->is_array()) return;
  for (const auto& gv : gs->as_array()) {
    const json::object* g = gv.if_object();
    if (g == nullptr) continue;
    const json::value* pts = g->if_contains("points");
    const json::value* pa = g->if_contains("partial");
    const size_t n = pts && pts->is_array() ? pts->as_array().size() : 0;
    const size_t partial = pa && pa->is_array() ? pa->as_array().size() : 0;
    out << "  group " << Str(*g, "name") << " (tenant " << Str(*g, "tenant") << "): " << n << " recoverable point(s)";
    if (n > 0) {
      const json::object& last = pts->as_array().back().as_object();
      const std::time_t t = std::time_t(Num(last, "time_us") / 1e6);
      char tb[64];
      std::strftime(tb, sizeof tb, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
      out << ", last " << Str(last, "marker") << " at " << tb << " UTC";
    }
    out << "\n";
    if (partial > 0)
      out << "    PARTIAL: " << partial << " group point(s) some member volume lacks (not recoverable as a group)\n";
  }
}

int GroupCommand(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const std::string sub = args.size() >= 2 ? args[1] : "";
  if (sub == "list" && args.size() == 2) return List(o, out, err);
  if (args.size() < 3) return Usage(args, err);
  if (!NeedTenant(o, err)) return 2;
  const std::string& group = args[2];
  if (sub == "create") return Create(o, args, out, err);
  if (sub == "remove" && args.size() == 3) {
    Call c = Http(o, AtMasterTarget(o, group) ? o.mt : o.ps, "POST", "/v1/groups/remove", json::object{{"tenant", o.tenant}, {"name", group}});
    if (!c.reached || c.status != 200) return Fail(err, "group remove " + group, c);
    out << (o.json ? json::serialize(c.body) : "group " + group + " removed") << "\n";
    return 0;
  }
  if (sub == "point" && args.size() == 3) {
    Call c = Http(o, AtMasterTarget(o, group) ? o.mt : o.ps, "POST", "/v1/groups/point",
                  json::object{{"tenant", o.tenant}, {"name", group}});
    if (!c.reached || c.status != 200) return Fail(err, "group point " + group, c);
    if (o.json) out << json::serialize(c.body) << "\n";
    else out << "group point " << Str(c.body.as_object(), "marker") << " made\n";
    return 0;
  }
  if (sub == "points" && args.size() == 3) {
    std::vector<GroupPoint> pts;
    uint64_t partial = 0;
    if (!Points(o, group, &pts, &partial, err)) return 1;
    if (o.json) {
      json::array a;
      for (const GroupPoint& g : pts) a.push_back(PointJson(g));
      out << json::serialize(json::object{{"group", group}, {"points", std::move(a)}, {"partial", partial}}) << "\n";
      return 0;
    }
    out << "group " << group << ": " << pts.size() << " point(s) held by every member volume at the master target"
        << (partial ? ", " + std::to_string(partial) + " partial (a member lacks the marker: not recoverable)" : "")
        << "\n";
    for (const GroupPoint& g : pts) {
      out << "  " << g.round;
      if (!g.tag.empty()) out << "  tag " << g.tag << " (application-consistent)";
      for (const auto& [v, s] : g.seqs) out << "  " << v << "@seq:" << s;
      out << "\n";
    }
    return 0;
  }
  return Usage(args, err);
}

int GroupTag(const Options& o, const std::string& group, const std::string& tag, const std::string& freeze_ms,
             std::ostream& out, std::ostream& err) {
  if (!NeedTenant(o, err)) return 2;
  json::object b{{"tenant", o.tenant}, {"name", group}, {"tag", tag}};
  uint64_t window = 10'000;  // the PS's default freeze window (proto::kMaxGroupHoldMs)
  if (!freeze_ms.empty()) {
    uint64_t ms = 0;
    auto [p, ec] = std::from_chars(freeze_ms.data(), freeze_ms.data() + freeze_ms.size(), ms);
    if (ec != std::errc() || p != freeze_ms.data() + freeze_ms.size()) {
      err << "cdpctl: tag --group: --freeze-ms takes whole milliseconds\n";
      return 2;
    }
    b["freeze_ms"] = ms;
    window = ms;
  }
  Options q = o;  // the answer comes after every member froze: wait for the window
  q.timeout_ms = std::max<int>(o.timeout_ms, int(std::min<uint64_t>(window, 60'000)) + 5'000);
  // Every member agent runs its freeze hook, then the group is held and
  // marked, then every agent thaws: one application-consistent point.
  Call c = Http(q, AtMasterTarget(o, group) ? o.mt : o.ps, "POST", "/v1/groups/point", b);
  if (!c.reached || c.status != 200) return Fail(err, "tag --group " + group + " " + tag, c);
  if (o.json) out << json::serialize(c.body) << "\n";
  else
    out << "group " << group << " tagged " << tag << " (every member frozen): marker " << Str(c.body.as_object(), "marker")
        << "\n";
  return 0;
}

int GroupFailback(const Options& o, const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  // failback --group G --member-agent AGENT=HOST:PORT[@TOKEN_FILE] ... [--passes N]
  if (!NeedTenant(o, err)) return 2;
  const std::string& group = args[2];
  std::map<std::string, Endpoint> agents;  // by client_id
  int passes = 5;  // as failback VOLUME
  for (size_t i = 3; i < args.size(); i += 2) {
    if (i + 1 >= args.size()) return Usage({args[i]}, err);
    const std::string& v = args[i + 1];
    if (args[i] == "--passes") {
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), passes);
      if (ec != std::errc() || p != v.data() + v.size() || passes < 1) {
        err << "cdpctl: --passes takes a whole number >= 1\n";
        return 2;
      }
      continue;
    }
    if (args[i] != "--member-agent") return Usage({args[i]}, err);
    const size_t eq = v.find('='), at = v.find('@', eq == std::string::npos ? 0 : eq);
    Endpoint ep = o.agent;
    if (eq == std::string::npos || !ParseEndpoint(v.substr(eq + 1, at == std::string::npos ? std::string::npos
                                                                                          : at - eq - 1),
                                                  &ep)) {
      err << "cdpctl: --member-agent wants AGENT=HOST:PORT[@TOKEN_FILE] (AGENT: the agent's client_id)\n";
      return 2;
    }
    ep.token = o.agent.token;
    if (at != std::string::npos) {
      auto t = ReadTokenFile(DefaultEnv(), v.substr(at + 1));
      if (!t.ok()) {
        err << "cdpctl: --member-agent " << v.substr(0, eq) << ": " << t.status().ToString() << "\n";
        return 2;
      }
      ep.token = *t;
    }
    agents[v.substr(0, eq)] = ep;
  }
  // The members, from the daemon that coordinates the group (the master
  // target, or the process server: the original site is back, failback
  // needs it anyway).
  const bool at_mt = AtMasterTarget(o, group);
  Call gc = Http(o, at_mt ? o.mt : o.ps, "GET", at_mt ? "/v1/groups?group=" + Q(group) + TenantParam(o) : "/v1/groups");
  if (!gc.reached || gc.status != 200) return Fail(err, "failback --group " + group + ": the group's members", gc);
  std::vector<std::pair<std::string, std::string>> members;  // (agent, volume)
  if (const json::object* g = Find(Coordinated(gc, at_mt), o, group)) {
    for (const auto& m : g->at("members").as_array()) {
      const std::string text(m.as_string());
      members.emplace_back(text.substr(0, text.find(':')), text.substr(text.find(':') + 1));
    }
  }
  if (members.empty()) {
    err << "cdpctl: failback --group: no group " << group << " of tenant " << o.tenant << " at the process server "
        << Where(o.ps) << " or the master target " << Where(o.mt) << "\n";
    return 1;
  }
  // The plan, per member: its agent, and its volume at the master target.
  Call vc = Http(o, o.mt, "GET", "/v1/volumes");
  if (!vc.reached || vc.status != 200) return Fail(err, "failback --group " + group + ": the volumes", vc);
  json::array plan;
  std::string missing;
  for (const auto& [agent, volume] : members) {
    json::object p{{"agent", agent}, {"volume", volume}};
    auto a = agents.find(agent);
    if (a == agents.end()) missing += (missing.empty() ? "" : ", ") + agent;
    else p["agent_at"] = Where(a->second);
    for (const auto& vv : vc.body.as_object().at("volumes").as_array()) {
      const json::object& v = vv.as_object();
      if (Str(v, "tenant") != o.tenant || Str(v, "volume") != volume) continue;
      p["state"] = Str(v, "state");
      if (const json::value* f = v.if_contains("failover"); f && f->is_object()) p["failover"] = *f;
    }
    plan.push_back(std::move(p));
  }
  if (!missing.empty()) {
    err << "cdpctl: failback --group " << group << ": give --member-agent AGENT=HOST:PORT[@TOKEN_FILE] for " << missing
        << "\n";
    return 2;
  }
  if (!o.json) {
    out << "failback of group " << group << ": " << members.size() << " member(s), one after another\n";
    for (const auto& pv : plan) {
      const json::object& p = pv.as_object();
      out << "  " << Str(p, "agent") << ":" << Str(p, "volume") << " at agent " << Str(p, "agent_at")
          << ", master target: " << (p.contains("state") ? Str(p, "state") : std::string("no such volume"));
      if (const json::value* f = p.if_contains("failover"); f && f->is_object())
        out << ", failed over at sequence " << uint64_t(Num(f->as_object(), "history_seq")) << ", "
            << uint64_t(Num(f->as_object(), "provider_written_blocks")) << " block(s) written at the provider";
      out << "\n";
    }
  }
  // Each member's single-volume failback at its own agent. Every step is
  // idempotent: after a failure, the same command finishes the job.
  json::array results;
  std::string done;
  for (const auto& [agent, volume] : members) {
    Options q = o;
    q.agent = agents.at(agent);
    std::ostringstream one, one_err;
    const int r = Failback(q, volume, passes, one, one_err);
    err << one_err.str();
    if (o.json) {
      boost::system::error_code ec;
      json::value v = json::parse(one.str(), ec);
      results.push_back(json::object{{"agent", agent}, {"volume", volume}, {"exit", r},
                                     {"result", ec ? json::value(json::string(one.str())) : std::move(v)}});
    } else {
      out << "member " << agent << ":" << volume << ":\n" << one.str();
    }
    if (r != 0) {
      err << "cdpctl: failback --group " << group << " stopped at member " << agent << ":" << volume
          << (done.empty() ? "" : " (failed back: " + done + ")") << "; run the same command again to finish\n";
      if (o.json) out << json::serialize(json::object{{"group", group}, {"plan", plan}, {"members", results}}) << "\n";
      return r;
    }
    done += (done.empty() ? "" : ", ") + agent + ":" + volume;
  }
  if (o.json) out << json::serialize(json::object{{"group", group}, {"plan", plan}, {"members", results}}) << "\n";
  else out << "group " << group << ": every member failed back; next: cdpctl reprotect VOLUME for each\n";
  return 0;
}

int GroupRecovery(const Options& o, const std::string& action, const std::string& group, const std::string& point,
                  std::ostream& out, std::ostream& err) {
  if (!NeedTenant(o, err)) return 2;
  std::vector<GroupPoint> pts;
  uint64_t partial = 0;
  if (!Points(o, group, &pts, &partial, err)) return 1;
  const GroupPoint* g = Resolve(pts, point);
  if (g == nullptr) {
    err << "cdpctl: group " << group << " has no point '" << point
        << "' held by every member volume at the master target (cdpctl group points " << group << ")\n";
    return 1;
  }
  // Each member's single-volume step at its marker: the same cut everywhere.
  int rc = 0;
  json::array results;
  for (const auto& [volume, seq] : g->seqs) {
    std::ostringstream one, one_err;
    Options q = o;
    int r = 0;
    if (action == "failover") r = Failover(q, volume, "--to", "seq:" + std::to_string(seq), one, one_err);
    else if (action == "rollback") r = Rollback(q, volume, "seq:" + std::to_string(seq), false, one, one_err);
    else r = Export(q, volume + "@seq:" + std::to_string(seq), false, one, one_err);
    rc = std::max(rc, r);
    err << one_err.str();
    if (o.json) {
      boost::system::error_code ec;
      json::value v = json::parse(one.str(), ec);
      json::value result = ec ? json::value(json::string(one.str())) : std::move(v);
      results.push_back(json::object{{"volume", volume}, {"seq", seq}, {"exit", r}, {"result", std::move(result)}});
    } else {
      out << "member " << volume << " (sequence " << seq << "):\n" << one.str();
    }
  }
  if (o.json) {
    out << json::serialize(json::object{{"group", group}, {"point", PointJson(*g)}, {"members", std::move(results)}})
        << "\n";
  }
  return rc;
}

}  // namespace cdp::ctl
