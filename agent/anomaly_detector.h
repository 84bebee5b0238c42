// SPDX-License-Identifier: Apache-2.0
// AnomalyDetector: ransomware detection on one protected volume's write
// stream. Encryption in progress shows as a jump in the change rate made of
// incompressible writes (the signal Zerto and NetApp ARP use), so the
// detector watches both, per window of `window_us` (default 1 s):
//
//   rate      bytes written in the window / window length
//   fraction  of the window's sampled 4 KiB blocks that are incompressible:
//             LZ4 cannot make them smaller than `incompressible_ratio` (97%)
//
// and compares each closed window with a baseline, an exponentially weighted
// moving average of the past windows' rate and fraction. A window is
// *suspect* when
//
//   rate     >= max(rate_factor x baseline rate, min_rate)          (3x, 1 MiB/s)
//   fraction >= max(min_incompressible, baseline fraction + delta)  (0.8, +0.3)
//   and it has at least min_samples sampled blocks;
//
// `run_windows` (3) suspect windows in a row fire an Anomaly. Nothing fires
// in the first `learning_windows` (30) windows, nor within `holdoff_us` (60 s)
// of the last anomaly. Only windows that are not suspect are learned into the
// baseline (so an attack does not become the norm), and every window is
// learned while learning. Idle windows are 0-byte windows. A lasting change
// of workload that is suspect (a new media store) fires once per hold-off
// until Rebaseline() is called.
//
//   learning --(learning_windows learned)--> watching
//   watching --(suspect)--> run += 1 --(run == run_windows, not held off)--> fire,
//                                       hold off until now + holdoff_us
//            --(not suspect)--> run = 0, learn the window
//
// Cost: 1 block in `sample_every` (16) is compressed, once, with LZ4 (~700
// MB/s, and faster on incompressible data, where compression stops as soon
// as the output reaches 97% of the block). Per GB written: 1 GB / 16 = 64 MB
// through LZ4 = ~0.09 CPU seconds, plus an O(1) count per 4 KiB block.
//
// Sampling is by count, not by address: every `sample_every`-th block seen
// (blocks are the write's pieces between 4 KiB volume boundaries; pieces
// under 1 KiB, where LZ4 cannot compress even text, count only for the rate).
//
// Blind spots (documented, not bugs):
//   - A slow encryptor, writing at no more than rate_factor x the baseline
//     rate, never fires: the rate alone cannot tell it from normal work.
//   - A volume whose writes are already incompressible (encrypted volumes,
//     media, compressed backups: baseline fraction above 1 - delta) cannot
//     show the fraction jump, so it never fires.
//   - Intermittent encryption (1 block in several, as some ransomware does to
//     go faster) keeps the fraction under min_incompressible.
//   - An attack shorter than run_windows windows, or one inside the
//     learning period, which is learned as the norm.
//
// Thread safety: not thread-safe; the caller serializes every call. The
// agent calls OnWrite and Tick under the volume's capture lock
// (CaptureQueue::Lock(), which CaptureDevice::Write holds while it applies a
// write and gives it its sequence), so that an Anomaly returned by OnWrite
// sits at that write's place in the sequence order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/base/coding.h"

