// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <unistd.h>

#include "common/base/clock.h"
#include "loadgen/tests/test_util.h"
#include "loadgen/wanem.h"

using namespace cdp;
using namespace cdp::loadgen;

TEST_CASE("DelayLine releases each packet after the delay, in order", "[wanem]") {
  ManualClock clock;
  DelayLine d(25'000, 0.0, 1 << 20, 1);
  CHECK(d.NextDueIn(clock.NowMicros()) == UINT64_MAX);
  REQUIRE(d.Push(Bytes{1}, clock.NowMicros()));
  clock.Advance(10'000);
  REQUIRE(d.Push(Bytes{2, 2}, clock.NowMicros()));
  Bytes out;
  CHECK(d.NextDueIn(clock.NowMicros()) == 15'000);
  CHECK_FALSE(d.PopDue(clock.NowMicros(), &out));
  clock.Advance(15'000);
  REQUIRE(d.PopDue(clock.NowMicros(), &out));
  CHECK(out == Bytes{1});
  CHECK(d.NextDueIn(clock.NowMicros()) == 10'000);
  clock.Advance(10'000);
  REQUIRE(d.PopDue(clock.NowMicros(), &out));
  CHECK(out == (Bytes{2, 2}));
  CHECK(d.size() == 0);
}

TEST_CASE("DelayLine drops the configured share and what overflows its buffer", "[wanem]") {
  DelayLine lossy(1000, 0.25, 1ull << 30, 7);
  int kept = 0;
  for (int i = 0; i < 10000; ++i) kept += lossy.Push(Bytes(100), 0);
  CHECK(kept == Approx(7500).margin(300));
  CHECK(lossy.dropped() == uint64_t(10000 - kept));
  DelayLine small(1000, 0.0, 1000, 1);
  CHECK(small.Push(Bytes(600), 0));
  CHECK_FALSE(small.Push(Bytes(600), 0));
  CHECK(small.Push(Bytes(400), 0));
  CHECK(small.dropped() == 1);
}

TEST_CASE("wanem up/down: rate and delay between two namespaces (root only)", "[wanem][e2e]") {
  if (::geteuid() != 0) {
    WARN("SKIPPED: wanem needs root (network namespaces, tc, TUN); running as uid " << ::geteuid());
    return;
  }
  if (RunShell("ip netns add cdplgprobe && ip netns del cdplgprobe").exit_code != 0) {
    WARN("SKIPPED: 'ip netns add' does not work here");
    return;
  }
  const std::string bin = CDP_LOADGEN_BIN;
  const std::string name = "lgt" + std::to_string(::getpid() % 100000);
  auto up = RunShell(bin + " wanem up --name " + name + " --rate-mbit 20 --delay-ms 20");
  INFO(up.output);
  REQUIRE(up.exit_code == 0);
  CHECK(up.output.find("side B: netns " + name + "-b, address 10.77.0.2") != std::string::npos);
  // Receiver in B for 8 s; sender in A for 3 s over 2 streams (it retries until the receiver listens).
  auto res = RunShell("ip netns exec " + name + "-b " + bin +
                 " wanem probe --mode server --listen 10.77.0.2:5201 --seconds 8 >/dev/null & ip netns exec " +
                 name + "-a " + bin + " wanem probe --mode client --connect 10.77.0.2:5201 --streams 2 --seconds 3 --json; wait");
  auto down = RunShell(bin + " wanem down --name " + name);
  CHECK(down.exit_code == 0);
  INFO(res.output);
  REQUIRE(res.exit_code == 0);
  auto num = [&](const std::string& key) {
    size_t p = res.output.find("\"" + key + "\":");
    REQUIRE(p != std::string::npos);
    return std::stod(res.output.substr(p + key.size() + 3));
  };
  double mbit = num("goodput_mbit"), rtt = num("connect_rtt_ms");
  CHECK(mbit < 20.0);  // tbf holds the rate
  CHECK(mbit > 12.0);  // and the link carries most of it
  CHECK(rtt >= 40.0);  // two delayed directions
  CHECK(rtt < 200.0);
  CHECK(RunShell("ip netns list | grep -q " + name).exit_code != 0);  // down removed both namespaces
}
