// SPDX-License-Identifier: Apache-2.0
// Spool: the process server's durable per-volume cache of captured writes.
//
// One Spool per (tenant, volume), in its own directory. It is a segment log
// (common/store/segment_log.h): segment files "<first seq, 16 hex digits>.spl", each
// a header followed by CRC-framed records (byte layout: docs/formats/spool.md
// on top of docs/formats/segment-log.md). Records keep the
// volume sequence, offset, length, kind, capture timestamp and data; a kData
// record whose data is all zeros is stored (and later shipped) as kZero.
//
// Append() is a group commit (leveldb's writer queue): callers queue their
// batches; the first in line becomes the leader, writes every queued batch,
// issues ONE File::Sync() for all of them, and only then reports each batch
// durable. A batch is acknowledged to the agent only after Append() returned
// ok, so a crash before the sync never leaves an acknowledged batch behind and
// a crash after it never loses one.
//
// Sequences: the spool accepts contiguous sequences. Records with
// seq <= durable_seq() are duplicates and skipped; a record past the expected
// one is a gap (kOutOfRange, expected_seq set). SetFloor(n) says "the master
// target already has everything <= n": the spool then expects n+1 next (used
// when the spool lost or released records the MT already applied).
//
// Quota: the unshipped (not yet released) record bytes are the backlog; a
// batch that would push the backlog over `quota_bytes` is refused with kBusy,
// and once refused the spool stays busy until the backlog has drained to
// `resume_fraction` of the quota (hysteresis, so the agent is not flapped).
//
// Shipping: Read() returns durable records from a sequence on, re-checking each
// record's CRC (a record that fails is never returned: kCorruption). The bytes
// of the latest group commits stay in memory, up to `recent_bytes` per spool
// (not released, newest kept), and Read() decodes records from there instead
// of reading them back from the file: a master target that keeps up is fed
// without a read. A group larger than `recent_bytes` is not kept. Damage to
// the file under a kept group is found by recovery, not by Read(). Release(n)
// is called when the master target acknowledged n durably; it deletes every
// segment whose records are all <= n (never the active segment). With several
// copies (process-server/spooled_volume.h) n is the lowest sequence every copy
// acknowledged, so the backlog and the quota are those of the slowest copy;
// BacklogAbove() tells one copy's own lag.
//
// Recovery (Open): segments are scanned in order; a torn or CRC-failing tail of
// the LAST segment is truncated (it was never acknowledged: it was never
// synced). A bad record anywhere else is corruption of synced data: it and
// everything after it are dropped, counted in Recovery::corrupt_records and
// reported through `on_corruption` (data loss; the volume needs a resync).
//
// Thread safety: all methods are thread-safe. Append() may be called from many
// threads (they group-commit); Read/Release/stats from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"
#include "common/store/segment_log.h"
#include "common/wire/protocol.h"

namespace cdp::ps {

// On-disk constants (docs/formats/spool.md). The version is the segment log's.
inline constexpr uint16_t kSpoolKind = 1;  // segment-log kind of spool segments
inline constexpr uint32_t kSegmentMagic = seglog::kMagic;
inline constexpr uint32_t kSpoolVersion = seglog::kVersion;
inline constexpr char kSpoolSegmentSuffix[] = ".spl";
inline constexpr size_t kSegmentHeaderSize = seglog::kHeaderSize;
// The segment log's frame, then seq, offset, length, kind, timestamp.
inline constexpr size_t kRecordHeaderSize = seglog::kFrameSize + 32;
// A record's data is at most a protocol record (or a tag name).
// A data record's bytes, or a sealed one's blocks and MACs.
inline constexpr uint32_t kMaxSpoolRecordData = proto::kMaxRecordLength + uint32_t(proto::SealMacBytes(proto::kMaxRecordLength));

// The bytes of recent group commits a spool keeps for Read() (see above).
inline constexpr uint64_t kRecentBytes = 16u << 20;

struct SpoolOptions {
  Env* env = nullptr;        // must outlive the Spool
  Clock* clock = nullptr;    // must outlive the Spool; ages of records
  std::string dir;           // the volume's spool directory (created if missing)
  uint64_t segment_bytes = 16u << 20;  // roll to a new segment past this size
  uint64_t quota_bytes = 0;            // backlog limit; 0 = unlimited
  double resume_fraction = 0.9;        // after kBusy, accept again at this fill
  uint64_t recent_bytes = kRecentBytes;  // recent group commits kept for Read (0: none)
  // Called (from Open or Read) for every corruption found; may be empty.
  std::function<void(const Status&)> on_corruption;
};

struct SpoolRecovery {
  uint64_t segments = 0;         // segment files kept
  uint64_t records = 0;          // valid records found
  uint64_t truncated_bytes = 0;  // torn tail bytes cut off the last segment
  uint64_t corrupt_records = 0;  // bad records in synced data (data loss)
  uint64_t dropped_segments = 0; // segments removed (headerless or after corruption)
};

struct AppendResult {
  Status status;              // ok, kBusy (quota), kOutOfRange (gap), kInvalidArgument, I/O errors
  uint64_t durable_seq = 0;   // on ok: everything <= this is durable
  uint64_t expected_seq = 0;  // on a gap: the sequence the spool expects next
  uint64_t appended = 0;      // records written (duplicates excluded)
};

// What the spool holds above one sequence (a copy's acknowledged one).
struct SpoolBacklog {
  uint64_t records = 0;             // durable records with a higher sequence
  uint64_t bytes = 0;               // their bytes as spooled (header + data)
  uint64_t oldest_timestamp_us = 0; // capture time of the first of them (0: none)
};

struct SpoolStats {
  uint64_t first_seq = 0;        // oldest unreleased record (0: none)
  uint64_t durable_seq = 0;      // newest durable record (or the floor)
  uint64_t released_seq = 0;     // highest sequence the MT acknowledged
  uint64_t backlog_bytes = 0;    // record bytes not yet released
  uint64_t backlog_records = 0;
  uint64_t oldest_timestamp_us = 0;  // capture time of the oldest unreleased record
  uint64_t disk_bytes = 0;       // bytes of all segment files
  uint64_t segments = 0;
  uint64_t syncs = 0;            // group commits done
  uint64_t read_bytes = 0;       // bytes (as spooled: header + data) of the records Read() returned...
  uint64_t read_file_bytes = 0;  // ...and the bytes it read back from segment files for them
  uint64_t appended_batches = 0;
  uint64_t queued_writers = 0;   // Append() calls waiting or being written
  bool busy = false;             // refusing for quota
};

class Spool {
 public:
  // Opens (recovering) or creates the spool in options.dir.
  static Result<std::unique_ptr<Spool>> Open(const SpoolOptions& options, SpoolRecovery* recovery = nullptr);
  ~Spool();
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  // Appends `records` (contiguous, ascending sequences) durably; see the header
  // comment for duplicates, gaps and quota. Records are consumed (moved from).
  AppendResult Append(std::vector<proto::Record> records);