namespace cdp::agent {

struct AnomalyOptions {
  bool enabled = true;
  uint32_t sample_every = 16;           // N: compress 1 block in N (0 is taken as 1)
  double incompressible_ratio = 0.97;   // compressed >= this x block: incompressible
  uint64_t window_us = 1'000'000;       // window length (at least 1 ms)
  double ewma_alpha = 0.1;              // weight of the newest window in the baseline (0.001..1)
  uint32_t learning_windows = 30;       // M: windows learned before anything can fire
  uint32_t run_windows = 3;             // K: suspect windows in a row that fire (0 is taken as 1)
  double rate_factor = 3.0;             // window rate >= this x baseline rate
  uint64_t min_rate = 1u << 20;         // and >= this, bytes per second
  double min_incompressible = 0.8;      // fraction >= max(this,
  double incompressible_delta = 0.3;    //                 baseline fraction + this)
  uint32_t min_samples = 8;             // sampled blocks a window needs to be judged
  uint64_t holdoff_us = 60'000'000;     // quiet time after an anomaly
};

// One detection, at the close of the window that completed the run.
struct Anomaly {
  uint64_t time_us = 0;                 // end of that window (the callers' clock)
  double rate = 0;                      // that window's bytes per second
  double baseline_rate = 0;             // bytes per second
  double incompressible = 0;            // that window's fraction, 0..1
  double baseline_incompressible = 0;   // 0..1
  // The last sequence written before the suspect run began (OnWrite's `seq`
  // of the last write of the last window that was neither suspect nor mostly
  // incompressible; 0: none): the image after it is the suspect-clean point.
  // Writes of a window that was partly an attack but too little of one to
  // judge (under min_samples sampled blocks) are in it: it is suspect, not
  // proven.
  uint64_t clean_seq = 0;
  // "change rate 52.3 MB/s (baseline 4.1 MB/s), 97% incompressible (baseline 31%)"
  std::string message;
};

struct AnomalyCounters {
  uint64_t blocks_sampled = 0;
  uint64_t blocks_incompressible = 0;   // of those sampled
  uint64_t windows = 0;                 // closed, idle ones included
  uint64_t anomalies = 0;
};

class AnomalyDetector {
 public:
  explicit AnomalyDetector(const AnomalyOptions& opts);

  // Accounts one captured write of `data` at volume byte `offset`, at time
  // `now_us` (monotonic, microseconds; non-decreasing across calls). First
  // closes the windows that ended at or before `now_us`: returns the Anomaly
  // when one of them fires, else nullopt (always nullopt when disabled).
  // `data` is only read during the call.
  // `seq`: the write's sequence in the volume's capture order (0: none, it
  // was not queued), remembered for Anomaly::clean_seq.
  std::optional<Anomaly> OnWrite(uint64_t offset, ByteSpan data, uint64_t now_us, uint64_t seq = 0);
  // Closes the windows that ended at or before `now_us` without a write
  // (a periodic timer; windows without writes count as idle). As OnWrite.
  std::optional<Anomaly> Tick(uint64_t now_us);
  // Forgets the baseline and the hold-off and starts a new learning period:
  // the operator's answer to an anomaly that was a real change of workload.
  void Rebaseline();

  const AnomalyCounters& counters() const { return counters_; }
  const std::optional<Anomaly>& last_anomaly() const { return last_; }
  double baseline_rate() const { return base_rate_; }
  double baseline_incompressible() const { return base_frac_; }
  const AnomalyOptions& options() const { return opts_; }

 private:
  std::optional<Anomaly> Advance(uint64_t now_us);
  std::optional<Anomaly> CloseWindow(uint64_t end_us);
  void CloseIdleWindows(uint64_t n);
  void Learn(double rate, uint64_t samples, double frac);
  bool Incompressible(ByteSpan block) const;

  AnomalyOptions opts_;
  AnomalyCounters counters_;
  std::optional<Anomaly> last_;
  bool started_ = false;
  uint64_t window_start_ = 0;
  uint64_t bytes_ = 0, samples_ = 0, incompressible_ = 0;  // of the open window
  uint64_t blocks_seen_ = 0;
  uint64_t learned_ = 0;    // windows in the baselines
  double frac_weight_ = 0;  // their weight in the fraction baseline
  double base_rate_ = 0, base_frac_ = 0;
  uint64_t window_last_seq_ = 0;  // the open window's last write (0: none yet)
  uint64_t clean_seq_ = 0;        // the last write of the last window not suspect
  uint32_t run_ = 0;          // suspect windows in a row
  uint64_t quiet_until_ = 0;  // no anomaly before this time
};

}  // namespace cdp::agent
