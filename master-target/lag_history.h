// SPDX-License-Identifier: Apache-2.0
// LagHistory: the recent RPO lag of one volume at the master target, for the
// dashboard's sparkline (GET /v1/lag, master-target/mt_control_api.h).
//
// The lag of an applied batch is the apply time minus the capture time of its
// newest record (what cdp_mt_apply_lag_seconds shows for the last batch). The
// history is a ring of `buckets` time buckets of `bucket_us` each (one hour of
// 30 s buckets by default); a bucket keeps the largest lag of the batches
// applied in it and how many there were. Memory is fixed at construction: it
// never grows with the traffic or the uptime. Not persisted: a restarted
// master target starts with an empty history. A bucket without a batch (an
// idle volume, or one whose apply is stalled: see ReplicaVolume::stall()) has
// no sample.
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

  struct Sample {
    uint64_t time_us = 0;        // start of the bucket
    double max_lag_seconds = 0;  // largest lag of a batch applied in it
    uint64_t batches = 0;        // batches applied in it (> 0)
  };
  // The buckets with a batch among the last `buckets` (the current one
  // included) as of `now_us`, oldest first.
  std::vector<Sample> Samples(uint64_t now_us) const;

  uint64_t bucket_us() const { return bucket_us_; }
  uint64_t window_us() const { return bucket_us_ * ring_.size(); }

 private:
  struct Bucket {
    uint64_t index = 0;  // time_us / bucket_us; 0 with batches == 0: empty
    double max_lag = 0;
    uint64_t batches = 0;
  };
  const uint64_t bucket_us_;
  mutable std::mutex mu_;
  std::vector<Bucket> ring_;  // slot = index % size
};

}  // namespace cdp::mt
