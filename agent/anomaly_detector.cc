// SPDX-License-Identifier: Apache-2.0
#include "agent/anomaly_detector.h"

#include <lz4.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace cdp::agent {

namespace {
constexpr size_t kBlock = 4096;
constexpr size_t kMinSample = 1024;
}  // namespace

AnomalyDetector::AnomalyDetector(const AnomalyOptions& opts) : opts_(opts) {
  opts_.sample_every = std::max(opts_.sample_every, 1u);
  opts_.run_windows = std::max(opts_.run_windows, 1u);
  opts_.window_us = std::max<uint64_t>(opts_.window_us, 1000);
  opts_.ewma_alpha = std::clamp(opts_.ewma_alpha, 0.001, 1.0);
  opts_.incompressible_ratio = std::clamp(opts_.incompressible_ratio, 0.0, 2.0);
}

std::optional<Anomaly> AnomalyDetector::OnWrite(uint64_t offset, ByteSpan data, uint64_t now_us, uint64_t seq) {
  if (!opts_.enabled) return std::nullopt;
  std::optional<Anomaly> fired = Advance(now_us);
  bytes_ += data.size();
  if (seq != 0) window_last_seq_ = seq;
  for (size_t pos = 0; pos < data.size();) {
    const size_t len = std::min<size_t>(data.size() - pos, kBlock - (offset + pos) % kBlock);
    if (len >= kMinSample && ++blocks_seen_ % opts_.sample_every == 0) {
      ++samples_;
      ++counters_.blocks_sampled;
      if (Incompressible(data.subspan(pos, len))) {
        ++incompressible_;
        ++counters_.blocks_incompressible;
      }
    }
    pos += len;
  }
  return fired;
}

std::optional<Anomaly> AnomalyDetector::Tick(uint64_t now_us) {
  if (!opts_.enabled) return std::nullopt;
  return Advance(now_us);
}

void AnomalyDetector::Rebaseline() {
  learned_ = 0;
  frac_weight_ = 0;
  base_rate_ = base_frac_ = 0;
  run_ = 0;
  quiet_until_ = 0;
}

bool AnomalyDetector::Incompressible(ByteSpan block) const {
  // LZ4 gives up (returns 0) once the output would not fit: an incompressible
  // block costs no more than the bytes it takes to find out.
  char out[LZ4_COMPRESSBOUND(kBlock)];
  const auto threshold = size_t(std::ceil(opts_.incompressible_ratio * double(block.size())));
  const int capacity = int(std::clamp<size_t>(threshold, 1, sizeof out) - 1);
  if (capacity == 0) return true;
  return LZ4_compress_default(reinterpret_cast<const char*>(block.data()), out, int(block.size()), capacity) == 0;
}

std::optional<Anomaly> AnomalyDetector::Advance(uint64_t now_us) {
  if (!started_) {
    started_ = true;
    window_start_ = now_us;
    return std::nullopt;
  }
  if (now_us < window_start_ || now_us - window_start_ < opts_.window_us) return std::nullopt;
  const uint64_t ended = (now_us - window_start_) / opts_.window_us;
  std::optional<Anomaly> fired = CloseWindow(window_start_ + opts_.window_us);
  CloseIdleWindows(ended - 1);
  window_start_ += ended * opts_.window_us;
  return fired;
}

std::optional<Anomaly> AnomalyDetector::CloseWindow(uint64_t end_us) {
  ++counters_.windows;
  const double rate = double(bytes_) * 1e6 / double(opts_.window_us);
  const double frac = samples_ > 0 ? double(incompressible_) / double(samples_) : 0.0;
  const uint64_t samples = samples_, last_seq = window_last_seq_;
  bytes_ = samples_ = incompressible_ = 0;
  window_last_seq_ = 0;
  const bool incompressible =
      samples >= opts_.min_samples && frac >= std::max(opts_.min_incompressible, base_frac_ + opts_.incompressible_delta);
  const bool suspect = learned_ >= opts_.learning_windows && incompressible && rate >= double(opts_.min_rate) &&
                       rate >= opts_.rate_factor * base_rate_;
  if (!suspect) {
    run_ = 0;
    // A window of incompressible writes too slow to be suspect (the start of
    // an attack in the last part of a window, say) is not clean either.
    if (last_seq != 0 && !incompressible) clean_seq_ = last_seq;
    Learn(rate, samples, frac);
    return std::nullopt;
  }
  if (++run_ < opts_.run_windows || end_us < quiet_until_) return std::nullopt;
  run_ = 0;
  quiet_until_ = end_us + opts_.holdoff_us;
  ++counters_.anomalies;
  Anomaly a{end_us, rate, base_rate_, frac, base_frac_, clean_seq_, {}};
  char msg[160];
  std::snprintf(msg, sizeof msg, "change rate %.1f MB/s (baseline %.1f MB/s), %.0f%% incompressible (baseline %.0f%%)",
                rate / 1e6, base_rate_ / 1e6, frac * 100, base_frac_ * 100);
  a.message = msg;
  last_ = a;
  return a;
}

void AnomalyDetector::CloseIdleWindows(uint64_t n) {
  if (n == 0) return;
  counters_.windows += n;
  run_ = 0;
  // While the warm-up average still weighs each window more than alpha, learn
  // them one by one; after that, n zero-rate windows decay the rate baseline
  // by (1 - alpha)^n.
  for (; n > 0 && 1.0 / double(learned_ + 1) > opts_.ewma_alpha; --n) Learn(0, 0, 0);
  base_rate_ *= std::pow(1 - opts_.ewma_alpha, double(n));
  learned_ += n;
}

void AnomalyDetector::Learn(double rate, uint64_t samples, double frac) {
  // Both averages start as the plain mean of the windows so far (so the first
  // window does not weigh more than the rest) and become EWMAs once alpha
  // outweighs 1/n. A window with fewer than min_samples samples moves the
  // fraction in proportion, so that a slow volume still learns it.
  ++learned_;
  base_rate_ += std::max(opts_.ewma_alpha, 1.0 / double(learned_)) * (rate - base_rate_);
  if (samples == 0) return;
  const double w = std::min(1.0, double(samples) / double(std::max(opts_.min_samples, 1u)));
  frac_weight_ += w;
  base_frac_ += std::max(opts_.ewma_alpha * w, w / frac_weight_) * (frac - base_frac_);
}

}  // namespace cdp::agent