  // Up to `max_bytes` of record data (at least one record if any) of durable
  // records with seq >= from_seq, in order. Empty when none is durable yet.
  // kCorruption if a record fails its CRC (it is not returned).
  Result<std::vector<proto::Record>> Read(uint64_t from_seq, uint64_t max_bytes);

  // The MT durably holds everything <= seq: frees whole segments.
  Status Release(uint64_t seq);

  // The MT already applied everything <= seq; the spool expects seq+1 next if
  // that is past its own records.
  void SetFloor(uint64_t seq);

  // Waits (real time, at most `timeout_ms`) until durable_seq() > after_seq or
  // Close() is called. Returns durable_seq().
  uint64_t WaitDurable(uint64_t after_seq, int timeout_ms);
  // Wakes waiters; later Appends fail with kAborted, and Release and SetFloor
  // change nothing (a closed spool never deletes a file: its directory may
  // have been retired and a new spool created at its path). Read still works.
  void Close();

  uint64_t durable_seq() const;
  SpoolStats stats() const;
  // The durable records with seq > `seq` that the spool still holds (those
  // at or below the released sequence are gone and not counted).
  SpoolBacklog BacklogAbove(uint64_t seq) const;

 private:
  struct Segment {
    uint64_t first_seq = 0;
    uint64_t last_seq = 0;     // 0 when empty (first_seq - 1 conceptually)
    uint64_t size = 0;
    std::string path;
    std::shared_ptr<seglog::Writer> log;  // its file is shared with readers
  };
  struct IndexEntry {
    uint64_t seq;
    uint64_t segment_first;  // key of its segment
    uint64_t offset;         // of the record header in the file
    uint32_t size;           // header + data
    uint64_t timestamp_us;
    uint64_t end_bytes;      // bytes_indexed_ after this entry: backlogs above a seq in O(1)
  };
  struct Writer;
  struct Recent {  // the bytes of one group commit, as written
    uint64_t segment_first;
    uint64_t offset;   // in the segment file
    uint64_t last_seq;
    std::shared_ptr<const Bytes> bytes;
  };

  explicit Spool(const SpoolOptions& options);
  Status Recover(SpoolRecovery* rec);
  Status CreateSegment(uint64_t first_seq, Segment* out);
  bool BusyLocked(uint64_t extra) ;
  uint64_t NextExpectedLocked() const;
  void Report(const Status& s);

  SpoolOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;          // writer queue
  std::condition_variable durable_cv_;  // readers waiting for data
  std::deque<Writer*> writers_;
  std::map<uint64_t, Segment> segments_;  // by first_seq; the last is active
  std::deque<IndexEntry> index_;          // unreleased durable records, contiguous
  uint64_t durable_seq_ = 0;              // last durable record (or floor)
  uint64_t released_seq_ = 0;
  uint64_t backlog_bytes_ = 0;
  uint64_t bytes_indexed_ = 0;            // every entry's size ever pushed on index_
  uint64_t disk_bytes_ = 0;
  uint64_t syncs_ = 0;
  std::deque<Recent> recent_;             // ascending; bytes total <= kRecentBytes
  uint64_t recent_bytes_ = 0;
  uint64_t read_bytes_ = 0;
  uint64_t read_file_bytes_ = 0;
  uint64_t batches_ = 0;
  bool busy_ = false;
  bool closed_ = false;
};

// Encodes one record in the spool's framing (exposed for tests and tools).
void EncodeSpoolRecord(const proto::Record& r, Bytes* out);
// True when every byte is zero (common/base/coding.h).
using cdp::AllZero;

}  // namespace cdp::ps
