// SPDX-License-Identifier: Apache-2.0
// The value types of a master target's replicated volume (ReplicaVolume,
// master-target/replica_volume.h, and its parts): identity, states, points,
// rollbacks, anomalies, retention, options, status, and the two sequence
// numberings. Plain data and pure functions; no locks, no I/O.
//
// Thread safety: values; the functions are pure.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"
#include "common/wire/protocol.h"

namespace cdp::metrics {
class Registry;
class Counter;
class Gauge;
class DoubleGauge;
}  // namespace cdp::metrics

namespace cdp::mt {

struct VolumeIdentity {
  std::string name;
  uint64_t size = 0;
  uint32_t block_size = 4096;
  std::array<uint8_t, 16> uuid{};
  uint64_t generation = 0;
  // Tenant-side encryption (common/crypto/seal.h): the volume takes only kSealed /
  // kSealedZero records. Their MACs live in the replica file after the
  // volume's `size` bytes (the MAC of block b at size + 16 b), are applied,
  // journaled, rolled back and read at a point like any other bytes, and are
  // never part of an export, a digest or a failback. Fixed at creation.
  bool sealed = false;
};

// Bytes of the replica file: the volume, then the MACs of a sealed one.
uint64_t DeviceSize(const VolumeIdentity& id);

// The peer a volume's records come from: a process server, or an agent of a
// tenant in `direct_agents`. Known by its certificate's name with TLS, by its
// client_id without (docs/operations.md, "Moving a volume to another upstream").
struct Upstream {
  std::string role;  // "ps" | "agent"
  std::string name;
  bool operator==(const Upstream&) const = default;
  // "process server 'NAME'" / "agent 'NAME'"
  std::string Describe() const;
};

// kReplicating is shown as "protecting" (the operator's word for it).
enum class VolumeState { kReplicating = 0, kRollingBack = 1, kFailedOver = 2, kFailingBack = 3, kFailedBack = 4 };
const char* StateName(VolumeState s);

// Why apply is stalled. A batch whose apply failed on an I/O error is undone
// and its sender resends it after a pause (nack kInternal): until one applies,
// the volume is stalled, and the cause is shown with its state. Not persisted
// (a restart starts unstalled; the next failure stalls it again).
// kHistoryLock: the journal is over its byte budget (retention.max_bytes) and
// what retention would drop to make room is inside the history lock
// (master-target/history_lock.h): apply refuses batches (Nack kBusy, the
// sender holds and retries; the process server's spool absorbs the backlog)
// until the lock window moves on or the admin raises the budget.
enum class StallCause { kNone = 0, kNoSpace = 1, kIOError = 2, kHistoryLock = 3 };
// "no space" (ENOSPC, EDQUOT, a full sqlite: Status kNoSpace), "I/O error"
// (anything else), "history lock", "" for kNone.
const char* StallCauseName(StallCause c);
struct ApplyStall {
  StallCause cause = StallCause::kNone;
  std::string message;    // the failed apply's Status, as logged
  uint64_t since_us = 0;  // wall clock of the first failure of the stall
  uint64_t failures = 0;  // failed applies since then
};

// A promoted failover (`cdpctl failover VOLUME --to POINT`), persisted in the
// index's `failover` row (docs/formats/mt-index.md).
struct FailoverInfo {
  uint64_t point_seq = 0;   // history sequence of the promoted image
  int64_t point_id = 0;     // the recovery point's id; 0 when named by sequence
  bool committed = false;   // `--commit`: undo is refused from then on
  uint64_t time_us = 0;     // wall clock of the failover
  bool quiesced = false;    // failing back: the promoted export refuses writes
};

enum class PointKind { kCrash = 1, kTag = 2 };
const char* PointKindName(PointKind k);

struct RecoveryPoint {
  int64_t id = 0;         // unique per volume, increasing
  uint64_t seq = 0;       // the image after applying every record <= seq
  // When the protected host wrote it: the capture time of the record that
  // made it (the agent's wall clock, micros), the MT's clock for what the MT
  // writes itself (a rollback) and for points made before issue 38.
  uint64_t time_us = 0;
  PointKind kind = PointKind::kCrash;
  std::string name;       // tag name; "" for crash-consistent points
  // On a rolled-back branch: a rollback to an earlier point rewound the
  // replica past it. Still listed and exportable (the rollback journaled what
  // it overwrote) until retention and the history lock let it go.
  bool rolled_back = false;
  // When this MT applied it (its wall clock, micros): what retention and the
  // history lock count from, so that a host's clock cannot age its history.
  uint64_t applied_us = 0;
};

// VOLUME@TIME: the newest point (by time_us, then sequence) the protected
// host wrote at or before `time_us`; none when every point is later.
std::optional<RecoveryPoint> PointAtTime(const std::vector<RecoveryPoint>& points, uint64_t time_us);
// A UTC time as an operator writes it: "YYYY-MM-DDTHH:MM:SS" or with a space
// for the T, seconds optional, an optional fraction ".ffffff" and an
// optional trailing "Z". Micros since the epoch; kInvalidArgument naming the
// accepted forms otherwise.
Result<uint64_t> ParseUtcTime(std::string_view text);

// A rollback (Rollback()), persisted in the index's `rollbacks` table. The
// points with to_seq < seq <= from_seq are its branch. The records from_seq+1
// .. end_seq are the rollback itself: the blocks it rewound, journaled as
// new history, ending with the tag "rollback-to-<to_seq>" (end_seq 0: in
// progress).
struct RollbackInfo {
  uint64_t to_seq = 0;
  uint64_t from_seq = 0;
  uint64_t end_seq = 0;
  uint64_t time_us = 0;
};

// A possible ransomware attack the agent saw (a proto::RecordKind::kAnomaly
// record; agent/anomaly_detector.h), persisted in the index's `anomalies`
// table. Applying the record adds the point "suspect-clean" at clean_seq
// (the image just before the suspect writes), which retention keeps until
// hold_until_us or until an admin acknowledges the event.
struct AnomalyEvent {
  int64_t id = 0;
  uint64_t seq = 0;          // the anomaly record's history sequence
  uint64_t clean_seq = 0;    // the suspect-clean image
  int64_t point_id = 0;      // its point
  uint64_t time_us = 0;      // wall clock when applied
  std::string message;       // the agent's ("change rate 52.3 MB/s (baseline ...")
  bool acknowledged = false;
  uint64_t hold_until_us = 0;
  // Holds its point at `now_us`.
  bool Holds(uint64_t now_us) const { return !acknowledged && now_us < hold_until_us; }
};

// Both limits are maxima; 0 = unlimited. See ApplyRetention() for the promise.
// lock_us: the history lock (master-target/history_lock.h; 0: none), which
// neither limit can cut.
struct RetentionPolicy {
  uint64_t max_age_us = 0;
  uint64_t max_bytes = 0;
  uint64_t lock_us = 0;
};

// Counters a daemon exports (common/daemon/metrics.h). Null pointers are skipped.
struct VolumeMetrics {
  std::shared_ptr<metrics::Counter> bytes_applied;      // change bytes applied (data+zero+trim)
  std::shared_ptr<metrics::Counter> records_applied;
  std::shared_ptr<metrics::Counter> disk_read_bytes;    // replica + journal reads by apply/undo
  std::shared_ptr<metrics::Counter> disk_write_bytes;   // replica + journal writes by apply/undo
  std::shared_ptr<metrics::Gauge> journal_bytes;
  std::shared_ptr<metrics::Gauge> points;
  std::shared_ptr<metrics::Gauge> applied_seq;
  std::shared_ptr<metrics::DoubleGauge> apply_lag_seconds;  // now - capture time of the last applied record
  std::shared_ptr<metrics::DoubleGauge> retention_span_seconds;
  // 1 while apply is stalled for that cause, else 0 (cdp_mt_apply_stalled{cause=...}).
  std::shared_ptr<metrics::Gauge> stalled_no_space;
  std::shared_ptr<metrics::Gauge> stalled_io_error;
  std::shared_ptr<metrics::Gauge> stalled_history_lock;
  // The history lock in force, in seconds (cdp_mt_history_lock_seconds).
  std::shared_ptr<metrics::Gauge> history_lock_seconds;
  // Anomalies neither acknowledged nor past their hold (cdp_mt_anomalies_open).
  std::shared_ptr<metrics::Gauge> anomalies_open;
};

struct VolumeOptions {
  Env* env = nullptr;             // must outlive the ReplicaVolume
  const Clock* clock = nullptr;   // must outlive the ReplicaVolume
  std::string dir;                // the volume's directory in `env`
  std::string index_path;         // sqlite file (real file system, or ":memory:"-like paths in tests)
  // "" : index_path is on the local file system. Otherwise the sqlite VFS to
  // open it with: an EnvVfs over `env` (the index then lives with the
  // volume's other files, e.g. in a Ceph pool).
  std::string index_vfs;
  uint64_t segment_bytes = 64ull << 20;
  // Crash-consistent points: at most one per interval, at the first flush or
  // write whose capture time is at least point_interval_us after the last
  // one (PointCatalogue::PointsOf). 0: one at every flush, none at writes.
  uint64_t point_interval_us = 5'000'000;
  // Only flushes make crash-consistent points (an application that never
  // flushes gets none between tags); config point_require_flush.
  bool points_require_flush = false;
  // A batch asking more ranged work (sum of data/zero/trim lengths: bytes
  // read into the undo journal) is refused with kBadRecord, nothing applied.
  uint64_t max_batch_work = proto::kMaxBatchWork;
  RetentionPolicy retention;
  // Old data goes into the undo journal zstd-compressed at this level when
  // that saves an eighth or more (0: never compressed). Per tenant at the MT.
  int journal_zstd_level = 1;
  // Apply reads the old data and writes the new data of the replica's whole
  // 4 KiB blocks through a second, O_DIRECT handle of the replica file, in
  // batches with several requests in flight (master-target/replica_io.h;
  // issue #15): no page-cache copy, no writeback of whole large folios per
  // 4 KiB block. Unaligned heads and tails, exports, digests and undo go
  // through the buffered handle. False, or an Env or file system that does
  // not honour O_DIRECT (then logged once at open): buffered only, as before.
  bool replica_direct_io = true;
  // A rollback undoes this many sequences at a time, newest first (its
  // memory: the undo index entries of one window).
  uint64_t rollback_window = 16384;
  // A rollback writes the image at its point back in batches of about this
  // many bytes (its memory; each batch is one apply).
  uint64_t rollback_batch_bytes = 8u << 20;
  // An anomaly's suspect-clean point is kept at least this long, whatever
  // the retention policy, unless an admin acknowledges it.
  uint64_t anomaly_hold_us = 7ull * 86'400'000'000;
  // Fault injection for tests: called just before the sqlite commit of a
  // batch; a non-ok Status aborts the batch there (as a crash before commit).
  std::function<Status()> before_commit;
  VolumeMetrics metrics;
};

// What the caller tells the peer after ApplyBatch.
struct ApplyOutcome {
  bool ack = true;                  // false: nack with reason/expected_seq/message
  proto::NackReason reason = proto::NackReason::kInternal;
  uint64_t expected_seq = 0;
  std::string message;
  uint64_t durable_seq = 0;         // for an ack
  uint64_t applied = 0;             // records applied by this call
  uint64_t duplicates = 0;          // records skipped as already applied
};

struct VolumeStatus {
  VolumeIdentity identity;
  VolumeState state = VolumeState::kReplicating;
  uint64_t applied_seq = 0;
  uint64_t horizon_seq = 0;        // points below this sequence are no longer reachable
  uint64_t journal_bytes = 0;
  uint64_t journal_segments = 0;
  uint64_t undo_records = 0;
  size_t points = 0;
  size_t active_exports = 0;
  uint64_t rollback_to = 0;        // failed-over: the point rolled back to
  uint64_t seq_base = 0;           // see VolumeFence::seq_base()
  uint64_t reprotect_armed = 0;    // the generation an operator allowed, 0: none
  Upstream upstream;               // the generation's upstream (empty before its first open)
  std::optional<FailoverInfo> failover;  // a promoted failover
  std::optional<ApplyStall> stall;       // set while apply is stalled (see StallCause)
  uint64_t lock_us = 0;                  // the history lock in force
  uint64_t lock_pending_until_us = 0;    // a shortened lock: when the longer one ends (0: none)
  size_t rolled_back_points = 0;         // points on a rolled-back branch
  size_t anomalies_open = 0;             // AnomalyEvent::Holds now
  std::string last_anomaly;              // the newest event's message ("": none)
};

// The state as the operator reads it (/v1/volumes, /status, cdpctl status):
// StateName(st.state), or "stalled: <cause>" while a protecting volume's apply
// is stalled ("stalled: no space", "stalled: I/O error").
std::string ShownState(const VolumeStatus& st);

struct RetentionResult {
  std::vector<uint64_t> dropped_segments;
  std::vector<int64_t> dropped_points;   // ids of points broken by the dropped segments
  uint64_t horizon_seq = 0;
  // The journal is over max_bytes and a point inside the history lock keeps
  // the bytes that would bring it under: apply stalls (kHistoryLock).
  bool locked_over_budget = false;
};

// Journal segment bookkeeping (also the sqlite `segments` rows).
struct SegmentInfo {
  uint64_t segment = 0;
  uint64_t min_seq = 0;     // 0: no record yet
  uint64_t max_seq = 0;
  uint64_t first_time_us = 0;
  uint64_t last_time_us = 0;
  uint64_t bytes = 0;       // file size (append position)
};

// A volume's two numberings: the generation's wire sequences (what its
// upstream sends, from 1) and the volume's history sequences (points,
// exports, applied_seq; they never restart). `base` is the history sequence
// of the generation's wire sequence 0 (VolumeFence::seq_base()). The only
// conversion between them: nothing else adds or subtracts a base. Take one
// per batch or request, so that a re-protect in between cannot mix two bases.
struct Numbering {
  uint64_t base = 0;
  // A wire sequence of the generation as a history sequence (0 stays 0: none).
  uint64_t History(uint64_t wire_seq) const { return wire_seq == 0 ? 0 : wire_seq + base; }
  // A history sequence as the generation's (0 when at or before its start).
  uint64_t Wire(uint64_t history_seq) const { return history_seq > base ? history_seq - base : 0; }
};

}  // namespace cdp::mt
