// SPDX-License-Identifier: Apache-2.0
// Deterministic random numbers for load generation: SplitMix64 (a small,
// seedable generator whose output depends only on the seed and the number of
// calls) and a Zipf sampler over [0, n) (Gray et al., "Quickly generating
// billion-record synthetic databases", SIGMOD 1994, as used by YCSB).
//
// Thread safety: objects are not thread-safe; use one per thread.
#pragma once

#include <cstdint>

namespace cdp::loadgen {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : s_(seed) {}
  uint64_t Next();
  // Uniform in [0, n); n > 0 (n == 0 returns 0).
  uint64_t Below(uint64_t n);
  // Uniform in [0, 1).
  double Unit();

 private:
  uint64_t s_;
};

// Mixes `a` and `b` into one well-spread 64-bit value (for per-item seeds).
uint64_t MixSeed(uint64_t a, uint64_t b);

// Zipf-distributed integers in [0, n): rank 0 is the most frequent, with
// P(k) proportional to 1 / (k+1)^theta. 0 < theta < 1 (theta = 0.99 is YCSB's
// default); n >= 1. Construction costs O(n) (the zeta sum), sampling O(1).
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double theta);
  uint64_t Next(SplitMix64& rng);
  uint64_t n() const { return n_; }
  double theta() const { return theta_; }

 private:
  uint64_t n_;
  double theta_;
  double alpha_ = 0, zetan_ = 0, eta_ = 0, zeta2_ = 0;
};

}  // namespace cdp::loadgen
