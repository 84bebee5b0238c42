// SPDX-License-Identifier: Apache-2.0
// Resync: brings the replica of one volume level with the source where the
// dirty bitmap says it may differ (initial sync, crash recovery, bitmap-mode
// healing, a full resync after lost history), shipping only the 4 KiB blocks
// that differ. Driven by the sender's resync thread (agent/sender.h).
//
// Compare protocol (docs/agent.md "Resync", docs/formats/protocol.md):
//
//   pick a run of up to `batch_regions` flagged regions from the cursor
//     |  min_seq = max(floor, the regions' last sequence); the run waits
//     |  until the process server acknowledged min_seq (records still in our
//     |  queue are compared once they are applied, not before)
//   HashRequest{unit = region, min_seq}  ----> PS ----> MT: digests of the
//     |                                        replica at a seq >= min_seq
//     |  meanwhile: local leaf digests of the run, unless the last answer
//     |  was all zeros (an initial sync; a sealed volume always reads them)
//   digests not read yet: a region the replica reads as zeros -> its
//     non-zero blocks are shipped, read once (CaptureDevice::ShipNonZero:
//     holes skipped, zero blocks dropped), no digest needed; any other
//     region -> its local leaf digests now (holes skipped, zeros flagged)
//   equal region -> done (if no bitmap-mode write flagged it meanwhile)
//   differing region -> HashRequest for its 64 KiB units, then for the 4 KiB
//     leaves of each differing 64 KiB unit (unit / 16 per level); a unit
//     the replica reads as zeros is not descended into (our non-zero leaves
//     are what differs), nor one we read as zeros (one kZero record)
//     |
//   differing leaves, merged into runs -> queued as kData or kZero records
//   (CaptureDevice::ShipRange, under the capture lock: an exact point in the
//   write order) as the rate controller allows
//     |
//   every run of the region queued -> region done
//
// Why an equal digest is safe: the replica's digest describes every record
// <= its seq >= min_seq, and min_seq covers every record ever captured into
// the region before its local digest was read (`floor` covers the records of
// earlier lifetimes, acknowledged before this process's first contact). Any
// record after that is in the stream and will be applied; a write that was
// not captured (bitmap mode) bumps the region's epoch and the region is
// compared again.
//
// Rate controller, in the spirit of DRBD's c-plan-ahead and c-fill-target:
// resync records queued but not yet acknowledged by the process server are
// kept under a window, so live writes never wait behind more than that, and
// the queue never leaves data mode on the resync's account. The window is what
// the process server acknowledged of the resync in the last `plan_ahead_ms`
// (measured over a quarter of it), at least `fill_target` and at most
// `fill_max`: a live write waits about plan_ahead_ms behind the resync on a
// fast link, and fill_target's worth on a slow one. Each measurement grows a
// full window by plan_ahead / round trip, so it grows while the round trip is
// shorter than the plan-ahead and the link has room. `max_rate` (bytes/s, 0 =
// none) caps the resync further.
//
// A request that cannot be answered (master target unreachable, connection
// lost) drops the work in flight (its regions stay flagged) and pauses the
// resync, backing off from retry_min_ms to retry_max_ms; a kBehind answer is
// asked again after behind_retry_ms with the same min_seq.
//
// Thread safety: Step/Wait/Abort/SetFloor from the resync thread only;
// Stats() and Kick() from any thread; the HashFn's callback from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "agent/capture_device.h"
#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/wire/protocol.h"

namespace cdp::agent {

struct ResyncOptions {
  uint32_t batch_regions = 64;      // regions per first-level HashRequest
  int max_requests = 64;            // HashRequests in flight (the PS takes 256 per connection)
  uint64_t fill_target = 8u << 20;  // resync bytes queued, not yet acknowledged: at least...
  uint64_t fill_max = 0;            // ...and at most (below fill_target: fill_target)
  uint64_t plan_ahead_ms = 100;     // the window: what was acknowledged in this time (0: fill_target)
  uint64_t max_rate = 0;            // resync bytes per second (0 = no cap)
  uint64_t retry_min_ms = 100;      // pause after a request that was not answered...
  uint64_t retry_max_ms = 5'000;    // ...doubling up to this
  uint64_t behind_retry_ms = 20;    // the replica has not applied min_seq yet
  const Clock* clock = nullptr;     // must outlive the resync
};

struct ResyncStats {
  uint64_t total_bytes = 0;      // bytes of the regions flagged when the pass started
  uint64_t done_bytes = 0;       // of those, finished (equal or shipped)
  uint64_t remaining_bytes = 0;
  double eta_seconds = 0;
  uint64_t regions_compared = 0;  // first-level compares (cumulative)
  uint64_t regions_equal = 0;
  uint64_t regions_differ = 0;
  uint64_t hash_requests = 0;     // sent (every level)
  uint64_t hash_behind = 0;       // answered kBehind
  uint64_t hash_failed = 0;       // not answered
  uint64_t shipped_blocks = 0;    // 4 KiB leaves queued as resync records
  uint64_t shipped_bytes = 0;     // bytes those records cover
  uint64_t shipped_records = 0;
  uint64_t read_bytes = 0;        // read from the backing store for digests (and for zero-replica regions)
  uint64_t skipped_bytes = 0;     // holes not read
  uint64_t inflight_bytes = 0;    // resync records queued, not yet acknowledged
  uint64_t fill_window_bytes = 0; // the most inflight_bytes may be now (see the rate controller)
  std::string last_error;         // why hash requests are paused; cleared at the next answer
};

class Resync {
 public:
  using HashCallback = std::function<void(Result<proto::HashResponse>)>;
  // Sends a HashRequest (volume_id/request_id are the transport's) and calls
  // the callback exactly once, possibly on another thread.
  using HashFn = std::function<void(const proto::HashRequest&, HashCallback)>;

