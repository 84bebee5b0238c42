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

GroupHolds::GroupHolds(Find find, uint64_t max_hold_ms, Hooks hooks)
    : find_(std::move(find)), max_hold_ms_(max_hold_ms), hooks_(std::move(hooks)), worker_([this] { Work(); }) {}

GroupHolds::~GroupHolds() { Stop(); }

void GroupHolds::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void GroupHolds::OnRequest(proto::Message m, Send send) {
  std::function<void()> job;
  if (auto* h = std::get_if<proto::GroupHold>(&m)) {
    if (h->freeze) {
      job = [this, h = std::move(*h), send = std::move(send), came = Clock::now()] {
        const proto::GroupHeld held = Freeze(h, came);
        if (Status s = send(held); !s.ok())
          log::Get("agent")->warn("group round {}: answer not sent: {}", held.round, s.ToString());
      };
    } else {
      job = [held = Hold(*h), send = std::move(send)] {
        if (Status s = send(held); !s.ok())
          log::Get("agent")->warn("group round {}: answer not sent: {}", held.round, s.ToString());
      };
    }
  } else if (auto* r = std::get_if<proto::GroupRelease>(&m)) {
    Release(*r);
    // The round's freeze, if any, ends after its marker is queued.
    job = [this, round = r->round] {
      if (frozen_ && frozen_->round == round) Thaw("released");
    };
  } else {
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

proto::GroupHeld GroupHolds::Freeze(const proto::GroupHold& h, Clock::time_point came) {
  const auto until = came + std::chrono::milliseconds(h.timeout_ms);
  std::string refused;
  if (max_hold_ms_ == 0) {
    refused = "this agent takes no group holds (group_hold_max = 0)";
  } else if (h.timeout_ms > hooks_.max_freeze_ms) {
    refused = "a freeze of " + std::to_string(h.timeout_ms) + " ms is above this agent's freeze_timeout (" +
              std::to_string(hooks_.max_freeze_ms) + " ms)";
  } else if (frozen_) {
    refused = "the application is frozen for group round " + std::to_string(frozen_->round);
  } else if (last_freeze_ && came - *last_freeze_ < std::chrono::milliseconds(hooks_.min_interval_ms)) {
    refused = "the last group freeze began " +
              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(came - *last_freeze_).count()) +
              " ms ago (group_freeze_min_interval " + std::to_string(hooks_.min_interval_ms) + " ms)";
  } else {
    for (const std::string& v : h.volumes) {
      if (find_(v) == nullptr) {
        refused = "no volume " + v + " at this agent";
        break;
      }
    }
  }
  if (refused.empty()) {
    frozen_ = Frozen{h.round, until};
    last_freeze_ = Clock::now();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    Status st = left <= 0 ? Status::Aborted("no time left of the freeze window")
                : hooks_.freeze ? hooks_.freeze(uint64_t(left))
                                : Status::OK();
    if (st.ok() && Clock::now() >= until) st = Status::Aborted("the freeze hook outlasted the window");
    if (!st.ok()) {
      refused = "freeze hook: " + st.ToString();
      Thaw("the freeze failed");
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  if (!refused.empty()) {
    ++freeze_stats_.refused;
    log::Get("agent")->warn("group round {}: freeze refused: {}", h.round, refused);
    return proto::GroupHeld{h.round, proto::GroupHoldStatus::kRefused, refused};
  }
  ++freeze_stats_.frozen;
  log::Get("agent")->info("group round {}: application frozen for at most {} ms", h.round, h.timeout_ms);
  return proto::GroupHeld{h.round, proto::GroupHoldStatus::kHeld, ""};
}

void GroupHolds::Thaw(const char* why) {
  const uint64_t round = frozen_->round;
  frozen_.reset();
  if (hooks_.thaw) hooks_.thaw();
  log::Get("agent")->info("group round {}: application thawed ({})", round, why);
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

GroupHolds::FreezeStats GroupHolds::freeze_stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return freeze_stats_;
}

void GroupHolds::Work() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    auto ready = [&] { return stop_ || !jobs_.empty(); };
    if (frozen_) cv_.wait_until(l, frozen_->until, ready);
    else cv_.wait(l, ready);
    if (frozen_ && (stop_ || Clock::now() >= frozen_->until)) {
      const bool stopping = stop_;
      if (!stopping) ++freeze_stats_.thawed_at_timeout;
      l.unlock();
      Thaw(stopping ? "the agent stops" : "no release within the freeze window");
      l.lock();
    }
    if (stop_) return;  // answers not sent yet are dropped
    if (jobs_.empty()) continue;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    l.unlock();
    job();
    l.lock();
  }
}

}  // namespace cdp::agent
