// SPDX-License-Identifier: Apache-2.0
// Group holds at the agent (agent/group_hold.h, CaptureQueue's holds): while
// a hold is on no write is applied or numbered; the release marks the held
// place; a hold ends by itself at its timeout; a volume that cannot promise
// a point refuses, and nothing stays held.
#include "agent/group_hold.h"

#include <catch2/catch.hpp>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>

#include "common/env/env.h"

using cdp::agent::CaptureDevice;
using cdp::agent::GroupHolds;
namespace proto = cdp::proto;
using std::chrono::milliseconds;

namespace {

constexpr uint64_t kMiB = 1u << 20;

struct Fixture {
  std::unique_ptr<cdp::Env> env = cdp::NewMemEnv();
  cdp::ManualClock clock;
  std::map<std::string, std::shared_ptr<CaptureDevice>> devs;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<proto::GroupHeld> answers;
  GroupHolds holds;

  explicit Fixture(GroupHolds::Hooks hooks = {})
      : holds([this](const std::string& v) { return devs.count(v) ? devs[v].get() : nullptr; }, 5000,
              std::move(hooks)) {
    for (const char* v : {"a", "b"}) {
      const std::string dir = std::string("/") + v;
      REQUIRE(env->CreateDirs(dir).ok());
      cdp::OpenOptions oo;
      oo.create = true;
      auto f = env->Open(dir + "/backing", oo);
      REQUIRE(f.ok());
      REQUIRE((*f)->Truncate(4 * kMiB).ok());
      CaptureDevice::Options o;
      o.volume = v;
      o.env = env.get();
      o.clock = &clock;
      o.backing_path = dir + "/backing";
      o.bitmap_path = dir + "/bitmap";
      o.budget = 16 * kMiB;
      o.region_size = 1u << 20;
      auto d = CaptureDevice::Open(o);
      REQUIRE(d.ok());
      (*d)->queue().Resume(0);
      for (uint64_t r = 0; r < (*d)->bitmap().region_count(); ++r) (*d)->bitmap().ResyncDone(r, 0);
      devs[v] = *d;
    }
  }
  ~Fixture() { holds.Stop(); }

  proto::GroupHeld Hold(uint64_t round, std::vector<std::string> vols, uint32_t timeout_ms = 5000,
                        bool freeze = false) {
    size_t before;
    {
      std::lock_guard<std::mutex> l(mu);
      before = answers.size();
    }
    holds.OnRequest(proto::GroupHold{round, timeout_ms, std::move(vols), freeze}, [this](const proto::Message& m) {
      std::lock_guard<std::mutex> l(mu);
      answers.push_back(std::get<proto::GroupHeld>(m));
      cv.notify_all();
      return cdp::Status::OK();
    });
    std::unique_lock<std::mutex> l(mu);
    REQUIRE(cv.wait_for(l, std::chrono::seconds(10), [&] { return answers.size() > before; }));
    return answers.back();
  }
  void Release(uint64_t round, std::string marker) {
    holds.OnRequest(proto::GroupRelease{round, std::move(marker)}, nullptr);
  }
  std::future<cdp::Status> WriteAsync(const std::string& v, uint8_t fill) {
    return std::async(std::launch::async, [this, v, fill] {
      cdp::Bytes b(4096, fill);
      return devs[v]->Write(0, cdp::ByteSpan(b.data(), b.size()), false);
    });
  }
  uint64_t Last(const std::string& v) { return devs[v]->queue().Stats().next_seq - 1; }
};

}  // namespace

TEST_CASE("a held volume applies and numbers no write until the release, which marks the held place", "[groups]") {
  Fixture f;
  REQUIRE(f.devs["a"]->Write(0, cdp::ByteSpan(cdp::Bytes(4096, 1)), false).ok());
  const uint64_t before = f.Last("a");
  proto::GroupHeld h = f.Hold(7, {"a", "b"});
  REQUIRE(h.status == proto::GroupHoldStatus::kHeld);
  auto w = f.WriteAsync("a", 2);
  // The write waits: after 200 ms of the host's clock it is still not done
  // and nothing was numbered or applied (the backing file still holds 1s).
  REQUIRE(w.wait_for(milliseconds(200)) == std::future_status::timeout);
  CHECK(f.Last("a") == before);
  cdp::Bytes now(4096);
  REQUIRE(f.devs["a"]->ReadBacking(0, 4096, now.data()).ok());
  CHECK(now == cdp::Bytes(4096, 1));
  // A tag of the agent's own is not held (it takes the plain lock).
  f.Release(7, "group.app.7.2");
  REQUIRE(w.wait_for(milliseconds(10000)) == std::future_status::ready);
  REQUIRE(w.get().ok());
  // The marker sits right after the last write before the hold, the held
  // write right after the marker; volume b got its marker too.
  GroupHolds::Released r = f.holds.last_released();
  CHECK(r.round == 7);
  REQUIRE(r.marked.size() == 2);
  CHECK(r.marked[0] == std::pair<std::string, uint64_t>{"a", before + 1});
  CHECK(f.Last("a") == before + 2);
  CHECK(f.devs["a"]->queue().Stats().holds == 1);
  CHECK(f.devs["a"]->queue().Stats().held_writes == 1);
  CHECK(f.devs["a"]->queue().Stats().holds_lapsed == 0);
}

