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

TEST_CASE("wanem ports: one HTB class per port and direction, the rest in the default class", "[wanem]") {
  auto cmds = PortShapingCommands("lo", 12.5, {7500, 10810});
  REQUIRE(cmds.size() == 2 + 2 * 2 * 2);
  CHECK(cmds[0] == std::vector<std::string>{"tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default",
                                            "99", "r2q", "1000"});
  CHECK(cmds[1] == std::vector<std::string>{"tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:99", "htb",
                                            "rate", "100gbit"});
  CHECK(cmds[2] == std::vector<std::string>{"tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb",
                                            "rate", "12.5mbit", "ceil", "12.5mbit", "burst", "256kb"});
  CHECK(cmds[3] == std::vector<std::string>{"tc", "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio",
                                            "1", "u32", "match", "ip", "dport", "7500", "0xffff", "flowid", "1:10"});
  CHECK(cmds[5].at(14) == "sport");
  CHECK(cmds[5].at(18) == "1:11");
  CHECK(cmds[9].at(14) == "sport");
  CHECK(cmds[9].at(15) == "10810");
  CHECK(cmds[9].at(18) == "1:13");
}

// On the loopback of a network namespace of its own: the machine's lo may be
// carrying someone's measurement.
TEST_CASE("wanem ports up/down: the classes and filters appear, and go (root only)", "[wanem][e2e]") {
  if (::geteuid() != 0) {
    WARN("SKIPPED: wanem ports needs root (tc); running as uid " << ::geteuid());
    return;
  }
  const std::string ns = "cdplg" + std::to_string(::getpid() % 100000);
  if (RunShell("ip netns add " + ns + " && ip -n " + ns + " link set lo up").exit_code != 0) {
    WARN("SKIPPED: 'ip netns add' does not work here");
    return;
  }
  const std::string in = "ip netns exec " + ns + " ", bin = in + CDP_LOADGEN_BIN;
  auto up = RunShell(bin + " wanem ports up --rate-mbit 40 --port 7500 --port 7501");
  auto classes = RunShell(in + "tc class show dev lo");
  auto filters = RunShell(in + "tc filter show dev lo");
  auto again = RunShell(bin + " wanem ports up --rate-mbit 80 --port 7502");  // replaces the first
  auto classes2 = RunShell(in + "tc class show dev lo");
  auto down = RunShell(bin + " wanem ports down");
  auto after = RunShell(in + "tc qdisc show dev lo root");
  auto down2 = RunShell(bin + " wanem ports down");  // nothing left: nothing to do
  RunShell("ip netns del " + ns);
  INFO(up.output << classes.output << filters.output << again.output << down.output << after.output);
  REQUIRE(up.exit_code == 0);
  for (const char* id : {"1:10", "1:11", "1:12", "1:13", "1:99"})
    CHECK(classes.output.find(std::string("class htb ") + id) != std::string::npos);
  CHECK(classes.output.find("rate 40Mbit") != std::string::npos);
  CHECK(filters.output.find("match 00001d4c/0000ffff at 20") != std::string::npos);  // dport 7500
  CHECK(filters.output.find("match 1d4d0000/ffff0000 at 20") != std::string::npos);  // sport 7501
  CHECK(again.exit_code == 0);
  CHECK(classes2.output.find("1:12") == std::string::npos);
  CHECK(classes2.output.find("rate 80Mbit") != std::string::npos);
  CHECK(down.exit_code == 0);
  CHECK(after.output.find("htb") == std::string::npos);
  CHECK(down2.exit_code == 0);
}
