// SPDX-License-Identifier: Apache-2.0
// GroupCoordinator (common/wire/group_coordinator.h): a round is made only
// when every member agent held within hold_max, is abandoned (every agent
// asked released, nothing marked) otherwise; the groups file survives
// errors and power cuts at every sync point.
#include "common/wire/group_coordinator.h"

#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/env/fault_env.h"

using cdp::Code;
using cdp::FaultEnv;
using cdp::GroupCoordinator;
using cdp::GroupSpec;
namespace proto = cdp::proto;

namespace {
cdp::http::Caller CallerOf(bool admin, const std::string& tenant) {
  cdp::http::Caller c;
  c.admin = admin;
  c.tenant = tenant;
  return c;
}
const cdp::http::Caller kAdmin = CallerOf(true, "");

GroupSpec App() {
  GroupSpec g;
  g.tenant = "acme";
  g.name = "app";
  g.members = {{"web", "data"}, {"db", "data"}, {"db", "logs"}};
  g.interval_ms = 3'600'000;  // the schedule stays out of the way: rounds run on demand
  return g;
}

// A fake agent session: records what it is sent, answers holds as told.
struct FakeAgent {
  GroupCoordinator* gc = nullptr;
  uint64_t handle = 0;
  enum class Mode { kHold, kRefuse, kSilent, kSlow, kRefuseFreeze } mode = Mode::kHold;
  std::vector<proto::Message> got;
  std::thread late;

  void Attach(GroupCoordinator& c, const std::string& tenant, const std::string& agent) {
    gc = &c;
    handle = c.Attach(tenant, agent, [this](proto::Message m) {
      got.push_back(m);
      auto* h = std::get_if<proto::GroupHold>(&m);
      if (h == nullptr) return;
      if (mode == Mode::kHold || (mode == Mode::kRefuseFreeze && !h->freeze))
        gc->Answered(handle, {h->round, proto::GroupHoldStatus::kHeld, ""});
      if (mode == Mode::kRefuseFreeze && h->freeze)
        gc->Answered(handle, {h->round, proto::GroupHoldStatus::kRefused, "freeze hook: exit 1"});
      if (mode == Mode::kRefuse) gc->Answered(handle, {h->round, proto::GroupHoldStatus::kRefused, "mode metadata"});
      if (mode == Mode::kSlow) {
        const uint64_t round = h->round;
        late = std::thread([this, round] {
          std::this_thread::sleep_for(std::chrono::milliseconds(120));  // the slow member (its delay is the test)
          gc->Answered(handle, {round, proto::GroupHoldStatus::kHeld, ""});
        });
      }
    });
  }
  ~FakeAgent() {
    if (late.joinable()) late.join();
  }
  const proto::GroupHold* LastHold() const {
    for (auto it = got.rbegin(); it != got.rend(); ++it)
      if (auto* h = std::get_if<proto::GroupHold>(&*it)) return h;
    return nullptr;
  }
  const proto::GroupRelease* LastRelease() const {
    for (auto it = got.rbegin(); it != got.rend(); ++it)
      if (auto* r = std::get_if<proto::GroupRelease>(&*it)) return r;
    return nullptr;
  }
};

GroupCoordinator::Options Opts(cdp::Env* env) {
  GroupCoordinator::Options o;
  o.env = env;
  o.path = "/ps/groups.json";
  return o;
}

// A started coordinator on a MemEnv holding group App().
struct AppFixture {
  AppFixture() {
    REQUIRE(env->CreateDirs("/ps").ok());
    REQUIRE(gc.Start().ok());
    REQUIRE(gc.Put(App()).ok());
  }
  std::unique_ptr<cdp::Env> env = cdp::NewMemEnv();
  GroupCoordinator gc{Opts(env.get())};
};

}  // namespace