TEST_CASE("a hold ends by itself at its timeout, and a release after that marks nothing", "[groups]") {
  Fixture f;
  REQUIRE(f.Hold(9, {"a"}, 100).status == proto::GroupHoldStatus::kHeld);
  const auto t0 = std::chrono::steady_clock::now();
  auto w = f.WriteAsync("a", 3);
  REQUIRE(w.wait_for(milliseconds(10000)) == std::future_status::ready);
  REQUIRE(w.get().ok());
  CHECK(std::chrono::steady_clock::now() - t0 >= milliseconds(90));  // it did wait for the hold
  f.Release(9, "group.app.9.1");
  CHECK(f.holds.last_released().marked.empty());
  CHECK(f.devs["a"]->queue().Stats().holds_lapsed == 1);
  // Nothing but the write was queued: no marker.
  CHECK(f.Last("a") == 1);
}

TEST_CASE("an abandoned round releases without a marker", "[groups]") {
  Fixture f;
  REQUIRE(f.Hold(11, {"a", "b"}).status == proto::GroupHoldStatus::kHeld);
  auto w = f.WriteAsync("b", 4);
  REQUIRE(w.wait_for(milliseconds(100)) == std::future_status::timeout);
  f.Release(11, "");
  REQUIRE(w.wait_for(milliseconds(10000)) == std::future_status::ready);
  CHECK(f.holds.last_released().marked.empty());
  CHECK(f.Last("a") == 0);
  CHECK(f.Last("b") == 1);
}

TEST_CASE("a hold is refused for an unknown volume, one already held, or one that cannot promise a point, and "
          "nothing stays held",
          "[groups]") {
  Fixture f;
  proto::GroupHeld h = f.Hold(1, {"a", "nope"});
  CHECK(h.status == proto::GroupHoldStatus::kRefused);
  CHECK(h.message == "no volume nope at this agent");
  // a was held and ended again: a write goes through at once.
  REQUIRE(f.devs["a"]->Write(0, cdp::ByteSpan(cdp::Bytes(4096, 5)), false).ok());

  REQUIRE(f.Hold(2, {"b"}).status == proto::GroupHoldStatus::kHeld);
  h = f.Hold(3, {"a", "b"});
  CHECK(h.status == proto::GroupHoldStatus::kRefused);
  CHECK(h.message == "volume b is held by another group round");
  REQUIRE(f.devs["a"]->Write(0, cdp::ByteSpan(cdp::Bytes(4096, 6)), false).ok());
  f.Release(2, "");

  // A resync pending on b: no consistent point there.
  f.devs["b"]->bitmap().AssignResync(0, 4096);
  h = f.Hold(4, {"a", "b"});
  CHECK(h.status == proto::GroupHoldStatus::kRefused);
  CHECK(h.message.find("volume b cannot promise a consistent point now") == 0);
  REQUIRE(f.devs["a"]->Write(0, cdp::ByteSpan(cdp::Bytes(4096, 7)), false).ok());
}

TEST_CASE("a hold longer than the agent's group_hold_max is refused, and with 0 every hold is", "[groups]") {
  for (uint64_t max : {uint64_t(200), uint64_t(0)}) {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<proto::GroupHeld> got;
    GroupHolds h([](const std::string&) -> CaptureDevice* { return nullptr; }, max);
    h.OnRequest(proto::GroupHold{1, 201, {"a"}}, [&](const proto::Message& m) {
      std::lock_guard<std::mutex> l(mu);
      got = std::get<proto::GroupHeld>(m);
      cv.notify_all();
      return cdp::Status::OK();
    });
    std::unique_lock<std::mutex> l(mu);
    REQUIRE(cv.wait_for(l, std::chrono::seconds(10), [&] { return got.has_value(); }));
    CHECK(got->status == proto::GroupHoldStatus::kRefused);
    CHECK(got->message == (max == 0 ? "this agent takes no group holds (group_hold_max = 0)"
                                    : "a hold of 201 ms is above this agent's group_hold_max (200 ms)"));
    l.unlock();
    h.Stop();
  }
}

namespace {

// The hooks of a group tag's freeze, as the agent runs them: each call
// recorded in order.
struct HookLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> calls;
  cdp::Status freeze_result;

  GroupHolds::Hooks Hooks(uint64_t max_freeze_ms = 10'000) {
    GroupHolds::Hooks h;
    h.max_freeze_ms = max_freeze_ms;
    h.freeze = [this](uint64_t timeout_ms) {
      std::lock_guard<std::mutex> l(mu);
      calls.push_back("freeze " + std::to_string(timeout_ms > 0));
      cv.notify_all();
      return freeze_result;
    };
    h.thaw = [this] {
      std::lock_guard<std::mutex> l(mu);
      calls.push_back("thaw");
      cv.notify_all();
    };
    return h;
  }
  // Waits (at most 10 s) for `n` calls; returns them.
  std::vector<std::string> Wait(size_t n) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait_for(l, std::chrono::seconds(10), [&] { return calls.size() >= n; });
    return calls;
  }
};

}  // namespace

