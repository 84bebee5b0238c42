// SPDX-License-Identifier: Apache-2.0
#include "master-target/lag_history.h"

#include <algorithm>

namespace cdp::mt {

LagHistory::LagHistory(uint64_t bucket_us, size_t buckets)
    : bucket_us_(std::max<uint64_t>(bucket_us, 1)), ring_(std::max<size_t>(buckets, 1)) {}

LagHistory::Bucket& LagHistory::At(uint64_t index) {
  Bucket& b = ring_[index % ring_.size()];
  if (b.index != index || b.empty()) b = Bucket{index, 0, 0, 0};
  return b;
}

void LagHistory::Record(uint64_t now_us, double lag_seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  Bucket& b = At(now_us / bucket_us_);
  b.max_lag = std::max(b.max_lag, std::max(lag_seconds, 0.0));
  ++b.batches;
}

void LagHistory::AddWireBytes(uint64_t now_us, uint64_t wire_bytes) {
  if (wire_bytes == 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  At(now_us / bucket_us_).wire_bytes += wire_bytes;
}

std::vector<LagHistory::Sample> LagHistory::Samples(uint64_t now_us) const {
  const uint64_t now_index = now_us / bucket_us_;
  const uint64_t first = now_index + 1 >= ring_.size() ? now_index + 1 - ring_.size() : 0;
  std::vector<Sample> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (const Bucket& b : ring_) {
    if (b.empty() || b.index < first || b.index > now_index) continue;
    out.push_back(Sample{b.index * bucket_us_, b.max_lag, b.batches, b.wire_bytes});
  }
  std::sort(out.begin(), out.end(), [](const Sample& a, const Sample& b) { return a.time_us < b.time_us; });
  return out;
}

}  // namespace cdp::mt
