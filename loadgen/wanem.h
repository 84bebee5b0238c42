// SPDX-License-Identifier: Apache-2.0
// Wanem: an emulated WAN between two network namespaces (root only).
//
// This kernel has no netem, so the delay (and loss) come from a small TUN
// forwarder in user space, and the rate limit from tbf:
//
//   netns <N>-a                                     netns <N>-b
//   app -> 10.77.0.2 --route--> dly0 (TUN)          dly0 (TUN) <--route-- app -> 10.77.0.1
//                                 |                    ^  |
//              cdp-loadgen wanem forward (delay D, loss P, in the root netns,
//              holds both TUN fds; a packet read from a TUN is written back
//              into the same TUN after D)
//                                 v                       v
//   "iif dly0" -> table 100 -> veth0 (tbf R) ======= veth0 (tbf R) -> local delivery
//   10.77.0.1/32                                    10.77.0.2/32
//
// Each direction passes the delay line once and the tbf once: RTT = 2 x D.
// Re-injected packets carry a local source address, so dly0 has
// accept_local=1 and rp_filter=0; ip_forward=1 in both namespaces.
//
//   cdp-loadgen wanem up --name wan --rate-mbit 100 --delay-ms 12.5 [--loss 0.1]
//   ip netns exec wan-b cdp-master-target --listen 10.77.0.2:7500 ...
//   ip netns exec wan-a cdp-process-server --mt 10.77.0.2:7500 ...
//   cdp-loadgen wanem down --name wan     (stops the forwarder, deletes both netns and /run files)
//
// `wanem probe` measures TCP goodput and connect RTT between the sides (an
// iperf-like sender/receiver), for the WAN benchmark.
//
// `wanem ports` is the other emulator: a link on the loopback itself, for the
// benchmarks that run the whole product on 127.0.0.1 (bench/lib.sh
// bench_link_on / bench_link_off). Each given port gets one HTB class of the
// rate for the traffic to it (u32 match on the destination port) and one for
// the traffic from it (source port): a full-duplex link of that rate each way
// between the port's daemon and its peers; the rest of lo goes through a
// 100 Gbit/s default class (unshaped). No delay (this kernel has htb, tbf and
// u32, not netem or prio). It replaces lo's root qdisc:
//
//   cdp-loadgen wanem ports up --rate-mbit 100 --port 7500 [--port 10810 ...]
//   cdp-loadgen wanem ports down      (deletes lo's root qdisc if it is this HTB)
//
// DelayLine is the forwarder's pure core (tested on a ManualClock).
// Thread safety: DelayLine is not thread-safe; the CLI functions run once.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "common/base/coding.h"
#include "common/base/result.h"
#include "loadgen/rng.h"

namespace cdp::loadgen {

// A FIFO that releases each packet `delay_us` after it entered, dropping a
// share `loss` (0..1) at entry and anything beyond `max_bytes` queued.
class DelayLine {
 public:
  DelayLine(uint64_t delay_us, double loss, uint64_t max_bytes, uint64_t seed)
      : delay_us_(delay_us), loss_(loss), max_bytes_(max_bytes), rng_(seed) {}
  // Returns false when the packet was dropped (loss or overflow).
  bool Push(Bytes packet, uint64_t now_us);
  // Micros until the head is due (0 = due now); UINT64_MAX when empty.
  uint64_t NextDueIn(uint64_t now_us) const;
  // Pops the head if due.
  bool PopDue(uint64_t now_us, Bytes* out);
  size_t size() const { return q_.size(); }
  uint64_t dropped() const { return dropped_; }

 private:
  struct Item {
    uint64_t due;
    Bytes data;
  };
  uint64_t delay_us_;
  double loss_;
  uint64_t max_bytes_;
  SplitMix64 rng_;
  std::deque<Item> q_;
  uint64_t bytes_ = 0;
  uint64_t dropped_ = 0;
};

// The tc commands of `wanem ports up` on device `dev`, in order: the HTB root
// (handle 1:, default class 1:99), the default class, then per port a class
// and a u32 filter for its destination port and for its source port
// (classes 1:10, 1:11, ... in that order). Each is one argv.
std::vector<std::vector<std::string>> PortShapingCommands(const std::string& dev, double rate_mbit,
                                                          const std::vector<uint16_t>& ports);

// The `cdp-loadgen wanem ...` command (argv[0] == "wanem"). Exit code.
int CmdWanem(int argc, char** argv);

}  // namespace cdp::loadgen
