// SPDX-License-Identifier: Apache-2.0
#include "common/wire/frame_inbox.h"

#include <span>
#include <variant>

#include "common/base/clock.h"

namespace cdp {

namespace {

constexpr uint64_t kMessageCharge = 256;                        // bytes charged per message besides record data
constexpr auto kReceiveSlice = std::chrono::milliseconds(200);  // how often the reader checks stop_

uint64_t Charge(const Result<proto::Message>& m) {
  uint64_t bytes = kMessageCharge;
  if (!m.ok()) return bytes;
  if (const auto* wb = std::get_if<proto::WriteBatch>(&*m)) {
    for (const proto::Record& r : wb->records) bytes += r.data.size() + sizeof(proto::Record);
  }
  return bytes;
}

}  // namespace

FrameInbox::FrameInbox(FrameChannel& ch, uint64_t max_bytes, metrics::Gauge* queued_bytes, Costs* costs,
                       Urgent urgent)
    : ch_(ch),
      max_bytes_(max_bytes),
      gauge_(queued_bytes),
      costs_(costs),
      urgent_(std::move(urgent)),
      reader_([this] { ReadLoop(); }) {}

FrameInbox::~FrameInbox() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  ch_.Close();
  reader_.join();
  std::lock_guard<std::mutex> lk(mu_);
  Account(-int64_t(queued_bytes_));
}

void FrameInbox::Account(int64_t bytes) {
  queued_bytes_ += bytes;
  if (gauge_ != nullptr) gauge_->Add(bytes);
}

void FrameInbox::ReadLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || queued_bytes_ < max_bytes_; });
      if (stop_) return;
    }
    // CPU time only: the wait for the peer's bytes costs none.
    const uint64_t cpu0 = costs_ != nullptr ? ThreadCpuMicros() : 0;
    uint64_t wire = 0;
    Result<proto::Message> m = ch_.Receive(kReceiveSlice, &wire);
    uint64_t now = 0;
    if (costs_ != nullptr) {
      costs_->receive_cpu_us += ThreadCpuMicros() - cpu0;
      now = SystemClock::Get()->NowMicros();
    }
    if (!m.ok() && m.status().IsBusy()) continue;
    if (m.ok() && urgent_ && urgent_(*m)) continue;
    const bool last = !m.ok();
    if (costs_ != nullptr && !last) ++costs_->messages;
    {
      std::lock_guard<std::mutex> lk(mu_);
      Item item{std::move(m), 0, now, wire};
      item.bytes = Charge(item.message);
      Account(int64_t(item.bytes));
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    if (last) return;
  }
}

void FrameInbox::Taken(const Item& item) {
  if (costs_ == nullptr || !item.message.ok()) return;
  const uint64_t now = SystemClock::Get()->NowMicros();
  if (now > item.received_us) costs_->queue_us += now - item.received_us;
}

Result<proto::Message> FrameInbox::Pop(std::chrono::milliseconds timeout, uint64_t* wire_bytes) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return !queue_.empty() || end_.has_value(); })) {
    return Status::Busy("no message within " + std::to_string(timeout.count()) + " ms");
  }
  if (queue_.empty()) return *end_;
  Item item = std::move(queue_.front());
  queue_.pop_front();
  Account(-int64_t(item.bytes));
  Taken(item);
  if (wire_bytes != nullptr) *wire_bytes = item.wire_bytes;
  if (!item.message.ok()) end_ = item.message.status();
  lk.unlock();
  cv_.notify_all();
  return std::move(item.message);
}

std::optional<proto::WriteBatch> FrameInbox::PopBatchFor(uint32_t volume_id, uint64_t first_seq, uint64_t max_work,
                                                         size_t max_records, uint64_t* wire_bytes) {
  std::unique_lock<std::mutex> lk(mu_);
  if (queue_.empty() || !queue_.front().message.ok()) return std::nullopt;
  auto* wb = std::get_if<proto::WriteBatch>(&*queue_.front().message);
  if (wb == nullptr || wb->volume_id != volume_id || wb->records.empty() || wb->records.front().seq != first_seq ||
      wb->records.size() > max_records || proto::BatchWork(std::span<const proto::Record>(wb->records)) > max_work) {
    return std::nullopt;
  }
  std::optional<proto::WriteBatch> out(std::move(*wb));
  Account(-int64_t(queue_.front().bytes));
  Taken(queue_.front());
  if (wire_bytes != nullptr) *wire_bytes = queue_.front().wire_bytes;
  queue_.pop_front();
  lk.unlock();
  cv_.notify_all();
  return out;
}

}  // namespace cdp
