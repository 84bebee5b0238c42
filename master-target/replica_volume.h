// SPDX-License-Identifier: Apache-2.0
// ReplicaVolume: one replicated volume at the master target — its replica file, its
// undo journal (master-target/journal.h), its sqlite index (volume row,
// journal segments, recovery points; docs/formats/mt-index.md) and the
// in-memory undo index for point-in-time reads.
//
// Apply protocol, per WriteBatch (one journal sync and one replica sync per
// batch, not per record):
//
//   validate every record (duplicates skipped, gap / bad record -> nack, nothing applied)
//     |
//   for each write record, in order: read the old bytes (replica + the batch's
//   earlier records; a hole of the replica is not read), encode undo records
//   (<= 1 MiB each, all-zero -> no data). The replica reads of up to 4 MiB
//   of records are issued together (ReplicaIo::Read), then the batch's
//   earlier records are laid over them record by record
//     |
//   journal Append ... journal Sync (+ dir sync for a new segment)   -- sync point 1
//     |
//   undo index += the new records (exclusive lock: exports now see them)
//     |
//   replica Write / PunchHole ... replica Sync                       -- sync point 2
//   (the batch's final image: its records laid over each other in order,
//   as disjoint extents; zero extents punched first, then the data extents
//   in one ReplicaIo::Write: unaligned heads and tails buffered, then the
//   4 KiB blocks through O_DIRECT, several at once; see replica_io.h)
//     |
//   sqlite: applied seq, journal position, segments, new points      -- commit point
//     |
//   durable_seq = last seq of the batch -> the caller acks it
//
// Crash recovery (at Open, and in place after a failed apply): every undo
// record past the committed journal position is undone newest first (each
// writes the bytes it saved; saved zeros punch a hole, so that the undo of a
// batch that failed on a full disk needs no new block), the replica is
// synced, the journal is truncated
// at the committed position and later segments are removed. The replica then
// holds exactly the image at the committed sequence, and resent records are
// applied again. A volume interrupted in a rollback finishes the rollback.
// When the in-place undo after a failed apply fails too, it is tried again at
// the next batch (HealLocked): a full disk stalls apply, never for good.
//
// ReplicaVolume states (VolumeState; persisted in the index's volume row, and
// for a failover in its `failover` row, so a restart or a kill -9 keeps them):
//
//                      Failover(P)  [cdpctl failover V --to P]
//   protecting -------------------------------------------> failed-over (promoted P)
//   (kReplicating) <-------------------------------------   |  the replica and the
//    ^   ^   ^  |      UndoFailover() [--undo]; refused     |  journal after P are
//    |   |   |  |      once committed                       |  kept untouched (the
//    |   |   |  |                                           |  branch); P is pinned;
//    |   |   |  |                                           |  CommitFailover() [--commit]
//    |   |   |  |                                           v  StartFailback() [cdpctl failback]
//    |   |   |  |                                      failing-back (commits the failover)
//    |   |   |  |   the agent pulls (MasterTarget::FailbackPlan / Pull); QuiesceFailback():
//    |   |   |  |   the promoted export refuses writes; ApplyFailback(): its image is
//    |   |   |  |   applied as new history, tag "failback"; EndFailback():
//    |   |   |  |                                           v
//    |   |   +--|------ Open with generation G+1 after --- failed-back (generation G fenced:
//    |   |      |       ArmReprotect() [cdpctl reprotect]   "failed over: ... failed back")
//    |   |      +--Rollback(P)--> rolling-back --done--> failed-over (rolled back to P)
//    |   +------ Open with generation G+1 after ArmReprotect() ------+
//    +---------- (the same, from protecting)
//
// Failed over by Failover(P) (a "promoted" failover): the MT serves the image
// at P as a persistent read-write NBD export (a copy-on-write overlay over
// ReadAt(P), master-target/export.h), and every stream of the old primary is
// fenced: CheckOpen and ApplyBatch answer Nack{kWrongGeneration} with a message
// beginning "failed over" (proto::IsFailedOverNack) and apply nothing; so
// while failing back, and after it until re-protect (failed-back). Every
// step is idempotent: Failover(P) again is a no-op, Failover(Q != P) is
// kAlreadyExists; UndoFailover() of a protecting volume is a no-op.
// Re-protect and rollback are refused while a promoted failover stands.
//
// No message from a peer drops history. A VolumeOpen with a higher
// generation is refused (Nack kPermissionDenied) unless an operator armed a
// re-protect (ArmReprotect(), `cdpctl reprotect`), and then only for the next
// generation. Re-protecting keeps the replica, the journal and every point:
// the new generation's sequence 1 follows the volume's history sequence H
// (the applied sequence at the re-protect), so internally sequences never
// restart and every old point stays exportable until retention expires it.
// The wire speaks the generation's own numbers: wire seq = history seq - H
// (seq_base()); points, exports and applied_seq() are history sequences.
// A volume failed over by a rollback refuses writes (Nack kWrongGeneration)
// until re-protected.
//
// Files of a volume `dir`:  replica.img, digests (master-target/digest_store.h),
// journal/<16 hex>.jnl; the sqlite
// index lives at VolumeOptions::index_path (dir/index.db in the daemon).
//
// Code: the façade, reads, pins and hashes in replica_volume.cc; the sqlite
// index in replica_index.cc; apply and re-protect in replica_apply.cc; crash
// recovery in replica_recovery.cc; rollback in replica_rollback.cc; failover
// in replica_failover.cc; retention in replica_retention.cc; the replica's
// batched direct I/O in replica_io.cc.
//
// Thread safety: all public methods are thread-safe. Apply, Rollback,
// Retention and current-image Digests are serialised by one mutex; ReadAt (exports)
// runs concurrently with them and sees the image of its point throughout.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"
#include "common/store/sqlite.h"
#include "common/wire/block_digest.h"
#include "common/wire/protocol.h"
#include "master-target/digest_store.h"
#include "master-target/history_lock.h"
#include "master-target/journal.h"
#include "master-target/replica_io.h"
#include "master-target/undo_index.h"

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

