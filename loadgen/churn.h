// SPDX-License-Identifier: Apache-2.0
// Churn: drive a target change rate (bytes per second) against a volume.
//
//   cdp-loadgen churn --target nbd://HOST:PORT/EXPORT|nbd+unix:///EXPORT?socket=PATH|FILE --rate MB/s --duration S
//                     --pattern seq|random|zipf:THETA --io-size B --compressibility R --seed S
//
// Each I/O is `io_size` bytes at an offset chosen by the pattern (aligned to
// io_size, within the target's size):
//   seq      consecutive offsets, wrapping at the end;
//   random   uniform over the blocks;
//   zipf:T   Zipf(theta T) over the blocks: block 0 hottest (a hot spot at the
//            start of the volume, like a database's hot pages).
// Data comes from loadgen::DataGenerator with the given compressibility and seed.
// Pacing: a Pacer (token bucket, burst = max(io_size, rate x 100 ms)) on the
// given Clock; the caller supplies the Sleeper that waits (a real sleep in the
// CLI, ManualClock::Advance in tests).
//
// Thread safety: RunChurn runs on the calling thread; a ChurnTarget is used
// from that thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"

namespace cdp::loadgen {

// Where churn writes.
class ChurnTarget {
 public:
  virtual ~ChurnTarget() = default;
  virtual uint64_t size() const = 0;
  virtual Status Write(uint64_t offset, ByteSpan data) = 0;
  // Makes written data durable (file: Sync; NBD: drain + NBD_CMD_FLUSH).
  virtual Status Flush() = 0;
  virtual Status Close() = 0;
  virtual std::string name() const = 0;
};

// A file through `env` ("env" must outlive the target). The file is created
// when missing; `size` 0 = use the existing file's size (must be > 0), else
// the file is extended to `size` if shorter.
Result<std::unique_ptr<ChurnTarget>> OpenFileTarget(Env* env, const std::string& path, uint64_t size);
// "nbd://..." or "nbd+unix://..." through NbdClient, else a file through `env`.
Result<std::unique_ptr<ChurnTarget>> OpenTarget(Env* env, const std::string& spec, uint64_t file_size);

enum class Pattern { kSequential, kRandom, kZipf };
struct PatternSpec {
  Pattern kind = Pattern::kSequential;
  double theta = 0.99;  // zipf only, 0 < theta < 1
};
// "seq" | "random" | "zipf:0.99". Failure: kInvalidArgument.
Result<PatternSpec> ParsePattern(std::string_view text);

struct ChurnOptions {
  double rate_bytes_per_sec = 10e6;  // > 0
  uint64_t duration_us = 10'000'000;
  PatternSpec pattern;
  uint32_t io_size = 65536;          // bytes, > 0, <= 32 MiB
  double compressibility = 0.75;
  uint64_t seed = 1;
  // Flush after this many bytes (0 = only at the end). A filesystem's page
  // cache or a VM flushes periodically; this stands for it.
  uint64_t flush_every_bytes = 64ull << 20;
  // Called about once a second (clock time) with the bytes written so far.
  std::function<void(uint64_t elapsed_us, uint64_t bytes)> progress;
};

struct ChurnResult {
  uint64_t bytes = 0;
  uint64_t ops = 0;
  uint64_t flushes = 0;
  uint64_t elapsed_us = 0;  // from start to the end of the final flush
  double achieved_bytes_per_sec() const { return elapsed_us ? double(bytes) * 1e6 / double(elapsed_us) : 0.0; }
};

// Waits `micros` (the Pacer's answer).
using Sleeper = std::function<void(uint64_t micros)>;

// Writes for `duration_us` of `clock` time at the paced rate, then flushes.
// Stops at the first failed write (returned). `clock` must be the one the
// sleeper moves. Success: what was written and how long it took.
Result<ChurnResult> RunChurn(ChurnTarget* target, const ChurnOptions& opts, const Clock* clock, const Sleeper& sleep);

}  // namespace cdp::loadgen