  // `device` must outlive the resync.
  Resync(CaptureDevice* device, ResyncOptions opts, HashFn hash);
  Resync(const Resync&) = delete;
  Resync& operator=(const Resync&) = delete;

  // The process server's resume point of the latest contact: records at or
  // below it may still be in its spool, so every compare asks the replica
  // for at least `seq` (lower after lost history, when the queue renumbered).
  void SetFloor(uint64_t seq);
  // One round: answers received, blocks queued, new requests sent. True when
  // it did something (the caller then calls it again at once).
  Result<bool> Step();
  // Waits up to `max` for an answer (or Abort).
  void Wait(std::chrono::milliseconds max);
  // The process server acknowledged records: if resync records are in flight
  // (so more may be held back by `fill_target`), ends a Wait now, or the
  // next one at once, and returns true (any thread).
  bool Kick();
  // Drops the work in flight (stopping); answers arriving later are ignored.
  void Abort();
  // Nothing in flight and nothing flagged.
  bool Idle() const;
  ResyncStats Stats() const;

 private:
  struct Region {             // a flagged region being compared
    uint32_t epoch = 0;       // DirtyBitmap::ResyncEpoch when picked
    std::vector<proto::Hash128> leaves;  // local leaf digests
    int pending = 0;          // requests out + runs waiting to be queued
    bool ready = false;       // local digests computed
    bool scan = false;        // the replica reads zeros: its non-zero blocks are shipped
    bool scan_shipped = false;  // ...and there were some
  };
  struct Request {            // one HashRequest in flight or waiting
    uint32_t unit = 0;
    uint64_t first = 0;       // in units
    uint32_t count = 0;
    uint64_t min_seq = 0;
    std::vector<uint64_t> regions;  // regions it answers for (first level: the run)
    uint64_t not_before_us = 0;     // kBehind: ask again from then
  };
  struct Answer {
    uint64_t ticket = 0;
    Result<proto::HashResponse> response;
  };
  struct Run {                // leaves to queue
    uint64_t offset = 0;
    uint32_t length = 0;
    uint64_t region = 0;
    bool scan = false;        // its non-zero blocks only (CaptureDevice::ShipNonZero)
  };

  bool PickRegions();                        // starts a first-level request
  // Local leaf digests of a contiguous run of picked regions.
  // (Counts the bytes read and skipped in the stats.)
  Status ReadLeaves(const std::vector<uint64_t>& regions);
  void Send(Request r);
  Status Handle(const Request& r, const proto::HashResponse& resp);
  // Compares the region's units [first_unit, +remote.size()) of `unit` bytes:
  // differing leaves become runs to ship; returns the differing units to
  // descend into.
  std::vector<uint64_t> Compare(uint64_t region, uint32_t unit, uint64_t first_unit,
                                std::span<const proto::Hash128> remote);
  // Queues the requests for the units inside `units` ((unit, region), sorted).
  void Descend(uint32_t unit, const std::vector<std::pair<uint64_t, uint64_t>>& units, uint64_t min_seq);
  bool ShipSome(Status* error);
  void Finish(uint64_t region);              // a region's pending count reached 0
  void DropAll(const Status& why);           // a failure: regions stay flagged
  uint64_t RegionBytes(uint64_t region) const;

  CaptureDevice* dev_;
  ResyncOptions opts_;
  HashFn hash_;

  // Resync thread only.
  uint64_t floor_ = 0;
  std::map<uint64_t, Region> regions_;       // being compared
  std::map<uint64_t, Request> out_;          // ticket -> request in flight
  std::deque<Request> later_;                // to send: descents, kBehind, waiting for an ack
  std::deque<Run> runs_;
  std::deque<std::pair<uint64_t, uint64_t>> queued_;  // (seq, bytes) of resync records not yet acknowledged
  uint64_t next_ticket_ = 1;
  uint64_t pause_until_us_ = 0;
  uint64_t backoff_ms_ = 0;
  uint64_t window_ = 0;                      // the fill window (bytes)
  uint64_t window_acked_ = 0;                // resync bytes acknowledged since...
  uint64_t window_since_us_ = 0;             // ...this time
  uint64_t rate_tokens_ = 0;                 // max_rate bucket (bytes)
  uint64_t rate_refill_us_ = 0;
  uint64_t pass_start_us_ = 0;
  bool lazy_ = true;                         // the last first-level answer was all zeros (see Step)

  // Answers from the transport's threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Answer> answers_;
  bool kicked_ = false;  // Kick() since the last Wait
  ResyncStats st_;
};

}  // namespace cdp::agent
