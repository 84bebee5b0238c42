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
// Code: ReplicaVolume is the façade over its parts, and apply (ApplyLocked)
// is the one place that drives them together:
//   VolumeFence (replica_fence.h)      generation, numbering, state, failover, upstream
//   PointCatalogue (replica_points.h)  points, pins, rollbacks, anomalies, policy, history lock
//   ReplicaStore (replica_store.h)     the replica file, its direct I/O, its digest store
//   UndoLog (replica_undo.h)           the journal, the undo index, segments, horizon
// with the value types in replica_types.h and a batch's helpers in
// replica_batch.h. The façade's reads, pins and hashes are in
// replica_volume.cc; the sqlite index in replica_index.cc; apply and
// re-protect in replica_apply.cc; crash recovery (UndoLog::Recover) in
// replica_recovery.cc;
// rollback in replica_rollback.cc; failover in replica_failover.cc; retention
// in replica_retention.cc; the replica's batched direct I/O in replica_io.cc.
// Every mutation of a part runs under the façade's apply lock; a change that
// spans parts (a batch's commit, a rollback's start and end) is one sqlite
// transaction the façade opens, each part staging its rows in it
// (Stage*(tx, ...)) and publishing after the commit.
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
#include "master-target/replica_fence.h"
#include "master-target/replica_io.h"
#include "master-target/replica_points.h"
#include "master-target/replica_store.h"
#include "master-target/replica_undo.h"
#include "master-target/replica_types.h"
#include "master-target/undo_index.h"


namespace cdp::mt {

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
  // The allocation of [offset, offset + len) of the replica file's image at
  // `point_seq` (ReadStoredAt's space; UndoLog::ExtentsAt): what an export's
  // NBD_CMD_BLOCK_STATUS reports, so that nbdcopy and qemu-img skip the holes
  // of a point, not of today's replica.
  Status ExtentsAt(uint64_t point_seq, uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) const;

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

  // The parts, for reading: the points, pins, rollbacks, anomalies and
  // retention policy (master-target/replica_points.h); the generation,
  // numbering, state and failover (master-target/replica_fence.h).
  const PointCatalogue& points() const { return *catalogue_; }
  const VolumeFence& fence() const { return *fence_; }
  // The undo journal: segments, horizon, undo records (master-target/replica_undo.h).
  const UndoLog& journal() const { return *journal_; }
  VolumeStatus GetStatus() const;
  uint64_t applied_seq() const { return applied_.load(); }
  uint64_t size() const { return id_.size; }
  const VolumeIdentity& identity() const { return id_; }
  std::optional<ApplyStall> stall() const;

 private:
  explicit ReplicaVolume(VolumeOptions opts) : o_(std::move(opts)) {}
  Status Init(const VolumeIdentity* create);
  Status CreateFiles(const VolumeIdentity& id);
  // An index of format 2 becomes 3 (UndoIndex::AddLongSummary), in one transaction.
  Status MigrateIndex();
  // The volume row (identity, applied sequence; the journal's part in `row`),
  // the fence and the point catalogue.
  Status LoadIndex(UndoLog::Row* row);
  // Writes the image at the fence's rollback point back over every block
  // changed after it, as new history, then ends the rollback (apply_mu_ held).
  Status FinishRollback();
  Result<RetentionResult> ApplyRetentionLocked();
  // Refuses a batch while the journal is over budget inside the lock
  // (retention run in place first); nullopt: go on. apply_mu_ held.
  Result<std::optional<ApplyOutcome>> CheckHistoryLock();
  // ReadAt over the whole replica file (the MACs of a sealed volume included).
  Status ReadDeviceAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* buf) const;
  // A sealed volume's digests (apply_mu_ held for the current image, or the
  // point pinned): the leaves read through `reader`, a zero leaf whose MAC
  // slot is empty as kUnsealedZeroDigest, window by window.
  Result<std::vector<proto::Hash128>> SealedDigests(DigestReader& reader, const DigestQuery& q, uint64_t at_seq);
  // Digests of the current image through the digest store (apply_mu_ held).
  Result<std::vector<proto::Hash128>> CurrentDigests(DigestReader& reader, const DigestQuery& q, uint64_t* skipped);
  Status ApplyLocked(const std::vector<proto::Record>& recs, size_t first, ApplyOutcome* out);
  // The commit point of a batch (master-target/replica_index.cc), in one
  // sqlite transaction: the applied sequence and the journal position `pos`
  // (one UPDATE of the volume row), the batch's undo records and touched
  // segments (UndoLog::StageCommit), and the new points and anomalies
  // (PointCatalogue::StageNew fills in their ids). Publishes nothing.
  Status CommitBatch(uint64_t last_seq, UndoLog::Position pos, const std::map<uint64_t, SegmentInfo>& touched,
                     const std::vector<UndoEntry>& undo, PointCatalogue::NewPoints* new_points);
  void UpdateGauges();

  VolumeOptions o_;
  VolumeIdentity id_;
  // The parts (declared after db_, which they use; the journal after the
  // store it undoes into).
  std::unique_ptr<sqlite::Db> db_;
  std::unique_ptr<VolumeFence> fence_;  // generation, state, failover, upstream
  std::unique_ptr<PointCatalogue> catalogue_;  // points, pins, rollbacks, anomalies, policy, history lock
  std::unique_ptr<ReplicaStore> store_;  // the replica and its digests (every write goes through it)
  std::unique_ptr<UndoLog> journal_;     // the undo journal, its index, segments and horizon

  mutable std::mutex apply_mu_;  // serialises apply, rollback, retention, hashes
  bool broken_ = false;              // an apply failed and could not be undone
  bool heal_by_recovery_ = false;    // broken_ by a failed undo of an apply: UndoLog::Recover again heals it
  // OK unless broken_. A volume broken by a failed undo of an apply (a full
  // disk may refuse even the undo) tries the undo again, and works again
  // once it succeeds; any other broken_ needs a reopen. apply_mu_ held.
  Status HealLocked();
  // Sets (failure) or clears (ok) the stall and its gauges; apply_mu_ held.
  // `cause` kNone: the failure's Status tells (no space, or an I/O error).
  void NoteApply(const Status& s, StallCause cause = StallCause::kNone);
  std::atomic<uint64_t> applied_{0};

  mutable std::mutex stall_mu_;  // a leaf: stall_ for readers (written under apply_mu_ too)
  std::optional<ApplyStall> stall_;
};

}  // namespace cdp::mt
