// SPDX-License-Identifier: Apache-2.0
#include "agent/capture_queue.h"

#include <algorithm>
#include <chrono>

#include "common/base/log.h"

namespace cdp::agent {

std::string_view ModeName(CaptureMode m) {
  switch (m) {
    case CaptureMode::kData: return "data";
    case CaptureMode::kMetadata: return "metadata";
    case CaptureMode::kBitmap: return "bitmap";
  }
  return "unknown";
}

CaptureQueue::CaptureQueue(Options opts) : opts_(std::move(opts)) {
  if (opts_.budget < (1u << 20)) opts_.budget = 1u << 20;
  if (opts_.clock == nullptr) opts_.clock = SystemClock::Get();
  data_limit_ = opts_.budget - opts_.budget / 8;
}

std::unique_lock<std::mutex> CaptureQueue::LockForWrite() {
  std::unique_lock<std::mutex> l(mu_);
  if (hold_round_ == 0) return l;
  const auto start = std::chrono::steady_clock::now();
  while (hold_round_ != 0) {
    if (std::chrono::steady_clock::now() >= hold_deadline_) {
      log::Get("agent")->warn("{} group hold {} lapsed after its timeout: writes flow again",
                              log::Where{opts_.volume, "", next_seq_}, hold_round_);
      hold_round_ = 0;
      ++st_.holds_lapsed;
      hold_cv_.notify_all();
      break;
    }
    hold_cv_.wait_until(l, hold_deadline_);
  }
  ++st_.held_writes;
  if (hold_waits_) {
    hold_waits_->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return l;
}

bool CaptureQueue::HoldLocked(uint64_t round, std::chrono::steady_clock::time_point deadline) {
  if (hold_round_ != 0 && std::chrono::steady_clock::now() < hold_deadline_) return false;
  if (hold_round_ != 0) ++st_.holds_lapsed;  // lapsed with nobody waiting
  hold_round_ = round;
  hold_deadline_ = deadline;
  ++st_.holds;
  return true;
}

bool CaptureQueue::EndHoldLocked(uint64_t round) {
  if (hold_round_ != round || round == 0) return false;
  const bool on_time = std::chrono::steady_clock::now() < hold_deadline_;
  if (!on_time) ++st_.holds_lapsed;
  hold_round_ = 0;
  hold_cv_.notify_all();
  return on_time;
}

void CaptureQueue::SetHoldWaits(std::shared_ptr<metrics::Histogram> h) {
  std::lock_guard<std::mutex> l(mu_);
  hold_waits_ = std::move(h);
}

void CaptureQueue::SetModeLocked(CaptureMode m, const char* why) {
  if (m == st_.mode) return;
  CaptureMode old = st_.mode;
  st_.mode = m;
  mode_relaxed_.store(int(m), std::memory_order_relaxed);
  if (m == CaptureMode::kMetadata) ++st_.to_metadata;
  if (m == CaptureMode::kBitmap) ++st_.to_bitmap;
  if (m == CaptureMode::kData) ++st_.to_data;
  auto lg = log::Get("agent");
  const char* effect = m == CaptureMode::kData
                           ? "recovery points resume from here"
                           : (m == CaptureMode::kMetadata ? "no recovery points until drained (data re-read when shipped)"
                                                          : "writes not queued; regions healed by resync");
  lg->warn("{} capture mode {} -> {} ({}; queue {} bytes, {} records): {}",
           log::Where{opts_.volume, "", next_seq_}, ModeName(old), ModeName(m), why, st_.memory_bytes,
           q_.size(), effect);
}

uint64_t CaptureQueue::PushLocked(QueuedRecord r) {
  r.seq = next_seq_++;
  r.timestamp_us = opts_.clock->WallMicros();
  st_.memory_bytes += kEntryOverhead + r.data_size();
  st_.peak_memory_bytes = std::max(st_.peak_memory_bytes, st_.memory_bytes);
  uint64_t seq = r.seq;
  q_.push_back(std::move(r));
  if (on_append_) on_append_();
  return seq;
}

bool CaptureQueue::HasRoomLocked(uint64_t len) const {
  return st_.mode == CaptureMode::kData && st_.memory_bytes + kEntryOverhead + len <= data_limit_;
}

uint64_t CaptureQueue::AppendLocked(proto::RecordKind kind, uint64_t offset, uint32_t length, ByteSpan data,
                                    std::shared_ptr<const Bytes> copy) {
  ++st_.captured_ops;
  st_.captured_bytes += length;
  QueuedRecord r;
  r.offset = offset;
  r.length = length;
  r.kind = kind;
  uint64_t cost = kEntryOverhead + (kind == proto::RecordKind::kData ? length : 0);
  if (st_.mode == CaptureMode::kData && st_.memory_bytes + cost > data_limit_) {
    SetModeLocked(CaptureMode::kMetadata, "memory budget reached");
  }
  if (st_.mode != CaptureMode::kBitmap && st_.memory_bytes + kEntryOverhead > opts_.budget) {
    SetModeLocked(CaptureMode::kBitmap, "metadata reserve exhausted");
  }
  if (st_.mode == CaptureMode::kBitmap) {
    ++st_.bitmap_mode_ops;
    return 0;
  }
  if (kind == proto::RecordKind::kData) {
    if (st_.mode == CaptureMode::kData) {
      r.has_data = true;
      r.data = (copy && copy->size() == data.size()) ? std::move(copy)
                                                      : std::make_shared<const Bytes>(data.begin(), data.end());
    }
  }
  return PushLocked(std::move(r));
}

uint64_t CaptureQueue::AppendFlushLocked(bool consistent) {
  if (st_.mode != CaptureMode::kData || !consistent || st_.memory_bytes + kEntryOverhead > opts_.budget) {
    ++st_.flushes_suppressed;
    return 0;
  }
  ++st_.flushes_recorded;
  QueuedRecord r;
  r.kind = proto::RecordKind::kFlush;
  return PushLocked(std::move(r));
}

uint64_t CaptureQueue::AppendTagLocked(std::string_view name) {
  if (st_.mode == CaptureMode::kBitmap) return 0;
  QueuedRecord r;
  r.kind = proto::RecordKind::kTag;
  r.data = std::make_shared<const Bytes>(name.begin(), name.end());  // offset = length = 0 (protocol.md)
  return PushLocked(std::move(r));
}

uint64_t CaptureQueue::AppendAnomalyLocked(uint64_t clean_seq, std::string_view message) {
  if (st_.mode == CaptureMode::kBitmap) return 0;
  QueuedRecord r;
  r.kind = proto::RecordKind::kAnomaly;
  const uint64_t back = next_seq_ - std::min(clean_seq, next_seq_ - 1);
  r.data = std::make_shared<const Bytes>(proto::EncodeAnomaly(back, message));  // offset = length = 0
  ++st_.anomalies;
  st_.last_anomaly = std::string(message);
  return PushLocked(std::move(r));
}

uint64_t CaptureQueue::AppendResyncLocked(uint64_t offset, uint32_t length, Bytes data) {
  if (!HasRoomLocked(data.size())) return 0;
  QueuedRecord r;
  r.offset = offset;
  r.length = length;
  if (data.empty()) {
    r.kind = proto::RecordKind::kZero;
  } else {
    r.kind = proto::RecordKind::kData;
    r.has_data = true;
    r.data = std::make_shared<const Bytes>(std::move(data));
  }
  return PushLocked(std::move(r));
}

bool CaptureQueue::Peek(uint64_t from_seq, uint64_t max_bytes, size_t max_records,
                        std::vector<QueuedRecord>* out) {
  out->clear();
  std::lock_guard lk(mu_);
  if (q_.empty() || from_seq >= next_seq_) return false;
  uint64_t first = q_.front().seq;
  size_t i = from_seq > first ? size_t(from_seq - first) : 0;
  uint64_t bytes = 0;
  uint64_t work = 0;  // what the batch asks of the master target (proto::kMaxBatchWork)
  for (; i < q_.size() && out->size() < max_records; ++i) {
    const QueuedRecord& r = q_[i];
    uint64_t cost = r.kind == proto::RecordKind::kData ? r.length : r.data_size();
    const bool ranged = r.kind == proto::RecordKind::kData || r.kind == proto::RecordKind::kZero ||
                        r.kind == proto::RecordKind::kTrim;
    if (!out->empty() && (bytes + cost > max_bytes || (ranged && work + r.length > proto::kMaxBatchWork))) break;
    bytes += cost;
    if (ranged) work += r.length;
    out->push_back(r);
  }
  return !out->empty();
}

void CaptureQueue::SetOnAppend(std::function<void()> fn) {
  std::lock_guard lk(mu_);
  on_append_ = std::move(fn);
}

size_t CaptureQueue::Ack(uint64_t durable) {
  std::lock_guard lk(mu_);
  size_t n = 0;
  while (!q_.empty() && q_.front().seq <= durable) {
    st_.memory_bytes -= kEntryOverhead + q_.front().data_size();
    q_.pop_front();
    ++n;
  }
  if (durable > acked_) acked_ = std::min(durable, next_seq_ - 1);
  if (q_.empty() && st_.mode != CaptureMode::kData) SetModeLocked(CaptureMode::kData, "queue drained");
  return n;
}

bool CaptureQueue::Resume(uint64_t durable,
                          const std::function<void(uint64_t old_acked, uint64_t new_acked)>& renumbered) {
  {
    std::lock_guard lk(mu_);
    resumed_ = true;
    if (durable < acked_ || durable >= next_seq_) {
      ++renumbers_;
      // Renumber: the first queued record becomes durable+1.
      uint64_t s = durable + 1;
      for (auto& r : q_) r.seq = s++;
      next_seq_ = s;
      uint64_t old = acked_;
      acked_ = durable;
      if (renumbered) renumbered(old, durable);
      return false;
    }
  }
  Ack(durable);
  return true;
}

void CaptureQueue::ResetLocked() {
  q_.clear();
  st_.memory_bytes = 0;
  next_seq_ = 1;
  acked_ = 0;
  resumed_ = false;
  if (st_.mode != CaptureMode::kData) SetModeLocked(CaptureMode::kData, "new generation");
}

uint64_t CaptureQueue::next_seq() const {
  std::lock_guard lk(mu_);
  return next_seq_;
}
uint64_t CaptureQueue::numbering() const {
  std::lock_guard lk(mu_);
  return NumberingLocked();
}
uint64_t CaptureQueue::acked_seq() const {
  std::lock_guard lk(mu_);
  return acked_;
}
CaptureMode CaptureQueue::mode() const { return CaptureMode(mode_relaxed_.load(std::memory_order_relaxed)); }
CaptureQueueStats CaptureQueue::Stats() const {
  std::lock_guard lk(mu_);
  CaptureQueueStats s = st_;
  s.records = q_.size();
  s.next_seq = next_seq_;
  s.acked_seq = acked_;
  return s;
}

}  // namespace cdp::agent
