// SPDX-License-Identifier: Apache-2.0
#include "common/wire/group_coordinator.h"

#include <algorithm>
#include <boost/json.hpp>
#include <set>

#include "common/base/log.h"
#include "common/base/names.h"

namespace cdp {

namespace json = boost::json;

namespace {

uint64_t WallMicros() {
  return uint64_t(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

std::string Key(const std::string& tenant, const std::string& name) { return tenant + "/" + name; }

json::object SpecJson(const GroupSpec& g) {
  json::array members;
  for (const GroupMember& m : g.members) members.push_back(json::string(m.agent + ":" + m.volume));
  return json::object{{"tenant", g.tenant},           {"name", g.name},
                      {"members", std::move(members)}, {"interval_ms", g.interval_ms},
                      {"hold_max_ms", g.hold_max_ms},  {"hold_timeout_ms", g.hold_timeout_ms}};
}

Result<GroupSpec> SpecOf(const json::value& v) {
  const json::object* o = v.if_object();
  if (o == nullptr) return Status::Corruption("a group is not an object");
  GroupSpec g;
  auto str = [&](const char* k, std::string* out) {
    const json::value* f = o->if_contains(k);
    if (f == nullptr || !f->is_string()) return false;
    *out = std::string(f->as_string());
    return true;
  };
  auto num = [&](const char* k, uint64_t* out) {
    const json::value* f = o->if_contains(k);
    if (f == nullptr) return true;  // the default
    if (f->is_uint64()) *out = f->as_uint64();
    else if (f->is_int64() && f->as_int64() >= 0) *out = uint64_t(f->as_int64());
    else return false;
    return true;
  };
  if (!str("tenant", &g.tenant) || !str("name", &g.name)) return Status::Corruption("a group without tenant or name");
  if (!num("interval_ms", &g.interval_ms) || !num("hold_max_ms", &g.hold_max_ms) ||
      !num("hold_timeout_ms", &g.hold_timeout_ms))
    return Status::Corruption("group " + g.name + ": a bad number");
  const json::value* ms = o->if_contains("members");
  if (ms == nullptr || !ms->is_array()) return Status::Corruption("group " + g.name + ": no members");
  for (const json::value& m : ms->as_array()) {
    if (!m.is_string()) return Status::Corruption("group " + g.name + ": a member is not a string");
    CDP_ASSIGN_OR_RETURN(GroupMember gm, ParseMember(std::string(m.as_string())));
    g.members.push_back(std::move(gm));
  }
  CDP_RETURN_IF_ERROR(ValidateGroup(g));
  return g;
}

}  // namespace

Result<GroupMember> ParseMember(const std::string& s) {
  const size_t colon = s.find(':');
  if (colon == std::string::npos) return Status::InvalidArgument("member '" + s + "' is not AGENT:VOLUME");
  GroupMember m{s.substr(0, colon), s.substr(colon + 1)};
  if (!ValidName(m.agent)) return Status::InvalidArgument("member '" + s + "': invalid agent name");
  if (!ValidName(m.volume)) return Status::InvalidArgument("member '" + s + "': invalid volume name");
  return m;
}

Status ValidateGroup(const GroupSpec& g) {
  if (!ValidName(g.tenant)) return Status::InvalidArgument("invalid tenant name '" + g.tenant + "'");
  if (!ValidName(g.name)) return Status::InvalidArgument("invalid group name '" + g.name + "'");
  if (g.members.empty() || g.members.size() > kMaxGroupMembers)
    return Status::InvalidArgument("a group has 1.." + std::to_string(kMaxGroupMembers) + " members");
  std::set<std::pair<std::string, std::string>> seen;
  std::map<std::string, size_t> per_agent;
  for (const GroupMember& m : g.members) {
    if (!seen.insert({m.agent, m.volume}).second)
      return Status::InvalidArgument("member " + m.agent + ":" + m.volume + " named twice");
    if (++per_agent[m.agent] > proto::kMaxGroupVolumes)
      return Status::InvalidArgument("more than " + std::to_string(proto::kMaxGroupVolumes) + " members on agent " +
                                     m.agent);
  }
  if (g.interval_ms < 100) return Status::InvalidArgument("interval_ms must be at least 100");
  if (g.hold_max_ms == 0) return Status::InvalidArgument("hold_max_ms must be at least 1");
  if (g.hold_timeout_ms > proto::kMaxGroupHoldMs)
    return Status::InvalidArgument("hold_timeout_ms must be at most " + std::to_string(proto::kMaxGroupHoldMs));
  if (g.hold_timeout_ms < g.hold_max_ms + kGroupHoldMarginMs)
    return Status::InvalidArgument("hold_timeout_ms must exceed hold_max_ms by at least " +
                                   std::to_string(kGroupHoldMarginMs) + " ms (docs/groups.md)");
  // The marker must be a valid name: group.<name>.<20 digits>.<2 digits>.
  if (GroupMarker(g.name, ~uint64_t(0), g.members.size()).size() > kMaxNameLength)
    return Status::InvalidArgument("group name too long for its markers");
  return Status::OK();
}

GroupCoordinator::GroupCoordinator(Options o) : o_(std::move(o)) {
  if (o_.registry != nullptr) {
    round_seconds_ = o_.registry->GetHistogram(
        o_.metric_prefix + "_group_round_seconds", "Time from a group round's first hold to its last member held (made rounds)",
        {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1});
    made_ = o_.registry->GetCounter(o_.metric_prefix + "_group_points_made_total",
                                    "Group rounds made: a marker queued at every member");
    abandoned_ = o_.registry->GetCounter(o_.metric_prefix + "_group_rounds_abandoned_total",
                                         "Group rounds abandoned: a member not reachable, refusing or holding too late");
  }
}

GroupCoordinator::~GroupCoordinator() { Stop(); }

Status GroupCoordinator::Start() {
  auto bytes = ReadWholeFile(o_.env, o_.path);
  if (bytes.ok()) {
    boost::system::error_code ec;
    json::value v = json::parse(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()), ec);
    if (ec || !v.is_object() || !v.as_object().contains("groups") || !v.at("groups").is_array())
      return Status::Corruption(o_.path + ": not a groups file (docs/formats/groups.md)");
    std::lock_guard<std::mutex> l(mu_);
    for (const json::value& gv : v.at("groups").as_array()) {
      auto g = SpecOf(gv);
      if (!g.ok()) return g.status().WithContext(o_.path);
      Group& slot = groups_[Key(g->tenant, g->name)];
      slot.spec = std::move(*g);
      slot.next = Clock::now() + std::chrono::milliseconds(slot.spec.interval_ms);
    }
  } else if (bytes.status().code() != Code::kNotFound) {
    return bytes.status().WithContext(o_.path);
  }
  scheduler_ = std::thread([this] { Schedule(); });
  relay_thread_ = std::thread([this] { SendAnswers(); });
  return Status::OK();
}

void GroupCoordinator::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  upstream_cv_.notify_all();
  if (scheduler_.joinable()) scheduler_.join();
  if (relay_thread_.joinable()) relay_thread_.join();
}

uint64_t GroupCoordinator::Attach(const std::string& tenant, const std::string& agent, Push push) {
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t h = next_handle_++;
  agents_[h] = Agent{tenant, agent, std::move(push)};
  return h;
}

void GroupCoordinator::Detach(uint64_t handle) {
  std::lock_guard<std::mutex> l(mu_);
  agents_.erase(handle);
}

void GroupCoordinator::Answered(uint64_t handle, const proto::GroupHeld& held) {
  std::lock_guard<std::mutex> l(mu_);
  if (!o_.route_by_volume && (held.round & kUpstreamRound) != 0) {
    auto r = relayed_.find(held.round);
    if (r == relayed_.end() || r->second.answered || !r->second.asked.count(handle)) return;
    if (held.status != proto::GroupHoldStatus::kHeld) {
      AnswerUpstreamLocked(r->second,
                           proto::GroupHeld{held.round, held.status,
                                            "agent " + r->second.asked[handle] + ": " + held.message});
    } else if (++r->second.held == r->second.asked.size()) {
      AnswerUpstreamLocked(r->second, proto::GroupHeld{held.round, proto::GroupHoldStatus::kHeld, ""});
    }
    return;
  }
  if (!round_ || round_->id != held.round) return;  // late: the round is over
  auto it = round_->asked.find(handle);
  if (it == round_->asked.end()) return;
  round_->answers[it->second] = held;
  round_->t_last = Clock::now();
  cv_.notify_all();
}

void GroupCoordinator::Opened(const std::string& tenant, const std::string& volume, const std::string& peer) {
  std::lock_guard<std::mutex> l(mu_);
  openers_[Key(tenant, volume)] = peer;
}

std::string GroupCoordinator::RouteLocked(const std::string& tenant, const GroupMember& m) const {
  if (!o_.route_by_volume) return m.agent;
  auto it = openers_.find(Key(tenant, m.volume));
  return it == openers_.end() ? "" : it->second;
}

void GroupCoordinator::AnswerUpstreamLocked(Relayed& r, proto::GroupHeld held) {
  r.answered = true;
  upstream_.emplace_back(r.answer, proto::Message(std::move(held)));
  upstream_cv_.notify_one();
}

void GroupCoordinator::Relay(const std::string& tenant, const proto::Message& m, Push answer) {
  std::vector<std::pair<Push, proto::Message>> out;  // pushed after mu_ is released
  {
    std::lock_guard<std::mutex> l(mu_);
    RelayLocked(tenant, m, std::move(answer), &out);
  }
  for (auto& [push, msg] : out) push(std::move(msg));
}

void GroupCoordinator::RelayLocked(const std::string& tenant, const proto::Message& m, Push answer,
                                   std::vector<std::pair<Push, proto::Message>>* out) {
  const auto now = Clock::now();
  std::erase_if(relayed_, [&](const auto& e) { return e.second.expires <= now; });
  if (const auto* hold = std::get_if<proto::GroupHold>(&m)) {
    if ((hold->round & kUpstreamRound) == 0) return;
    if (relayed_.size() >= kMaxRelayedRounds && !relayed_.count(hold->round)) {
      Relayed refused;
      refused.answer = std::move(answer);
      AnswerUpstreamLocked(refused, proto::GroupHeld{hold->round, proto::GroupHoldStatus::kRefused,
                                                     "too many group rounds under way at this process server"});
      return;
    }
    // A freeze and then the hold of one round come as two GroupHolds: each
    // starts the round's relay afresh.
    Relayed& r = relayed_[hold->round];
    r = Relayed{};
    r.tenant = tenant;
    r.answer = std::move(answer);
    r.expires = now + std::chrono::milliseconds(2 * uint64_t(proto::kMaxGroupHoldMs));
    // The volumes of each agent (the newest opener of each), and that agent's newest session.
    std::map<std::string, std::vector<std::string>> by_agent;
    for (const std::string& v : hold->volumes) {
      auto o = openers_.find(Key(tenant, v));
      if (o == openers_.end()) {
        AnswerUpstreamLocked(r,
                             proto::GroupHeld{hold->round, proto::GroupHoldStatus::kRefused,
                                              "volume " + v + " is not open at this process server"});
        return;
      }
      by_agent[o->second].push_back(v);
    }
    std::map<std::string, std::pair<uint64_t, Push>> sessions;
    for (const auto& [h, a] : agents_)
      if (a.tenant == tenant && by_agent.count(a.agent)) sessions[a.agent] = {h, a.push};  // the newest wins
    for (const auto& [agent, vols] : by_agent) {
      if (!sessions.count(agent)) {
        AnswerUpstreamLocked(r,
                             proto::GroupHeld{hold->round, proto::GroupHoldStatus::kRefused,
                                              "agent " + agent + " is not connected to this process server"});
        return;
      }
    }
    for (const auto& [agent, s] : sessions) r.asked[s.first] = agent;
    for (const auto& [agent, s] : sessions)
      out->emplace_back(s.second, proto::GroupHold{hold->round, hold->timeout_ms, by_agent[agent], hold->freeze});
  } else if (const auto* rel = std::get_if<proto::GroupRelease>(&m)) {
    auto r = relayed_.find(rel->round);
    if (r == relayed_.end()) return;
    for (const auto& [h, agent] : r->second.asked) {
      auto a = agents_.find(h);
      if (a != agents_.end()) out->emplace_back(a->second.push, proto::GroupRelease{rel->round, rel->marker});
    }
    relayed_.erase(r);
  }
}

void GroupCoordinator::SendAnswers() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    if (upstream_.empty()) {
      upstream_cv_.wait(l);
      continue;
    }
    auto [push, m] = std::move(upstream_.front());
    upstream_.pop_front();
    l.unlock();
    push(std::move(m));
    l.lock();
  }
}

