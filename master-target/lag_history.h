// SPDX-License-Identifier: Apache-2.0
// LagHistory: the recent RPO lag of one volume at the master target, and the
// bytes its stream put on the link, for the dashboard's charts (GET /v1/lag,
// master-target/mt_control_api.h).
//
// The lag of an applied batch is the apply time minus the capture time of its
// newest record (what cdp_mt_apply_lag_seconds shows for the last batch). The
// history is a ring of `buckets` time buckets of `bucket_us` each (one hour of
// 30 s buckets by default); a bucket keeps the largest lag of the batches
// applied in it and how many there were, and the wire bytes (compressed
// frames, headers included) of the batches received in it, applied or not:
// the volume's use of the link. Memory is fixed at construction: it
// never grows with the traffic or the uptime. Not persisted: a restarted
// master target starts with an empty history. A bucket without a batch (an
// idle volume, or one whose apply is stalled: see ReplicaVolume::stall()) has
// no lag; a bucket with neither a batch nor wire bytes has no sample.
//
// Thread safety: thread-safe (one mutex); Record runs on the apply threads,
// Samples on the HTTP server's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace cdp::mt {

class LagHistory {
 public:
  // bucket_us > 0 and buckets > 0.
  explicit LagHistory(uint64_t bucket_us = 30'000'000, size_t buckets = 120);

  // A batch applied at wall time `now_us` with lag `lag_seconds` (>= 0).
  void Record(uint64_t now_us, double lag_seconds);
  // Batches of `wire_bytes` on the wire received at wall time `now_us`.
  void AddWireBytes(uint64_t now_us, uint64_t wire_bytes);

  struct Sample {
    uint64_t time_us = 0;        // start of the bucket
    double max_lag_seconds = 0;  // largest lag of a batch applied in it (0 without one)
    uint64_t batches = 0;        // batches applied in it
    uint64_t wire_bytes = 0;     // wire bytes received in it
  };
  // The buckets with a batch or wire bytes among the last `buckets` (the
  // current one included) as of `now_us`, oldest first.
  std::vector<Sample> Samples(uint64_t now_us) const;

  uint64_t bucket_us() const { return bucket_us_; }
  uint64_t window_us() const { return bucket_us_ * ring_.size(); }

 private:
  struct Bucket {
    uint64_t index = 0;  // time_us / bucket_us
    double max_lag = 0;
    uint64_t batches = 0;
    uint64_t wire_bytes = 0;
    bool empty() const { return batches == 0 && wire_bytes == 0; }
  };
  Bucket& At(uint64_t index);  // the bucket of `index`, reset if its slot held an older one; mu_ held
  const uint64_t bucket_us_;
  mutable std::mutex mu_;
  std::vector<Bucket> ring_;  // slot = index % size
};

}  // namespace cdp::mt
