// SPDX-License-Identifier: Apache-2.0
// Pacer: a token bucket on a cdp::Clock that holds a byte rate.
//
// Tokens (bytes) accrue at `rate` per second up to `burst`. Reserve(n) takes n
// tokens at once, letting the balance go negative, and answers how long the
// caller must wait before doing the I/O so that the long-run rate never exceeds
// `rate` (and, when I/O is fast enough, equals it). With a slow target the
// balance refills during the I/O, up to `burst`, so a short stall is caught up.
//
//   Pacer p(clock, 50e6, 4 << 20);
//   uint64_t wait = p.Reserve(65536);   // micros
//   sleeper(wait); target.Write(...);
//
// Thread safety: not thread-safe (one pacer per driving thread).
#pragma once

#include <cstdint>

#include "common/base/clock.h"

namespace cdp::loadgen {

class Pacer {
 public:
  // `clock` must outlive the Pacer. rate > 0 bytes per second; burst >= 1 byte.
  // The bucket starts empty (no initial burst).
  Pacer(const Clock* clock, double rate_bytes_per_sec, uint64_t burst_bytes);

  // Takes `n` tokens; returns the micros to wait until they are covered (0 = go).
  uint64_t Reserve(uint64_t n);
  double rate() const { return rate_; }

 private:
  void Refill();
  const Clock* clock_;
  double rate_;
  double burst_;
  double tokens_ = 0;
  uint64_t last_us_;
};

}  // namespace cdp::loadgen