TEST_CASE("a round with every member held in time is made: one hold per agent naming its volumes, one marker",
          "[groups]") {
  AppFixture fx;
  GroupCoordinator& gc = fx.gc;
  FakeAgent web, db, other;
  web.Attach(gc, "acme", "web");
  db.Attach(gc, "acme", "db");
  other.Attach(gc, "beta", "db");  // another tenant's agent of the same name: never asked
  auto r = gc.RunRound("acme", "app");
  REQUIRE(r.ok());
  INFO(r->why);
  REQUIRE(r->made);
  CHECK(r->marker == "group.app." + std::to_string(r->round) + ".3");
  REQUIRE(db.LastHold() != nullptr);
  CHECK(db.LastHold()->volumes == std::vector<std::string>{"data", "logs"});
  CHECK(db.LastHold()->timeout_ms == 200);
  CHECK(web.LastHold()->volumes == std::vector<std::string>{"data"});
  CHECK(web.LastRelease()->marker == r->marker);
  CHECK(db.LastRelease()->marker == r->marker);
  CHECK(other.got.empty());
  // Rounds are unique and increasing.
  auto r2 = gc.RunRound("acme", "app");
  REQUIRE(r2.ok());
  CHECK(r2->round > r->round);
}

TEST_CASE("a round is abandoned when a member is not connected, refuses, or holds too late, and every agent asked "
          "is released without a marker",
          "[groups]") {
  AppFixture fx;
  GroupCoordinator& gc = fx.gc;
  FakeAgent web, db;
  web.Attach(gc, "acme", "web");
  auto r = gc.RunRound("acme", "app");
  REQUIRE(r.ok());
  CHECK_FALSE(r->made);
  CHECK(r->why == "agent db is not connected");
  CHECK(web.got.empty());  // nobody was held for a round that could not be made

  db.Attach(gc, "acme", "db");
  db.mode = FakeAgent::Mode::kRefuse;
  r = gc.RunRound("acme", "app");
  REQUIRE(r.ok());
  CHECK(r->why == "agent db refused: mode metadata");
  CHECK(web.LastRelease()->marker.empty());
  CHECK(web.LastRelease()->round == r->round);

  db.mode = FakeAgent::Mode::kSilent;
  const auto t0 = std::chrono::steady_clock::now();
  r = gc.RunRound("acme", "app");
  REQUIRE(r.ok());
  CHECK(r->why == "agent db did not hold within 50 ms");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1000));
  CHECK(web.LastRelease()->marker.empty());
  CHECK(db.LastRelease()->marker.empty());

  // A held answer that comes after hold_max belongs to a round that is over.
  db.mode = FakeAgent::Mode::kSlow;
  r = gc.RunRound("acme", "app");
  REQUIRE(r.ok());
  CHECK_FALSE(r->made);
  db.late.join();
  // Detached: the agent is gone.
  gc.Detach(db.handle);
  r = gc.RunRound("acme", "app");
  CHECK(r->why == "agent db is not connected");
  const auto j = gc.Json(kAdmin).as_array().at(0).as_object();
  CHECK(j.at("points_made").as_uint64() == 0);
  CHECK(j.at("rounds_abandoned").as_uint64() == 5);
}

TEST_CASE("groups are validated: members, intervals, and a hold timeout above hold_max by the margin", "[groups]") {
  using cdp::ValidateGroup;
  GroupSpec g = App();
  CHECK(ValidateGroup(g).ok());
  g.members.push_back({"web", "data"});
  CHECK(ValidateGroup(g).message() == "member web:data named twice");
  g = App();
  g.hold_timeout_ms = g.hold_max_ms + cdp::kGroupHoldMarginMs - 1;
  CHECK(ValidateGroup(g).code() == Code::kInvalidArgument);
  g = App();
  g.interval_ms = 99;
  CHECK(ValidateGroup(g).code() == Code::kInvalidArgument);
  g = App();
  g.members.clear();
  CHECK(ValidateGroup(g).code() == Code::kInvalidArgument);
  g = App();
  g.name = std::string(120, 'g');  // its markers would not be valid names
  CHECK(ValidateGroup(g).message() == "group name too long for its markers");
  CHECK(cdp::ParseMember("db").status().code() == Code::kInvalidArgument);
  CHECK(cdp::ParseMember("db:bad name").status().code() == Code::kInvalidArgument);
  CHECK(cdp::ParseMember("db:logs")->volume == "logs");
}

