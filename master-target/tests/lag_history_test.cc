// SPDX-License-Identifier: Apache-2.0
// LagHistory (master-target/lag_history.h): fixed buckets over a window, the
// largest lag per bucket, nothing older than the window, fixed memory.
#include <catch2/catch.hpp>

#include "master-target/lag_history.h"

using cdp::mt::LagHistory;

TEST_CASE("lag history keeps the largest lag per bucket over the last window only", "[lag_history]") {
  LagHistory h(10'000'000, 6);  // 10 s buckets, one minute
  REQUIRE(h.window_us() == 60'000'000);
  const uint64_t t0 = 1'000'000'000'000;  // a multiple of the bucket
  REQUIRE(h.Samples(t0).empty());
  h.Record(t0 + 1'000'000, 0.5);
  h.Record(t0 + 9'000'000, 2.0);
  h.Record(t0 + 5'000'000, 1.0);
  h.Record(t0 + 25'000'000, 0.25);
  auto s = h.Samples(t0 + 30'000'000);
  REQUIRE(s.size() == 2);
  CHECK(s[0].time_us == t0);
  CHECK(s[0].max_lag_seconds == 2.0);
  CHECK(s[0].batches == 3);
  CHECK(s[1].time_us == t0 + 20'000'000);
  CHECK(s[1].max_lag_seconds == 0.25);
  CHECK(s[1].batches == 1);

  // A minute later the first bucket has left the window; its slot is reused.
  h.Record(t0 + 61'000'000, 4.0);
  s = h.Samples(t0 + 61'000'000);
  REQUIRE(s.size() == 2);
  CHECK(s[0].time_us == t0 + 20'000'000);
  CHECK(s[1].time_us == t0 + 60'000'000);
  CHECK(s[1].max_lag_seconds == 4.0);
  CHECK(s[1].batches == 1);
  // Nothing recorded for over a window: nothing shown.
  CHECK(h.Samples(t0 + 200'000'000).empty());
  // Negative lags (clock skew between sites) count as 0.
  h.Record(t0 + 200'000'000, -3.0);
  s = h.Samples(t0 + 200'000'000);
  REQUIRE(s.size() == 1);
  CHECK(s[0].max_lag_seconds == 0.0);
}

TEST_CASE("lag history sums the wire bytes received per bucket, with or without a batch applied in it",
          "[lag_history]") {
  LagHistory h(10'000'000, 6);
  const uint64_t t0 = 1'000'000'000'000;
  h.AddWireBytes(t0 + 1'000'000, 1000);
  h.AddWireBytes(t0 + 2'000'000, 500);
  h.Record(t0 + 2'000'000, 1.5);
  h.AddWireBytes(t0 + 12'000'000, 0);  // nothing: no sample
  h.AddWireBytes(t0 + 25'000'000, 300);  // received, not applied (a refused batch is sent again)
  auto s = h.Samples(t0 + 30'000'000);
  REQUIRE(s.size() == 2);
  CHECK(s[0].time_us == t0);
  CHECK(s[0].wire_bytes == 1500);
  CHECK(s[0].batches == 1);
  CHECK(s[0].max_lag_seconds == 1.5);
  CHECK(s[1].time_us == t0 + 20'000'000);
  CHECK(s[1].wire_bytes == 300);
  CHECK(s[1].batches == 0);
  CHECK(s[1].max_lag_seconds == 0.0);
  // The slot's next use starts afresh: the old bucket's bytes are not carried over.
  h.AddWireBytes(t0 + 60'000'000, 7);
  s = h.Samples(t0 + 60'000'000);
  REQUIRE(s.size() == 2);
  CHECK(s[1].time_us == t0 + 60'000'000);
  CHECK(s[1].wire_bytes == 7);
  CHECK(s[1].batches == 0);
}