// A sealed volume's records as the plain writes apply journals: each sealed
// record of recs[first..] becomes its blocks (data, or zeros) at its range
// and its MACs as data at volume_size + 16 * block, both under the record's
// sequence; other records are copied as they are.
std::vector<proto::Record> UnsealRecords(const std::vector<proto::Record>& recs, size_t first, uint64_t volume_size);

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
  uint64_t point_interval_us = 5'000'000;  // at most one crash-consistent point per interval
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
  uint64_t seq_base = 0;           // see ReplicaVolume::seq_base()
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

class ReplicaVolume;

// Keeps a point readable (retention will not drop what it needs, rollback is
// refused) while alive. Must not outlive its ReplicaVolume.
class PointPin {
 public:
  PointPin(ReplicaVolume* v, uint64_t seq) : v_(v), seq_(seq) {}
  ~PointPin();
  PointPin(const PointPin&) = delete;
  PointPin& operator=(const PointPin&) = delete;
  uint64_t seq() const { return seq_; }

 private:
  ReplicaVolume* v_;
  uint64_t seq_;
};

class ReplicaVolume {
 public:
  // Opens the volume in opts.dir, creating it from `create` when its index has
  // no volume yet (create == nullptr: kNotFound then). Runs crash recovery
  // before returning. Failure: the Env's or sqlite's Status, kCorruption for a
  // journal that contradicts the index.
  static Result<std::unique_ptr<ReplicaVolume>> Open(VolumeOptions opts, const VolumeIdentity* create);
  ~ReplicaVolume();
  ReplicaVolume(const ReplicaVolume&) = delete;
  ReplicaVolume& operator=(const ReplicaVolume&) = delete;

  // Checks a VolumeOpen from `from` against this volume. OK: same uuid, size
  // and generation, or the armed re-protect generation (see above); durable_seq
  // is a wire sequence. Otherwise an outcome with ack=false: kWrongGeneration
  // for another uuid, size or block size, a lower generation or a failed-over
  // volume; kPermissionDenied for a higher generation nobody armed, and for
  // another upstream than the generation's.
  //
  // One upstream per generation: the first open of a generation binds it to
  // `from` (persisted). Sequence numbers are the upstream's; records another
  // upstream still holds (a process server's spool) would interleave with a
  // second one's under the same numbers, or be silently skipped as
  // duplicates. Moving a volume is a re-protect: the next generation binds
  // its first opener, the old one's streams are fenced (a lower generation)
  // and the agent compares every region.
  Result<ApplyOutcome> CheckOpen(const VolumeIdentity& id, const Upstream& from);