TEST_CASE("the groups file: a failed write changes nothing, a power cut at any sync point leaves the old or the "
          "new groups, a corrupt file stops the start",
          "[groups]") {
  auto mem = cdp::NewMemEnv();
  REQUIRE(mem->CreateDirs("/ps").ok());
  {
    FaultEnv fault(mem.get());
    GroupCoordinator gc(Opts(&fault));
    REQUIRE(gc.Start().ok());
    REQUIRE(gc.Put(App()).ok());
    GroupSpec b = App();
    b.name = "batch";
    for (FaultEnv::Op op : {FaultEnv::Op::kWrite, FaultEnv::Op::kSync, FaultEnv::Op::kRename}) {
      INFO(FaultEnv::OpName(op));
      fault.InjectError(op, ENOSPC);
      auto s = gc.Put(b);
      fault.ClearErrors();
      CHECK(s.code() == Code::kNoSpace);
      CHECK(gc.Json(kAdmin).as_array().size() == 1);  // not taken
    }
  }
  for (uint64_t n = 0;; ++n) {
    auto m = cdp::NewMemEnv();
    REQUIRE(m->CreateDirs("/ps").ok());
    FaultEnv fault(m.get());
    fault.SetCrashAfterSyncs(n);
    bool put_ok = false;
    {
      GroupCoordinator gc(Opts(&fault));
      REQUIRE(gc.Start().ok());
      put_ok = gc.Put(App()).ok();
    }
    const bool finished = !fault.crashed();
    REQUIRE(fault.DropUnsyncedData().ok());
    INFO("crash after " << n << " syncs");
    GroupCoordinator again(Opts(&fault));
    REQUIRE(again.Start().ok());  // never a torn file
    const size_t groups = again.Json(kAdmin).as_array().size();
    if (put_ok) CHECK(groups == 1);  // acknowledged: durable
    CHECK(groups <= 1);
    if (finished) {
      CHECK(groups == 1);
      break;
    }
  }
  // A file that is not a groups file stops the start, naming it.
  auto m = cdp::NewMemEnv();
  REQUIRE(m->CreateDirs("/ps").ok());
  const std::string junk = "{\"groups\": [{\"tenant\": \"acme\"}]}";
  REQUIRE(cdp::WriteFileAtomic(m.get(), "/ps/groups.json",
                               cdp::ByteSpan(reinterpret_cast<const uint8_t*>(junk.data()), junk.size()))
              .ok());
  GroupCoordinator bad(Opts(m.get()));
  auto s = bad.Start();
  CHECK(s.code() == Code::kCorruption);
  CHECK(s.ToString().find("/ps/groups.json") != std::string::npos);
}

TEST_CASE("an application-consistent round freezes every member agent first, then holds, and its marker carries "
          "the tag, and a member that cannot freeze abandons it",
          "[groups]") {
  AppFixture fx;
  GroupCoordinator& gc = fx.gc;
  FakeAgent web, db;
  web.Attach(gc, "acme", "web");
  db.Attach(gc, "acme", "db");
  auto r = gc.RunRound("acme", "app", "nightly", 5000);
  REQUIRE(r.ok());
  INFO(r->why);
  REQUIRE(r->made);
  CHECK(r->marker == "group.app." + std::to_string(r->round) + ".3.tag.nightly");
  for (FakeAgent* a : {&web, &db}) {
    // freeze, hold, release: in that order, one round.
    REQUIRE(a->got.size() == 3);
    auto* f = std::get_if<proto::GroupHold>(&a->got[0]);
    auto* h = std::get_if<proto::GroupHold>(&a->got[1]);
    auto* rel = std::get_if<proto::GroupRelease>(&a->got[2]);
    REQUIRE((f && h && rel));
    CHECK(f->freeze);
    CHECK(f->timeout_ms == 5000);
    CHECK_FALSE(h->freeze);
    CHECK(h->timeout_ms == 200);
    CHECK(f->round == r->round);
    CHECK(h->round == r->round);
    CHECK(rel->marker == r->marker);
  }

  db.mode = FakeAgent::Mode::kRefuseFreeze;
  web.got.clear();
  db.got.clear();
  r = gc.RunRound("acme", "app", "nightly2", 5000);
  REQUIRE(r.ok());
  CHECK_FALSE(r->made);
  CHECK(r->why == "agent db refused the freeze: freeze hook: exit 1");
  // No hold was asked of anyone; both are released (and thaw).
  for (FakeAgent* a : {&web, &db}) {
    REQUIRE(a->got.size() == 2);
    CHECK(std::get<proto::GroupHold>(a->got[0]).freeze);
    CHECK(std::get<proto::GroupRelease>(a->got[1]).marker.empty());
  }

  CHECK(gc.RunRound("acme", "app", "a.b", 5000).status().code() == Code::kInvalidArgument);
  CHECK(gc.RunRound("acme", "app", "ok", 100).status().code() == Code::kInvalidArgument);
  CHECK(gc.RunRound("acme", "app", "ok", proto::kMaxGroupHoldMs + 1).status().code() == Code::kInvalidArgument);
  CHECK(gc.RunRound("acme", "app", std::string(200, 't'), 5000).status().code() == Code::kInvalidArgument);
}

