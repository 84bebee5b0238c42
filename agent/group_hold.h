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
// Nothing of a round is durable: a restarted agent holds nothing, and no
// hold outlives its timeout whatever happens to the coordinator.
//
// Thread safety: OnRequest runs on the links' reader threads and never
// blocks on the network: answers go out from this object's own thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/capture_device.h"
#include "common/base/status.h"
#include "common/wire/protocol.h"

namespace cdp::agent {

class GroupHolds {
 public:
  using Find = std::function<CaptureDevice*(const std::string& volume)>;
  // A hold asking a timeout above `max_hold_ms` is refused (0: every one).
  GroupHolds(Find find, uint64_t max_hold_ms);
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

 private:
  proto::GroupHeld Hold(const proto::GroupHold& h);
  void Release(const proto::GroupRelease& r);
  void Answer();

  const Find find_;
  const uint64_t max_hold_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::vector<CaptureDevice*>> rounds_;  // held, by round (a lapsed one stays until its release)
  std::deque<std::pair<Send, proto::GroupHeld>> outbox_;
  Released last_;
  bool stop_ = false;
  std::thread answerer_;
};

}  // namespace cdp::agent
