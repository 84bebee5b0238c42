// SPDX-License-Identifier: Apache-2.0
// UndoLog: the undo journal of one replicated volume. A part of
// ReplicaVolume (master-target/replica_volume.h): the journal segments
// (`journal/<16 hex>.jnl`, master-target/journal.h) with their writer, the
// committed journal position, the undo index (master-target/undo_index.h:
// which record holds the old bytes of which range), the segment table and
// the retention horizon. Rows in the volume's sqlite index (`segments`, the
// undo tables, the volume row's journal position and horizon_seq;
// docs/formats/mt-index.md).
//
// Apply drives it in this order, the façade holding the apply lock:
//
//   Append ... Sync           the batch's old bytes, durable      (sync point 1)
//   Stage                     exports see the new undo records (before the
//                             replica changes)
//   [the replica is written and synced: ReplicaStore]              (sync point 2)
//   Touched, position         the segments' new bookkeeping
//   StageCommit(tx)           inside the batch's one transaction   (commit point)
//   Committed                 published (after the commit)
//
// Crash recovery (Recover, at Open and in place after a failed apply) undoes
// every record past the committed position into the replica, newest first,
// cuts the journal there and reopens the writer; RebuildIndex fills the undo
// tables of an index older than them. Retention: RaiseHorizon (readers below
// it are refused from now on) -- StageDrop(tx) -- Dropped (files removed), or
// Discard when the transaction failed.
//
// Thread safety: the apply-side and retention methods, Recover and
// RebuildIndex run with the owning ReplicaVolume's apply lock held. Readers
// (ReadAt, EntriesBetween, WhileReachable, horizon, FillStatus, Segments,
// bytes) may run on any thread: exports hold the index lock shared across a
// lookup and the reads it leads to, and apply takes it exclusive only to
// change the index, the horizon or the segment files -- with writer
// preference, so a busy export cannot starve apply. The segment table has a
// leaf mutex of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"
#include "common/env/env.h"
#include "common/nbd/block_device.h"
#include "common/store/sqlite.h"
#include "master-target/journal.h"
#include "master-target/replica_store.h"
#include "master-target/replica_types.h"
#include "master-target/undo_index.h"

namespace cdp::mt {

// volume.format_version of the index this binary writes (docs/formats/
// mt-index.md, "Version note"): 3 since the undo index's long-record summary.
inline constexpr int kIndexFormatVersion = 3;

class UndoLog {
 public:
  struct Options {
    Env* env = nullptr;
    std::string dir;                 // the journal's directory (volume dir/journal)
    std::string name;                // the volume's, for messages
    uint64_t segment_bytes = 64ull << 20;
    const VolumeMetrics* metrics = nullptr;  // disk_read_bytes / disk_write_bytes of recovery
  };
  // `db` and `store` must outlive the log.
  UndoLog(sqlite::Db* db, ReplicaStore* store, Options o) : db_(db), store_(store), o_(std::move(o)) {}
  UndoLog(const UndoLog&) = delete;
  UndoLog& operator=(const UndoLog&) = delete;

  // A new journal in `dir`: segment 1, empty, synced (leftover segments of a
  // creation interrupted before its index row was committed are removed).
  static Status CreateJournal(Env* env, const std::string& dir, uint64_t segment_bytes);

  // ---- Open, in this order (the façade's Init).
  // What the volume row says of the journal.
  struct Row {
    uint64_t committed_segment = 0;  // the committed journal position
    uint64_t committed_offset = 0;
    uint64_t horizon = 0;
    int index_version = 0;  // volume.format_version (1: undo tables to be filled)
  };
  // The row, and the segment table. kCorruption (naming `index_path`) when
  // the committed segment is not in it.
  Status Load(const Row& row, const std::string& index_path);
  Status OpenIndex(const std::string& index_path, uint64_t device_size, const std::string& vfs);
  // Undoes (when `undo`) every record past the committed position whose
  // sequence is above `applied`, newest first, into the replica (synced), cuts
  // the journal at the committed position and reopens the writer.
  // kCorruption for a committed segment that is damaged or missing. After a
  // failure the writer is closed: only Recover again may follow.
  Status Recover(uint64_t applied, bool undo = true);
  // Fills the undo tables from the committed journal when they are empty or
  // older than them, and opens the segment files for readers.
  Status RebuildIndex();

