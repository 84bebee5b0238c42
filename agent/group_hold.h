// SPDX-License-Identifier: Apache-2.0
// GroupHolds: the agent's side of a group point (docs/groups.md). The
// process server coordinating a consistency group sends GroupHold{round,
// timeout_ms, volumes} on one of the agent's links; for each named volume
// this takes the capture lock, checks that the volume can promise a
// consistent point (CaptureDevice::ConsistentLocked) and puts the hold on
// (CaptureQueue::HoldLocked) until now + timeout_ms. Then it answers
// GroupHeld{kHeld}, or kRefused with the reason (a timeout above the agent's
// group_hold_max, an unknown volume, one that cannot promise a point, one
// already held by another round), after ending the holds it had put on. GroupRelease{round, marker} ends the round's
// holds; when the marker is non-empty and a volume's hold had not lapsed, a
// kTag record named `marker` is queued first, at the held place. A hold
// that lapsed gets no marker, so the coordinator's point lacks this member's
// marker and is never listed as a group point at the master target.
//
// An application-consistent group tag starts with GroupHold{freeze}: this
// object's thread runs the agent's freeze hook (Hooks::freeze, bounded by the
// time left of the request's timeout_ms), answers kHeld once it returned or
// kRefused when it failed, and runs the thaw hook (Hooks::thaw) on the
// round's GroupRelease, or by itself timeout_ms after the request came,
// whichever is first. Thaw follows every freeze call, failed or not, exactly
// once. One freeze at a time: a second round's is refused while one is on.
// The ordinary hold of the same round then marks the volumes while the
// application is frozen.
//
// Nothing of a round is durable: a restarted agent holds nothing, and no
// hold outlives its timeout whatever happens to the coordinator; nor does a
// freeze (Stop thaws).
//
// Thread safety: OnRequest runs on the links' reader threads and never
// blocks on the network or a hook: answers and hooks run on this object's
// own thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/capture_device.h"
#include "common/base/status.h"
#include "common/wire/protocol.h"

namespace cdp::agent {

// The agent's freeze and thaw hooks, as a group tag runs them.
struct GroupFreezeHooks {
  // Freezes the application, in at most timeout_ms (null: nothing to
  // freeze, a freeze is answered at once). Called on GroupHolds' thread.
  std::function<Status(uint64_t timeout_ms)> freeze;
  // Thaws it; called once after every freeze call (null: nothing to do).
  std::function<void()> thaw;
  uint64_t max_freeze_ms = 10'000;  // a freeze window above this is refused
  // A freeze asked sooner than this after the last one began is refused: a
  // coordinator (a compromised PS) cannot keep the application frozen.
  uint64_t min_interval_ms = 0;
};

class GroupHolds {
 public:
  using Find = std::function<CaptureDevice*(const std::string& volume)>;
  using Hooks = GroupFreezeHooks;
  // A hold asking a timeout above `max_hold_ms` is refused (0: every one,
  // and every freeze).
  GroupHolds(Find find, uint64_t max_hold_ms, Hooks hooks = {});
  ~GroupHolds();  // Stop()s
  GroupHolds(const GroupHolds&) = delete;
  GroupHolds& operator=(const GroupHolds&) = delete;

  // Sends one answer to the process server (the link the hold came on:
  // ReplicationSender::Send); called from this object's own thread.
  using Send = std::function<Status(const proto::Message&)>;
  // A GroupHold or GroupRelease; the answer to a hold goes out through
  // `send`. Other messages are ignored.
  void OnRequest(proto::Message m, Send send);
  // Joins the answering thread; answers not sent yet are dropped. Call after
  // the links are stopped.
  void Stop();

  // The round's markers as queued: volume -> sequence (tests, logs).
  struct Released {
    uint64_t round = 0;
    std::vector<std::pair<std::string, uint64_t>> marked;
  };
  Released last_released() const;

  struct FreezeStats {
    uint64_t frozen = 0;            // freezes answered kHeld
    uint64_t refused = 0;           // freeze requests refused (hook failed, busy, over the cap)
    uint64_t thawed_at_timeout = 0; // thawed with no release
  };
  FreezeStats freeze_stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  proto::GroupHeld Hold(const proto::GroupHold& h);
  void Release(const proto::GroupRelease& r);
  // On the worker: the freeze of `h`, which came at `came`.
  proto::GroupHeld Freeze(const proto::GroupHold& h, Clock::time_point came);
  void Thaw(const char* why);  // worker only, frozen_ set
  void Work();

  const Find find_;
  const uint64_t max_hold_ms_;
  const Hooks hooks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::vector<CaptureDevice*>> rounds_;  // held, by round (a lapsed one stays until its release)
  std::deque<std::function<void()>> jobs_;                 // for the worker, in order
  Released last_;
  FreezeStats freeze_stats_;
  bool stop_ = false;
  struct Frozen {
    uint64_t round = 0;
    Clock::time_point until;
  };
  std::optional<Frozen> frozen_;  // the worker's alone
  std::optional<Clock::time_point> last_freeze_;  // when the last hook began (the worker's alone)
  std::thread worker_;
};

}  // namespace cdp::agent
