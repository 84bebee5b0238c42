// SPDX-License-Identifier: Apache-2.0
// CaptureQueue: the ordered, memory-bounded queue of captured records of one
// volume, between the capture tap (agent/capture_device.h) and the sender
// (agent/sender.h). It owns the volume's *capture lock*: applying a write to
// the backing store, assigning its sequence and queueing it happen under that
// one lock, so sequence order is exactly the order writes reached the store.
//
// Modes (InMage's filter-driver modes), chosen per record at capture time:
//
//            data bytes + overheads > data_limit        overheads > budget
//   kData ---------------------------------> kMetadata -------------------> kBitmap
//     ^                                         |                             |
//     +------ every queued record acknowledged -+-----------------------------+
//
//   kData      the record keeps its data (exact point-in-time content).
//   kMetadata  only (offset, length) is kept; the sender re-reads the current
//              content from the backing store. The stream is no longer a prefix
//              of the source's history inside that window: kFlush records are
//              suppressed there (no recovery point is promised).
//   kBitmap    nothing is queued and no sequence is used; the caller marks the
//              regions for a resync (DirtyBitmap::AssignResync).
// data_limit = budget - budget/8; the last eighth is the metadata reserve, so
// the queue's memory (data + kEntryOverhead per record) never exceeds `budget`.
// Every transition is logged and counted.
//
// Sequences start at 1 and are contiguous. Until the process server has told
// the resume point (Rebase), the numbers are provisional.
//
// Thread safety: every method is thread-safe. Methods named *Locked must be
// called with the lock returned by Lock() held (or, for tags across volumes,
// all volumes' locks held); nothing else must be called while holding it
// except DirtyBitmap::Assign/AssignResync/NoteShipped and the
// DirtyBitmap's read-only accessors (LastSeq, ResyncState, ResyncEpoch, ...).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/clock.h"
#include "common/base/coding.h"
#include "common/base/status.h"
#include "common/daemon/metrics.h"
#include "common/wire/protocol.h"

namespace cdp::agent {

enum class CaptureMode : int { kData = 0, kMetadata = 1, kBitmap = 2 };
std::string_view ModeName(CaptureMode m);

// One record waiting to be sent or acknowledged. `has_data` false with kind
// kData means metadata mode: the sender must re-read [offset, offset+length).
struct QueuedRecord {
  uint64_t seq = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
  proto::RecordKind kind = proto::RecordKind::kData;
  bool has_data = false;
  uint64_t timestamp_us = 0;
  // kData with has_data: `length` bytes; kTag: the name; else null. Shared
  // and immutable, so that the sender's Peek copies no data under the lock.
  std::shared_ptr<const Bytes> data;
  size_t data_size() const { return data ? data->size() : 0; }
};

struct CaptureQueueStats {
  CaptureMode mode = CaptureMode::kData;
  uint64_t memory_bytes = 0;     // data + per-record overheads
  uint64_t peak_memory_bytes = 0;
  uint64_t records = 0;          // queued (sent or not), not yet acknowledged
  uint64_t next_seq = 1;
  uint64_t acked_seq = 0;
  uint64_t captured_ops = 0;     // writes, zero-writes and trims captured (any mode)
  uint64_t captured_bytes = 0;
  uint64_t flushes_recorded = 0;
  uint64_t flushes_suppressed = 0;
  uint64_t to_metadata = 0;      // transitions counted
  uint64_t to_bitmap = 0;
  uint64_t to_data = 0;
  uint64_t bitmap_mode_ops = 0;  // writes that were not queued (bitmap mode)
  uint64_t anomalies = 0;        // anomaly records queued (agent/anomaly_detector.h)
  uint64_t holds = 0;            // group holds put on
  uint64_t holds_lapsed = 0;     // ... that ended at their deadline, not by their coordinator
  uint64_t held_writes = 0;      // writes that waited for a hold
  std::string last_anomaly;      // the last one's message ("" : none)
};

class CaptureQueue {
 public:
  static constexpr uint64_t kEntryOverhead = 96;  // bytes charged per record

  struct Options {
    std::string volume;                 // for log lines
    uint64_t budget = 64ull << 20;      // bytes, >= 1 MiB
    const Clock* clock = nullptr;       // for timestamps; must outlive the queue
  };
  explicit CaptureQueue(Options opts);
  CaptureQueue(const CaptureQueue&) = delete;
  CaptureQueue& operator=(const CaptureQueue&) = delete;

  // The capture lock.
  std::unique_lock<std::mutex> Lock() { return std::unique_lock<std::mutex>(mu_); }

  // --- Group holds (docs/groups.md) ---
  // While a hold is on, no application write (or flush) is applied, numbered
  // or completed: the capture device takes the lock for one with
  // LockForWrite, which waits, the lock released meanwhile, until the hold
  // ends. A hold ends at EndHoldLocked or at its deadline, whichever comes
  // first: the first writer to wake past the deadline ends it, and so does
  // EndHoldLocked. The queue's own records (tags, anomalies, resync and
  // repair ranges) are not held: they take Lock().
  //
  // The capture lock for an application write: waits while a hold is on.
  std::unique_lock<std::mutex> LockForWrite();
  // Puts hold `round` (non-zero) on until `deadline`. False, and nothing
  // changes, when another one is on.
  bool HoldLocked(uint64_t round, std::chrono::steady_clock::time_point deadline);
  // Ends hold `round`. True if it was still on and its deadline not passed:
  // no write was numbered since HoldLocked, so a record queued now (before
  // this call, under the same lock) lands at the held place. False when the
  // hold had lapsed or is another round's (then it is left alone).
  bool EndHoldLocked(uint64_t round);
  // Writes that waited for a hold are observed here (seconds); null: none.
  // Set before writes arrive.
  void SetHoldWaits(std::shared_ptr<metrics::Histogram> h);