Status GroupCoordinator::SaveLocked() {
  json::array gs;
  for (const auto& [key, g] : groups_) gs.push_back(SpecJson(g.spec));
  const std::string text = json::serialize(json::object{{"version", 1}, {"groups", std::move(gs)}}) + "\n";
  return WriteFileAtomic(o_.env, o_.path, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

Status GroupCoordinator::Put(GroupSpec g) {
  CDP_RETURN_IF_ERROR(ValidateGroup(g));
  if (o_.route_by_volume) {
    // Members are routed by their volume: a tenant's volume names are unique here.
    std::set<std::string> volumes;
    for (const GroupMember& m : g.members)
      if (!volumes.insert(m.volume).second)
        return Status::InvalidArgument("volume " + m.volume +
                                       " named twice: the master target knows a tenant's volumes by name");
  }
  std::lock_guard<std::mutex> l(mu_);
  const std::string key = Key(g.tenant, g.name);
  auto old = groups_.find(key);
  std::optional<Group> before;
  if (old != groups_.end()) before = old->second;
  Group& slot = groups_[key];
  slot.spec = std::move(g);
  slot.next = Clock::now() + std::chrono::milliseconds(slot.spec.interval_ms);
  if (Status s = SaveLocked(); !s.ok()) {
    if (before) slot = *before;
    else groups_.erase(key);
    return s;
  }
  log::Get(o_.log_name)->info("group {}: {} members, a point every {} ms (hold at most {} ms)", key,
                       slot.spec.members.size(), slot.spec.interval_ms, slot.spec.hold_max_ms);
  cv_.notify_all();
  return Status::OK();
}

Status GroupCoordinator::Remove(const std::string& tenant, const std::string& name) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = groups_.find(Key(tenant, name));
  if (it == groups_.end()) return Status::NotFound("no group " + name + " of tenant " + tenant);
  Group g = it->second;
  groups_.erase(it);
  if (Status s = SaveLocked(); !s.ok()) {
    groups_[Key(tenant, name)] = std::move(g);
    return s;
  }
  return Status::OK();
}

Result<RoundOutcome> GroupCoordinator::RunRound(const std::string& tenant, const std::string& name,
                                                const std::string& tag, uint64_t freeze_ms) {
  GroupSpec spec;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = groups_.find(Key(tenant, name));
    if (it == groups_.end()) return Status::NotFound("no group " + name + " of tenant " + tenant);
    spec = it->second.spec;
  }
  if (!tag.empty()) {
    if (!ValidGroupTag(tag)) return Status::InvalidArgument("invalid tag name '" + tag + "' (a valid name without dots)");
    if (GroupMarker(spec.name, ~uint64_t(0), spec.members.size(), tag).size() > kMaxNameLength)
      return Status::InvalidArgument("tag name too long for the group's markers");
    if (freeze_ms > proto::kMaxGroupHoldMs || freeze_ms < spec.hold_max_ms + kGroupHoldMarginMs + 100)
      return Status::InvalidArgument("freeze_ms must be " + std::to_string(spec.hold_max_ms + kGroupHoldMarginMs + 100) +
                                     ".." + std::to_string(proto::kMaxGroupHoldMs));
  }
  return Run(spec, tag, freeze_ms);
}

