// SPDX-License-Identifier: Apache-2.0
#include "loadgen/rng.h"

#include <cmath>

namespace cdp::loadgen {

uint64_t SplitMix64::Next() {
  uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::Below(uint64_t n) {
  if (n == 0) return 0;
  // 128-bit multiply-shift: unbiased enough for load generation, and exact
  // for the deterministic layout (same seed, same result on every platform).
  return uint64_t((unsigned __int128)Next() * n >> 64);
}

double SplitMix64::Unit() { return double(Next() >> 11) * 0x1.0p-53; }

uint64_t MixSeed(uint64_t a, uint64_t b) {
  SplitMix64 r(a ^ (b * 0xd1b54a32d192ed03ull + 0x632be59bd9b4e019ull));
  r.Next();
  return r.Next();
}

ZipfSampler::ZipfSampler(uint64_t n, double theta) : n_(n == 0 ? 1 : n), theta_(theta) {
  if (!(theta_ > 0.0)) theta_ = 1e-6;
  if (theta_ >= 1.0) theta_ = 0.999999;
  for (uint64_t i = 1; i <= n_; ++i) zetan_ += 1.0 / std::pow(double(i), theta_);
  zeta2_ = 1.0 + 1.0 / std::pow(2.0, theta_);
  alpha_ = 1.0 / (1.0 - theta_);
  eta_ = (1.0 - std::pow(2.0 / double(n_), 1.0 - theta_)) / (1.0 - zeta2_ / zetan_);
}

uint64_t ZipfSampler::Next(SplitMix64& rng) {
  double u = rng.Unit();
  double uz = u * zetan_;
  if (uz < 1.0) return 0;
  if (uz < zeta2_) return n_ > 1 ? 1 : 0;
  uint64_t k = uint64_t(double(n_) * std::pow(eta_ * u - eta_ + 1.0, alpha_));
  return k >= n_ ? n_ - 1 : k;
}

}  // namespace cdp::loadgen