TEST_CASE("a group tag's freeze runs the freeze hook before it answers, and its release thaws after the marker",
          "[groups]") {
  HookLog hooks;
  Fixture f(hooks.Hooks());
  REQUIRE(f.devs["a"]->Write(0, cdp::ByteSpan(cdp::Bytes(4096, 1)), false).ok());
  proto::GroupHeld frozen = f.Hold(21, {"a", "b"}, 5000, true);
  REQUIRE(frozen.status == proto::GroupHoldStatus::kHeld);
  CHECK(hooks.Wait(1) == std::vector<std::string>{"freeze 1"});
  // A freeze holds no write: the application's own hook quiesces it.
  REQUIRE(f.devs["a"]->Write(4096, cdp::ByteSpan(cdp::Bytes(4096, 2)), false).ok());
  const uint64_t before = f.Last("a");
  REQUIRE(f.Hold(21, {"a", "b"}).status == proto::GroupHoldStatus::kHeld);
  f.Release(21, "group.app.21.2.tag.nightly");
  CHECK(hooks.Wait(2) == std::vector<std::string>{"freeze 1", "thaw"});
  GroupHolds::Released r = f.holds.last_released();
  REQUIRE(r.marked.size() == 2);
  CHECK(r.marked[0] == std::pair<std::string, uint64_t>{"a", before + 1});
  CHECK(f.holds.freeze_stats().frozen == 1);
  CHECK(f.holds.freeze_stats().thawed_at_timeout == 0);
}

TEST_CASE("a freeze with no release thaws by itself at its window, a second one is refused while it is on, and a "
          "failed freeze hook is refused and still thawed",
          "[groups]") {
  HookLog hooks;
  Fixture f(hooks.Hooks(2000));
  REQUIRE(f.Hold(31, {"a"}, 300, true).status == proto::GroupHoldStatus::kHeld);
  proto::GroupHeld second = f.Hold(32, {"b"}, 300, true);
  CHECK(second.status == proto::GroupHoldStatus::kRefused);
  CHECK(second.message == "the application is frozen for group round 31");
  // The coordinator never releases round 31 (it died): the agent thaws.
  CHECK(hooks.Wait(2) == std::vector<std::string>{"freeze 1", "thaw"});
  CHECK(f.holds.freeze_stats().thawed_at_timeout == 1);
  f.Release(31, "");  // late: nothing thaws twice
  f.Release(32, "");

  proto::GroupHeld over = f.Hold(33, {"a"}, 2001, true);
  CHECK(over.status == proto::GroupHoldStatus::kRefused);
  CHECK(over.message == "a freeze of 2001 ms is above this agent's freeze_timeout (2000 ms)");
  proto::GroupHeld unknown = f.Hold(34, {"a", "nope"}, 300, true);
  CHECK(unknown.message == "no volume nope at this agent");

  {
    std::lock_guard<std::mutex> l(hooks.mu);
    hooks.freeze_result = cdp::Status::Aborted("hook 'fsfreeze -f /data' failed (exit 1)");
  }
  proto::GroupHeld failed = f.Hold(35, {"a"}, 300, true);
  CHECK(failed.status == proto::GroupHoldStatus::kRefused);
  CHECK(failed.message.find("freeze hook: ") == 0);
  CHECK(failed.message.find("fsfreeze -f /data") != std::string::npos);
  // Thawed at once, not at the window; the refused ones never froze.
  CHECK(hooks.Wait(4) == std::vector<std::string>{"freeze 1", "thaw", "freeze 1", "thaw"});
  CHECK(f.holds.freeze_stats().frozen == 1);
  CHECK(f.holds.freeze_stats().refused == 4);
  CHECK(f.holds.freeze_stats().thawed_at_timeout == 1);
}

TEST_CASE("a group freeze asked sooner than group_freeze_min_interval after the last one is refused", "[groups]") {
  HookLog hooks;
  GroupHolds::Hooks h = hooks.Hooks();
  h.min_interval_ms = 3'600'000;
  Fixture f(std::move(h));
  REQUIRE(f.Hold(41, {"a"}, 300, true).status == proto::GroupHoldStatus::kHeld);
  f.Release(41, "");
  CHECK(hooks.Wait(2) == std::vector<std::string>{"freeze 1", "thaw"});
  proto::GroupHeld again = f.Hold(42, {"a"}, 300, true);
  CHECK(again.status == proto::GroupHoldStatus::kRefused);
  CHECK(again.message.find("the last group freeze began ") == 0);
  CHECK(again.message.find("ms ago (group_freeze_min_interval 3600000 ms)") != std::string::npos);
  // Crash-consistent holds are not limited by it.
  CHECK(f.Hold(43, {"a"}).status == proto::GroupHoldStatus::kHeld);
  f.Release(43, "");
}