namespace {

// Groups across process servers: a coordinator as the master target runs it
// (members routed by the peer that opened their volume), and two process
// servers' coordinators relaying its rounds to their agents.
struct AcrossFixture {
  // A process server's session at the master target: what the MT pushes is
  // relayed by the PS's coordinator, whose answer comes back on the session.
  struct Ps {
    GroupCoordinator gc;
    uint64_t at_mt = 0;  // its session's handle at the master target
    Ps(cdp::Env* env, const std::string& dir) : gc(Options(env, dir)) {}
    static GroupCoordinator::Options Options(cdp::Env* env, const std::string& dir) {
      GroupCoordinator::Options o = Opts(env);
      o.path = dir + "/groups.json";
      return o;
    }
  };
  AcrossFixture() {
    for (const char* d : {"/mt", "/ps1", "/ps2"}) REQUIRE(env->CreateDirs(d).ok());
    REQUIRE(mt.Start().ok());
    REQUIRE(ps1.gc.Start().ok());
    REQUIRE(ps2.gc.Start().ok());
    GroupSpec g = App();
    g.members = {{"web", "www"}, {"db", "data"}, {"db", "logs"}};
    REQUIRE(mt.Put(g).ok());
    for (auto [ps, name] : {std::pair{&ps1, "ps1"}, std::pair{&ps2, "ps2"}}) {
      ps->at_mt = mt.Attach("acme", name, [this, ps](proto::Message m) {
        ps->gc.Relay("acme", m, [this, ps](proto::Message a) { mt.Answered(ps->at_mt, std::get<proto::GroupHeld>(a)); });
      });
    }
    web.Attach(ps1.gc, "acme", "web");
    db.Attach(ps2.gc, "acme", "db");
  }
  // Each volume opened by its agent at its process server, and by that
  // process server at the master target.
  void OpenAll() {
    ps1.gc.Opened("acme", "www", "web");
    ps2.gc.Opened("acme", "data", "db");
    ps2.gc.Opened("acme", "logs", "db");
    mt.Opened("acme", "www", "ps1");
    mt.Opened("acme", "data", "ps2");
    mt.Opened("acme", "logs", "ps2");
  }
  static GroupCoordinator::Options MtOptions(cdp::Env* env, cdp::metrics::Registry* registry) {
    GroupCoordinator::Options o = Opts(env);
    o.path = "/mt/groups.json";
    o.route_by_volume = true;
    o.registry = registry;
    o.metric_prefix = "cdp_mt";
    return o;
  }
  uint64_t Counted(const char* name) { return registry.GetCounter(name, "")->Value(); }
  std::unique_ptr<cdp::Env> env = cdp::NewMemEnv();
  cdp::metrics::Registry registry;
  GroupCoordinator mt{MtOptions(env.get(), &registry)};
  Ps ps1{env.get(), "/ps1"}, ps2{env.get(), "/ps2"};
  FakeAgent web, db;
};

}  // namespace

