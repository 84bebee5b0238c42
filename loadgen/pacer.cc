// SPDX-License-Identifier: Apache-2.0
#include "loadgen/pacer.h"

#include <algorithm>
#include <cmath>

namespace cdp::loadgen {

Pacer::Pacer(const Clock* clock, double rate, uint64_t burst)
    : clock_(clock), rate_(rate > 0 ? rate : 1.0), burst_(double(std::max<uint64_t>(burst, 1))),
      last_us_(clock->NowMicros()) {}

void Pacer::Refill() {
  uint64_t now = clock_->NowMicros();
  if (now > last_us_) {
    tokens_ = std::min(burst_, tokens_ + double(now - last_us_) * rate_ / 1e6);
    last_us_ = now;
  }
}

uint64_t Pacer::Reserve(uint64_t n) {
  Refill();
  tokens_ -= double(n);
  if (tokens_ >= 0) return 0;
  return uint64_t(std::ceil(-tokens_ * 1e6 / rate_));
}

}  // namespace cdp::loadgen