std::string GroupCoordinator::Ask(const Sessions& sessions, const ByAgent& by_agent,
                                  uint64_t round, uint32_t timeout_ms, bool freeze, Clock::time_point deadline,
                                  Clock::time_point* t_last) {
  {
    std::lock_guard<std::mutex> l(mu_);
    round_->answers.clear();
  }
  for (const auto& [agent, s] : sessions) s.second(proto::GroupHold{round, timeout_ms, by_agent.at(agent), freeze});
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_until(l, deadline, [&] { return stop_ || round_->answers.size() == by_agent.size(); });
  *t_last = round_->answers.size() == by_agent.size() ? round_->t_last : Clock::now();
  const std::string verb = freeze ? "freeze" : "hold";
  const std::string who = o_.route_by_volume ? "peer " : "agent ";
  for (const auto& [agent, vols] : by_agent) {
    auto a = round_->answers.find(agent);
    if (a == round_->answers.end())
      return who + agent + " did not " + verb + " within " +
             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - round_->t0).count()) +
             " ms";
    if (a->second.status != proto::GroupHoldStatus::kHeld)
      return who + agent + " refused" + (freeze ? " the freeze" : "") + ": " + a->second.message;
  }
  return "";
}

RoundOutcome GroupCoordinator::Run(const GroupSpec& g, const std::string& tag, uint64_t freeze_ms) {
  std::lock_guard<std::mutex> one(round_mu_);
  RoundOutcome out;
  // The member volumes of each peer they are routed to, and that peer's newest session.
  ByAgent by_agent;
  Sessions sessions;
  const auto t0 = Clock::now();
  {
    std::unique_lock<std::mutex> l(mu_);
    // Rounds are numbered by the wall clock's microseconds when that is
    // higher than the last: unique across restarts of the daemon.
    last_round_ = std::max(last_round_ + 1, WallMicros());
    out.round = last_round_ | (o_.route_by_volume ? kUpstreamRound : 0);
    for (const GroupMember& m : g.members) {
      const std::string peer = RouteLocked(g.tenant, m);
      if (peer.empty()) {
        out.why = "volume " + m.volume + " is not open at the master target";
        break;
      }
      by_agent[peer].push_back(m.volume);
    }
    for (const auto& [h, a] : agents_) {
      if (a.tenant == g.tenant && by_agent.count(a.agent)) sessions[a.agent] = {h, a.push};  // the newest wins
    }
    for (const auto& [agent, vols] : by_agent) {
      if (!out.why.empty()) break;
      if (!sessions.count(agent)) {
        out.why = (o_.route_by_volume ? "peer " : "agent ") + agent + " is not connected";
        break;
      }
    }
    if (out.why.empty()) {
      round_ = Round{};
      round_->id = out.round;
      round_->t0 = t0;
      for (const auto& [agent, s] : sessions) round_->asked[s.first] = agent;
    }
  }
  if (out.why.empty()) {
    auto t_last = t0;
    auto hold_from = t0;
    if (!tag.empty()) {
      // An application-consistent point: every member frozen first. The
      // agents thaw by themselves freeze_ms after the request; the hold
      // below must be answered before that, by the margin for the clocks.
      out.why = Ask(sessions, by_agent, out.round, uint32_t(freeze_ms), true,
                    t0 + std::chrono::milliseconds(freeze_ms - g.hold_max_ms - kGroupHoldMarginMs), &t_last);
      hold_from = Clock::now();
      std::lock_guard<std::mutex> l(mu_);
      round_->t0 = hold_from;
    }
    if (out.why.empty()) {
      out.why = Ask(sessions, by_agent, out.round, uint32_t(g.hold_timeout_ms), false,
                    hold_from + std::chrono::milliseconds(g.hold_max_ms), &t_last);
      out.hold_us = uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(t_last - hold_from).count());
      if (out.why.empty() && t_last - hold_from >= std::chrono::milliseconds(g.hold_max_ms))
        out.why = "the members held only after " + std::to_string(out.hold_us / 1000) + " ms";
      if (out.why.empty() && !tag.empty() &&
          t_last - t0 >= std::chrono::milliseconds(freeze_ms - kGroupHoldMarginMs))
        out.why = "the members held only after their freeze window";
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      round_.reset();
    }
    out.made = out.why.empty();
    if (out.made) out.marker = GroupMarker(g.name, out.round, g.members.size(), tag);
    // Every agent asked is released, marked or not (a refused one holds
    // nothing; a frozen one thaws).
    for (const auto& [agent, s] : sessions) s.second(proto::GroupRelease{out.round, out.marker});
  }
  std::lock_guard<std::mutex> l(mu_);
  auto it = groups_.find(Key(g.tenant, g.name));
  if (it != groups_.end()) {
    Group& gr = it->second;
    (out.made ? gr.made : gr.abandoned)++;
    gr.last = out;
    if (out.made) {
      gr.last_made = out;
      gr.last_made_wall_us = WallMicros();
    }
  }
  if (auto& c = out.made ? made_ : abandoned_) c->Inc();
  if (out.made) {
    if (round_seconds_) round_seconds_->Observe(double(out.hold_us) / 1e6);
    if (!tag.empty()) log::Get(o_.log_name)->info("group {}/{}: tag {} made ({})", g.tenant, g.name, tag, out.marker);
  } else {
    log::Get(o_.log_name)->warn("group {}/{} round {}{} abandoned: {}", g.tenant, g.name, out.round,
                         tag.empty() ? "" : " (tag " + tag + ")", out.why);
  }
  return out;
}