  // An operator's re-protect: the next VolumeOpen with generation()+1 will be
  // accepted (once; until the daemon restarts). Returns that generation.
  Result<uint64_t> ArmReprotect();
  // The history sequence the current generation's wire sequence 0 stands for.
  uint64_t seq_base() const { return seq_base_.load(); }
  // The two numberings (above), as of now: the only conversion between them
  // (nothing else adds or subtracts seq_base()). Take one per batch or
  // request, so that a re-protect in between cannot mix two bases.
  struct Numbering {
    uint64_t base = 0;
    // A wire sequence of the generation as a history sequence (0 stays 0: none).
    uint64_t History(uint64_t wire_seq) const { return wire_seq == 0 ? 0 : wire_seq + base; }
    // A history sequence as the generation's (0 when at or before its start).
    uint64_t Wire(uint64_t history_seq) const { return history_seq > base ? history_seq - base : 0; }
  };
  Numbering numbering() const { return Numbering{seq_base()}; }
  uint64_t generation() const { return generation_.load(); }

  // Applies a batch (see the protocol above). Validation failures and gaps
  // are returned as a nack outcome with nothing applied; a non-ok Status is an
  // I/O failure (the volume has then undone the partial batch, or — when even
  // that failed — tries the undo again at the next ApplyBatch, CheckOpen or
  // ApplyRetention and refuses work until it succeeds), and the volume is
  // stalled (stall(), ShownState) until a batch applies again.
  Result<ApplyOutcome> ApplyBatch(const std::vector<proto::Record>& records);