TEST_CASE("groups across process servers: the master target asks each process server for the volumes it ships, "
          "each relays to the agent that opened them, and one marker is made",
          "[groups]") {
  AcrossFixture fx;
  fx.OpenAll();
  auto r = fx.mt.RunRound("acme", "app");
  REQUIRE(r.ok());
  INFO(r->why);
  REQUIRE(r->made);
  CHECK((r->round & cdp::kUpstreamRound) != 0);  // never the number of a process server's own round
  CHECK(r->marker == "group.app." + std::to_string(r->round) + ".3");
  REQUIRE(fx.web.LastHold() != nullptr);
  REQUIRE(fx.db.LastHold() != nullptr);
  CHECK(fx.web.LastHold()->round == r->round);
  CHECK(fx.web.LastHold()->volumes == std::vector<std::string>{"www"});
  CHECK(fx.db.LastHold()->volumes == std::vector<std::string>{"data", "logs"});
  CHECK(fx.web.LastRelease()->marker == r->marker);
  CHECK(fx.db.LastRelease()->marker == r->marker);
  // The master target shows the members reachable.
  const auto j = fx.mt.Json(kAdmin).as_array().at(0).as_object();
  CHECK(boost::json::serialize(j.at("connected")) == "[true,true,true]");
  CHECK(j.at("points_made").as_uint64() == 1);
  // A tenant token sees its own tenant's groups only.
  CHECK(fx.mt.Json(CallerOf(false, "beta")).as_array().empty());
}

TEST_CASE("groups across process servers: a volume no peer opened, a process server without it, an agent that "
          "refuses or stays silent: the round is abandoned, and every agent held is released without a marker",
          "[groups]") {
  AcrossFixture fx;
  auto r = fx.mt.RunRound("acme", "app");
  REQUIRE(r.ok());
  CHECK(r->why == "volume www is not open at the master target");
  CHECK(fx.web.got.empty());

  fx.mt.Opened("acme", "www", "ps1");
  fx.mt.Opened("acme", "data", "ps2");
  fx.mt.Opened("acme", "logs", "ps2");
  r = fx.mt.RunRound("acme", "app");
  REQUIRE(r.ok());
  CHECK_FALSE(r->made);
  // Either process server may answer first; each names what it lacks.
  CHECK((r->why == "peer ps1 refused: volume www is not open at this process server" ||
         r->why == "peer ps2 refused: volume data is not open at this process server"));
  CHECK(fx.web.got.empty());

  fx.OpenAll();
  fx.db.mode = FakeAgent::Mode::kRefuse;
  r = fx.mt.RunRound("acme", "app");
  REQUIRE(r.ok());
  CHECK(r->why == "peer ps2 refused: agent db: mode metadata");
  REQUIRE(fx.web.LastRelease() != nullptr);
  CHECK(fx.web.LastRelease()->round == r->round);
  CHECK(fx.web.LastRelease()->marker.empty());

  fx.db.mode = FakeAgent::Mode::kSilent;
  r = fx.mt.RunRound("acme", "app");
  REQUIRE(r.ok());
  CHECK(r->why == "peer ps2 did not hold within 50 ms");
  CHECK(fx.web.LastRelease()->marker.empty());
  REQUIRE(fx.db.LastRelease() != nullptr);
  CHECK(fx.db.LastRelease()->round == r->round);  // the silent agent is released too
  CHECK(fx.db.LastRelease()->marker.empty());

  // The agent that opened a volume last is the one asked.
  FakeAgent db2;
  db2.Attach(fx.ps2.gc, "acme", "db2");
  fx.ps2.gc.Opened("acme", "data", "db2");
  fx.ps2.gc.Opened("acme", "logs", "db2");
  r = fx.mt.RunRound("acme", "app");
  REQUIRE(r.ok());
  INFO(r->why);
  CHECK(r->made);
  REQUIRE(db2.LastHold() != nullptr);
  CHECK(db2.LastHold()->volumes == std::vector<std::string>{"data", "logs"});
  CHECK(fx.Counted("cdp_mt_group_rounds_abandoned_total") == 4);
  CHECK(fx.Counted("cdp_mt_group_points_made_total") == 1);
}

TEST_CASE("a process server relays only rounds marked as the master target's, and a master target's group names "
          "each volume once",
          "[groups]") {
  AcrossFixture fx;
  fx.OpenAll();
  // A hold without kUpstreamRound on the link (a peer posing as coordinator of
  // the process server's own rounds) is not relayed.
  bool answered = false;
  fx.ps1.gc.Relay("acme", proto::GroupHold{42, 200, {"www"}, false}, [&](proto::Message) { answered = true; });
  fx.ps1.gc.Relay("acme", proto::GroupRelease{42, "group.app.42.1"}, [&](proto::Message) { answered = true; });
  CHECK(fx.web.got.empty());
  CHECK_FALSE(answered);
  // Another tenant's link does not reach this tenant's agents.
  fx.ps1.gc.Relay("beta", proto::GroupHold{cdp::kUpstreamRound | 7, 200, {"www"}, false}, [](proto::Message) {});
  CHECK(fx.web.got.empty());

  GroupSpec g = App();
  g.name = "dup";
  g.members = {{"web", "data"}, {"db", "data"}};
  cdp::Status s = fx.mt.Put(g);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(s.message() == "volume data named twice: the master target knows a tenant's volumes by name");
}