  // ---- Readers.
  // The image at `point_seq` of [offset, offset + len) of the replica file:
  // the undo records after the point over the replica. kOutOfRange below the
  // horizon; kCorruption when a journal read fails its check.
  Status ReadAt(uint64_t point_seq, uint64_t offset, uint64_t len, uint8_t* buf) const;
  // The allocation of the image ReadAt reads (BlockDevice::Extents): a range
  // an undo record after the point covers is data (its old bytes are in the
  // journal, whatever the replica holds now); the rest is the replica file's
  // own allocation (FileExtents), read under the same lock as ReadAt, so
  // that an apply meanwhile cannot make a hole of what the point holds.
  Status ExtentsAt(uint64_t point_seq, uint64_t offset, uint64_t len, std::vector<DeviceExtent>* out) const;
  // The undo records with lo < seq <= hi.
  Result<std::vector<UndoEntry>> EntriesBetween(uint64_t lo, uint64_t hi) const;
  // Runs `fn` with `seq` reachable (horizon <= seq <= applied) and the index
  // locked shared; kOutOfRange (and `fn` not run) otherwise.
  Status WhileReachable(uint64_t seq, const std::atomic<uint64_t>& applied, const std::function<void()>& fn) const;
  uint64_t horizon() const;
  // Fills horizon_seq, undo_records, journal_bytes and journal_segments.
  void FillStatus(VolumeStatus* s) const;
  std::vector<SegmentInfo> Segments() const;
  uint64_t bytes() const;  // every segment

  // ---- Apply lock held: a batch.
  Result<UndoLocation> Append(ByteSpan records, uint64_t first_seq) { return writer_->Append(records, first_seq); }
  Status Sync() { return writer_->Sync(); }
  void Stage(const std::vector<UndoEntry>& added);
  // The segments `added` lands in, as they will be after the batch.
  Result<std::map<uint64_t, SegmentInfo>> Touched(const std::vector<UndoEntry>& added) const;
  struct Position {
    uint64_t segment = 0;
    uint64_t offset = 0;
  };
  // The writer's end: the committed position once the batch commits.
  Position position() const { return Position{writer_->segment(), writer_->end()}; }
  // Inside the batch's transaction: its undo records and segment rows.
  Status StageCommit(const sqlite::Transaction& tx, const std::vector<UndoEntry>& added,
                     const std::map<uint64_t, SegmentInfo>& touched);
  // After its commit: readers see the records committed, the segment table
  // the touched rows, and `pos` is the committed position.
  void Committed(const std::map<uint64_t, SegmentInfo>& touched, Position pos);

  // ---- Apply lock held: retention.
  uint64_t current_segment() const { return writer_->segment(); }
  // Readers of points below `h` are refused from now on (before the undo
  // records they would need leave the index).
  void RaiseHorizon(uint64_t h);
  // Inside retention's transaction: the undo records at or below `h`, the
  // segment rows up to `last_dropped`, the volume row's horizon.
  Status StageDrop(const sqlite::Transaction& tx, uint64_t last_dropped, uint64_t h);
  // After its commit: the segments go (rows, open files, then the files).
  Status Dropped(const std::vector<uint64_t>& segments);
  // After a failed transaction (StageDrop's or a batch's): the index forgets
  // what was staged.
  void Discard();

 private:
  std::unique_lock<std::shared_mutex> LockIndexExclusive() const;
  std::shared_lock<std::shared_mutex> LockIndexShared() const;
  std::shared_ptr<File> SegmentFile(uint64_t segment) const;  // index_mu_ held
  std::string SegmentPath(uint64_t segment) const;
  // Writes the old bytes of `entries` (in their order) back into the replica.
  Status UndoEntries(const std::vector<UndoEntry>& entries);

  sqlite::Db* const db_;
  ReplicaStore* const store_;
  const Options o_;

  std::unique_ptr<SegmentWriter> writer_;  // null after a failed Recover
  uint64_t committed_segment_ = 0;         // the committed journal position
  uint64_t committed_offset_ = 0;
  int index_version_ = 0;  // volume.format_version as loaded (1: undo tables to be filled)

  // Readers take index_mu_ shared; an exclusive locker holds the turnstile
  // while it waits, so no new reader gets in meanwhile (glibc's rwlock
  // prefers readers).
  mutable std::shared_mutex index_mu_;
  mutable std::mutex turnstile_;
  std::unique_ptr<UndoIndex> undo_;  // on disk (index.db); memory bounded
  std::map<uint64_t, std::shared_ptr<File>> seg_files_;
  uint64_t horizon_ = 0;

  mutable std::mutex seg_mu_;  // a leaf: the segment table for readers
  std::map<uint64_t, SegmentInfo> segments_;
};

}  // namespace cdp::mt