  // Queues a captured write (kData: `data` holds length bytes), zero-write or
  // trim (no data) in the current mode. Returns its sequence, or 0 when the
  // queue is in bitmap mode (the caller must mark the range for a resync).
  // `copy`, when given, is a copy of `data` made before taking the lock: it is
  // kept instead of copying under the lock.
  uint64_t AppendLocked(proto::RecordKind kind, uint64_t offset, uint32_t length, ByteSpan data,
                        std::shared_ptr<const Bytes> copy = nullptr);
  // Queues a kFlush record unless inside a no-recovery-point window (not data
  // mode, or `consistent` false). Returns its sequence or 0 if suppressed.
  uint64_t AppendFlushLocked(bool consistent);
  // Queues a kTag record (any mode but bitmap; the caller checks consistency).
  // Returns its sequence, or 0 in bitmap mode.
  uint64_t AppendTagLocked(std::string_view name);
  // Queues a kAnomaly record (proto::EncodeAnomaly) naming the image after
  // `clean_seq` (<= the last sequence; 0: the start) as suspect-clean, with
  // the detector's message. Returns its sequence, or 0 in bitmap mode (the
  // write order is lost there: nothing to point at).
  uint64_t AppendAnomalyLocked(uint64_t clean_seq, std::string_view message);
  // Queues a resync range: `data` (length bytes, kept as it is: no copy) as a
  // data record, or, when `data` is empty, a kZero record of `length` bytes.
  // Returns 0 (nothing queued) unless in data mode and the data fits in the
  // data limit.
  uint64_t AppendResyncLocked(uint64_t offset, uint32_t length, Bytes data);
  CaptureMode ModeLocked() const { return st_.mode; }
  bool HasRoomLocked(uint64_t len) const;
  // The last sequence assigned (0: none yet).
  uint64_t LastSeqLocked() const { return next_seq_ - 1; }
  // Which numbering the sequences are in: 0 while they are provisional (no
  // Resume yet: the process server has not told the resume point), then 1,
  // plus one for every renumbering Resume. A sequence handed out under
  // numbering N means the same history position only while it is still N.
  uint64_t NumberingLocked() const { return resumed_ ? 1 + renumbers_ : 0; }

  // --- Sender side ---
  // Copies records with seq >= from_seq, at most `max_bytes` of data (at least
  // one record) and `max_records`, into *out. Returns false if there is none.
  bool Peek(uint64_t from_seq, uint64_t max_bytes, size_t max_records, std::vector<QueuedRecord>* out);
  // `fn` is called after every record queued, with the capture lock held (so
  // it must only wake someone: ReplicationSender::Notify). Set it before
  // writes arrive; empty = none.
  void SetOnAppend(std::function<void()> fn);
  // The process server durably holds every seq <= durable: releases them.
  // Returns to data mode once nothing is queued. Returns records released.
  size_t Ack(uint64_t durable);
  // The resume point told by the process server. If `durable` lies within
  // [acked, next_seq-1] this is Ack(durable) and returns true. Otherwise the
  // queued records are renumbered to start at durable+1 and it returns false
  // (the caller decides whether history was lost: see Sender); `renumbered`,
  // when given, is then called under the capture lock with (old acked, new
  // acked) so that other holders of sequences (the dirty bitmap) follow.
  bool Resume(uint64_t durable,
              const std::function<void(uint64_t old_acked, uint64_t new_acked)>& renumbered = nullptr);

  // A new generation (re-protect after a failback): every queued record is
  // dropped and numbering starts again at 1 with no resume point, as in a
  // new process. The caller has made sure none of them is needed (failback
  // compared their blocks and saved the differing ones to the branch).
  // Call with Lock() held.
  void ResetLocked();

  uint64_t next_seq() const;
  uint64_t acked_seq() const;
  uint64_t numbering() const;  // NumberingLocked(), taking the lock
  CaptureMode mode() const;  // lock-free (a recent value)
  CaptureQueueStats Stats() const;

 private:
  void SetModeLocked(CaptureMode m, const char* why);
  uint64_t PushLocked(QueuedRecord r);

  Options opts_;
  uint64_t data_limit_;
  mutable std::mutex mu_;
  std::function<void()> on_append_;  // guarded by mu_
  std::condition_variable hold_cv_;  // a hold ended
  uint64_t hold_round_ = 0;          // 0: no hold on
  std::chrono::steady_clock::time_point hold_deadline_;
  std::shared_ptr<metrics::Histogram> hold_waits_;
  std::deque<QueuedRecord> q_;  // seqs acked_+1 .. next_seq_-1, in order
  uint64_t next_seq_ = 1;
  uint64_t acked_ = 0;
  bool resumed_ = false;    // Resume() has run at least once
  uint64_t renumbers_ = 0;  // Resume() calls that renumbered
  CaptureQueueStats st_;
  std::atomic<int> mode_relaxed_{0};  // st_.mode, readable without the lock
};

}  // namespace cdp::agent