TEST_CASE("groups across process servers: a tag freezes every agent through the relays before the hold, and an "
          "agent whose freeze hook fails abandons it",
          "[groups]") {
  AcrossFixture fx;
  fx.OpenAll();
  auto r = fx.mt.RunRound("acme", "app", "nightly", 1000);
  REQUIRE(r.ok());
  INFO(r->why);
  REQUIRE(r->made);
  CHECK(r->marker == "group.app." + std::to_string(r->round) + ".3.tag.nightly");
  for (FakeAgent* a : {&fx.web, &fx.db}) {
    // A freeze, then the hold, of the same round, then the release with the marker.
    REQUIRE(a->got.size() == 3);
    const auto* freeze = std::get_if<proto::GroupHold>(&a->got[0]);
    const auto* hold = std::get_if<proto::GroupHold>(&a->got[1]);
    REQUIRE(freeze != nullptr);
    REQUIRE(hold != nullptr);
    CHECK(freeze->freeze);
    CHECK(freeze->timeout_ms == 1000);
    CHECK_FALSE(hold->freeze);
    CHECK(hold->round == freeze->round);
    CHECK(a->LastRelease()->marker == r->marker);
  }
  fx.db.mode = FakeAgent::Mode::kRefuseFreeze;
  r = fx.mt.RunRound("acme", "app", "nightly2", 1000);
  REQUIRE(r.ok());
  CHECK(r->why == "peer ps2 refused the freeze: agent db: freeze hook: exit 1");
  CHECK(fx.web.LastRelease()->round == r->round);  // web thaws
  CHECK(fx.web.LastRelease()->marker.empty());
}

TEST_CASE("a process server relays at most kMaxRelayedRounds upstream rounds at once: the next hold is refused "
          "until a release frees one",
          "[groups]") {
  AcrossFixture fx;
  fx.OpenAll();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<proto::GroupHeld> answers;
  auto answer = [&](proto::Message m) {
    std::lock_guard<std::mutex> l(mu);
    answers.push_back(std::get<proto::GroupHeld>(m));
    cv.notify_all();
  };
  auto wait_for = [&](size_t n) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(10), [&] { return answers.size() >= n; });
  };
  const uint64_t cap = cdp::kMaxRelayedRounds;
  for (uint64_t i = 1; i <= cap + 1; ++i)
    fx.ps1.gc.Relay("acme", proto::GroupHold{cdp::kUpstreamRound | i, 200, {"www"}, false}, answer);
  REQUIRE(wait_for(cap + 1));
  {
    std::lock_guard<std::mutex> l(mu);
    for (uint64_t i = 0; i < cap; ++i) CHECK(answers[i].status == proto::GroupHoldStatus::kHeld);
    CHECK(answers[cap].round == (cdp::kUpstreamRound | (cap + 1)));
    CHECK(answers[cap].status == proto::GroupHoldStatus::kRefused);
    CHECK(answers[cap].message == "too many group rounds under way at this process server");
  }
  CHECK(fx.web.got.size() == cap);  // the refused one never reached the agent
  fx.ps1.gc.Relay("acme", proto::GroupRelease{cdp::kUpstreamRound | 1, ""}, answer);
  fx.ps1.gc.Relay("acme", proto::GroupHold{cdp::kUpstreamRound | (cap + 2), 200, {"www"}, false}, answer);
  REQUIRE(wait_for(cap + 2));
  std::lock_guard<std::mutex> l(mu);
  CHECK(answers[cap + 1].round == (cdp::kUpstreamRound | (cap + 2)));
  CHECK(answers[cap + 1].status == proto::GroupHoldStatus::kHeld);
}
