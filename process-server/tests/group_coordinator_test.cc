// SPDX-License-Identifier: Apache-2.0
// GroupCoordinator (process-server/group_coordinator.h): a round is made only
// when every member agent held within hold_max, is abandoned (every agent
// asked released, nothing marked) otherwise; the groups file survives
// errors and power cuts at every sync point.
#include "process-server/group_coordinator.h"

#include <catch2/catch.hpp>
#include <thread>

#include "common/env/fault_env.h"

using cdp::Code;
using cdp::FaultEnv;
using cdp::ps::GroupCoordinator;
using cdp::ps::GroupSpec;
namespace proto = cdp::proto;

namespace {

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
  const auto j = gc.Json().as_array().at(0).as_object();
  CHECK(j.at("points_made").as_uint64() == 0);
  CHECK(j.at("rounds_abandoned").as_uint64() == 5);
}

TEST_CASE("groups are validated: members, intervals, and a hold timeout above hold_max by the margin", "[groups]") {
  using cdp::ps::ValidateGroup;
  GroupSpec g = App();
  CHECK(ValidateGroup(g).ok());
  g.members.push_back({"web", "data"});
  CHECK(ValidateGroup(g).message() == "member web:data named twice");
  g = App();
  g.hold_timeout_ms = g.hold_max_ms + cdp::ps::kGroupHoldMarginMs - 1;
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
  CHECK(cdp::ps::ParseMember("db").status().code() == Code::kInvalidArgument);
  CHECK(cdp::ps::ParseMember("db:bad name").status().code() == Code::kInvalidArgument);
  CHECK(cdp::ps::ParseMember("db:logs")->volume == "logs");
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
      CHECK(gc.Json().as_array().size() == 1);  // not taken
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
    const size_t groups = again.Json().as_array().size();
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
