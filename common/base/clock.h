// SPDX-License-Identifier: Apache-2.0
// Clock: the only way OpenCDP code reads time or waits, so that throttles,
// timers and retention can be tested on a ManualClock.
//
// NowMicros() is monotonic (steady); WallMicros() is the real-time clock used for
// timestamps that operators see (recovery points, records).
//
// Thread safety: every method of every Clock is thread-safe.
#pragma once

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace cdp {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t NowMicros() const = 0;   // monotonic
  virtual uint64_t WallMicros() const = 0;  // microseconds since the Unix epoch
};

class SystemClock final : public Clock {
 public:
  uint64_t NowMicros() const override {
    return uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::steady_clock::now().time_since_epoch()).count());
  }
  uint64_t WallMicros() const override {
    return uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count());
  }
  static SystemClock* Get() {
    static SystemClock clock;
    return &clock;
  }
};

// A clock that moves only when told to. Both readings advance together.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(uint64_t start_micros = 1'000'000, uint64_t wall_start = 1'700'000'000'000'000)
      : now_(start_micros), wall_offset_(wall_start - start_micros) {}
  uint64_t NowMicros() const override { return now_.load(); }
  uint64_t WallMicros() const override { return now_.load() + wall_offset_; }
  void Advance(uint64_t micros) { now_.fetch_add(micros); }
  void Set(uint64_t micros) { now_.store(micros); }

 private:
  std::atomic<uint64_t> now_;
  uint64_t wall_offset_;
};

// CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID), for the
// stage costs of the data path (what a stage spent computing, as against
// waiting); measurement only, never a deadline.
inline uint64_t ThreadCpuMicros() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000 + uint64_t(ts.tv_nsec) / 1000;
}

}  // namespace cdp
