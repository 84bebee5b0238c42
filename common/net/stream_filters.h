// SPDX-License-Identifier: Apache-2.0
// Stream filters: ByteStreams that own the next stream down and forward to it,
// in the style of nbdkit filters (filters/delay, filters/rate, filters/error).
//
//   StreamFilter     forwards everything unchanged; the base of every filter.
//   ThrottleFilter   charges every write to a shared Throttle and waits as it says.
//   FaultFilter      for tests: delays writes, flips a byte at a given offset
//                    of the written stream, drops the connection after N bytes.
//
// Stacking, e.g. a client whose link is throttled and drops after 1 MiB:
//
//   auto ch = Connect(host, port, timeout, {}, [&](std::unique_ptr<ByteStream> s) {
//     s = std::make_unique<ThrottleFilter>(std::move(s), &throttle);
//     FaultOptions faults;
//     faults.drop_after = 1 << 20;
//     return std::make_unique<FaultFilter>(std::move(s), faults);
//   });
//
// Waiting: a filter that waits (throttle, delay) does so through a SleepFn.
// The default sleeps in real time and is cut short by Shutdown(); tests pass
// one that advances a ManualClock instead.
//
// Thread safety: as for every ByteStream (common/net/byte_stream.h): one reader
// and one writer at a time, Shutdown() and peer() from any thread. The filters
// here act on the write direction only; reads are forwarded unchanged.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "common/net/byte_stream.h"
#include "common/net/throttle.h"

namespace cdp {

// Waits `micros`. Returns false if the wait was cut short by Shutdown().
using SleepFn = std::function<bool(uint64_t micros)>;

class StreamFilter : public ByteStream {
 public:
  // Takes ownership of `next` (not null). `sleep` empty = real time, cut
  // short by Shutdown().
  explicit StreamFilter(std::unique_ptr<ByteStream> next, SleepFn sleep = {});
  ~StreamFilter() override;

  Result<size_t> ReadSome(std::span<uint8_t> buf, Deadline deadline) override;
  Status WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) override;
  // Wakes this filter's waits, then shuts the next stream down.
  void Shutdown() override;
  const std::string& peer() const override;
  const TlsPeer* tls_peer() const override;

 protected:
  ByteStream& next() { return *next_; }
  // Waits `micros` through the SleepFn. false (the caller fails with kAborted)
  // if Shutdown() cut the wait short or had already been called.
  bool Sleep(uint64_t micros);

 private:
  const std::unique_ptr<ByteStream> next_;
  const SleepFn sleep_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool shut_ = false;  // guarded by mu_
};

// Charges each write (its total size) to `throttle` before passing it on and
// waits the time Reserve() answers. The wait does not count against the
// write's deadline (the deadline guards the peer, not our own pacing): the
// next stream gets `deadline` moved out by the time waited.
class ThrottleFilter final : public StreamFilter {
 public:
  // `throttle` may be shared by many streams and must outlive this filter.
  ThrottleFilter(std::unique_ptr<ByteStream> next, Throttle* throttle, SleepFn sleep = {});

  Status WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) override;

 private:
  Throttle* const throttle_;
};

struct FaultOptions {
  // After exactly this many bytes have been written through the filter, the
  // connection is shut down: the peer reads those bytes and then EOF, and the
  // write that crossed the limit fails with kUnavailable.
  std::optional<uint64_t> drop_after;
  // The byte at this offset of the written stream is inverted (xor 0xff).
  std::optional<uint64_t> flip_at;
  // Waited before every write.
  std::chrono::microseconds delay{0};
  SleepFn sleep;  // how to wait (see above)
};

class FaultFilter final : public StreamFilter {
 public:
  FaultFilter(std::unique_ptr<ByteStream> next, FaultOptions options);

  Status WriteAll(std::span<const ByteSpan> bufs, Deadline deadline) override;

  // Bytes written through this filter so far (writer thread only).
  uint64_t written() const { return written_; }

 private:
  const FaultOptions opt_;
  uint64_t written_ = 0;  // writer thread only
};

}  // namespace cdp
