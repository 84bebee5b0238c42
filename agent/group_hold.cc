// SPDX-License-Identifier: Apache-2.0
#include "agent/group_hold.h"

#include <chrono>

#include "common/base/log.h"

namespace cdp::agent {

namespace {
// Rounds whose release never came (the coordinator died): forgotten past this
// many, oldest first. Their holds lapsed long ago.
constexpr size_t kMaxRounds = 64;
}  // namespace

GroupHolds::GroupHolds(Find find, uint64_t max_hold_ms)
    : find_(std::move(find)), max_hold_ms_(max_hold_ms), answerer_([this] { Answer(); }) {}

GroupHolds::~GroupHolds() { Stop(); }

void GroupHolds::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (answerer_.joinable()) answerer_.join();
}

void GroupHolds::OnRequest(proto::Message m, Send send) {
  if (auto* h = std::get_if<proto::GroupHold>(&m)) {
    proto::GroupHeld held = Hold(*h);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) return;
      outbox_.emplace_back(std::move(send), std::move(held));
    }
    cv_.notify_all();
  } else if (auto* r = std::get_if<proto::GroupRelease>(&m)) {
    Release(*r);
  }
}

proto::GroupHeld GroupHolds::Hold(const proto::GroupHold& h) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(h.timeout_ms);
  std::vector<CaptureDevice*> held;
  std::string refused;
  if (max_hold_ms_ == 0) {
    refused = "this agent takes no group holds (group_hold_max = 0)";
  } else if (h.timeout_ms > max_hold_ms_) {
    refused = "a hold of " + std::to_string(h.timeout_ms) + " ms is above this agent's group_hold_max (" +
              std::to_string(max_hold_ms_) + " ms)";
  }
  for (const std::string& v : refused.empty() ? h.volumes : std::vector<std::string>{}) {
    CaptureDevice* d = find_(v);
    if (d == nullptr) {
      refused = "no volume " + v + " at this agent";
      break;
    }
    auto lk = d->queue().Lock();
    if (!d->ConsistentLocked()) {
      refused = "volume " + v + " cannot promise a consistent point now (mode " +
                std::string(ModeName(d->queue().ModeLocked())) + " or resync pending)";
      break;
    }
    if (!d->queue().HoldLocked(h.round, deadline)) {
      refused = "volume " + v + " is held by another group round";
      break;
    }
    held.push_back(d);
  }
  if (!refused.empty()) {
    for (CaptureDevice* d : held) {
      auto lk = d->queue().Lock();
      (void)d->queue().EndHoldLocked(h.round);
    }
    log::Get("agent")->warn("group round {} refused: {}", h.round, refused);
    return proto::GroupHeld{h.round, proto::GroupHoldStatus::kRefused, refused};
  }
  std::lock_guard<std::mutex> l(mu_);
  rounds_[h.round] = std::move(held);
  while (rounds_.size() > kMaxRounds) rounds_.erase(rounds_.begin());
  return proto::GroupHeld{h.round, proto::GroupHoldStatus::kHeld, ""};
}

void GroupHolds::Release(const proto::GroupRelease& r) {
  std::vector<CaptureDevice*> held;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = rounds_.find(r.round);
    if (it == rounds_.end()) return;  // refused, or forgotten: nothing is held
    held = std::move(it->second);
    rounds_.erase(it);
  }
  Released out;
  out.round = r.round;
  for (CaptureDevice* d : held) {
    auto lk = d->queue().Lock();
    // Ended and marked under one lock: no write comes between.
    const bool on_time = d->queue().EndHoldLocked(r.round);
    if (r.marker.empty()) continue;
    if (!on_time) {
      log::Get("agent")->warn("{} group round {} released after its hold lapsed: no marker '{}'",
                              log::Where{d->volume(), "", 0}, r.round, r.marker);
      continue;
    }
    if (!d->ConsistentLocked()) continue;  // the queue changed mode under the hold: no point here
    const uint64_t seq = d->queue().AppendTagLocked(r.marker);
    if (seq != 0) out.marked.emplace_back(d->volume(), seq);
  }
  std::lock_guard<std::mutex> l(mu_);
  last_ = std::move(out);
}

GroupHolds::Released GroupHolds::last_released() const {
  std::lock_guard<std::mutex> l(mu_);
  return last_;
}

void GroupHolds::Answer() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || !outbox_.empty(); });
    if (stop_) return;
    auto [send, held] = std::move(outbox_.front());
    outbox_.pop_front();
    l.unlock();
    if (Status s = send(held); !s.ok()) {
      log::Get("agent")->warn("group round {}: answer not sent: {}", held.round, s.ToString());
    }
    l.lock();
  }
}

}  // namespace cdp::agent
