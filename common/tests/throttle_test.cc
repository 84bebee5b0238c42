// SPDX-License-Identifier: Apache-2.0
#include "common/net/throttle.h"

#include <catch2/catch.hpp>

namespace {

constexpr uint64_t kSec = 1'000'000;

// Moves `clock` forward so that its wall time of day is hh:mm:00 UTC.
void AdvanceToTimeOfDay(cdp::ManualClock& clock, int hh, int mm) {
  uint64_t day = 86400 * kSec;
  uint64_t tod = clock.WallMicros() % day;
  uint64_t want = uint64_t(hh * 3600 + mm * 60) * kSec;
  clock.Advance(want >= tod ? want - tod : day - tod + want);
}

// A sender that always has data: reserves `chunk`, waits as told, sends.
// Returns bytes sent per second in [from, to) (monotonic micros) buckets.
struct Sender {
  cdp::ManualClock& clock;
  cdp::Throttle& throttle;
  uint64_t chunk;
  // Runs until the clock reaches `until`; counts bytes sent inside [from, to).
  uint64_t Run(uint64_t until, uint64_t from, uint64_t to) {
    uint64_t in_window = 0;
    while (clock.NowMicros() < until) {
      uint64_t wait = throttle.Reserve(chunk);
      clock.Advance(wait);
      uint64_t t = clock.NowMicros();
      if (t >= from && t < to) in_window += chunk;
      if (wait == 0) clock.Advance(10);  // sending itself takes a little time
    }
    return in_window;
  }
};

double Mbps(uint64_t bytes, uint64_t micros) { return double(bytes) * 8.0 / double(micros); }

}  // namespace

TEST_CASE("throttle holds a constant rate within 5% over a window", "[throttle]") {
  cdp::ManualClock clock;
  cdp::ThrottleOptions o;
  o.default_mbps = 20;
  cdp::Throttle t(&clock, o);
  Sender s{clock, t, 64 << 10};
  uint64_t start = clock.NowMicros();
  uint64_t bytes = s.Run(start + 70 * kSec, start + 10 * kSec, start + 70 * kSec);
  double rate = Mbps(bytes, 60 * kSec);
  CHECK(rate > 20 * 0.95);
  CHECK(rate < 20 * 1.05);
  CHECK(t.state().throttling);
  CHECK(t.state().limit_mbps == 20);
}

TEST_CASE("throttle follows a daily schedule across a window edge", "[throttle]") {
  cdp::ManualClock clock;
  AdvanceToTimeOfDay(clock, 17, 58);
  cdp::ThrottleOptions o;
  o.default_mbps = 100;
  auto sched = cdp::ParseSchedule("20@08:00-18:00");
  REQUIRE(sched.ok());
  o.schedule = *sched;
  cdp::Throttle t(&clock, o);
  CHECK(t.CurrentMbps() == 20);
  Sender s{clock, t, 32 << 10};
  uint64_t t0 = clock.NowMicros();  // 17:58:00
  // 17:59-18:00 at 20 Mbit/s, then 18:00-18:01 at 100 Mbit/s.
  uint64_t before = s.Run(t0 + 120 * kSec, t0 + 60 * kSec, t0 + 120 * kSec);
  CHECK(t.CurrentMbps() == 100);
  uint64_t after = s.Run(t0 + 180 * kSec, t0 + 120 * kSec, t0 + 180 * kSec);
  double r1 = Mbps(before, 60 * kSec), r2 = Mbps(after, 60 * kSec);
  CHECK(r1 > 20 * 0.95);
  CHECK(r1 < 20 * 1.05);
  CHECK(r2 > 100 * 0.95);
  CHECK(r2 < 100 * 1.05);
}

TEST_CASE("throttle with a window that wraps midnight and an unlimited default", "[throttle]") {
  cdp::ManualClock clock;
  AdvanceToTimeOfDay(clock, 23, 0);
  cdp::ThrottleOptions o;
  o.default_mbps = 0;  // unlimited outside the window
  auto sched = cdp::ParseSchedule("8@22:00-06:00");
  REQUIRE(sched.ok());
  o.schedule = *sched;
  cdp::Throttle t(&clock, o);
  Sender s{clock, t, 16 << 10};
  uint64_t t0 = clock.NowMicros();
  uint64_t bytes = s.Run(t0 + 30 * kSec, t0, t0 + 30 * kSec);
  double r = Mbps(bytes, 30 * kSec);
  CHECK(r > 8 * 0.95);
  CHECK(r < 8 * 1.05);
  AdvanceToTimeOfDay(clock, 7, 0);
  CHECK(t.CurrentMbps() == 0);
  CHECK(t.Reserve(100 << 20) == 0);
}

TEST_CASE("throttle reconfigured at run time takes the new rate", "[throttle]") {
  cdp::ManualClock clock;
  cdp::ThrottleOptions o;
  o.default_mbps = 50;
  cdp::Throttle t(&clock, o);
  Sender s{clock, t, 64 << 10};
  uint64_t t0 = clock.NowMicros();
  s.Run(t0 + 5 * kSec, 0, 0);
  o.default_mbps = 10;
  t.Reconfigure(o);
  uint64_t t1 = clock.NowMicros();
  uint64_t bytes = s.Run(t1 + 40 * kSec, t1 + 5 * kSec, t1 + 40 * kSec);
  double r = Mbps(bytes, 35 * kSec);
  CHECK(r > 10 * 0.95);
  CHECK(r < 10 * 1.05);
}

TEST_CASE("throttle schedule parser", "[throttle]") {
  auto ok = cdp::ParseSchedule(" 20@08:00-18:00, 5.5@22:30-06:00 ");
  REQUIRE(ok.ok());
  REQUIRE(ok->size() == 2);
  CHECK((*ok)[0].mbps == 20);
  CHECK((*ok)[0].start_minute == 480);
  CHECK((*ok)[0].end_minute == 1080);
  CHECK((*ok)[1].mbps == 5.5);
  CHECK((*ok)[1].start_minute == 1350);
  CHECK((*ok)[1].end_minute == 360);
  CHECK(cdp::ParseSchedule("")->empty());
  for (const char* bad : {"20", "20@8:00-18:00", "x@08:00-18:00", "20@08:00-08:00", "20@25:00-01:00",
                          "-1@08:00-09:00", "20@08:00"}) {
    auto r = cdp::ParseSchedule(bad);
    CHECK(r.status().code() == cdp::Code::kInvalidArgument);
  }
}
