// SPDX-License-Identifier: Apache-2.0
// Throttle: a token bucket in Mbit/s with an optional daily schedule, on a
// cdp::Clock (so tests drive it with a ManualClock).
//
// The rate at any moment is the rate of the first schedule window that
// contains the wall-clock time of day (windows are [start, end) minutes after
// midnight, in UTC shifted by `utc_offset_minutes`; a window may wrap
// midnight, e.g. 22:00-06:00), else `default_mbps`. A rate of 0 means
// unlimited. Tokens accrue at the rate in force during each part of the elapsed
// time (a schedule boundary inside an interval is honoured exactly), capped at
// `burst_bytes`.
//
// Reserve(n) takes n bytes' worth of tokens at once, possibly going into debt,
// and answers how long the caller must wait before sending them so that the
// long-run rate holds. Callers send after waiting; several senders may share
// one Throttle (the debt serializes them fairly).
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/base/status.h"

namespace cdp {

struct ThrottleWindow {
  uint32_t start_minute = 0;  // 0..1439
  uint32_t end_minute = 0;    // 0..1440; end < start wraps midnight
  double mbps = 0;            // 0 = unlimited inside this window
};

struct ThrottleOptions {
  double default_mbps = 0;              // 0 = unlimited
  std::vector<ThrottleWindow> schedule;
  int utc_offset_minutes = 0;           // schedule times are UTC + this
  uint64_t burst_bytes = 256u << 10;    // bucket depth
};

// Parses "20@08:00-18:00,100@18:00-08:00" (Mbit/s @ HH:MM-HH:MM, comma list).
// Empty text = no schedule. kInvalidArgument names the bad part.
Result<std::vector<ThrottleWindow>> ParseSchedule(std::string_view text);

// The lowest rate a throttle may be set to (Mbit/s), 0 (unlimited) aside: a
// typo such as 0.000001 would otherwise stall shipping for good.
inline constexpr double kMinThrottleMbps = 0.5;
// The highest: 1 Tbit/s (anything above is a mistake, not a link).
inline constexpr double kMaxThrottleMbps = 1e6;

// kInvalidArgument naming the bad rate unless every rate (default and
// schedule windows) is 0 or within [kMinThrottleMbps, kMaxThrottleMbps].
Status ValidateThrottle(const ThrottleOptions& options);

struct ThrottleState {
  double limit_mbps = 0;          // rate in force now (0 = unlimited)
  uint64_t reserved_bytes = 0;    // total bytes passed through
  uint64_t waited_micros = 0;     // total wait handed out
  bool throttling = false;        // the last Reserve had to wait
};

class Throttle {
 public:
  // `clock` must outlive the Throttle.
  Throttle(Clock* clock, ThrottleOptions options);

  // Takes `bytes` and returns the microseconds to wait before sending them
  // (0: send now).
  uint64_t Reserve(uint64_t bytes);

  // Replaces rate, schedule and burst at run time (control API).
  void Reconfigure(ThrottleOptions options);

  // The rate in force at the clock's current wall time.
  double CurrentMbps() const;
  ThrottleState state() const;

 private:
  double RateAtLocked(uint64_t wall_us) const;        // bytes per microsecond, 0 = unlimited
  uint64_t NextBoundaryLocked(uint64_t wall_us) const;  // wall micros of the next window edge
  void RefillLocked(uint64_t now_us, uint64_t wall_us);

  Clock* clock_;
  mutable std::mutex mu_;
  ThrottleOptions opt_;
  double tokens_ = 0;         // may be negative (debt)
  uint64_t last_now_ = 0;
  uint64_t last_wall_ = 0;
  ThrottleState state_;
};

}  // namespace cdp
