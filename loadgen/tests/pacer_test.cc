// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include "common/base/clock.h"
#include "loadgen/pacer.h"

using namespace cdp;
using namespace cdp::loadgen;

TEST_CASE("Pacer: waits rate-long per reservation, caps idle credit at the burst", "[pacer]") {
  ManualClock clock;
  Pacer p(&clock, 10e6, 1'000'000);  // 10 MB/s, 1 MB burst
  CHECK(p.Reserve(1'000'000) == 100'000);  // starts empty: 1 MB takes 100 ms
  clock.Advance(100'000);
  CHECK(p.Reserve(500'000) == 50'000);
  clock.Advance(50'000);
  clock.Advance(10'000'000);               // idle 10 s: credit capped at 1 MB
  CHECK(p.Reserve(1'000'000) == 0);
  CHECK(p.Reserve(1'000'000) == 100'000);
}

TEST_CASE("Pacer holds the rate over many small reservations", "[pacer]") {
  ManualClock clock;
  const uint64_t start = clock.NowMicros();
  Pacer p(&clock, 3e6, 65536);
  uint64_t bytes = 0;
  while (clock.NowMicros() - start < 20'000'000) {
    clock.Advance(p.Reserve(4096));
    bytes += 4096;
    clock.Advance(37);  // I/O time, covered by the pacing
  }
  double rate = double(bytes) / (double(clock.NowMicros() - start) / 1e6);
  CHECK(rate == Approx(3e6).epsilon(0.01));
}