  // Point-in-time read: the image after applying every record <= `point_seq`
  // (point_seq >= applied: the current image). kOutOfRange outside the volume
  // or for a point below the horizon; kCorruption if a journal read fails its
  // check. Safe concurrently with ApplyBatch.
  Status ReadAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* buf) const;
  // A sealed volume: the MACs (proto::kSealMacSize bytes per 4 KiB block) of
  // the blocks of [offset, offset + len) at `point_seq`, as ReadAt reads
  // their stored bytes. kInvalidArgument for an unsealed volume or a range
  // that is not whole 4 KiB blocks; otherwise as ReadAt.
  Status ReadMacsAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* macs) const;
  // ReadAt over the whole replica file, [0, DeviceSize()): a sealed volume's
  // stored blocks, then its MACs (the space a sealed promoted failover's
  // overlay covers). kOutOfRange past it.
  Status ReadStoredAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* buf) const;

  // Pins `point_seq` for an export. kOutOfRange if it is below the horizon or
  // above the applied sequence.
  Result<std::unique_ptr<PointPin>> Pin(uint64_t point_seq);

  // Rewinds the replica to `point_seq` (a recovery point's seq, or any seq
  // between horizon and applied), then the volume is failed over. Nothing is
  // lost: the blocks changed after the point are written back to their image
  // at the point as new history (journaled like any batch, in batches of
  // bounded memory), so every later point stays listed (rolled_back) and
  // exportable, and the replica's image at the end equals the point's. A
  // crash in the middle finishes the rollback at the next Open.
  // discard_history: then forgets the points of the branch (retention can
  // drop their journal); kAlreadyExists, with nothing done, when any of them
  // is inside the history lock. Callers check that only an admin asks it.
  // kBusy while exports are pinned; kOutOfRange for an unreachable seq.
  Status Rollback(uint64_t point_seq, bool discard_history = false);
  std::vector<RollbackInfo> Rollbacks() const;

  // Ransomware anomalies (AnomalyEvent), oldest first.
  std::vector<AnomalyEvent> Anomalies() const;
  // An admin's acknowledgement: the event's point is no longer held beyond
  // retention. True: changed; false: already acknowledged. kNotFound for an
  // unknown id; sqlite's Status on failure.
  Result<bool> AcknowledgeAnomaly(int64_t id);

  // Failover (see the states above). Failover: the volume becomes failed-over
  // at `point_seq` (the caller has created and synced the promoted export's
  // overlay before; it pins the point). True: changed; false: already failed
  // over at that point (nothing done). kAlreadyExists when failed over at
  // another point, kInvalidArgument for a volume rolled back or rolling back,
  // kOutOfRange for an unreachable sequence, sqlite's Status on failure (then
  // nothing changed).
  Result<bool> Failover(uint64_t point_seq, int64_t point_id);
  // Marks the failover final. True: changed; false: already committed.
  // kInvalidArgument when the volume is not failed over by Failover().
  Result<bool> CommitFailover();
  // Back to protecting as before the failover: replication resumes at the
  // applied sequence (the replica and the journal were never touched). True:
  // changed; false: the volume was protecting already. kAlreadyExists once
  // committed, kInvalidArgument for a volume rolled back. The caller removes
  // the overlay afterwards (a leftover is harmless: the next failover
  // recreates it).
  Result<bool> UndoFailover();
  std::optional<FailoverInfo> failover() const;
  // The "failed over" refusal (proto::IsFailedOverNack) the stream of this
  // volume gets now: failed over, or failed back; "" while it replicates.
  // Sessions tell it to a peer that has the volume open, so that a peer with
  // nothing to send learns of the fence too.
  std::string Fence() const;

  // Failback (the states above; the pull itself is driven by the original
  // site's agent through MasterTarget::FailbackPlan / Pull).
  // StartFailback: failed-over -> failing-back, committing the failover (the
  // provider's writes are now the truth). True: changed; false: already
  // failing back. kInvalidArgument unless failed over by Failover().
  Result<bool> StartFailback();
  // Failing back: from now on the promoted export refuses writes (persisted,
  // so a restart keeps it quiesced). True: changed; false: already quiesced.
  Result<bool> QuiesceFailback();
  // The blocks (of block_size) of every undo record with a sequence above
  // `point_seq`: what the journal changed after the point. Sorted, merged.
  // Read window by window (memory: the extents, not the records).
  Result<std::vector<proto::BlockExtent>> JournalBlocksAfter(uint64_t point_seq) const;
  // Failing back and quiesced: applies `records` (kData / kZero, any seq:
  // they are renumbered after the applied sequence) as new history, journaled
  // like any batch, so every older point stays readable. Returns the last
  // history sequence applied.
  Result<uint64_t> ApplyFailback(std::vector<proto::Record> records);
  // Failing back and quiesced, the replica now equal to the promoted image:
  // failing-back -> failed-back. The failover row goes; the old generation's
  // stream stays fenced until `cdpctl reprotect` (ArmReprotect) lets the next
  // generation in. True: changed; false: already failed back.
  Result<bool> EndFailback();

  // Drops whole oldest journal segments that no promised point needs. A point
  // is promised when it is younger than max_age (or max_age is 0) and the
  // journal bytes it needs (every segment holding a record newer than it,
  // the current one included) fit in max_bytes (or max_bytes is 0); a pinned
  // point, the point of a standing failover, and a point inside the history
  // lock are always promised. Points broken by a drop are deleted.
  Result<RetentionResult> ApplyRetention();
  // The tenant's journal cap (max_journal_bytes_per_tenant) holds this
  // volume's batches (`why`, the nack's text): inside a history lock that is
  // the lock stall (retention can free only what the lock lets go), shown as
  // such until a batch applies again; without a lock, nothing is shown.
  void NoteTenantCapHold(const std::string& why);
  // Replaces the retention policy (takes effect at the next ApplyRetention;
  // the lock as HistoryLock::Configure says). The lock's sqlite Status on
  // failure (then the old policy stays).
  Status SetRetention(const RetentionPolicy& policy);
  RetentionPolicy retention() const;

  // Block digests (common/wire/block_digest.h) of units [first, first+count) of
  // `unit` bytes, for resync and online verify. Sequences are history
  // sequences. at_seq == 0: the current image, taken under the apply lock
  // (so the replica file is that image and its holes are skipped unread);
  // kBehind when applied < min_seq. at_seq != 0: the image at exactly that
  // sequence through the undo journal; kBehind when not yet applied,
  // kPointGone below the horizon. kInvalidArgument for a bad unit or count,
  // kOutOfRange when `first` starts past the end (units past the end are
  // left out).
  struct DigestQuery {
    uint32_t unit = 1u << 20;
    uint64_t first = 0;
    uint32_t count = 0;
    uint64_t min_seq = 0;
    uint64_t at_seq = 0;
    // The current image may come from the digest store (a resync).
    // Verify reads the replica afresh: it is there to find what went bad on
    // the disk behind our back.
    bool cached = true;
  };
  struct DigestAnswer {
    proto::HashStatus status = proto::HashStatus::kOk;
    uint64_t seq = 0;  // the sequence the digests describe (kBehind: applied)
    std::vector<proto::Hash128> digests;
    uint64_t bytes_read = 0;     // replica or journal bytes read
    uint64_t bytes_skipped = 0;  // holes not read
  };
  Result<DigestAnswer> Digests(const DigestQuery& q);
  // Leaf digests of the current image the digest store knew
  // (master-target/digest_store.h), since Open.
  uint64_t digest_store_hits() const;

  std::vector<RecoveryPoint> ListPoints() const;
  std::optional<RecoveryPoint> FindPoint(int64_t id) const;
  VolumeStatus GetStatus() const;
  std::vector<SegmentInfo> Segments() const;
  uint64_t applied_seq() const { return applied_.load(); }
  uint64_t size() const { return id_.size; }
  const VolumeIdentity& identity() const { return id_; }
  VolumeState state() const;
  std::optional<ApplyStall> stall() const;

 private:
  friend class PointPin;
  explicit ReplicaVolume(VolumeOptions opts) : o_(std::move(opts)) {}
  Status Init(const VolumeIdentity* create);
  Status CreateFiles(const VolumeIdentity& id);
  Status LoadIndex();
  // Undoes (when `undo`) the journal past the committed position, cuts it
  // there and reopens the writer.
  Status RecoverUncommitted(bool undo = true);
  Status RebuildUndoIndex();
  // Writes the image at rollback_to_ back over every block changed after it,
  // as new history, then ends the rollback (apply_mu_ held).
  Status FinishRollback();
  Result<RetentionResult> ApplyRetentionLocked();
  // Refuses a batch while the journal is over budget inside the lock
  // (retention run in place first); nullopt: go on. apply_mu_ held.
  Result<std::optional<ApplyOutcome>> CheckHistoryLock();
  // Marks points_ on a rolled-back branch (meta_mu_ held).
  void MarkRolledBack();
  // The journal's bytes, every segment (meta_mu_ held).
  uint64_t JournalBytesLocked() const;
  // The Nack text of the old generation's stream after a failback.
  std::string FailedBackMessage() const;
  // The Nack text of a fenced stream (failover_ set, apply_mu_ held), or of
  // failover `f`.
  std::string FencedMessage() const;
  std::string FencedMessage(const FailoverInfo& f) const;
  // Moves to generation `gen` keeping everything (apply_mu_ held).
  Status Reprotect(uint64_t gen);
  Status UndoEntries(const std::vector<UndoEntry>& entries);
  // ReadAt over the whole replica file (the MACs of a sealed volume included).
  Status ReadDeviceAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* buf) const;
  // A sealed volume's digests (apply_mu_ held for the current image, or the
  // point pinned): the leaves read through `reader`, a zero leaf whose MAC
  // slot is empty as kUnsealedZeroDigest, window by window.
  Result<std::vector<proto::Hash128>> SealedDigests(DigestReader& reader, const DigestQuery& q, uint64_t at_seq);
  // Digests of the current image through digests_ (apply_mu_ held).
  Result<std::vector<proto::Hash128>> CurrentDigests(DigestReader& reader, const DigestQuery& q, uint64_t* skipped);
  Status ZeroReplica(uint64_t offset, uint64_t len);
  Status ApplyLocked(const std::vector<proto::Record>& recs, size_t first, ApplyOutcome* out);
  // The commit point of a batch (master-target/replica_index.cc): the applied
  // sequence, the journal position, the touched segments, the batch's undo
  // records (staged in undo_) and the new points (whose ids it fills in), in
  // one sqlite transaction. Then undo_ reads those records from the database.
  // Each new anomaly's point_id names the index of its point in new_points
  // on entry, and the point's id on return.
  Status CommitBatch(uint64_t last_seq, uint64_t journal_segment, uint64_t journal_offset,
                     const std::map<uint64_t, SegmentInfo>& touched, const std::vector<UndoEntry>& undo,
                     std::vector<RecoveryPoint>* new_points, std::vector<AnomalyEvent>* new_anomalies);
  std::shared_ptr<File> SegmentFile(uint64_t segment) const;  // index_mu_ held
  void Unpin(uint64_t seq);
  void UpdateGauges();
  std::string JournalDir() const;
  std::string ReplicaPath() const;
  std::string DigestStorePath() const;

  VolumeOptions o_;
  VolumeIdentity id_;
  std::unique_ptr<sqlite::Db> db_;

  mutable std::mutex apply_mu_;  // serialises apply, rollback, retention, hashes
  std::unique_ptr<File> replica_;
  std::unique_ptr<ReplicaIo> replica_io_;  // apply's batched I/O: replica_ + its direct handle
  std::unique_ptr<DigestStore> digests_;  // every write to replica_ goes through it
  std::unique_ptr<SegmentWriter> writer_;
  VolumeState state_ = VolumeState::kReplicating;  // apply_mu_ (+ meta_mu_ for readers)
  uint64_t rollback_to_ = 0;
  std::optional<FailoverInfo> failover_;  // apply_mu_ (+ meta_mu_ for readers)
  uint64_t committed_segment_ = 0;   // committed journal position
  uint64_t committed_offset_ = 0;
  bool broken_ = false;              // an apply failed and could not be undone
  bool heal_by_recovery_ = false;    // broken_ by a failed undo of an apply: RecoverUncommitted() again heals it
  // OK unless broken_. A volume broken by a failed undo of an apply (a full
  // disk may refuse even the undo) tries the undo again, and works again
  // once it succeeds; any other broken_ needs a reopen. apply_mu_ held.
  Status HealLocked();
  // Binds the current generation to `from` (the upstream table, then the
  // members); apply_mu_ held.
  Status BindUpstream(const Upstream& from);
  // Sets (failure) or clears (ok) the stall and its gauges; apply_mu_ held.
  // `cause` kNone: the failure's Status tells (no space, or an I/O error).
  void NoteApply(const Status& s, StallCause cause = StallCause::kNone);
  std::atomic<uint64_t> applied_{0};
  std::atomic<uint64_t> seq_base_{0};    // history seq of the generation's wire seq 0
  std::atomic<uint64_t> generation_{0};  // id_.generation, for readers without apply_mu_
  std::atomic<uint64_t> reprotect_armed_{0};  // written under apply_mu_: the generation an operator allowed
  // The generation the upstream was bound in, and the upstream; written under
  // apply_mu_ and meta_mu_, read under either.
  uint64_t upstream_generation_ = 0;
  Upstream upstream_;

  // Readers (exports) take index_mu_ shared across the index lookup and the
  // reads it leads to; the apply thread takes it exclusive only to change the
  // index or the segment map.
  mutable std::shared_mutex index_mu_;
  // Writer preference for index_mu_ (glibc's rwlock prefers readers, and a
  // busy export must not starve apply): an exclusive locker holds the
  // turnstile while it waits, so no new reader gets in meanwhile.
  mutable std::mutex turnstile_;
  std::unique_lock<std::shared_mutex> LockIndexExclusive() const;
  std::shared_lock<std::shared_mutex> LockIndexShared() const;
  std::unique_ptr<UndoIndex> undo_;  // on disk (index.db); memory bounded
  int index_version_ = 0;            // volume.format_version as loaded (1: undo tables to be filled)
  std::map<uint64_t, std::shared_ptr<File>> seg_files_;
  uint64_t horizon_ = 0;

  mutable std::mutex meta_mu_;        // guards the copies below for readers
  std::map<uint64_t, SegmentInfo> segments_;
  std::vector<RecoveryPoint> points_;  // ascending seq (a suspect-clean point is older than its id)
  std::multiset<uint64_t> pins_;
  std::optional<ApplyStall> stall_;
  HistoryLock lock_;                   // apply_mu_ (+ meta_mu_ for readers)
  std::vector<RollbackInfo> rollbacks_;  // meta_mu_
  std::vector<AnomalyEvent> anomalies_;  // meta_mu_
};

}  // namespace cdp::mt