void GroupCoordinator::Schedule() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    auto next = Clock::time_point::max();
    std::optional<GroupSpec> due;
    const auto now = Clock::now();
    for (auto& [key, g] : groups_) {
      if (g.next <= now && !due) {
        due = g.spec;
        g.next = now + std::chrono::milliseconds(g.spec.interval_ms);
      }
      next = std::min(next, g.next);
    }
    if (due) {
      l.unlock();
      (void)Run(*due, "", 0);
      l.lock();
      continue;
    }
    if (next == Clock::time_point::max()) cv_.wait(l);
    else cv_.wait_until(l, next);
  }
}

json::value GroupCoordinator::Json(const http::Caller& caller) const {
  std::lock_guard<std::mutex> l(mu_);
  json::array out;
  for (const auto& [key, g] : groups_) {
    if (!caller.Sees(g.spec.tenant)) continue;
    json::object o = SpecJson(g.spec);
    json::array connected;
    for (const GroupMember& m : g.spec.members) {
      bool up = false;
      const std::string peer = RouteLocked(g.spec.tenant, m);
      for (const auto& [h, a] : agents_) up = up || (a.tenant == g.spec.tenant && a.agent == peer && !peer.empty());
      connected.push_back(up);
    }
    o["connected"] = std::move(connected);
    o["points_made"] = g.made;
    o["rounds_abandoned"] = g.abandoned;
    if (g.last_made) {
      o["last_point"] = json::object{{"round", g.last_made->round},
                                     {"marker", g.last_made->marker},
                                     {"hold_us", g.last_made->hold_us},
                                     {"unix_us", g.last_made_wall_us}};
    }
    if (g.last && !g.last->made) o["last_abandoned"] = json::object{{"round", g.last->round}, {"why", g.last->why}};
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace cdp
